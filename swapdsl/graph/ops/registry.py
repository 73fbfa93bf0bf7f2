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

import attrs

from swapdsl.common.errors import SwpError
from swapdsl.graph.ir import DType, TensorType

Types = tuple[TensorType, ...]
Attrs = Mapping[str, Any]
Array = Any  # a numpy.ndarray or a cupy.ndarray


@attrs.frozen
class KernelContext:
    """What a kernel may know besides its inputs."""

    xp: Any  # the array module: numpy or cupy
    step: int = 1  # 1-based training step (Adam's bias correction, fresh dropout masks)


class GradBuilder(Protocol):
    """What a gradient rule uses to append backward ops to the training graph."""

    def type(self, name: str) -> TensorType: ...

    def emit(self, op: str, inputs: Sequence[str], attrs: Mapping[str, Any] | None = None) -> str: ...


Kernel = Callable[[KernelContext, list[Array], Attrs], Array]
# (builder, input names, output name, gradient of the output, attrs) -> gradient of each input or None
GradRule = Callable[[GradBuilder, tuple[str, ...], str, str, Attrs], tuple[str | None, ...]]
Cost = Callable[[Types, TensorType, Attrs], int]


def _read_all(ins: Types, out: TensorType, a: Attrs) -> int:
    return sum(t.nbytes for t in ins)


def _write_out(ins: Types, out: TensorType, a: Attrs) -> int:
    return out.nbytes


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


REGISTRY: dict[str, OpDef] = {}


def register(*defs: OpDef) -> None:
    for d in defs:
        assert d.name not in REGISTRY, f"op {d.name} registered twice"
        REGISTRY[d.name] = d


def infer(op: str, ins: Types, attrs_: Attrs) -> TensorType:
    """The output type of ``op`` on inputs of types ``ins``; raises SwpError."""
    d = REGISTRY[op]
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
    """The array module's dtype for an IR dtype (bf16 computes in f32 on both backends)."""
    label = dtype.label if isinstance(dtype, DType) else dtype
    return {"f64": xp.float64, "f32": xp.float32, "f16": xp.float16, "bf16": xp.float32, "i32": xp.int32, "i64": xp.int64}[label]
