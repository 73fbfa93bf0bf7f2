"""Convolution and pooling.

Every kernel writes into its output and takes its temporaries from the scratch
its op declares. Convolution copies strided window views into scratch columns
(im2col) and multiplies; its adjoints scatter back with one strided add per
kernel tap. Kernels tile the batch so that a tile's temporaries stay near half
the op's largest tensor.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from swapdsl.common.errors import SwpError
from swapdsl.graph.ir import TensorType
from swapdsl.graph.ops.blas import matmul_into
from swapdsl.graph.ops.registry import (
    Array, Attrs, GradBuilder, KernelContext, OpDef, Types, buffers, chunk_len, chunks, floating, op_bytes,
    per_input_element, register, same_as,
)

# ---- convolution and pooling ---------------------------------------------------


def out_size(size: int, k: int, s: int, p: int, d: int) -> int:
    return (size + 2 * p - d * (k - 1) - 1) // s + 1


def _positive_out(op: str, shape: tuple[int, ...], x: TensorType) -> tuple[int, ...]:
    if min(shape) < 1:
        raise SwpError(f"`{op}` output would be empty: input {x} gives spatial size {shape[-2:]}",
                       hints=["the kernel (with dilation) is larger than the padded input"])
    return shape


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


class _Conv(NamedTuple):
    """A convolution's (or pooling's) sizes, from the input shape [N, C, H, W] and the attributes."""

    n: int
    channels: int
    hw: tuple[int, int]
    kernel: tuple[int, int]
    out: tuple[int, int]
    padding: tuple[int, int]
    groups: int

    @property
    def padded(self) -> tuple[int, int]:
        return (self.hw[0] + 2 * self.padding[0], self.hw[1] + 2 * self.padding[1])

    def sample_bytes(self, itemsize: int) -> dict[str, int]:
        """One sample's share of each temporary: its window columns, its padded image, its output."""
        k, o = self.kernel[0] * self.kernel[1], self.out[0] * self.out[1]
        pad = self.channels * self.padded[0] * self.padded[1] * itemsize if any(self.padding) else 0
        return {"cols": self.channels * k * o * itemsize, "pad": pad, "out": self.channels * o * itemsize}


def _conv_of(x_shape: tuple[int, ...], kernel: tuple[int, int], a: Attrs) -> _Conv:
    a = {"dilation": (1, 1), "groups": 1, **a}
    return _Conv(x_shape[0], x_shape[1], tuple(x_shape[2:]), tuple(kernel), _conv_geometry(x_shape, kernel, a),
                 tuple(a["padding"]), a["groups"])


def _batch_chunks(cv: _Conv, per_sample: int, ins: list[Array], out: Array) -> list[slice]:
    return chunks(cv.n, per_sample, op_bytes(ins, out))


def _padded(c: KernelContext, x: Array, cv: _Conv, fill: float) -> Array:
    """``x`` (a chunk of the batch) inside a border of ``fill``, in scratch; ``x`` itself without padding."""
    if not any(cv.padding):
        return x
    (ph, pw), (h, w) = cv.padding, cv.hw
    buf = c.scratch.take((x.shape[0], x.shape[1]) + cv.padded, x.dtype)
    buf.fill(fill)
    c.xp.copyto(buf[:, :, ph:ph + h, pw:pw + w], x)
    return buf


def _unpad(c: KernelContext, padded: Array, out: Array, cv: _Conv) -> None:
    if any(cv.padding):  # else ``padded`` is ``out`` (``_padded_target``)
        (ph, pw), (h, w) = cv.padding, cv.hw
        c.xp.copyto(out, padded[:, :, ph:ph + h, pw:pw + w])


def _padded_target(c: KernelContext, out: Array, cv: _Conv) -> Array:
    """Where a gradient over the padded input accumulates: zeroed scratch, or ``out`` itself (no padding)."""
    target = c.scratch.take(out.shape[:2] + cv.padded, out.dtype) if any(cv.padding) else out
    target.fill(0)
    return target


def _columns(c: KernelContext, x: Array, cv: _Conv, a: Attrs, order: tuple[int, ...]) -> Array:
    """Each output position's receptive field, copied into scratch: the window view [n, G, C/G, Ho, Wo, KH,
    KW] transposed by ``order``."""
    n = x.shape[0]
    src = _padded(c, x, cv, 0.0)
    win = _windows(c.xp, src, cv.kernel, a["stride"], a["dilation"], cv.out)
    win = win.reshape((n, cv.groups, cv.channels // cv.groups) + cv.out + cv.kernel).transpose(order)
    cols = c.scratch.take(win.shape, x.dtype)
    c.xp.copyto(cols, win)
    return cols


def _conv2d(c: KernelContext, ins: list[Array], out: Array, a: Attrs) -> None:
    """out[n, g] = W[g] @ cols[n, g], a chunk of the batch at a time."""
    x, w = ins
    o, kh, kw = w.shape[0], w.shape[2], w.shape[3]
    cv = _conv_of(x.shape, (kh, kw), a)
    per = cv.sample_bytes(x.dtype.itemsize)
    wmat = w.reshape(cv.groups, o // cv.groups, -1)
    for k in _batch_chunks(cv, per["cols"] + per["pad"], ins, out):
        n = k.stop - k.start
        cols = _columns(c, x[k], cv, a, (0, 1, 2, 5, 6, 3, 4))  # [n, G, C/G, KH, KW, Ho, Wo]
        p = cv.out[0] * cv.out[1]
        matmul_into(c, wmat, cols.reshape(n, cv.groups, -1, p), out[k].reshape(n, cv.groups, o // cv.groups, p))
        c.scratch.reset()


def _columns_scratch(image: TensorType, ins: Types, out: TensorType, a: Attrs) -> int:
    """A chunk of samples' window columns and padded images (``image``: the convolution's input)."""
    cv = _conv_of(image.shape, ins[1].shape[2:], a)
    per = cv.sample_bytes(image.dtype.itemsize)
    n = chunk_len(cv.n, per["cols"] + per["pad"], op_bytes(ins, out))
    return buffers(n * per["pad"], n * per["cols"]) if per["pad"] else buffers(n * per["cols"])


def _conv2d_scratch(ins: Types, out: TensorType, a: Attrs) -> int:
    return _columns_scratch(ins[0], ins, out, a)


def _conv2d_grad_weight(c: KernelContext, ins: list[Array], out: Array, a: Attrs) -> None:
    """dW[g] = sum over the batch of gy[n, g] @ cols[n, g]^T: one GEMM per chunk over (samples x positions)."""
    x, g = ins
    o, (kh, kw) = g.shape[1], a["kernel"]
    cv = _conv_of(x.shape, (kh, kw), a)
    per = cv.sample_bytes(x.dtype.itemsize)
    dw = out.reshape(cv.groups, o // cv.groups, -1)
    parts = _batch_chunks(cv, per["cols"] + per["pad"] + g[0].nbytes, ins, out)
    acc = c.scratch.take(dw.shape, out.dtype) if len(parts) > 1 else dw
    mark = c.scratch.used
    for k in parts:
        n, p = k.stop - k.start, cv.out[0] * cv.out[1]
        cols = _columns(c, x[k], cv, a, (1, 2, 5, 6, 0, 3, 4))  # [G, C/G, KH, KW, n, Ho, Wo]
        gy = c.scratch.take((cv.groups, o // cv.groups, n, p), g.dtype)
        c.xp.copyto(gy, g[k].reshape(n, cv.groups, o // cv.groups, p).transpose(1, 2, 0, 3))
        target = dw if k.start == 0 else acc
        matmul_into(c, gy.reshape(cv.groups, o // cv.groups, -1),
                    cols.reshape(cv.groups, dw.shape[2], -1).swapaxes(-1, -2), target)
        if target is not dw:
            c.xp.add(dw, acc, out=dw)
        c.scratch.used = mark


def _grad_weight_scratch(ins: Types, out: TensorType, a: Attrs) -> int:
    x, g = ins
    cv = _conv_of(x.shape, a["kernel"], a)
    per = cv.sample_bytes(x.dtype.itemsize)
    sample_g = g.nbytes // g.shape[0]
    n = chunk_len(cv.n, per["cols"] + per["pad"] + sample_g, op_bytes(ins, out))
    acc = [out.nbytes] if n < cv.n else []
    return buffers(*acc, n * per["pad"], n * per["cols"], n * sample_g)


def _conv2d_grad_input(c: KernelContext, ins: list[Array], out: Array, a: Attrs) -> None:
    """dcols[n, g] = W[g]^T @ gy[n, g], scattered back with one strided add per kernel tap."""
    g, w = ins
    o, cg, kh, kw = w.shape
    cv = _conv_of((g.shape[0], cg * a["groups"]) + tuple(a["input_hw"]), (kh, kw), a)
    per = cv.sample_bytes(g.dtype.itemsize)
    wt = w.reshape(cv.groups, o // cv.groups, -1).swapaxes(-1, -2)  # [G, C/G*KH*KW, O/G]
    p = cv.out[0] * cv.out[1]
    for k in _batch_chunks(cv, per["cols"] + per["pad"], ins, out):
        n = k.stop - k.start
        dcols = c.scratch.take((n, cv.groups, cg, kh, kw) + cv.out, g.dtype)
        matmul_into(c, wt, g[k].reshape(n, cv.groups, o // cv.groups, p), dcols.reshape(n, cv.groups, -1, p))
        target = _padded_target(c, out[k], cv)
        grouped = target.reshape((n, cv.groups, cg) + cv.padded)
        for i in range(kh):
            for j in range(kw):
                rows, cols = _tap((kh, kw), i, j, a["stride"], a["dilation"], cv.out)
                view = grouped[:, :, :, rows, cols]
                c.xp.add(view, dcols[:, :, :, i, j], out=view)
        _unpad(c, target, out[k], cv)
        c.scratch.reset()


def _grad_input_scratch(ins: Types, out: TensorType, a: Attrs) -> int:
    return _columns_scratch(out, ins, out, a)


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


def _pool_windows(c: KernelContext, x: Array, cv: _Conv, a: Attrs, fill: float) -> Array:
    return _windows(c.xp, _padded(c, x, cv, fill), cv.kernel, a["stride"], (1, 1), cv.out)


def _max_pool(c: KernelContext, ins: list[Array], out: Array, a: Attrs) -> None:
    (x,) = ins
    cv = _conv_of(x.shape, a["kernel"], a)
    for k in _batch_chunks(cv, cv.sample_bytes(x.dtype.itemsize)["pad"], ins, out):
        c.xp.max(_pool_windows(c, x[k], cv, a, float("-inf")), axis=(4, 5), out=out[k])
        c.scratch.reset()


def _avg_divide(c: KernelContext, total: Array, cv: _Conv, a: Attrs) -> None:
    """Divide window sums by the pixels each window averages: the whole kernel, or only its unpadded part."""
    if a.get("count_include_pad", True):
        c.xp.divide(total, float(cv.kernel[0] * cv.kernel[1]), out=total)
        return
    ones = c.scratch.take((1, 1) + cv.padded, total.dtype)
    ones.fill(0)
    (ph, pw), (h, w) = cv.padding, cv.hw
    ones[:, :, ph:ph + h, pw:pw + w].fill(1)
    count = c.scratch.take(cv.out, total.dtype)
    c.xp.sum(_windows(c.xp, ones, cv.kernel, a["stride"], (1, 1), cv.out), axis=(0, 1, 4, 5), out=count)
    c.xp.divide(total, count, out=total)


def _avg_pool(c: KernelContext, ins: list[Array], out: Array, a: Attrs) -> None:
    (x,) = ins
    cv = _conv_of(x.shape, a["kernel"], a)
    for k in _batch_chunks(cv, cv.sample_bytes(x.dtype.itemsize)["pad"], ins, out):
        c.xp.sum(_pool_windows(c, x[k], cv, a, 0.0), axis=(4, 5), out=out[k])
        _avg_divide(c, out[k], cv, a)
        c.scratch.reset()


def _pool_scratch(kind: str):  # noqa: ANN202
    """Per chunk of the batch: the padded input (forward), or for the gradient the padded gradient plus
    the output-sized temporaries: max: the maximum, its float share and two masks; avg: the share."""
    def rule(ins: Types, out: TensorType, a: Attrs) -> int:
        x = ins[0] if kind != "avg_grad" else out
        cv = _conv_of(x.shape, a["kernel"], a)
        size = x.dtype.itemsize
        per = cv.sample_bytes(size)
        divisor = [] if a.get("count_include_pad", True) else [cv.padded[0] * cv.padded[1] * size,
                                                                cv.out[0] * cv.out[1] * size]
        if kind == "forward":
            n = chunk_len(cv.n, per["pad"], op_bytes(ins, out))
            return buffers(n * per["pad"], *divisor) if per["pad"] else buffers(*divisor)
        cells = per["out"] // size
        if kind == "max_grad":
            n = chunk_len(cv.n, 2 * per["pad"] + 2 * per["out"] + 2 * cells, op_bytes(ins, out))
            return buffers(n * per["pad"], n * per["out"], n * cells, n * cells, n * per["out"], n * per["pad"])
        n = chunk_len(cv.n, per["pad"] + per["out"], op_bytes(ins, out))
        return buffers(n * per["out"], *divisor, n * per["pad"])

    return rule


def _scatter_taps(c: KernelContext, target: Array, cv: _Conv, a: Attrs, tap_value: Any) -> None:
    """target (the padded input's gradient) += tap_value(i, j) at the pixels each kernel tap (i, j) read."""
    for i in range(cv.kernel[0]):
        for j in range(cv.kernel[1]):
            rows, cols = _tap(cv.kernel, i, j, a["stride"], (1, 1), cv.out)
            view = target[:, :, rows, cols]
            c.xp.add(view, tap_value(i, j, rows, cols), out=view)


def _max_pool_grad(c: KernelContext, ins: list[Array], out: Array, a: Attrs) -> None:
    """The gradient goes to the first maximum of each window, taps in row-major order."""
    x, g = ins
    xp, cv = c.xp, _conv_of(x.shape, a["kernel"], a)
    per = cv.sample_bytes(x.dtype.itemsize)
    cells = per["out"] // x.dtype.itemsize
    for k in _batch_chunks(cv, 2 * per["pad"] + 2 * per["out"] + 2 * cells, ins, out):
        n = k.stop - k.start
        src = _padded(c, x[k], cv, float("-inf"))
        top = c.scratch.take((n, cv.channels) + cv.out, x.dtype)
        xp.max(_windows(xp, src, cv.kernel, a["stride"], (1, 1), cv.out), axis=(4, 5), out=top)
        taken, hit = c.scratch.take(top.shape, xp.bool_), c.scratch.take(top.shape, xp.bool_)
        taken.fill(False)
        share = c.scratch.take(top.shape, x.dtype)
        target = _padded_target(c, out[k], cv)

        def first_max(i: int, j: int, rows: slice, cols: slice) -> Array:
            xp.equal(src[:, :, rows, cols], top, out=hit)
            xp.greater(hit, taken, out=hit)  # a maximum, and the window's first
            xp.logical_or(taken, hit, out=taken)
            return xp.multiply(g[k], hit, out=share)

        _scatter_taps(c, target, cv, a, first_max)
        _unpad(c, target, out[k], cv)
        c.scratch.reset()


def _avg_pool_grad(c: KernelContext, ins: list[Array], out: Array, a: Attrs) -> None:
    (g,) = ins
    cv = _conv_of(out.shape, a["kernel"], a)
    per = cv.sample_bytes(g.dtype.itemsize)
    for k in _batch_chunks(cv, per["pad"] + per["out"], ins, out):
        share = c.scratch.take(g[k].shape, g.dtype)
        c.xp.copyto(share, g[k])
        _avg_divide(c, share, cv, a)
        target = _padded_target(c, out[k], cv)
        _scatter_taps(c, target, cv, a, lambda i, j, rows, cols: share)
        _unpad(c, target, out[k], cv)
        c.scratch.reset()


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


register(
    OpDef("conv2d", (2, 2), _conv2d_infer, _conv2d_flops, _conv2d, _conv2d_grad, scratch=_conv2d_scratch),
    OpDef("conv2d_grad_input", (2, 2), _grad_input_infer, _grad_input_flops, _conv2d_grad_input,
          scratch=_grad_input_scratch),
    OpDef("conv2d_grad_weight", (2, 2), _grad_weight_infer, _grad_weight_flops, _conv2d_grad_weight,
          scratch=_grad_weight_scratch),
    OpDef("max_pool2d", (1, 1), _pool_infer("max_pool2d"), _pool_flops, _max_pool, _max_pool_grad_rule,
          scratch=_pool_scratch("forward")),
    OpDef("max_pool2d_grad", (2, 2), same_as(0, op="max_pool2d_grad"), lambda ins, o, a: _pool_flops(ins, ins[1], a),
          _max_pool_grad, scratch=_pool_scratch("max_grad")),
    OpDef("avg_pool2d", (1, 1), _pool_infer("avg_pool2d"), _pool_flops, _avg_pool, _avg_pool_grad_rule,
          scratch=_pool_scratch("forward")),
    OpDef("avg_pool2d_grad", (1, 1), _avg_pool_grad_infer, lambda ins, o, a: _pool_flops(ins, ins[0], a),
          _avg_pool_grad, scratch=_pool_scratch("avg_grad")),
    OpDef("global_avg_pool", (1, 1), _global_avg_pool_infer, per_input_element(1),
          lambda c, ins, out, a: c.xp.mean(ins[0], axis=(2, 3), out=out), _global_avg_pool_grad),
)
