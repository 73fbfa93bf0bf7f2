"""Element-wise ops, their backward helpers, and broadcasting's adjoints."""

from __future__ import annotations

import math

import numpy as np

from swapdsl.common.errors import SwpError
from swapdsl.graph.ir import DType, TensorType
from swapdsl.graph.ops.registry import (
    Array, Attrs, GradBuilder, GradRule, KernelContext, OpDef, Types, broadcast_shapes, floating, no_flops, np_dtype,
    per_element, register, same_as, same_dtype,
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


def _div_grad_rhs(c: KernelContext, ins: list[Array], a: Attrs) -> Array:
    g, x, y = ins
    return -(g * x) / (y * y)


def _div_grad_rhs_infer(ins: Types, a: Attrs) -> TensorType:
    g, x, y = ins
    return TensorType(g.shape, floating("div_grad_rhs", g, x, y))


# ---- unary ops -----------------------------------------------------------------


def _gelu(c: KernelContext, ins: list[Array], a: Attrs) -> Array:
    (x,) = ins
    xp = c.xp
    return 0.5 * x * (1.0 + xp.tanh(_GELU_K * (x + _GELU_C * x * x * x)))


def _gelu_grad(c: KernelContext, ins: list[Array], a: Attrs) -> Array:
    x, g = ins
    t = c.xp.tanh(_GELU_K * (x + _GELU_C * x * x * x))
    return g * (0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * _GELU_K * (1.0 + 3.0 * _GELU_C * x * x))


def _sigmoid(c: KernelContext, ins: list[Array], a: Attrs) -> Array:
    (x,) = ins
    # exp of a non-positive number only: no overflow for large |x|
    e = c.xp.exp(-c.xp.abs(x))
    return c.xp.where(x >= 0, 1.0 / (1.0 + e), e / (1.0 + e)).astype(x.dtype)


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


def _pow_scalar_grad(c: KernelContext, ins: list[Array], a: Attrs) -> Array:
    x, g = ins
    p = a["exponent"]
    return g * (p * x ** (p - 1.0))


def _same_grad_op(b: GradBuilder, ins: tuple[str, ...], out: str, g: str, a: Attrs) -> tuple[str | None, ...]:
    """dropout's gradient is dropout with the same mask (same seed, same step)."""
    return (b.emit("dropout", [g], a),)


def _cast_grad(b: GradBuilder, ins: tuple[str, ...], out: str, g: str, a: Attrs) -> tuple[str | None, ...]:
    return (b.emit("cast", [g], {"dtype": b.type(ins[0]).dtype.label}),)


def dropout_mask(c: KernelContext, shape: tuple[int, ...], p: float, seed: int) -> Array:
    """The keep-mask scaled by 1/(1-p); drawn with NumPy so both backends agree."""
    keep = np.random.default_rng([seed, c.step]).random(shape) >= p
    return c.xp.asarray(keep.astype(np.float32) / np.float32(1.0 - p))


def _dropout(c: KernelContext, ins: list[Array], a: Attrs) -> Array:
    (x,) = ins
    if a["p"] == 0.0:
        return x.copy()
    return (x * dropout_mask(c, x.shape, a["p"], a["seed"])).astype(x.dtype)


def _cast(c: KernelContext, ins: list[Array], a: Attrs) -> Array:
    return ins[0].astype(np_dtype(c.xp, a["dtype"]))


def _cast_infer(ins: Types, a: Attrs) -> TensorType:
    return TensorType(ins[0].shape, DType[a["dtype"]])


# ---- broadcasting adjoints and constants -----------------------------------------


def _sum_to_infer(ins: Types, a: Attrs) -> TensorType:
    (g,) = ins
    shape = tuple(a["shape"])
    if broadcast_shapes("sum_to", TensorType(shape, g.dtype), g) != g.shape:
        raise SwpError(f"sum_to: {g} does not broadcast from {list(shape)}")
    return TensorType(shape, g.dtype)


def sum_to(xp: object, g: Array, shape: tuple[int, ...]) -> Array:
    lead = g.ndim - len(shape)
    axes = tuple(range(lead)) + tuple(lead + i for i, d in enumerate(shape) if d == 1 and g.shape[lead + i] != 1)
    return g.sum(axis=axes).reshape(shape) if axes else g.copy()


def _sum_to(c: KernelContext, ins: list[Array], a: Attrs) -> Array:
    return sum_to(c.xp, ins[0], tuple(a["shape"]))


def _broadcast_infer(ins: Types, a: Attrs) -> TensorType:
    (g,) = ins
    shape, axes = tuple(a["shape"]), tuple(a["axes"])
    kept = tuple(d for i, d in enumerate(shape) if i not in axes)
    if len(kept) != g.rank or any(gd not in (1, kd) for gd, kd in zip(g.shape, kept)):
        raise SwpError(f"broadcast_to: {g} does not fit {list(shape)} with new axes {list(axes)}")
    return TensorType(shape, g.dtype)


def _broadcast_to(c: KernelContext, ins: list[Array], a: Attrs) -> Array:
    (g,) = ins
    xp = c.xp
    expanded = xp.expand_dims(g, tuple(a["axes"])) if a["axes"] else g
    return xp.broadcast_to(expanded, tuple(a["shape"])) * g.dtype.type(a["scale"])


def _fill_infer(ins: Types, a: Attrs) -> TensorType:
    return TensorType(tuple(a["shape"]), DType[a["dtype"]])


def _fill(c: KernelContext, ins: list[Array], a: Attrs) -> Array:
    return c.xp.full(tuple(a["shape"]), a["value"], dtype=np_dtype(c.xp, a["dtype"]))


def _k(fn):  # noqa: ANN001, ANN202
    """A kernel from a function of the input arrays alone."""
    return lambda c, ins, a: fn(c.xp, *ins)


def _unary(name: str, flops: int, kernel, grad) -> OpDef:  # noqa: ANN001
    return OpDef(name, (1, 1), same_as(0, op=name), per_element(flops), kernel, grad)


def _backward(name: str, flops: int, kernel, arity: int = 2) -> OpDef:  # noqa: ANN001
    """A backward op (forward tensor, g) -> shaped like g; not itself differentiated."""
    return OpDef(name, (arity, arity), same_as(arity - 1, op=name), per_element(flops), kernel)


register(
    OpDef("add", (2, 2), _binary_infer("add"), per_element(1), _k(lambda xp, x, y: x + y), _add_grad,
          in_place=True),
    OpDef("sub", (2, 2), _binary_infer("sub"), per_element(1), _k(lambda xp, x, y: x - y), _sub_grad),
    OpDef("mul", (2, 2), _binary_infer("mul"), per_element(1), _k(lambda xp, x, y: x * y), _mul_grad),
    OpDef("div", (2, 2), _binary_infer("div"), per_element(1), _k(lambda xp, x, y: x / y), _div_grad),
    OpDef("div_grad_rhs", (3, 3), _div_grad_rhs_infer, per_element(3), _div_grad_rhs),
    OpDef("add_scalar", (1, 1), same_as(0, float_only=False), per_element(1),
          lambda c, ins, a: ins[0] + ins[0].dtype.type(a["value"]), _add_scalar_grad),
    OpDef("mul_scalar", (1, 1), same_as(0, float_only=False), per_element(1),
          lambda c, ins, a: ins[0] * ins[0].dtype.type(a["value"]), _mul_scalar_grad),
    OpDef("pow_scalar", (1, 1), same_as(0, op="pow_scalar"), per_element(2),
          lambda c, ins, a: ins[0] ** ins[0].dtype.type(a["exponent"]), _grad_via("pow_scalar_grad", False)),
    _backward("pow_scalar_grad", 4, _pow_scalar_grad),
    OpDef("neg", (1, 1), same_as(0, float_only=False), per_element(1), _k(lambda xp, x: -x), _neg_grad),
    _unary("relu", 1, _k(lambda xp, x: xp.maximum(x, x.dtype.type(0))), _grad_via("relu_grad", True)),
    _backward("relu_grad", 1, _k(lambda xp, y, g: g * (y > 0))),
    _unary("gelu", 8, _gelu, _grad_via("gelu_grad", False)),
    _backward("gelu_grad", 12, _gelu_grad),
    _unary("tanh", 4, _k(lambda xp, x: xp.tanh(x)), _grad_via("tanh_grad", True)),
    _backward("tanh_grad", 3, _k(lambda xp, y, g: g * (1 - y * y))),
    _unary("sigmoid", 4, _sigmoid, _grad_via("sigmoid_grad", True)),
    _backward("sigmoid_grad", 3, _k(lambda xp, y, g: g * y * (1 - y))),
    _unary("exp", 2, _k(lambda xp, x: xp.exp(x)), _exp_grad),
    _unary("log", 2, _k(lambda xp, x: xp.log(x)), _log_grad),
    _unary("sqrt", 2, _k(lambda xp, x: xp.sqrt(x)), _sqrt_grad),
    _unary("dropout", 2, _dropout, _same_grad_op),
    OpDef("cast", (1, 1), _cast_infer, no_flops, _cast, _cast_grad),
    OpDef("sum_to", (1, 1), _sum_to_infer, lambda ins, out, a: ins[0].numel, _sum_to),
    OpDef("broadcast_to", (1, 1), _broadcast_infer, per_element(1), _broadcast_to),
    OpDef("fill", (0, 0), _fill_infer, no_flops, _fill),
)
