"""The op registry: one table keyed by op name, and what every entry holds.

An entry gives an op's arity, its shape/dtype rule, FLOP count, bytes read
and written, its kernel (written once against an array module ``xp``, NumPy or
CuPy) and, for differentiable ops, its gradient rule expressed as IR ops.
Shape rules see canonical attributes (axes non-negative, spatial arguments
pairs) and raise SwpError without a position; the caller places it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import functools
import math

import attrs
import ml_dtypes
import numpy as np

from swapdsl.common.errors import SwpError
from swapdsl.common.units import arena_bytes
from swapdsl.graph.ir import DType, TensorType

Types = tuple[TensorType, ...]
Attrs = Mapping[str, Any]
Array = Any  # a numpy.ndarray or a cupy.ndarray


# A kernel that tiles its temporaries keeps a tile's worth of them near half its op's largest tensor, within
# these bounds: the scratch then grows with the model, and a small model's plan does not pay for a large tile.
SCRATCH_CHUNK_BYTES = 16 * 2**20
MIN_CHUNK_BYTES = 64 * 2**10


class ScratchOverflow(AssertionError):
    """A kernel took more scratch than its op declares: a bug in the op's ``scratch`` rule."""


class Scratch:
    """A kernel's temporaries, bump-allocated from one flat byte buffer (a region of the device arena)
    and given back all at once before the next kernel. A kernel takes at most what its op declares."""

    def __init__(self, buffer: Array) -> None:
        self.buffer = buffer
        self.used = 0
        self.floor = 0  # what ``reset`` keeps: a half-precision wrapper's f32 copies (see ``kernel_of``)

    def take(self, shape: tuple[int, ...], dtype: Any) -> Array:
        """An uninitialised array of ``shape`` and ``dtype`` in the scratch region."""
        size = math.prod(shape) * dtype_itemsize(dtype)
        start, end = self.used, self.used + arena_bytes(size)
        if end > self.buffer.size:
            raise ScratchOverflow(f"a kernel took {end} bytes of scratch; it has {self.buffer.size}")
        self.used = end
        return self.buffer[start:start + size].view(dtype).reshape(shape)

    def reset(self) -> None:
        self.used = self.floor


def dtype_itemsize(dtype: Any) -> int:
    return np.dtype(dtype).itemsize


@attrs.frozen
class KernelContext:
    """What a kernel may know besides its inputs and output: the array module, where its temporaries go,
    and the training step as a device scalar (so a step's work can be replayed without the host)."""

    xp: Any  # the array module: numpy or cupy
    scratch: Scratch
    step: Array  # 0-d int64 on the device: the 1-based training step (Adam's bias correction, dropout masks)
    tf32: bool = False  # FP32 matrix products may use TF32 tensor cores (CuPy; an opt-in: `exec --tf32`)

    @staticmethod
    def standalone(xp: Any, scratch_bytes: int, step: int = 1) -> KernelContext:
        """A context with its own scratch and step counter (tests, the reference executor, profiling)."""
        counter = xp.zeros((), dtype=xp.int64)
        counter[...] = step
        return KernelContext(xp, Scratch(xp.zeros(max(scratch_bytes, 1), dtype=xp.uint8)), counter)


class GradBuilder(Protocol):
    """What a gradient rule uses to append backward ops to the training graph."""

    def type(self, name: str) -> TensorType: ...

    def emit(self, op: str, inputs: Sequence[str], attrs: Mapping[str, Any] | None = None) -> str: ...


# (context, inputs, output, attrs): writes the result into ``output`` (a view into the arena); every temporary
# comes from ``context.scratch``. An in-place op's output may be its first input.
Kernel = Callable[[KernelContext, list[Array], Array, Attrs], None]
# (builder, input names, output name, gradient of the output, attrs) -> gradient of each input or None
GradRule = Callable[[GradBuilder, tuple[str, ...], str, str, Attrs], tuple[str | None, ...]]
Cost = Callable[[Types, TensorType, Attrs], int]


def _read_all(ins: Types, out: TensorType, a: Attrs) -> int:
    return sum(t.nbytes for t in ins)


def _write_out(ins: Types, out: TensorType, a: Attrs) -> int:
    return out.nbytes


def no_scratch(ins: Types, out: TensorType, a: Attrs) -> int:
    return 0


@attrs.frozen
class OpDef:
    name: str
    arity: tuple[int, int | None]  # (min, max); max None = any number
    infer: Callable[[Types, Attrs], TensorType]
    flops: Cost
    kernel: Kernel
    grad: GradRule | None = None  # None: no gradient flows through (backward and update ops)
    in_place: bool = False  # the kernel may write its output over its first input (updates, accumulation)
    accumulate: str | None = None  # the op computing (first input) + this op's result, for gradient sums
    bytes_read: Cost = _read_all
    bytes_written: Cost = _write_out
    scratch: Cost = no_scratch  # the bytes of temporaries the kernel takes (``buffers`` of what it takes, in order)


REGISTRY: dict[str, OpDef] = {}


def register(*defs: OpDef) -> None:
    for d in defs:
        assert d.name not in REGISTRY, f"op {d.name} registered twice"
        REGISTRY[d.name] = d


def infer(op: str, ins: Types, attrs_: Attrs) -> TensorType:
    """The output type of ``op`` on inputs of types ``ins``; raises SwpError. A ``gated`` op (an update of a
    guarded step) reads one more input, last: the f32 flag ``all_finite`` makes."""
    d = REGISTRY[op]
    if attrs_.get("gated"):
        if not d.in_place or not ins or ins[-1] != TensorType((), DType.f32):
            raise SwpError(f"`{op}` cannot be gated: only updates are, by an f32 flag read last")
        ins = ins[:-1]
    lo, hi = d.arity
    if len(ins) < lo or (hi is not None and len(ins) > hi):
        raise SwpError(f"`{op}` takes {lo if lo == hi else f'{lo} or more'} tensor inputs, got {len(ins)}")
    return d.infer(ins, attrs_)


# ---- helpers shared by the rule modules --------------------------------------


def floating(op: str, *ts: TensorType) -> DType:
    """All of ``ts`` share one floating dtype; return it."""
    for t in ts:
        if not t.dtype.is_float:
            raise SwpError(f"`{op}` needs floating-point tensors, got {t}", hints=["use cast(x, f32)"])
    return same_dtype(op, *ts)


def same_dtype(op: str, *ts: TensorType) -> DType:
    dtypes = {t.dtype for t in ts}
    if len(dtypes) > 1:
        shown = ", ".join(str(t) for t in ts)
        raise SwpError(f"dtype mismatch in `{op}`: {' vs '.join(sorted(d.label for d in dtypes))}",
                       hints=[f"operands are {shown}", "convert one side with cast(x, DTYPE)"])
    return ts[0].dtype


def broadcast_shapes(op: str, a: TensorType, b: TensorType) -> tuple[int, ...]:
    """NumPy broadcasting of two shapes."""
    out = []
    for i in range(1, max(a.rank, b.rank) + 1):
        da = a.shape[-i] if i <= a.rank else 1
        db = b.shape[-i] if i <= b.rank else 1
        if da != db and 1 not in (da, db):
            raise SwpError(f"shapes do not broadcast in `{op}`: {da} vs {db} in dimension -{i}",
                           hints=[f"left is {a}, right is {b}"])
        out.append(max(da, db) if 1 not in (da, db) else da * db)
    return tuple(reversed(out))


def per_element(n: int) -> Cost:
    return lambda ins, out, a: n * out.numel


def per_input_element(n: int) -> Cost:
    return lambda ins, out, a: n * ins[0].numel


def no_flops(ins: Types, out: TensorType, a: Attrs) -> int:
    return 0


def same_as(index: int, *, float_only: bool = True, op: str = "") -> Callable[[Types, Attrs], TensorType]:
    """Shape rule: the output is shaped and typed like input ``index`` (all float inputs alike)."""

    def rule(ins: Types, a: Attrs) -> TensorType:
        dtype = floating(op, *ins) if float_only else ins[index].dtype
        return TensorType(ins[index].shape, dtype)

    return rule


def np_dtype(xp: Any, dtype: DType | str) -> Any:
    """The array module's dtype for an IR dtype (bf16: ml_dtypes' bfloat16 on NumPy; CuPy has none, see
    ``interpreter.check_runnable``)."""
    label = dtype.label if isinstance(dtype, DType) else dtype
    if label == "bf16":
        return ml_dtypes.bfloat16
    return {"f64": xp.float64, "f32": xp.float32, "f16": xp.float16, "i32": xp.int32, "i64": xp.int64}[label]


# ---- half precision: every kernel computes as a GPU's would ---------------------------
#
# A kernel is written once, for f32 and f64. On f16 or bf16 tensors it runs on f32 copies of its half
# inputs, into an f32 result rounded once to the half output: products and sums accumulate in f32, as
# tensor-core GEMMs, cuDNN and element-wise kernels computing in f32 registers do. The copies are
# scratch, declared by ``scratch_need``.

HALF = (DType.f16, DType.bf16)


def is_half(t: TensorType) -> bool:
    return t.dtype in HALF


def _widened(t: TensorType) -> TensorType:
    return TensorType(t.shape, DType.f32) if is_half(t) else t


def _broadcast_axes(ins: Types, out: TensorType) -> int:
    """The leading axes of ``out`` that every input either has in full or is broadcast over."""
    axes = len(out.shape)
    for t in ins:
        if t.shape != out.shape:
            padded = (1,) * (len(out.shape) - len(t.shape)) + t.shape
            axes = min(axes, next((i for i, d in enumerate(padded) if d != 1), len(padded)))
    return axes


def _last_axis_axes(ins: Types, out: TensorType, a: Attrs) -> int:
    """Softmax and its kin over the last axis: every row is its own."""
    last = a.get("axis", -1) % max(len(out.shape), 1) == len(out.shape) - 1
    return min(_broadcast_axes(ins, out), len(out.shape) - 1) if last else 0


def _summed_rows(ins: Types, out: TensorType, a: Attrs) -> int:
    """A product summed over every leading axis of its operands (a weight gradient): its rows are summed
    block by block (the op on the first block, its ``accumulate`` op adding each other)."""
    x, g = ins
    return len(x.shape) - 1 if x.shape[:-1] == g.shape[:-1] else 0


def _matrix_rows(ins: Types, out: TensorType, a: Attrs) -> int:
    """A product with a matrix (a weight): every row of the first operand gives a row of the result."""
    x, w = ins
    return len(out.shape) - 1 if len(w.shape) == 2 and x.shape[:-1] == out.shape[:-1] else 0


# How many leading axes of an op's output ``kernel_of`` may split into blocks of rows on half tensors
# (0: none): element-wise ops (each output element reads the same element of each input shaped like the
# output; others are broadcast), softmax over the last axis, products with a matrix.
_ELEMENTWISE = ("add", "sub", "mul", "div", "add_scalar", "mul_scalar", "pow_scalar", "neg", "relu", "gelu", "tanh",
                "sigmoid", "exp", "log", "sqrt", "cast", "relu_grad", "gelu_grad", "tanh_grad", "sigmoid_grad",
                "pow_scalar_grad")
ROW_RULES: dict[str, Callable[[Types, TensorType, Attrs], int]] = {
    **{op: (lambda ins, out, a: _broadcast_axes(ins, out)) for op in _ELEMENTWISE},
    **{op: _last_axis_axes for op in ("softmax", "log_softmax", "softmax_grad", "log_softmax_grad")},
    "matmul": _matrix_rows, "matmul_nt": _matrix_rows, "matmul_tn_fold": _summed_rows,
}


@attrs.frozen
class Rows:
    """How an op on half tensors is staged: its output seen as ``rows`` rows over its leading ``axes`` axes,
    ``block`` rows at a time. An input whose leading axes are the output's is split the same way; any
    other is broadcast over them (reshaped without them: ``inner``) or, for a product, whole."""

    axes: int
    rows: int
    block: int
    split: tuple[bool, ...]  # per input
    product: bool = False
    summed: str | None = None  # the op that adds a block's result into the sum so far (the output is not split)

    def inner(self, t: Any, out: Any) -> tuple[int, ...]:
        if self.product:
            return tuple(t.shape)
        return ((1,) * (len(out.shape) - len(t.shape)) + tuple(t.shape))[self.axes:]

    def attrs(self, a: Attrs, out: Any) -> Attrs:
        """The op's attributes for a block, whose leading axes are one: an ``axis`` (the last) renumbered."""
        return {**a, "axis": len(out.shape) - self.axes} if "axis" in a else a


def staged_rows(op: str, ins: Types, out: TensorType, attrs_: Attrs | None = None) -> Rows | None:
    """How ``kernel_of`` stages ``op`` on these types a block of rows at a time; None: it copies whole
    tensors (no rule for the op, no half tensor, no leading axis to split, or one block would do)."""
    rule = ROW_RULES.get(op)
    if rule is None or not (is_half(out) or any(map(is_half, ins))):
        return None
    axes = rule(ins, out, attrs_ or {})
    summed = REGISTRY[op].accumulate if rule is _summed_rows else None
    rows = math.prod((ins[0] if summed else out).shape[:axes])
    if axes == 0 or rows < 2:
        return None
    product = op.startswith("matmul")
    split = tuple(summed is not None or ((i == 0 or not product) and len(t.shape) == len(out.shape)
                                         and t.shape[:axes] == out.shape[:axes]) for i, t in enumerate(ins))
    r = Rows(axes, rows, 1, split, product, summed)
    per_row = sum(4 * t.numel // rows for t, s in zip(ins, split) if is_half(t) and s)
    per_row += 4 * out.numel // rows if is_half(out) and summed is None else 0
    block = chunk_len(rows, per_row, max(t.nbytes for t in (*ins, out)))
    return attrs.evolve(r, block=block) if block < rows else None


def kernel_of(op: str, ins: Types, out: TensorType, attrs_: Attrs | None = None) -> Kernel:
    """``op``'s kernel for tensors of these types: its own, or, where any is half, its own on f32 copies
    (of a block of rows at a time, for an element-wise op); for a ``gated`` update, one that keeps the old
    value (its first input) unless the flag is 1."""
    if attrs_ and attrs_.get("gated"):
        return _gated(kernel_of(op, ins[:-1], out))
    kernel = REGISTRY[op].kernel
    if not (is_half(out) or any(map(is_half, ins))):
        return kernel
    rows = staged_rows(op, ins, out, attrs_)
    if rows is not None:
        return _by_rows(kernel, rows, is_half(out))

    def in_f32(c: KernelContext, ins_: list[Array], out_: Array, a: Attrs) -> None:
        wide = [_f32_copy(c, x) for x in ins_]
        result = c.scratch.take(out_.shape, c.xp.float32) if is_half(out) else out_
        below, c.scratch.floor = c.scratch.floor, c.scratch.used  # a kernel that resets its scratch keeps these
        try:
            kernel(c, wide, result, a)
        finally:
            c.scratch.floor = below
        if result is not out_:
            c.xp.copyto(out_, result, casting="unsafe")

    return in_f32


def _by_rows(kernel: Kernel, r: Rows, half_out: bool) -> Kernel:
    """``kernel`` on f32 copies of a block of rows of each split input at a time (others copied once), each
    block's result rounded into the output: the same numbers as whole copies give (a summed product:
    within f32 of them, its blocks summed in f32 and rounded once)."""
    if r.summed is not None:
        return _summed_by_rows(kernel, REGISTRY[r.summed].kernel, r, half_out)

    def by_rows(c: KernelContext, ins_: list[Array], out_: Array, a: Attrs) -> None:
        xp = c.xp
        dest = out_.reshape(r.rows, *out_.shape[r.axes:])
        src = [x.reshape(r.rows, *x.shape[r.axes:]) if s else _f32_copy(c, x.reshape(r.inner(x, out_)))
               for x, s in zip(ins_, r.split)]
        below, base = c.scratch.floor, c.scratch.used
        a = r.attrs(a, out_)
        try:
            for i in range(0, r.rows, r.block):
                c.scratch.used = base
                part = slice(i, min(i + r.block, r.rows))
                wide = [_f32_copy(c, x[part]) if s else x for x, s in zip(src, r.split)]
                result = c.scratch.take(dest[part].shape, xp.float32) if half_out else dest[part]
                c.scratch.floor = c.scratch.used  # a kernel that resets its scratch keeps these
                kernel(c, wide, result, a)
                c.scratch.floor = below
                if half_out:
                    xp.copyto(dest[part], result, casting="unsafe")
        finally:
            c.scratch.floor = below

    return by_rows


def _summed_by_rows(kernel: Kernel, add_into: Kernel, r: Rows, half_out: bool) -> Kernel:
    def summed(c: KernelContext, ins_: list[Array], out_: Array, a: Attrs) -> None:
        xp = c.xp
        total = c.scratch.take(out_.shape, xp.float32) if half_out else out_
        src = [x.reshape(r.rows, *x.shape[r.axes:]) for x in ins_]
        below, base = c.scratch.floor, c.scratch.used
        try:
            for i in range(0, r.rows, r.block):
                c.scratch.used = base
                wide = [_f32_copy(c, x[i:i + r.block]) for x in src]
                c.scratch.floor = c.scratch.used
                if i == 0:
                    kernel(c, wide, total, a)
                else:
                    add_into(c, [total, *wide], total, a)
                c.scratch.floor = below
        finally:
            c.scratch.floor = below
        if half_out:
            xp.copyto(out_, total, casting="unsafe")

    return summed


def _gated(kernel: Kernel) -> Kernel:
    def gated(c: KernelContext, ins_: list[Array], out_: Array, a: Attrs) -> None:
        xp, flag = c.xp, ins_[-1]
        new = c.scratch.take(out_.shape, out_.dtype)
        keep, apply = c.scratch.take((), xp.bool_), c.scratch.take((), xp.bool_)
        xp.not_equal(flag, xp.float32(1), out=keep)
        xp.equal(flag, xp.float32(1), out=apply)
        below, c.scratch.floor = c.scratch.floor, c.scratch.used
        try:
            kernel(c, ins_[:-1], new, a)
        finally:
            c.scratch.floor = below
        xp.copyto(out_, ins_[0], where=keep)  # a no-op where the update runs in place
        xp.copyto(out_, new, where=apply)

    return gated


_HALF_ARRAYS = frozenset({np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16)})


def _f32_copy(c: KernelContext, x: Array) -> Array:
    if x.dtype not in _HALF_ARRAYS:
        return x
    wide = c.scratch.take(x.shape, c.xp.float32)
    c.xp.copyto(wide, x, casting="unsafe")
    return wide


# ---- scratch: what kernels declare and take ----------------------------------------


def buffers(*nbytes: int) -> int:
    """The scratch that temporaries of these sizes take, each aligned as ``Scratch.take`` aligns it."""
    return sum(arena_bytes(n) for n in nbytes)


def iota(xp: Any, out: Array, start: int = 0) -> Array:
    """out[i] = start + i for a 1-d integer ``out``, allocating nothing (a scan would, on CuPy)."""
    if xp is not np:
        _iota_kernel(xp)(out.dtype.type(start), out)
        return out
    out.fill(1)
    np.cumsum(out, dtype=out.dtype, out=out)
    np.subtract(out, 1, out=out)
    if start:
        np.add(out, out.dtype.type(start), out=out)
    return out


@functools.cache
def _iota_kernel(xp: Any) -> Any:
    return xp.ElementwiseKernel("T start", "T out", "out = start + (T)i", "swapdsl_iota")


def op_bytes(ins: Sequence[Any], out: Any) -> int:
    """The largest of an op's tensors (arrays or TensorTypes): what its tiles are sized against."""
    return max(t.nbytes for t in (*ins, out))


def chunk_len(total: int, item_bytes: int, largest: int) -> int:
    """How many of ``total`` items a tiled kernel processes at once: as many as keep a temporary of
    ``item_bytes`` per item near half the op's ``largest`` tensor (see SCRATCH_CHUNK_BYTES), at least one."""
    budget = min(SCRATCH_CHUNK_BYTES, max(MIN_CHUNK_BYTES, largest // 2))
    return max(1, min(total, budget // max(item_bytes, 1)))


def chunks(total: int, item_bytes: int, largest: int) -> list[slice]:
    step = chunk_len(total, item_bytes, largest)
    return [slice(i, min(i + step, total)) for i in range(0, total, step)]


def scratch_need(op: str, ins: Types, out: TensorType, attrs_: Attrs) -> int:
    """The scratch bytes ``op``'s kernel (``kernel_of``) takes on these types: a gated update's new value and
    flags first; on half tensors, the f32 copies (inputs in order, then the result); then what the kernel
    takes on f32."""
    if attrs_.get("gated"):
        plain = {k: v for k, v in attrs_.items() if k != "gated"}
        return buffers(out.nbytes, 1, 1) + scratch_need(op, ins[:-1], out, plain)
    r = staged_rows(op, ins, out, attrs_)
    if r is not None and r.summed is not None:  # the f32 sum, then a block of each input
        wide_out = _widened(out)
        block = tuple(TensorType((r.block, *t.shape[r.axes:]), DType.f32) for t in ins)
        return (buffers(*([wide_out.nbytes] if is_half(out) else []), *(b.nbytes for t, b in zip(ins, block) if is_half(t)))
                + max(REGISTRY[op].scratch(block, wide_out, attrs_),
                      REGISTRY[r.summed].scratch((wide_out, *block), wide_out, attrs_)))
    if r is not None:  # inputs not split copied whole, then a block of each split input and of the result
        block = [TensorType((r.block, *t.shape[r.axes:]), _widened(t).dtype) if s
                 else TensorType(r.inner(t, out), _widened(t).dtype) for t, s in zip(ins, r.split)]
        wide_out = TensorType((r.block, *out.shape[r.axes:]), DType.f32 if is_half(out) else out.dtype)
        copies = [b.nbytes for t, b, s in zip(ins, block, r.split) if is_half(t) and not s]
        copies += [b.nbytes for t, b, s in zip(ins, block, r.split) if is_half(t) and s]
        copies += [wide_out.nbytes] if is_half(out) else []
        return buffers(*copies) + REGISTRY[op].scratch(tuple(block), wide_out, r.attrs(attrs_, out))
    wide_ins, wide_out = tuple(map(_widened, ins)), _widened(out)
    copies = [w.nbytes for t, w in zip(ins, wide_ins) if is_half(t)] + ([wide_out.nbytes] if is_half(out) else [])
    return buffers(*copies) + REGISTRY[op].scratch(wide_ins, wide_out, attrs_)


def type_of(array: Array) -> TensorType:
    """The IR type of an array."""
    return TensorType(tuple(array.shape), DType[_LABELS[str(array.dtype)]])


_LABELS = {"float64": "f64", "float32": "f32", "float16": "f16", "bfloat16": "bf16", "int32": "i32", "int64": "i64"}


def run_kernel(xp: Any, op: str, ins: list[Array], attrs_: Attrs, step: int = 1) -> Array:
    """``op`` on ``ins`` into a fresh output, with exactly the scratch the op declares (so a kernel that
    takes more fails here): for tests, profiling and the reference executor."""
    types = tuple(type_of(a) for a in ins)
    out_type = infer(op, types, attrs_)
    out = xp.empty(out_type.shape, dtype=np_dtype(xp, out_type.dtype))
    ctx = KernelContext.standalone(xp, scratch_need(op, types, out_type, attrs_), step)
    kernel_of(op, types, out_type, attrs_)(ctx, ins, out, attrs_)
    return out
