"""The model registry: a name -> a factory ``(feature_shape, num_classes, **args) -> module``.

A factory returns a flax ``nn.Module`` whose ``__call__(x)`` gives logits [B, num_classes] (or
a ready `mcfl.models.ModelSpec`). ``@register("name")`` adds one; a config may also name a
factory by import path, ``"mypkg.nets:ResNet"`` (`resolve`), so a user's model needs no edit
of mcfl. The papers' models and the zoo register themselves when `mcfl.models` is imported.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from mcfl.named import Registry

Factory = Callable[..., Any]

MODELS = Registry("model")
register = MODELS.register
names = MODELS.names
doc = MODELS.doc


def arguments(name: str) -> str:
    """A registered factory's keyword arguments with their defaults (what --model-args may
    set), e.g. "width=64, groups=2"."""
    parameters = list(inspect.signature(MODELS.get(name)).parameters.values())[2:]
    return ", ".join(p.name if p.default is inspect.Parameter.empty else f"{p.name}={p.default!r}"
                     for p in parameters if p.kind is not inspect.Parameter.VAR_KEYWORD)


def resolve(name: str) -> Factory:
    """The factory `name` stands for: a registered name, or ``module.path:Factory`` (a factory
    or a flax module class, imported here); anything else is a one-line `ConfigError`."""
    return MODELS.resolve(name)
