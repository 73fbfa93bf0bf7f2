"""Matrix products: matmul and the transposed forms its gradient needs."""

from __future__ import annotations

from swapdsl.common.errors import SwpError
from swapdsl.graph.ir import TensorType
from swapdsl.graph.ops.elementwise import unbroadcast
from swapdsl.graph.ops.blas import half_gemm, matmul_into
from swapdsl.graph.ops.registry import (
    Array, Attrs, GradBuilder, KernelContext, OpDef, Types, broadcast_shapes, buffers, chunk_len, chunks, floating,
    parts, register,
)


def _matrices(op: str, x: TensorType, y: TensorType) -> None:
    if x.rank < 2 or y.rank < 2:
        raise SwpError(f"`{op}` needs operands of rank 2 or more", hints=[f"left is {x}, right is {y}",
                                                                          "reshape a vector to [1, n] or [n, 1]"])


def _batched(op: str, x: TensorType, y: TensorType, m: int, n: int, inner: tuple[int, int]) -> TensorType:
    dtype = floating(op, x, y)
    if inner[0] != inner[1]:
        raise SwpError(f"{op} inner dimensions differ: {inner[0]} vs {inner[1]}", hints=[f"left is {x}, right is {y}"])
    batch = broadcast_shapes(op, TensorType(x.shape[:-2], dtype), TensorType(y.shape[:-2], dtype))
    return TensorType(batch + (m, n), dtype)


def _matmul_infer(ins: Types, a: Attrs) -> TensorType:
    x, y = ins  # [..., m, k] @ [..., k, n]
    _matrices("matmul", x, y)
    return _batched("matmul", x, y, x.shape[-2], y.shape[-1], (x.shape[-1], y.shape[-2]))


def _nt_infer(ins: Types, a: Attrs) -> TensorType:
    g, y = ins  # [..., m, n] @ [..., k, n]^T
    _matrices("matmul_nt", g, y)
    return _batched("matmul_nt", g, y, g.shape[-2], y.shape[-2], (g.shape[-1], y.shape[-1]))


def _tn_infer(ins: Types, a: Attrs) -> TensorType:
    x, g = ins  # [..., m, k]^T @ [..., m, n]
    _matrices("matmul_tn", x, g)
    return _batched("matmul_tn", x, g, x.shape[-1], g.shape[-1], (x.shape[-2], g.shape[-2]))


def _tn_fold_infer(ins: Types, a: Attrs) -> TensorType:
    x, g = ins  # contract every leading dimension: [..., k], [..., n] -> [k, n]
    if x.rank < 1 or g.rank < 1 or x.shape[:-1] != g.shape[:-1]:
        raise SwpError(f"matmul_tn_fold needs equal leading dimensions, got {x} and {g}")
    return TensorType((x.shape[-1], g.shape[-1]), floating("matmul_tn_fold", x, g))


def _tn_fold_acc_infer(ins: Types, a: Attrs) -> TensorType:
    acc, x, g = ins  # acc + matmul_tn_fold(x, g)
    out = _tn_fold_infer((x, g), a)
    if acc != out:
        raise SwpError(f"matmul_tn_fold_acc adds {out} into {acc}: they must be the same type")
    return out


def _swap(xp: object, t: Array) -> Array:
    return t.swapaxes(-1, -2)


def _matmul_grad(b: GradBuilder, ins: tuple[str, ...], out: str, g: str, a: Attrs) -> tuple[str | None, ...]:
    x, y = ins
    dx = unbroadcast(b, b.emit("matmul_nt", [g, y]), b.type(x).shape)
    if b.type(y).rank == 2:
        dy = b.emit("matmul_tn_fold", [x, g])  # a dense layer: no batched temporary for the weight gradient
    else:
        dy = unbroadcast(b, b.emit("matmul_tn", [x, g]), b.type(y).shape)
    return dx, dy


def _matmul_nt_grad(b: GradBuilder, ins: tuple[str, ...], out: str, g: str, a: Attrs) -> tuple[str | None, ...]:
    """y = x @ w^T (w shared, e.g. a tied embedding table): dx = g @ w, dw = g^T @ x."""
    x, w = ins
    dx = unbroadcast(b, b.emit("matmul", [g, w]), b.type(x).shape)
    if b.type(w).rank == 2:
        dw = b.emit("matmul_tn_fold", [g, x])
    else:
        dw = unbroadcast(b, b.emit("matmul_tn", [g, x]), b.type(w).shape)
    return dx, dw


def _mm_flops(form: str):  # noqa: ANN202
    def flops(ins: Types, out: TensorType, a: Attrs) -> int:
        x = ins[0]
        k = {"nn": x.shape[-1], "nt": x.shape[-1], "tn": x.shape[-2], "fold": x.numel // x.shape[-1]}[form]
        return 2 * out.numel * k

    return flops


def _fold(c: KernelContext, ins: list[Array], out: Array, a: Attrs) -> None:
    x, g = ins
    matmul_into(c, x.reshape(-1, x.shape[-1]).T, g.reshape(-1, g.shape[-1]), out)


def _fold_acc(c: KernelContext, ins: list[Array], out: Array, a: Attrs) -> None:
    """acc + x^T g, a block of output columns at a time (out may be acc itself)."""
    acc, x, g = ins
    x2, g2 = x.reshape(-1, x.shape[-1]), g.reshape(-1, g.shape[-1])
    for k in chunks(out.shape[1], out.shape[0] * out.dtype.itemsize, out.nbytes):
        product = c.scratch.take((out.shape[0], k.stop - k.start), out.dtype)
        matmul_into(c, x2.T, g2[:, k], product)
        acc_k, out_k = parts(acc, out, (slice(None), k))
        c.xp.add(acc_k, product, out=out_k)
        c.scratch.reset()


def _fold_acc_scratch(ins: Types, out: TensorType, a: Attrs) -> int:
    column = out.shape[0] * out.dtype.itemsize
    return buffers(chunk_len(out.shape[1], column, out.nbytes) * column)


def _fold_acc_flops(ins: Types, out: TensorType, a: Attrs) -> int:
    return _mm_flops("fold")(ins[1:], out, a) + out.numel


register(
    OpDef("matmul", (2, 2), _matmul_infer, _mm_flops("nn"),
          lambda c, ins, out, a: matmul_into(c, *ins, out),
          _matmul_grad, on_half=lambda c, ins, out, a: half_gemm(c, *ins, out)),
    OpDef("matmul_nt", (2, 2), _nt_infer, _mm_flops("nt"),
          lambda c, ins, out, a: matmul_into(c, ins[0], _swap(c.xp, ins[1]), out), _matmul_nt_grad,
          on_half=lambda c, ins, out, a: half_gemm(c, ins[0], _swap(c.xp, ins[1]), out)),
    OpDef("matmul_tn", (2, 2), _tn_infer, _mm_flops("tn"),
          lambda c, ins, out, a: matmul_into(c, _swap(c.xp, ins[0]), ins[1], out),
          on_half=lambda c, ins, out, a: half_gemm(c, _swap(c.xp, ins[0]), ins[1], out)),
    OpDef("matmul_tn_fold", (2, 2), _tn_fold_infer, _mm_flops("fold"), _fold, accumulate="matmul_tn_fold_acc",
          on_half=lambda c, ins, out, a: half_gemm(c, ins[0].reshape(-1, ins[0].shape[-1]).T,
                                                   ins[1].reshape(-1, ins[1].shape[-1]), out)),
    # a weight gradient summed over uses (an RNN's time steps) as it is made
    OpDef("matmul_tn_fold_acc", (3, 3), _tn_fold_acc_infer, _fold_acc_flops, _fold_acc, in_place=True,
          scratch=_fold_acc_scratch,
          on_half=lambda c, ins, out, a: half_gemm(c, ins[1].reshape(-1, ins[1].shape[-1]).T,
                                                   ins[2].reshape(-1, ins[2].shape[-1]), out, acc=ins[0])),
)
