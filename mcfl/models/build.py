"""Build the model a run names: a registered name, an import path, a flax module or a ready
`ModelSpec` (what `mcfl.run(config, model=...)` accepts)."""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Mapping, Sequence
from typing import Any, Optional

import flax.linen as nn

from mcfl.errors import ConfigError, McflError, first_line
from mcfl.models import registry
from mcfl.models.paper import CONV_IMPLEMENTATIONS, resolve_conv
from mcfl.models.precision import with_precision
from mcfl.models.spec import ModelSpec, check_modes, from_module
from mcfl.models.structure import uses_conv, with_fast_paths

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


@dataclasses.dataclass(frozen=True)
class ModelChoice:
    """The model a run trains, as its settings resolve it before the data's shapes are known:
    what to build (`model`: a registered name, an import path, or a user's Python object,
    recorded as `label`), the factory's `args`, MLP widths `hidden` (None when the factory
    takes none), the convolution `conv`, the fast paths, the precision and where batch-norm
    statistics live (`norm_state`: "global" or "local", FedBN). `build` makes the
    `ModelSpec`; equal choices build equal models (a Python object compares by its label)."""

    model: Any = dataclasses.field(compare=False)
    label: str
    args: Any = dataclasses.field(default_factory=dict)
    hidden: Optional[tuple[int, ...]] = None
    conv: str = "auto"
    fast_paths: str = "auto"
    precision: str = "float32"
    norm_state: str = "global"

    def build(self, feature_shape: tuple[int, ...], num_classes: int,
              backend: Optional[str] = None) -> ModelSpec:
        """The `ModelSpec` for the data's shapes (`make_model`); `conv` set to other than
        auto on a model without convolutions that its factory would compute is refused."""
        built = make_model(self.model, feature_shape, num_classes,
                           (200, 200) if self.hidden is None else self.hidden, self.conv,
                           model_args=self.args, fast_paths=self.fast_paths,
                           precision=self.precision, backend=backend)
        if self.conv != "auto" and not takes_setting(self.model, "conv"):
            convolutions = uses_conv(built)
            if self.fast_paths == "auto" and convolutions:
                return built
            why = ("its fast paths are off (--fast-paths off)" if convolutions
                   else "it has no convolutions")
            raise ConfigError(f"--conv {self.conv} says how a model's convolutions are "
                              f"computed; model {self.label!r} takes no conv and {why}")
        return built

    def describe(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out.pop("model")
        out["args"] = dict(self.args)
        out["hidden"] = None if self.hidden is None else list(self.hidden)
        return out


def takes_setting(model: Any, name: str) -> bool:
    """Whether `model`'s factory (a registered name or an import path of a factory) receives
    the run setting `name` (`SETTING_ARGS`: hidden, conv), by its signature; a module class,
    a flax module or a `ModelSpec` receives none."""
    if isinstance(model, str):
        if model.startswith(PYTHON_PREFIX):
            return False
        model = registry.resolve(model)
    if isinstance(model, (nn.Module, ModelSpec)) or (
            isinstance(model, type) and issubclass(model, nn.Module)) or not callable(model):
        return False
    return name in _accepted(model, {name: None})


def choose_model(model: Any, label: str, args, hidden: tuple[int, ...], conv: str,
                 fast_paths: str, precision: str, norm_state: str,
                 default_hidden: tuple[int, ...] = (200, 200)) -> ModelChoice:
    """The `ModelChoice` of these settings (the flags of the same names, `model` the object
    or name to build); MLP widths other than the default for a model whose factory takes no
    `hidden` are refused in one line."""
    takes_hidden = takes_setting(model, "hidden")
    if not takes_hidden and tuple(hidden) != tuple(default_hidden):
        raise ConfigError(f"--hidden {','.join(map(str, hidden))} gives an MLP's hidden widths; "
                          f"model {label!r} takes no hidden widths")
    return ModelChoice(model, label, args, tuple(hidden) if takes_hidden else None, conv,
                       fast_paths, precision, norm_state)
