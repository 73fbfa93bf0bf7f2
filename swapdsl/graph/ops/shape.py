"""Ops that move data without arithmetic, and reductions."""

from __future__ import annotations

import math

import numpy as np

from swapdsl.common.errors import SwpError
from swapdsl.graph.ir import DType, TensorType
from swapdsl.graph.ops.registry import (
    Array, Attrs, GradBuilder, KernelContext, OpDef, Types, buffers, floating, no_flops, per_input_element,
    register, same_dtype,
)


def _reshape_infer(ins: Types, a: Attrs) -> TensorType:
    (x,) = ins
    shape = tuple(a["shape"])
    if math.prod(shape) != x.numel:
        raise SwpError(f"cannot reshape {x} ({x.numel} elements) to [{','.join(map(str, shape))}] "
                       f"({math.prod(shape)} elements)")
    return TensorType(shape, x.dtype)


def _reshape_grad(b: GradBuilder, ins: tuple[str, ...], out: str, g: str, a: Attrs) -> tuple[str | None, ...]:
    return (b.emit("reshape", [g], {"shape": b.type(ins[0]).shape}),)


def _permute_infer(ins: Types, a: Attrs) -> TensorType:
    (x,) = ins
    perm = tuple(a["perm"])
    if sorted(perm) != list(range(x.rank)):
        raise SwpError(f"permutation {list(perm)} does not fit {x}", hints=[f"expected an order of 0..{x.rank - 1}"])
    return TensorType(tuple(x.shape[p] for p in perm), x.dtype)


def _permute_grad(b: GradBuilder, ins: tuple[str, ...], out: str, g: str, a: Attrs) -> tuple[str | None, ...]:
    perm = tuple(a["perm"])
    inverse = tuple(perm.index(i) for i in range(len(perm)))
    return (b.emit("permute", [g], {"perm": inverse}),)


def _concat_infer(ins: Types, a: Attrs) -> TensorType:
    axis = a["axis"]
    first = ins[0]
    dtype = same_dtype("concat", *ins)
    for t in ins[1:]:
        if t.rank != first.rank or any(t.shape[i] != first.shape[i] for i in range(t.rank) if i != axis):
            raise SwpError(f"`concat` along axis {axis} needs equal sizes in every other dimension",
                           hints=[f"got {first} and {t}"])
    size = sum(t.shape[axis] for t in ins)
    return TensorType(first.shape[:axis] + (size,) + first.shape[axis + 1 :], dtype)


def _concat(c: KernelContext, ins: list[Array], out: Array, a: Attrs) -> None:
    """Each input copied into its slice of the output: CuPy's ``concatenate`` of more than 8 arrays copies
    a table of their pointers from the host every call, which a CUDA graph cannot capture."""
    axis, start = a["axis"], 0
    for x in ins:
        index = (slice(None),) * axis + (slice(start, start + x.shape[axis]),)
        c.xp.copyto(out[index], x)
        start += x.shape[axis]


def _concat_grad(b: GradBuilder, ins: tuple[str, ...], out: str, g: str, a: Attrs) -> tuple[str | None, ...]:
    axis, start, grads = a["axis"], 0, []
    for name in ins:
        size = b.type(name).shape[axis]
        grads.append(b.emit("slice", [g], {"axis": axis, "start": start, "stop": start + size, "step": 1}))
        start += size
    return tuple(grads)


def _slice_infer(ins: Types, a: Attrs) -> TensorType:
    (x,) = ins
    axis, start, stop, step = a["axis"], a["start"], a["stop"], a["step"]
    n = len(range(start, stop, step))
    if n < 1 or not (0 <= start < x.shape[axis]) or stop > x.shape[axis]:
        raise SwpError(f"slice {start}:{stop}:{step} of dimension {axis} (size {x.shape[axis]}) is empty "
                       "or out of range")
    return TensorType(x.shape[:axis] + (n,) + x.shape[axis + 1 :], x.dtype)


def _index(a: Attrs, rank: int) -> tuple[slice, ...]:
    return (slice(None),) * a["axis"] + (slice(a["start"], a["stop"], a["step"]),) + (slice(None),) * (
        rank - a["axis"] - 1)


def _slice(c: KernelContext, ins: list[Array], out: Array, a: Attrs) -> None:
    (x,) = ins
    c.xp.copyto(out, x[_index(a, x.ndim)])


def _slice_grad(b: GradBuilder, ins: tuple[str, ...], out: str, g: str, a: Attrs) -> tuple[str | None, ...]:
    return (b.emit("slice_grad", [g], {**a, "size": b.type(ins[0]).shape[a["axis"]]}),)


def _slice_grad_infer(ins: Types, a: Attrs) -> TensorType:
    (g,) = ins
    return TensorType(g.shape[: a["axis"]] + (a["size"],) + g.shape[a["axis"] + 1 :], g.dtype)


def _slice_grad_kernel(c: KernelContext, ins: list[Array], out: Array, a: Attrs) -> None:
    (g,) = ins
    out.fill(0)
    c.xp.copyto(out[_index(a, g.ndim)], g)


def _reduce_infer(op: str):  # noqa: ANN202
    def infer(ins: Types, a: Attrs) -> TensorType:
        (x,) = ins
        axes, keep = a["axes"], a["keepdims"]
        if keep:
            shape = tuple(1 if i in axes else d for i, d in enumerate(x.shape))
        else:
            shape = tuple(d for i, d in enumerate(x.shape) if i not in axes)
        return TensorType(shape, floating(op, x) if op == "mean" else x.dtype)

    return infer


def _reduce_grad(op: str):  # noqa: ANN202
    def rule(b: GradBuilder, ins: tuple[str, ...], out: str, g: str, a: Attrs) -> tuple[str | None, ...]:
        shape = b.type(ins[0]).shape
        n = math.prod(shape[i] for i in a["axes"])
        attrs_ = {"shape": shape, "axes": () if a["keepdims"] else tuple(a["axes"]),
                  "scale": 1.0 / n if op == "mean" else 1.0}
        return (b.emit("broadcast_to", [g], attrs_),)

    return rule


def _reduce_kernel(op: str):  # noqa: ANN202
    def kernel(c: KernelContext, ins: list[Array], out: Array, a: Attrs) -> None:
        getattr(c.xp, op)(ins[0], axis=tuple(a["axes"]), keepdims=a["keepdims"], out=out)

    return kernel


def _argmax_infer(ins: Types, a: Attrs) -> TensorType:
    (x,) = ins
    return TensorType(x.shape[: a["axis"]] + x.shape[a["axis"] + 1 :], DType.i32)


def _argmax(c: KernelContext, ins: list[Array], out: Array, a: Attrs) -> None:
    index = c.scratch.take(out.shape, np.int64)  # argmax writes the platform's index type only
    c.xp.argmax(ins[0], axis=a["axis"], out=index)
    c.xp.copyto(out, index, casting="unsafe")


def _moved(ins: Types, out: TensorType, a: Attrs) -> int:
    return out.nbytes


register(
    OpDef("reshape", (1, 1), _reshape_infer, no_flops,
          lambda c, ins, out, a: c.xp.copyto(out, ins[0].reshape(out.shape)), _reshape_grad),
    OpDef("permute", (1, 1), _permute_infer, no_flops,
          lambda c, ins, out, a: c.xp.copyto(out, ins[0].transpose(tuple(a["perm"]))), _permute_grad),
    OpDef("concat", (1, None), _concat_infer, no_flops,
          _concat, _concat_grad),
    OpDef("slice", (1, 1), _slice_infer, no_flops, _slice, _slice_grad, bytes_read=_moved),
    OpDef("slice_grad", (1, 1), _slice_grad_infer, no_flops, _slice_grad_kernel),
    OpDef("sum", (1, 1), _reduce_infer("sum"), per_input_element(1), _reduce_kernel("sum"), _reduce_grad("sum")),
    OpDef("mean", (1, 1), _reduce_infer("mean"), per_input_element(1), _reduce_kernel("mean"), _reduce_grad("mean")),
    OpDef("argmax", (1, 1), _argmax_infer, per_input_element(1), _argmax,
          scratch=lambda ins, out, a: buffers(out.numel * 8)),
)
