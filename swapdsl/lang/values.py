"""Values during elaboration, and binding call arguments to parameters."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Union

import attrs

from swapdsl.common.errors import Span, SwpError, did_you_mean
from swapdsl.graph.ir import DType, TensorType


@attrs.frozen
class TensorVal:
    """A tensor of the graph being built, as seen by the program."""

    name: str
    type: TensorType


Value = Union[int, float, bool, str, DType, TensorVal, tuple, range]

REQUIRED: Any = object()


def describe(v: Value) -> str:
    """How a value is named in an error message."""
    if isinstance(v, TensorVal):
        return f"tensor {v.type}"
    if isinstance(v, bool):
        return f"bool `{str(v).lower()}`"
    if isinstance(v, int):
        return f"integer `{v}`"
    if isinstance(v, float):
        return f"float `{v!r}`"
    if isinstance(v, str):
        return f'string "{v}"'
    if isinstance(v, DType):
        return f"dtype `{v}`"
    if isinstance(v, tuple):
        return "tuple (" + ", ".join(describe(x) for x in v) + ")"
    if isinstance(v, range):
        return f"`{v}`"
    return type(v).__name__


@attrs.frozen
class Bound:
    """An argument value bound to a parameter, with where it came from."""

    value: Value
    span: Span


def bind(
    what: str,
    params: Sequence[tuple[str, Any]],
    args: Sequence[tuple[str | None, Value, Span]],
    call_span: Span,
) -> dict[str, Bound]:
    """Match positional and keyword ``args`` to ``params`` (name, default-or-REQUIRED)."""
    names = [p for p, _ in params]
    out: dict[str, Bound] = {}
    positional = [a for a in args if a[0] is None]
    if len(positional) > len(params):
        extra = positional[len(params)]
        raise SwpError(f"{what} takes {_count(len(params))} but {len(positional)} were given", extra[2],
                       hints=[f"parameters: {', '.join(names) or '(none)'}"])
    for (name, _), (_, value, span) in zip(params, positional):
        out[name] = Bound(value, span)
    for key, value, span in args:
        if key is None:
            continue
        if key not in names:
            raise SwpError(f"{what} has no parameter `{key}`", span,
                           hints=did_you_mean(key, names) or [f"parameters: {', '.join(names)}"])
        if key in out:
            raise SwpError(f"{what} got parameter `{key}` twice", span)
        out[key] = Bound(value, span)
    for name, default in params:
        if name not in out:
            if default is REQUIRED:
                raise SwpError(f"{what} is missing argument `{name}`", call_span,
                               hints=[f"parameters: {', '.join(names)}"])
            out[name] = Bound(default, call_span)
    return out


def _count(n: int) -> str:
    return f"{n} argument" + ("" if n == 1 else "s")
