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
import numpy as np

from swapdsl.common.errors import SwpError
from swapdsl.common.units import arena_bytes
from swapdsl.graph.ir import DType, TensorType
from swapdsl.graph.ops.halfbits import BITS, bfloat16, keeps_bits

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
    comm: Any = None  # the data-parallel ranks' MPI communicator (ops/collective.py), or None: one process
    workspace: Array | None = None  # cuBLAS's workspace on the device (beside the arena), or None: its own pool

    @staticmethod
    def standalone(xp: Any, scratch_bytes: int, step: int = 1, comm: Any = None) -> KernelContext:
        """A context with its own scratch and step counter (tests, the reference executor, profiling)."""
        counter = xp.zeros((), dtype=xp.int64)
        counter[...] = step
        return KernelContext(xp, Scratch(xp.zeros(max(scratch_bytes, 1), dtype=xp.uint8)), counter, comm=comm)


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
    # half tensors as they are, where the array module can (cuBLAS's half products, accumulated in f32): False
    # where it cannot, and ``kernels.kernel_of``'s f32 staging runs instead
    on_half: Callable[[KernelContext, list[Array], Array, Attrs], bool] | None = None


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
    axis = attrs_.get("axis")
    if isinstance(axis, int) and ins and not 0 <= axis < ins[0].rank:  # kernels read a negative axis as none
        raise SwpError(f"`{op}`'s axis {axis} is not an axis of {ins[0]} (the graph takes 0 to rank - 1)")
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
    """The array module's dtype for an IR dtype (bf16: ml_dtypes' bfloat16 on NumPy; elsewhere its bits,
    ``halfbits``)."""
    label = dtype.label if isinstance(dtype, DType) else dtype
    if label == "bf16":
        return BITS.type if keeps_bits(xp) else bfloat16().type
    return {"f64": xp.float64, "f32": xp.float32, "f16": xp.float16, "i32": xp.int32, "i64": xp.int64}[label]


# ---- scratch: what kernels declare and take ----------------------------------------


def buffers(*nbytes: int) -> int:
    """The scratch that temporaries of these sizes take, each aligned as ``Scratch.take`` aligns it."""
    return sum(arena_bytes(n) for n in nbytes)


def on_cuda(xp: Any) -> bool:
    """Whether ``xp`` runs on a GPU (CuPy): its kernels may take CUDA's own paths."""
    return hasattr(xp, "cuda")


def iota(xp: Any, out: Array, start: int = 0) -> Array:
    """out[i] = start + i for a 1-d integer ``out``, allocating nothing (a scan would, on CuPy)."""
    if on_cuda(xp):
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


def parts(x: Array, out: Array, index: Any) -> tuple[Array, Array]:
    """``x[index]`` and ``out[index]``, one object when ``x`` is ``out`` (an op in place): CuPy copies an
    input that overlaps the output unless the two are one object, allocating inside the step."""
    o = out[index]
    return (o if x is out else x[index]), o


def type_of(array: Array) -> TensorType:
    """The IR type of an array."""
    return TensorType(tuple(array.shape), DType[_LABELS[str(array.dtype)]])


_LABELS = {"float64": "f64", "float32": "f32", "float16": "f16", "bfloat16": "bf16", "int32": "i32", "int64": "i64"}
