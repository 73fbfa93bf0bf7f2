"""Constant folding, keyed by ONNX op type: a node whose inputs are all constants (the shape arithmetic
an exporter leaves: Shape, Gather, Concat, Unsqueeze, ...) evaluated with NumPy at import."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from swapdsl.importer.context import flag, np_dtype, onnx_dtype, reshape_target, unsupported

_BOOL = 9  # ONNX's bool: a mask's type, which constants may have and tensors may not
Fold = Callable[[Any, list[Any], dict[str, Any]], list[np.ndarray]]


def _constant(node: Any, ins: list[Any], a: dict[str, Any]) -> list[np.ndarray]:
    from onnx import numpy_helper

    if "value" in a:
        return [np.asarray(numpy_helper.to_array(a["value"]))]
    for key, dtype in (("value_float", np.float32), ("value_floats", np.float32), ("value_int", np.int64),
                       ("value_ints", np.int64)):
        if key in a:
            return [np.asarray(a[key], dtype)]
    raise unsupported(node, "a Constant without a tensor, float or int value")


def _fold_reshape(node: Any, ins: list[Any], a: dict[str, Any]) -> list[np.ndarray]:
    return [ins[0].reshape(reshape_target(ins[0].shape, ins[1], node, flag(a, "allowzero", 0, node)))]


def _fold_slice(node: Any, ins: list[Any], a: dict[str, Any]) -> list[np.ndarray]:
    x, starts, ends = ins[:3]
    axes = range(len(starts)) if len(ins) < 4 or ins[3] is None else ins[3]
    steps = [1] * len(starts) if len(ins) < 5 or ins[4] is None else ins[4]
    index = [slice(None)] * x.ndim
    for axis, s, e, step in zip(axes, starts, ends, steps):
        index[int(axis)] = slice(int(s), int(max(min(e, 2**62), -(2**62))), int(step))
    return [x[tuple(index)]]


def _int_div(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    if np.issubdtype(x.dtype, np.integer) and np.issubdtype(y.dtype, np.integer):
        return (np.trunc(x / y)).astype(x.dtype)
    return x / y


def _f(fn: Callable[..., Any]) -> Fold:
    return lambda node, ins, a: [np.asarray(fn(*ins))]


FOLD: dict[str, Fold] = {
    "Constant": _constant,
    "Identity": _f(lambda x: x),
    "Cast": lambda node, ins, a: [ins[0].astype(np.bool_ if a["to"] == _BOOL else np_dtype(onnx_dtype(a["to"], node)))],
    "Add": _f(np.add), "Sub": _f(np.subtract), "Mul": _f(np.multiply), "Div": _f(_int_div),
    "Neg": _f(np.negative), "Sqrt": _f(np.sqrt), "Equal": _f(np.equal), "Where": _f(np.where),
    "Min": _f(np.minimum), "Max": _f(np.maximum),
    "Concat": lambda node, ins, a: [np.concatenate([np.atleast_1d(x) for x in ins], axis=a["axis"])],
    "Gather": lambda node, ins, a: [np.take(ins[0], ins[1].astype(np.int64), axis=a.get("axis", 0))],
    "Unsqueeze": lambda node, ins, a: [np.expand_dims(ins[0], tuple(int(i) for i in ins[1].reshape(-1)))],
    "Squeeze": lambda node, ins, a: [np.squeeze(ins[0], None if len(ins) < 2 or ins[1] is None
                                                else tuple(int(i) for i in ins[1].reshape(-1)))],
    "Reshape": _fold_reshape, "Slice": _fold_slice,
    "Transpose": lambda node, ins, a: [np.transpose(ins[0], a.get("perm"))],
    "Range": _f(lambda s, e, d: np.arange(s, e, d, dtype=np.result_type(s, e, d))),
    "ConstantOfShape": lambda node, ins, a: [np.full(tuple(int(d) for d in ins[0]), _fill_value(a))],
    "Expand": _f(lambda x, s: np.broadcast_to(x, np.broadcast_shapes(x.shape, tuple(int(d) for d in s))).copy()),
    "ReduceProd": lambda node, ins, a: [np.prod(ins[0], keepdims=bool(a.get("keepdims", 1)))],
    # what the dynamo exporter (optimize=False) leaves: masks and rotary tables from positions
    "Shape": lambda node, ins, a: [np.array(ins[0].shape[a.get("start", 0):a.get("end", ins[0].ndim)], np.int64)],
    "CastLike": lambda node, ins, a: [ins[0].astype(ins[1].dtype)],
    "Less": _f(np.less), "LessOrEqual": _f(np.less_equal), "Greater": _f(np.greater),
    "GreaterOrEqual": _f(np.greater_equal), "And": _f(np.logical_and), "Or": _f(np.logical_or),
    "Not": _f(np.logical_not), "IsNaN": _f(np.isnan), "Cos": _f(np.cos), "Sin": _f(np.sin),
    "Pow": _f(lambda x, p: np.power(x, p.astype(x.dtype))), "Reciprocal": _f(np.reciprocal),
    "MatMul": _f(np.matmul), "CumSum": lambda node, ins, a: [_cumsum(ins[0], ins[1], a)],
    "GatherElements": lambda node, ins, a: [np.take_along_axis(ins[0], ins[1].astype(np.int64), a.get("axis", 0))],
    "GatherND": lambda node, ins, a: [_gather_nd(ins[0], ins[1].astype(np.int64), int(a.get("batch_dims", 0)))],
    # (the TorchScript exporter's causal mask for scaled_dot_product_attention(is_causal=True))
    "Trilu": lambda node, ins, a: [_trilu(ins[0], 0 if len(ins) < 2 or ins[1] is None else int(ins[1].reshape(())),
                                          flag(a, "upper", 1, node))],
}


def _trilu(x: np.ndarray, k: int, upper: int) -> np.ndarray:
    if x.ndim < 2:
        raise ValueError("Trilu takes a tensor of at least 2 dimensions")
    return np.triu(x, k) if upper else np.tril(x, k)


def _cumsum(x: np.ndarray, axis: np.ndarray, a: dict[str, Any]) -> np.ndarray:
    ax = int(axis.reshape(()))
    y = np.flip(x, ax) if a.get("reverse", 0) else x
    out = np.cumsum(y, axis=ax, dtype=x.dtype)
    if a.get("exclusive", 0):
        out = out - y
    return np.flip(out, ax) if a.get("reverse", 0) else out


def _gather_nd(data: np.ndarray, indices: np.ndarray, batch_dims: int) -> np.ndarray:
    """ONNX GatherND: the last axis of ``indices`` indexes ``data`` after its first ``batch_dims`` axes."""
    if batch_dims:
        return np.stack([_gather_nd(d, i, batch_dims - 1) for d, i in zip(data, indices, strict=True)])
    return data[tuple(np.moveaxis(indices, -1, 0))]


def _fill_value(a: dict[str, Any]) -> np.ndarray:
    from onnx import numpy_helper

    return np.asarray(numpy_helper.to_array(a["value"])).reshape(-1)[0] if "value" in a else np.float32(0)
