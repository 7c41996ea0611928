"""What a program computes, counted from its jaxpr: floating-point operations and a lower bound
on the bytes it moves, with every `lax.scan` body counted as many times as it runs.

XLA's own cost analysis (``jax.jit(f).lower(...).compile().cost_analysis()``) counts the body
of every loop once: a round that trains E x ceil(n/B) local steps in a scan is reported as one
step (measured with jax 0.10.2: a 10-step scan of a matmul reports the FLOPs of one matmul).
Local training is loops all the way down (blocks of clients, local steps), so mcfl counts on
the jaxpr instead, where a scan's trip count is its ``length``:

* FLOPs: 2 x M x N x K for every ``dot_general`` (its batch dimensions included), 2 x (output
  elements) x (kernel elements per output feature) for every convolution, and one per output
  element of every other operation (elementwise work, reductions);
* bytes: the operands and the result of every matmul and convolution, the rows every gather
  and slice reads, and the program's own arguments and results, each once. Elementwise work is
  taken to be fused into its neighbours and moves nothing, so the figure is a lower bound on
  the memory traffic, as a roofline's lower bound on time wants.

A client's loops (its local steps, its chunks of rows) are ``while`` loops whose trip count is
the longest client's of its block, known only when the round runs. The engine runs each under
a name scope (`mcfl.engine.blocks.loop_scope`; a local-step loop is named by its schedule,
`mcfl.engine.training.steps_key`, so one epoch of pre-training is not counted as a round's E),
and `trips` gives the mean count of each, which the caller knows from the data
(`mcfl.planning.estimate`): the mean, not the block's longest, so the count stays a lower bound. (A
client told to stop before its schedule's end, a FlexCFL newcomer going on after its
pre-training epoch, is counted at its schedule's length.) Any other ``while`` loop (k-means
until it converges) is counted once and reported in `Cost.while_loops`.

A ``cond`` counts its most expensive branch (a block's training against a block that takes no
step), except an occasional one (`mcfl.engine.blocks.occasional_cond`: work a round does only
now and then, such as FlexCFL's newcomers' pre-training), which counts its cheaper branch and
is reported in `Cost.occasional`; ``occasional="dearer"`` counts a round that does that work.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, NamedTuple, Optional

from jax.extend import core as jcore

from mcfl.engine.blocks import LOOP_SCOPE, OCCASIONAL_SCOPE

# the mean iterations of a client loop, by its name (None: unknown)
Trips = Callable[[str], Optional[float]]

MATMULS = ("dot_general",)
CONVOLUTIONS = ("conv_general_dilated",)
READS = ("gather", "dynamic_slice", "take_along_axis")


class Cost(NamedTuple):
    """Counted work of a program (module docstring)."""

    flops: float = 0.0
    matmul_flops: float = 0.0  # of which in matmuls and convolutions (what bfloat16 speeds up)
    bytes: float = 0.0
    while_loops: int = 0  # data-dependent loops counted once
    occasional: int = 0  # occasional conds counted at their cheaper branch

    def __add__(self, other: Cost) -> Cost:  # type: ignore[override]
        return Cost(*(a + b for a, b in zip(self, other)))

    def times(self, count: float) -> Cost:
        return Cost(self.flops * count, self.matmul_flops * count, self.bytes * count,
                    self.while_loops, self.occasional)


def _size(aval) -> int:
    return int(math.prod(getattr(aval, "shape", ())))


def _bytes(aval) -> int:
    dtype = getattr(aval, "dtype", None)
    return 0 if dtype is None else _size(aval) * dtype.itemsize


def _dot_flops(eqn) -> float:
    lhs = eqn.invars[0].aval
    (contracting, _), _ = eqn.params["dimension_numbers"]
    inner = math.prod(lhs.shape[d] for d in contracting)
    return 2.0 * _size(eqn.outvars[0].aval) * inner


def _conv_flops(eqn) -> float:
    kernel = eqn.invars[1].aval
    out_features = kernel.shape[eqn.params["dimension_numbers"].rhs_spec[0]]
    return 2.0 * _size(eqn.outvars[0].aval) * _size(kernel) / max(1, out_features)


def _sub_jaxprs(params: dict[str, Any]) -> list:
    """The jaxprs inside an equation's parameters (pjit's, custom_vjp's, shard_map's ...)."""
    found = []
    for value in params.values():
        items = value if isinstance(value, (tuple, list)) else (value,)
        for item in items:
            if isinstance(item, jcore.ClosedJaxpr):
                found.append(item.jaxpr)
            elif isinstance(item, jcore.Jaxpr):
                found.append(item)
    return found


def _client_loop(eqn) -> str:
    """The length key of the client loop `eqn` runs in ('' for none)."""
    stack = str(eqn.source_info.name_stack)
    start = stack.rfind(LOOP_SCOPE)
    return "" if start < 0 else stack[start + len(LOOP_SCOPE):].split("/")[0]


def jaxpr_cost(jaxpr, trips: Optional[Trips] = None, occasional: str = "cheaper",
               each_loop_once: bool = False) -> Cost:
    """The `Cost` of running `jaxpr` (a Jaxpr or ClosedJaxpr) once, its loops included; `trips`:
    the mean iterations of each client loop, by its name; `occasional`: the side of an
    occasional cond counted, "cheaper" or "dearer" (module docstring). `each_loop_once`: every
    loop body counted once, as XLA's cost analysis counts it (what completes the TPU compiler's
    figures to whole loops: `mcfl.planning.tpu_compile`)."""
    if occasional not in ("cheaper", "dearer"):
        raise ValueError(f"occasional={occasional!r}: 'cheaper' or 'dearer'")
    count_of = (lambda _: 1.0) if each_loop_once else (trips or (lambda _: None))

    def inner(sub) -> Cost:
        return jaxpr_cost(sub, trips, occasional, each_loop_once)

    jaxpr = getattr(jaxpr, "jaxpr", jaxpr)
    total = Cost()
    for eqn in jaxpr.eqns:
        name = eqn.primitive.name
        if name in MATMULS or name in CONVOLUTIONS:
            flops = _dot_flops(eqn) if name in MATMULS else _conv_flops(eqn)
            moved = sum(_bytes(v.aval) for v in eqn.invars) + _bytes(eqn.outvars[0].aval)
            total += Cost(flops, flops, moved)
        elif name == "scan":
            total += inner(eqn.params["jaxpr"]).times(1 if each_loop_once
                                                      else eqn.params["length"])
        elif name == "while":
            body = inner(eqn.params["body_jaxpr"]) + inner(eqn.params["cond_jaxpr"])
            count = count_of(_client_loop(eqn))
            if count is not None:
                total += body.times(count)
            else:
                total += body._replace(while_loops=body.while_loops + 1)
        elif name == "cond":
            branches = [inner(b) for b in eqn.params["branches"]]
            if OCCASIONAL_SCOPE in str(eqn.source_info.name_stack):
                side = (min if occasional == "cheaper" else max)(branches, key=lambda c: c.flops)
                total += side._replace(occasional=side.occasional + 1)
            else:
                total += max(branches, key=lambda c: c.flops)
        elif (subs := _sub_jaxprs(eqn.params)):
            for sub in subs[:1]:  # custom_vjp's fwd / bwd: the primal's work, once
                total += inner(sub)
        else:
            elements = sum(_size(v.aval) for v in eqn.outvars)
            moved = sum(_bytes(v.aval) for v in eqn.outvars) if name in READS else 0
            total += Cost(float(elements), 0.0, float(moved))
    return total


def traced_cost(jitted, *args, trips: Optional[Trips] = None,
                occasional: str = "cheaper") -> Cost:
    """The `Cost` of one call of `jitted` (a `jax.jit` function) on arguments like `args`
    (arrays or `jax.ShapeDtypeStruct`s): `program_cost` of its trace."""
    return program_cost(jitted.trace(*args).jaxpr, trips, occasional)


def program_cost(closed, trips: Optional[Trips] = None, occasional: str = "cheaper",
                 each_loop_once: bool = False) -> Cost:
    """The `Cost` of one call of a traced program (its ClosedJaxpr): its jaxpr's work plus
    writing its results once. Its arguments count only as far as it reads them (a round reads
    its clients' rows, not the whole population's: FeSEM at 1,000,000 clients on an H200 ran
    below a bound that counted every argument)."""
    io = sum(_bytes(v.aval) for v in closed.jaxpr.outvars if hasattr(v, "aval"))
    return jaxpr_cost(closed, trips, occasional, each_loop_once) + Cost(bytes=float(io))


def xla_cost(compiled) -> dict[str, float]:
    """XLA's own cost analysis of a compiled program ({} where the backend has none): kept
    beside mcfl's count to show what counting every loop body once misses."""
    try:
        analysis = compiled.cost_analysis()
    except Exception:  # some backends have none
        return {}
    if isinstance(analysis, (list, tuple)):  # older jax: one dict per device program
        analysis = analysis[0] if analysis else {}
    return {key: float(analysis[key]) for key in ("flops", "bytes accessed")
            if key in (analysis or {})}


__all__ = ["Cost", "jaxpr_cost", "traced_cost", "xla_cost"]
