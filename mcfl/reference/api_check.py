"""The public names the API reference pages document, and which of them lack a docstring (the
docs build warns for each, and `mkdocs build --strict` then fails)."""

from __future__ import annotations

import importlib
import inspect

# The modules the API pages document; every public name of each needs a docstring.
API_MODULES = ("mcfl", "mcfl.algorithms", "mcfl.data", "mcfl.models", "mcfl.transforms",
               "mcfl.tracking", "mcfl.sweeps")


def undocumented_public_names(modules=API_MODULES) -> list[str]:
    """Public names of `modules` (each one's ``__all__``, or every name not starting with an
    underscore that the module defines) that are functions or classes without a docstring of
    their own."""
    missing = []
    for module_name in modules:
        module = importlib.import_module(module_name)
        names = getattr(module, "__all__", None) or [
            n for n, v in vars(module).items() if not n.startswith("_")
            and getattr(v, "__module__", None) == module_name]
        for name in names:
            value = getattr(module, name)
            if inspect.ismodule(value) or not callable(value):
                continue
            own = value.__doc__ if inspect.isclass(value) else getattr(value, "__doc__", None)
            if not (own and own.strip()):
                missing.append(f"{module_name}.{name}")
    return missing
