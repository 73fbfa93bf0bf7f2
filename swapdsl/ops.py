"""The op registry: one table keyed by op name.

Each entry gives an op's arity, its shape/dtype rule, its FLOP count and the
bytes it reads and writes. Shape rules see canonical attributes (axes already
non-negative, spatial arguments already pairs) and raise SwpError without a
position; the elaborator places the error at the call.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import attrs

from swapdsl.errors import SwpError
from swapdsl.ir import DType, TensorType

Types = tuple[TensorType, ...]
Attrs = Mapping[str, Any]


@attrs.frozen
class OpDef:
    name: str
    arity: tuple[int, int | None]  # (min, max); max None = any number
    infer: Callable[[Types, Attrs], TensorType]
    flops: Callable[[Types, TensorType, Attrs], int]
    bytes_read: Callable[[Types, TensorType, Attrs], int] = attrs.field(
        default=lambda ins, out, a: sum(t.nbytes for t in ins)
    )
    bytes_written: Callable[[Types, TensorType, Attrs], int] = attrs.field(
        default=lambda ins, out, a: out.nbytes
    )


# ---- helpers shared by the rules ---------------------------------------------


def _float(op: str, *ts: TensorType) -> DType:
    """All of ``ts`` share one floating dtype; return it."""
    for t in ts:
        if not t.dtype.is_float:
            raise SwpError(f"`{op}` needs floating-point tensors, got {t}", hints=["use cast(x, f32)"])
    return _same_dtype(op, *ts)


def _same_dtype(op: str, *ts: TensorType) -> DType:
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


def _ew_flops(per_element: int) -> Callable[[Types, TensorType, Attrs], int]:
    return lambda ins, out, a: per_element * out.numel


def _zero(ins: Types, out: TensorType, a: Attrs) -> int:
    return 0


def _conv_out(size: int, k: int, s: int, p: int, d: int) -> int:
    return (size + 2 * p - d * (k - 1) - 1) // s + 1


def _positive_out(op: str, shape: tuple[int, ...], x: TensorType) -> tuple[int, ...]:
    if min(shape) < 1:
        raise SwpError(f"`{op}` output would be empty: input {x} gives spatial size {shape[-2:]}",
                       hints=["the kernel (with dilation) is larger than the padded input"])
    return shape


# ---- rules -------------------------------------------------------------------


def _binary(op: str) -> OpDef:
    def infer(ins: Types, a: Attrs) -> TensorType:
        return TensorType(broadcast_shapes(op, *ins), _same_dtype(op, *ins))

    return OpDef(op, (2, 2), infer, _ew_flops(1))


def _unary(op: str, flops_per: int = 1, *, floating: bool = True) -> OpDef:
    def infer(ins: Types, a: Attrs) -> TensorType:
        (x,) = ins
        return TensorType(x.shape, _float(op, x) if floating else x.dtype)

    return OpDef(op, (1, 1), infer, _ew_flops(flops_per))


def _matmul(ins: Types, a: Attrs) -> TensorType:
    x, w = ins
    dtype = _float("matmul", x, w)
    if x.rank < 2 or w.rank < 2:
        raise SwpError("`matmul` needs operands of rank 2 or more", hints=[f"left is {x}, right is {w}"])
    if x.shape[-1] != w.shape[-2]:
        raise SwpError(f"matmul inner dimensions differ: {x.shape[-1]} vs {w.shape[-2]}",
                       hints=[f"left is {x}, right is {w}"])
    bx, bw = TensorType(x.shape[:-2], dtype), TensorType(w.shape[:-2], dtype)
    batch = broadcast_shapes("matmul", bx, bw)
    return TensorType(batch + (x.shape[-2], w.shape[-1]), dtype)


def _matmul_flops(ins: Types, out: TensorType, a: Attrs) -> int:
    return 2 * out.numel * ins[0].shape[-1]


def _softmax(op: str) -> OpDef:
    def infer(ins: Types, a: Attrs) -> TensorType:
        (x,) = ins
        return TensorType(x.shape, _float(op, x))

    return OpDef(op, (1, 1), infer, _ew_flops(5))


def _layer_norm(ins: Types, a: Attrs) -> TensorType:
    x, g, b = ins
    dtype = _float("layer_norm", x, g, b)
    k = g.rank
    if g.shape != b.shape or k == 0 or x.shape[-k:] != g.shape:
        raise SwpError("`layer_norm` scale and shift must match the trailing dimensions of its input",
                       hints=[f"input is {x}, scale is {g}, shift is {b}"])
    return TensorType(x.shape, dtype)


def _batch_norm(ins: Types, a: Attrs) -> TensorType:
    x, g, b = ins
    dtype = _float("batch_norm", x, g, b)
    if x.rank < 2 or g.shape != (x.shape[1],) or b.shape != (x.shape[1],):
        raise SwpError("`batch_norm` scale and shift must be vectors over the input's channels (dimension 1)",
                       hints=[f"input is {x}, scale is {g}, shift is {b}"])
    return TensorType(x.shape, dtype)


def _conv2d(ins: Types, a: Attrs) -> TensorType:
    x, w = ins
    dtype = _float("conv2d", x, w)
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
    (sh, sw), (ph, pw), (dh, dw) = a["stride"], a["padding"], a["dilation"]
    out = (n, o, _conv_out(h, kh, sh, ph, dh), _conv_out(wd, kw, sw, pw, dw))
    return TensorType(_positive_out("conv2d", out, x), dtype)


def _conv2d_flops(ins: Types, out: TensorType, a: Attrs) -> int:
    _, ci, kh, kw = ins[1].shape
    return 2 * out.numel * ci * kh * kw


def _pool(op: str) -> OpDef:
    def infer(ins: Types, a: Attrs) -> TensorType:
        (x,) = ins
        dtype = _float(op, x)
        if x.rank != 4:
            raise SwpError(f"`{op}` needs a 4-d input [N, C, H, W], got {x}")
        (kh, kw), (sh, sw), (ph, pw) = a["kernel"], a["stride"], a["padding"]
        if ph * 2 > kh or pw * 2 > kw:
            raise SwpError(f"`{op}` padding {a['padding']} is more than half the kernel {a['kernel']}")
        n, c, h, w = x.shape
        out = (n, c, _conv_out(h, kh, sh, ph, 1), _conv_out(w, kw, sw, pw, 1))
        return TensorType(_positive_out(op, out, x), dtype)

    def flops(ins: Types, out: TensorType, a: Attrs) -> int:
        return out.numel * a["kernel"][0] * a["kernel"][1]

    return OpDef(op, (1, 1), infer, flops)


def _global_avg_pool(ins: Types, a: Attrs) -> TensorType:
    (x,) = ins
    if x.rank != 4:
        raise SwpError(f"`global_avg_pool` needs a 4-d input [N, C, H, W], got {x}")
    return TensorType(x.shape[:2], _float("global_avg_pool", x))


def _reshape(ins: Types, a: Attrs) -> TensorType:
    (x,) = ins
    shape = tuple(a["shape"])
    if math.prod(shape) != x.numel:
        raise SwpError(f"cannot reshape {x} ({x.numel} elements) to [{','.join(map(str, shape))}] "
                       f"({math.prod(shape)} elements)")
    return TensorType(shape, x.dtype)


def _permute(ins: Types, a: Attrs) -> TensorType:
    (x,) = ins
    perm = tuple(a["perm"])
    if sorted(perm) != list(range(x.rank)):
        raise SwpError(f"permutation {list(perm)} does not fit {x}", hints=[f"expected an order of 0..{x.rank - 1}"])
    return TensorType(tuple(x.shape[p] for p in perm), x.dtype)


def _concat(ins: Types, a: Attrs) -> TensorType:
    axis = a["axis"]
    first = ins[0]
    dtype = _same_dtype("concat", *ins)
    for t in ins[1:]:
        if t.rank != first.rank or any(t.shape[i] != first.shape[i] for i in range(t.rank) if i != axis):
            raise SwpError(f"`concat` along axis {axis} needs equal sizes in every other dimension",
                           hints=[f"got {first} and {t}"])
    size = sum(t.shape[axis] for t in ins)
    return TensorType(first.shape[:axis] + (size,) + first.shape[axis + 1 :], dtype)


def _slice(ins: Types, a: Attrs) -> TensorType:
    (x,) = ins
    axis, start, stop, step = a["axis"], a["start"], a["stop"], a["step"]
    n = len(range(start, stop, step))
    if n < 1 or not (0 <= start < x.shape[axis]) or stop > x.shape[axis]:
        raise SwpError(f"slice {start}:{stop}:{step} of dimension {axis} (size {x.shape[axis]}) is empty "
                       "or out of range")
    return TensorType(x.shape[:axis] + (n,) + x.shape[axis + 1 :], x.dtype)


def _embedding(ins: Types, a: Attrs) -> TensorType:
    ids, table = ins
    if ids.dtype.is_float:
        raise SwpError(f"`embedding` indices must be integers, got {ids}")
    if table.rank != 2:
        raise SwpError(f"`embedding` table must be 2-d [vocab, dim], got {table}")
    return TensorType(ids.shape + (table.shape[1],), _float("embedding", table))


def _reduce(op: str) -> OpDef:
    def infer(ins: Types, a: Attrs) -> TensorType:
        (x,) = ins
        axes, keep = a["axes"], a["keepdims"]
        if keep:
            shape = tuple(1 if i in axes else d for i, d in enumerate(x.shape))
        else:
            shape = tuple(d for i, d in enumerate(x.shape) if i not in axes)
        return TensorType(shape, _float(op, x) if op == "mean" else x.dtype)

    return OpDef(op, (1, 1), infer, lambda ins, out, a: ins[0].numel)


def _cross_entropy(ins: Types, a: Attrs) -> TensorType:
    logits, labels = ins
    dtype = _float("softmax_cross_entropy", logits)
    if labels.dtype.is_float:
        raise SwpError(f"`softmax_cross_entropy` labels must be integer class indices, got {labels}",
                       hints=["declare the labels as i32 or i64"])
    if logits.rank < 1 or logits.shape[:-1] != labels.shape:
        raise SwpError("`softmax_cross_entropy` labels must have the logits' shape without the class dimension",
                       hints=[f"logits are {logits}, labels are {labels}"])
    return TensorType((), dtype)


def _mse(ins: Types, a: Attrs) -> TensorType:
    p, t = ins
    dtype = _float("mse_loss", p, t)
    if p.shape != t.shape:
        raise SwpError("`mse_loss` prediction and target shapes differ", hints=[f"prediction is {p}, target is {t}"])
    return TensorType((), dtype)


def _cast(ins: Types, a: Attrs) -> TensorType:
    return TensorType(ins[0].shape, DType[a["dtype"]])


def _embedding_read(ins: Types, out: TensorType, a: Attrs) -> int:
    return ins[0].nbytes + out.nbytes  # only the gathered rows of the table are read


def _table() -> dict[str, OpDef]:
    defs = [
        OpDef("matmul", (2, 2), _matmul, _matmul_flops),
        *(_binary(n) for n in ("add", "sub", "mul", "div")),
        _unary("add_scalar", floating=False),
        _unary("mul_scalar", floating=False),
        _unary("pow_scalar", 2),
        _unary("neg", floating=False),
        _unary("relu"),
        _unary("gelu", 8),
        _unary("tanh", 4),
        _unary("sigmoid", 4),
        _unary("exp", 2),
        _unary("log", 2),
        _unary("sqrt", 2),
        _softmax("softmax"),
        _softmax("log_softmax"),
        OpDef("layer_norm", (3, 3), _layer_norm, _ew_flops(8)),
        OpDef("batch_norm", (3, 3), _batch_norm, _ew_flops(8)),
        _unary("dropout", 2),
        OpDef("conv2d", (2, 2), _conv2d, _conv2d_flops),
        _pool("max_pool2d"),
        _pool("avg_pool2d"),
        OpDef("global_avg_pool", (1, 1), _global_avg_pool, lambda ins, out, a: ins[0].numel),
        OpDef("reshape", (1, 1), _reshape, _zero),
        OpDef("permute", (1, 1), _permute, _zero),
        OpDef("concat", (1, None), _concat, _zero),
        OpDef("slice", (1, 1), _slice, _zero,
              bytes_read=lambda ins, out, a: out.nbytes),
        OpDef("embedding", (2, 2), _embedding, _zero, bytes_read=_embedding_read),
        _reduce("sum"),
        _reduce("mean"),
        OpDef("softmax_cross_entropy", (2, 2), _cross_entropy, lambda ins, out, a: 6 * ins[0].numel),
        OpDef("mse_loss", (2, 2), _mse, lambda ins, out, a: 3 * ins[0].numel),
        OpDef("cast", (1, 1), _cast, _zero),
    ]
    return {d.name: d for d in defs}


REGISTRY: dict[str, OpDef] = _table()


def infer(op: str, ins: Types, attrs_: Attrs) -> TensorType:
    """The output type of ``op`` on inputs of types ``ins``; raises SwpError."""
    d = REGISTRY[op]
    lo, hi = d.arity
    if len(ins) < lo or (hi is not None and len(ins) > hi):
        raise SwpError(f"`{op}` takes {lo if lo == hi else f'{lo} or more'} tensor inputs, got {len(ins)}")
    return d.infer(ins, attrs_)
