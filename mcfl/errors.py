"""Exceptions that carry a message meant for the user (the CLI prints them in one line)."""


class McflError(Exception):
    """Base class: bad input or a run that cannot go on, with a message naming the cause."""


class ConfigError(McflError, ValueError):
    """A configuration value is unknown, out of range or inconsistent."""


class DataError(McflError, ValueError):
    """A dataset is missing, malformed, or cannot be split as asked."""


class TrainingDivergedError(McflError, FloatingPointError):
    """Training produced NaN or inf; results up to the previous round were kept."""


def first_line(error: BaseException) -> str:
    """An exception as one line for a message: its type and the first line of its text (at
    most 300 characters), e.g. "ValueError: boom"."""
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"[:300]


def choice_error(name: str, value, allowed) -> ConfigError:
    """`ConfigError` for a value outside a fixed set, naming the allowed ones."""
    allowed = ", ".join(str(a) for a in allowed)
    return ConfigError(f"unknown {name} {value!r}; allowed: {allowed}")
