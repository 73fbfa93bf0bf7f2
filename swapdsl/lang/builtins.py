"""The built-in functions of .swp: a table from surface name to IR op(s).

Each entry lists its parameters with a kind (how an argument is checked and
converted) and a default, and a lowering that emits IR ops through an
``Emitter``. Most entries are one op; a few are sugar (transpose, split,
flatten) over the registry's ops.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Protocol

import attrs

from swapdsl.common.errors import Span, SwpError
from swapdsl.graph.ir import DType
from swapdsl.lang.values import Bound, REQUIRED, TensorVal, Value, bind, describe


class Emitter(Protocol):
    def emit(self, op: str, inputs: list[TensorVal], attrs: dict[str, Any], span: Span) -> TensorVal: ...

    def next_seed(self) -> int: ...


Args = dict[str, Any]


@attrs.frozen
class Builtin:
    name: str
    params: tuple[tuple[str, str, Any], ...]  # (name, kind, default)
    lower: Callable[[Emitter, Args, Span], Value]
    static: Callable[..., Value] | None = None  # evaluation on numbers, if any


# ---- argument kinds ----------------------------------------------------------


def _int(v: Value) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _ints(v: Value) -> bool:
    return isinstance(v, tuple) and all(_int(x) for x in v)


def _convert(kind: str, v: Value) -> Any:
    """Check ``v`` against ``kind``; return the converted value or raise (message, expected)."""
    if kind == "tensor" and isinstance(v, TensorVal):
        return v
    if kind == "tensors" and isinstance(v, tuple) and v and all(isinstance(x, TensorVal) for x in v):
        return list(v)
    if kind in ("int", "axis") and _int(v):
        return v
    if kind == "float" and (_int(v) or isinstance(v, float)):
        return float(v)
    if kind == "bool" and isinstance(v, bool):
        return v
    if kind == "pair" and _int(v):
        return (v, v)
    if kind == "pair" and _ints(v) and len(v) == 2:
        return v
    if kind == "pair?" and v is None:
        return None
    if kind == "pair?":
        return _convert("pair", v)
    if kind == "ints" and _ints(v):
        return v
    if kind == "axes" and v is None:
        return None
    if kind == "axes" and (_int(v) or _ints(v)):
        return (v,) if _int(v) else v
    if kind == "sections" and (_int(v) or _ints(v)):
        return v
    if kind == "dtype" and isinstance(v, DType):
        return v
    raise TypeError(_EXPECTED[kind])


_EXPECTED = {
    "tensor": "a tensor",
    "tensors": "a list of tensors",
    "int": "an integer",
    "axis": "an integer axis",
    "float": "a number",
    "bool": "`true` or `false`",
    "pair": "an integer or a pair of integers",
    "pair?": "an integer or a pair of integers",
    "ints": "a list of integers",
    "axes": "an axis or a list of axes",
    "sections": "a number of sections or a list of sizes",
    "dtype": f"a dtype ({', '.join(DType.names())})",
}


def call_builtin(em: Emitter, b: Builtin, args: list[tuple[str | None, Value, Span]], span: Span) -> Value:
    bound = bind(f"`{b.name}`", [(n, d) for n, _, d in b.params], args, span)
    if b.static is not None and all(isinstance(x.value, (int, float)) and not isinstance(x.value, bool)
                                    for x in bound.values()):
        return b.static(*(x.value for x in bound.values()))
    converted: Args = {}
    for name, kind, _ in b.params:
        arg: Bound = bound[name]
        try:
            converted[name] = _convert(kind, arg.value)
        except TypeError as exc:
            raise SwpError(f"argument `{name}` of `{b.name}` must be {exc}, got {describe(arg.value)}",
                           arg.span) from None
    return b.lower(em, converted, span)


# ---- lowerings ---------------------------------------------------------------


def _axis(x: TensorVal, axis: int, span: Span, rank: int | None = None) -> int:
    r = x.type.rank if rank is None else rank
    if not -r <= axis < r:
        raise SwpError(f"axis {axis} is out of range for {x.type} (rank {r})", span)
    return axis % r


def _op(op: str, *tensor_params: str, **attr_params: str) -> Callable[[Emitter, Args, Span], Value]:
    """A lowering to one op: tensors from ``tensor_params``, attrs renamed from ``attr_params``."""

    def lower(em: Emitter, a: Args, span: Span) -> Value:
        ins = [x for p in tensor_params for x in (a[p] if isinstance(a[p], list) else [a[p]])]
        return em.emit(op, ins, {k: a[v] for k, v in attr_params.items()}, span)

    return lower


def _with_axis(op: str) -> Callable[[Emitter, Args, Span], Value]:
    def lower(em: Emitter, a: Args, span: Span) -> Value:
        return em.emit(op, [a["x"]], {"axis": _axis(a["x"], a["axis"], span)}, span)

    return lower


def _dropout(em: Emitter, a: Args, span: Span) -> Value:
    if not 0.0 <= a["p"] < 1.0:
        raise SwpError(f"dropout probability must be in [0, 1), got {a['p']}", span)
    seed = a["seed"] if a["seed"] >= 0 else em.next_seed()
    return em.emit("dropout", [a["x"]], {"p": a["p"], "seed": seed}, span)


def _leaky(em: Emitter, a: Args, span: Span) -> Value:
    if not 0.0 <= a["slope"] < 1.0:
        raise SwpError(f"leaky_relu slope must be in [0, 1), got {a['slope']}", span)
    return em.emit("leaky_relu", [a["x"]], {"slope": a["slope"]}, span)


def _conv2d(em: Emitter, a: Args, span: Span) -> Value:
    for key in ("stride", "dilation"):
        if min(a[key]) < 1:
            raise SwpError(f"conv2d {key} must be positive, got {a[key]}", span)
    if min(a["padding"]) < 0:
        raise SwpError(f"conv2d padding must not be negative, got {a['padding']}", span)
    attrs_ = {k: a[k] for k in ("stride", "padding", "dilation", "groups")}
    return em.emit("conv2d", [a["x"], a["w"]], attrs_, span)


def _pool(op: str) -> Callable[[Emitter, Args, Span], Value]:
    def lower(em: Emitter, a: Args, span: Span) -> Value:
        stride = a["stride"] if a["stride"] is not None else a["kernel"]
        if min(a["kernel"]) < 1 or min(stride) < 1 or min(a["padding"]) < 0:
            raise SwpError(f"`{op}` kernel and stride must be positive and padding not negative", span)
        attrs_ = {"kernel": a["kernel"], "stride": stride, "padding": a["padding"]}
        if "count_include_pad" in a:
            attrs_["count_include_pad"] = a["count_include_pad"]
        return em.emit(op, [a["x"]], attrs_, span)

    return lower


def _matmul(em: Emitter, a: Args, span: Span) -> Value:
    """a @ b, or a @ b^T without materialising the transpose (a tied embedding as the output layer)."""
    return em.emit("matmul_nt" if a["transpose_b"] else "matmul", [a["a"], a["b"]], {}, span)


def _pad2d(em: Emitter, a: Args, span: Span) -> Value:
    if len(a["padding"]) != 4:
        raise SwpError(f"pad2d padding is (top, bottom, left, right), got {list(a['padding'])}", span)
    return em.emit("pad2d", [a["x"]], {"padding": a["padding"]}, span)


def representable(value: float, dtype: DType, span: Span, said: str = "") -> None:
    """Refuse a finite number the dtype it goes into cannot hold (it would be infinite, or wrap); ``said``:
    how the model wrote it, where that differs (an infinite value is then one that overflowed)."""
    low, high = dtype.bounds
    if (said and math.isinf(value)) or (math.isfinite(value) and not low <= value <= high):
        limits = f"from {low:,} to {high:,}" if not dtype.is_float else f"at most {high:g} in magnitude"
        whole = not dtype.is_float and math.isfinite(value) and float(value).is_integer()
        shown = f"{int(value):,}" if whole else f"{value:g}"
        raise SwpError(f"{said}{shown}{', which' if said else ''} is out of the range of {dtype} ({limits})", span,
                       hints=["scale the model so its constants fit, or use a wider dtype"])


def _fill(value: float | None):  # noqa: ANN202
    def lower(em: Emitter, a: Args, span: Span) -> Value:
        if min(a["shape"], default=1) < 1:
            raise SwpError(f"a tensor's dimensions must be positive, got {list(a['shape'])}", span)
        v = a["value"] if value is None else value
        representable(v, a["dtype"], span)
        return em.emit("fill", [], {"shape": a["shape"], "value": v, "dtype": a["dtype"].label}, span)

    return lower


def _reshape_to(em: Emitter, x: TensorVal, shape: tuple[int, ...], span: Span) -> TensorVal:
    unknown = [i for i, d in enumerate(shape) if d == -1]
    if len(unknown) > 1 or any(d < -1 or d == 0 for d in shape):
        raise SwpError(f"reshape target {list(shape)} must have positive sizes and at most one -1", span)
    if unknown:
        known = math.prod(d for d in shape if d != -1)
        if x.type.numel % known:
            raise SwpError(f"cannot reshape {x.type} ({x.type.numel} elements) to {list(shape)}", span)
        shape = tuple(x.type.numel // known if d == -1 else d for d in shape)
    return em.emit("reshape", [x], {"shape": shape}, span)


def _reshape(em: Emitter, a: Args, span: Span) -> Value:
    return _reshape_to(em, a["x"], a["shape"], span)


def _flatten(em: Emitter, a: Args, span: Span) -> Value:
    x = a["x"]
    start = _axis(x, a["start"], span)
    return _reshape_to(em, x, x.type.shape[:start] + (math.prod(x.type.shape[start:]),), span)


def _permute(em: Emitter, a: Args, span: Span) -> Value:
    perm = tuple(_axis(a["x"], p, span) for p in a["perm"])
    return em.emit("permute", [a["x"]], {"perm": perm}, span)


def _transpose(em: Emitter, a: Args, span: Span) -> Value:
    x = a["x"]
    if x.type.rank < 2:
        raise SwpError(f"transpose needs a tensor of rank 2 or more, got {x.type}", span)
    i, j = _axis(x, a["a"], span), _axis(x, a["b"], span)
    perm = list(range(x.type.rank))
    perm[i], perm[j] = perm[j], perm[i]
    return em.emit("permute", [x], {"perm": tuple(perm)}, span)


def _concat(em: Emitter, a: Args, span: Span) -> Value:
    xs = a["xs"]
    return em.emit("concat", xs, {"axis": _axis(xs[0], a["axis"], span)}, span)


def slice_axis(em: Emitter, x: TensorVal, axis: int, start: int, stop: int, step: int, span: Span) -> TensorVal:
    """``x[start:stop:step]`` along ``axis``, with Python's clamping of the bounds."""
    if step < 1:
        raise SwpError(f"slice step must be positive, got {step}", span)
    start, stop, step = slice(start, stop, step).indices(x.type.shape[axis])
    if len(range(start, stop, step)) < 1:
        raise SwpError(f"slice {start}:{stop}:{step} of dimension {axis} (size {x.type.shape[axis]}) is empty",
                       span)
    return em.emit("slice", [x], {"axis": axis, "start": start, "stop": stop, "step": step}, span)


def _slice(em: Emitter, a: Args, span: Span) -> Value:
    x = a["x"]
    return slice_axis(em, x, _axis(x, a["axis"], span), a["start"], a["stop"], a["step"], span)


def _split(em: Emitter, a: Args, span: Span) -> Value:
    x = a["x"]
    axis = _axis(x, a["axis"], span)
    size = x.type.shape[axis]
    sec = a["sections"]
    if isinstance(sec, int):
        if sec < 1 or size % sec:
            raise SwpError(f"cannot split dimension {axis} of size {size} into {sec} equal parts", span)
        sizes = (size // sec,) * sec
    else:
        sizes = sec
        if sum(sizes) != size or min(sizes) < 1:
            raise SwpError(f"split sizes {list(sizes)} do not add up to dimension {axis} of size {size}", span)
    starts = [sum(sizes[:i]) for i in range(len(sizes))]
    return tuple(slice_axis(em, x, axis, s, s + n, 1, span) for s, n in zip(starts, sizes))


def _reduce(op: str) -> Callable[[Emitter, Args, Span], Value]:
    def lower(em: Emitter, a: Args, span: Span) -> Value:
        x = a["x"]
        axes = tuple(range(x.type.rank)) if a["axes"] is None else a["axes"]
        norm = tuple(sorted({_axis(x, ax, span) for ax in axes}))
        return em.emit(op, [x], {"axes": norm, "keepdims": a["keepdims"]}, span)

    return lower


def _cast(em: Emitter, a: Args, span: Span) -> Value:
    return em.emit("cast", [a["x"]], {"dtype": a["dtype"].label}, span)


def _unary(name: str, static: Callable[..., Value] | None = None) -> Builtin:
    return Builtin(name, (("x", "tensor", REQUIRED),), _op(name, "x"), static)


def _table() -> dict[str, Builtin]:
    X = ("x", "tensor", REQUIRED)
    pool = (X, ("kernel", "pair", REQUIRED), ("stride", "pair?", None), ("padding", "pair", 0))
    avg_pool = pool + (("count_include_pad", "bool", True),)
    reduce_ = (X, ("axes", "axes", None), ("keepdims", "bool", False))
    defs = [
        Builtin("matmul", (("a", "tensor", REQUIRED), ("b", "tensor", REQUIRED), ("transpose_b", "bool", False)),
                _matmul),
        *(Builtin(n, (("a", "tensor", REQUIRED), ("b", "tensor", REQUIRED)), _op(n, "a", "b"))
          for n in ("add", "sub", "mul", "div")),
        _unary("neg", lambda v: -v),
        _unary("relu"),
        _unary("gelu"),
        _unary("tanh", math.tanh),
        _unary("sigmoid"),
        _unary("silu"),
        _unary("erf", math.erf),
        Builtin("leaky_relu", (X, ("slope", "float", 0.01)), _leaky),
        _unary("exp", math.exp),
        _unary("log", _static_log),
        _unary("sqrt", _static_sqrt),
        Builtin("softmax", (X, ("axis", "axis", -1)), _with_axis("softmax")),
        Builtin("log_softmax", (X, ("axis", "axis", -1)), _with_axis("log_softmax")),
        Builtin("layer_norm", (X, ("scale", "tensor", REQUIRED), ("shift", "tensor", REQUIRED),
                               ("eps", "float", 1e-5)), _op("layer_norm", "x", "scale", "shift", eps="eps")),
        Builtin("rms_norm", (X, ("scale", "tensor", REQUIRED), ("eps", "float", 1e-6)),
                _op("rms_norm", "x", "scale", eps="eps")),
        Builtin("batch_norm", (X, ("scale", "tensor", REQUIRED), ("shift", "tensor", REQUIRED),
                               ("eps", "float", 1e-5)), _op("batch_norm", "x", "scale", "shift", eps="eps")),
        Builtin("dropout", (X, ("p", "float", 0.1), ("seed", "int", -1)), _dropout),
        Builtin("conv2d", (X, ("w", "tensor", REQUIRED), ("stride", "pair", 1), ("padding", "pair", 0),
                           ("dilation", "pair", 1), ("groups", "int", 1)), _conv2d),
        Builtin("max_pool2d", pool, _pool("max_pool2d")),
        Builtin("avg_pool2d", avg_pool, _pool("avg_pool2d")),
        Builtin("global_avg_pool", (X,), _op("global_avg_pool", "x")),
        Builtin("pad2d", (X, ("padding", "ints", REQUIRED)), _pad2d),
        Builtin("causal_mask", (X, ("fill", "float", float("-inf"))), _op("causal_mask", "x", fill="fill")),
        Builtin("rope", (X, ("base", "float", 10000.0)), _op("rope", "x", base="base")),
        Builtin("reshape", (X, ("shape", "ints", REQUIRED)), _reshape),
        Builtin("flatten", (X, ("start", "axis", 1)), _flatten),
        Builtin("permute", (X, ("perm", "ints", REQUIRED)), _permute),
        Builtin("transpose", (X, ("a", "axis", -2), ("b", "axis", -1)), _transpose),
        Builtin("concat", (("xs", "tensors", REQUIRED), ("axis", "axis", 0)), _concat),
        Builtin("split", (X, ("sections", "sections", REQUIRED), ("axis", "axis", -1)), _split),
        Builtin("slice", (X, ("axis", "axis", REQUIRED), ("start", "int", REQUIRED), ("stop", "int", REQUIRED),
                          ("step", "int", 1)), _slice),
        Builtin("embedding", (("ids", "tensor", REQUIRED), ("table", "tensor", REQUIRED)),
                _op("embedding", "ids", "table")),
        Builtin("sum", reduce_, _reduce("sum")),
        Builtin("mean", reduce_, _reduce("mean")),
        Builtin("argmax", (X, ("axis", "axis", -1)), _with_axis("argmax")),
        Builtin("softmax_cross_entropy", (("logits", "tensor", REQUIRED), ("labels", "tensor", REQUIRED)),
                _op("softmax_cross_entropy", "logits", "labels")),
        Builtin("mse_loss", (("prediction", "tensor", REQUIRED), ("target", "tensor", REQUIRED)),
                _op("mse_loss", "prediction", "target")),
        Builtin("cast", (X, ("dtype", "dtype", REQUIRED)), _cast),
        Builtin("zeros", (("shape", "ints", REQUIRED), ("dtype", "dtype", DType.f32)), _fill(0.0)),
        Builtin("full", (("shape", "ints", REQUIRED), ("value", "float", REQUIRED), ("dtype", "dtype", DType.f32)),
                _fill(None)),
    ]
    return {b.name: b for b in defs}


def _static_sqrt(v: float) -> float:
    if v < 0:
        raise SwpError(f"sqrt of a negative number ({v})")
    return math.sqrt(v)


def _static_log(v: float) -> float:
    if v <= 0:
        raise SwpError(f"log of a number that is not positive ({v})")
    return math.log(v)


BUILTINS: dict[str, Builtin] = _table()
