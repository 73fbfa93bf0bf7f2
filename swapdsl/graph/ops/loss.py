"""Losses: scalar means, numerically careful."""

from __future__ import annotations

from typing import Any

from swapdsl.common.errors import SwpError
from swapdsl.graph.ir import DType, TensorType
from swapdsl.graph.ops.halfbits import narrow, widen
from swapdsl.graph.ops.registry import (
    Array, Attrs, GradBuilder, KernelContext, OpDef, Types, buffers, chunk_len, chunks, floating, iota,
    per_input_element, register, same_as,
)


def _xent_infer(ins: Types, a: Attrs) -> TensorType:
    logits, labels = ins
    dtype = floating("softmax_cross_entropy", logits)
    if labels.dtype.is_float:
        raise SwpError(f"`softmax_cross_entropy` labels must be integer class indices, got {labels}",
                       hints=["declare the labels as i32 or i64"])
    if logits.rank < 1 or logits.shape[:-1] != labels.shape:
        raise SwpError("`softmax_cross_entropy` labels must have the logits' shape without the class dimension",
                       hints=[f"logits are {logits}, labels are {labels}"])
    return TensorType((), DType.f32 if dtype in (DType.f16, DType.bf16) else dtype)  # (computed in f32)


def logit_rows(logits: Array, labels: Array) -> tuple[Array, Array]:
    classes = logits.shape[-1]
    return logits.reshape(-1, classes), labels.reshape(-1)


def row_starts(xp: Any, out: Array, rows: slice, classes: int) -> Array:
    """Into int64 ``out``: the flat index of the first entry of each row in ``rows``."""
    iota(xp, out, rows.start)
    xp.multiply(out, classes, out=out)
    return out


def labelled(c: KernelContext, z: Array, y: Array, rows: slice) -> tuple[Array, Array]:
    """(flat index of each row's labelled entry, an f-typed buffer of the rows' size)."""
    n = rows.stop - rows.start
    index = row_starts(c.xp, c.scratch.take((n,), c.xp.int64), rows, z.shape[1])
    c.xp.add(index, y[rows], out=index)
    return index, c.scratch.take((n,), z.dtype)


# The cross-entropy kernels read half logits as they are and compute in f32 a chunk of rows at a time
# (``kernels.NATIVE``): an f32 copy of every chunk, the loss in f32, the gradient rounded once. So a
# half model's largest tensors, the logits and their gradient, are never widened whole.


def _half(x: Any) -> bool:
    return x.dtype.itemsize == 2


def _xent_chunk(rows: int, classes: int, itemsize: int, nbytes: int) -> int:
    """Rows per chunk: a half chunk takes an f32 copy besides its f32 temporary."""
    return chunk_len(rows, classes * (8 if itemsize == 2 else itemsize), nbytes)


def _wide_chunk(c: KernelContext, z: Array) -> Array:
    """``z`` (a chunk of rows), or its f32 copy if it is half."""
    if not _half(z):
        return z
    wide = c.scratch.take(z.shape, c.xp.float32)
    widen(c.xp, wide, z)
    return wide


def _xent(c: KernelContext, ins: list[Array], out: Array, a: Attrs) -> None:
    """mean over rows of logsumexp(z) - z[label]; rows in chunks, so the exp temporary stays small."""
    z, y = logit_rows(*ins)
    xp = c.xp
    total = c.scratch.take((z.shape[0],), out.dtype)
    mark = c.scratch.used
    n = _xent_chunk(z.shape[0], z.shape[1], z.dtype.itemsize, z.nbytes)
    for rows in (slice(i, min(i + n, z.shape[0])) for i in range(0, z.shape[0], n)):
        zc, lse = _wide_chunk(c, z[rows]), total[rows]
        m, e = c.scratch.take((zc.shape[0], 1), zc.dtype), c.scratch.take(zc.shape, zc.dtype)
        xp.max(zc, axis=1, keepdims=True, out=m)
        xp.subtract(zc, m, out=e)
        xp.exp(e, out=e)
        xp.sum(e, axis=1, out=lse)
        xp.log(lse, out=lse)
        xp.add(m[:, 0], lse, out=lse)
        index, picked = labelled(c, zc, y[rows], slice(0, zc.shape[0]))
        xp.take(zc.reshape(-1), index, out=picked)
        xp.subtract(lse, picked, out=lse)
        c.scratch.used = mark
    xp.mean(total, out=out)


def _xent_scratch(ins: Types, out: TensorType, a: Attrs) -> int:
    rows, classes, size = ins[0].numel // ins[0].shape[-1], ins[0].shape[-1], ins[0].dtype.itemsize
    n = _xent_chunk(rows, classes, size, ins[0].nbytes)
    wide = out.dtype.itemsize
    copy = [n * classes * 4] if size == 2 else []
    return buffers(rows * wide, *copy, n * wide, n * classes * wide, 8 * n, n * wide)


def _xent_grad_kernel(c: KernelContext, ins: list[Array], out: Array, a: Attrs) -> None:
    """(softmax(z) - onehot(label)) * g / rows, written row-wise into the output."""
    logits, labels, g = ins
    z, y = logit_rows(logits, labels)
    if _half(z):
        _xent_grad_half(c, z, y, g, out.reshape(z.shape))
        return
    xp = c.xp
    p = out.reshape(z.shape)
    m = c.scratch.take((z.shape[0], 1), z.dtype)
    xp.max(z, axis=1, keepdims=True, out=m)
    xp.subtract(z, m, out=p)
    xp.exp(p, out=p)
    xp.sum(p, axis=1, keepdims=True, out=m)
    xp.divide(p, m, out=p)
    index, picked = labelled(c, z, y, slice(0, z.shape[0]))
    xp.take(p.reshape(-1), index, out=picked)
    xp.subtract(picked, 1, out=picked)
    xp.put(p.reshape(-1), index, picked)
    scale = c.scratch.take((), g.dtype)
    xp.divide(g, z.shape[0], out=scale)
    xp.multiply(p, scale, out=p)


def _xent_grad_half(c: KernelContext, z: Array, y: Array, g: Array, dest: Array) -> None:
    """The same steps on an f32 copy of a chunk of rows at a time, each rounded once into ``dest``."""
    xp = c.xp
    scale = c.scratch.take((), xp.float32)
    xp.divide(g, z.shape[0], out=scale)
    mark = c.scratch.used
    n = chunk_len(z.shape[0], z.shape[1] * 4, z.nbytes)
    for rows in (slice(i, min(i + n, z.shape[0])) for i in range(0, z.shape[0], n)):
        p = _wide_chunk(c, z[rows])
        m = c.scratch.take((p.shape[0], 1), p.dtype)
        xp.max(p, axis=1, keepdims=True, out=m)
        xp.subtract(p, m, out=p)
        xp.exp(p, out=p)
        xp.sum(p, axis=1, keepdims=True, out=m)
        xp.divide(p, m, out=p)
        index, picked = labelled(c, p, y[rows], slice(0, p.shape[0]))
        xp.take(p.reshape(-1), index, out=picked)
        xp.subtract(picked, 1, out=picked)
        xp.put(p.reshape(-1), index, picked)
        xp.multiply(p, scale, out=p)
        narrow(xp, dest[rows], p)
        c.scratch.used = mark


def _xent_grad_scratch(ins: Types, out: TensorType, a: Attrs) -> int:
    rows, classes, size = ins[0].numel // ins[0].shape[-1], ins[0].shape[-1], ins[0].dtype.itemsize
    if size == 2:
        n = chunk_len(rows, classes * 4, ins[0].nbytes)
        return buffers(4, n * classes * 4, n * 4, 8 * n, n * 4)
    return buffers(rows * size, 8 * rows, rows * size, ins[2].dtype.itemsize)


def _xent_grad(b: GradBuilder, ins: tuple[str, ...], out: str, g: str, a: Attrs) -> tuple[str | None, ...]:
    return b.emit("softmax_cross_entropy_grad", [ins[0], ins[1], g]), None


def _mse_infer(ins: Types, a: Attrs) -> TensorType:
    p, t = ins
    dtype = floating("mse_loss", p, t)
    if p.shape != t.shape:
        raise SwpError("`mse_loss` prediction and target shapes differ", hints=[f"prediction is {p}, target is {t}"])
    return TensorType((), dtype)


def _mse(c: KernelContext, ins: list[Array], out: Array, a: Attrs) -> None:
    p, t = ins
    d = c.scratch.take(p.shape, p.dtype)
    c.xp.subtract(p, t, out=d)
    c.xp.multiply(d, d, out=d)
    c.xp.mean(d, out=out)


def _mse_grad_kernel(c: KernelContext, ins: list[Array], out: Array, a: Attrs) -> None:
    p, t, g = ins
    scale = c.scratch.take((), g.dtype)
    c.xp.multiply(2.0, g, out=scale)
    c.xp.divide(scale, p.size, out=scale)
    c.xp.subtract(p, t, out=out)
    c.xp.multiply(out, scale, out=out)


def _mse_grad(b: GradBuilder, ins: tuple[str, ...], out: str, g: str, a: Attrs) -> tuple[str | None, ...]:
    dp = b.emit("mse_loss_grad", [ins[0], ins[1], g])
    return dp, b.emit("neg", [dp])


register(
    OpDef("softmax_cross_entropy", (2, 2), _xent_infer, per_input_element(6), _xent, _xent_grad,
          scratch=_xent_scratch),
    OpDef("softmax_cross_entropy_grad", (3, 3), same_as(0, float_only=False), per_input_element(6),
          _xent_grad_kernel, scratch=_xent_grad_scratch),
    OpDef("mse_loss", (2, 2), _mse_infer, per_input_element(3), _mse, _mse_grad,
          scratch=lambda ins, out, a: buffers(ins[0].nbytes)),
    OpDef("mse_loss_grad", (3, 3), same_as(0, op="mse_loss_grad"), per_input_element(3), _mse_grad_kernel,
          scratch=lambda ins, out, a: buffers(ins[2].dtype.itemsize)),
)
