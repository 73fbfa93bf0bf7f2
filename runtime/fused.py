"""Fused kernels on CuPy: one CUDA kernel per op, or per chain of element-wise work, instead of ufuncs.

The op's own kernel (graph/ops) is a sequence of NumPy-style ufuncs, each a
kernel launch and a pass over memory. On CuPy the element-wise ops in
``FUSED`` run as one ``cupy.ElementwiseKernel`` each, reading their inputs
once and writing their output once, with no temporaries (``max_pool2d_grad``
reads its inputs whole, one thread per output element); the batch-norm ops
in ``COMPOSITE`` keep their own statistics and fuse the passes around them. Each is checked once
when a plan is loaded, on small random inputs against the op's own kernel on
the same device; one that differs or fails to compile is not used, and the
run says so. NumPy keeps the ufunc kernels: they are the reference.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import attrs
import numpy as np

from swapdsl.graph.ir import Graph, TensorType
from swapdsl.graph.ops import REGISTRY
from swapdsl.graph.ops.elementwise import dropout_constants, element_offset, step_key
from swapdsl.graph.ops.optim import bias_correction, decay_kept, learning_rate
from swapdsl.graph.ops.kernels import is_half
from swapdsl.graph.ops.loss import labelled, logit_rows
from swapdsl.graph.ops.nn import norm_sum, norm_tiles, reduced_shape
from swapdsl.graph.ops.registry import Array, Attrs, Kernel, KernelContext, np_dtype
from swapdsl.runtime.backend import separate_pool

_PREAMBLE = f"""
#define GELU_K {math.sqrt(2.0 / math.pi)!r}
#define GELU_C 0.044715
__device__ unsigned int fmix32(unsigned int h) {{
    h ^= h >> 16; h *= 0x85EBCA6Bu; h ^= h >> 13; h *= 0xC2B2AE35u; h ^= h >> 16; return h;
}}
"""

Scalars = Callable[[KernelContext, list[Array], Attrs], tuple[Any, ...]]


def _none(c: KernelContext, ins: list[Array], a: Attrs) -> tuple[Any, ...]:
    return ()


@attrs.frozen
class Fused:
    """An op as one element-wise kernel: its parameters (inputs, then scalars), its body writing ``y``, and
    the scalars' values for a call. ``shaped``: the kernel reads its inputs whole (``raw``), one thread per
    output element, and is checked on the op's own shapes (the batch cut to 2) rather than on vectors."""

    params: str
    body: str
    scalars: Scalars = _none
    shaped: bool = False


def _typed(ins: list[Array], *values: float) -> tuple[Any, ...]:
    return tuple(ins[0].dtype.type(v) for v in values)


def _decay(a: Attrs) -> float:
    return a.get("weight_decay", 0.0)


def _dropout_scalars(c: KernelContext, ins: list[Array], a: Attrs) -> tuple[Any, ...]:
    # (offset: where a micro-batch's elements start in the whole batch's, as the op's own kernel counts)
    return (step_key(c, a["seed"]), *dropout_constants(a["p"], ins[0].dtype), np.int64(element_offset(c, a)))


def _lr(c: KernelContext, ins: list[Array], a: Attrs) -> Any:
    """This step's learning rate, as the op's own kernel takes it (a schedule's: from the step counter, on
    the device; a 0-d array is a scalar argument CuPy broadcasts)."""
    return learning_rate(c, a, ins[0].dtype)


def _adam_apply_scalars(c: KernelContext, ins: list[Array], a: Attrs) -> tuple[Any, ...]:
    w, m, v = ins
    c1, c2, lr = bias_correction(c, a["beta1"], m.dtype), bias_correction(c, a["beta2"], v.dtype), _lr(c, ins, a)
    return c1, c2, lr, w.dtype.type(a["eps"]), decay_kept(c, lr, a.get("decoupled_wd", 0.0), w.dtype)


def _pool_scalars(c: KernelContext, ins: list[Array], a: Attrs) -> tuple[Any, ...]:
    x, g = ins
    return tuple(np.int32(v) for v in (*a["kernel"], *a["stride"], *a["padding"], *x.shape[2:], *g.shape[2:]))


# max_pool2d's gradient, gathered: each input pixel sums the gradients of the windows whose first maximum
# (NumPy's max, a NaN winning; taps in row-major order) it is, in the order the op's own kernel adds its
# taps. No atomics, so the result is the same bits every run.
_MAX_POOL_GRAD = """
    const long long w_ = W, h_ = H;
    long long t = i / w_;
    const int iw = (int)(i % w_), ih = (int)(t % h_);
    t /= h_;
    const long long xb = t * h_ * w_, gb = t * (long long)OH * OW;
    const T lowest = (T)__int_as_float(0xff800000);
    T acc = (T)0;
    for (int a = 0; a < KH; ++a) {
        const int r0 = ih + PH - a;
        if (r0 < 0 || r0 % SH || r0 / SH >= OH) continue;
        for (int b = 0; b < KW; ++b) {
            const int c0 = iw + PW - b;
            if (c0 < 0 || c0 % SW || c0 / SW >= OW) continue;
            const int oh = r0 / SH, ow = c0 / SW;
            T m = lowest;
            for (int u = 0; u < KH; ++u) for (int v = 0; v < KW; ++v) {
                const int r = oh * SH + u - PH, q = ow * SW + v - PW;
                const T val = (r >= 0 && r < H && q >= 0 && q < W) ? x[xb + r * w_ + q] : lowest;
                if (val > m || val != val) m = val;
            }
            int first = -1;
            for (int u = 0; u < KH && first < 0; ++u) for (int v = 0; v < KW; ++v) {
                const int r = oh * SH + u - PH, q = ow * SW + v - PW;
                const T val = (r >= 0 && r < H && q >= 0 && q < W) ? x[xb + r * w_ + q] : lowest;
                if (val == m) { first = u * KW + v; break; }
            }
            if (first == a * KW + b) acc += g[gb + (long long)oh * OW + ow];
        }
    }
    y = acc;"""

# Each body follows the op's own kernel's order of operations, so results agree to rounding.
FUSED: dict[str, Fused] = {
    "gelu": Fused("T x", "T t = tanh(((x + x * (T)GELU_C * x * x)) * (T)GELU_K); y = (t + (T)1) * x * (T)0.5;"),
    "gelu_grad": Fused("T x, T g", """
        T t = tanh((x + x * (T)GELU_C * x * x) * (T)GELU_K);
        T u = x * (T)0.5 * ((T)1 - t * t) * (T)GELU_K * (x * (T)(3.0 * GELU_C) * x + (T)1);
        y = ((t + (T)1) * (T)0.5 + u) * g;"""),
    "sigmoid": Fused("T x", "T e = exp(-abs(x)); y = (x >= (T)0 ? (T)1 : e) / (e + (T)1);"),
    "sigmoid_grad": Fused("T s, T g", "y = ((T)1 - s) * s * g;"),
    "tanh_grad": Fused("T t, T g", "y = g * ((T)1 - t * t);"),
    "relu_grad": Fused("T r, T g", "y = g * (T)(r > (T)0);"),
    "dropout": Fused("T x, uint32 key, uint32 thr, T scale, int64 offset", """
        unsigned int h = fmix32(((unsigned int)(i + offset) + 1u) * 0x9E3779B1u ^ key);
        y = h >= thr ? (T)(x * scale) : (T)0;""", _dropout_scalars),
    "sgd": Fused("T w, T g, T lr, T wd", "y = w - lr * (g + w * wd);",
                 lambda c, ins, a: (_lr(c, ins, a), *_typed(ins, _decay(a)))),
    "momentum": Fused("T m, T g, T w, T mu, T wd", "y = m * mu + (g + w * wd);",
                      lambda c, ins, a: _typed(ins, a["momentum"], _decay(a))),
    "sgd_apply": Fused("T w, T m, T lr", "y = w - lr * m;", lambda c, ins, a: (_lr(c, ins, a),)),
    "adam_m": Fused("T m, T g, T w, T b1, T one_b1, T wd", "y = b1 * m + one_b1 * (g + w * wd);",
                    lambda c, ins, a: _typed(ins, a["beta1"], 1.0 - a["beta1"], _decay(a))),
    "adam_v": Fused("T v, T g, T w, T b2, T one_b2, T wd", "T d = g + w * wd; y = b2 * v + one_b2 * d * d;",
                    lambda c, ins, a: _typed(ins, a["beta2"], 1.0 - a["beta2"], _decay(a))),
    # (keep: AdamW's 1 - lr * wd, exactly 1 without it, so that w * keep is w)
    "adam_apply": Fused("T w, T m, T v, T c1, T c2, T lr, T eps, T keep",
                        "y = w * keep - lr * (m * c1) / (sqrt(v * c2) + eps);", _adam_apply_scalars),
    "max_pool2d_grad": Fused("raw T x, raw T g, int32 KH, int32 KW, int32 SH, int32 SW, int32 PH, int32 PW, "
                             "int32 H, int32 W, int32 OH, int32 OW", _MAX_POOL_GRAD, _pool_scalars, shaped=True),
}


# ---- normalisation: the op's own statistics around fused element-wise passes --------------------------
#
# batch_norm, layer_norm and rms_norm, their gradients and batch norm's scale gradient, as their own kernels
# compute them (tiles, two-pass statistics, graph/ops/nn.py's sums), each chain of element-wise ufuncs made
# one kernel. Batch norm forward: 6 passes over a tile where the ufuncs made 12; its gradient 12 where
# they made about 22 (each read or write of a tile-sized array counted once). The gradients' means are
# taken of g k and of g k (x - mean), 1/std multiplied in after (for batch norm, whose scale k is constant
# over what it reduces, of g and k after), which rounds differently from the op's own kernel (within the
# load-time check's 1e-5). RMS norm is the same with no mean taken out.

PIECES: dict[str, tuple[str, str]] = {  # name: (parameters, body writing y), all of one element each
    "sqdev": ("T x, T m", "T d = x - m; y = d * d;"),
    "norm_out": ("T x, T m, T s, T k, T b", "y = (x - m) * s * k + b;"),
    "rms_out": ("T x, T s, T k", "y = x * s * k;"),
    "gk": ("T g, T k", "y = g * k;"),
    "gkdev": ("T x, T m, T g, T k", "y = g * k * (x - m);"),
    "gdev": ("T x, T m, T g", "y = g * (x - m);"),
    "norm_dx": ("T x, T g, T m, T s, T k, T m1, T m2", "y = s * ((g * k - m1) - (x - m) * s * m2);"),
    # softmax's (the op's order of operations, each a pass over the rows where the ufuncs made two or three)
    "expdev": ("T x, T m", "y = exp(x - m);"),
    "over": ("T e, T s", "y = e / s;"),
    "over_scaled": ("T e, T s, T k", "y = e / s * k;"),
    "log_out": ("T x, T m, T t", "y = x - m - t;"),
    "times": ("T g, T p", "y = g * p;"),
    "softmax_dx": ("T p, T g, T r", "y = p * (g - r);"),
    "log_softmax_dx": ("T p, T g, T r", "y = g - exp(p) * r;"),
}
Elementwise = Callable[[str, str, str], Callable[..., Any]]  # (parameters, body, name) -> kernel(*ins, out)


def _cupy_elementwise(xp: Any) -> Elementwise:
    return lambda params, body, name: xp.ElementwiseKernel(params, "T y", body, f"swapdsl_{name}",
                                                           preamble=_PREAMBLE)


def _pieces(ew: Elementwise, *names: str) -> list[Any]:
    return [ew(*PIECES[n], n) for n in names]


def _stats(c: KernelContext, xc: Array, axes: tuple[int, ...], t: Array, sqdev: Any, eps: float,
           centered: bool) -> tuple[Array, Array]:
    """A tile's mean (zeros when not ``centered``) and 1 / sqrt(var + eps), kept dims, two-pass, ``t`` its
    scratch."""
    xp = c.xp
    red = tuple(1 if i in axes else d for i, d in enumerate(xc.shape))
    m, s = (c.scratch.take(red, xc.dtype) for _ in range(2))
    if centered:
        norm_sum(c, xc, axes, m, mean=True)
    else:
        m.fill(0)
    sqdev(xc, m, t)
    norm_sum(c, t, axes, s, mean=True)
    xp.add(s, s.dtype.type(eps), out=s)
    xp.sqrt(s, out=s)
    xp.divide(s.dtype.type(1.0), s, out=s)
    return m, s


def _norm_forward(kind: str) -> Callable[[Any, Elementwise], Kernel]:
    def build(xp: Any, ew: Elementwise) -> Kernel:
        sqdev, affine, scaled = _pieces(ew, "sqdev", "norm_out", "rms_out")

        def kernel(c: KernelContext, ins: list[Array], out: Array, a: Attrs) -> None:
            x, scale, *shift = ins  # RMS norm has no shift
            axes, tiles = norm_tiles(kind, x, [out, scale, *shift], 2, scale.ndim)
            for _, (xc, oc, kc, *bc) in tiles:
                m, s = _stats(c, xc, axes, c.scratch.take(xc.shape, xc.dtype), sqdev, a["eps"], kind != "rms")
                if bc:
                    affine(xc, m, s, kc, bc[0], oc)
                else:
                    scaled(xc, s, kc, oc)
                c.scratch.reset()

        return kernel

    return build


def _norm_grad(kind: str) -> Callable[[Any, Elementwise], Kernel]:
    def build(xp: Any, ew: Elementwise) -> Kernel:
        sqdev, gk, gkdev, dx = _pieces(ew, "sqdev", "gk", "gkdev", "norm_dx")

        def kernel(c: KernelContext, ins: list[Array], out: Array, a: Attrs) -> None:
            x, scale, g = ins
            axes, tiles = norm_tiles(kind, x, [g, out, scale], 4, scale.ndim)
            for _, (xc, gc, oc, kc) in tiles:
                t = c.scratch.take(xc.shape, xc.dtype)
                m, s = _stats(c, xc, axes, t, sqdev, a["eps"], kind != "rms")
                m1, m2 = (c.scratch.take(m.shape, m.dtype) for _ in range(2))
                if kind == "rms":
                    m1.fill(0)  # (no mean was taken out, so none comes back)
                elif kind == "batch":  # the scale is one number per statistic: mean(g) k
                    norm_sum(c, gc, axes, m1, mean=True)
                    xp.multiply(m1, kc, out=m1)
                else:
                    gk(gc, kc, t)
                    norm_sum(c, t, axes, m1, mean=True)
                gkdev(xc, m, gc, kc, t)
                norm_sum(c, t, axes, m2, mean=True)
                xp.multiply(m2, s, out=m2)  # mean(g k xhat)
                dx(xc, gc, m, s, kc, m1, m2, oc)
                c.scratch.reset()

        return kernel

    return build


def _bn_dscale(xp: Any, ew: Elementwise) -> Kernel:
    sqdev, gdev = _pieces(ew, "sqdev", "gdev")

    def kernel(c: KernelContext, ins: list[Array], out: Array, a: Attrs) -> None:
        x, g = ins
        axes, tiles = norm_tiles("batch", x, [g], 2)
        for k, (xc, gc) in tiles:
            t = c.scratch.take(xc.shape, xc.dtype)
            m, s = _stats(c, xc, axes, t, sqdev, a["eps"], True)
            gdev(xc, m, gc, t)
            part = out.reshape(1, -1, 1)[:, k]
            norm_sum(c, t, axes, part)
            xp.multiply(part, s, out=part)  # sum(g * xhat) = sum(g (x - mean)) / std
            c.scratch.reset()

    return kernel


# ---- softmax: the op's own row maxima and sums around fused element-wise passes ------------------------
#
# Passes over the rows (each read or write of a row-sized array counted once): softmax 6 where the ufuncs
# made 8, log-softmax 6 where 10, their gradients 7 where 9 and 4 where 8, cross-entropy's gradient 6 where
# 10 (its labelled entries, one a row, still by take and put). Its gradient scales before it takes the
# label's 1 away (times the scale, so it rounds differently from the op's own kernel, within the check's).


def _softmax(xp: Any, ew: Elementwise) -> Kernel:
    expdev, over = _pieces(ew, "expdev", "over")

    def kernel(c: KernelContext, ins: list[Array], out: Array, a: Attrs) -> None:
        (x,), axis = ins, a["axis"]
        r = c.scratch.take(reduced_shape(x, axis), x.dtype)
        xp.max(x, axis=axis, keepdims=True, out=r)
        expdev(x, r, out)
        xp.sum(out, axis=axis, keepdims=True, out=r)
        over(out, r, out)  # (in place: each thread reads its element, then writes it)

    return kernel


def _log_softmax(xp: Any, ew: Elementwise) -> Kernel:
    expdev, log_out = _pieces(ew, "expdev", "log_out")

    def kernel(c: KernelContext, ins: list[Array], out: Array, a: Attrs) -> None:
        (x,), axis = ins, a["axis"]
        m, total = (c.scratch.take(reduced_shape(x, axis), x.dtype) for _ in range(2))
        xp.max(x, axis=axis, keepdims=True, out=m)
        expdev(x, m, out)
        xp.sum(out, axis=axis, keepdims=True, out=total)
        xp.log(total, out=total)
        log_out(x, m, total, out)

    return kernel


def _softmax_grad(log: bool) -> Callable[[Any, Elementwise], Kernel]:
    """y (g - sum(g y)), or for log-softmax g - exp(y) sum(g)."""
    def build(xp: Any, ew: Elementwise) -> Kernel:
        times, dx = _pieces(ew, "times", "log_softmax_dx" if log else "softmax_dx")

        def kernel(c: KernelContext, ins: list[Array], out: Array, a: Attrs) -> None:
            (y, g), axis = ins, a["axis"]
            r = c.scratch.take(reduced_shape(y, axis), y.dtype)
            if not log:
                times(g, y, out)
            xp.sum(g if log else out, axis=axis, keepdims=True, out=r)
            dx(y, g, r, out)

        return kernel

    return build


def _xent_grad(xp: Any, ew: Elementwise) -> Kernel:
    """(softmax(z) - onehot(label)) g / rows."""
    expdev, over_scaled = _pieces(ew, "expdev", "over_scaled")

    def kernel(c: KernelContext, ins: list[Array], out: Array, a: Attrs) -> None:
        logits, labels, g = ins
        z, y = logit_rows(logits, labels)
        p = out.reshape(z.shape)
        m = c.scratch.take((z.shape[0], 1), z.dtype)
        xp.max(z, axis=1, keepdims=True, out=m)
        expdev(z, m, p)
        xp.sum(p, axis=1, keepdims=True, out=m)
        index, picked = labelled(c, z, y, slice(0, z.shape[0]))
        scale = c.scratch.take((), g.dtype)
        xp.divide(g, z.shape[0], out=scale)
        over_scaled(p, m, scale, p)
        xp.take(p.reshape(-1), index, out=picked)
        xp.subtract(picked, scale, out=picked)
        xp.put(p.reshape(-1), index, picked)

    return kernel


COMPOSITE: dict[str, Callable[[Any, Elementwise], Kernel]] = {
    "batch_norm": _norm_forward("batch"), "batch_norm_grad": _norm_grad("batch"), "batch_norm_dscale": _bn_dscale,
    "layer_norm": _norm_forward("layer"), "layer_norm_grad": _norm_grad("layer"),
    "rms_norm": _norm_forward("rms"), "rms_norm_grad": _norm_grad("rms"),
    "softmax": _softmax, "log_softmax": _log_softmax, "softmax_grad": _softmax_grad(False),
    "log_softmax_grad": _softmax_grad(True), "softmax_cross_entropy_grad": _xent_grad,
}


def fused_kernel(xp: Any, name: str, elementwise: Elementwise | None = None) -> Kernel:
    """The op's fused kernel (compiled on first use; ``elementwise`` builds the element-wise pieces of a
    composite one, CuPy's ``ElementwiseKernel`` unless given)."""
    if name in COMPOSITE:
        return COMPOSITE[name](xp, elementwise or _cupy_elementwise(xp))
    f = FUSED[name]
    ek = xp.ElementwiseKernel(f.params, "T y", f.body, f"swapdsl_{name}", preamble=_PREAMBLE)

    def run(c: KernelContext, ins: list[Array], out: Array, a: Attrs) -> None:
        if f.shaped and not all(x.flags.c_contiguous for x in (*ins, out)):
            REGISTRY[name].kernel(c, ins, out, a)  # raw reads index the memory as C-ordered
            return
        ek(*ins, *f.scalars(c, ins, a), out)

    return run


@attrs.define
class FusedKernels:
    """The fused kernels a plan's ops use (op index -> kernel), and what was not used and why."""

    kernels: dict[int, Kernel] = attrs.field(factory=dict)
    notes: list[str] = attrs.field(factory=list)

    @staticmethod
    def load(g: Graph, xp: Any) -> FusedKernels:
        """Each fused op checked once per (op, dtype, attributes) against its own kernel, then used."""
        found = FusedKernels()
        checked: dict[tuple[str, str, str], Kernel | None] = {}
        own_pool = separate_pool(xp)  # the checks' arrays stay out of the memory a run reports holding
        for i, op in enumerate(g.ops):
            if ((op.op not in FUSED and op.op not in COMPOSITE) or op.attr_dict.get("gated")
                    or any(is_half(g.type_of(n)) for n in (*op.inputs, *op.outputs))):
                continue  # half tensors or a gated update: kernels.kernel_of's wrapping of the op's own kernel
            shaped = op.op in COMPOSITE or FUSED[op.op].shaped
            first = g.type_of(op.inputs[0])
            types = tuple(_example(t, shaped, t.rank == first.rank and t.shape[:1] == first.shape[:1])
                          for t in map(g.type_of, op.inputs))
            key = (op.op, repr(types), repr(sorted(op.attr_dict.items())))
            if key not in checked:
                with own_pool():
                    checked[key] = _checked(xp, op.op, types, op.attr_dict, found.notes)
            if checked[key] is not None:
                found.kernels[i] = checked[key]
        return found


def _example(t: TensorType, shaped: bool, batched: bool) -> TensorType:
    """What a fused kernel is checked on for an input of type ``t``: 4096 elements, or (``shaped``) ``t``
    with at most 2 in its first dimension where that is the batch's (``batched``: as the op's first input's)."""
    if not shaped:
        return TensorType((4096,), t.dtype)
    return TensorType((min(t.shape[0], 2), *t.shape[1:]), t.dtype) if batched and t.rank > 1 else t


CHECKED_STEPS = (3, 1000)  # early and late: what depends on the step (a schedule, bias correction) is held too


def _checked(xp: Any, name: str, types: tuple[TensorType, ...], a: Attrs, notes: list[str]) -> Kernel | None:
    """The fused kernel, if it matches the op's own kernel on random inputs (to 1e-5 relative), at each of
    ``CHECKED_STEPS``."""
    rng = np.random.default_rng(0)
    dtype = types[0].dtype.label
    ins = [xp.asarray(rng.uniform(0.1, 0.9, t.shape).astype(np_dtype(np, t.dtype.label))) for t in types]
    try:
        out_type = REGISTRY[name].infer(types, a)
        want, got = (xp.empty(out_type.shape, dtype=ins[0].dtype) for _ in range(2))
        kernel = fused_kernel(xp, name)
        worst = 0.0
        for step in CHECKED_STEPS:
            for k, out in ((REGISTRY[name].kernel, want), (kernel, got)):
                scratch = max(1 << 20, REGISTRY[name].scratch(types, out_type, a))
                k(KernelContext.standalone(xp, scratch, step=step), ins, out, a)
            w, h = (np.asarray(x.get() if hasattr(x, "get") else x, dtype=np.float64) for x in (want, got))
            worst = max(worst, float(np.max(np.abs(w - h)) / max(float(np.max(np.abs(w))), 1e-30)))
    except Exception as exc:  # a compile error, or an op this check cannot drive
        notes.append(f"`{name}` ({dtype}) runs its ufunc kernel: the fused one failed ({type(exc).__name__}: {exc})")
        return None
    if not worst <= 1e-5:
        notes.append(f"`{name}` ({dtype}) runs its ufunc kernel: the fused one differs by {worst:.1e}")
        return None
    return kernel
