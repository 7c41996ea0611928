"""Lowering mcfl's programs for the accelerators its users run on, without one here.

JAX lowers a jitted function for any platform on a CPU-only machine (`jax.export.export` with
``platforms=("tpu", "cuda")``): every operation must have a lowering rule there. That is how
mcfl checks, on CPU, that a round, an initialisation or an evaluation would run on a Colab TPU
or a GPU: an operation implemented only for the CPU (a LAPACK-only routine such as ``schur``),
a host callback on the hot path (``jax.pure_callback``), or anything else XLA cannot lower for
those platforms fails here with the operation named. Lowering is not compiling: memory and
speed on the device are not checked by it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
from jax import export

from mcfl.errors import McflError

PLATFORMS = ("tpu", "cuda")


class LoweringError(McflError):
    """A program that does not lower for a platform: names the program, the platforms and the
    first line of JAX's reason (the operation without a lowering rule)."""


def lower_for(fn: Callable, *args: Any, platforms: Sequence[str] = PLATFORMS,
              name: str = "program") -> export.Exported:
    """`fn` (jitted here unless it already is) lowered for `platforms` on example `args`
    (arrays or `jax.ShapeDtypeStruct`s, sharded as the run would shard them); raises
    `LoweringError` when any operation has no lowering there."""
    jitted = fn if hasattr(fn, "lower") else jax.jit(fn)
    try:
        return export.export(jitted, platforms=tuple(platforms))(*args)
    except (NotImplementedError, ValueError, TypeError) as error:
        reason = (str(error).strip().splitlines() or [type(error).__name__])[0]
        raise LoweringError(f"{name} does not lower for {', '.join(platforms)}: "
                            f"{reason[:300]}") from error
