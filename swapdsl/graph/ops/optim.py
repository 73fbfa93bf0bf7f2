"""Optimiser update ops: each step's new parameter and state values.

Updates are functional (they return new arrays); the training graph records
which new value replaces which persistent tensor at the end of a step.
Weight decay is L2 (added to the gradient), as in torch.optim.SGD and Adam.
Every constant is formed in f64 from the hyper-parameters and rounded to the tensor's dtype once
(``_const``): forming ``1 - beta2`` in f32 would scale Adam's second moment by a factor other than 1.
"""

from __future__ import annotations

from typing import Any

from swapdsl.graph.ir import TensorType
from swapdsl.graph.ops.registry import Array, Attrs, KernelContext, OpDef, Types, per_element, register


def _const(like: Array, value: float) -> Any:
    """``value`` (computed in f64) as a scalar of ``like``'s dtype, rounded once."""
    return like.dtype.type(value)


def _decayed(g: Array, w: Array, a: Attrs) -> Array:
    wd = a.get("weight_decay", 0.0)
    return g + _const(w, wd) * w if wd else g


def _sgd(c: KernelContext, ins: list[Array], a: Attrs) -> Array:
    w, g = ins
    return w - _const(w, a["lr"]) * _decayed(g, w, a)


def _momentum(c: KernelContext, ins: list[Array], a: Attrs) -> Array:
    m, g, w = ins
    return m * _const(m, a["momentum"]) + _decayed(g, w, a)


def _sgd_apply(c: KernelContext, ins: list[Array], a: Attrs) -> Array:
    w, m = ins
    return w - _const(w, a["lr"]) * m


def _adam_m(c: KernelContext, ins: list[Array], a: Attrs) -> Array:
    m, g, w = ins
    return _const(m, a["beta1"]) * m + _const(m, 1.0 - a["beta1"]) * _decayed(g, w, a)


def _adam_v(c: KernelContext, ins: list[Array], a: Attrs) -> Array:
    v, g, w = ins
    gd = _decayed(g, w, a)
    return _const(v, a["beta2"]) * v + _const(v, 1.0 - a["beta2"]) * gd * gd


def _adam_apply(c: KernelContext, ins: list[Array], a: Attrs) -> Array:
    w, m, v = ins
    t = c.step
    mhat = m * _const(m, 1.0 / (1.0 - a["beta1"] ** t))
    vhat = v * _const(v, 1.0 / (1.0 - a["beta2"] ** t))
    return (w - _const(w, a["lr"]) * mhat / (c.xp.sqrt(vhat) + _const(w, a["eps"]))).astype(w.dtype)


def _like_first(ins: Types, a: Attrs) -> TensorType:
    return ins[0]


def _update(name: str, arity: int, flops: int, kernel) -> OpDef:  # noqa: ANN001
    return OpDef(name, (arity, arity), _like_first, per_element(flops), kernel, in_place=True)


register(
    _update("sgd", 2, 3, _sgd),
    _update("momentum", 3, 4, _momentum),
    _update("sgd_apply", 2, 2, _sgd_apply),
    _update("adam_m", 3, 5, _adam_m),
    _update("adam_v", 3, 6, _adam_v),
    _update("adam_apply", 3, 6, _adam_apply),
)
