"""`--partition` spec strings: ``iid``, ``dirichlet:ALPHA``, ``shards:C``, ``fedprox-mnist``,
``ditto-fmnist``, ``natural``, and planted clusters ``rotated:R`` / ``permuted:R`` /
``label_swap:R``, optionally on top of a label partition (``rotated:4+dirichlet:0.5``; alone,
planted clusters split IID). Planted clusters are of equal size, or in given proportions:
``rotated:4/4,3,2,1`` puts 40%, 30%, 20% and 10% of the clients in clusters 0-3."""

from __future__ import annotations

from typing import NamedTuple, Optional

from mcfl.errors import ConfigError

BASE_KINDS = ("iid", "dirichlet", "shards", "fedprox-mnist", "ditto-fmnist", "natural")
PLANTED_KINDS = ("rotated", "permuted", "label_swap")
_TAKES_ARG = {"dirichlet": float, "shards": int, "rotated": int, "permuted": int,
              "label_swap": int}
ALLOWED = "iid, dirichlet:ALPHA, shards:C, fedprox-mnist, ditto-fmnist, natural, rotated:R, " \
    "permuted:R, label_swap:R (a planted one may be joined to a label one with +, e.g. " \
    "rotated:4+dirichlet:0.5, and sized by proportions, e.g. rotated:4/4,3,2,1)"


class Partition(NamedTuple):
    kind: str  # one of BASE_KINDS
    arg: Optional[float] = None  # alpha for dirichlet, classes per client for shards
    planted: Optional[str] = None  # one of PLANTED_KINDS
    clusters: int = 0  # R
    shares: tuple[float, ...] = ()  # the planted clusters' proportions (empty: equal)

    def __str__(self) -> str:
        base = self.kind if self.arg is None else f"{self.kind}:{self.arg:g}"
        sized = "/" + ",".join(f"{s:g}" for s in self.shares) if self.shares else ""
        return f"{self.planted}:{self.clusters}{sized}+{base}" if self.planted else base


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
    if (not weights or not all(w > 0 for w in weights)
            or not count.isdigit() or len(weights) != int(count)):
        raise ConfigError(f"planted proportions must be R positive numbers after the slash, "
                          f"as in {kind}:4/4,3,2,1; got {part!r}")
    return count, weights


def _parse_part(part: str, spec: str) -> tuple[str, Optional[float], tuple]:
    kind, _, value = part.strip().partition(":")
    if kind not in BASE_KINDS + PLANTED_KINDS:
        raise ConfigError(f"unknown partition {part!r} in {spec!r}; allowed: {ALLOWED}")
    if kind not in _TAKES_ARG:
        if value:
            raise ConfigError(f"partition {kind!r} takes no value, got {part!r}")
        return kind, None, ()
    value, shares = _parse_shares(kind, value, part, spec)
    try:
        number = _TAKES_ARG[kind](value)
    except ValueError:
        wanted = "an integer" if _TAKES_ARG[kind] is int else "a number"
        raise ConfigError(
            f"partition {kind!r} needs {wanted} as in "
            f"{kind}:{'0.5' if _TAKES_ARG[kind] is float else '2'}, got {part!r}"
        ) from None
    if kind == "dirichlet" and not number > 0:
        raise ConfigError(f"dirichlet alpha must be > 0, got {number:g}")
    if kind != "dirichlet" and number < 1:
        raise ConfigError(f"partition {kind} needs a count >= 1, got {number}")
    return kind, number, shares


def parse_partition(spec: str) -> Partition:
    """Parse a spec string, with errors naming the bad part and the allowed forms."""
    parts = [_parse_part(p, spec) for p in spec.split("+")]
    planted = [p for p in parts if p[0] in PLANTED_KINDS]
    base = [p for p in parts if p[0] in BASE_KINDS]
    if len(planted) > 1 or len(base) > 1:
        raise ConfigError(
            f"partition {spec!r} may join at most one planted (rotated/permuted/label_swap) "
            "and one label partition"
        )
    kind, arg = base[0][:2] if base else ("iid", None)
    if planted:
        if kind == "natural":
            raise ConfigError("planted clusters cannot be joined to the natural (per-user) split")
        return Partition(kind, arg, planted[0][0], int(planted[0][1]), planted[0][2])
    return Partition(kind, arg)
