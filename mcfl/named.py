"""Named factories: one registry kind for models and datasets (`mcfl.models.registry`,
`mcfl.data.registry`), with names a config may give as a registered name or as an import path
``module.path:attribute``, so a user's code needs no edit of mcfl."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from mcfl.errors import ConfigError, first_line


class Registry:
    """Factories by name, in registration order; `kind` ("model", "dataset") names them in
    messages."""

    def __init__(self, kind: str):
        self.kind = kind
        self._factories: dict[str, Callable] = {}
        self._docs: dict[str, str] = {}

    def register(self, name: str, doc: str = "") -> Callable[[Callable], Callable]:
        """Decorator: register a factory under `name` (a name given twice is an error, so two
        factories never silently share one)."""
        if not isinstance(name, str) or not name or ":" in name:
            raise ValueError(f"a {self.kind} name must be a non-empty string without ':', "
                             f"got {name!r}")

        def add(factory: Callable) -> Callable:
            if name in self._factories and self._factories[name] is not factory:
                raise ValueError(f"{self.kind} {name!r} is already registered")
            self._factories[name] = factory
            self._docs[name] = doc or (factory.__doc__ or "").strip().split("\n")[0]
            return factory

        return add

    def names(self) -> tuple[str, ...]:
        """Every registered name, in registration order."""
        return tuple(self._factories)

    def doc(self, name: str) -> str:
        return self._docs[name]

    def get(self, name: str) -> Callable:
        return self._factories[name]

    def __contains__(self, name: object) -> bool:
        return name in self._factories

    def resolve(self, name: Any, also_allowed: tuple[str, ...] = ()) -> Callable:
        """The factory `name` stands for: a registered name, or ``module.path:attribute``
        (imported here). Anything else is a `ConfigError` naming the value and what is
        allowed (the registered names, `also_allowed`, and the import-path form)."""
        if not isinstance(name, str):
            raise ConfigError(f"{self.kind} must be a string, got {name!r}")
        if name in self._factories:
            return self._factories[name]
        if ":" not in name:
            allowed = also_allowed + self.names() + ("module.path:factory",)
            raise ConfigError(f"unknown {self.kind} {name!r}; allowed: {', '.join(allowed)}")
        return import_factory(self.kind, name)


def import_factory(kind: str, name: str) -> Callable:
    """The callable an import path ``module.path:attribute`` names, or a one-line
    `ConfigError` saying what is wrong with it."""
    module_name, _, attribute = name.partition(":")
    if not module_name or not attribute:
        raise ConfigError(f"{kind} {name!r} is not an import path of the form "
                          f"'module.path:factory'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ConfigError(f"{kind} {name!r}: cannot import {module_name!r} ({e})") from None
    except SyntaxError as e:  # (its file and line: the user's module, not mcfl)
        raise ConfigError(f"{kind} {name!r}: module {module_name!r} does not parse: {e.msg} "
                          f"({e.filename}, line {e.lineno})") from None
    except Exception as e:  # noqa: BLE001 - any failure of the user's module as it imports
        raise ConfigError(f"{kind} {name!r}: importing module {module_name!r} failed: "
                          f"{first_line(e)}") from None
    target: Any = module
    for part in attribute.split("."):
        if not hasattr(target, part):
            raise ConfigError(f"{kind} {name!r}: module {module_name!r} has no attribute "
                              f"{attribute!r}")
        target = getattr(target, part)
    if not callable(target):
        raise ConfigError(f"{kind} {name!r} names a {type(target).__name__}, which is not a "
                          f"callable factory")
    return target
