"""Optimiser update ops: each step's new parameter and state values.

An update writes its new value into its output, which the plan may place over
the value it replaces; the training graph records which new value replaces
which persistent tensor at the end of a step. Updates run over flat chunks, so
their temporaries stay small whatever the parameter's size.
Weight decay is L2 (added to the gradient) in ``sgd`` and ``adam``, as in torch.optim.SGD and Adam,
and decoupled (the weight shrunk by lr * wd) in ``adamw`` and ``lion``, as in torch.optim.AdamW and
the Lion paper (Chen et al. 2023, Algorithm 2).
A learning-rate schedule (``SCHEDULE``) is read from the device's step counter too: warmup, then
cosine, linear or step decay, as PyTorch's LinearLR, CosineAnnealingLR and StepLR give them.
Every constant is formed in f64 from the hyper-parameters and rounded to the tensor's dtype once:
forming ``1 - beta2`` in f32 would scale Adam's second moment by a factor other than 1. Adam's bias
correction reads the step from the device's counter, so a step replays without the host.
"""

from __future__ import annotations

from typing import Any

from swapdsl.common.errors import SwpError
from swapdsl.graph.ir import DType, TensorType
from swapdsl.graph.ops.registry import (
    Array, Attrs, KernelContext, OpDef, Types, buffers, chunk_len, chunks, parts, per_element, register,
)


def _decayed(c: KernelContext, g: Array, w: Array, a: Attrs, out: Array) -> Array:
    """g + wd * w into ``out`` (or g itself when there is no weight decay)."""
    wd = a.get("weight_decay", 0.0)
    if not wd:
        return g
    c.xp.multiply(w, w.dtype.type(wd), out=out)
    c.xp.add(g, out, out=out)
    return out


# the schedule's attributes and their defaults (an update op carries those that differ); 0 is off
SCHEDULE = {"warmup": 0, "cosine": 0, "linear": 0, "step_every": 0, "gamma": 0.1, "min_lr": 0.0}


def learning_rate(c: KernelContext, a: Attrs, dtype: Any) -> Any:
    """This step's learning rate: ``lr`` as it is without a schedule; else formed in f64 from the device's
    step counter and rounded to ``dtype`` once. With e the steps before this one (PyTorch's epoch count):
    lr * min(1, (e + 1) / warmup), times the decay after the warmup, over p = (e - warmup) / (T - warmup)
    clipped to [0, 1]: cosine to ``min_lr`` at T (``cosine = T``), linear to ``min_lr`` at T
    (``linear = T``), or ``gamma`` every ``step_every`` steps."""
    if not any(k in a for k in SCHEDULE):
        return dtype.type(a["lr"])
    xp, s = c.xp, {**SCHEDULE, **{k: a[k] for k in SCHEDULE if k in a}}
    e, f, rate = c.scratch.take((), xp.float64), c.scratch.take((), xp.float64), c.scratch.take((), xp.float64)
    xp.subtract(c.step, 1, out=e)
    lr, low = xp.float64(a["lr"]), xp.float64(s["min_lr"])
    rate.fill(a["lr"])
    end = s["cosine"] or s["linear"]
    if end:
        xp.subtract(e, s["warmup"], out=f)
        xp.clip(xp.divide(f, xp.float64(end - s["warmup"]), out=f), 0.0, 1.0, out=f)
        if s["cosine"]:
            xp.multiply(f, xp.float64(xp.pi), out=f)
            xp.cos(f, out=f)
            xp.add(f, 1.0, out=f)
            xp.multiply(f, 0.5 * (lr - low), out=f)
            xp.add(f, low, out=rate)
        else:
            xp.multiply(f, low - lr, out=f)
            xp.add(f, lr, out=rate)
    elif s["step_every"]:
        xp.subtract(e, s["warmup"], out=f)
        xp.maximum(f, 0.0, out=f)
        xp.floor_divide(f, xp.float64(s["step_every"]), out=f)
        xp.power(xp.float64(s["gamma"]), f, out=f)
        xp.multiply(rate, f, out=rate)
    if s["warmup"]:
        xp.add(e, 1.0, out=f)
        xp.divide(f, xp.float64(s["warmup"]), out=f)
        xp.minimum(f, 1.0, out=f)
        xp.multiply(rate, f, out=rate)
    rounded = c.scratch.take((), dtype)
    xp.copyto(rounded, rate, casting="unsafe")
    return rounded


def _sgd(c: KernelContext, ins: list[Array], out: Array, a: Attrs) -> None:
    w, g = ins
    lr = learning_rate(c, a, w.dtype)
    mark = c.scratch.used
    for k in flat_chunks(out):
        wk, o = parts(w, out, k)
        t = c.scratch.take(o.shape, out.dtype)
        c.xp.multiply(lr, _decayed(c, g[k], wk, a, t), out=t)
        c.xp.subtract(wk, t, out=o)
        c.scratch.used = mark


def _momentum(c: KernelContext, ins: list[Array], out: Array, a: Attrs) -> None:
    m, g, w = ins
    for k in flat_chunks(out):
        mk, o = parts(m, out, k)
        t = c.scratch.take(o.shape, out.dtype)
        d = _decayed(c, g[k], w[k], a, t)
        c.xp.multiply(mk, m.dtype.type(a["momentum"]), out=o)
        c.xp.add(o, d, out=o)
        c.scratch.reset()


def _sgd_apply(c: KernelContext, ins: list[Array], out: Array, a: Attrs) -> None:
    w, m = ins
    lr = learning_rate(c, a, w.dtype)
    mark = c.scratch.used
    for k in flat_chunks(out):
        wk, o = parts(w, out, k)
        t = c.scratch.take(o.shape, out.dtype)
        c.xp.multiply(lr, m[k], out=t)
        c.xp.subtract(wk, t, out=o)
        c.scratch.used = mark


def _nesterov_apply(c: KernelContext, ins: list[Array], out: Array, a: Attrs) -> None:
    """w - lr * (d + momentum * m), d = g + wd * w: SGD with Nesterov momentum as torch.optim.SGD has it."""
    w, m, g = ins
    lr = learning_rate(c, a, w.dtype)
    mark = c.scratch.used
    for k in flat_chunks(out):
        wk, o = parts(w, out, k)
        t, u = c.scratch.take(o.shape, out.dtype), c.scratch.take(o.shape, out.dtype)
        d = _decayed(c, g[k], wk, a, t)
        c.xp.multiply(m[k], w.dtype.type(a["momentum"]), out=u)
        c.xp.add(d, u, out=u)
        c.xp.multiply(lr, u, out=u)
        c.xp.subtract(wk, u, out=o)
        c.scratch.used = mark


def _lion_apply(c: KernelContext, ins: list[Array], out: Array, a: Attrs) -> None:
    """w * (1 - lr * wd) - lr * sign(beta1 * m + (1 - beta1) * g) (Lion, Chen et al. 2023)."""
    w, m, g = ins
    xp = c.xp
    lr = learning_rate(c, a, w.dtype)
    wd = a.get("decoupled_wd", 0.0)
    if wd:
        keep = c.scratch.take((), w.dtype)
        xp.multiply(lr, w.dtype.type(wd), out=keep)
        xp.subtract(w.dtype.type(1), keep, out=keep)
    mark = c.scratch.used
    for k in flat_chunks(out):
        wk, o = parts(w, out, k)
        t, u = c.scratch.take(o.shape, out.dtype), c.scratch.take(o.shape, out.dtype)
        xp.multiply(g[k], w.dtype.type(1.0 - a["beta1"]), out=t)
        xp.multiply(m[k], w.dtype.type(a["beta1"]), out=u)
        xp.add(t, u, out=t)
        xp.sign(t, out=t)
        xp.multiply(lr, t, out=t)
        if wd:
            xp.multiply(wk, keep, out=u)
            xp.subtract(u, t, out=o)
        else:
            xp.subtract(wk, t, out=o)
        c.scratch.used = mark


def _lion_m(c: KernelContext, ins: list[Array], out: Array, a: Attrs) -> None:
    """beta2 * m + (1 - beta2) * g: Lion's momentum, updated after the weight read the old one."""
    m, g = ins
    for k in flat_chunks(out):
        mk, o = parts(m, out, k)
        t = c.scratch.take(o.shape, out.dtype)
        c.xp.multiply(g[k], m.dtype.type(1.0 - a["beta2"]), out=t)
        c.xp.multiply(mk, m.dtype.type(a["beta2"]), out=o)
        c.xp.add(o, t, out=o)
        c.scratch.reset()


def _adam_m(c: KernelContext, ins: list[Array], out: Array, a: Attrs) -> None:
    m, g, w = ins
    for k in flat_chunks(out):
        mk, o = parts(m, out, k)
        t = c.scratch.take(o.shape, out.dtype)
        d = _decayed(c, g[k], w[k], a, t)
        c.xp.multiply(m.dtype.type(1.0 - a["beta1"]), d, out=t)
        c.xp.multiply(m.dtype.type(a["beta1"]), mk, out=o)
        c.xp.add(o, t, out=o)
        c.scratch.reset()


def _adam_v(c: KernelContext, ins: list[Array], out: Array, a: Attrs) -> None:
    v, g, w = ins
    for k in flat_chunks(out):
        vk, o = parts(v, out, k)
        t, u = c.scratch.take(o.shape, out.dtype), c.scratch.take(o.shape, out.dtype)
        d = _decayed(c, g[k], w[k], a, t)
        c.xp.multiply(v.dtype.type(1.0 - a["beta2"]), d, out=u)
        c.xp.multiply(u, d, out=u)
        c.xp.multiply(v.dtype.type(a["beta2"]), vk, out=o)
        c.xp.add(o, u, out=o)
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
    """w * (1 - lr * wd) - lr * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps); wd is AdamW's decoupled
    weight decay (``decoupled_wd``; Adam's own is L2, in ``adam_m`` and ``adam_v``)."""
    w, m, v = ins
    xp = c.xp
    c1, c2 = bias_correction(c, a["beta1"], m.dtype), bias_correction(c, a["beta2"], v.dtype)
    lr = learning_rate(c, a, w.dtype)
    wd = a.get("decoupled_wd", 0.0)
    keep = decay_kept(c, lr, wd, w.dtype)
    mark = c.scratch.used
    for k in flat_chunks(out):
        wk, o = parts(w, out, k)
        t, u = c.scratch.take(o.shape, out.dtype), c.scratch.take(o.shape, out.dtype)
        xp.multiply(v[k], c2, out=t)
        xp.sqrt(t, out=t)
        xp.add(t, w.dtype.type(a["eps"]), out=t)
        xp.multiply(m[k], c1, out=u)
        xp.multiply(lr, u, out=u)
        xp.divide(u, t, out=u)
        if wd:
            xp.multiply(wk, keep, out=t)
            xp.subtract(t, u, out=o)
        else:
            xp.subtract(wk, u, out=o)
        c.scratch.used = mark


def decay_kept(c: KernelContext, lr: Any, wd: float, dtype: Any) -> Any:
    """1 - lr * wd, what of a weight decoupled weight decay keeps this step, in ``dtype`` (1: no decay)."""
    if not wd:
        return dtype.type(1)
    keep = c.scratch.take((), dtype)
    c.xp.multiply(lr, dtype.type(wd), out=keep)
    c.xp.subtract(dtype.type(1), keep, out=keep)
    return keep


def flat_chunks(out: Array) -> list[slice]:
    """Chunks of a flattened update, each small enough that its temporaries stay under the chunk size (two
    of them per element; an update with one takes a chunk's worth of scratch too many, which is harmless)."""
    return chunks(out.size, 2 * out.dtype.itemsize, out.nbytes)


def _update_scratch(temporaries: int, scalars: int = 0, lr: bool = False):  # noqa: ANN202
    """``scalars`` pairs of an f64 and a rounded scalar (bias corrections); with ``lr``, what
    ``learning_rate`` takes (three f64 and a rounded scalar) and the decoupled decay's factor."""
    def rule(ins: Types, out: TensorType, a: Attrs) -> int:
        chunk = chunk_len(out.numel, 2 * out.dtype.itemsize, out.nbytes) * out.dtype.itemsize
        scheduled = lr and (any(k in a for k in SCHEDULE) or a.get("decoupled_wd"))
        rate = [8, 8, 8, out.dtype.itemsize, out.dtype.itemsize] if scheduled else []
        return buffers(*([8, out.dtype.itemsize] * scalars), *rate, *([chunk] * temporaries))

    return rule


def _like_first(ins: Types, a: Attrs) -> TensorType:
    return ins[0]


def _update(name: str, arity: int, flops: int, kernel, temporaries: int = 1, scalars: int = 0,  # noqa: ANN001
            lr: bool = False) -> OpDef:
    return OpDef(name, (arity, arity), _like_first, per_element(flops), _flat(kernel), in_place=True,
                 scratch=_update_scratch(temporaries, scalars, lr))


def _flat(kernel):  # noqa: ANN001, ANN202
    """Updates are element-wise over same-shaped tensors: run them on flat views, in chunks. An update in
    place (its output the first input's object) keeps that identity in the flat views."""
    def run(c: KernelContext, ins: list[Array], out: Array, a: Attrs) -> None:
        flat = [x.reshape(-1) for x in ins]
        kernel(c, flat, flat[0] if out is ins[0] else out.reshape(-1), a)

    return run


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


def _sum_squares(c: KernelContext, ins: list[Array], out: Array, a: Attrs) -> None:
    """The sum of the squares of a gradient's elements, in ``out``'s type, a chunk at a time: one per
    gradient, so that clipping never needs every gradient on the device at once."""
    xp = c.xp
    part = c.scratch.take((), out.dtype)
    out.fill(0)
    mark = c.scratch.used
    flat = ins[0].reshape(-1)
    for k in flat_chunks(flat):
        t = c.scratch.take(flat[k].shape, out.dtype)
        xp.multiply(flat[k], flat[k], out=t, dtype=out.dtype)
        xp.sum(t, out=part)
        xp.add(out, part, out=out)
        c.scratch.used = mark


def _sum_squares_scratch(ins: Types, out: TensorType, a: Attrs) -> int:
    t = ins[0]
    return buffers(8, chunk_len(t.numel, 2 * t.dtype.itemsize, t.nbytes) * 8)


def _global_norm(c: KernelContext, ins: list[Array], out: Array, a: Attrs) -> None:
    """The square root of the sum of the gradients' ``sum_squares``: their L2 norm all at once."""
    out.fill(0)
    for x in ins:
        c.xp.add(out, x, out=out)
    c.xp.sqrt(out, out=out)


def _clip_factor(c: KernelContext, ins: list[Array], out: Array, a: Attrs) -> None:
    """min(1, max_norm / (norm + 1e-6)), as torch.nn.utils.clip_grad_norm_ forms it."""
    xp = c.xp
    xp.add(ins[0], out.dtype.type(1e-6), out=out)
    xp.divide(out.dtype.type(a["max_norm"]), out, out=out)
    xp.minimum(out, out.dtype.type(1), out=out)


def _norm_infer(ins: Types, a: Attrs) -> TensorType:
    for t in ins:
        if not t.dtype.is_float:
            raise SwpError(f"a gradient norm reads floating-point tensors, got {t}")
    return TensorType((), DType.f64 if all(t.dtype is DType.f64 for t in ins) else DType.f32)


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
    OpDef("sum_squares", (1, 1), _norm_infer, lambda ins, out, a: 2 * ins[0].numel, _sum_squares,
          scratch=_sum_squares_scratch),
    OpDef("global_norm", (1, None), _norm_infer, lambda ins, out, a: len(ins) + 1, _global_norm),
    OpDef("clip_factor", (1, 1), _norm_infer, lambda ins, out, a: 3, _clip_factor),
)

register(
    _update("sgd", 2, 3, _sgd, lr=True),
    _update("momentum", 3, 4, _momentum),
    _update("sgd_apply", 2, 2, _sgd_apply, lr=True),
    _update("nesterov_apply", 3, 6, _nesterov_apply, temporaries=2, lr=True),
    _update("adam_m", 3, 5, _adam_m),
    _update("adam_v", 3, 6, _adam_v, temporaries=2),
    _update("adam_apply", 3, 8, _adam_apply, temporaries=2, scalars=2, lr=True),
    _update("lion_apply", 3, 7, _lion_apply, temporaries=2, lr=True),
    _update("lion_m", 2, 3, _lion_m),
)
