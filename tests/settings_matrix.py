"""The matrix of every registered algorithm x every setting moved off its default, resolved
(`mcfl.resolve`, no training): each pair is refused in one line (`ConfigError`) or gives a
plan other than the base's; a pair whose plan equals the base's is an ignored setting.

The settings and their values come from the settings' own registry (`mcfl.config` and every
algorithm's hyperparameter dataclass): every other choice, the other boolean, a number one
step off its default within its range, and for settings whose values are text in a syntax of
their own (a distribution, a partition recipe, a trace file) the examples in `EXAMPLES`.
Besides the base config, the moves are tried in *contexts* that switch a rule on (an
optimizer, a shift, the clock, DP, another dataset, each choice of an algorithm's own
hyperparameters), so that a rule's parameter under another rule is seen too.

``python tests/settings_matrix.py`` prints the counts and every ignored pair.
"""

from __future__ import annotations

import dataclasses
import typing
from collections import Counter
from pathlib import Path
from typing import Any, Optional, Union

import mcfl
from mcfl import settings
from mcfl.algorithms.framework import registry
from mcfl.config import OWNER, SHARED_FIELDS
from mcfl.errors import ConfigError

# Values of settings whose text has a syntax of its own (or whose default is resolved to a
# value that a plain step could repeat), one or more each.
EXAMPLES: dict[str, list[Any]] = {
    "dataset": ["digits", "fedem-synthetic"],
    "dataset_args": [{"n": 3}],
    "clients": [40],
    "data_seed": [7],
    "data_dir": ["/tmp"],
    "partition": ["dirichlet:0.5", "rotated:2"],
    "samples_per_client": [30],
    "test_fraction": [0.3],
    "normalize": ["none", "standardize"],
    "unseen_share": [0.2],
    "model": ["mlp"],
    "model_args": [{"width": 3}],
    "hidden": [(16,)],
    "local_steps": [3],
    "clients_per_round": [5, 0.5],
    "block_size": [7],
    "devices": [1],
    "dp_clip": [1.0],
    "dp_noise": [1.0],
    "dp_epsilon": [3.0],
    "dp_delta": [1e-3],
    "dp_epsilon_budget": [5.0],
    "dp_adaptive_quantile": [0.5],
    "device_speeds": ["constant:2"],
    "bandwidth": ["constant:10"],
    "device_trace": [],  # a file: `trace_file` writes one per matrix
    "availability": ["diurnal:100,0.5"],
    "client_dropout": [0.1],
    "deadline": [30.0],
    "over_select": [0.5],
    "seed": [1],
    "rounds": [31],
}
# Not moved here: the row dimension, and the rounds (they bound what a plan counts; moved by
# EXAMPLES above).
SKIPPED = {"algorithm"}
# The base of every row: a resolvable config for any algorithm (100 clients for FedGroup's
# cold start, 30 rounds for FL+HC's warm-up).
BASE = dict(dataset="synthetic", clients=100, rounds=30, model="mclr")


def alternatives(key: str, cls, field: dataclasses.Field) -> list[Any]:
    """The values `key` is moved to: `EXAMPLES`, else derived from its type and range."""
    if key in EXAMPLES:
        return EXAMPLES[key]
    hint = settings.type_of(cls, field)
    default, meta = field.default, field.metadata
    if typing.get_origin(hint) is Union:
        hint = next(a for a in typing.get_args(hint) if a is not type(None))
    if meta.get("choices"):
        return [c for c in meta["choices"] if c != default]
    if hint is bool:
        return [not default]
    if hint is int:
        value = (meta.get("minimum") or 1) if default is None else default + 1
        top = meta.get("maximum")
        return [value if top is None or value <= top else default - 1]
    if hint is float:
        low = next((meta[k] for k in ("minimum", "above") if meta.get(k) is not None), None)
        high = next((meta[k] for k in ("maximum", "below") if meta.get(k) is not None), None)
        if default is None:
            value = 0.5 if high is None or high > 0.5 else (low or 0) + (high - (low or 0)) / 2
        elif default == 0:
            value = 0.1 if high is None or high > 0.1 else high / 2
        else:
            value = default / 2 if high is not None and default * 2 >= high else default * 2
        return [value]
    raise TypeError(f"no values to move {key} ({hint}) to: add it to EXAMPLES")


def setting_fields(algorithm: str) -> dict[str, tuple[type, dataclasses.Field]]:
    """Every setting of a run of `algorithm`: the shared ones and its hyperparameters."""
    out = {k: (OWNER[k], f) for k, f in SHARED_FIELDS.items() if k not in SKIPPED}
    out.update({k: (registry.get(algorithm).params, f)
                for k, f in settings.fields_of(registry.get(algorithm).params).items()})
    return out


def contexts(algorithm: str, shared: bool) -> list[tuple[str, dict[str, Any]]]:
    """(name, changes) of the configs the moves start from: the base, with `shared` the rule
    switches every algorithm has, and each other choice of the algorithm's own
    hyperparameters."""
    out = [("base", {})]
    if shared:
        out += [("momentum", {"client_optimizer": "momentum"}),
                ("adam", {"client_optimizer": "adam"}),
                ("weight decay", {"weight_decay": 0.01}),
                ("local steps", {"local_steps": 3}),
                ("swap_all", {"shift": "swap_all"}),
                ("incremental", {"shift": "incremental"}),
                ("clock", {"device_speeds": "constant:2"}),
                ("deadline", {"device_speeds": "constant:2", "deadline": 30.0}),
                ("diurnal", {"availability": "diurnal:100,0.5"}),
                ("dp", {"dp_clip": 1.0, "dp_noise": 1.0}),
                ("poisson dp", {"client_sampling": "poisson", "dp_clip": 1.0,
                                "dp_noise": 1.0}),
                ("digits", {"dataset": "digits"}),
                ("fedem-synthetic", {"dataset": "fedem-synthetic"}),
                ("leaf", {"dataset": "leaf", "clients": None, "data_dir": "/tmp"}),
                ("mlp", {"model": "mlp"})]
    params = registry.get(algorithm).params
    for key, field in settings.fields_of(params).items():
        for value in field.metadata.get("choices") or ():
            if value != field.default:
                out.append((f"{key}={value}", {key: value}))
    return out


class Outcome(typing.NamedTuple):
    algorithm: str
    context: str
    key: str
    value: Any
    result: str  # "used" | "refused" | "ignored"
    why: str = ""


def _plan(values: dict[str, Any]):
    return mcfl.resolve(mcfl.from_dict(values))


def matrix(algorithms: Optional[list[str]] = None, shared_contexts: tuple[str, ...] = (),
           trace: Optional[str] = None) -> list[Outcome]:
    """Every algorithm (default: all) x setting x value, in the base context, and in the
    shared contexts for the algorithms named in `shared_contexts`; `trace`: a device trace
    file the ``device_trace`` moves point at."""
    outcomes = []
    for algorithm in algorithms or registry.names():
        fields = setting_fields(algorithm)
        for name, changes in contexts(algorithm, algorithm in shared_contexts):
            start = {**BASE, "algorithm": algorithm, **changes}
            try:
                base = _plan(start)
            except ConfigError:
                continue  # a context this algorithm refuses (DP for one it does not cover)
            for key, (cls, field) in fields.items():
                values = alternatives(key, cls, field) if key != "device_trace" else (
                    [trace] if trace else [])
                for value in values:
                    if key in changes and changes[key] == value:
                        continue
                    try:
                        plan = _plan({**start, key: value})
                    except ConfigError as error:
                        outcomes.append(Outcome(algorithm, name, key, value, "refused",
                                                str(error)))
                        continue
                    result = "ignored" if plan == base else "used"
                    outcomes.append(Outcome(algorithm, name, key, value, result))
    return outcomes


def trace_file(folder: Path, clients: int = 100) -> str:
    """A device trace for `clients` clients without online intervals."""
    path = Path(folder) / "trace.csv"
    path.write_text("client,speed,bandwidth\n" + "".join(f"{c},2,10\n" for c in range(clients)))
    return str(path)


def counts(outcomes: list[Outcome]) -> Counter:
    return Counter(o.result for o in outcomes)


def main() -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        found = matrix(shared_contexts=SHARED_CONTEXT_ALGORITHMS, trace=trace_file(folder))
    print(f"{len(found)} pairs: {dict(counts(found))}")
    by_algorithm = Counter(o.algorithm for o in found)
    print(f"{len(by_algorithm)} algorithms, {min(by_algorithm.values())}-"
          f"{max(by_algorithm.values())} pairs each")
    for o in found:
        if o.result == "ignored":
            print(f"IGNORED {o.algorithm} [{o.context}] {o.key}={o.value!r}")
    reasons = Counter(o.why.split(" ")[0] for o in found if o.result == "refused")
    print("refusals by their first word:", dict(reasons.most_common(8)))


# The algorithms whose rows also run in every shared context: one of each family (one global
# model, clustered, rows per client, a population start, asynchronous, DP-covered clustered).
SHARED_CONTEXT_ALGORITHMS = ("fedavg", "ifca", "local", "fesem", "fedbuff", "ditto",
                             "flexcfl")

if __name__ == "__main__":
    main()
