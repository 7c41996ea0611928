"""The algorithm registry: every algorithm is a factory plus a dataclass of its hyperparameters.

An algorithm module declares its hyperparameters as a frozen dataclass of `mcfl.settings`
fields (default, one-line doc, flat key, allowed range) and registers a factory
``(context, params) -> FederatedAlgorithm`` under a name (as optax's aliases or evosax's
strategies are found by name). The run config validates an algorithm's hyperparameters
through its dataclass; the command-line flags, `--help`, `mcfl run --algorithm` choices, the
README's table and the conformance tests (tests/test_conformance.py) all read this registry,
so a new algorithm is one file and its registration (README, "Adding an algorithm").
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, NamedTuple

from mcfl import settings
from mcfl.errors import ConfigError, choice_error


class AlgorithmContext(NamedTuple):
    """What every algorithm is built from, whatever its own hyperparameters.

    `training` is the clients' local training (optimizer, batch, epochs or steps); `lr` the
    clients' learning rate (FedSGD's server step); `num_clusters` is K (centers, groups, models
    or most clusters; 1 for single-model algorithms).
    """

    model: Any  # mcfl.models.ModelSpec
    training: Any  # mcfl.engine.LocalTraining
    clients_per_round: int
    block_size: int
    num_clusters: int = 1
    lr: float = 0.01


@dataclasses.dataclass(frozen=True)
class NoParams:
    """An algorithm without hyperparameters of its own."""


class AlgorithmSpec(NamedTuple):
    name: str
    params: type  # frozen dataclass of `settings.setting` fields
    factory: Callable[[AlgorithmContext, Any], Any]
    summary: str  # what a round does, one line (README table, --help)
    reference: str  # the paper it implements
    clustered: bool  # whether it uses K = --clusters

    def build(self, context: AlgorithmContext, params=None, **overrides):
        """The algorithm with `params` (an instance of `self.params`; default: the defaults)
        changed by `overrides` (field names or flat keys), validated."""
        params = self.params() if params is None else params
        if overrides:
            params = with_values(self.params, params, overrides)
        return self.factory(context, params)


REGISTRY: dict[str, AlgorithmSpec] = {}


def register(name: str, params: type = NoParams, *, summary: str, reference: str,
             clustered: bool = False):
    """Decorator registering `factory(context, params)` as algorithm `name`."""
    def decorate(factory):
        if name in REGISTRY:
            raise ValueError(f"algorithm {name!r} registered twice")
        REGISTRY[name] = AlgorithmSpec(name, params, factory, summary, reference, clustered)
        return factory

    return decorate


def names() -> tuple[str, ...]:
    return tuple(REGISTRY)


def get(name: str) -> AlgorithmSpec:
    if name not in REGISTRY:
        raise choice_error("algorithm", name, names())
    return REGISTRY[name]


def build(name: str, context: AlgorithmContext, **params):
    """The registered algorithm `name` built in `context` with hyperparameters `params`
    (field names or flat keys; the others at their defaults)."""
    return get(name).build(context, **params)


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


def markdown_table() -> str:
    """The README's table of algorithms (generated; a test keeps the README in step)."""
    lines = ["| `--algorithm` | what a round does | hyperparameters (default) | paper |",
             "| --- | --- | --- | --- |"]
    for spec in REGISTRY.values():
        params = ", ".join(
            f"`--{settings.key_of(f).replace('_', '-')}` ({_shown(f.default)})"
            for f in dataclasses.fields(spec.params)) or "-"
        lines.append(f"| `{spec.name}` | {spec.summary} | {params} | {spec.reference} |")
    return "\n".join(lines)


def _shown(value) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    return str(value)


if __name__ == "__main__":  # python -m mcfl.algorithms.registry: the README's table
    import mcfl.algorithms  # noqa: F401  (registers every algorithm)

    print(markdown_table())
