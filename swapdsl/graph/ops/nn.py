"""Neural-network ops: softmax, normalisation, convolution, pooling, embedding.

Convolution and pooling are vectorised with strided window views (im2col) and
a matmul; their adjoints scatter back with one strided add per kernel tap.
"""

from __future__ import annotations

from typing import Any

from swapdsl.common.errors import SwpError
from swapdsl.graph.ir import TensorType
from swapdsl.graph.ops.registry import (
    Array, Attrs, GradBuilder, KernelContext, OpDef, Types, floating, per_element, per_input_element, register,
    same_as,
)

# ---- softmax -------------------------------------------------------------------


def _softmax(c: KernelContext, ins: list[Array], a: Attrs) -> Array:
    (x,) = ins
    e = c.xp.exp(x - x.max(axis=a["axis"], keepdims=True))
    return e / e.sum(axis=a["axis"], keepdims=True)


def _log_softmax(c: KernelContext, ins: list[Array], a: Attrs) -> Array:
    (x,) = ins
    shifted = x - x.max(axis=a["axis"], keepdims=True)
    return shifted - c.xp.log(c.xp.exp(shifted).sum(axis=a["axis"], keepdims=True))


def _softmax_grad(c: KernelContext, ins: list[Array], a: Attrs) -> Array:
    y, g = ins
    return y * (g - (g * y).sum(axis=a["axis"], keepdims=True))


def _log_softmax_grad(c: KernelContext, ins: list[Array], a: Attrs) -> Array:
    y, g = ins
    return g - c.xp.exp(y) * g.sum(axis=a["axis"], keepdims=True)


def _via_output(op: str):  # noqa: ANN202
    def rule(b: GradBuilder, ins: tuple[str, ...], out: str, g: str, a: Attrs) -> tuple[str | None, ...]:
        return (b.emit(op, [out, g], a),)

    return rule


# ---- normalisation -------------------------------------------------------------


def _norm_axes(kind: str, x: Any, scale_rank: int) -> tuple[int, ...]:
    if kind == "layer":
        return tuple(range(x.ndim - scale_rank, x.ndim))
    return (0,) + tuple(range(2, x.ndim))


def _scale_view(kind: str, s: Array, ndim: int) -> Array:
    """Scale/shift as they broadcast against the input."""
    return s if kind == "layer" else s.reshape((1, -1) + (1,) * (ndim - 2))


def _normalized(c: KernelContext, x: Array, axes: tuple[int, ...], eps: float) -> tuple[Array, Array]:
    """(x - mean) / sqrt(var + eps) and 1 / sqrt(var + eps); two-pass, in f32 for f16 inputs."""
    xf = x.astype(c.xp.float32) if x.dtype == c.xp.float16 else x
    centered = xf - xf.mean(axis=axes, keepdims=True)
    invstd = 1.0 / c.xp.sqrt((centered * centered).mean(axis=axes, keepdims=True) + eps)
    return centered * invstd, invstd


def _norm_kernel(kind: str):  # noqa: ANN202
    def kernel(c: KernelContext, ins: list[Array], a: Attrs) -> Array:
        x, scale, shift = ins
        xhat, _ = _normalized(c, x, _norm_axes(kind, x, scale.ndim), a["eps"])
        y = xhat * _scale_view(kind, scale, x.ndim) + _scale_view(kind, shift, x.ndim)
        return y.astype(x.dtype)

    return kernel


def _norm_grad_kernel(kind: str):  # noqa: ANN202
    def kernel(c: KernelContext, ins: list[Array], a: Attrs) -> Array:
        x, scale, g = ins
        axes = _norm_axes(kind, x, scale.ndim)
        xhat, invstd = _normalized(c, x, axes, a["eps"])
        gs = g * _scale_view(kind, scale, x.ndim)
        dx = invstd * (gs - gs.mean(axis=axes, keepdims=True) - xhat * (gs * xhat).mean(axis=axes, keepdims=True))
        return dx.astype(x.dtype)

    return kernel


def _norm_dscale_kernel(kind: str):  # noqa: ANN202
    def kernel(c: KernelContext, ins: list[Array], a: Attrs) -> Array:
        x, g = ins
        scale_rank = a.get("scale_rank", 1)
        axes = _norm_axes(kind, x, scale_rank)
        xhat, _ = _normalized(c, x, axes, a["eps"])
        reduce_axes = tuple(i for i in range(x.ndim) if i not in axes) if kind == "layer" else axes
        return (g * xhat).sum(axis=reduce_axes).astype(x.dtype)

    return kernel


def _norm_grad(kind: str):  # noqa: ANN202
    def rule(b: GradBuilder, ins: tuple[str, ...], out: str, g: str, a: Attrs) -> tuple[str | None, ...]:
        x, scale, _ = ins
        xt, st = b.type(x), b.type(scale)
        if kind == "layer":
            reduce_axes = tuple(range(xt.rank - st.rank))
            dscale_attrs = {"eps": a["eps"], "scale_rank": st.rank}
        else:
            reduce_axes = (0,) + tuple(range(2, xt.rank))
            dscale_attrs = {"eps": a["eps"]}
        dx = b.emit(f"{kind}_norm_grad", [x, scale, g], {"eps": a["eps"]})
        dscale = b.emit(f"{kind}_norm_dscale", [x, g], dscale_attrs)
        dshift = b.emit("sum", [g], {"axes": reduce_axes, "keepdims": False}) if reduce_axes else g
        return dx, dscale, dshift

    return rule


def _layer_norm_infer(ins: Types, a: Attrs) -> TensorType:
    x, g, b = ins
    dtype = floating("layer_norm", x, g, b)
    k = g.rank
    if g.shape != b.shape or k == 0 or x.shape[-k:] != g.shape:
        raise SwpError("`layer_norm` scale and shift must match the trailing dimensions of its input",
                       hints=[f"input is {x}, scale is {g}, shift is {b}"])
    return TensorType(x.shape, dtype)


def _batch_norm_infer(ins: Types, a: Attrs) -> TensorType:
    x, g, b = ins
    dtype = floating("batch_norm", x, g, b)
    if x.rank < 2 or g.shape != (x.shape[1],) or b.shape != (x.shape[1],):
        raise SwpError("`batch_norm` scale and shift must be vectors over the input's channels (dimension 1)",
                       hints=[f"input is {x}, scale is {g}, shift is {b}"])
    return TensorType(x.shape, dtype)


def _dscale_infer(kind: str):  # noqa: ANN202
    def infer(ins: Types, a: Attrs) -> TensorType:
        x, g = ins
        if kind == "layer":
            return TensorType(x.shape[x.rank - a.get("scale_rank", 1):], x.dtype)
        return TensorType((x.shape[1],), x.dtype)

    return infer


# ---- convolution and pooling ---------------------------------------------------


def out_size(size: int, k: int, s: int, p: int, d: int) -> int:
    return (size + 2 * p - d * (k - 1) - 1) // s + 1


def _positive_out(op: str, shape: tuple[int, ...], x: TensorType) -> tuple[int, ...]:
    if min(shape) < 1:
        raise SwpError(f"`{op}` output would be empty: input {x} gives spatial size {shape[-2:]}",
                       hints=["the kernel (with dilation) is larger than the padded input"])
    return shape


def _pad(xp: Any, x: Array, ph: int, pw: int, value: float = 0.0) -> Array:
    if not (ph or pw):
        return x
    return xp.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)), constant_values=value)


def _windows(xp: Any, xpad: Array, k: tuple[int, int], s: tuple[int, int], d: tuple[int, int],
             out: tuple[int, int]) -> Array:
    """A strided view [N, C, Ho, Wo, KH, KW] of every kernel window; nothing is copied."""
    n, c = xpad.shape[:2]
    st = xpad.strides
    shape = (n, c, out[0], out[1], k[0], k[1])
    strides = (st[0], st[1], st[2] * s[0], st[3] * s[1], st[2] * d[0], st[3] * d[1])
    return xp.lib.stride_tricks.as_strided(xpad, shape, strides)


def _tap(k: tuple[int, int], i: int, j: int, s: tuple[int, int], d: tuple[int, int],
         out: tuple[int, int]) -> tuple[slice, slice]:
    """The padded-input pixels that kernel tap (i, j) touches, over every output position."""
    return (slice(i * d[0], i * d[0] + s[0] * (out[0] - 1) + 1, s[0]),
            slice(j * d[1], j * d[1] + s[1] * (out[1] - 1) + 1, s[1]))


def _conv_geometry(x_shape: tuple[int, ...], kernel: tuple[int, int], a: Attrs) -> tuple[int, int]:
    (sh, sw), (ph, pw), (dh, dw) = a["stride"], a["padding"], a["dilation"]
    return (out_size(x_shape[2], kernel[0], sh, ph, dh), out_size(x_shape[3], kernel[1], sw, pw, dw))


def _im2col(c: KernelContext, x: Array, kernel: tuple[int, int], groups: int, a: Attrs) -> Array:
    """[N, G, Ho*Wo, C/G*KH*KW]: each output position's receptive field, one row each."""
    n, ch = x.shape[:2]
    out = _conv_geometry(x.shape, kernel, a)
    win = _windows(c.xp, _pad(c.xp, x, *a["padding"]), kernel, a["stride"], a["dilation"], out)
    win = win.reshape(n, groups, ch // groups, out[0], out[1], kernel[0], kernel[1])
    return win.transpose(0, 1, 3, 4, 2, 5, 6).reshape(n, groups, out[0] * out[1], -1)


def _conv2d(c: KernelContext, ins: list[Array], a: Attrs) -> Array:
    x, w = ins
    groups = a["groups"]
    o, _, kh, kw = w.shape
    cols = _im2col(c, x, (kh, kw), groups, a)
    wmat = w.reshape(groups, o // groups, -1)
    y = c.xp.matmul(cols, wmat.transpose(0, 2, 1))  # [N, G, P, O/G]
    ho, wo = _conv_geometry(x.shape, (kh, kw), a)
    return c.xp.ascontiguousarray(y.transpose(0, 1, 3, 2)).reshape(x.shape[0], o, ho, wo)


def _conv2d_grad_weight(c: KernelContext, ins: list[Array], a: Attrs) -> Array:
    x, g = ins
    groups, (kh, kw) = a["groups"], a["kernel"]
    n, o = g.shape[:2]
    cols = _im2col(c, x, (kh, kw), groups, a)
    gy = g.reshape(n, groups, o // groups, -1)  # [N, G, O/G, P]
    dw = c.xp.matmul(gy, cols).sum(axis=0)  # [G, O/G, C/G*KH*KW]
    return dw.reshape(o, x.shape[1] // groups, kh, kw)


def _conv2d_grad_input(c: KernelContext, ins: list[Array], a: Attrs) -> Array:
    g, w = ins
    groups = a["groups"]
    o, cg, kh, kw = w.shape
    n, _, ho, wo = g.shape
    h, wd = a["input_hw"]
    (ph, pw) = a["padding"]
    gy = g.reshape(n, groups, o // groups, ho * wo).transpose(0, 1, 3, 2)  # [N, G, P, O/G]
    dcols = c.xp.matmul(gy, w.reshape(groups, o // groups, -1))  # [N, G, P, C/G*KH*KW]
    dcols = dcols.reshape(n, groups, ho, wo, cg, kh, kw)
    dx = c.xp.zeros((n, groups, cg, h + 2 * ph, wd + 2 * pw), dtype=g.dtype)
    for i in range(kh):
        for j in range(kw):
            rows, cols = _tap((kh, kw), i, j, a["stride"], a["dilation"], (ho, wo))
            dx[:, :, :, rows, cols] += dcols[:, :, :, :, :, i, j].transpose(0, 1, 4, 2, 3)
    return c.xp.ascontiguousarray(dx.reshape(n, groups * cg, h + 2 * ph, wd + 2 * pw)[:, :, ph:ph + h, pw:pw + wd])


def _conv2d_infer(ins: Types, a: Attrs) -> TensorType:
    x, w = ins
    dtype = floating("conv2d", x, w)
    if x.rank != 4 or w.rank != 4:
        raise SwpError("`conv2d` needs a 4-d input [N, C, H, W] and a 4-d weight [O, C/groups, KH, KW]",
                       hints=[f"input is {x}, weight is {w}"])
    g = a["groups"]
    n, c, h, wd = x.shape
    o, ci, kh, kw = w.shape
    if g < 1 or c % g or o % g:
        raise SwpError(f"`conv2d` groups={g} must divide both the input channels ({c}) and the output channels ({o})")
    if ci * g != c:
        raise SwpError(f"conv2d input has {c} channels but the weight expects {ci * g} (groups={g})",
                       hints=[f"input is {x}, weight is {w}"])
    out = (n, o) + _conv_geometry(x.shape, (kh, kw), a)
    return TensorType(_positive_out("conv2d", out, x), dtype)


def _conv2d_flops(ins: Types, out: TensorType, a: Attrs) -> int:
    _, ci, kh, kw = ins[1].shape
    return 2 * out.numel * ci * kh * kw


def _conv2d_grad(b: GradBuilder, ins: tuple[str, ...], out: str, g: str, a: Attrs) -> tuple[str | None, ...]:
    x, w = ins
    xt, wt = b.type(x), b.type(w)
    dx = b.emit("conv2d_grad_input", [g, w], {**a, "input_hw": xt.shape[2:]})
    dw = b.emit("conv2d_grad_weight", [x, g], {**a, "kernel": wt.shape[2:]})
    return dx, dw


def _grad_input_infer(ins: Types, a: Attrs) -> TensorType:
    g, w = ins
    return TensorType((g.shape[0], w.shape[1] * a["groups"]) + tuple(a["input_hw"]), floating("conv2d", g, w))


def _grad_weight_infer(ins: Types, a: Attrs) -> TensorType:
    x, g = ins
    return TensorType((g.shape[1], x.shape[1] // a["groups"]) + tuple(a["kernel"]), floating("conv2d", x, g))


def _grad_input_flops(ins: Types, out: TensorType, a: Attrs) -> int:
    return _conv2d_flops((out, ins[1]), ins[0], a)


def _grad_weight_flops(ins: Types, out: TensorType, a: Attrs) -> int:
    return _conv2d_flops((ins[0], out), ins[1], a)


def _pool_infer(op: str):  # noqa: ANN202
    def infer(ins: Types, a: Attrs) -> TensorType:
        (x,) = ins
        dtype = floating(op, x)
        if x.rank != 4:
            raise SwpError(f"`{op}` needs a 4-d input [N, C, H, W], got {x}")
        (kh, kw), (ph, pw) = a["kernel"], a["padding"]
        if ph * 2 > kh or pw * 2 > kw:
            raise SwpError(f"`{op}` padding {a['padding']} is more than half the kernel {a['kernel']}")
        out = x.shape[:2] + _conv_geometry(x.shape, a["kernel"], {**a, "dilation": (1, 1)})
        return TensorType(_positive_out(op, out, x), dtype)

    return infer


def _pool_windows(c: KernelContext, x: Array, a: Attrs, fill: float) -> Array:
    out = _conv_geometry(x.shape, a["kernel"], {**a, "dilation": (1, 1)})
    return _windows(c.xp, _pad(c.xp, x, *a["padding"], value=fill), a["kernel"], a["stride"], (1, 1), out)


def _max_pool(c: KernelContext, ins: list[Array], a: Attrs) -> Array:
    return _pool_windows(c, ins[0], a, float("-inf")).max(axis=(4, 5))


def _avg_divisor(c: KernelContext, in_hw: tuple[int, int], a: Attrs) -> Any:
    """How many pixels each window averages: the whole kernel, or only its unpadded part."""
    kh, kw = a["kernel"]
    if a.get("count_include_pad", True):
        return float(kh * kw)
    ones = c.xp.ones((1, 1) + tuple(in_hw))
    return _pool_windows(c, ones, a, 0.0).sum(axis=(4, 5))[0, 0]


def _avg_pool(c: KernelContext, ins: list[Array], a: Attrs) -> Array:
    (x,) = ins
    total = _pool_windows(c, x, a, 0.0).sum(axis=(4, 5))
    return (total / _avg_divisor(c, x.shape[2:], a)).astype(x.dtype)


def _scatter_taps(c: KernelContext, g: Array, in_shape: tuple[int, ...], a: Attrs, weight_of: Any) -> Array:
    """dx = sum over kernel taps of weight_of(i, j) * g, placed at the pixels each tap read."""
    (kh, kw), (ph, pw) = a["kernel"], a["padding"]
    n, ch, h, w = in_shape
    out = g.shape[2:]
    dx = c.xp.zeros((n, ch, h + 2 * ph, w + 2 * pw), dtype=g.dtype)
    for i in range(kh):
        for j in range(kw):
            rows, cols = _tap((kh, kw), i, j, a["stride"], (1, 1), out)
            dx[:, :, rows, cols] += weight_of(i, j) * g
    return c.xp.ascontiguousarray(dx[:, :, ph:ph + h, pw:pw + w])


def _max_pool_grad(c: KernelContext, ins: list[Array], a: Attrs) -> Array:
    x, g = ins
    kh, kw = a["kernel"]
    win = _pool_windows(c, x, a, float("-inf"))
    arg = win.reshape(win.shape[:4] + (kh * kw,)).argmax(axis=4)  # the first maximum takes the gradient
    return _scatter_taps(c, g, x.shape, a, lambda i, j: arg == i * kw + j)


def _avg_pool_grad(c: KernelContext, ins: list[Array], a: Attrs) -> Array:
    (g,) = ins
    in_hw = tuple(a["input_hw"])
    share = (g / _avg_divisor(c, in_hw, a)).astype(g.dtype)
    return _scatter_taps(c, share, g.shape[:2] + in_hw, a, lambda i, j: 1)


def _max_pool_grad_rule(b: GradBuilder, ins: tuple[str, ...], out: str, g: str, a: Attrs) -> tuple[str | None, ...]:
    return (b.emit("max_pool2d_grad", [ins[0], g], a),)


def _avg_pool_grad_rule(b: GradBuilder, ins: tuple[str, ...], out: str, g: str, a: Attrs) -> tuple[str | None, ...]:
    return (b.emit("avg_pool2d_grad", [g], {**a, "input_hw": b.type(ins[0]).shape[2:]}),)


def _avg_pool_grad_infer(ins: Types, a: Attrs) -> TensorType:
    (g,) = ins
    return TensorType(g.shape[:2] + tuple(a["input_hw"]), g.dtype)


def _pool_flops(ins: Types, out: TensorType, a: Attrs) -> int:
    return out.numel * a["kernel"][0] * a["kernel"][1]


def _global_avg_pool_infer(ins: Types, a: Attrs) -> TensorType:
    (x,) = ins
    if x.rank != 4:
        raise SwpError(f"`global_avg_pool` needs a 4-d input [N, C, H, W], got {x}")
    return TensorType(x.shape[:2], floating("global_avg_pool", x))


def _global_avg_pool_grad(b: GradBuilder, ins: tuple[str, ...], out: str, g: str,
                          a: Attrs) -> tuple[str | None, ...]:
    shape = b.type(ins[0]).shape
    return (b.emit("broadcast_to", [g], {"shape": shape, "axes": (2, 3), "scale": 1.0 / (shape[2] * shape[3])}),)


# ---- padding and masks -----------------------------------------------------------


def _pad2d_infer(ins: Types, a: Attrs) -> TensorType:
    (x,) = ins
    top, bottom, left, right = a["padding"]
    if x.rank != 4 or min(a["padding"]) < 0:
        raise SwpError(f"`pad2d` needs a 4-d input and non-negative padding, got {x} and {a['padding']}")
    return TensorType(x.shape[:2] + (x.shape[2] + top + bottom, x.shape[3] + left + right), x.dtype)


def _pad2d(c: KernelContext, ins: list[Array], a: Attrs) -> Array:
    top, bottom, left, right = a["padding"]
    return c.xp.pad(ins[0], ((0, 0), (0, 0), (top, bottom), (left, right)))


def _pad2d_grad(b: GradBuilder, ins: tuple[str, ...], out: str, g: str, a: Attrs) -> tuple[str | None, ...]:
    return (b.emit("crop2d", [g], a),)


def _crop2d_infer(ins: Types, a: Attrs) -> TensorType:
    (g,) = ins
    top, bottom, left, right = a["padding"]
    return TensorType(g.shape[:2] + (g.shape[2] - top - bottom, g.shape[3] - left - right), g.dtype)


def _crop2d(c: KernelContext, ins: list[Array], a: Attrs) -> Array:
    (g,) = ins
    top, bottom, left, right = a["padding"]
    return g[:, :, top:g.shape[2] - bottom, left:g.shape[3] - right].copy()


def _causal_infer(ins: Types, a: Attrs) -> TensorType:
    (x,) = ins
    if x.rank < 2 or x.shape[-1] != x.shape[-2]:
        raise SwpError(f"`causal_mask` needs square trailing dimensions [..., T, T], got {x}")
    return TensorType(x.shape, floating("causal_mask", x))


def _causal(c: KernelContext, ins: list[Array], a: Attrs) -> Array:
    """Entries above the diagonal (key after query) become ``fill``."""
    (x,) = ins
    t = x.shape[-1]
    future = c.xp.triu(c.xp.ones((t, t), dtype=bool), k=1)
    return c.xp.where(future, x.dtype.type(a["fill"]), x)


def _causal_grad(b: GradBuilder, ins: tuple[str, ...], out: str, g: str, a: Attrs) -> tuple[str | None, ...]:
    return (b.emit("causal_mask", [g], {"fill": 0.0}),)


# ---- embedding -----------------------------------------------------------------


def _embedding_infer(ins: Types, a: Attrs) -> TensorType:
    ids, table = ins
    if ids.dtype.is_float:
        raise SwpError(f"`embedding` indices must be integers, got {ids}")
    if table.rank != 2:
        raise SwpError(f"`embedding` table must be 2-d [vocab, dim], got {table}")
    return TensorType(ids.shape + (table.shape[1],), floating("embedding", table))


def scatter_add(xp: Any, target: Array, index: Array, values: Array) -> None:
    """target[index] += values, with repeated indices accumulating."""
    if hasattr(xp, "add") and hasattr(xp.add, "at"):
        xp.add.at(target, index, values)
    else:  # CuPy before add.at
        import cupyx

        cupyx.scatter_add(target, index, values)


def _embedding_grad_kernel(c: KernelContext, ins: list[Array], a: Attrs) -> Array:
    ids, g = ins
    table = c.xp.zeros((a["vocab"], g.shape[-1]), dtype=g.dtype)
    scatter_add(c.xp, table, ids.reshape(-1), g.reshape(-1, g.shape[-1]))
    return table


def _embedding_grad(b: GradBuilder, ins: tuple[str, ...], out: str, g: str, a: Attrs) -> tuple[str | None, ...]:
    ids, table = ins
    return None, b.emit("embedding_grad", [ids, g], {"vocab": b.type(table).shape[0]})


def _embedding_grad_infer(ins: Types, a: Attrs) -> TensorType:
    ids, g = ins
    return TensorType((a["vocab"], g.shape[-1]), g.dtype)


def _gathered_bytes(ins: Types, out: TensorType, a: Attrs) -> int:
    return ins[0].nbytes + out.nbytes  # only the gathered rows of the table are read


register(
    OpDef("softmax", (1, 1), same_as(0, op="softmax"), per_element(5), _softmax, _via_output("softmax_grad")),
    OpDef("log_softmax", (1, 1), same_as(0, op="log_softmax"), per_element(5), _log_softmax,
          _via_output("log_softmax_grad")),
    OpDef("softmax_grad", (2, 2), same_as(1, op="softmax_grad"), per_element(4), _softmax_grad),
    OpDef("log_softmax_grad", (2, 2), same_as(1, op="log_softmax_grad"), per_element(4), _log_softmax_grad),
    OpDef("layer_norm", (3, 3), _layer_norm_infer, per_element(8), _norm_kernel("layer"), _norm_grad("layer")),
    OpDef("layer_norm_grad", (3, 3), same_as(0, op="layer_norm_grad"), per_input_element(14),
          _norm_grad_kernel("layer")),
    OpDef("layer_norm_dscale", (2, 2), _dscale_infer("layer"), per_input_element(10), _norm_dscale_kernel("layer")),
    OpDef("batch_norm", (3, 3), _batch_norm_infer, per_element(8), _norm_kernel("batch"), _norm_grad("batch")),
    OpDef("batch_norm_grad", (3, 3), same_as(0, op="batch_norm_grad"), per_input_element(14),
          _norm_grad_kernel("batch")),
    OpDef("batch_norm_dscale", (2, 2), _dscale_infer("batch"), per_input_element(10), _norm_dscale_kernel("batch")),
    OpDef("conv2d", (2, 2), _conv2d_infer, _conv2d_flops, _conv2d, _conv2d_grad),
    OpDef("conv2d_grad_input", (2, 2), _grad_input_infer, _grad_input_flops, _conv2d_grad_input),
    OpDef("conv2d_grad_weight", (2, 2), _grad_weight_infer, _grad_weight_flops, _conv2d_grad_weight),
    OpDef("max_pool2d", (1, 1), _pool_infer("max_pool2d"), _pool_flops, _max_pool, _max_pool_grad_rule),
    OpDef("max_pool2d_grad", (2, 2), same_as(0, op="max_pool2d_grad"), lambda ins, o, a: _pool_flops(ins, ins[1], a),
          _max_pool_grad),
    OpDef("avg_pool2d", (1, 1), _pool_infer("avg_pool2d"), _pool_flops, _avg_pool, _avg_pool_grad_rule),
    OpDef("avg_pool2d_grad", (1, 1), _avg_pool_grad_infer, lambda ins, o, a: _pool_flops(ins, ins[0], a),
          _avg_pool_grad),
    OpDef("global_avg_pool", (1, 1), _global_avg_pool_infer, per_input_element(1),
          lambda c, ins, a: ins[0].mean(axis=(2, 3)).astype(ins[0].dtype), _global_avg_pool_grad),
    OpDef("pad2d", (1, 1), _pad2d_infer, lambda ins, o, a: 0, _pad2d, _pad2d_grad),
    OpDef("crop2d", (1, 1), _crop2d_infer, lambda ins, o, a: 0, _crop2d),
    OpDef("causal_mask", (1, 1), _causal_infer, per_element(1), _causal, _causal_grad),
    OpDef("embedding", (2, 2), _embedding_infer, lambda ins, o, a: 0, lambda c, ins, a: ins[1][ins[0]],
          _embedding_grad, bytes_read=_gathered_bytes),
    OpDef("embedding_grad", (2, 2), _embedding_grad_infer, lambda ins, o, a: ins[1].numel,
          _embedding_grad_kernel),
)
