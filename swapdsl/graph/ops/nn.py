"""Neural-network ops: softmax, normalisation, padding and masks, embedding (convolution and pooling:
conv.py).

Every kernel writes into its output and takes its temporaries from the scratch
its op declares. Normalisation tiles the channels (batch norm) or the rows
(layer norm) so that a tile's temporaries stay near half the op's largest tensor.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

from swapdsl.common.errors import SwpError
from swapdsl.graph.ir import TensorType
from swapdsl.graph.ops.registry import (
    Array, Attrs, GradBuilder, KernelContext, OpDef, Types, buffers, chunk_len, chunks, floating, iota,
    per_element, per_input_element, register, same_as,
)

# ---- softmax -------------------------------------------------------------------


def reduced_shape(x: Any, axis: int) -> tuple[int, ...]:
    return tuple(1 if i == axis else d for i, d in enumerate(x.shape))


def _softmax(c: KernelContext, ins: list[Array], out: Array, a: Attrs) -> None:
    (x,) = ins
    xp, axis = c.xp, a["axis"]
    r = c.scratch.take(reduced_shape(x, axis), x.dtype)
    xp.max(x, axis=axis, keepdims=True, out=r)
    xp.subtract(x, r, out=out)
    xp.exp(out, out=out)
    xp.sum(out, axis=axis, keepdims=True, out=r)
    xp.divide(out, r, out=out)


def _log_softmax(c: KernelContext, ins: list[Array], out: Array, a: Attrs) -> None:
    """(x - max) - log(sum(exp(x - max))); the shift is formed twice rather than held in a temporary."""
    (x,) = ins
    xp, axis = c.xp, a["axis"]
    m, total = c.scratch.take(reduced_shape(x, axis), x.dtype), c.scratch.take(reduced_shape(x, axis), x.dtype)
    xp.max(x, axis=axis, keepdims=True, out=m)
    xp.subtract(x, m, out=out)
    xp.exp(out, out=out)
    xp.sum(out, axis=axis, keepdims=True, out=total)
    xp.log(total, out=total)
    xp.subtract(x, m, out=out)
    xp.subtract(out, total, out=out)


def _softmax_grad(c: KernelContext, ins: list[Array], out: Array, a: Attrs) -> None:
    """y * (g - sum(g * y))."""
    y, g = ins
    xp, axis = c.xp, a["axis"]
    r = c.scratch.take(reduced_shape(y, axis), y.dtype)
    xp.multiply(g, y, out=out)
    xp.sum(out, axis=axis, keepdims=True, out=r)
    xp.subtract(g, r, out=out)
    xp.multiply(y, out, out=out)


def _log_softmax_grad(c: KernelContext, ins: list[Array], out: Array, a: Attrs) -> None:
    """g - exp(y) * sum(g)."""
    y, g = ins
    xp, axis = c.xp, a["axis"]
    r = c.scratch.take(reduced_shape(y, axis), y.dtype)
    xp.sum(g, axis=axis, keepdims=True, out=r)
    xp.exp(y, out=out)
    xp.multiply(out, r, out=out)
    xp.subtract(g, out, out=out)


def _reduced_scratch(count: int):  # noqa: ANN202
    def rule(ins: Types, out: TensorType, a: Attrs) -> int:
        x = ins[0]
        return buffers(*[x.numel // x.shape[a["axis"]] * x.dtype.itemsize] * count)

    return rule


def _via_output(op: str):  # noqa: ANN202
    def rule(b: GradBuilder, ins: tuple[str, ...], out: str, g: str, a: Attrs) -> tuple[str | None, ...]:
        return (b.emit(op, [out, g], a),)

    return rule


# ---- normalisation -------------------------------------------------------------


class _Frame(NamedTuple):
    """A normalisation's view of its input: x as [A, B, C] normalised over axes (0, 2) (batch norm:
    [N, channels, pixels]) or (1,) of [rows, features, 1] (layer and RMS norm), tiled along axis 1 or 0."""

    x: Array
    axes: tuple[int, ...]
    tile_axis: int


def _frame(kind: str, x: Array, scale_rank: int) -> _Frame:
    if kind != "batch":
        features = math.prod(x.shape[x.ndim - scale_rank:])
        return _Frame(x.reshape(-1, features, 1), (1,), 0)
    return _Frame(x.reshape(x.shape[0], x.shape[1], -1), (0, 2), 1)


def _frame_shape(kind: str, t: TensorType, scale_rank: int) -> tuple[int, int, int]:
    if kind != "batch":
        features = math.prod(t.shape[t.rank - scale_rank:])
        return (t.numel // features, features, 1)
    return (t.shape[0], t.shape[1], t.numel // (t.shape[0] * t.shape[1]))


def _tiles(f: _Frame, arrays: list[Array], full: int) -> list[tuple[slice, list[Array]]]:
    """Tiles along the frame's tile axis, sized for ``full`` temporaries of a tile: each array's part (an
    array of the frame's shape, or a vector along axis 1 broadcast as [1, B, 1]) and the slice it covers."""
    shape = f.x.shape
    per_item = math.prod(d for i, d in enumerate(shape) if i != f.tile_axis) * 4 * full
    out = []
    for k in chunks(shape[f.tile_axis], per_item, f.x.nbytes):
        index = (slice(None),) * f.tile_axis + (k,)
        parts: dict[int, Array] = {}  # one part per array object: an in-place output stays its input (CuPy
        for a in arrays:              # copies an input that overlaps the output unless they are one object)
            if id(a) not in parts:  # (a scale of three axes is a vector too: compare shapes, not ranks)
                parts[id(a)] = a[index] if a.shape == shape else _vector(a, k, f.tile_axis)
        out.append((k, [parts[id(a)] for a in arrays]))
    return out


def _vector(v: Array, k: slice, tile_axis: int) -> Array:
    return v.reshape(1, -1, 1) if tile_axis == 0 else v[k].reshape(1, -1, 1)


def _compute_dtype(xp: Any, x: Array) -> Any:
    return xp.float32 if x.dtype == xp.float16 else x.dtype


def norm_sum(c: KernelContext, x: Array, axes: tuple[int, ...], out: Array, mean: bool = False) -> None:
    """Sum (or mean) of a frame ``x`` [A, B, C] over ``axes`` into ``out`` (keepdims), in ``out``'s dtype.
    Over (0, 2) (batch norm's channels) it sums the contiguous axis first, then across A: a reduction
    across both strided axes at once gets one CUDA thread block per channel on CuPy, and a tile of a few
    channels of a large activation ran at a few GB/s (on an H200, 2026-12-04: 40 ms for one batch_norm
    of ResNet-50's first layer)."""
    xp = c.xp
    if axes != (0, 2) or x.shape[2] == 1:
        (xp.mean if mean else xp.sum)(x, axis=axes, keepdims=True, dtype=out.dtype, out=out)
        return
    mark = c.scratch.used  # the partial sums are done with once ``out`` has them
    rows = c.scratch.take((x.shape[0], x.shape[1], 1), _compute_dtype(xp, x))
    xp.sum(x, axis=2, keepdims=True, dtype=rows.dtype, out=rows)
    xp.sum(rows, axis=0, keepdims=True, out=out)
    if mean:
        xp.divide(out, out.dtype.type(x.shape[0] * x.shape[2]), out=out)
    c.scratch.used = mark


def norm_tiles(kind: str, x: Array, others: list[Array], full: int,
               scale_rank: int = 1) -> tuple[tuple[int, ...], list[tuple[slice, list[Array]]]]:
    """A normalisation's view of ``x`` as its own kernels tile it, for kernels that stand in for them
    (``runtime/fused.py``): the axes its statistics reduce, and the tiles of ``x`` and of ``others`` (arrays
    shaped like ``x``, or its scale's shape), sized as the op's scratch rule sizes them for ``full``
    temporaries. Batch norm: [N, B, pixels] tiles of B channels; layer and RMS norm: [R, features, 1] tiles
    of R rows. A scale's part is [1, B, 1] or [1, features, 1]."""
    f = _frame(kind, x, scale_rank)
    return f.axes, _tiles(f, [f.x, *(a.reshape(f.x.shape) if a.shape == x.shape else a.reshape(-1)
                                    for a in others)], full)


def _normalized(c: KernelContext, x: Array, axes: tuple[int, ...], eps: float,
                centered: bool = True) -> tuple[Array, Array]:
    """(x - mean) / sqrt(var + eps) and 1 / sqrt(var + eps), two-pass, in f32 for f16 inputs; both in scratch.
    Not ``centered`` (RMS norm): x / sqrt(mean(x^2) + eps) and 1 / sqrt(mean(x^2) + eps)."""
    xp, dt = c.xp, _compute_dtype(c.xp, x)
    red = tuple(1 if i in axes else d for i, d in enumerate(x.shape))
    xhat, square, invstd = c.scratch.take(x.shape, dt), c.scratch.take(x.shape, dt), c.scratch.take(red, dt)
    if centered:
        norm_sum(c, x, axes, invstd, mean=True)
        xp.subtract(x, invstd, out=xhat)
    else:
        xp.copyto(xhat, x, casting="unsafe")
    xp.multiply(xhat, xhat, out=square)
    norm_sum(c, square, axes, invstd, mean=True)
    xp.add(invstd, eps, out=invstd)
    xp.sqrt(invstd, out=invstd)
    xp.divide(1.0, invstd, out=invstd)
    xp.multiply(xhat, invstd, out=xhat)
    return xhat, invstd


def _norm_kernel(kind: str):  # noqa: ANN202
    def kernel(c: KernelContext, ins: list[Array], out: Array, a: Attrs) -> None:
        x, scale, *shift = ins  # RMS norm has no shift
        f = _frame(kind, x, scale.ndim)
        for _, (xc, oc, sc, *bc) in _tiles(f, [f.x, out.reshape(f.x.shape), scale, *shift], 2):
            xhat, _ = _normalized(c, xc, f.axes, a["eps"], centered=kind != "rms")
            if bc:
                c.xp.multiply(xhat, sc, out=xhat)
                c.xp.add(xhat, bc[0], out=oc)
            else:
                c.xp.multiply(xhat, sc, out=oc)
            c.scratch.reset()

    return kernel


def _norm_grad_kernel(kind: str):  # noqa: ANN202
    """dx = invstd * (gs - mean(gs) - xhat * mean(gs * xhat)), gs = g * scale (RMS norm: no mean(gs))."""
    def kernel(c: KernelContext, ins: list[Array], out: Array, a: Attrs) -> None:
        x, scale, g = ins
        xp, f = c.xp, _frame(kind, x, scale.ndim)
        for _, (xc, gc, oc, sc) in _tiles(f, [f.x, g.reshape(f.x.shape), out.reshape(f.x.shape), scale], 4):
            xhat, invstd = _normalized(c, xc, f.axes, a["eps"], centered=kind != "rms")
            gs, m1, m2 = c.scratch.take(xc.shape, xhat.dtype), c.scratch.take(invstd.shape, xhat.dtype), \
                c.scratch.take(invstd.shape, xhat.dtype)
            xp.multiply(gc, sc, out=gs)
            if kind != "rms":  # (RMS norm took no mean out, so its gradient has none to put back)
                norm_sum(c, gs, f.axes, m1, mean=True)
            square = c.scratch.take(xc.shape, xhat.dtype)
            xp.multiply(gs, xhat, out=square)
            norm_sum(c, square, f.axes, m2, mean=True)
            xp.multiply(xhat, m2, out=xhat)
            if kind != "rms":
                xp.subtract(gs, m1, out=gs)
            xp.subtract(gs, xhat, out=gs)
            xp.multiply(invstd, gs, out=oc)
            c.scratch.reset()

    return kernel


def _norm_dscale_kernel(kind: str):  # noqa: ANN202
    """sum of g * xhat over everything but the scale's axes."""
    def kernel(c: KernelContext, ins: list[Array], out: Array, a: Attrs) -> None:
        x, g = ins
        xp, f = c.xp, _frame(kind, x, a.get("scale_rank", 1))
        summed = tuple(i for i in range(3) if i != 1)
        acc = c.scratch.take(out.shape, out.dtype) if kind != "batch" else None
        mark = c.scratch.used
        for k, (xc, gc) in _tiles(f, [f.x, g.reshape(f.x.shape)], 2):
            xhat, _ = _normalized(c, xc, f.axes, a["eps"], centered=kind != "rms")
            xp.multiply(xhat, gc, out=xhat)
            if kind == "batch":
                norm_sum(c, xhat, summed, out.reshape(1, -1, 1)[:, k])
            elif k.start == 0:
                xp.sum(xhat, axis=summed, out=out.reshape(-1))
            else:
                xp.sum(xhat, axis=summed, out=acc.reshape(-1))
                xp.add(out, acc, out=out)
            c.scratch.used = mark

    return kernel


def _norm_scratch(kind: str, full: int, reduced: int, acc: bool = False):  # noqa: ANN202
    """``full`` temporaries of a tile of the input and ``reduced`` of its statistics, in the compute dtype."""
    def rule(ins: Types, out: TensorType, a: Attrs) -> int:
        # the dscale ops say their scale's rank; the others read their scale (x and g alike: batch norm's)
        scale_rank = a["scale_rank"] if "scale_rank" in a else ins[1].rank if ins[1].shape != ins[0].shape else 1
        shape = _frame_shape(kind, ins[0], scale_rank)
        tile = 0 if kind != "batch" else 1
        others = math.prod(d for i, d in enumerate(shape) if i != tile)
        n = chunk_len(shape[tile], others * 4 * full, ins[0].nbytes)
        item = 4 if ins[0].dtype.itemsize == 2 else ins[0].dtype.itemsize
        extra = [out.nbytes] if acc and kind != "batch" else [shape[0] * n * item] if kind == "batch" else []
        return buffers(*extra, *[n * others * item] * full, *[n * item] * reduced)  # n statistics per tile

    return rule


# ---- batch norm's running statistics (as torch.nn.BatchNorm2d keeps them) ------------------------------
#
# Training updates each running statistic in place from the batch: r = (1 - momentum) * r + momentum * s,
# s the batch's per-channel mean, or its unbiased variance; evaluation normalises with them.


def _running_infer(ins: Types, a: Attrs) -> TensorType:
    r, x = ins
    floating("batch_norm running statistics", x)
    if x.rank < 2 or r.shape != (x.shape[1],) or not r.dtype.is_float:
        raise SwpError(f"a running statistic is a float vector over the input's channels, got {r} for {x}")
    return r


def _running(statistic: str):  # noqa: ANN202
    def kernel(c: KernelContext, ins: list[Array], out: Array, a: Attrs) -> None:
        r, x = ins
        xp, f, m = c.xp, _frame("batch", x, 1), a["momentum"]
        for _, (xc, rc, oc) in _tiles(f, [f.x, r, out], 2):
            dt = _compute_dtype(xp, xc)
            s = c.scratch.take((1, xc.shape[1], 1), dt)
            norm_sum(c, xc, (0, 2), s, mean=True)
            if statistic == "var":
                d = c.scratch.take(xc.shape, dt)
                xp.subtract(xc, s, out=d)
                xp.multiply(d, d, out=d)
                norm_sum(c, d, (0, 2), s)
                xp.divide(s, s.dtype.type(max(xc.shape[0] * xc.shape[2] - 1, 1)), out=s)
            xp.multiply(rc, rc.dtype.type(1.0 - m), out=oc)
            xp.multiply(s, s.dtype.type(m), out=s)
            xp.add(oc, s, out=oc, casting="unsafe")
            c.scratch.reset()

    return kernel


def _running_merge(c: KernelContext, ins: list[Array], out: Array, a: Attrs) -> None:
    """r * decay + contribution: k micro-batches' running-statistic updates folded into one, in place over
    the statistic (decay = (1 - momentum) ** k; the contribution is the k updates run from zero)."""
    r, contribution = ins
    c.xp.multiply(r, r.dtype.type(a["decay"]), out=out)
    c.xp.add(out, contribution, out=out)


def _running_scratch(ins: Types, out: TensorType, a: Attrs) -> int:
    return _norm_scratch("batch", 1, 1)((ins[1], ins[0]), out, a)


def _batch_norm_eval_infer(ins: Types, a: Attrs) -> TensorType:
    x, g, b, rm, rv = ins
    out = _batch_norm_infer((x, g, b), a)
    if rm.shape != (x.shape[1],) or rv.shape != (x.shape[1],):
        raise SwpError(f"`batch_norm_eval` running statistics must be vectors over the channels, got {rm}, {rv}")
    return out


def _batch_norm_eval(c: KernelContext, ins: list[Array], out: Array, a: Attrs) -> None:
    """scale * (x - running mean) / sqrt(running var + eps) + shift, as one multiply-add per element."""
    x, scale, shift, rm, rv = ins
    xp, f = c.xp, _frame("batch", x, 1)
    for _, (xc, oc, sc, bc, mc, vc) in _tiles(f, [f.x, out.reshape(f.x.shape), scale, shift, rm, rv], 1):
        dt = _compute_dtype(xp, xc)
        k, t = c.scratch.take(sc.shape, dt), c.scratch.take(sc.shape, dt)
        xp.add(vc, k.dtype.type(a["eps"]), out=k, casting="unsafe")
        xp.sqrt(k, out=k)
        xp.divide(sc, k, out=k, casting="unsafe")
        xp.multiply(mc, k, out=t, casting="unsafe")
        xp.subtract(bc, t, out=t, casting="unsafe")
        xp.multiply(xc, k, out=oc, casting="unsafe")
        xp.add(oc, t, out=oc, casting="unsafe")
        c.scratch.reset()


def _norm_grad(kind: str):  # noqa: ANN202
    def rule(b: GradBuilder, ins: tuple[str, ...], out: str, g: str, a: Attrs) -> tuple[str | None, ...]:
        x, scale, *_ = ins
        xt, st = b.type(x), b.type(scale)
        if kind != "batch":
            reduce_axes = tuple(range(xt.rank - st.rank))
            dscale_attrs = {"eps": a["eps"], "scale_rank": st.rank}
        else:
            reduce_axes = (0,) + tuple(range(2, xt.rank))
            dscale_attrs = {"eps": a["eps"]}
        dx = b.emit(f"{kind}_norm_grad", [x, scale, g], {"eps": a["eps"]})
        dscale = b.emit(f"{kind}_norm_dscale", [x, g], dscale_attrs)
        if kind == "rms":
            return dx, dscale
        dshift = b.emit("sum", [g], {"axes": reduce_axes, "keepdims": False}) if reduce_axes else g
        return dx, dscale, dshift

    return rule


def _layer_norm_infer(ins: Types, a: Attrs) -> TensorType:
    x, g, b = ins
    dtype = floating("layer_norm", x, g, b)
    k = g.rank
    if g.shape != b.shape or k == 0 or x.shape[-k:] != g.shape:
        raise SwpError("`layer_norm` scale and shift must match the trailing dimensions of its input",
                       hints=[f"input is {x}, scale is {g}, shift is {b}"])
    return TensorType(x.shape, dtype)


def _rms_norm_infer(ins: Types, a: Attrs) -> TensorType:
    x, g = ins
    dtype = floating("rms_norm", x, g)
    if g.rank == 0 or x.shape[-g.rank:] != g.shape:
        raise SwpError("`rms_norm` scale must match the trailing dimensions of its input",
                       hints=[f"input is {x}, scale is {g}"])
    return TensorType(x.shape, dtype)


def _batch_norm_infer(ins: Types, a: Attrs) -> TensorType:
    x, g, b = ins
    dtype = floating("batch_norm", x, g, b)
    if x.rank < 2 or g.shape != (x.shape[1],) or b.shape != (x.shape[1],):
        raise SwpError("`batch_norm` scale and shift must be vectors over the input's channels (dimension 1)",
                       hints=[f"input is {x}, scale is {g}, shift is {b}"])
    return TensorType(x.shape, dtype)


def _dscale_infer(kind: str):  # noqa: ANN202
    def infer(ins: Types, a: Attrs) -> TensorType:
        x, g = ins
        if kind != "batch":
            return TensorType(x.shape[x.rank - a.get("scale_rank", 1):], x.dtype)
        return TensorType((x.shape[1],), x.dtype)

    return infer


# ---- padding and masks -----------------------------------------------------------


def _pad2d_infer(ins: Types, a: Attrs) -> TensorType:
    (x,) = ins
    top, bottom, left, right = a["padding"]
    if x.rank != 4 or min(a["padding"]) < 0:
        raise SwpError(f"`pad2d` needs a 4-d input and non-negative padding, got {x} and {a['padding']}")
    return TensorType(x.shape[:2] + (x.shape[2] + top + bottom, x.shape[3] + left + right), x.dtype)


def _pad2d(c: KernelContext, ins: list[Array], out: Array, a: Attrs) -> None:
    (x,) = ins
    top, _, left, _ = a["padding"]
    out.fill(0)
    c.xp.copyto(out[:, :, top:top + x.shape[2], left:left + x.shape[3]], x)


def _pad2d_grad(b: GradBuilder, ins: tuple[str, ...], out: str, g: str, a: Attrs) -> tuple[str | None, ...]:
    return (b.emit("crop2d", [g], a),)


def _crop2d_infer(ins: Types, a: Attrs) -> TensorType:
    (g,) = ins
    top, bottom, left, right = a["padding"]
    return TensorType(g.shape[:2] + (g.shape[2] - top - bottom, g.shape[3] - left - right), g.dtype)


def _crop2d(c: KernelContext, ins: list[Array], out: Array, a: Attrs) -> None:
    (g,) = ins
    top, bottom, left, right = a["padding"]
    c.xp.copyto(out, g[:, :, top:g.shape[2] - bottom, left:g.shape[3] - right])


def _causal_infer(ins: Types, a: Attrs) -> TensorType:
    (x,) = ins
    if x.rank < 2 or x.shape[-1] != x.shape[-2]:
        raise SwpError(f"`causal_mask` needs square trailing dimensions [..., T, T], got {x}")
    return TensorType(x.shape, floating("causal_mask", x))


def _causal(c: KernelContext, ins: list[Array], out: Array, a: Attrs) -> None:
    """Entries above the diagonal (key after query) become ``fill``."""
    (x,) = ins
    xp, t = c.xp, x.shape[-1]
    position, future = c.scratch.take((t,), xp.int64), c.scratch.take((t, t), xp.bool_)
    iota(xp, position)
    xp.greater(position[None, :], position[:, None], out=future)
    xp.copyto(out, x)
    xp.copyto(out, x.dtype.type(a["fill"]), where=future)


def _causal_grad(b: GradBuilder, ins: tuple[str, ...], out: str, g: str, a: Attrs) -> tuple[str | None, ...]:
    return (b.emit("causal_mask", [g], {"fill": 0.0}),)


# ---- rotary position embedding (Su et al. 2021, as LLaMA applies it) ---------------------------------
#
# Over x [..., T, D], position t = the index along axis -2: the pairs (x[i], x[i + D/2]) of the last axis
# turn by the angle t * base ** (-2i / D) (the "rotate half" layout of LLaMA's reference code).


def _rope_infer(ins: Types, a: Attrs) -> TensorType:
    (x,) = ins
    if x.rank < 2 or x.shape[-1] % 2:
        raise SwpError(f"`rope` needs [..., positions, features] with an even number of features, got {x}")
    if not a["base"] > 1.0:
        raise SwpError(f"`rope` base must be above 1, got {a['base']}")
    return TensorType(x.shape, floating("rope", x))


def _rope(c: KernelContext, ins: list[Array], out: Array, a: Attrs) -> None:
    """out1 = x1 cos - x2 sin, out2 = x2 cos + x1 sin (``inverse``: the angle negated, the gradient)."""
    (x,) = ins
    xp, (t, d) = c.xp, x.shape[-2:]
    dt, half = _compute_dtype(xp, x), x.shape[-1] // 2
    # the angles in f64 whatever the data: at position 2,000 an f32 angle is off by 1e-4 radians
    angle, position = c.scratch.take((t, half), xp.float64), c.scratch.take((t, 1), xp.float64)
    iota(xp, position.reshape(-1))
    iota(xp, angle[0])
    xp.multiply(angle[0], -2.0 * math.log(a["base"]) / d, out=angle[0])
    xp.exp(angle[0], out=angle[0])
    xp.multiply(position, angle[0], out=angle)
    cos, sin = c.scratch.take((t, half), dt), c.scratch.take((t, half), dt)
    xp.cos(angle, out=cos, casting="unsafe")
    xp.sin(angle, out=sin, casting="unsafe")
    if a.get("inverse"):
        xp.negative(sin, out=sin)
    x1, x2, o1, o2 = x[..., :half], x[..., half:], out[..., :half], out[..., half:]
    tmp = c.scratch.take(x1.shape, dt)
    xp.multiply(x1, cos, out=o1, casting="unsafe")
    xp.multiply(x2, sin, out=tmp)
    xp.subtract(o1, tmp, out=o1, casting="unsafe")
    xp.multiply(x2, cos, out=o2, casting="unsafe")
    xp.multiply(x1, sin, out=tmp)
    xp.add(o2, tmp, out=o2, casting="unsafe")


def _rope_scratch(ins: Types, out: TensorType, a: Attrs) -> int:
    (x,) = ins
    item = 4 if x.dtype.itemsize == 2 else x.dtype.itemsize
    t, half = x.shape[-2], x.shape[-1] // 2
    return buffers(t * half * 8, t * 8, t * half * item, t * half * item, x.numel // 2 * item)


def _rope_grad(b: GradBuilder, ins: tuple[str, ...], out: str, g: str, a: Attrs) -> tuple[str | None, ...]:
    return (b.emit("rope", [g], {**a, "inverse": not a.get("inverse", False)}),)


# ---- embedding -----------------------------------------------------------------


def _embedding_infer(ins: Types, a: Attrs) -> TensorType:
    ids, table = ins
    if ids.dtype.is_float:
        raise SwpError(f"`embedding` indices must be integers, got {ids}")
    if table.rank != 2:
        raise SwpError(f"`embedding` table must be 2-d [vocab, dim], got {table}")
    return TensorType(ids.shape + (table.shape[1],), floating("embedding", table))


def scatter_add(xp: Any, target: Array, index: Array, values: Array) -> None:
    """target[index] += values, with repeated indices accumulating."""
    if hasattr(xp, "add") and hasattr(xp.add, "at"):
        xp.add.at(target, index, values)
    else:  # CuPy before add.at
        import cupyx

        cupyx.scatter_add(target, index, values)


def _embedding_grad_kernel(c: KernelContext, ins: list[Array], out: Array, a: Attrs) -> None:
    ids, g = ins
    out.fill(0)
    scatter_add(c.xp, out, ids.reshape(-1), g.reshape(-1, g.shape[-1]))


def _embedding_grad(b: GradBuilder, ins: tuple[str, ...], out: str, g: str, a: Attrs) -> tuple[str | None, ...]:
    ids, table = ins
    return None, b.emit("embedding_grad", [ids, g], {"vocab": b.type(table).shape[0]})


def _embedding_grad_infer(ins: Types, a: Attrs) -> TensorType:
    ids, g = ins
    return TensorType((a["vocab"], g.shape[-1]), g.dtype)


def _gathered_bytes(ins: Types, out: TensorType, a: Attrs) -> int:
    return ins[0].nbytes + out.nbytes  # only the gathered rows of the table are read


register(
    OpDef("softmax", (1, 1), same_as(0, op="softmax"), per_element(5), _softmax, _via_output("softmax_grad"),
          scratch=_reduced_scratch(1)),
    OpDef("log_softmax", (1, 1), same_as(0, op="log_softmax"), per_element(5), _log_softmax,
          _via_output("log_softmax_grad"), scratch=_reduced_scratch(2)),
    OpDef("softmax_grad", (2, 2), same_as(1, op="softmax_grad"), per_element(4), _softmax_grad,
          scratch=_reduced_scratch(1)),
    OpDef("log_softmax_grad", (2, 2), same_as(1, op="log_softmax_grad"), per_element(4), _log_softmax_grad,
          scratch=_reduced_scratch(1)),
    OpDef("layer_norm", (3, 3), _layer_norm_infer, per_element(8), _norm_kernel("layer"), _norm_grad("layer"),
          scratch=_norm_scratch("layer", 2, 1)),
    OpDef("layer_norm_grad", (3, 3), same_as(0, op="layer_norm_grad"), per_input_element(14),
          _norm_grad_kernel("layer"), scratch=_norm_scratch("layer", 4, 3)),
    OpDef("layer_norm_dscale", (2, 2), _dscale_infer("layer"), per_input_element(10), _norm_dscale_kernel("layer"),
          scratch=_norm_scratch("layer", 2, 1, acc=True)),
    OpDef("rms_norm", (2, 2), _rms_norm_infer, per_element(6), _norm_kernel("rms"), _norm_grad("rms"),
          scratch=_norm_scratch("rms", 2, 1)),
    OpDef("rms_norm_grad", (3, 3), same_as(0, op="rms_norm_grad"), per_input_element(11),
          _norm_grad_kernel("rms"), scratch=_norm_scratch("rms", 4, 3)),
    OpDef("rms_norm_dscale", (2, 2), _dscale_infer("rms"), per_input_element(8), _norm_dscale_kernel("rms"),
          scratch=_norm_scratch("rms", 2, 1, acc=True)),
    OpDef("batch_norm", (3, 3), _batch_norm_infer, per_element(8), _norm_kernel("batch"), _norm_grad("batch"),
          scratch=_norm_scratch("batch", 2, 1)),
    OpDef("batch_norm_grad", (3, 3), same_as(0, op="batch_norm_grad"), per_input_element(14),
          _norm_grad_kernel("batch"), scratch=_norm_scratch("batch", 4, 3)),
    OpDef("batch_norm_dscale", (2, 2), _dscale_infer("batch"), per_input_element(10), _norm_dscale_kernel("batch"),
          scratch=_norm_scratch("batch", 2, 1)),
    OpDef("batch_norm_running_mean", (2, 2), _running_infer, lambda ins, o, a: 3 * ins[1].numel, _running("mean"),
          in_place=True, scratch=_running_scratch),
    OpDef("batch_norm_running_var", (2, 2), _running_infer, lambda ins, o, a: 5 * ins[1].numel, _running("var"),
          in_place=True, scratch=_running_scratch),
    OpDef("running_merge", (2, 2), same_as(0, op="running_merge"), per_element(2), _running_merge, in_place=True),
    OpDef("batch_norm_eval", (5, 5), _batch_norm_eval_infer, per_element(2), _batch_norm_eval,
          scratch=_norm_scratch("batch", 0, 2)),
    OpDef("pad2d", (1, 1), _pad2d_infer, lambda ins, o, a: 0, _pad2d, _pad2d_grad),
    OpDef("crop2d", (1, 1), _crop2d_infer, lambda ins, o, a: 0, _crop2d),
    OpDef("causal_mask", (1, 1), _causal_infer, per_element(1), _causal, _causal_grad,
          scratch=lambda ins, o, a: buffers(8 * ins[0].shape[-1], ins[0].shape[-1] ** 2)),
    OpDef("rope", (1, 1), _rope_infer, per_element(6), _rope, _rope_grad, scratch=_rope_scratch),
    OpDef("embedding", (2, 2), _embedding_infer, lambda ins, o, a: 0,
          lambda c, ins, out, a: c.xp.take(ins[1], ins[0], axis=0, out=out), _embedding_grad,
          bytes_read=_gathered_bytes),
    OpDef("embedding_grad", (2, 2), _embedding_grad_infer, lambda ins, o, a: ins[1].numel,
          _embedding_grad_kernel),
)
