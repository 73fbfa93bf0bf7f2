"""Validators for the library's option records (``attrs`` fields) and its functions' arguments: a value of
the wrong type or out of range is an SwpError naming the field or argument, as the command line's own
checks would say it, not a TypeError deep inside a run. The converters first take what stands for the
value (a NumPy integer, a Path)."""

from __future__ import annotations

import math
import numbers
import os
from collections.abc import Callable
from typing import Any

import numpy as np

from swapdsl.common.errors import SwpError

NAME_MAX = 255  # bytes in one part of a path (Linux and macOS file systems)

Validator = Callable[[Any, Any, Any], None]


def as_whole(value: Any) -> Any:
    """A NumPy integer as an int; anything else as it is (for the validator to judge)."""
    return int(value) if isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_)) else value


def as_number(value: Any) -> Any:
    return float(value) if isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_)) else value


def as_text(value: Any) -> Any:
    return os.fspath(value) if isinstance(value, os.PathLike) else value


def as_flag(value: Any) -> Any:
    return bool(value) if isinstance(value, np.bool_) else value


def whole(low: int, high: int | None = None, optional: bool = False) -> Validator:
    """An integer in [low, high] (None too, where ``optional``)."""

    def check(_: Any, field: Any, value: Any) -> None:
        whole_arg(value, field.name, low, high, optional)

    return check


def positive(_: Any, field: Any, value: Any) -> None:
    """A positive, finite number."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (math.isfinite(value) and value > 0):
        raise SwpError(f"`{field.name}` must be a positive, finite number, not {value!r}")


def text(optional: bool = False) -> Validator:
    """A file name (None too, where ``optional``)."""

    def check(_: Any, field: Any, value: Any) -> None:
        if not (isinstance(value, str) or (value is None and optional)):
            raise SwpError(f"`{field.name}` must be a string{' or None' if optional else ''}, not {value!r}")
        flag = f"--{field.name.replace('_', '-')}"  # (an option of a run: named as the run's other errors do)
        if value is not None and "\0" in value:  # (no system call takes one)
            raise SwpError(f"{flag} holds a NUL byte")
        if value is not None:
            not_too_long(value, flag)

    return check


def flag(_: Any, field: Any, value: Any) -> None:
    flag_arg(value, field.name)


def one_of(choices: tuple[str, ...]) -> Validator:
    def check(_: Any, field: Any, value: Any) -> None:
        choice_arg(value, field.name, choices)

    return check


def callable_or_none(_: Any, field: Any, value: Any) -> None:
    if value is not None and not callable(value):
        raise SwpError(f"`{field.name}` must be a function or None, not {value!r:.60}")


# ---- a function's arguments (the same rules, by the argument's name) --------------------------------------

def path_arg(value: Any, name: str, optional: bool = False, flag: str | None = None) -> str | None:
    """A file or folder argument as text: a string or a Path (None too, where ``optional``). ``flag``: the
    command-line option that gives it, which names it where the file system would refuse it."""
    if value is None and optional:
        return None
    value = as_text(value)
    if not isinstance(value, str) or not value.strip() or "\0" in value:
        raise SwpError(f"`{name}` must name a file (a string or a Path), not {value!r:.60}")
    not_too_long(value, flag or f"`{name}`")
    return value


def too_long(path: str) -> bool:
    """Whether a part of ``path`` is longer than a file system takes."""
    return any(len(part) > NAME_MAX for part in os.fsencode(path).split(b"/"))


def not_too_long(path: str, name: str) -> None:
    """The system's own refusal of a name too long, said before it is asked."""
    if too_long(path):
        shown = path if len(path) <= 60 else f"{path[:57]}..."
        raise SwpError(f"{name} `{shown}`: a part of the file name is longer than {NAME_MAX} bytes")


def whole_arg(value: Any, name: str, low: int, high: int | None = None, optional: bool = False) -> int | None:
    """An integer argument in [low, high] (a NumPy integer too; never a bool)."""
    if value is None and optional:
        return None
    value = as_whole(value)
    if not isinstance(value, int) or isinstance(value, bool) or value < low or (high is not None and value > high):
        bounds = f"at least {low}" if high is None else f"from {low} to {high}"
        raise SwpError(f"`{name}` must be an integer {bounds}, not {value!r:.60}")
    return value


def flag_arg(value: Any, name: str) -> bool:
    value = as_flag(value)
    if not isinstance(value, bool):
        raise SwpError(f"`{name}` must be True or False, not {value!r:.60}")
    return value


def choice_arg(value: Any, name: str, choices: tuple[str, ...] | list[str]) -> str:
    if not isinstance(value, str) or value not in choices:
        raise SwpError(f"`{name}` must be one of {', '.join(choices)}, not {value!r:.60}")
    return value


def instance_arg(value: Any, name: str, kind: type, what: str) -> Any:
    if not isinstance(value, kind):
        raise SwpError(f"`{name}` must be {what}, not {type(value).__name__}")
    return value


def plain_number(value: Any) -> Any:
    """A NumPy scalar as the Python number it stands for (a model argument given as np.int64(8))."""
    return value.item() if isinstance(value, np.generic) else value
