"""The kernel an op runs with on given types, and the scratch it takes.

A kernel is written once, for f32 and f64. On f16 or bf16 tensors it runs on f32 copies of its half
inputs, into an f32 result rounded once to the half output: products and sums accumulate in f32, as
tensor-core GEMMs, cuDNN and element-wise kernels computing in f32 registers do. Where an op splits
along one axis (``CUTS``), the copies are of a block of slices at a time, so the scratch stays near a
tile's worth instead of three whole f32 tensors; a ``gated`` update (a guarded step's) keeps its old value
unless the step's flag is 1. An op with ``on_half`` (the products, on CuPy: cuBLAS with half operands) takes
half tensors as they are where it can, and is staged where it cannot. ``scratch_need`` declares exactly
what ``kernel_of``'s staged kernel takes (the direct path takes none).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import attrs
import numpy as np

from swapdsl.graph.ir import DType, TensorType
from swapdsl.graph.ops.halfbits import BITS, is_bf16, narrow, widen
from swapdsl.graph.ops.registry import (REGISTRY, Array, Attrs, Kernel, KernelContext, Types, buffers, chunk_len,
                                        infer, np_dtype, type_of)

HALF = (DType.f16, DType.bf16)


def is_half(t: TensorType) -> bool:
    return t.dtype in HALF


def _widened(t: TensorType) -> TensorType:
    return TensorType(t.shape, DType.f32) if is_half(t) else t


# ---- how an op splits: its cut ----------------------------------------------------


@attrs.frozen
class Cut:
    """An op's tensors cut into slices along one axis, once each tensor's leading ``merged`` axes are seen as
    one (for a cut along axis 0): per input, the axis it is cut along (None: whole, copied once); the
    output's axis, or None where each block's result is summed (by the op ``summed``, which adds into its
    first input, or else by adding an f32 partial). ``rows`` slices, ``block`` at a time (``staged``)."""

    merged: int
    axes: tuple[int | None, ...]
    out_axis: int | None
    summed: str | None = None
    broadcast: bool = False  # inputs not cut are broadcast over the merged axes (seen without them)
    offset: bool = False  # the kernel hashes element indices (dropout): it is told its block's first one
    rows: int = 0
    block: int = 0

    def view(self, shape: tuple[int, ...], axis: int | None) -> tuple[int, ...]:
        """How a tensor of ``shape`` cut along ``axis`` is seen: its merged leading axes as one."""
        if axis == 0 and self.merged > 1:
            return (math.prod(shape[:self.merged]), *shape[self.merged:])
        return shape

    def whole(self, shape: tuple[int, ...], out: tuple[int, ...]) -> tuple[int, ...]:
        """How an input not cut is seen: broadcast over the merged axes, or as it is."""
        if not self.broadcast:
            return shape
        return ((1,) * (len(out) - len(shape)) + shape)[self.merged:]

    def block_shape(self, shape: tuple[int, ...], axis: int) -> tuple[int, ...]:
        v = self.view(shape, axis)
        return v[:axis] + (self.block,) + v[axis + 1:]

    def attrs(self, a: Attrs, out: TensorType, start: int) -> Attrs:
        """A block's attributes: an ``axis`` past the merged axes renumbered; a hashing kernel's offset."""
        if "axis" in a and self.merged > 1:
            a = {**a, "axis": a["axis"] - (self.merged - 1)}
        if self.offset:  # (after the micro-batch's own offset, if any)
            a = {**a, "offset": a.get("offset", 0) + start * (out.numel // self.rows)}
        return a


CutRule = Callable[[Types, TensorType, Attrs], "Cut | None"]


def _broadcast_axes(ins: Types, out: TensorType) -> int:
    """The leading axes of ``out`` that every input either has in full or is broadcast over."""
    axes = len(out.shape)
    for t in ins:
        if t.shape != out.shape:
            padded = (1,) * (len(out.shape) - len(t.shape)) + t.shape
            axes = min(axes, next((i for i, d in enumerate(padded) if d != 1), len(padded)))
    return axes


def _leading(ins: Types, out: TensorType, merged: int, **kw: Any) -> Cut | None:
    """Cut along ``out``'s leading ``merged`` axes: every input of its rank with those axes is cut too."""
    if merged <= 0:
        return None
    axes = tuple(0 if t.rank == out.rank and t.shape[:merged] == out.shape[:merged] else None for t in ins)
    return Cut(merged, axes, 0, **kw)


def _elementwise(**kw: Any) -> CutRule:
    return lambda ins, out, a: _leading(ins, out, _broadcast_axes(ins, out), broadcast=True, **kw)


def _last_axis(ins: Types, out: TensorType, a: Attrs) -> Cut | None:
    """Softmax and its kin over the last axis: every row is its own."""
    if a.get("axis", -1) % max(out.rank, 1) != out.rank - 1:
        return None
    return _leading(ins, out, min(_broadcast_axes(ins, out), out.rank - 1), broadcast=True)


def _product(ins: Types, out: TensorType, a: Attrs) -> Cut | None:
    """A product with a matrix (a weight): a row of the first operand gives a row of the result. A batch of
    products over equal leading axes: each is its own."""
    x, w = ins
    if w.rank == 2 and x.shape[:-1] == out.shape[:-1]:
        return Cut(out.rank - 1, (0, None), 0)
    if out.rank > 2 and x.shape[:-2] == w.shape[:-2] == out.shape[:-2]:
        return Cut(out.rank - 2, (0, 0), 0)
    return None


def _batched(ins: Types, out: TensorType, a: Attrs) -> Cut | None:
    x, w = ins
    return Cut(out.rank - 2, (0, 0), 0) if out.rank > 2 and x.shape[:-2] == w.shape[:-2] == out.shape[:-2] else None


def _folded(ins: Types, out: TensorType, a: Attrs) -> Cut | None:
    """A product summed over every leading axis of its operands (a weight gradient): its blocks summed by
    its accumulate op."""
    x, g = ins
    return Cut(x.rank - 1, (0, 0), None, REGISTRY["matmul_tn_fold"].accumulate) if x.rank > 1 else None


def _images(*cut: bool, summed: bool = False) -> CutRule:
    """Images [N, ...] each its own: the inputs flagged cut along N (a weight is not)."""
    def rule(ins: Types, out: TensorType, a: Attrs) -> Cut | None:
        return Cut(1, tuple(0 if c else None for c in cut), None if summed else 0)

    return rule


def _channels(*axes: int | None, out_axis: int) -> CutRule:
    """Batch norm: every channel (axis 1 of the input, axis 0 of a per-channel vector) is its own."""
    return lambda ins, out, a: Cut(1, axes, out_axis)


def _norm_rows(ins: Types, out: TensorType, a: Attrs) -> Cut | None:
    """Layer norm and its input gradient: every row (the axes before the scale's) is its own."""
    return _leading(ins, out, ins[0].rank - ins[1].rank)


def _norm_rows_summed(ins: Types, out: TensorType, a: Attrs) -> Cut | None:
    """Layer norm's scale gradient: summed over the rows."""
    merged = ins[0].rank - a.get("scale_rank", 1)
    return Cut(merged, (0, 0), None) if merged > 0 else None


def _sum(ins: Types, out: TensorType, a: Attrs) -> Cut | None:
    """A sum keeps the images or the channels it does not reduce; else its blocks are summed."""
    axes, keep = a["axes"], a["keepdims"]
    if 0 not in axes:
        return Cut(1, (0,), 0)
    if ins[0].rank > 1 and 1 not in axes:
        return Cut(1, (1,), 1 if keep else 0)
    return Cut(1, (0,), None)


def _sum_to(ins: Types, out: TensorType, a: Attrs) -> Cut | None:
    (g,) = ins
    return Cut(1, (0,), None) if g.rank > 0 and (out.rank < g.rank or out.shape[0] == 1) else None


# Ops that only move bits run on half tensors as they are: an f32 round trip would give the same bits.
MOVES = frozenset({"reshape", "permute", "concat", "slice", "slice_grad", "pad2d", "crop2d"})
# Ops whose own kernels read half inputs and compute in f32, a chunk of rows at a time (graph/ops/loss.py).
NATIVE = frozenset({"softmax_cross_entropy", "softmax_cross_entropy_grad"})

# Each op's cut on half tensors (see ``staged``); an op not here runs on whole f32 copies.
_ELEMENTWISE = ("add", "sub", "mul", "div", "add_scalar", "mul_scalar", "pow_scalar", "neg", "relu", "gelu", "tanh",
                "sigmoid", "exp", "log", "sqrt", "cast", "relu_grad", "gelu_grad", "tanh_grad", "sigmoid_grad",
                "pow_scalar_grad", "silu", "silu_grad", "leaky_relu", "leaky_relu_grad", "erf", "erf_grad")
CUTS: dict[str, CutRule] = {
    **{op: _elementwise() for op in _ELEMENTWISE},
    "dropout": _elementwise(offset=True),
    "causal_mask": lambda ins, out, a: _leading(ins, out, out.rank - 2),
    "rope": lambda ins, out, a: _leading(ins, out, out.rank - 2),
    **{op: _last_axis for op in ("softmax", "log_softmax", "softmax_grad", "log_softmax_grad")},
    "matmul": _product, "matmul_nt": _product, "matmul_tn": _batched, "matmul_tn_fold": _folded,
    "conv2d": _images(True, False), "conv2d_grad_input": _images(True, False),
    "conv2d_grad_weight": _images(True, True, summed=True),
    "max_pool2d": _images(True), "max_pool2d_grad": _images(True, True), "avg_pool2d": _images(True),
    "avg_pool2d_grad": _images(True), "global_avg_pool": _images(True),
    "batch_norm": _channels(1, 0, 0, out_axis=1), "batch_norm_grad": _channels(1, 0, 1, out_axis=1),
    "batch_norm_dscale": _channels(1, 1, out_axis=0),
    "batch_norm_running_mean": _channels(0, 1, out_axis=0), "batch_norm_running_var": _channels(0, 1, out_axis=0),
    "batch_norm_eval": _channels(1, 0, 0, 0, 0, out_axis=1),
    "layer_norm": _norm_rows, "layer_norm_grad": _norm_rows, "layer_norm_dscale": _norm_rows_summed,
    "rms_norm": _norm_rows, "rms_norm_grad": _norm_rows, "rms_norm_dscale": _norm_rows_summed,
    "sum": _sum, "sum_to": _sum_to,
}


def staged(op: str, ins: Types, out: TensorType, attrs_: Attrs | None = None) -> Cut | None:
    """How ``kernel_of`` stages ``op`` on these types a block at a time; None: it copies whole tensors (no
    half tensor, no cut for the op on these types, or one block would do)."""
    rule = CUTS.get(op)
    if rule is None or not (is_half(out) or any(map(is_half, ins))):
        return None
    cut = rule(ins, out, attrs_ or {})
    if cut is None or all(ax is None for ax in cut.axes):
        return None
    first = next(i for i, ax in enumerate(cut.axes) if ax is not None)
    view = cut.view(ins[first].shape, cut.axes[first])
    rows = view[cut.axes[first]] if len(view) > cut.axes[first] else 0  # (a 0-d tensor has no axis to cut)
    if rows < 2:
        return None
    per_row = sum(4 * t.numel // rows for t, ax in zip(ins, cut.axes) if ax is not None and is_half(t))
    if cut.out_axis is not None and (is_half(out) or cut.out_axis != 0):
        per_row += _widened(out).dtype.itemsize * out.numel // rows
    block = chunk_len(rows, per_row, max(t.nbytes for t in (*ins, out)))
    return attrs.evolve(cut, rows=rows, block=block) if block < rows else None


# ---- the kernels --------------------------------------------------------------------


def kernel_of(op: str, ins: Types, out: TensorType, attrs_: Attrs | None = None) -> Kernel:
    """``op``'s kernel for tensors of these types: its own, or, where any is half, its own on f32 copies (of
    a block at a time, where the op splits), unless its ``on_half`` takes them as they are; for a ``gated``
    update, one that keeps the old value (its first input) unless the flag is 1."""
    if attrs_ and attrs_.get("gated"):
        return _gated(kernel_of(op, ins[:-1], out, {k: v for k, v in attrs_.items() if k != "gated"}))
    kernel = REGISTRY[op].kernel
    if op in MOVES or op in NATIVE or not (is_half(out) or any(map(is_half, ins))):
        return kernel
    wide = _staged_kernel(op, kernel, ins, out, attrs_)
    on_half = REGISTRY[op].on_half
    if on_half is None:
        return wide

    def half_first(c: KernelContext, ins_: list[Array], out_: Array, a: Attrs) -> None:
        if not on_half(c, ins_, out_, a):
            wide(c, ins_, out_, a)

    return half_first


def _staged_kernel(op: str, kernel: Kernel, ins: Types, out: TensorType, attrs_: Attrs | None) -> Kernel:
    """``kernel`` on f32 copies of half tensors: a block at a time where the op splits, else whole."""
    cut = staged(op, ins, out, attrs_)
    if cut is not None and cut.out_axis is None:
        return _summed_blocks(kernel, cut, out)
    if cut is not None:
        return _blocks(kernel, cut, out)

    def in_f32(c: KernelContext, ins_: list[Array], out_: Array, a: Attrs) -> None:
        wide = [_f32_copy(c, x) for x in ins_]
        result = c.scratch.take(out_.shape, c.xp.float32) if is_half(out) else out_
        _run(c, kernel, wide, result, a)
        if result is not out_:
            narrow(c.xp, out_, result)

    return in_f32


def _run(c: KernelContext, kernel: Kernel, ins_: list[Array], out_: Array, a: Attrs) -> None:
    """``kernel`` with the copies taken so far kept from its ``reset``."""
    below, c.scratch.floor = c.scratch.floor, c.scratch.used
    try:
        kernel(c, ins_, out_, a)
    finally:
        c.scratch.floor = below


def _index(axis: int, part: slice) -> tuple[slice, ...]:
    return (slice(None),) * axis + (part,)


def _sources(c: KernelContext, cut: Cut, ins_: list[Array], out_: Array) -> list[Array]:
    """Each input as the blocks see it: a cut one in its view, a whole one copied to f32 once."""
    return [x.reshape(cut.view(x.shape, ax)) if ax is not None else _f32_copy(c, x.reshape(cut.whole(x.shape, out_.shape)))
            for x, ax in zip(ins_, cut.axes)]


def _block_of(c: KernelContext, cut: Cut, src: list[Array], part: slice) -> list[Array]:
    return [_f32_copy(c, x[_index(ax, part)]) if ax is not None else x for x, ax in zip(src, cut.axes)]


def _blocks(kernel: Kernel, cut: Cut, out: TensorType) -> Kernel:
    """``kernel`` on f32 copies of a block of each cut input at a time (others copied once), each block's
    result rounded into its slice of the output."""
    direct = not is_half(out) and cut.out_axis == 0  # the output's block is contiguous: written in place

    def blocks(c: KernelContext, ins_: list[Array], out_: Array, a: Attrs) -> None:
        xp = c.xp
        dest = out_.reshape(cut.view(out_.shape, cut.out_axis))
        src = _sources(c, cut, ins_, out_)
        base = c.scratch.used
        for i in range(0, cut.rows, cut.block):
            c.scratch.used = base
            part = slice(i, min(i + cut.block, cut.rows))
            wide = _block_of(c, cut, src, part)
            target = dest[_index(cut.out_axis, part)]
            if direct:  # an input in place is the output's block itself (CuPy copies an overlapping other)
                wide = [target if x is out_ and w.shape == target.shape else w for x, w in zip(ins_, wide)]
            result = target if direct else c.scratch.take(target.shape, _np_wide(xp, out_))
            _run(c, kernel, wide, result, cut.attrs(a, out, i))
            if not direct:
                narrow(xp, target, result)

    return blocks


def _summed_blocks(kernel: Kernel, cut: Cut, out: TensorType) -> Kernel:
    """``kernel`` on a block at a time, the blocks' results summed in f32 (by the op's accumulate op, or
    through a partial) and rounded once."""
    add_into = REGISTRY[cut.summed].kernel if cut.summed else None

    def summed(c: KernelContext, ins_: list[Array], out_: Array, a: Attrs) -> None:
        xp = c.xp
        total = c.scratch.take(out_.shape, xp.float32) if is_half(out) else out_
        partial = None if add_into else c.scratch.take(out_.shape, total.dtype)
        src = _sources(c, cut, ins_, out_)
        base = c.scratch.used
        for i in range(0, cut.rows, cut.block):
            c.scratch.used = base
            wide = _block_of(c, cut, src, slice(i, min(i + cut.block, cut.rows)))
            if i == 0:
                _run(c, kernel, wide, total, a)
            elif add_into is not None:
                _run(c, add_into, [total, *wide], total, a)
            else:
                _run(c, kernel, wide, partial, a)
                xp.add(total, partial, out=total)
        if total is not out_:
            narrow(xp, out_, total)

    return summed


def _gated(kernel: Kernel) -> Kernel:
    def gated(c: KernelContext, ins_: list[Array], out_: Array, a: Attrs) -> None:
        xp, flag = c.xp, ins_[-1]
        new = c.scratch.take(out_.shape, out_.dtype)
        keep, apply = c.scratch.take((), xp.bool_), c.scratch.take((), xp.bool_)
        xp.not_equal(flag, xp.float32(1), out=keep)
        xp.equal(flag, xp.float32(1), out=apply)
        _run(c, kernel, ins_[:-1], new, a)
        xp.copyto(out_, ins_[0], where=keep)  # a no-op where the update runs in place
        xp.copyto(out_, new, where=apply)

    return gated


def _is_half(dtype: Any) -> bool:
    return dtype == np.float16 or dtype == BITS or is_bf16(dtype)  # (bits: bf16, halfbits)


def _np_wide(xp: Any, x: Array) -> Any:
    return xp.float32 if _is_half(x.dtype) else x.dtype


def _f32_copy(c: KernelContext, x: Array) -> Array:
    if not _is_half(x.dtype):
        return x
    wide = c.scratch.take(x.shape, c.xp.float32)
    widen(c.xp, wide, x)
    return wide


# ---- scratch ---------------------------------------------------------------------------


def scratch_need(op: str, ins: Types, out: TensorType, attrs_: Attrs) -> int:
    """The scratch bytes ``op``'s kernel (``kernel_of``) takes on these types, in the order it takes them: a
    gated update's new value and flags; on half tensors, the f32 copies (a sum's total and partial, whole
    inputs, a block of each cut input, the result's block); then what the kernel takes on f32."""
    if attrs_.get("gated"):
        plain = {k: v for k, v in attrs_.items() if k != "gated"}
        return buffers(out.nbytes, 1, 1) + scratch_need(op, ins[:-1], out, plain)
    own = REGISTRY[op].scratch
    if op in MOVES or op in NATIVE or not (is_half(out) or any(map(is_half, ins))):
        return own(ins, out, attrs_)
    cut = staged(op, ins, out, attrs_)
    if cut is None:
        wide_ins, wide_out = tuple(map(_widened, ins)), _widened(out)
        copies = [w.nbytes for t, w in zip(ins, wide_ins) if is_half(t)] + ([wide_out.nbytes] if is_half(out) else [])
        return buffers(*copies) + own(wide_ins, wide_out, attrs_)
    blocks = tuple(TensorType(cut.block_shape(t.shape, ax) if ax is not None else cut.whole(t.shape, out.shape),
                              _widened(t).dtype) for t, ax in zip(ins, cut.axes))
    whole = [b.nbytes for t, b, ax in zip(ins, blocks, cut.axes) if is_half(t) and ax is None]
    cut_copies = [b.nbytes for t, b, ax in zip(ins, blocks, cut.axes) if is_half(t) and ax is not None]
    wide_out = _widened(out)
    if cut.out_axis is None:
        sums = ([wide_out.nbytes] if is_half(out) else []) + ([] if cut.summed else [wide_out.nbytes])
        need = own(blocks, wide_out, attrs_)
        if cut.summed:
            need = max(need, REGISTRY[cut.summed].scratch((wide_out, *blocks), wide_out, attrs_))
        return buffers(*sums, *whole, *cut_copies) + need
    out_block = TensorType(cut.block_shape(out.shape, cut.out_axis), wide_out.dtype)
    result = [out_block.nbytes] if is_half(out) or cut.out_axis != 0 else []
    return buffers(*whole, *cut_copies, *result) + own(blocks, out_block, cut.attrs(attrs_, out, 0))


def run_kernel(xp: Any, op: str, ins: list[Array], attrs_: Attrs, step: int = 1) -> Array:
    """``op`` on ``ins`` into a fresh output, with exactly the scratch the op declares (so a kernel that
    takes more fails here): for tests, profiling and the reference executor."""
    types = tuple(type_of(a) for a in ins)
    out_type = infer(op, types, attrs_)
    out = xp.empty(out_type.shape, dtype=np_dtype(xp, out_type.dtype))
    ctx = KernelContext.standalone(xp, scratch_need(op, types, out_type, attrs_), step)
    kernel_of(op, types, out_type, attrs_)(ctx, ins, out, attrs_)
    return out
