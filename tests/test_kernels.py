"""Kernels against hand-computed values, on NumPy and (marked gpu) on CuPy."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from swapdsl.graph.ops.kernels import run_kernel
from swapdsl.runtime.backend import to_host


@pytest.fixture(params=["numpy", pytest.param("cupy", marks=pytest.mark.gpu)])
def xp(request: pytest.FixtureRequest) -> Any:
    if request.param == "numpy":
        return np
    import cupy

    return cupy


def run(xp: Any, op: str, *inputs: Any, train_step: int = 1, **attrs: Any) -> np.ndarray:
    arrays = [xp.asarray(np.asarray(x, dtype=np.int64 if isinstance(x, IntArray) else np.float64)) for x in inputs]
    return to_host(run_kernel(xp, op, arrays, attrs, train_step))


class IntArray(list):
    """Marks an input as integer (labels, ids)."""


def pair(v: int) -> tuple[int, int]:
    return (v, v)


def conv_attrs(stride: int = 1, padding: int = 0, dilation: int = 1, groups: int = 1) -> dict[str, Any]:
    return {"stride": pair(stride), "padding": pair(padding), "dilation": pair(dilation), "groups": groups}


GRID = np.arange(16.0).reshape(1, 1, 4, 4)


def test_matmul(xp: Any) -> None:
    np.testing.assert_array_equal(run(xp, "matmul", [[1, 2], [3, 4]], [[5, 6], [7, 8]]), [[19, 22], [43, 50]])
    # a batch of two against one shared matrix
    out = run(xp, "matmul", [[[1, 0]], [[0, 1]]], [[2, 3], [4, 5]])
    np.testing.assert_array_equal(out, [[[2, 3]], [[4, 5]]])


def test_matmul_transposed_forms(xp: Any) -> None:
    a, b = [[1.0, 2], [3, 4]], [[5.0, 6], [7, 8]]
    np.testing.assert_array_equal(run(xp, "matmul_nt", a, b), [[17, 23], [39, 53]])  # a @ b.T
    np.testing.assert_array_equal(run(xp, "matmul_tn", a, b), [[26, 30], [38, 44]])  # a.T @ b
    np.testing.assert_array_equal(run(xp, "matmul_tn_fold", [[[1.0, 2]], [[3, 4]]], [[[5.0, 6]], [[7, 8]]]),
                                  [[26, 30], [38, 44]])
    # the same, added into a sum so far (a weight gradient summed over time steps)
    np.testing.assert_array_equal(run(xp, "matmul_tn_fold_acc", [[1.0, -1], [0, 2]], [[[1.0, 2]], [[3, 4]]],
                                      [[[5.0, 6]], [[7, 8]]]), [[27, 29], [38, 46]])


def test_conv2d_sums_each_window(xp: Any) -> None:
    out = run(xp, "conv2d", GRID, np.ones((1, 1, 2, 2)), **conv_attrs(stride=2))
    np.testing.assert_array_equal(out[0, 0], [[10, 18], [42, 50]])  # 0+1+4+5, 2+3+6+7, ...


def test_conv2d_padding_counts_neighbours(xp: Any) -> None:
    out = run(xp, "conv2d", np.ones((1, 1, 3, 3)), np.ones((1, 1, 3, 3)), **conv_attrs(padding=1))
    np.testing.assert_array_equal(out[0, 0], [[4, 6, 4], [6, 9, 6], [4, 6, 4]])


def test_conv2d_dilation_and_groups(xp: Any) -> None:
    # dilation 2: a 2x2 kernel reads corners of 3x3 windows
    out = run(xp, "conv2d", GRID, np.ones((1, 1, 2, 2)), **conv_attrs(dilation=2))
    np.testing.assert_array_equal(out[0, 0], [[0 + 2 + 8 + 10, 1 + 3 + 9 + 11], [4 + 6 + 12 + 14, 5 + 7 + 13 + 15]])
    # depthwise: channel 0 times 1, channel 1 times 2
    x = np.stack([GRID[0, 0], -GRID[0, 0]])[None]
    out = run(xp, "conv2d", x, [[[[1.0]]], [[[2.0]]]], **conv_attrs(groups=2))
    np.testing.assert_array_equal(out[0], [GRID[0, 0], -2 * GRID[0, 0]])


def test_conv2d_asymmetric_kernel(xp: Any) -> None:
    out = run(xp, "conv2d", GRID, np.ones((1, 1, 1, 3)),
              stride=(1, 1), padding=(0, 1), dilation=(1, 1), groups=1)
    np.testing.assert_array_equal(out[0, 0, 0], [0 + 1, 0 + 1 + 2, 1 + 2 + 3, 2 + 3])


def test_conv2d_grads_known(xp: Any) -> None:
    attrs = conv_attrs(stride=2)
    g = np.ones((1, 1, 2, 2))
    # every input pixel is read exactly once by a 2x2 stride-2 kernel of ones
    np.testing.assert_array_equal(run(xp, "conv2d_grad_input", g, np.ones((1, 1, 2, 2)), input_hw=(4, 4), **attrs),
                                  np.ones((1, 1, 4, 4)))
    # d/dw[i, j] = sum of the pixels at tap (i, j)
    dw = run(xp, "conv2d_grad_weight", GRID, g, kernel=(2, 2), **attrs)
    np.testing.assert_array_equal(dw[0, 0], [[0 + 2 + 8 + 10, 1 + 3 + 9 + 11], [4 + 6 + 12 + 14, 5 + 7 + 13 + 15]])


def test_pooling(xp: Any) -> None:
    attrs = {"kernel": (2, 2), "stride": (2, 2), "padding": (0, 0)}
    np.testing.assert_array_equal(run(xp, "max_pool2d", GRID, **attrs)[0, 0], [[5, 7], [13, 15]])
    np.testing.assert_array_equal(run(xp, "avg_pool2d", GRID, **attrs)[0, 0], [[2.5, 4.5], [10.5, 12.5]])
    dx = run(xp, "max_pool2d_grad", GRID, np.ones((1, 1, 2, 2)), **attrs)[0, 0]
    np.testing.assert_array_equal(dx, [[0, 0, 0, 0], [0, 1, 0, 1], [0, 0, 0, 0], [0, 1, 0, 1]])
    dx = run(xp, "avg_pool2d_grad", np.ones((1, 1, 2, 2)), input_hw=(4, 4), **attrs)[0, 0]
    np.testing.assert_array_equal(dx, np.full((4, 4), 0.25))
    padded = run(xp, "max_pool2d", -GRID, kernel=(3, 3), stride=(2, 2), padding=(1, 1))
    np.testing.assert_array_equal(padded[0, 0], [[0, -1], [-4, -5]])  # padding never wins a max
    np.testing.assert_array_equal(run(xp, "global_avg_pool", GRID), [[7.5]])


def test_avg_pool_without_padding_in_the_count(xp: Any) -> None:
    ones = np.ones((1, 1, 3, 3))
    attrs = {"kernel": (3, 3), "stride": (1, 1), "padding": (1, 1)}
    np.testing.assert_allclose(run(xp, "avg_pool2d", ones, **attrs)[0, 0, 0, 0], 4 / 9)  # corner: 4 of 9 real
    np.testing.assert_allclose(run(xp, "avg_pool2d", ones, count_include_pad=False, **attrs)[0, 0], np.ones((3, 3)))
    dx = run(xp, "avg_pool2d_grad", np.ones((1, 1, 3, 3)), input_hw=(3, 3), count_include_pad=False, **attrs)
    # the corner pixel feeds 4 windows of 4, 6, 6 and 9 real pixels
    np.testing.assert_allclose(dx[0, 0, 0, 0], 1 / 4 + 1 / 6 + 1 / 6 + 1 / 9)


def test_pad_crop_and_causal_mask(xp: Any) -> None:
    x = np.arange(4.0).reshape(1, 1, 2, 2)
    padded = run(xp, "pad2d", x, padding=(0, 1, 1, 0))
    np.testing.assert_array_equal(padded[0, 0], [[0, 0, 1], [0, 2, 3], [0, 0, 0]])
    np.testing.assert_array_equal(run(xp, "crop2d", padded, padding=(0, 1, 1, 0)), x)
    masked = run(xp, "causal_mask", np.ones((2, 2)), fill=-np.inf)
    np.testing.assert_array_equal(masked, [[1, -np.inf], [1, 1]])
    np.testing.assert_allclose(run(xp, "softmax", masked, axis=1), [[1, 0], [0.5, 0.5]])


def test_softmax_family(xp: Any) -> None:
    np.testing.assert_allclose(run(xp, "softmax", [[0.0, math.log(3)]], axis=1), [[0.25, 0.75]])
    np.testing.assert_allclose(run(xp, "log_softmax", [[0.0, 0.0]], axis=1), [[-math.log(2)] * 2])
    # stable at magnitudes where a naive exp overflows
    np.testing.assert_allclose(run(xp, "softmax", [[1000.0, 1000.0]], axis=1), [[0.5, 0.5]])
    np.testing.assert_allclose(run(xp, "log_softmax", [[1000.0, 0.0]], axis=1), [[0.0, -1000.0]])


def test_norms(xp: Any) -> None:
    s = math.sqrt(2 / 3)
    np.testing.assert_allclose(run(xp, "layer_norm", [[1.0, 2, 3]], [1.0, 1, 1], [0.0, 0, 0], eps=0.0),
                               [[-1 / s, 0, 1 / s]])
    np.testing.assert_allclose(run(xp, "layer_norm", [[1.0, 2, 3]], [2.0, 2, 2], [1.0, 1, 1], eps=0.0),
                               [[1 - 2 / s, 1, 1 + 2 / s]])
    r = math.sqrt(14 / 3)  # root mean square of 1, 2, 3: no mean taken out
    np.testing.assert_allclose(run(xp, "rms_norm", [[1.0, 2, 3]], [1.0, 1, 2], eps=0.0), [[1 / r, 2 / r, 6 / r]])
    x = np.array([1.0, 3.0]).reshape(2, 1, 1, 1)
    np.testing.assert_allclose(run(xp, "batch_norm", x, [1.0], [0.0], eps=0.0).ravel(), [-1, 1])
    # a large common offset does not cost precision (two-pass variance)
    np.testing.assert_allclose(run(xp, "batch_norm", x + 1e8, [1.0], [0.0], eps=0.0).ravel(), [-1, 1])


def test_losses(xp: Any) -> None:
    np.testing.assert_allclose(run(xp, "softmax_cross_entropy", [[0.0, 0.0]], IntArray([0])), math.log(2))
    np.testing.assert_allclose(run(xp, "softmax_cross_entropy", [[math.log(3), 0.0], [0.0, 0.0]], IntArray([0, 1])),
                               (math.log(4 / 3) + math.log(2)) / 2)
    np.testing.assert_allclose(run(xp, "softmax_cross_entropy", [[1000.0, 0.0]], IntArray([1])), 1000.0)
    np.testing.assert_allclose(run(xp, "softmax_cross_entropy_grad", [[0.0, 0.0]], IntArray([0]), 1.0),
                               [[-0.5, 0.5]])
    np.testing.assert_allclose(run(xp, "mse_loss", [1.0, 2.0], [0.0, 0.0]), 2.5)
    np.testing.assert_allclose(run(xp, "mse_loss_grad", [1.0, 2.0], [0.0, 0.0], 1.0), [1.0, 2.0])


def test_elementwise(xp: Any) -> None:
    np.testing.assert_allclose(run(xp, "gelu", [0.0, 1.0, -0.5]), [0.0, 0.8411919906082768, -0.15428599017485606])
    np.testing.assert_allclose(run(xp, "sigmoid", [0.0, -1000.0, 1000.0]), [0.5, 0.0, 1.0])
    np.testing.assert_allclose(run(xp, "erf", [0.0, 0.5, -2.0]), [0.0, math.erf(0.5), math.erf(-2.0)], rtol=1e-15)
    np.testing.assert_allclose(run(xp, "erf_grad", [0.5], [3.0]), [3.0 * 2 / math.sqrt(math.pi) * math.exp(-0.25)])
    np.testing.assert_array_equal(run(xp, "relu", [-1.0, 0.0, 2.0]), [0, 0, 2])
    np.testing.assert_array_equal(run(xp, "relu_grad", [0.0, 0.0, 2.0], [5.0, 5.0, 5.0]), [0, 0, 5])
    np.testing.assert_allclose(run(xp, "tanh_grad", [0.5], [2.0]), [1.5])
    np.testing.assert_allclose(run(xp, "sigmoid_grad", [0.5], [2.0]), [0.5])
    np.testing.assert_allclose(run(xp, "pow_scalar", [4.0], exponent=0.5), [2.0])
    np.testing.assert_allclose(run(xp, "pow_scalar_grad", [4.0], [1.0], exponent=0.5), [0.25])
    np.testing.assert_allclose(run(xp, "div_grad_rhs", [1.0], [3.0], [2.0]), [-0.75])
    np.testing.assert_array_equal(run(xp, "add", [[1.0], [2.0]], [10.0, 20.0]), [[11, 21], [12, 22]])


def test_broadcast_adjoints(xp: Any) -> None:
    np.testing.assert_array_equal(run(xp, "sum_to", np.ones((2, 3, 4)), shape=(3, 1)), np.full((3, 1), 8.0))
    out = run(xp, "broadcast_to", [1.0, 2.0], shape=(2, 3), axes=(1,), scale=0.5)
    np.testing.assert_array_equal(out, [[0.5] * 3, [1.0] * 3])
    np.testing.assert_array_equal(run(xp, "slice_grad", [[7.0]], axis=1, start=2, stop=3, step=1, size=4),
                                  [[0, 0, 7, 0]])


def test_shape_ops(xp: Any) -> None:
    x = np.arange(6.0).reshape(2, 3)
    np.testing.assert_array_equal(run(xp, "permute", x, perm=(1, 0)), x.T)
    np.testing.assert_array_equal(run(xp, "reshape", x, shape=(3, 2)), x.reshape(3, 2))
    np.testing.assert_array_equal(run(xp, "concat", x, x, axis=0), np.vstack([x, x]))
    np.testing.assert_array_equal(run(xp, "slice", x, axis=1, start=0, stop=3, step=2), [[0, 2], [3, 5]])
    np.testing.assert_array_equal(run(xp, "sum", x, axes=(1,), keepdims=False), [3, 12])
    np.testing.assert_array_equal(run(xp, "mean", x, axes=(0, 1), keepdims=True), [[2.5]])


def test_embedding(xp: Any) -> None:
    table = [[1.0, 2], [3, 4], [5, 6]]
    np.testing.assert_array_equal(run(xp, "embedding", IntArray([2, 0]), table), [[5, 6], [1, 2]])
    # repeated ids accumulate their gradients
    g = [[1.0, 1], [2, 2], [3, 3]]
    np.testing.assert_array_equal(run(xp, "embedding_grad", IntArray([2, 0, 2]), g, vocab=3),
                                  [[2, 2], [0, 0], [4, 4]])


def test_dropout_masks(xp: Any) -> None:
    x = np.ones((64, 64))
    a = run(xp, "dropout", x, p=0.5, seed=3, train_step=1)
    assert set(np.unique(a)) <= {0.0, 2.0}
    assert 0.4 < (a == 0).mean() < 0.6
    np.testing.assert_array_equal(a, run(xp, "dropout", x, p=0.5, seed=3, train_step=1))
    assert not np.array_equal(a, run(xp, "dropout", x, p=0.5, seed=3, train_step=2))
    assert not np.array_equal(a, run(xp, "dropout", x, p=0.5, seed=4, train_step=1))


@pytest.mark.parametrize("shape", [(8, 16, 16), (64, 512, 256)])  # the second large enough to stage in blocks
def test_a_later_micro_batch_or_rank_draws_the_whole_batch_s_mask(shape: tuple[int, int, int]) -> None:
    """Dropout over the second half of a batch, told where it starts (a micro-batch's ``offset``, a rank's
    ``rank_stride``), keeps the elements the whole batch's mask keeps, in bf16 too (a staged block's own
    offset replaced the micro-batch's before)."""
    import ml_dtypes

    from swapdsl.graph.ir import DType, TensorType
    from swapdsl.graph.ops.kernels import kernel_of, staged
    from swapdsl.graph.ops.registry import KernelContext

    class Rank1:
        def Get_rank(self) -> int:  # noqa: N802
            return 1

    rows, half = shape[0], (shape[0] // 2, *shape[1:])
    x = np.ones(shape, ml_dtypes.bfloat16)
    a = {"p": 0.5, "seed": 3}
    whole = np.empty_like(x)
    kernel_of("dropout", (TensorType(shape, DType.bf16),), TensorType(shape, DType.bf16), a)(
        KernelContext.standalone(np, 1 << 27), [x], whole, a)
    part_type = TensorType(half, DType.bf16)
    assert (staged("dropout", (part_type,), part_type, a) is not None) == (rows == 64)  # both ways tried
    n = int(np.prod(half))
    for context, told in ((KernelContext.standalone(np, 1 << 27), {"offset": n}),
                          (KernelContext.standalone(np, 1 << 27, comm=Rank1()), {"rank_stride": n})):
        part = np.empty(half, ml_dtypes.bfloat16)
        kernel_of("dropout", (part_type,), part_type, a | told)(context, [x[rows // 2:]], part, a | told)
        np.testing.assert_array_equal(part.astype(np.float32), whole[rows // 2:].astype(np.float32))


@pytest.mark.parametrize("p", [0.1, 0.3, 0.7])
def test_dropout_scales_in_the_tensors_float_type(xp: Any, p: float) -> None:
    """f64: kept elements are x / (1 - p) to f64 rounding (a float32 scale was 5e-8 off at p = 0.1)."""
    x = np.random.default_rng(0).standard_normal((32, 32))
    a = run(xp, "dropout", x, p=p, seed=3)
    kept = a != 0
    np.testing.assert_array_equal(a[kept], x[kept] * (1.0 / (1.0 - p)))
    x32 = xp.asarray(x.astype(np.float32))
    b = to_host(run_kernel(xp, "dropout", [x32], {"p": p, "seed": 3}, 1))
    np.testing.assert_array_equal(b[kept], x.astype(np.float32)[kept] * (np.float32(1) / np.float32(1 - p)))


def test_optimizer_updates(xp: Any) -> None:
    np.testing.assert_allclose(run(xp, "sgd", [1.0], [0.5], lr=0.1, weight_decay=0.0), [0.95])
    np.testing.assert_allclose(run(xp, "sgd", [1.0], [0.5], lr=0.1, weight_decay=0.5), [0.9])
    np.testing.assert_allclose(run(xp, "momentum", [2.0], [0.5], [1.0], momentum=0.9, weight_decay=0.0), [2.3])
    np.testing.assert_allclose(run(xp, "sgd_apply", [1.0], [2.0], lr=0.1), [0.8])
    m = run(xp, "adam_m", [0.0], [0.5], [1.0], beta1=0.9, weight_decay=0.0)
    v = run(xp, "adam_v", [0.0], [0.5], [1.0], beta2=0.999, weight_decay=0.0)
    np.testing.assert_allclose((m, v), ([0.05], [0.00025]))
    # with weight decay both moments see g + wd * w (1.0 here), the second one squared
    m = run(xp, "adam_m", [0.0], [0.5], [1.0], beta1=0.9, weight_decay=0.5)
    v = run(xp, "adam_v", [0.0], [0.5], [1.0], beta2=0.999, weight_decay=0.5)
    np.testing.assert_allclose((m, v), ([0.1], [0.001]))
    # step 1 with bias correction moves each weight by lr against the gradient's sign
    w = run(xp, "adam_apply", [1.0], m, v, lr=0.01, beta1=0.9, beta2=0.999, eps=1e-12, train_step=1)
    np.testing.assert_allclose(w, [0.99])


def test_fill_and_cast(xp: Any) -> None:
    np.testing.assert_array_equal(run(xp, "fill", shape=(2,), value=1.5, dtype="f32"), [1.5, 1.5])
    out = run(xp, "cast", [1.7], dtype="i32")
    assert out.dtype == np.int32 and out[0] == 1


@pytest.mark.parametrize("beta2", [0.999, 0.9999, 0.99999])
def test_f32_adam_first_step_is_unbiased(xp: Any, beta2: float) -> None:
    """Adam's first step in f32 moves each weight by lr * g / (|g| + eps), as in exact arithmetic: every
    constant is formed in f64 and rounded once (forming 1 - beta in f32 scaled v by a factor != 1)."""
    g = np.array([0.5, -1e-3, 3.0, 2e-4], dtype=np.float32)
    zero = np.zeros(4, dtype=np.float32)
    f32 = [xp.asarray(a) for a in (zero, g, zero)]
    hp = {"beta1": 0.9, "beta2": beta2, "weight_decay": 0.0}
    m = run_kernel(xp, "adam_m", f32, hp)
    v = run_kernel(xp, "adam_v", f32, hp)
    out = run_kernel(xp, "adam_apply", [xp.asarray(zero), m, v], {**hp, "lr": 1e-3, "eps": 1e-12})
    assert to_host(out).dtype == np.float32
    step = -to_host(out).astype(np.float64)
    exact = 1e-3 * g.astype(np.float64) / (np.abs(g.astype(np.float64)) + 1e-12)
    assert np.max(np.abs(step - exact) / np.abs(exact)) < 3e-7  # PyTorch: <= 1.2e-7
    # the moments themselves, to f32 rounding
    np.testing.assert_allclose(to_host(v), (1 - beta2) * g.astype(np.float64) ** 2, rtol=3e-7)
    np.testing.assert_allclose(to_host(m), 0.1 * g.astype(np.float64), rtol=3e-7)


def test_concat_of_many_inputs_copies_into_slices() -> None:
    """CuPy's concatenate of more than 8 arrays copies a pointer table from the host on every call, which a
    CUDA graph cannot capture (the LSTM's unrolled outputs): the kernel copies each input into its slice,
    here on an array module without `concatenate`."""
    import types

    xp = types.SimpleNamespace(**{k: getattr(np, k) for k in dir(np) if not k.startswith("__") and k != "concatenate"})
    xp.__name__ = "numpy"
    parts = [np.full((2, i + 1, 3), i, np.float32) for i in range(12)]
    np.testing.assert_array_equal(run_kernel(xp, "concat", parts, {"axis": 1}), np.concatenate(parts, axis=1))


def test_an_axis_outside_the_inputs_rank_is_refused() -> None:
    """The language and the importer normalise axes; a graph built by hand with axis -1 would otherwise
    reach kernels that read it as no axis at all."""
    from swapdsl.common.errors import SwpError
    from swapdsl.graph.ir import DType, TensorType
    from swapdsl.graph.ops.registry import infer

    x = TensorType((2, 4), DType.f32)
    assert infer("softmax", (x,), {"axis": 1}) == x
    for axis in (-1, 2):
        with pytest.raises(SwpError, match="not an axis"):
            infer("softmax", (x,), {"axis": axis})
