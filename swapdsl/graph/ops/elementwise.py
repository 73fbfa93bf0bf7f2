"""Element-wise ops, their backward helpers, and broadcasting's adjoints."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from swapdsl.common.errors import SwpError
from swapdsl.graph.ir import DType, TensorType
from swapdsl.graph.ops.registry import (
    Array, Attrs, Cost, GradBuilder, GradRule, KernelContext, OpDef, Types, broadcast_shapes, buffers, chunk_len,
    chunks, floating, iota, no_flops, no_scratch, per_element, register, same_as, same_dtype,
)

_GELU_K = math.sqrt(2.0 / math.pi)
_GELU_C = 0.044715


def unbroadcast(b: GradBuilder, g: str, shape: tuple[int, ...]) -> str:
    """Sum ``g`` down to ``shape``: the adjoint of broadcasting."""
    return g if b.type(g).shape == shape else b.emit("sum_to", [g], {"shape": shape})


# ---- binary ops ----------------------------------------------------------------


def _binary_infer(op: str):  # noqa: ANN202
    def infer(ins: Types, a: Attrs) -> TensorType:
        return TensorType(broadcast_shapes(op, *ins), same_dtype(op, *ins))

    return infer


def _add_grad(b: GradBuilder, ins: tuple[str, ...], out: str, g: str, a: Attrs) -> tuple[str | None, ...]:
    return unbroadcast(b, g, b.type(ins[0]).shape), unbroadcast(b, g, b.type(ins[1]).shape)


def _sub_grad(b: GradBuilder, ins: tuple[str, ...], out: str, g: str, a: Attrs) -> tuple[str | None, ...]:
    return unbroadcast(b, g, b.type(ins[0]).shape), b.emit("neg", [unbroadcast(b, g, b.type(ins[1]).shape)])


def _mul_grad(b: GradBuilder, ins: tuple[str, ...], out: str, g: str, a: Attrs) -> tuple[str | None, ...]:
    x, y = ins
    return (unbroadcast(b, b.emit("mul", [g, y]), b.type(x).shape),
            unbroadcast(b, b.emit("mul", [g, x]), b.type(y).shape))


def _div_grad(b: GradBuilder, ins: tuple[str, ...], out: str, g: str, a: Attrs) -> tuple[str | None, ...]:
    x, y = ins
    return (unbroadcast(b, b.emit("div", [g, y]), b.type(x).shape),
            unbroadcast(b, b.emit("div_grad_rhs", [g, x, y]), b.type(y).shape))


def _div_grad_rhs(c: KernelContext, ins: list[Array], out: Array, a: Attrs) -> None:
    g, x, y = ins
    xp, yy = c.xp, c.scratch.take(y.shape, y.dtype)
    xp.multiply(g, x, out=out)
    xp.negative(out, out=out)
    xp.multiply(y, y, out=yy)
    xp.divide(out, yy, out=out)


def _div_grad_rhs_scratch(ins: Types, out: TensorType, a: Attrs) -> int:
    return buffers(ins[2].nbytes)


def _div_grad_rhs_infer(ins: Types, a: Attrs) -> TensorType:
    g, x, y = ins
    return TensorType(g.shape, floating("div_grad_rhs", g, x, y))


# ---- unary ops -----------------------------------------------------------------


def _gelu_tanh(xp: Any, x: Array, out: Array) -> None:
    """out = tanh(K * (x + C * x^3)), in the order the formula reads."""
    xp.multiply(x, _GELU_C, out=out)
    xp.multiply(out, x, out=out)
    xp.multiply(out, x, out=out)
    xp.add(x, out, out=out)
    xp.multiply(out, _GELU_K, out=out)
    xp.tanh(out, out=out)


def _gelu(c: KernelContext, ins: list[Array], out: Array, a: Attrs) -> None:
    (x,) = ins
    xp = c.xp
    _gelu_tanh(xp, x, out)
    xp.add(out, 1.0, out=out)
    xp.multiply(out, x, out=out)
    xp.multiply(out, 0.5, out=out)  # exact: 0.5 * x * (1 + t) in any order


def _gelu_grad(c: KernelContext, ins: list[Array], out: Array, a: Attrs, start: int = 0) -> None:
    """g * (0.5 (1 + t) + 0.5 x (1 - t^2) K (1 + 3 C x^2))."""
    x, g = ins
    xp = c.xp
    t, u = c.scratch.take(x.shape, x.dtype), c.scratch.take(x.shape, x.dtype)
    _gelu_tanh(xp, x, t)
    xp.multiply(t, t, out=out)
    xp.subtract(1.0, out, out=out)
    xp.multiply(x, 0.5, out=u)
    xp.multiply(u, out, out=u)
    xp.multiply(u, _GELU_K, out=u)
    xp.multiply(x, 3.0 * _GELU_C, out=out)
    xp.multiply(out, x, out=out)
    xp.add(out, 1.0, out=out)
    xp.multiply(u, out, out=u)
    xp.add(t, 1.0, out=t)
    xp.multiply(t, 0.5, out=t)
    xp.add(t, u, out=out)
    xp.multiply(out, g, out=out)


def _sigmoid(c: KernelContext, ins: list[Array], out: Array, a: Attrs, start: int = 0) -> None:
    (x,) = ins
    xp = c.xp
    # exp of a non-positive number only: no overflow for large |x|: 1 / (1 + e) or e / (1 + e)
    e, positive = c.scratch.take(x.shape, x.dtype), c.scratch.take(x.shape, xp.bool_)
    xp.abs(x, out=e)
    xp.negative(e, out=e)
    xp.exp(e, out=e)
    xp.add(e, 1.0, out=out)
    xp.greater_equal(x, 0, out=positive)
    xp.copyto(e, 1.0, where=positive)
    xp.divide(e, out, out=out)


def _silu(c: KernelContext, ins: list[Array], out: Array, a: Attrs, start: int = 0) -> None:
    """x * sigmoid(x) (SiLU, or swish)."""
    (x,) = ins
    s = c.scratch.take(x.shape, x.dtype)
    _sigmoid(c, [x], s, a)
    c.xp.multiply(x, s, out=out)


def _silu_grad(c: KernelContext, ins: list[Array], out: Array, a: Attrs, start: int = 0) -> None:
    """g * s * (1 + x * (1 - s)), s = sigmoid(x)."""
    x, g = ins
    xp = c.xp
    s, t = c.scratch.take(x.shape, x.dtype), c.scratch.take(x.shape, x.dtype)
    _sigmoid(c, [x], s, a)
    xp.subtract(x.dtype.type(1), s, out=t)
    xp.multiply(x, t, out=t)
    xp.add(t, x.dtype.type(1), out=t)
    xp.multiply(s, t, out=t)
    xp.multiply(g, t, out=out)


def _erf_function(xp: Any) -> Any:
    """SciPy's erf on NumPy (exact in f64), CuPy's own on a GPU: NumPy has none."""
    if xp.__name__ == "numpy":
        from scipy.special import erf
    else:
        from cupyx.scipy.special import erf
    return erf


def _erf(c: KernelContext, ins: list[Array], out: Array, a: Attrs) -> None:
    _erf_function(c.xp)(ins[0], out=out)


def _erf_grad(c: KernelContext, ins: list[Array], out: Array, a: Attrs, start: int = 0) -> None:
    """g * 2 / sqrt(pi) * exp(-x^2)."""
    x, g = ins
    xp = c.xp
    xp.multiply(x, x, out=out)
    xp.negative(out, out=out)
    xp.exp(out, out=out)
    xp.multiply(out, x.dtype.type(2.0 / math.sqrt(math.pi)), out=out)
    xp.multiply(out, g, out=out)


def _leaky_relu(c: KernelContext, ins: list[Array], out: Array, a: Attrs) -> None:
    """max(x, slope * x): x where positive, slope * x elsewhere (0 <= slope < 1)."""
    (x,) = ins
    c.xp.multiply(x, x.dtype.type(a["slope"]), out=out)
    c.xp.maximum(x, out, out=out)


def _leaky_relu_grad(c: KernelContext, ins: list[Array], out: Array, a: Attrs, start: int = 0) -> None:
    """g where x > 0, else slope * g (at 0 too, as PyTorch)."""
    x, g = ins
    positive = c.scratch.take(x.shape, c.xp.bool_)
    c.xp.greater(x, 0, out=positive)
    c.xp.multiply(g, g.dtype.type(a["slope"]), out=out)
    c.xp.copyto(out, g, where=positive)


def _in_flat_chunks(kernel, *itemsizes: int) -> tuple[Any, Cost]:  # noqa: ANN001
    """An element-wise kernel over same-shaped operands, run on flat chunks so that its temporaries (one per
    item size given; 0: the operand's own) stay small; and its scratch rule."""
    def per_element(dtype_size: int) -> int:
        return sum(s or dtype_size for s in itemsizes)

    def tiled(c: KernelContext, ins: list[Array], out: Array, a: Attrs) -> None:
        flat, dest = [x.reshape(-1) for x in ins], out.reshape(-1)
        mark = c.scratch.used
        first = element_offset(c, a)  # where this block, micro-batch or rank's rows start (a hashing kernel)
        for k in chunks(dest.size, per_element(out.dtype.itemsize), out.nbytes):
            kernel(c, [x[k] for x in flat], dest[k], a, first + k.start)
            c.scratch.used = mark

    def rule(ins: Types, out: TensorType, a: Attrs) -> int:
        n = chunk_len(out.numel, per_element(out.dtype.itemsize), out.nbytes)
        return buffers(*(n * (s or out.dtype.itemsize) for s in itemsizes), 4, 4)

    return tiled, rule


def _grad_via(op: str, use_output: bool) -> GradRule:
    """A gradient that is one backward op of (forward input or output, g)."""

    def rule(b: GradBuilder, ins: tuple[str, ...], out: str, g: str, a: Attrs) -> tuple[str | None, ...]:
        return (b.emit(op, [out if use_output else ins[0], g], a),)

    return rule


def _neg_grad(b: GradBuilder, ins: tuple[str, ...], out: str, g: str, a: Attrs) -> tuple[str | None, ...]:
    return (b.emit("neg", [g]),)


def _exp_grad(b: GradBuilder, ins: tuple[str, ...], out: str, g: str, a: Attrs) -> tuple[str | None, ...]:
    return (b.emit("mul", [g, out]),)


def _log_grad(b: GradBuilder, ins: tuple[str, ...], out: str, g: str, a: Attrs) -> tuple[str | None, ...]:
    return (b.emit("div", [g, ins[0]]),)


def _sqrt_grad(b: GradBuilder, ins: tuple[str, ...], out: str, g: str, a: Attrs) -> tuple[str | None, ...]:
    return (b.emit("div", [b.emit("mul_scalar", [g], {"value": 0.5}), out]),)


def _add_scalar_grad(b: GradBuilder, ins: tuple[str, ...], out: str, g: str, a: Attrs) -> tuple[str | None, ...]:
    return (g,)


def _mul_scalar_grad(b: GradBuilder, ins: tuple[str, ...], out: str, g: str, a: Attrs) -> tuple[str | None, ...]:
    return (b.emit("mul_scalar", [g], {"value": a["value"]}),)


def _pow_scalar_grad(c: KernelContext, ins: list[Array], out: Array, a: Attrs) -> None:
    x, g = ins
    p = a["exponent"]
    c.xp.power(x, p - 1.0, out=out)
    c.xp.multiply(out, p, out=out)
    c.xp.multiply(g, out, out=out)


def _same_grad_op(b: GradBuilder, ins: tuple[str, ...], out: str, g: str, a: Attrs) -> tuple[str | None, ...]:
    """dropout's gradient is dropout with the same mask (same seed, same step)."""
    return (b.emit("dropout", [g], a),)


def _cast_grad(b: GradBuilder, ins: tuple[str, ...], out: str, g: str, a: Attrs) -> tuple[str | None, ...]:
    return (b.emit("cast", [g], {"dtype": b.type(ins[0]).dtype.label}),)


_M1, _M2, _GOLDEN = np.uint32(0x85EBCA6B), np.uint32(0xC2B2AE35), np.uint32(0x9E3779B1)


def _fmix32(xp: Any, h: Array, tmp: Array) -> None:
    """MurmurHash3's finaliser, in place on uint32 ``h``: every input bit reaches every output bit."""
    for shift, mult in ((16, _M1), (13, _M2), (16, None)):
        xp.right_shift(h, np.uint32(shift), out=tmp)
        xp.bitwise_xor(h, tmp, out=h)
        if mult is not None:
            xp.multiply(h, mult, out=h)


def _seed_key(seed: int) -> np.uint32:
    h = np.array([seed & 0xFFFFFFFF], dtype=np.uint32)
    _fmix32(np, h, np.empty_like(h))
    return h[0]


def step_key(c: KernelContext, seed: int) -> Array:
    """The hash key of (seed, training step), a 0-d uint32 on the device, formed from the step counter."""
    xp = c.xp
    key, tmp = c.scratch.take((), xp.uint32), c.scratch.take((), xp.uint32)
    xp.copyto(key, c.step, casting="unsafe")
    _fmix32(xp, key, tmp)
    xp.bitwise_xor(key, _seed_key(seed), out=key)
    return key


def dropout_constants(p: float, dtype: Any) -> tuple[np.uint32, np.floating]:
    """(the hash threshold below which an element is dropped, the scale of a kept one, 1 / (1 - p) formed in
    the tensor's float type as PyTorch forms it: f64 for f64 tensors, else f32)."""
    t = np.float64 if np.dtype(dtype) == np.float64 else np.float32
    return np.uint32(min(round(p * 2.0**32), 2**32 - 1)), t(1.0) / t(1.0 - p)


def element_offset(c: KernelContext, a: Attrs) -> int:
    """Where a hashing kernel's elements start among the global batch's: its micro-batch's or staged block's
    ``offset``, after the rows of the data-parallel ranks before this one (``rank_stride`` elements each:
    graph/dataparallel.py), so that N ranks draw the masks one process would on the whole batch."""
    rank = c.comm.Get_rank() if c.comm is not None and "rank_stride" in a else 0
    return int(a.get("offset", 0)) + rank * int(a.get("rank_stride", 0))


def uniform_bits(c: KernelContext, n: int, start: int, seed: int) -> Array:
    """32 random bits for each of elements start..start+n-1, a pure function of (seed, training step, element
    index), computed on the device from the step counter: the same on NumPy and CuPy, whatever the tiling,
    and replayable without the host."""
    xp = c.xp
    h, tmp = c.scratch.take((n,), xp.uint32), c.scratch.take((n,), xp.uint32)
    key = step_key(c, seed)
    iota(xp, h, (start + 1) % 2**32)  # the element index, 1-based
    xp.multiply(h, _GOLDEN, out=h)
    xp.bitwise_xor(h, key, out=h)
    _fmix32(xp, h, tmp)
    return h


def _dropout(c: KernelContext, ins: list[Array], out: Array, a: Attrs, start: int = 0) -> None:
    """Keep each element with probability 1 - p, scaled by 1 / (1 - p)."""
    (x,) = ins
    xp, p = c.xp, a["p"]
    if p == 0.0:
        xp.copyto(out, x)
        return
    bits, keep = uniform_bits(c, x.size, start, a["seed"]), c.scratch.take(x.shape, xp.bool_)
    threshold, scale = dropout_constants(p, x.dtype)
    xp.greater_equal(bits, threshold, out=keep)
    xp.multiply(x, scale, out=out)
    xp.multiply(out, keep, out=out)


_DROPOUT = _in_flat_chunks(_dropout, 4, 4, 1)  # the bits, a shift temporary, the keep-mask
_SIGMOID = _in_flat_chunks(_sigmoid, 0, 1)  # exp(-|x|), the sign mask
_SILU = _in_flat_chunks(_silu, 0, 0, 1)  # the sigmoid, and its temporaries
_SILU_GRAD = _in_flat_chunks(_silu_grad, 0, 0, 0, 1)
_LEAKY_GRAD = _in_flat_chunks(_leaky_relu_grad, 1)  # the mask


def _cast(c: KernelContext, ins: list[Array], out: Array, a: Attrs) -> None:
    c.xp.copyto(out, ins[0], casting="unsafe")


def _cast_infer(ins: Types, a: Attrs) -> TensorType:
    return TensorType(ins[0].shape, DType[a["dtype"]])


# ---- broadcasting adjoints and constants -----------------------------------------


def _sum_to_infer(ins: Types, a: Attrs) -> TensorType:
    (g,) = ins
    shape = tuple(a["shape"])
    if broadcast_shapes("sum_to", TensorType(shape, g.dtype), g) != g.shape:
        raise SwpError(f"sum_to: {g} does not broadcast from {list(shape)}")
    return TensorType(shape, g.dtype)


def _sum_to(c: KernelContext, ins: list[Array], out: Array, a: Attrs) -> None:
    (g,) = ins
    shape = tuple(a["shape"])
    lead = g.ndim - len(shape)
    axes = tuple(range(lead)) + tuple(lead + i for i, d in enumerate(shape) if d == 1 and g.shape[lead + i] != 1)
    if not axes:
        c.xp.copyto(out, g)
        return
    kept = tuple(d for i, d in enumerate(g.shape) if i not in axes)
    c.xp.sum(g, axis=axes, out=out.reshape(kept))


def _broadcast_infer(ins: Types, a: Attrs) -> TensorType:
    (g,) = ins
    shape, axes = tuple(a["shape"]), tuple(a["axes"])
    kept = tuple(d for i, d in enumerate(shape) if i not in axes)
    if len(kept) != g.rank or any(gd not in (1, kd) for gd, kd in zip(g.shape, kept)):
        raise SwpError(f"broadcast_to: {g} does not fit {list(shape)} with new axes {list(axes)}")
    return TensorType(shape, g.dtype)


def _broadcast_to(c: KernelContext, ins: list[Array], out: Array, a: Attrs) -> None:
    (g,) = ins
    xp = c.xp
    expanded = xp.expand_dims(g, tuple(a["axes"])) if a["axes"] else g
    xp.multiply(xp.broadcast_to(expanded, tuple(a["shape"])), g.dtype.type(a["scale"]), out=out)


def _fill_infer(ins: Types, a: Attrs) -> TensorType:
    return TensorType(tuple(a["shape"]), DType[a["dtype"]])


def _fill(c: KernelContext, ins: list[Array], out: Array, a: Attrs) -> None:
    out.fill(a["value"])


def _u(name: str):  # noqa: ANN202
    """A kernel that is one ufunc of the inputs, into the output."""
    return lambda c, ins, out, a: getattr(c.xp, name)(*ins, out=out)


def _scalar(name: str, attr: str):  # noqa: ANN202
    """A kernel that is one ufunc of the input and a scalar attribute in the input's dtype."""
    return lambda c, ins, out, a: getattr(c.xp, name)(ins[0], ins[0].dtype.type(a[attr]), out=out)


def _relu_grad(c: KernelContext, ins: list[Array], out: Array, a: Attrs) -> None:
    y, g = ins
    c.xp.greater(y, 0, out=out)  # 1 where the unit was active, else 0
    c.xp.multiply(g, out, out=out)


def _tanh_grad(c: KernelContext, ins: list[Array], out: Array, a: Attrs) -> None:
    y, g = ins
    c.xp.multiply(y, y, out=out)
    c.xp.subtract(1, out, out=out)
    c.xp.multiply(g, out, out=out)


def _sigmoid_grad(c: KernelContext, ins: list[Array], out: Array, a: Attrs) -> None:
    y, g = ins
    c.xp.subtract(1, y, out=out)
    c.xp.multiply(out, y, out=out)
    c.xp.multiply(out, g, out=out)


def _compare_infer(op: str):  # noqa: ANN202
    def infer(ins: Types, a: Attrs) -> TensorType:
        same_dtype(op, *ins)
        return TensorType(broadcast_shapes(op, *ins), DType.i32)

    return infer


COMPARISONS = {"==": "equal", "!=": "not_equal", "<": "less", "<=": "less_equal", ">": "greater",
               ">=": "greater_equal"}


def _unary(name: str, flops: int, kernel, grad, scratch: Cost = no_scratch) -> OpDef:  # noqa: ANN001
    return OpDef(name, (1, 1), same_as(0, op=name), per_element(flops), kernel, grad, scratch=scratch)


def _backward(name: str, flops: int, kernel, scratch: Cost = no_scratch) -> OpDef:  # noqa: ANN001
    """A backward op (forward tensor, g) -> shaped like g; not itself differentiated."""
    return OpDef(name, (2, 2), same_as(1, op=name), per_element(flops), kernel, scratch=scratch)


register(
    OpDef("add", (2, 2), _binary_infer("add"), per_element(1), _u("add"), _add_grad, in_place=True),
    OpDef("sub", (2, 2), _binary_infer("sub"), per_element(1), _u("subtract"), _sub_grad),
    OpDef("mul", (2, 2), _binary_infer("mul"), per_element(1), _u("multiply"), _mul_grad),
    OpDef("div", (2, 2), _binary_infer("div"), per_element(1), _u("divide"), _div_grad),
    OpDef("div_grad_rhs", (3, 3), _div_grad_rhs_infer, per_element(3), _div_grad_rhs, scratch=_div_grad_rhs_scratch),
    OpDef("add_scalar", (1, 1), same_as(0, float_only=False), per_element(1), _scalar("add", "value"),
          _add_scalar_grad),
    OpDef("mul_scalar", (1, 1), same_as(0, float_only=False), per_element(1), _scalar("multiply", "value"),
          _mul_scalar_grad),
    OpDef("pow_scalar", (1, 1), same_as(0, op="pow_scalar"), per_element(2), _scalar("power", "exponent"),
          _grad_via("pow_scalar_grad", False)),
    _backward("pow_scalar_grad", 4, _pow_scalar_grad),
    OpDef("neg", (1, 1), same_as(0, float_only=False), per_element(1), _u("negative"), _neg_grad),
    _unary("relu", 1, lambda c, ins, out, a: c.xp.maximum(ins[0], ins[0].dtype.type(0), out=out),
           _grad_via("relu_grad", True)),
    _backward("relu_grad", 1, _relu_grad),
    _unary("gelu", 8, _gelu, _grad_via("gelu_grad", False)),
    _backward("gelu_grad", 12, *_in_flat_chunks(_gelu_grad, 0, 0)),
    _unary("tanh", 4, _u("tanh"), _grad_via("tanh_grad", True)),
    _backward("tanh_grad", 3, _tanh_grad),
    _unary("sigmoid", 4, _SIGMOID[0], _grad_via("sigmoid_grad", True), _SIGMOID[1]),
    _backward("sigmoid_grad", 3, _sigmoid_grad),
    _unary("silu", 6, _SILU[0], _grad_via("silu_grad", False), _SILU[1]),
    _unary("erf", 10, _erf, _grad_via("erf_grad", False)),
    _backward("erf_grad", 5, _erf_grad),
    _backward("silu_grad", 10, *_SILU_GRAD),
    _unary("leaky_relu", 2, _leaky_relu, _grad_via("leaky_relu_grad", False)),
    _backward("leaky_relu_grad", 2, *_LEAKY_GRAD),
    _unary("exp", 2, _u("exp"), _exp_grad),
    _unary("log", 2, _u("log"), _log_grad),
    _unary("sqrt", 2, _u("sqrt"), _sqrt_grad),
    _unary("dropout", 2, _DROPOUT[0], _same_grad_op, _DROPOUT[1]),
    OpDef("cast", (1, 1), _cast_infer, no_flops, _cast, _cast_grad),
    OpDef("sum_to", (1, 1), _sum_to_infer, lambda ins, out, a: ins[0].numel, _sum_to),
    OpDef("broadcast_to", (1, 1), _broadcast_infer, per_element(1), _broadcast_to),
    OpDef("fill", (0, 0), _fill_infer, no_flops, _fill),
    # (a `report`'s state, its value this step) -> the new state: the value (see autodiff.training_graph)
    OpDef("report", (2, 2), same_as(0, float_only=False), no_flops, lambda c, ins, out, a: c.xp.copyto(out, ins[1]),
          in_place=True),
    # comparisons: 1 where true, else 0, as i32; no gradient flows through them
    *(OpDef(name, (2, 2), _compare_infer(name), per_element(1), _u(name)) for name in COMPARISONS.values()),
)
