"""Losses: scalar means, numerically careful."""

from __future__ import annotations

from swapdsl.common.errors import SwpError
from swapdsl.graph.ir import TensorType
from swapdsl.graph.ops.registry import (
    Array, Attrs, GradBuilder, KernelContext, OpDef, Types, floating, per_input_element, register, same_as,
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
    return TensorType((), dtype)


def _rows(logits: Array, labels: Array) -> tuple[Array, Array]:
    classes = logits.shape[-1]
    return logits.reshape(-1, classes), labels.reshape(-1)


def _xent(c: KernelContext, ins: list[Array], a: Attrs) -> Array:
    z, y = _rows(*ins)
    xp = c.xp
    m = z.max(axis=1, keepdims=True)
    logsumexp = m[:, 0] + xp.log(xp.exp(z - m).sum(axis=1))
    picked = z[xp.arange(z.shape[0]), y]
    return xp.asarray((logsumexp - picked).mean(), dtype=z.dtype)


def _xent_grad_kernel(c: KernelContext, ins: list[Array], a: Attrs) -> Array:
    logits, labels, g = ins
    z, y = _rows(logits, labels)
    xp = c.xp
    e = xp.exp(z - z.max(axis=1, keepdims=True))
    p = e / e.sum(axis=1, keepdims=True)
    p[xp.arange(z.shape[0]), y] -= 1
    return (p * (g / z.shape[0])).reshape(logits.shape).astype(logits.dtype)


def _xent_grad(b: GradBuilder, ins: tuple[str, ...], out: str, g: str, a: Attrs) -> tuple[str | None, ...]:
    return b.emit("softmax_cross_entropy_grad", [ins[0], ins[1], g]), None


def _mse_infer(ins: Types, a: Attrs) -> TensorType:
    p, t = ins
    dtype = floating("mse_loss", p, t)
    if p.shape != t.shape:
        raise SwpError("`mse_loss` prediction and target shapes differ", hints=[f"prediction is {p}, target is {t}"])
    return TensorType((), dtype)


def _mse(c: KernelContext, ins: list[Array], a: Attrs) -> Array:
    d = ins[0] - ins[1]
    return c.xp.asarray((d * d).mean(), dtype=d.dtype)


def _mse_grad_kernel(c: KernelContext, ins: list[Array], a: Attrs) -> Array:
    p, t, g = ins
    return ((p - t) * (2.0 * g / p.size)).astype(p.dtype)


def _mse_grad(b: GradBuilder, ins: tuple[str, ...], out: str, g: str, a: Attrs) -> tuple[str | None, ...]:
    dp = b.emit("mse_loss_grad", [ins[0], ins[1], g])
    return dp, b.emit("neg", [dp])


register(
    OpDef("softmax_cross_entropy", (2, 2), _xent_infer, per_input_element(6), _xent, _xent_grad),
    OpDef("softmax_cross_entropy_grad", (3, 3), same_as(0, float_only=False), per_input_element(6),
          _xent_grad_kernel),
    OpDef("mse_loss", (2, 2), _mse_infer, per_input_element(3), _mse, _mse_grad),
    OpDef("mse_loss_grad", (3, 3), same_as(0, op="mse_loss_grad"), per_input_element(3), _mse_grad_kernel),
)
