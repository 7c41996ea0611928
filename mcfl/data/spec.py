"""`--partition` spec strings: ``iid``, ``dirichlet:ALPHA``, ``shards:C``, ``fedprox-mnist``,
``ditto-fmnist``, ``natural``, and planted clusters ``rotated:R`` / ``permuted:R`` /
``label_swap:R``, optionally on top of a label partition (``rotated:4+dirichlet:0.5``; alone,
planted clusters split IID). Planted clusters are of equal size, or in given proportions:
``rotated:4/4,3,2,1`` puts 40%, 30%, 20% and 10% of the clients in clusters 0-3.

The four distribution shifts of `mcfl.data.shifts` are planted the same way, with a strength
after ``@`` (in (0, 1], default 0.5): ``shift_x:R@S``, ``shift_y:R@S``,
``shift_y_given_x:R@S``, ``shift_x_given_y:R@S``. Unlike the three older recipes, they join
each other on the same R groups (``shift_x:4@0.5+shift_y_given_x:4@1+dirichlet:0.3``)."""

from __future__ import annotations

import math
from typing import NamedTuple, Optional

from mcfl.data.shifts import DEFAULT_STRENGTH, SHIFT_KINDS
from mcfl.errors import ConfigError

# The largest Dirichlet alpha (beyond it the draw is IID to float precision) and the largest
# count a recipe takes (classes per client, planted groups): an infinite or absurd value is
# refused where it is read, not as a NumPy error while the data are built.
MAX_DIRICHLET_ALPHA = 1e6
MAX_COUNT = 1_000_000
BASE_KINDS = ("iid", "dirichlet", "shards", "fedprox-mnist", "ditto-fmnist", "natural")
SINGLE_PLANTED_KINDS = ("rotated", "permuted", "label_swap")
PLANTED_KINDS = SINGLE_PLANTED_KINDS + SHIFT_KINDS
_TAKES_ARG = {"dirichlet": float, "shards": int, **{kind: int for kind in PLANTED_KINDS}}
ALLOWED = "iid, dirichlet:ALPHA, shards:C, fedprox-mnist, ditto-fmnist, natural, rotated:R, " \
    "permuted:R, label_swap:R, shift_x:R@S, shift_y:R@S, shift_y_given_x:R@S, " \
    "shift_x_given_y:R@S (a planted one may be joined to a label one with +, e.g. " \
    "rotated:4+dirichlet:0.5, and sized by proportions, e.g. rotated:4/4,3,2,1; the shift_* " \
    "ones also to each other, e.g. shift_x:4@0.5+shift_y:4@0.5)"


class Planted(NamedTuple):
    """One planted recipe: its kind, and for a ``shift_*`` kind its strength in (0, 1]."""

    kind: str  # one of PLANTED_KINDS
    strength: Optional[float] = None


class Partition(NamedTuple):
    kind: str  # one of BASE_KINDS
    arg: Optional[float] = None  # alpha for dirichlet, classes per client for shards
    planted: tuple[Planted, ...] = ()  # on the same R groups; empty: none planted
    clusters: int = 0  # R
    shares: tuple[float, ...] = ()  # the planted clusters' proportions (empty: equal)

    @property
    def shifts(self) -> tuple[tuple[str, float], ...]:
        """(kind, strength) of the planted ``shift_*`` recipes."""
        return tuple((p.kind, p.strength) for p in self.planted if p.kind in SHIFT_KINDS)

    def planted_kind(self, kind: str) -> bool:
        return any(p.kind == kind for p in self.planted)

    def __str__(self) -> str:
        base = self.kind if self.arg is None else f"{self.kind}:{self.arg:g}"
        sized = "/" + ",".join(f"{s:g}" for s in self.shares) if self.shares else ""
        parts = [f"{p.kind}:{self.clusters}{sized if i == 0 else ''}"
                 + (f"@{p.strength:g}" if p.strength is not None else "")
                 for i, p in enumerate(self.planted)]
        return "+".join(parts + [base]) if parts else base


def _parse_shares(kind: str, value: str, part: str, spec: str) -> tuple[str, tuple]:
    """``4/4,3,2,1`` -> ("4", (4.0, 3.0, 2.0, 1.0)) for a planted kind; (value, ()) without
    a slash."""
    count, slash, shares = value.partition("/")
    if not slash:
        return value, ()
    if kind not in PLANTED_KINDS:
        raise ConfigError(f"only planted clusters take proportions (R/w1,...,wR), got {part!r} "
                          f"in {spec!r}")
    try:
        weights = tuple(float(w) for w in shares.split(","))
    except ValueError:
        weights = ()
    if (not weights or not all(0 < w < math.inf for w in weights)
            or not count.isdigit() or len(weights) != int(count)):
        raise ConfigError(f"planted proportions must be R positive numbers after the slash, "
                          f"as in {kind}:4/4,3,2,1; got {part!r}")
    return count, weights


def _parse_strength(kind: str, value: str, part: str) -> tuple[str, Optional[float]]:
    """``4@0.5`` -> ("4", 0.5) for a shift kind (no ``@``: the default strength); a strength on
    another kind, or one outside (0, 1], is refused."""
    value, at, strength = value.partition("@")
    if kind not in SHIFT_KINDS:
        if at:
            raise ConfigError(f"only the shift_* recipes take a strength (@S), got {part!r}")
        return value, None
    if not at:
        return value, DEFAULT_STRENGTH
    try:
        number = float(strength)
    except ValueError:
        number = math.nan
    if not 0 < number <= 1:
        raise ConfigError(f"the strength of {kind} must be a number in (0, 1], as in "
                          f"{kind}:4@0.5; got {strength!r} in {part!r}")
    return value, number


def _parse_part(part: str, spec: str) -> tuple[str, Optional[float], tuple, Optional[float]]:
    kind, _, value = part.strip().partition(":")
    if kind not in BASE_KINDS + PLANTED_KINDS:
        raise ConfigError(f"unknown partition {part!r} in {spec!r}; allowed: {ALLOWED}")
    if kind not in _TAKES_ARG:
        if value:
            raise ConfigError(f"partition {kind!r} takes no value, got {part!r}")
        return kind, None, (), None
    value, strength = _parse_strength(kind, value, part)
    value, shares = _parse_shares(kind, value, part, spec)
    try:
        number = _TAKES_ARG[kind](value)
    except ValueError:
        wanted = "an integer" if _TAKES_ARG[kind] is int else "a number"
        raise ConfigError(
            f"partition {kind!r} needs {wanted} as in "
            f"{kind}:{'0.5' if _TAKES_ARG[kind] is float else '2'}, got {part!r}"
        ) from None
    if kind == "dirichlet" and not 0 < number <= MAX_DIRICHLET_ALPHA:
        raise ConfigError(f"dirichlet alpha must be a finite number in (0, "
                          f"{MAX_DIRICHLET_ALPHA:g}] (larger is IID to the float: use iid), "
                          f"got {value!r} in {part!r}")
    if kind != "dirichlet" and not 1 <= number <= MAX_COUNT:
        raise ConfigError(f"partition {kind} needs a count from 1 to {MAX_COUNT:,}, got "
                          f"{value!r} in {part!r}")
    return kind, number, shares, strength


def parse_partition(spec: str) -> Partition:
    """Parse a spec string, with errors naming the bad part and the allowed forms."""
    parts = [_parse_part(p, spec) for p in spec.split("+")]
    planted = [p for p in parts if p[0] in PLANTED_KINDS]
    base = [p for p in parts if p[0] in BASE_KINDS]
    single = [p for p in planted if p[0] in SINGLE_PLANTED_KINDS]
    if len(base) > 1 or (single and len(planted) > 1):
        raise ConfigError(
            f"partition {spec!r} may join at most one planted recipe (rotated/permuted/"
            "label_swap) or shift_* recipes, and one label partition"
        )
    kinds = [p[0] for p in planted]
    if len(set(kinds)) < len(kinds):
        raise ConfigError(f"partition {spec!r} names a shift twice; join each kind once")
    if len({int(p[1]) for p in planted}) > 1:
        raise ConfigError(f"the shifts joined in {spec!r} must plant the same number of groups "
                          f"R, got {', '.join(f'{p[0]}:{int(p[1])}' for p in planted)}")
    sized = {p[2] for p in planted if p[2]}
    if len(sized) > 1:
        raise ConfigError(f"the shifts joined in {spec!r} give different group proportions; "
                          "give them once")
    kind, arg = base[0][:2] if base else ("iid", None)
    if planted:
        if kind == "natural":
            raise ConfigError("planted clusters cannot be joined to the natural (per-user) split")
        return Partition(kind, arg, tuple(Planted(p[0], p[3]) for p in planted),
                         int(planted[0][1]), sized.pop() if sized else ())
    return Partition(kind, arg)
