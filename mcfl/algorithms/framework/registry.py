"""The algorithm registry: every algorithm is a factory plus a dataclass of its hyperparameters.

An algorithm module declares its hyperparameters as a frozen dataclass of `mcfl.settings`
fields (default, one-line doc, flat key, allowed range) and registers a factory
``(context) -> FederatedAlgorithm`` under a name (as optax's aliases or evosax's strategies
are found by name). The factory builds the algorithm once; its hyperparameters reach its
functions as an argument (``hp.params``, `base.Hyperparams`): registering makes the dataclass
a pytree whose leaves are its traced fields (floats, `settings.is_traced`) and whose other
fields are static. The run config validates an algorithm's hyperparameters
through its dataclass; the command-line flags, `--help`, `mcfl run --algorithm` choices, the
README's table, the docs' algorithm pages (`mcfl.reference.algorithm_pages`) and the
conformance tests (tests/test_conformance.py) all read this registry, so a new algorithm is one
file and its registration (docs/extending.md, "Adding an algorithm").
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any, NamedTuple, Optional

import jax

from mcfl import settings
from mcfl.errors import ConfigError, choice_error
from mcfl.models import make_model


class AlgorithmContext(NamedTuple):
    """What every algorithm is built from, whatever its hyperparameters: the model, the
    clients a round, K (`num_clusters`: centers, groups, models or most clusters; 1 for
    single-model algorithms), the dtype a client store keeps per-client rows in, and the
    number of clients the engine trains side by side (`block_size`, the run's plan: an
    algorithm passes it to every engine call; None: the engine's rule for the models at hand).
    Everything numeric arrives at run time in `hp`."""

    model: Any  # mcfl.models.ModelSpec
    clients_per_round: int
    num_clusters: int = 1
    store_dtype: str = "float32"  # the dtype per-client rows are stored in (mcfl.store)
    block_size: Optional[int] = None  # clients per vmapped block (mcfl.runs.execution)
    # the clients' devices (mcfl.system.devices.SystemModel) for an asynchronous algorithm,
    # whose server steps come from the simulated clock; None: the run sets none
    system: Any = None


class RunShape(NamedTuple):
    """What an algorithm's hyperparameters are checked against beside themselves (their
    ``check(run)`` and ``unused(run)``): the run's clients (None: a natural dataset's users,
    not counted yet), rounds, K (`clusters`, 1 for a single-model algorithm), the clients'
    local training (`mcfl.engine.TrainingSpec`), whether client-level DP is on (`private`)
    and whether the simulated clock counts the clients' work (`clock`)."""

    clients: Optional[int]
    rounds: int
    clusters: int
    training: Any
    private: bool = False
    clock: bool = False


@dataclasses.dataclass(frozen=True)
class NoParams:
    """An algorithm without hyperparameters of its own."""


class AlgorithmSpec(NamedTuple):
    name: str
    params: type  # frozen dataclass of `settings.setting` fields
    factory: Callable[[AlgorithmContext], Any]
    summary: str  # what a round does, one line (README table, its docs page, --help)
    reference: str  # the paper it implements
    clustered: bool  # whether it uses K = --clusters
    # whether its server steps on the simulated clock as clients arrive (mcfl.system.events)
    asynchronous: bool = False

    def build(self, context: AlgorithmContext):
        """The algorithm, built once for `context`; its functions take `hp`."""
        return self.factory(context)

    @property
    def keeps(self) -> str:
        """What the algorithm keeps per client: "rows" (a client store holds them), "start"
        (every client's trained model at the start, streamed by a host or disk store) or
        "nothing" (`kept_per_client`)."""
        return kept_per_client(self.name)

    def params_with(self, params=None, **overrides):
        """Its hyperparameters: `params` (an instance of `self.params`; default: the
        defaults) changed by `overrides` (field names or flat keys), validated."""
        params = self.params() if params is None else params
        return with_values(self.params, params, overrides) if overrides else params


REGISTRY: dict[str, AlgorithmSpec] = {}
_PYTREES: set[type] = set()


def as_pytree(cls: type) -> type:
    """Register the settings dataclass `cls` as a pytree (once): its traced fields are leaves,
    the others static (hashable aux data)."""
    if cls not in _PYTREES:
        traced = settings.traced_fields(cls)
        static = [f.name for f in dataclasses.fields(cls) if f.name not in traced]
        jax.tree_util.register_dataclass(cls, data_fields=list(traced), meta_fields=static)
        _PYTREES.add(cls)
    return cls


def register(name: str, params: type = NoParams, *, summary: str, reference: str,
             clustered: bool = False, asynchronous: bool = False):
    """Decorator registering `factory(context)` as algorithm `name`, with its hyperparameters
    `params` (a frozen dataclass of `settings.setting` fields)."""
    def decorate(factory):
        if name in REGISTRY:
            raise ValueError(f"algorithm {name!r} registered twice")
        REGISTRY[name] = AlgorithmSpec(name, as_pytree(params), factory, summary, reference,
                                       clustered, asynchronous)
        return factory

    return decorate


def names() -> tuple[str, ...]:
    """Every registered algorithm's name, in registration order."""
    return tuple(REGISTRY)


def get(name: str) -> AlgorithmSpec:
    """The registration of algorithm `name`; an unknown name is a `ConfigError` listing the
    registered ones."""
    if name not in REGISTRY:
        raise choice_error("algorithm", name, names())
    return REGISTRY[name]


def build(name: str, context: AlgorithmContext):
    """The registered algorithm `name` built in `context`."""
    return get(name).build(context)


# The model an algorithm is built with to see what it keeps per client: the smallest one
# (building traces nothing, so its size does not matter).
_PROBE_MODEL_ARGS = ("mclr", (4,), 3)


@functools.cache
def kept_per_client(name: str) -> str:
    """What algorithm `name` keeps per client (`AlgorithmSpec.keeps`), from the algorithm
    built once with a probe model: what it keeps does not depend on its hyperparameters'
    values."""
    spec = get(name)
    context = AlgorithmContext(model=make_model(*_PROBE_MODEL_ARGS), clients_per_round=2,
                               num_clusters=2 if spec.clustered else 1)
    algorithm = spec.build(context)
    if algorithm.rows:
        return "rows"
    state = algorithm.client_state
    return "start" if state is not None and state.start is not None else "nothing"


def unused_settings(params, run: RunShape) -> dict[str, str]:
    """The settings (flat keys: the algorithm's own hyperparameters, or shared settings) that
    `params`' values leave unused in `run`, each with why: what the dataclass's
    ``unused(run)`` says (a rule's parameter under another rule, local training in an
    algorithm that trains nothing, ...); {} when it says nothing."""
    unused = getattr(params, "unused", None)
    return {} if unused is None else dict(unused(run))


def with_values(cls, params, values: dict[str, Any]):
    """`params` with `values` (by field name or flat key) replaced, validated."""
    by_name = {f.name: settings.key_of(f) for f in dataclasses.fields(cls)}
    flat = settings.as_flat(params)
    flat.update({by_name.get(k, k): v for k, v in values.items()})
    return settings.build(cls, flat, f"{cls.__name__}")


def owners_of_keys() -> dict[str, list[str]]:
    """Every hyperparameter key and the algorithms that take it, in registration order."""
    owners: dict[str, list[str]] = {}
    for spec in REGISTRY.values():
        for key in settings.fields_of(spec.params):
            owners.setdefault(key, []).append(spec.name)
    return owners


def params_from_flat(name: str, values: dict[str, Any]):
    """Algorithm `name`'s hyperparameters from flat keys; a key of another algorithm is an
    error naming the algorithms that take it."""
    spec = get(name)
    own = settings.fields_of(spec.params)
    owners = owners_of_keys()
    for key in values:
        if key not in own and key in owners:
            raise ConfigError(f"{key} applies to {', '.join(owners[key])}, not {name!r}")
    return settings.build(spec.params, values, f"{name} hyperparameter")


def markdown_table(link: Optional[Callable[[str], str]] = None) -> str:
    """The README's table of algorithms (generated; a test keeps the README in step); with
    `link`, each name links to ``link(name)`` (the docs site's algorithm pages)."""
    lines = ["| `--algorithm` | what a round does | hyperparameters (default) | paper |",
             "| --- | --- | --- | --- |"]
    for spec in REGISTRY.values():
        params = ", ".join(
            f"{settings.flag_text(settings.key_of(f), isinstance(f.default, bool))} "
            f"({settings.shown(f.default)})"
            for f in dataclasses.fields(spec.params)) or "-"
        name = f"[`{spec.name}`]({link(spec.name)})" if link else f"`{spec.name}`"
        lines.append(f"| {name} | {spec.summary} | {params} | {spec.reference} |")
    return "\n".join(lines)


if __name__ == "__main__":  # python -m mcfl.algorithms.framework.registry: the README's table
    import mcfl.algorithms  # noqa: F401  (registers every algorithm)

    print(markdown_table())
