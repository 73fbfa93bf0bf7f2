"""Optimiser update ops: each step's new parameter and state values.

An update writes its new value into its output, which the plan may place over
the value it replaces; the training graph records which new value replaces
which persistent tensor at the end of a step. Updates run over flat chunks, so
their temporaries stay small whatever the parameter's size.
Weight decay is L2 (added to the gradient), as in torch.optim.SGD and Adam.
Every constant is formed in f64 from the hyper-parameters and rounded to the tensor's dtype once:
forming ``1 - beta2`` in f32 would scale Adam's second moment by a factor other than 1. Adam's bias
correction reads the step from the device's counter, so a step replays without the host.
"""

from __future__ import annotations

from typing import Any

from swapdsl.common.errors import SwpError
from swapdsl.graph.ir import DType, TensorType
from swapdsl.graph.ops.registry import (
    Array, Attrs, KernelContext, OpDef, Types, buffers, chunk_len, chunks, per_element, register,
)


def _decayed(c: KernelContext, g: Array, w: Array, a: Attrs, out: Array) -> Array:
    """g + wd * w into ``out`` (or g itself when there is no weight decay)."""
    wd = a.get("weight_decay", 0.0)
    if not wd:
        return g
    c.xp.multiply(w, w.dtype.type(wd), out=out)
    c.xp.add(g, out, out=out)
    return out


def _sgd(c: KernelContext, ins: list[Array], out: Array, a: Attrs) -> None:
    w, g = ins
    for k in flat_chunks(out):
        t = c.scratch.take(out[k].shape, out.dtype)
        c.xp.multiply(w.dtype.type(a["lr"]), _decayed(c, g[k], w[k], a, t), out=t)
        c.xp.subtract(w[k], t, out=out[k])
        c.scratch.reset()


def _momentum(c: KernelContext, ins: list[Array], out: Array, a: Attrs) -> None:
    m, g, w = ins
    for k in flat_chunks(out):
        t = c.scratch.take(out[k].shape, out.dtype)
        d = _decayed(c, g[k], w[k], a, t)
        c.xp.multiply(m[k], m.dtype.type(a["momentum"]), out=out[k])
        c.xp.add(out[k], d, out=out[k])
        c.scratch.reset()


def _sgd_apply(c: KernelContext, ins: list[Array], out: Array, a: Attrs) -> None:
    w, m = ins
    for k in flat_chunks(out):
        t = c.scratch.take(out[k].shape, out.dtype)
        c.xp.multiply(w.dtype.type(a["lr"]), m[k], out=t)
        c.xp.subtract(w[k], t, out=out[k])
        c.scratch.reset()


def _adam_m(c: KernelContext, ins: list[Array], out: Array, a: Attrs) -> None:
    m, g, w = ins
    for k in flat_chunks(out):
        t = c.scratch.take(out[k].shape, out.dtype)
        d = _decayed(c, g[k], w[k], a, t)
        c.xp.multiply(m.dtype.type(1.0 - a["beta1"]), d, out=t)
        c.xp.multiply(m.dtype.type(a["beta1"]), m[k], out=out[k])
        c.xp.add(out[k], t, out=out[k])
        c.scratch.reset()


def _adam_v(c: KernelContext, ins: list[Array], out: Array, a: Attrs) -> None:
    v, g, w = ins
    for k in flat_chunks(out):
        t, u = c.scratch.take(out[k].shape, out.dtype), c.scratch.take(out[k].shape, out.dtype)
        d = _decayed(c, g[k], w[k], a, t)
        c.xp.multiply(v.dtype.type(1.0 - a["beta2"]), d, out=u)
        c.xp.multiply(u, d, out=u)
        c.xp.multiply(v.dtype.type(a["beta2"]), v[k], out=out[k])
        c.xp.add(out[k], u, out=out[k])
        c.scratch.reset()


def bias_correction(c: KernelContext, beta: float, dtype: Any) -> Array:
    """1 / (1 - beta^t) for the device's step counter t: formed in f64, rounded to ``dtype`` once."""
    xp = c.xp
    f64, rounded = c.scratch.take((), xp.float64), c.scratch.take((), dtype)
    xp.power(xp.float64(beta), c.step, out=f64)
    xp.subtract(1.0, f64, out=f64)
    xp.divide(1.0, f64, out=f64)
    xp.copyto(rounded, f64, casting="unsafe")
    return rounded


def _adam_apply(c: KernelContext, ins: list[Array], out: Array, a: Attrs) -> None:
    """w - lr * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)."""
    w, m, v = ins
    xp = c.xp
    c1, c2 = bias_correction(c, a["beta1"], m.dtype), bias_correction(c, a["beta2"], v.dtype)
    mark = c.scratch.used
    for k in flat_chunks(out):
        t, u = c.scratch.take(out[k].shape, out.dtype), c.scratch.take(out[k].shape, out.dtype)
        xp.multiply(v[k], c2, out=t)
        xp.sqrt(t, out=t)
        xp.add(t, w.dtype.type(a["eps"]), out=t)
        xp.multiply(m[k], c1, out=u)
        xp.multiply(w.dtype.type(a["lr"]), u, out=u)
        xp.divide(u, t, out=u)
        xp.subtract(w[k], u, out=out[k])
        c.scratch.used = mark


def flat_chunks(out: Array) -> list[slice]:
    """Chunks of a flattened update, each small enough that its temporaries stay under the chunk size (two
    of them per element; an update with one takes a chunk's worth of scratch too many, which is harmless)."""
    return chunks(out.size, 2 * out.dtype.itemsize, out.nbytes)


def _update_scratch(temporaries: int, scalars: int = 0):  # noqa: ANN202
    def rule(ins: Types, out: TensorType, a: Attrs) -> int:
        chunk = chunk_len(out.numel, 2 * out.dtype.itemsize, out.nbytes) * out.dtype.itemsize
        return buffers(*([8, out.dtype.itemsize] * scalars), *([chunk] * temporaries))

    return rule


def _like_first(ins: Types, a: Attrs) -> TensorType:
    return ins[0]


def _update(name: str, arity: int, flops: int, kernel, temporaries: int = 1, scalars: int = 0) -> OpDef:  # noqa: ANN001
    return OpDef(name, (arity, arity), _like_first, per_element(flops), _flat(kernel), in_place=True,
                 scratch=_update_scratch(temporaries, scalars))


def _flat(kernel):  # noqa: ANN001, ANN202
    """Updates are element-wise over same-shaped tensors: run them on flat views, in chunks."""
    return lambda c, ins, out, a: kernel(c, [x.reshape(-1) for x in ins], out.reshape(-1), a)


# ---- a guarded step: the updates apply only when every gradient is finite; dynamic loss scaling ----------
#
# ``all_finite`` reduces the gradients to one flag (1.0: all finite) on the device; an update op with the
# attribute ``gated`` reads it as an extra last input (``kernels.kernel_of``) and leaves its state as it
# was when the flag is 0. The loss scale follows torch.amp.GradScaler: halved after a step with a
# non-finite gradient, doubled after ``interval`` finite steps in a row.


def _all_finite_infer(ins: Types, a: Attrs) -> TensorType:
    for t in ins:
        if not t.dtype.is_float:
            raise SwpError(f"`all_finite` reads floating-point gradients, got {t}")
    return TensorType((), DType.f32)


def _all_finite(c: KernelContext, ins: list[Array], out: Array, a: Attrs) -> None:
    """out = 1 if every element of every input is finite, else 0: each input times zero, summed, is NaN
    exactly when the input holds a NaN or an infinity; in chunks, into scratch, on the device."""
    xp = c.xp
    acc, part = c.scratch.take((), xp.float32), c.scratch.take((), xp.float32)
    acc.fill(0)
    mark = c.scratch.used
    for x in ins:
        flat = x.reshape(-1)
        for k in flat_chunks(flat):
            t = c.scratch.take(flat[k].shape, flat.dtype)
            xp.multiply(flat[k], flat.dtype.type(0), out=t)
            xp.sum(t, out=part, dtype=xp.float32)
            xp.add(acc, part, out=acc)
            c.scratch.used = mark
    ok = c.scratch.take((), xp.bool_)
    xp.isfinite(acc, out=ok)
    xp.copyto(out, ok, casting="unsafe")


def _all_finite_scratch(ins: Types, out: TensorType, a: Attrs) -> int:
    widest = max((chunk_len(t.numel, 2 * t.dtype.itemsize, t.nbytes) * t.dtype.itemsize for t in ins), default=0)
    return buffers(4, 4, widest, 1)


def _scalar_state(ins: Types, a: Attrs) -> TensorType:
    for t in ins:
        if t.shape != () or t.dtype is not DType.f32:
            raise SwpError(f"loss-scale state is an f32 scalar, got {t}")
    return TensorType((), DType.f32)


def _scale_next(c: KernelContext, ins: list[Array], out: Array, a: Attrs) -> None:
    """scale * backoff after a non-finite step; * growth when this finite step completes ``interval``. Both
    candidates are formed before ``out`` is written: it may be ``scale`` itself (the update runs in place)."""
    xp = c.xp
    scale, good, ok = ins
    grown, backed = c.scratch.take((), xp.float32), c.scratch.take((), xp.float32)
    completes, failed = c.scratch.take((), xp.bool_), c.scratch.take((), xp.bool_)
    xp.add(good, xp.float32(1), out=grown)
    xp.greater_equal(grown, xp.float32(a["interval"]), out=completes)
    xp.not_equal(ok, xp.float32(1), out=failed)
    xp.multiply(scale, xp.float32(a["growth"]), out=grown)
    xp.multiply(scale, xp.float32(a["backoff"]), out=backed)
    xp.copyto(out, scale)  # a no-op in place; into a fresh output (the reference executor's), the scale kept
    xp.copyto(out, grown, where=completes)
    xp.copyto(out, backed, where=failed)


def _good_next(c: KernelContext, ins: list[Array], out: Array, a: Attrs) -> None:
    """The finite steps in a row since the scale last changed: (good + 1) mod interval, 0 after a non-finite one."""
    xp = c.xp
    good, ok = ins
    xp.add(good, xp.float32(1), out=out)
    xp.remainder(out, xp.float32(a["interval"]), out=out)
    xp.multiply(out, ok, out=out)


register(
    OpDef("all_finite", (1, None), _all_finite_infer, lambda ins, out, a: sum(t.numel for t in ins), _all_finite,
          scratch=_all_finite_scratch),
    # in place, as every update of persistent state is (planners keep the new value where the old one was)
    OpDef("loss_scale_next", (3, 3), _scalar_state, lambda ins, out, a: 8, _scale_next, in_place=True,
          scratch=lambda i, o, a: buffers(4, 4, 1, 1)),
    OpDef("good_steps_next", (2, 2), _scalar_state, lambda ins, out, a: 3, _good_next, in_place=True),
)

register(
    _update("sgd", 2, 3, _sgd),
    _update("momentum", 3, 4, _momentum),
    _update("sgd_apply", 2, 2, _sgd_apply),
    _update("adam_m", 3, 5, _adam_m),
    _update("adam_v", 3, 6, _adam_v, temporaries=2),
    _update("adam_apply", 3, 6, _adam_apply, temporaries=2, scalars=2),
)
