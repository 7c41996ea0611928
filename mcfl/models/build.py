"""Build the model a run names: a registered name, an import path, a flax module or a ready
`ModelSpec` (what `mcfl.run(config, model=...)` accepts)."""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from typing import Any, Optional

import flax.linen as nn

from mcfl.errors import ConfigError, McflError, first_line
from mcfl.models import registry
from mcfl.models.paper import CONV_IMPLEMENTATIONS, resolve_conv
from mcfl.models.precision import with_precision
from mcfl.models.spec import ModelSpec, check_modes, from_module
from mcfl.models.structure import with_fast_paths

# The run settings a factory receives when its signature names them (the papers' models take
# `hidden` and `conv`; a user's factory may too).
SETTING_ARGS = ("hidden", "conv")


def _accepted(factory, args: dict[str, Any]) -> dict[str, Any]:
    """`args` restricted to what `factory` accepts (all of them if it takes ``**kwargs``)."""
    try:
        parameters = inspect.signature(factory).parameters
    except (TypeError, ValueError):
        return args
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return args
    return {k: v for k, v in args.items() if k in parameters}


def _call_factory(name: str, factory, feature_shape, num_classes, model_args, settings):
    if isinstance(factory, type) and issubclass(factory, nn.Module):
        # A module class named by import path: its fields are the model args, with
        # `num_classes` filled in when it has such a field.
        fields = {f for f in getattr(factory, "__dataclass_fields__", {})}
        kwargs = dict(model_args)
        if "num_classes" in fields and "num_classes" not in kwargs:
            kwargs["num_classes"] = num_classes
        unknown = sorted(set(kwargs) - fields)
        if unknown:
            own = sorted(f for f in fields if f not in ("parent", "name"))
            raise ConfigError(f"model {name!r} has no field(s) {', '.join(unknown)}; its "
                              f"fields: {', '.join(own)}")
        call = lambda: factory(**kwargs)  # noqa: E731
    else:
        kwargs = {**_accepted(factory, settings), **model_args}
        unknown = sorted(set(model_args) - set(_accepted(factory, dict(model_args))))
        if unknown:
            raise ConfigError(f"model {name!r} takes no argument(s) {', '.join(unknown)} "
                              f"(model_args)")
        call = lambda: factory(tuple(feature_shape), num_classes, **kwargs)  # noqa: E731
    try:
        built = call()
    except McflError:
        raise
    except Exception as e:  # noqa: BLE001 - any failure of the user's factory is reported
        given = f" with {kwargs}" if kwargs else ""
        raise ConfigError(f"model {name!r} could not be built{given}: {first_line(e)}"
                          ) from None
    if not isinstance(built, (nn.Module, ModelSpec)):
        raise ConfigError(f"model {name!r}: its factory returned {type(built).__name__}; a "
                          f"model factory must return a flax.linen.Module whose __call__(x) "
                          f"gives logits (or a mcfl.models.ModelSpec)")
    return built


def make_model(
    model: Any,
    feature_shape: tuple[int, ...],
    num_classes: int,
    hidden: Sequence[int] = (200, 200),
    conv: str = "auto",
    model_args: Optional[Mapping[str, Any]] = None,
    fast_paths: str = "auto",
    precision: str = "float32",
    backend: Optional[str] = None,
) -> ModelSpec:
    """The `ModelSpec` of `model` for inputs of `feature_shape` and `num_classes` classes.

    `model` is a registered name (``"mlp"``), an import path of a factory or module class
    (``"mypkg.nets:ResNet"``), a factory ``(feature_shape, num_classes, **args) -> module``, a
    flax module, or a `ModelSpec`. `model_args` go to the factory; `hidden` and `conv` too when
    it takes them. A module is checked on the data's shapes (`spec.from_module`), and gets
    the fast paths its structure allows (`structure.with_fast_paths`; "off": none), and
    computes in `precision` (`precision.with_precision`: "bfloat16" on float32 weights).
    `backend`: the platform it is built for ("cpu", "gpu", "tpu"; default: this machine's),
    which decides `conv` "auto" and the fast paths (`mcfl plan` builds a TPU's programs here).

    A user's model (anything but a model mcfl registers itself, `is_users`) is also traced in
    training and evaluation mode as local training and evaluation call it (`spec.check_modes`),
    so that a model failing only there is a one-line `ConfigError` before anything runs."""
    model_args = dict(model_args or {})
    settings = {"hidden": tuple(hidden),
                "conv": resolve_conv(conv, backend) if conv in CONV_IMPLEMENTATIONS else conv}
    if isinstance(model, ModelSpec):
        built, name = model, model.name
    elif isinstance(model, nn.Module):
        built, name = model, type(model).__name__
    else:
        factory = registry.resolve(model) if isinstance(model, str) else model
        if not callable(factory):
            raise ConfigError(f"model must be a name, an import path, a factory or a flax "
                              f"module, got {type(model).__name__}")
        name = model if isinstance(model, str) else getattr(factory, "__name__", "model")
        built = _call_factory(name, factory, feature_shape, num_classes, model_args, settings)
    if isinstance(built, ModelSpec):
        if tuple(built.feature_shape) != tuple(feature_shape):
            raise ConfigError(f"model {name!r} was built for features {built.feature_shape}, "
                              f"the data has {tuple(feature_shape)}")
    else:
        built = from_module(built, feature_shape, num_classes, name)
    if is_users(model):
        check_modes(built, num_classes)
    return with_precision(with_fast_paths(built, fast_paths, conv, backend), precision)


def is_users(model: Any) -> bool:
    """Whether `model` (what `make_model` takes) is a user's: a Python object, an import path,
    or a name registered outside mcfl; mcfl's own registered models are not (its tests check
    them)."""
    if not isinstance(model, str) or ":" in model:
        return True
    factory = registry.resolve(model)
    return not (getattr(factory, "__module__", None) or "").startswith("mcfl.")


# A config's model when the model was given as a Python object (`mcfl.run(config, model=M)`):
# recorded under this prefix, and refused without the object.
PYTHON_PREFIX = "python:"


def model_label(model: Any) -> str:
    """How a model given as a Python object is recorded in its run's config."""
    if isinstance(model, ModelSpec):
        name = model.name
    elif isinstance(model, nn.Module):
        name = type(model).__name__
    else:
        name = getattr(model, "__name__", type(model).__name__)
    return PYTHON_PREFIX + str(name)


def check_model_name(name: str) -> None:
    """A config's model: registered, an importable factory, or a Python object's label."""
    if not (isinstance(name, str) and name.startswith(PYTHON_PREFIX)):
        registry.resolve(name)


def model_of(config_model: str, model: Any = None) -> Any:
    """What to build: the object passed (`model`), else the config's name; a label of a
    Python object without the object is a one-line error."""
    if model is not None:
        return model
    if config_model.startswith(PYTHON_PREFIX):
        raise ConfigError(f"model {config_model!r} was given as a Python object; pass it again: "
                          f"mcfl.run(config, model=...) (or name a registered model or an "
                          f"import path module:Factory)")
    return config_model
