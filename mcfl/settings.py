"""Typed, documented settings: one validation for config files, flags and Python.

A setting is a dataclass field made with `setting`, which records a one-line doc, its flat key
(the name in config files and, with dashes, the command-line flag) and its allowed range. The
run config (`mcfl.config.RunConfig`) and every algorithm's hyperparameter dataclass are made of
them, so `check` gives every value the same treatment: booleans must be booleans, numbers must
be finite numbers in range, strings must be strings (and one of the choices when there are
choices), dicts objects of JSON values under string names, and an error names the key, the
value and what is allowed.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import math
import typing
from typing import Annotated, Any, NamedTuple, Optional, Union

from mcfl.errors import ConfigError

INT64_MAX = 2**63 - 1


class Static(NamedTuple):
    """Marks a float setting as static: ``Annotated[float, Static("why")]``. Its value is
    part of the compiled program (a shape or a Python branch depends on it), so members of a
    sweep that differ in it run as separate programs."""

    why: str


class JsonObject(dict):
    """The value of a setting of type dict: string names of JSON values (numbers, strings,
    true / false, null, lists and objects of them), read-only and hashable, so the frozen
    settings holding one stay hashable values; JSON writes it as an object."""

    def __hash__(self) -> int:
        return hash(json.dumps(self, sort_keys=True))

    def __reduce__(self):  # pickle and copy build it whole (not item by item)
        return JsonObject, (dict(self),)

    def _read_only(self, *args, **kwargs):
        raise TypeError("a setting's JSON object is read-only; make a new one instead")

    __setitem__ = __delitem__ = __ior__ = _read_only
    clear = pop = popitem = setdefault = update = _read_only


def setting(default, doc: str, *, key: Optional[str] = None, minimum=None, maximum=None,
            above=None, below=None, choices: Optional[tuple] = None) -> Any:
    """A dataclass field with its doc, flat key (default: the field's name) and range:
    ``minimum <= value <= maximum``, ``above < value < below``, or one of `choices`. A dict
    default is held as a `JsonObject`."""
    if isinstance(default, dict):
        default = JsonObject(default)
    metadata = {"doc": doc, "key": key, "minimum": minimum, "maximum": maximum, "above": above,
                "below": below, "choices": choices}
    return dataclasses.field(default=default, metadata=metadata)


def key_of(field: dataclasses.Field) -> str:
    return field.metadata.get("key") or field.name


def doc_of(field: dataclasses.Field) -> str:
    return field.metadata.get("doc", "")


def fields_of(cls) -> dict[str, dataclasses.Field]:
    """The settings of a dataclass by flat key."""
    return {key_of(f): f for f in dataclasses.fields(cls)}


def type_of(cls, field: dataclasses.Field):
    """The field's type, without a `Static` marker (``Annotated[float, Static(...)]`` ->
    float)."""
    hint = _type_hints(cls)[field.name]
    return typing.get_args(hint)[0] if typing.get_origin(hint) is Annotated else hint


def static_reason(cls, field: dataclasses.Field) -> Optional[str]:
    """Why a float setting is static (its `Static` marker), or None."""
    hint = _type_hints(cls)[field.name]
    marks = typing.get_args(hint)[1:] if typing.get_origin(hint) is Annotated else ()
    return next((m.why for m in marks if isinstance(m, Static)), None)


def is_traced(cls, field: dataclasses.Field) -> bool:
    """Whether the setting is a number the round program takes as an argument: a float not
    marked `Static`."""
    return type_of(cls, field) is float and static_reason(cls, field) is None


def traced_fields(cls) -> tuple[str, ...]:
    """Names of the traced fields of a settings dataclass."""
    return tuple(f.name for f in dataclasses.fields(cls) if is_traced(cls, f))


@functools.cache
def _type_hints(cls) -> dict:
    return typing.get_type_hints(cls, include_extras=True)


def _is_dict(hint) -> bool:
    return hint is dict or typing.get_origin(hint) is dict


def _describe(hint) -> str:
    if _is_dict(hint):
        return "a JSON object"
    if hint is bool:
        return "true or false"
    if hint is int:
        return "an integer"
    if hint is float:
        return "a number"
    if hint is str:
        return "a string"
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if typing.get_origin(hint) is tuple:
        return "a list of integers"
    if typing.get_origin(hint) is Union and set(args) == {int, float}:
        return "a count or a fraction"
    return " or ".join(_describe(a) for a in args)


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check(cls, field: dataclasses.Field, value):
    """`value` if it fits `field` of `cls` (ints given for a float field become floats), else
    `ConfigError` naming the key, the value and what is allowed."""
    key, hint = key_of(field), type_of(cls, field)
    optional = typing.get_origin(hint) is Union and type(None) in typing.get_args(hint)
    if value is None:
        if optional:
            return None
        raise ConfigError(f"{key} must be {_describe(hint)}, got None")
    if optional:
        args = tuple(a for a in typing.get_args(hint) if a is not type(None))
        hint = args[0] if len(args) == 1 else Union[args]
    meta = field.metadata
    if hint is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{key} must be true or false, got {value!r}")
        return value
    if hint is str:
        choices = meta.get("choices")
        if not isinstance(value, str):
            allowed = f" ({', '.join(map(str, choices))})" if choices else ""
            raise ConfigError(f"{key} must be a string{allowed}, got {value!r}")
        if choices and value not in choices:
            raise ConfigError(f"unknown {key} {value!r}; allowed: {', '.join(map(str, choices))}")
        return value
    if _is_dict(hint):
        return json_object(key, value)
    if typing.get_origin(hint) is tuple:  # hidden widths
        if isinstance(value, str) or not isinstance(value, (list, tuple)) or not value or any(
                isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in value):
            raise ConfigError(f"{key} must be a list of positive integers like 200,200, "
                              f"got {value!r}")
        return tuple(value)
    if typing.get_origin(hint) is Union:  # a count (int) or a fraction (float)
        if not _is_number(value) or not math.isfinite(value):
            raise ConfigError(f"{key} must be a count or a fraction, got {value!r}")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{key} must be an integer, got {value!r}")
    elif hint is float:
        if not _is_number(value) or not math.isfinite(value):
            raise ConfigError(f"{key} must be a finite number, got {value!r}")
        value = float(value)
    _check_range(key, value, meta, "an integer" if hint is int else "a number")
    return value


def json_object(key: str, value) -> JsonObject:
    """`value` as a dict setting holds it: a mapping of string names to JSON values, copied as
    JSON reads it back (tuples become lists), else `ConfigError` naming the key and the first
    value that is not JSON (a NaN, a numpy number, a non-string name ...)."""
    if not isinstance(value, dict):
        raise ConfigError(f"{key} must be a JSON object of names to values, e.g. {{\"n\": 3}}, "
                          f"got {value!r}")
    bad = _not_json(value)
    if bad is not None:
        raise ConfigError(f"{key} must hold JSON values (numbers, strings, true / false, null, "
                          f"lists, objects) under string names, got {bad[0]} {bad[1]!r}")
    return JsonObject(json.loads(json.dumps(value)))


def _not_json(value) -> Optional[tuple[str, Any]]:
    """("name" or "value", the first one) that JSON cannot hold exactly in `value`, or None."""
    if value is None or isinstance(value, (bool, str, int)):
        return None
    if isinstance(value, float):
        return None if math.isfinite(value) else ("value", value)
    if isinstance(value, (list, tuple)):
        return next((bad for bad in map(_not_json, value) if bad is not None), None)
    if isinstance(value, dict):
        for name, item in value.items():
            bad = ("name", name) if not isinstance(name, str) else _not_json(item)
            if bad is not None:
                return bad
        return None
    return "value", value


def _bounds(meta) -> list[str]:
    """A field's range as ">= 0", "< 1", ... (empty when it has none)."""
    low, high = meta.get("minimum"), meta.get("maximum")
    above, below = meta.get("above"), meta.get("below")
    parts = []
    if low is not None:
        parts.append(f">= {low}")
    if above is not None:
        parts.append(f"> {above}")
    if high is not None:
        parts.append(f"<= {high}")
    if below is not None:
        parts.append(f"< {below}")
    return parts


def flag_text(key: str, boolean: bool = False) -> str:
    """A setting's flag as the command line accepts it, in backquotes: ``--local-epochs``; a
    boolean's both forms, ``--apfl-adaptive`` / ``--no-apfl-adaptive``."""
    flag = key.replace("_", "-")
    return f"`--{flag}` / `--no-{flag}`" if boolean else f"`--{flag}`"


def shown(value) -> str:
    """A setting's value as tables and help show it: booleans as on / off, a tuple as its
    comma-separated items (as a flag takes it)."""
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, tuple):
        return ",".join(map(str, value))
    return str(value)


def allowed(cls, field: dataclasses.Field) -> str:
    """What a setting accepts, in words: its type and range, or its choices (the docs'
    hyperparameter tables; `check` enforces the same)."""
    choices = field.metadata.get("choices")
    if choices:
        return "one of " + ", ".join(str(c) for c in choices)
    hint = type_of(cls, field)
    text = " ".join([_describe(hint)] + [" and ".join(_bounds(field.metadata))]).strip()
    optional = typing.get_origin(hint) is Union and type(None) in typing.get_args(hint)
    return f"{text}, or unset" if optional else text


def _check_range(key: str, value, meta, kind: str) -> None:
    low, high = meta.get("minimum"), meta.get("maximum")
    above, below = meta.get("above"), meta.get("below")
    parts = _bounds(meta)
    ok = ((low is None or value >= low) and (high is None or value <= high)
          and (above is None or value > above) and (below is None or value < below))
    if not ok:
        raise ConfigError(f"{key} must be {kind} {' and '.join(parts)}, got {value!r}")


class TextParser:
    """The one reading of a setting's value from text (a command-line flag, a ``--grid``
    value, a list in a config file written as text): typed as the setting is; range and
    choices are `check`'s job. `__name__` names the type, as argparse reports it ("invalid int
    value: 'ten'"); a bad text is a `ConfigError` ("'ten' is not an integer")."""

    def __init__(self, hint):
        self.hint = hint
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        self.optional = type(None) in typing.get_args(hint)
        self.kinds = set(args) if args and typing.get_origin(hint) not in (tuple, dict) \
            else {hint}
        self.__name__ = ("list of integers" if typing.get_origin(hint) is tuple
                         else "JSON object" if _is_dict(hint)
                         else "count or fraction" if self.kinds == {int, float}
                         else " or ".join(k.__name__ for k in self.kinds))

    def __call__(self, text: str):
        if self.optional and text.strip().lower() == "none":
            return None
        if typing.get_origin(self.hint) is tuple:
            try:
                return parse_int_list(text)
            except ConfigError as e:  # argparse shows its text after the flag's name
                raise ListError(str(e)) from None
        if _is_dict(self.hint):
            return parse_json_object(text)
        try:
            if self.kinds == {int, float}:
                return float(text) if any(c in text for c in ".eE") else int(text)
            if float in self.kinds:
                return float(text)
            if int in self.kinds:
                return int(text)
        except ValueError:
            what = ("an integer" if self.kinds == {int} else "a count or a fraction"
                    if self.kinds == {int, float} else "a number")
            raise ConfigError(f"{text!r} is not {what}") from None
        if bool in self.kinds:
            if text.strip().lower() not in ("true", "false"):
                raise ConfigError(f"{text!r} is not true or false")
            return text.strip().lower() == "true"
        return text


class ListError(ConfigError, argparse.ArgumentTypeError):
    """A bad list (or JSON object) value of a flag: argparse prints this message after the
    flag's name (for other types it says only "invalid ... value")."""


def parse_json_object(text: str) -> dict:
    """'{"n": 3}' -> {"n": 3}: the text of a dict setting (a flag's value), JSON that must be
    an object; the values are `check`'s job."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise ListError(f"{text!r} is not JSON ({e.msg} at character {e.pos}); give an object "
                        "like '{\"n\": 3}'") from None
    if not isinstance(value, dict):
        raise ListError(f"{text!r} is not a JSON object; give one like '{{\"n\": 3}}'")
    return value


def split_list(text: str, what: str, example: str = "2,3,4", separator: str = ",",
               repeats: bool = False) -> list[str]:
    """'a, b' -> ['a', 'b']: a list value of a flag or config file, read strictly: an empty
    item (a doubled or trailing separator, blank text) and, unless `repeats`, a value given
    twice are errors naming `what` and the text."""
    parts = [part.strip() for part in str(text).split(separator)]
    if not all(parts):
        raise ConfigError(f"{what} {str(text)!r} has an empty item; give values separated by "
                          f"{separator!r}, e.g. {example}")
    if not repeats and len(set(parts)) != len(parts):
        twice = next(p for i, p in enumerate(parts) if p in parts[:i])
        raise ConfigError(f"{what} {str(text)!r} gives {twice!r} twice; give each value once")
    return parts


def _positive_int(item) -> Optional[int]:
    """An integer >= 1 from an int or its text as `int` reads it ('2.5', 'true', 2.0, True:
    None)."""
    if isinstance(item, str):
        try:
            item = int(item)
        except ValueError:
            return None
    if isinstance(item, bool) or not isinstance(item, int) or item < 1:
        return None
    return item


def parse_int_list(value) -> tuple[int, ...]:
    """'200,200' or [200, 200] -> (200, 200) (the MLP's hidden widths, each >= 1)."""
    items = split_list(value, "hidden", "200,200", repeats=True) if isinstance(value, str) \
        else value
    allowed = f"hidden must be comma-separated integers >= 1 like 200,200, got {value!r}"
    if isinstance(items, (str, bytes)) or not isinstance(items, (list, tuple)) or not items:
        raise ConfigError(allowed)
    widths = [_positive_int(v) for v in items]
    if None in widths:
        raise ConfigError(f"{allowed} ({items[widths.index(None)]!r} is not)")
    return tuple(widths)


def build(cls, values: dict[str, Any], what: str):
    """An instance of the settings dataclass `cls` from flat keys (the rest default); an
    unknown key is a `ConfigError` naming the allowed ones."""
    fields = fields_of(cls)
    unknown = sorted(set(values) - set(fields))
    if unknown:
        raise ConfigError(f"unknown {what} key(s) {', '.join(map(repr, unknown))}; allowed: "
                          f"{', '.join(fields) or 'none'}")
    kwargs = {f.name: check(cls, f, values[k]) for k, f in fields.items() if k in values}
    return cls(**kwargs)


def as_flat(instance) -> dict[str, Any]:
    """An instance's values by flat key."""
    return {key_of(f): getattr(instance, f.name) for f in dataclasses.fields(instance)}
