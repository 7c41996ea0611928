"""The command line's flags: one per setting, derived from the config's groups and the
algorithm registry, each read by the setting's own text parser (`settings.TextParser`); and
the flags several commands share (caches, --overwrite)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, Optional

from mcfl import settings
from mcfl.algorithms.framework import registry
from mcfl.apps.user_environment import compile_cache_off
from mcfl.config import OWNER, SHARED_FIELDS, RunConfig, all_keys, from_dict, load_file
from mcfl.data.cache import default_cache_dir
from mcfl.data.settings import DataSettings
from mcfl.errors import ConfigError
from mcfl.runtime import compile_cache

# `mcfl data describe / plot`: the data settings and the seed their data seed defaults to
DATA_FLAGS = ("seed", *settings.fields_of(DataSettings))


class Parser(argparse.ArgumentParser):
    """argparse that reports errors in one line with exit code 2 (no usage dump)."""

    def error(self, message):  # noqa: D401 - argparse's hook
        self.exit(2, f"mcfl: error: {message}\n")


def _help(doc: str, default, owners=()) -> str:
    where = f"[{', '.join(owners)}] " if owners else ""
    shown = "" if default is None else f" (default {default})"
    return (where + doc + shown).replace("%", "%%")


def flag_settings(names=None):
    """(flat key, type hint, help) of every flag: the shared settings, then each
    hyperparameter of the registered algorithms once (with the algorithms that take it)."""
    out = []
    for name, field in SHARED_FIELDS.items():
        if names is None or name in names:
            doc = field.metadata["doc"]
            if name == "algorithm":
                doc = " | ".join(registry.names())
            out.append((name, settings.type_of(OWNER[name], field),
                        _help(doc, field.default)))
    if names is not None:
        return out
    for key, owners in registry.owners_of_keys().items():
        spec = registry.get(owners[0])
        field = settings.fields_of(spec.params)[key]
        defaults = {settings.fields_of(registry.get(o).params)[key].default for o in owners}
        default = field.default if len(defaults) == 1 else None
        out.append((key, settings.type_of(spec.params, field),
                    _help(settings.doc_of(field), default, owners)))
    return out


def add_config_flags(parser: argparse.ArgumentParser, names=None) -> None:
    """A flag for every setting (`names`: only these shared ones), derived from the config
    and the algorithm registry."""
    parser.add_argument("--config", metavar="FILE", help="JSON or TOML config file")
    for key, hint, help_text in flag_settings(names):
        flag = "--" + key.replace("_", "-")
        if hint is bool:
            parser.add_argument(flag, dest=key, action=argparse.BooleanOptionalAction,
                                default=argparse.SUPPRESS, help=help_text)
        else:
            parser.add_argument(flag, dest=key, type=settings.TextParser(hint),
                                default=argparse.SUPPRESS, help=help_text)


def add_cache_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cache-dir", metavar="DIR",
                        help="where prepared datasets are cached (default $MCFL_CACHE_DIR "
                        "or ~/.cache/mcfl)")
    parser.add_argument("--no-cache", action="store_true",
                        help="neither read nor write the dataset cache")


def add_compile_cache_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--no-compile-cache", action="store_true",
                        help="do not keep compiled programs in JAX's persistent cache "
                        "(default: kept under the cache dir's jax-compile/; also "
                        "MCFL_NO_COMPILE_CACHE=1)")


def add_overwrite_flag(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument("--overwrite", action="store_true",
                        help=f"replace the {what} already in --out (default: refuse)")


def add_log_flag(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument("--log", action="append", metavar="SPEC",
                        help=f"send {what} to an experiment tracker: tensorboard:DIR, mlflow, "
                        "mlflow:URI, wandb or wandb:PROJECT (repeatable; mcfl.tracking)")


def add_verbose_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--verbose", action="store_true",
                        help="let XLA, JAX, absl and orbax log to stderr as they do (default: "
                        "their warnings and XLA's alarms are kept off; mcfl.apps.logs)")


def compile_cache_wanted(args) -> bool:
    """Whether the command keeps its programs in JAX's persistent compilation cache: unless
    --no-compile-cache or MCFL_NO_COMPILE_CACHE (`user_environment.compile_cache_off`) say
    no. `mcfl bench` passes the answer to its children as their --no-compile-cache."""
    return not (getattr(args, "no_compile_cache", False) or compile_cache_off())


def setup_compile_cache(args) -> None:
    """Turn JAX's persistent compilation cache on unless the flag or the environment say no
    (`compile_cache_wanted`); `mcfl bench` turns it on in its children, not here."""
    if args.command == "bench" or not compile_cache_wanted(args):
        return  # (the bench parent runs no JAX; each child turns the cache on itself)
    base = Path(args.cache_dir).expanduser() if getattr(args, "cache_dir", None) else None
    compile_cache.enable(None if base is None else base / compile_cache.SUBDIRECTORY)


def cache_dir_from_args(args) -> Optional[Path]:
    if args.no_cache:
        return None
    return Path(args.cache_dir).expanduser() if args.cache_dir else default_cache_dir()


def check_cache_dir(args) -> None:
    """--cache-dir names a folder that is, or can be made, writable (one line if not)."""
    if not getattr(args, "cache_dir", None):
        return
    path = Path(args.cache_dir).expanduser()
    if path.exists() and not path.is_dir():
        raise ConfigError(f"--cache-dir {args.cache_dir!r} is a file; name a folder")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"--cache-dir {args.cache_dir!r} cannot be made: "
                          f"{e.strerror or e}") from None


def config_from_args(args: argparse.Namespace, base: Optional[dict] = None) -> RunConfig:
    """`base`, then the --config file, then the flags given. A flag naming another algorithm
    than the file's changes it as `RunConfig.replace` does: the file's settings the new
    algorithm does not take (its K, the old algorithm's hyperparameters) go with the old one,
    so one experiment file serves each algorithm of its table."""
    values: dict[str, Any] = dict(base or {})
    if getattr(args, "config", None):
        values.update(load_file(args.config))
    keys = all_keys()
    given = {k: v for k, v in vars(args).items() if k in keys}
    named = values.get("algorithm")
    if named is not None and given.get("algorithm", named) != named:
        return from_dict(values).replace(**given)
    return from_dict({**values, **given})
