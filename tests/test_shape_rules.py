"""The registry's shape rules agree with NumPy's semantics on random shapes."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from swapdsl.common.errors import SwpError
from swapdsl.graph import ops
from swapdsl.graph.ir import DType, TensorType

F32 = DType.f32
dims = st.integers(1, 5)
shapes = st.lists(dims, min_size=0, max_size=4).map(tuple)


def tt(shape: tuple[int, ...], dtype: DType = F32) -> TensorType:
    return TensorType(tuple(shape), dtype)


@given(shapes, shapes)
def test_broadcasting_matches_numpy(a: tuple[int, ...], b: tuple[int, ...]) -> None:
    try:
        expected = np.broadcast_shapes(a, b)
    except ValueError:
        with pytest.raises(SwpError, match="do not broadcast"):
            ops.infer("add", (tt(a), tt(b)), {})
        return
    assert ops.infer("mul", (tt(a), tt(b)), {}).shape == expected


@given(st.lists(dims, min_size=2, max_size=4), st.lists(dims, min_size=2, max_size=4), st.booleans())
def test_matmul_matches_numpy(a: list[int], b: list[int], align: bool) -> None:
    if align:
        b[-2] = a[-1]
    try:
        expected = np.matmul(np.zeros(a, np.float32), np.zeros(b, np.float32)).shape
    except ValueError:
        with pytest.raises(SwpError):
            ops.infer("matmul", (tt(tuple(a)), tt(tuple(b))), {})
        return
    out = ops.infer("matmul", (tt(tuple(a)), tt(tuple(b))), {})
    assert out.shape == expected


def _conv_reference_size(size: int, k: int, s: int, p: int, d: int) -> int:
    """Count the window positions directly: a window starts every s pixels of the padded input."""
    span = d * (k - 1) + 1
    return len(range(0, size + 2 * p - span + 1, s))


@settings(max_examples=200)
@given(st.integers(1, 12), st.integers(1, 12), st.integers(1, 4), st.integers(1, 3), st.integers(0, 3),
       st.integers(1, 3), st.sampled_from([1, 2, 4]))
def test_conv2d_output_size(h: int, w: int, k: int, s: int, p: int, d: int, groups: int) -> None:
    x = tt((2, 4 * groups, h, w))
    wt = tt((8 * groups, 4, k, k + 1))
    attrs = {"stride": (s, s), "padding": (p, p), "dilation": (d, d), "groups": groups}
    eh, ew = _conv_reference_size(h, k, s, p, d), _conv_reference_size(w, k + 1, s, p, d)
    if eh < 1 or ew < 1:
        with pytest.raises(SwpError, match="output would be empty"):
            ops.infer("conv2d", (x, wt), attrs)
        return
    assert ops.infer("conv2d", (x, wt), attrs).shape == (2, 8 * groups, eh, ew)


@given(shapes.filter(lambda s: len(s) >= 1), st.data())
def test_reductions_match_numpy(shape: tuple[int, ...], data: st.DataObject) -> None:
    axes = tuple(sorted(data.draw(st.sets(st.integers(0, len(shape) - 1), min_size=1))))
    keep = data.draw(st.booleans())
    expected = np.sum(np.zeros(shape), axis=axes, keepdims=keep).shape
    assert ops.infer("sum", (tt(shape),), {"axes": axes, "keepdims": keep}).shape == expected


@given(st.lists(dims, min_size=1, max_size=4), st.data())
def test_permute_and_concat_match_numpy(shape: list[int], data: st.DataObject) -> None:
    perm = tuple(data.draw(st.permutations(range(len(shape)))))
    assert ops.infer("permute", (tt(tuple(shape)),), {"perm": perm}).shape == np.zeros(shape).transpose(perm).shape
    axis = data.draw(st.integers(0, len(shape) - 1))
    other = list(shape)
    other[axis] = data.draw(dims)
    expected = np.concatenate([np.zeros(shape), np.zeros(other)], axis=axis).shape
    assert ops.infer("concat", (tt(tuple(shape)), tt(tuple(other))), {"axis": axis}).shape == expected


def test_pool_and_global_pool() -> None:
    x = tt((2, 3, 7, 7))
    out = ops.infer("max_pool2d", (x,), {"kernel": (3, 3), "stride": (2, 2), "padding": (1, 1)})
    assert out.shape == (2, 3, 4, 4)
    assert ops.infer("global_avg_pool", (x,), {}).shape == (2, 3)


def test_embedding_and_losses() -> None:
    ids = tt((4, 9), DType.i64)
    assert ops.infer("embedding", (ids, tt((100, 16))), {}).shape == (4, 9, 16)
    assert ops.infer("softmax_cross_entropy", (tt((4, 9, 100)), ids), {}).shape == ()
    assert ops.infer("mse_loss", (tt((4, 3)), tt((4, 3))), {}).shape == ()


def test_every_op_has_flops_and_bytes() -> None:
    for name, d in ops.REGISTRY.items():
        assert d.name == name
    x = tt((2, 3))
    d = ops.REGISTRY["relu"]
    out = d.infer((x,), {})
    assert (d.flops((x,), out, {}), d.bytes_read((x,), out, {}), d.bytes_written((x,), out, {})) == (6, 24, 24)
    mm = ops.REGISTRY["matmul"]
    a, b = tt((5, 2, 3)), tt((3, 4))
    assert mm.flops((a, b), mm.infer((a, b), {}), {}) == 2 * 5 * 2 * 3 * 4
