"""The import table, keyed by ONNX op type: each rule writes a node that computes on the model's tensors
as `.swp` (a node whose inputs are all constants is folded instead: ``fold``). docs/import.md lists it."""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

import numpy as np

from swapdsl.common.errors import SwpError
from swapdsl.importer.context import (Lowering, NanTest, Tensor, TensorList, attributes, flag, np_dtype,
                                      onnx_dtype, reshape_target, swp_dtype, unsupported)

Rule = Callable[[Lowering, Any, dict[str, Any]], None]


def _num(v: float) -> str:
    """A number as `.swp` writes it: float32's shortest text (ONNX's float attributes are float32)."""
    if not np.isfinite(v):
        raise SwpError(f"a constant {v} is not a finite number")
    text = repr(float(v)) if float(np.float32(v)) != float(v) else str(np.float32(v))
    text = text if any(c in text for c in ".e") else f"{text}.0"
    return f"({text})" if text.startswith("-") else text


def _axis(axis: int, rank: int, node: Any) -> int:
    if not -rank <= axis < rank:
        raise unsupported(node, f"axis {axis} is outside a tensor of rank {rank}")
    return axis % rank


# ---- element-wise ----------------------------------------------------------------------


def _unary(fn: str) -> Rule:
    def rule(lw: Lowering, node: Any, a: dict[str, Any]) -> None:
        x = lw.tensor(node, 0)
        lw.emit(node, f"{fn}({x.name})", x.shape, x.dtype)

    return rule


def _leaky_relu(lw: Lowering, node: Any, a: dict[str, Any]) -> None:
    x = lw.tensor(node, 0)
    lw.emit(node, f"leaky_relu({x.name}, slope = {_num(a.get('alpha', 0.01))})", x.shape, x.dtype)


def _hard(lw: Lowering, node: Any, a: dict[str, Any]) -> None:
    """HardSigmoid max(0, min(1, alpha x + beta)) as relu(t) - relu(t - 1); HardSwish x times it (alpha
    1/6, beta 1/2): no op of their own, the same numbers and gradients almost everywhere."""
    x = lw.tensor(node, 0)
    alpha, beta = (a.get("alpha", 0.2), a.get("beta", 0.5)) if node.op_type == "HardSigmoid" else (1 / 6, 0.5)
    t = f"{x.name} * {_num(np.float32(alpha))} + {_num(np.float32(beta))}"
    gate = f"relu({t}) - relu({t} - 1.0)"
    lw.emit(node, gate if node.op_type == "HardSigmoid" else f"{x.name} * ({gate})", x.shape, x.dtype)


def _clip(lw: Lowering, node: Any, a: dict[str, Any]) -> None:
    """Clip to [lo, hi] (ReLU6: [0, 6]) as lo + relu(x - lo) - relu(x - hi): no op of its own."""
    x = lw.tensor(node, 0)
    lo, hi = (lw.const(node, i) for i in (1, 2))
    bounds = [None if v is None else float(np.asarray(v).reshape(-1)[0]) for v in (lo, hi)]
    if any(v is not None and np.asarray(v).size != 1 for v in (lo, hi)) or any(
            b is not None and not np.isfinite(b) for b in bounds):
        raise unsupported(node, "bounds other than constant finite scalars")
    lo_f, hi_f = bounds
    if lo_f is not None and hi_f is not None and lo_f > hi_f:
        raise unsupported(node, f"an empty range [{lo_f}, {hi_f}]")
    low = x.name if lo_f is None else f"relu({x.name})" if lo_f == 0 else \
        f"relu({x.name} - {_num(np.float32(lo_f))}) + {_num(np.float32(lo_f))}"
    expr = low if hi_f is None else f"{low} - relu({x.name} - {_num(np.float32(hi_f))})"
    lw.emit(node, expr, x.shape, x.dtype)


def _reciprocal(lw: Lowering, node: Any, a: dict[str, Any]) -> None:
    x = lw.tensor(node, 0)
    lw.emit(node, f"1.0 / {x.name}", x.shape, x.dtype)


def _isnan(lw: Lowering, node: Any, a: dict[str, Any]) -> None:
    lw.env[node.output[0]] = NanTest(lw.tensor(node, 0))


def _where(lw: Lowering, node: Any, a: dict[str, Any]) -> None:
    """Where(IsNaN(x), c, x): the guard exporters put after a softmax whose row may be all masked (NaN
    there becomes c). Imported as x itself: such a row is a NaN that stops training (`--on-nonfinite`).
    Where over a constant condition that puts one constant above the diagonal and the scores elsewhere
    (`scores.masked_fill(mask == 0, -inf)` with a lower-triangular buffer) is `causal_mask`."""
    cond, then, other = (lw.get(node, i) for i in range(3))
    if isinstance(cond, NanTest) and other is cond.of and isinstance(then, np.ndarray) and then.size == 1:
        lw.env[node.output[0]] = cond.of
        note = "Where(IsNaN(x), c, x) after a softmax imported as x: a fully masked row is NaN, not c"
        if note not in lw.notes:
            lw.notes.append(note)
        return
    if isinstance(cond, np.ndarray) and _fills_above_the_diagonal(lw, node, cond, then, other):
        return
    raise unsupported(node, "Where on tensors other than the NaN guard Where(IsNaN(x), c, x) or a causal "
                            "mask (one constant above the diagonal, over a constant condition)")


def _fills_above_the_diagonal(lw: Lowering, node: Any, cond: np.ndarray, then: Any, other: Any) -> bool:
    if isinstance(then, Tensor) == isinstance(other, Tensor) or cond.dtype != np.bool_:
        return False
    t, fill, filled = (then, other, ~cond) if isinstance(then, Tensor) else (other, then, cond)
    n = t.shape[-1] if len(t.shape) >= 2 else 0
    if not isinstance(fill, np.ndarray) or fill.size != 1 or fill.dtype.name not in ("float32", "bfloat16", "float16") \
            or swp_dtype(fill) != t.dtype or np.isnan(np.float32(fill.reshape(()))) \
            or n == 0 or t.shape[-2] != n or filled.ndim < 2 or filled.shape[-2:] != (n, n) \
            or np.broadcast_shapes(t.shape, filled.shape, fill.shape) != t.shape:
        return False
    above = np.triu(np.ones((n, n), bool), 1)  # (compared at the condition's size, not the scores')
    if not np.array_equal(filled.reshape(-1, n, n), np.broadcast_to(above, (filled.size // (n * n), n, n))):
        return False
    _causal_mask(lw, node, t, fill.reshape(()))
    return True


def _causal_mask(lw: Lowering, node: Any, t: Tensor, fill: Any) -> None:
    value = np.float32(fill)
    fill_text = "" if value == -np.inf else f", fill = {_num(value)}"  # (-inf is the default)
    lw.emit(node, f"causal_mask({t.name}{fill_text})", t.shape, t.dtype)


def _gelu(lw: Lowering, node: Any, a: dict[str, Any]) -> None:
    """`gelu` is the tanh form; the exact one (PyTorch's default) is written with `erf`."""
    form = a.get("approximate", "none")
    if form == "tanh":
        _unary("gelu")(lw, node, a)
    elif form == "none":
        x = lw.tensor(node, 0)
        lw.emit(node, f"0.5 * {x.name} * (1.0 + erf({x.name} * {_num(np.float32(0.5 ** 0.5))}))", x.shape, x.dtype)
    else:
        raise unsupported(node, f"approximate = {str(form)[:40]!r}: GELU is exact (none) or tanh")


_SYMBOL = {"Add": "+", "Sub": "-", "Mul": "*", "Div": "/"}


def _binary(lw: Lowering, node: Any, a: dict[str, Any]) -> None:
    op = _SYMBOL[node.op_type]
    x, y = lw.get(node, 0), lw.get(node, 1)
    if node.op_type == "Add" and (_adds_a_mask(lw, node, x, y) or _adds_rotary(lw, node)):
        return
    if node.op_type == "Add":
        _freeze_a_stored_mask(lw, node, x, y)
    scalar = next((i for i, v in enumerate((x, y)) if isinstance(v, np.ndarray) and v.size == 1), None)
    if scalar is not None:
        t = lw.tensor(node, 1 - scalar)
        c = _num(np.asarray((x, y)[scalar]).reshape(()).item())
        expr = f"{t.name} {op} {c}" if scalar == 1 else f"{c} {op} {t.name}"
        lw.emit(node, expr, t.shape, t.dtype)
        return
    tx, ty = lw.tensor(node, 0), lw.tensor(node, 1)
    lw.emit(node, f"{tx.name} {op} {ty.name}", np.broadcast_shapes(tx.shape, ty.shape), tx.dtype)


def _adds_a_mask(lw: Lowering, node: Any, x: Any, y: Any) -> bool:
    """Scores plus the exporter's mask constant: all zeros (BERT without padding) is the scores themselves;
    0 on and below the diagonal and one very negative value above it (a constant, or a buffer stored as a
    weight) is `causal_mask(x, fill = that)` (bit for bit: x + min is min), which needs no weight and
    follows the batch."""
    (t, i), c = ((x, 0), y) if isinstance(x, Tensor) else ((y, 1), x)
    if not isinstance(t, Tensor) or not isinstance(c, np.ndarray) or c.dtype.name not in ("float32", "bfloat16") \
            or c.size < 2 or np.broadcast_shapes(t.shape, c.shape) != t.shape:
        return False
    if not np.any(c):
        if node.input[1 - i] in lw.weights:
            return False  # (a weight of zeros trains)
        lw.env[node.output[0]] = t
        return True
    # (a stored causal mask too: the TorchScript exporter stores buffers as weights, and none trains as this)
    n = t.shape[-1]
    if len(t.shape) < 2 or t.shape[-2] != n or c.ndim < 2 or c.shape[-2:] != (n, n):
        return False
    above = np.triu(np.ones((n, n), bool), 1)
    fill = c.reshape(-1, n, n)[0][0, 1] if n > 1 else c.dtype.type(0)
    if not (fill <= -1e30 and np.all(c[..., above] == fill) and not np.any(c[..., ~above])) \
            or not _softmax_reads_alone(lw, node.output[0], len(t.shape)):
        return False
    _causal_mask(lw, node, t, fill)
    return True


# a stored weight with a value this low, added to scores a softmax alone reads, is a mask: f16's lowest
# (-65504) and the customary -1e9 fills are below it, a learned bias (-1e4 at the most) is not
MASK_FILL = -6e4


def _freeze_a_stored_mask(lw: Lowering, node: Any, x: Any, y: Any) -> None:
    """A weight with values of MASK_FILL or below added to scores that a softmax alone reads is a mask
    buffer the TorchScript exporter stored as a weight (a window, a prefix): frozen, as PyTorch keeps it
    (trained, its zeros moved with the gradients). A weight that another op read first is left as it is."""
    for i, (c, t) in enumerate(((x, y), (y, x))):
        name = node.input[i]
        if name in lw.weights and name not in lw.param_of and isinstance(c, np.ndarray) and c.dtype.kind == "f" \
                and c.size > 1 and isinstance(t, Tensor) and bool(np.any(c <= MASK_FILL)) \
                and _softmax_reads_alone(lw, node.output[0], len(np.broadcast_shapes(t.shape, c.shape))):
            lw.weights.discard(name)  # (before its parameter is made: made from a weight it would train)
            lw.notes.append(f"weight `{name}` (values of {float(c.min()):.3g}, added to scores a softmax reads) is "
                            "a mask buffer the exporter stored as a weight: imported frozen")


def _softmax_reads_alone(lw: Lowering, name: str, rank: int) -> bool:
    """Whether only softmaxes over the last axis read ``name`` (and the graph does not give it out): then
    setting its entries above the diagonal trains as adding a very negative constant there does, the
    softmax's gradient at those entries being 0 (with another reader, the addition passes it on)."""
    readers = lw.readers.get(name, [])
    return bool(readers) and name not in lw.src.outputs and all(
        r.op_type == "Softmax" and attributes(r).get("axis", -1) in (-1, rank - 1) for r in readers)


def _adds_rotary(lw: Lowering, node: Any) -> bool:
    """q * cos + rotate_half(q) * sin with the exporter's constant tables (Hugging Face's rotary positions,
    rotate_half(q) = concat(-q[..., h:], q[..., :h])) is `rope(q, base = b)`, b read off the tables and
    checked against them: no frozen tables, and the sequence may change."""
    muls = [lw.producer.get(n) for n in node.input[:2]]
    if len(muls) != 2 or any(m is None or m.op_type != "Mul" for m in muls):
        return False
    parts = [_tensor_times_constant(lw, m) for m in muls]
    if None in parts:
        return False
    for (q_name, cos), (r_name, sin) in (parts, parts[::-1]):  # type: ignore[misc]
        q = lw.env.get(q_name)
        if isinstance(q, Tensor) and _rotated_half(lw, r_name, q_name, q):
            base = _rope_base(cos, sin, q.shape)
            if base is not None:
                lw.emit(node, f"rope({q.name}, base = {_num(base)})", q.shape, q.dtype)
                return True
    return False


def _tensor_times_constant(lw: Lowering, mul: Any) -> tuple[str, np.ndarray] | None:
    a, b = lw.get(mul, 0), lw.get(mul, 1)
    if isinstance(a, Tensor) and isinstance(b, np.ndarray) and mul.input[1] not in lw.weights:
        return mul.input[0], b
    if isinstance(b, Tensor) and isinstance(a, np.ndarray) and mul.input[0] not in lw.weights:
        return mul.input[1], a
    return None


def _rotated_half(lw: Lowering, r_name: str, q_name: str, q: Tensor) -> bool:
    concat, last, d = lw.producer.get(r_name), len(q.shape) - 1, q.shape[-1]
    if concat is None or concat.op_type != "Concat" or len(concat.input) != 2 or d % 2:
        return False
    if _axis(attributes(concat).get("axis", 0), len(q.shape), concat) != last:
        return False
    neg = lw.producer.get(concat.input[0])
    return neg is not None and neg.op_type == "Neg" and lw.slices.get(neg.input[0]) == (q_name, last, d // 2, d) \
        and lw.slices.get(concat.input[1]) == (q_name, last, 0, d // 2)


def _rope_base(cos: np.ndarray, sin: np.ndarray, shape: tuple[int, ...]) -> float | None:
    """The base whose rotary tables ``cos`` and ``sin`` are (to 1e-4), or None."""
    t, d = shape[-2:]
    if t < 2 or d < 4 or cos.shape != sin.shape or cos.shape[-2:] != (t, d) or \
            np.broadcast_shapes(cos.shape, shape) != tuple(shape):
        return None
    c, s = (a.astype(np.float64).reshape(-1, t, d) for a in (cos, sin))
    if not (np.all(c == c[0]) and np.all(s == s[0])):
        return None
    step = np.arctan2(s[0, 1, 1], c[0, 1, 1])  # position 1, pair 1: base^(-2/d)
    if not 0 < step < 1:
        return None
    base = float(f"{step ** (-d / 2):.6g}")
    angle = np.arange(t)[:, None] * base ** (-2.0 * np.arange(d // 2) / d)
    want_c, want_s = (np.concatenate([f(angle)] * 2, axis=1) for f in (np.cos, np.sin))
    ok = np.abs(c[0] - want_c).max() <= 1e-4 and np.abs(s[0] - want_s).max() <= 1e-4
    return base if ok else None


def _pow(lw: Lowering, node: Any, a: dict[str, Any]) -> None:
    p = lw.const(node, 1)
    if p is None or p.size != 1:
        raise unsupported(node, "only a constant scalar exponent")
    x = lw.tensor(node, 0)
    lw.emit(node, f"{x.name} ** {_num(p.reshape(()).item())}", x.shape, x.dtype)


def _cast(lw: Lowering, node: Any, a: dict[str, Any]) -> None:
    x = lw.tensor(node, 0)
    to = onnx_dtype(a["to"], node)
    lw.emit(node, f"cast({x.name}, {to})", x.shape, to)


def _cast_like(lw: Lowering, node: Any, a: dict[str, Any]) -> None:
    like = lw.get(node, 1)
    to = like.dtype if isinstance(like, Tensor) else swp_dtype(np.asarray(like)) if like is not None else None
    if to is None:
        raise unsupported(node, "input 1 is missing")
    if isinstance(lw.get(node, 0), np.ndarray) and node.input[0] not in lw.weights:
        lw.env[node.output[0]] = lw.const(node, 0).astype(np_dtype(to))  # a constant made the tensor's type
        return
    x = lw.tensor(node, 0)
    if to == x.dtype:
        lw.env[node.output[0]] = x
    else:
        lw.emit(node, f"cast({x.name}, {to})", x.shape, to)


def _alias(lw: Lowering, node: Any, a: dict[str, Any]) -> None:
    """Identity, and Dropout as exported for inference."""
    _unread_mask(lw, node)
    lw.env[node.output[0]] = lw.tensor(node, 0)


def _unread_mask(lw: Lowering, node: Any) -> None:
    """Refuse a Dropout whose mask output the graph reads (TorchScript names one that nothing reads)."""
    mask = node.output[1] if len(node.output) > 1 else ""
    if mask and (lw.readers.get(mask) or mask in lw.src.outputs):
        raise unsupported(node, "a dropout mask output that the graph reads")


def _dropout(lw: Lowering, node: Any, a: dict[str, Any]) -> None:
    """Dropout: as exported in `train()` mode (training_mode true), `dropout` (off in evaluation, as in
    PyTorch's `eval()`; its mask is swapdsl's own); as exported for inference, the input itself."""
    def given(i: int, default: float) -> float:
        v = lw.const(node, i) if len(node.input) > i and node.input[i] else None
        return default if v is None else float(np.asarray(v).reshape(-1)[0])

    p = given(1, 0.5)
    if not given(2, 0.0) or p == 0:
        _alias(lw, node, a)
        return
    _unread_mask(lw, node)
    if not 0 <= p < 1:
        raise unsupported(node, f"a dropout ratio of {p:g} (0 to below 1)")
    x = lw.tensor(node, 0)
    lw.emit(node, f"dropout({x.name}, p = {_num(p)})", x.shape, x.dtype)


# ---- products and convolutions -------------------------------------------------------------


def _matmul(lw: Lowering, node: Any, a: dict[str, Any]) -> None:
    x, w = lw.tensor(node, 0), lw.tensor(node, 1)
    if len(x.shape) < 2 or len(w.shape) < 2:
        raise unsupported(node, "a vector operand (rank 1)")
    _inner(node, x.shape[-1], w.shape[-2])
    shape = np.broadcast_shapes(x.shape[:-2], w.shape[:-2]) + (x.shape[-2], w.shape[-1])
    lw.emit(node, f"{x.name} @ {w.name}", shape, x.dtype)


def _inner(node: Any, a: int, b: int) -> None:
    if a != b:
        raise unsupported(node, f"the product's inner dimensions differ: {a} and {b}")


def _gemm(lw: Lowering, node: Any, a: dict[str, Any]) -> None:
    trans_b = flag(a, "transB", 0, node)
    if flag(a, "transA", 0, node) or a.get("alpha", 1.0) != 1.0 or a.get("beta", 1.0) != 1.0:
        raise unsupported(node, "Gemm with transA, alpha or beta other than the defaults")
    x, w = lw.tensor(node, 0), lw.tensor(node, 1)
    if len(x.shape) != 2 or len(w.shape) != 2:
        raise unsupported(node, "Gemm of other than two matrices")
    _inner(node, x.shape[1], w.shape[1] if trans_b else w.shape[0])
    out = w.shape[0] if trans_b else w.shape[1]
    expr = f"matmul({x.name}, {w.name}, transpose_b = true)" if trans_b else f"{x.name} @ {w.name}"
    if lw.get(node, 2) is not None:
        expr += f" + {lw.tensor(node, 2).name}"
    lw.emit(node, expr, (x.shape[0], out), x.dtype)


def _spatial(node: Any, a: dict[str, Any]) -> tuple[tuple[int, int], tuple[int, int], tuple[int, int]]:
    """(stride, padding, dilation) of a 2-d convolution or pooling, symmetric padding only."""
    if a.get("auto_pad", "NOTSET") not in ("NOTSET", "VALID"):
        raise unsupported(node, f"auto_pad {a['auto_pad']}; export with explicit pads")
    pads = list(a.get("pads", [0, 0, 0, 0]))
    if len(pads) != 4 or pads[:2] != pads[2:]:
        raise unsupported(node, f"pads {pads}: swapdsl imports 2-d ops with the same padding on both sides")
    stride, dilation = tuple(a.get("strides", [1, 1])), tuple(a.get("dilations", [1, 1]))
    if len(stride) != 2 or len(dilation) != 2:
        raise unsupported(node, "only 2-d convolutions and pooling")
    if min(stride + dilation) < 1 or min(pads) < 0:
        raise unsupported(node, f"strides {list(stride)}, dilations {list(dilation)} and pads {pads} must be "
                          "positive (pads: not negative)")
    return stride, (pads[0], pads[1]), dilation


def _out_size(size: int, k: int, s: int, p: int, d: int) -> int:
    return (size + 2 * p - d * (k - 1) - 1) // s + 1


def _defaults_left_out(call: str, stride: str = ", stride = (1, 1)") -> str:
    for default in (stride, ", padding = (0, 0)", ", dilation = (1, 1)", ", groups = 1"):
        call = re.sub(re.escape(default) + r"(?=[,)])", "", call)  # (not `groups = 16`)
    return call


def _conv(lw: Lowering, node: Any, a: dict[str, Any]) -> None:
    x, w = lw.tensor(node, 0), lw.tensor(node, 1)
    if len(x.shape) != 4:
        raise unsupported(node, "only 2-d convolutions ([N, C, H, W] inputs)")
    stride, pad, dil = _spatial(node, a)
    groups = a.get("group", 1)
    expr = _defaults_left_out(f"conv2d({x.name}, {w.name}, stride = {stride}, padding = {pad}, dilation = {dil}, "
                              f"groups = {groups})")
    b = lw.get(node, 2)
    zero = isinstance(b, np.ndarray) and node.input[2] not in lw.weights and not np.any(b)  # the exporter's
    if b is not None and not zero:
        expr += f" + {lw.tensor(node, 2, shape=(w.shape[0], 1, 1)).name}"
    hw = tuple(_out_size(x.shape[2 + i], w.shape[2 + i], stride[i], pad[i], dil[i]) for i in range(2))
    lw.emit(node, expr, (x.shape[0], w.shape[0]) + hw, x.dtype)


def _pool(fn: str) -> Rule:
    def rule(lw: Lowering, node: Any, a: dict[str, Any]) -> None:
        x = lw.tensor(node, 0)
        if len(x.shape) != 4 or flag(a, "ceil_mode", 0, node) or a.get("storage_order", 0):
            raise unsupported(node, "pooling of [N, C, H, W] without ceil_mode")
        k = tuple(a["kernel_shape"])
        if len(k) != 2 or min(k) < 1:
            raise unsupported(node, f"kernel_shape {list(k)}: a 2-d pooling's is two positive sizes")
        stride, pad, dil = _spatial(node, a)
        if dil != (1, 1) or len(node.output) > 1:
            raise unsupported(node, "pooling with dilations or an indices output")
        include = flag(a, "count_include_pad", 0, node)
        extra = "" if fn != "avg_pool2d" else ", count_include_pad = true" if include else \
            ", count_include_pad = false" if pad != (0, 0) else ""
        hw = tuple(_out_size(x.shape[2 + i], k[i], stride[i], pad[i], 1) for i in range(2))
        text = f"{fn}({x.name}, {k}, stride = {stride}, padding = {pad}{extra})"
        lw.emit(node, _defaults_left_out(text, stride=f", stride = {k}"), x.shape[:2] + hw, x.dtype)

    return rule


def _global_avg_pool(lw: Lowering, node: Any, a: dict[str, Any]) -> None:
    x = lw.tensor(node, 0)
    if len(x.shape) != 4:
        raise unsupported(node, "only [N, C, H, W] inputs")
    n, c = x.shape[:2]
    lw.emit(node, f"reshape(global_avg_pool({x.name}), [{n}, {c}, 1, 1])", (n, c, 1, 1), x.dtype)


# ---- normalisation and softmax ----------------------------------------------------------------


def _softmax(fn: str) -> Rule:
    def rule(lw: Lowering, node: Any, a: dict[str, Any]) -> None:
        x = lw.tensor(node, 0)
        axis = _axis(a.get("axis", -1), len(x.shape), node)
        axis_text = "" if axis == len(x.shape) - 1 else f", axis = {axis}"
        lw.emit(node, f"{fn}({x.name}{axis_text})", x.shape, x.dtype)

    return rule


def _batch_norm(lw: Lowering, node: Any, a: dict[str, Any]) -> None:
    if flag(a, "training_mode", 0, node) or len(node.output) > 1:
        raise unsupported(node, "BatchNormalization in training mode (export the model in eval mode)")
    x = lw.tensor(node, 0)
    scale, shift = lw.tensor(node, 1), lw.tensor(node, 2)
    mean, var = lw.const(node, 3), lw.const(node, 4)
    if mean is None or var is None or len(x.shape) < 2:
        raise unsupported(node, "running mean and variance must be weights")
    lw.running[scale.name] = (mean.astype(np.float32), var.astype(np.float32))
    lw.emit(node, f"batch_norm({x.name}, {scale.name}, {shift.name}, eps = {_num(a.get('epsilon', 1e-5))})",
            x.shape, x.dtype)


def _layer_norm(lw: Lowering, node: Any, a: dict[str, Any]) -> None:
    x = lw.tensor(node, 0)
    axis = _axis(a.get("axis", -1), len(x.shape), node)
    if len(node.output) > 1 and any(node.output[1:]):
        raise unsupported(node, "the mean and inverse deviation outputs")
    scale = lw.tensor(node, 1, shape=x.shape[axis:])
    if lw.get(node, 2) is None:
        shift = lw.param(f"{node.input[1]}.shift", np.zeros(x.shape[axis:], np.float32))
    else:
        shift = lw.tensor(node, 2, shape=x.shape[axis:])
    lw.emit(node, f"layer_norm({x.name}, {scale.name}, {shift.name}, eps = {_num(a.get('epsilon', 1e-5))})",
            x.shape, x.dtype)


def _reduce(fn: str) -> Rule:
    def rule(lw: Lowering, node: Any, a: dict[str, Any]) -> None:
        x = lw.tensor(node, 0)
        given = lw.const(node, 1) if len(node.input) > 1 else a.get("axes")
        axes = sorted({_axis(int(i), len(x.shape), node) for i in np.asarray(given).reshape(-1)}) \
            if given is not None and np.asarray(given).size else list(range(len(x.shape)))
        keep = flag(a, "keepdims", 1, node)
        shape = tuple(1 if i in axes else d for i, d in enumerate(x.shape)) if keep else \
            tuple(d for i, d in enumerate(x.shape) if i not in axes)
        lw.emit(node, f"{fn}({x.name}, axes = {axes}, keepdims = {str(keep).lower()})", shape, x.dtype)

    return rule


# ---- shapes ------------------------------------------------------------------------------


def _unless_same(lw: Lowering, node: Any, x: Tensor, shape: tuple[int, ...], expr: str) -> None:
    """``expr`` as the node's value, or ``x`` itself where the shape does not change."""
    if shape == x.shape:
        lw.env[node.output[0]] = x
        return
    lw.emit(node, expr, shape, x.dtype)


def _reshape_to(lw: Lowering, node: Any, x: Tensor, shape: tuple[int, ...]) -> None:
    _unless_same(lw, node, x, shape, f"reshape({x.name}, {list(shape)})")


def _reshape(lw: Lowering, node: Any, a: dict[str, Any]) -> None:
    x = lw.tensor(node, 0)
    _reshape_to(lw, node, x, reshape_target(x.shape, lw.const(node, 1), node, flag(a, "allowzero", 0, node)))


def _flatten(lw: Lowering, node: Any, a: dict[str, Any]) -> None:
    x = lw.tensor(node, 0)
    axis = a.get("axis", 1)
    if not -len(x.shape) <= axis <= len(x.shape):
        raise unsupported(node, f"axis {axis} of a rank-{len(x.shape)} tensor")
    axis %= len(x.shape) + 1
    _reshape_to(lw, node, x, (math.prod(x.shape[:axis]), math.prod(x.shape[axis:])))


def _squeeze(lw: Lowering, node: Any, a: dict[str, Any]) -> None:
    x = lw.tensor(node, 0)
    given = lw.const(node, 1)
    axes = {_axis(int(i), len(x.shape), node) for i in given.reshape(-1)} if given is not None else \
        {i for i, d in enumerate(x.shape) if d == 1}
    if any(x.shape[i] != 1 for i in axes):
        raise unsupported(node, f"squeezing a dimension of size other than 1 from {list(x.shape)}")
    _reshape_to(lw, node, x, tuple(d for i, d in enumerate(x.shape) if i not in axes))


def _unsqueeze(lw: Lowering, node: Any, a: dict[str, Any]) -> None:
    x = lw.tensor(node, 0)
    axes = lw.const(node, 1)
    _reshape_to(lw, node, x, np.expand_dims(np.empty(x.shape, np.int8), tuple(int(i) for i in axes.reshape(-1)))
                .shape)


def _transpose(lw: Lowering, node: Any, a: dict[str, Any]) -> None:
    x = lw.tensor(node, 0)
    perm = [int(p) for p in a.get("perm", range(len(x.shape) - 1, -1, -1))]
    if sorted(perm) != list(range(len(x.shape))):
        raise unsupported(node, f"perm {perm} of a rank-{len(x.shape)} tensor")
    lw.emit(node, f"permute({x.name}, {perm})", tuple(x.shape[p] for p in perm), x.dtype)


def _concat(lw: Lowering, node: Any, a: dict[str, Any]) -> None:
    xs = [lw.tensor(node, i) for i in range(len(node.input))]
    axis = _axis(a["axis"], len(xs[0].shape), node)
    shape = list(xs[0].shape)
    shape[axis] = sum(x.shape[axis] for x in xs)
    lw.emit(node, f"concat([{', '.join(x.name for x in xs)}], axis = {axis})", tuple(shape), xs[0].dtype)


def _split(lw: Lowering, node: Any, a: dict[str, Any]) -> None:
    x = lw.tensor(node, 0)
    axis = _axis(a.get("axis", 0), len(x.shape), node)
    given = lw.const(node, 1)
    n = len(node.output)
    sizes = [int(s) for s in given.reshape(-1)] if given is not None else \
        [-(-x.shape[axis] // n)] * (n - 1) + [x.shape[axis] - -(-x.shape[axis] // n) * (n - 1)]
    lw.env.update(zip(node.output, _pieces(lw, node, x, axis, sizes, list(node.output))))


def _pieces(lw: Lowering, node: Any, x: Tensor, axis: int, sizes: list[int], names: list[str]) -> list[Tensor]:
    """One `split` line: ``x`` cut along ``axis`` into pieces of these sizes."""
    if len(sizes) != len(names) or sum(sizes) != x.shape[axis] or min(sizes, default=0) < 1:
        raise unsupported(node, f"split sizes {sizes} of a dimension of size {x.shape[axis]}")
    outs = []
    for name, size in zip(names, sizes):
        shape = list(x.shape)
        shape[axis] = size
        outs.append(Tensor(lw.fresh(name), tuple(shape), x.dtype))
    lw.lines.append(f"{', '.join(t.name for t in outs)}{',' if len(outs) == 1 else ''} = "
                    f"split({x.name}, {sizes}, axis = {axis})")
    return outs


def _split_to_sequence(lw: Lowering, node: Any, a: dict[str, Any]) -> None:
    """torch.split as the dynamo exporter writes it: pieces of a constant size (the last one shorter)."""
    x = lw.tensor(node, 0)
    axis = _axis(a.get("axis", 0), len(x.shape), node)
    given = lw.const(node, 1)
    flag(a, "keepdims", 1, node)  # (with split sizes given, as here, ONNX ignores it)
    if given is None:
        raise unsupported(node, "SplitToSequence without split sizes (pieces of size 1)")
    dim = x.shape[axis]
    sizes = [int(s) for s in given.reshape(-1)] if given.ndim else \
        [min(int(given), dim - k) for k in range(0, dim, max(int(given), 1))]
    lw.env[node.output[0]] = TensorList(tuple(_pieces(lw, node, x, axis, sizes,
                                                      [f"{node.output[0]}_{k}" for k in range(len(sizes))])))


def _sequence_at(lw: Lowering, node: Any, a: dict[str, Any]) -> None:
    seq, at = lw.get(node, 0), lw.const(node, 1)
    if not isinstance(seq, TensorList) or at is None or at.size != 1:
        raise unsupported(node, "SequenceAt reads a SplitToSequence's pieces at a constant position")
    k = int(at.reshape(()))
    if not -len(seq.items) <= k < len(seq.items):
        raise unsupported(node, f"position {k} of {len(seq.items)} pieces")
    lw.env[node.output[0]] = seq.items[k]


def _slice(lw: Lowering, node: Any, a: dict[str, Any]) -> None:
    x = lw.tensor(node, 0)
    starts, ends = lw.const(node, 1), lw.const(node, 2)
    axes, steps = lw.const(node, 3), lw.const(node, 4)
    axes = range(len(starts)) if axes is None else [int(i) for i in axes]
    steps = [1] * len(starts) if steps is None else [int(s) for s in steps]
    index, shape = [":"] * len(x.shape), list(x.shape)
    for axis, s, e, step in zip(axes, starts, ends, steps):
        axis = _axis(axis, len(x.shape), node)
        if step < 1:
            raise unsupported(node, "a slice with a negative step")
        size = x.shape[axis]
        lo, hi, _ = slice(int(s), int(min(e, size)), step).indices(size)
        shape[axis] = len(range(lo, hi, step))
        if shape[axis] < 1:
            raise unsupported(node, "an empty slice")
        # bounds as written (a negative one counts from the end), so that they follow the size
        start = "" if lo == 0 else str(int(s)) if -size <= s < 0 else str(lo)
        stop = "" if hi == size else str(int(e)) if -size <= e < 0 else str(hi)
        index[axis] = f"{start}:{stop}" + (f":{step}" if step != 1 else "")
    if len(starts) == 1 and steps[0] == 1:
        axis = _axis(int(list(axes)[0]), len(x.shape), node)
        lw.slices[node.output[0]] = (node.input[0], axis, *slice(int(starts[0]), int(min(ends[0], x.shape[axis])),
                                                                   1).indices(x.shape[axis])[:2])
    while index and index[-1] == ":":
        index.pop()
    if not index:
        lw.env[node.output[0]] = x
        return
    lw.emit(node, f"{x.name}[{', '.join(index)}]", tuple(shape), x.dtype)


def _gather(lw: Lowering, node: Any, a: dict[str, Any]) -> None:
    data, ids = lw.get(node, 0), lw.get(node, 1)
    axis = a.get("axis", 0)
    if isinstance(data, np.ndarray) and isinstance(ids, Tensor) and axis == 0 and data.ndim == 2:
        table = lw.tensor(node, 0)
        lw.emit(node, f"embedding({ids.name}, {table.name})", ids.shape + (data.shape[1],), table.dtype)
        return
    rows = table_rows(data, ids) if axis == 0 else None
    if rows is not None:  # positions, or BERT's token types (all 0): rows of a trained table, broadcast
        first, n = rows
        table = lw.tensor(node, 0)
        shape = ids.shape + (data.shape[1],)
        read = f"{table.name}[{first or ''}:{first + n}]"
        if shape[:-2] != (1,) * (len(shape) - 2) or shape[-2] != n:
            read = f"reshape({read}, {[1] * (ids.ndim - 1) + [n, data.shape[1]]}) + zeros({list(shape)}, {table.dtype})"
        elif len(shape) > 2:
            read = f"reshape({read}, {list(shape)})"
        lw.emit(node, read, shape, table.dtype)
        return
    if isinstance(data, Tensor) and isinstance(ids, np.ndarray) and ids.size == 1 and ids.ndim == 0:
        axis = _axis(axis, len(data.shape), node)
        if not -data.shape[axis] <= int(ids) < data.shape[axis]:
            raise unsupported(node, f"index {int(ids)} is outside a dimension of size {data.shape[axis]}")
        index = [":"] * axis + [str(int(ids))]
        lw.emit(node, f"{data.name}[{', '.join(index)}]", data.shape[:axis] + data.shape[axis + 1:], data.dtype)
        return
    raise unsupported(node, "Gather other than an embedding lookup (a weight table, axis 0: token ids, "
                      "consecutive positions or one row for all) or one index")


def table_rows(data: object, ids: object) -> tuple[int, int] | None:
    """(first, n) where constant integer ``ids`` read a 2-d constant table at rows first .. first + n - 1
    along their last axis, the same at every leading position (a position embedding, batched or not), or
    one row everywhere (n = 1); negative indices count from the end, as ONNX's do. None otherwise."""
    if not (isinstance(data, np.ndarray) and data.ndim == 2 and isinstance(ids, np.ndarray)
            and np.issubdtype(ids.dtype, np.integer) and ids.size and ids.ndim):
        return None
    flat = ids.astype(np.int64).reshape(-1, ids.shape[-1])
    flat = np.where(flat < 0, flat + data.shape[0], flat)
    if flat.min() < 0 or flat.max() >= data.shape[0]:
        return None
    if np.all(flat == flat[0, 0]):
        return int(flat[0, 0]), 1
    if np.all(flat == flat[0]) and np.all(np.diff(flat[0]) == 1):
        return int(flat[0, 0]), flat.shape[1]
    return None


def _expand(lw: Lowering, node: Any, a: dict[str, Any]) -> None:
    """A broadcast (grouped-query attention's repeated key heads): x plus zeros of the target shape."""
    x = lw.tensor(node, 0)
    shape = np.broadcast_shapes(x.shape, tuple(int(d) for d in lw.const(node, 1).reshape(-1)))
    _unless_same(lw, node, x, shape, f"{x.name} + zeros({list(shape)}, {x.dtype})")


def _shape(lw: Lowering, node: Any, a: dict[str, Any]) -> None:
    x = lw.tensor(node, 0)
    lw.env[node.output[0]] = np.array(x.shape[a.get("start", 0):a.get("end", len(x.shape))], np.int64)


RULES: dict[str, Rule] = {
    **{op: _unary(fn) for op, fn in (("Relu", "relu"), ("Sigmoid", "sigmoid"), ("Tanh", "tanh"), ("Exp", "exp"),
                                     ("Log", "log"), ("Sqrt", "sqrt"), ("Neg", "neg"),
                                     ("Erf", "erf"))},
    "Reciprocal": _reciprocal, "Clip": _clip, "IsNaN": _isnan, "Where": _where,
    "LeakyRelu": _leaky_relu, "HardSigmoid": _hard, "HardSwish": _hard, "Gelu": _gelu, "Pow": _pow, "Cast": _cast,
    "CastLike": _cast_like, "Identity": _alias, "Dropout": _dropout,
    **{op: _binary for op in _SYMBOL},
    "MatMul": _matmul, "Gemm": _gemm, "Conv": _conv,
    "MaxPool": _pool("max_pool2d"), "AveragePool": _pool("avg_pool2d"), "GlobalAveragePool": _global_avg_pool,
    "Softmax": _softmax("softmax"), "LogSoftmax": _softmax("log_softmax"),
    "BatchNormalization": _batch_norm, "LayerNormalization": _layer_norm,
    "ReduceMean": _reduce("mean"), "ReduceSum": _reduce("sum"),
    "Reshape": _reshape, "Flatten": _flatten, "Squeeze": _squeeze, "Unsqueeze": _unsqueeze,
    "Transpose": _transpose, "Concat": _concat, "Split": _split, "SplitToSequence": _split_to_sequence,
    "SequenceAt": _sequence_at, "Slice": _slice, "Gather": _gather,
    "Shape": _shape, "Expand": _expand,
}
