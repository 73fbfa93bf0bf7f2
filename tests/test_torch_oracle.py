"""Kernels against PyTorch (CPU), an independent oracle; skipped where torch is not installed (`.ci/run`
installs it; swapdsl never depends on it)."""

from __future__ import annotations

import numpy as np
import pytest

from swapdsl.graph.ops.registry import run_kernel

torch = pytest.importorskip("torch")


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("p", [0.1, 0.25, 0.5])
def test_dropout_keeps_elements_scaled_as_pytorch_does(dtype: str, p: float) -> None:
    """The masks differ by design (ours hash (seed, step, element)); where both keep an element, the value is
    the same to the last bit, in f64 as in f32."""
    x = np.random.default_rng(1).standard_normal(1 << 14).astype(dtype)
    torch.manual_seed(0)
    theirs = torch.nn.functional.dropout(torch.from_numpy(x), p, training=True).numpy()
    ours = np.asarray(run_kernel(np, "dropout", [x.copy()], {"p": p, "seed": 5}, 1))
    both = (theirs != 0) & (ours != 0)
    assert both.sum() > 0.3 * x.size * (1 - p) ** 2
    np.testing.assert_array_equal(ours[both], theirs[both])
    assert abs((ours == 0).mean() - p) < 0.02
