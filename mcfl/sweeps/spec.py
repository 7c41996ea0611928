"""What a sweep runs: its members (grid point x data seed x seed) and how they group.

A member is one run: the base config with one value of every grid parameter, one seed and one
data seed. Members whose configs differ only in their seed and in *traced* settings (floats
that no shape or Python branch depends on: learning rates, mu, FeSEM's lambda, eta_g, server
lr, shift probability ...) form a group, which runs as one program vmapped over its members
(`mcfl.sweeps.members`). Every other difference (algorithm, model, clients, K, local steps, a
static float such as weight_decay, the data seed) starts a new group.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Optional

from mcfl import settings
from mcfl.config import (
    CLUSTERED_ONLY,
    KEPT_STATE_ONLY,
    OWNER,
    SHARED_FIELDS,
    RunConfig,
    all_keys,
    asks_nothing,
    hint_of,
    not_taken_by,
)
from mcfl.data.settings import DATA_FIELDS
from mcfl.errors import ConfigError

# Varied by `seeds=` / `data_seeds=`, not by the grid.
SEED_KEYS = ("seed", "data_seed")
# Optional floats traced when a config gives them (DP's numbers, `mcfl.privacy.mechanism`;
# the dropout chance, `mcfl.system.clock`): None turns the feature off, which shapes the program.
TRACED_WHEN_GIVEN = ("dp_clip", "dp_noise", "client_dropout")
# The most seeds a sweep takes (a range such as 0-99999999999 would fill the memory).
MAX_SEEDS = 1_000_000


@dataclasses.dataclass(frozen=True)
class Member:
    index: int  # position in the sweep
    config: RunConfig  # the single run it equals
    point: tuple[tuple[str, Any], ...]  # (grid parameter, value) pairs

    @property
    def seed(self) -> int:
        return self.config.seed

    @property
    def data_seed(self) -> int:
        return self.config.data_seed


@dataclasses.dataclass(frozen=True)
class Group:
    """Members that share one compiled program; `traced` are the settings that vary among
    them (each member's values are fed to the program as arrays)."""

    members: tuple[Member, ...]
    traced: tuple[str, ...]

    @property
    def base(self) -> RunConfig:
        return self.members[0].config


def _setting_fields(config: RunConfig) -> dict[str, tuple[type, dataclasses.Field]]:
    """Every setting of `config` by flat key, with the dataclass it belongs to."""
    out = {name: (OWNER[name], f) for name, f in SHARED_FIELDS.items()}
    out.update({key: (type(config.params), f)
                for key, f in settings.fields_of(type(config.params)).items()})
    return out


def traceable_keys(config: RunConfig) -> tuple[str, ...]:
    """The settings of `config` a sweep may vary inside one program: floats not marked
    ``static`` and not shaping the data, and optional floats that `config` gives (DP's
    dp_clip and dp_noise: None turns DP off, which shapes the program)."""
    return tuple(key for key, (cls, f) in _setting_fields(config).items()
                 if key not in DATA_FIELDS and (settings.is_traced(cls, f) or (
                     settings.type_of(cls, f) == Optional[float] and key in TRACED_WHEN_GIVEN
                     and getattr(config, key) is not None)))


def _seed_ranges(text: str, what: str) -> list[range]:
    """'0-3,7' -> [range(0, 4), range(7, 8)]: every item an integer or an ascending range."""
    ranges = []
    for part in settings.split_list(text, what, "0-7 or 0,3,5"):
        low, dash, high = part[1:].partition("-")  # (a leading '-' is a sign: refused below)
        try:
            low, high = int(part[0] + low), int(high if dash else part[0] + low)
        except ValueError:
            raise ConfigError(f"{what} must look like 0-7 or 0,3,5, got {text!r} ({part!r} is "
                              "not an integer or a range of them)") from None
        if high < low:
            raise ConfigError(f"{what} {text!r}: the range {part!r} runs backwards; write it "
                              f"as {high}-{low}")
        if high - low >= MAX_SEEDS:
            raise ConfigError(f"{what} {text!r}: the range {part!r} holds {high - low + 1:,} "
                              f"seeds; at most {MAX_SEEDS:,} are allowed")
        ranges.append(range(low, high + 1))
    return ranges


def parse_seeds(seeds: int | Iterable[int] | str, what: str = "seeds") -> tuple[int, ...]:
    """Seeds as a list, a count (``8``: 0..7) or text (``"0-7"``, ``"0,3,5"``); each an
    integer from 0 to 2^63 - 1, none twice, at most `MAX_SEEDS`. `what` names the value in
    errors (the flag: seeds, data_seeds)."""
    if isinstance(seeds, str):
        seeds = _seed_ranges(seeds, what)
    elif isinstance(seeds, int) and not isinstance(seeds, bool):
        if seeds < 1 or seeds > MAX_SEEDS:
            raise ConfigError(f"{what} as a count must be from 1 to {MAX_SEEDS:,}, got {seeds}")
        seeds = [range(seeds)]
    elif isinstance(seeds, (bytes, Mapping)) or not isinstance(seeds, Iterable):
        raise ConfigError(f"{what} must be a count, a list of integers or text like 0-7 or "
                          f"0,3,5, got {seeds!r}")
    else:
        seeds = [tuple(seeds)]
    if sum(len(r) for r in seeds) > MAX_SEEDS:
        raise ConfigError(f"{what} gives {sum(len(r) for r in seeds):,} seeds; at most "
                          f"{MAX_SEEDS:,} are allowed")
    seeds = tuple(s for r in seeds for s in r)
    if not seeds:
        raise ConfigError(f"{what} is empty; give at least one seed")
    for s in seeds:
        if isinstance(s, bool) or not isinstance(s, int) or not 0 <= s <= settings.INT64_MAX:
            raise ConfigError(f"{what} must be integers from 0 to 2^63 - 1, got {s!r}")
    if len(set(seeds)) != len(seeds):
        twice = next(s for s, n in Counter(seeds).items() if n > 1)
        raise ConfigError(f"{what} gives the seed {twice} twice; give each seed once")
    return seeds


def _once(what: str, values: Sequence[Any], texts: Optional[Sequence[str]] = None) -> None:
    """A grid's values, none given twice (as read: '0.1' and '0.10' are one value; 1 and 1.0
    are not, a count and a fraction); `what` names the grid in errors."""
    keys = [(type(v).__name__, repr(v)) for v in values]
    if len(set(keys)) != len(keys):
        i = next(i for i, k in enumerate(keys) if k in keys[:i])
        given = f" (as {texts[keys.index(keys[i])]!r} and {texts[i]!r})" if texts else ""
        raise ConfigError(f"{what} gives the value {values[i]!r} twice{given}; give each "
                          "value once")


def check_grid(grid: Optional[Mapping[str, Sequence[Any]]]) -> dict[str, tuple[Any, ...]]:
    """The grid with every name a config key and every value list non-empty; the values
    themselves are checked when the members' configs are built."""
    grid = dict(grid or {})
    allowed = [k for k in all_keys() if k not in SEED_KEYS]
    for name, values in grid.items():
        if name in SEED_KEYS:
            raise ConfigError(f"{name} is varied by the sweep's {name}s argument "
                              f"(--{name.replace('_', '-')}s), not by the grid")
        if name not in allowed:
            raise ConfigError(f"unknown sweep parameter {name!r}; allowed: {', '.join(allowed)}")
        if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
            raise ConfigError(f"grid {name} must be a list of values, got {values!r}")
        if len(values) == 0:
            raise ConfigError(f"grid {name} has no values; give at least one")
        _once(f"grid {name}", values)
        grid[name] = tuple(values)
    return grid


def expand(config: RunConfig, seeds: Sequence[int], grid: Mapping[str, Sequence[Any]],
           data_seeds: Optional[Sequence[int]] = None) -> list[Member]:
    """Every member: data seeds outermost, then the grid points (the grid's order), then the
    seeds. Each member's config is built (and so validated) as its own run's would be."""
    if data_seeds is None:
        base_data_seed = config.data_seed if config.data_seed is not None else config.seed
        data_seeds = (base_data_seed,)
    names = list(grid)
    members = []
    for data_seed in data_seeds:
        for values in itertools.product(*(grid[n] for n in names)):
            point = tuple(zip(names, values))
            changes = dict(point)
            if "algorithm" in changes:  # settings only some algorithms take go with them
                keep = settings_not_taken(config, changes["algorithm"])
            else:
                keep = {}
            for seed in seeds:
                try:
                    member = config.replace(**changes, **keep, seed=seed, data_seed=data_seed)
                except ConfigError as e:
                    where = ", ".join(f"{k}={v!r}" for k, v in point) or "the base config"
                    raise ConfigError(f"sweep point {where}: {e}") from None
                members.append(Member(len(members), member, point))
    return members


def settings_not_taken(config: RunConfig, algorithm: str) -> dict[str, Any]:
    """The base config's shared settings that a member of `algorithm` (on the grid) does not
    take, at their defaults: such a member runs without them (as `RunConfig.replace` drops the
    hyperparameters a new algorithm does not share), its clustered siblings with them."""
    return {key: SHARED_FIELDS[key].default for key in not_taken_by(algorithm, config.bn)}


def check_settings_taken(config: RunConfig, algorithms: Iterable[str],
                         runs: str = "the sweep's algorithms",
                         keys: Iterable[str] = CLUSTERED_ONLY + KEPT_STATE_ONLY) -> None:
    """Refuse a base setting (of `keys`) that only some algorithms take when none of
    `algorithms` (a sweep's members', a table's cells') takes it (a K on a grid of
    single-model algorithms): it would be accepted and ignored."""
    algorithms = set(algorithms)
    for key in keys:
        value = getattr(config, key)
        if not asks_nothing(key, value) and all(key in not_taken_by(a, config.bn)
                                                 for a in algorithms):
            raise ConfigError(f"--{key.replace('_', '-')} {value} is taken by none of "
                              f"{runs} ({', '.join(sorted(algorithms))})")


def _group_key(config: RunConfig, traced: tuple[str, ...]) -> tuple:
    values = config.to_dict()
    return tuple((k, repr(v)) for k, v in sorted(values.items())
                 if k not in traced and k != "seed")


def group(members: Sequence[Member]) -> list[Group]:
    """Members sharing everything but their seed and traceable settings, in sweep order."""
    by_key: dict[tuple, list[Member]] = {}
    for member in members:
        key = _group_key(member.config, traceable_keys(member.config))
        by_key.setdefault(key, []).append(member)
    groups = []
    for grouped in by_key.values():
        keys = traceable_keys(grouped[0].config)
        traced = tuple(k for k in keys
                       if len({getattr(m.config, k) for m in grouped}) > 1)
        groups.append(Group(tuple(grouped), traced))
    return groups


def parse_grid(text: str) -> tuple[str, tuple[Any, ...]]:
    """``"lr=0.01,0.05"`` -> ("lr", (0.01, 0.05)): values read by the setting's own text
    parser (`settings.TextParser`; a list of MLP widths separates values with ';':
    ``hidden=200,200;100``)."""
    name, sep, rest = text.partition("=")
    name = name.strip().replace("-", "_")
    if not sep or not name:
        raise ConfigError(f"--grid must look like NAME=V1,V2, got {text!r}")
    if name == "algorithms":
        name = "algorithm"
    if name in SEED_KEYS:
        raise ConfigError(f"{name} is varied by --{name.replace('_', '-')}s, not by --grid")
    if name not in all_keys():
        raise ConfigError(f"unknown sweep parameter {name!r}; allowed: "
                          f"{', '.join(k for k in all_keys() if k not in SEED_KEYS)}")
    parse = settings.TextParser(hint_of(name))
    if not rest.strip():
        raise ConfigError(f"grid {name} has no values; give at least one, e.g. {name}=V1,V2")
    lists = ";" in rest or parse.__name__ == "list of integers"
    parts = settings.split_list(rest, f"--grid {name}",
                                f"{name}=200,200;100" if lists else f"{name}=V1,V2",
                                separator=";" if lists else ",")
    try:
        values = tuple(parse(p) for p in parts)
    except ConfigError as e:
        raise ConfigError(f"grid {name}: {e}") from None
    _once(f"--grid {name}", values, parts)
    return name, values
