"""The reference executor and `swapdsl exec` / `check --training` on model files."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from conftest import MODELS, SMALL_MODELS, build_graph, write
from swapdsl.graph.autodiff import training_graph
from swapdsl.runtime.reference import train


@pytest.mark.parametrize("name", SMALL_MODELS)
def test_thirty_steps_lower_the_loss(cli, name: str) -> None:
    code, out, err = cli("exec", MODELS / f"{name}.swp", "--steps", "30", "--backend", "numpy", "--json")
    assert code == 0, err
    info = json.loads(out)
    assert info["backend"] == "numpy" and info["steps"] == 30
    assert len(info["loss"]) == len(info["step_ms"]) == 30
    assert info["loss"][-1] < 0.6 * info["loss"][0]


def test_same_seed_same_losses_bit_for_bit() -> None:
    t = training_graph(build_graph(str(MODELS / "tiny_transformer.swp"), ["depth=1", "seq=8"])[1])
    a = train(t, 3, seed=5, xp=np).losses
    b = train(t, 3, seed=5, xp=np).losses
    c = train(t, 3, seed=6, xp=np).losses
    assert a == b
    assert a != c


def test_human_output(cli) -> None:
    code, out, _ = cli("exec", MODELS / "mlp.swp", "--steps", "2", "--backend", "numpy")
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == f"training mlp ({MODELS / 'mlp.swp'}) on numpy with the reference executor (no cap)"
    assert lines[1] == "  steps 1..2 on one synthetic batch, seed 0"
    assert lines[2].startswith("  step 1/2  loss ") and "  accuracy " in lines[2]
    assert lines[-1].startswith("loss ")


PEAK_MODEL = """model p(batch = 2) {
    input x: f32[batch, 3]
    input y: i32[batch]
    param w: [3, 4] = zeros
    loss = softmax_cross_entropy(x @ w, y)
    minimize loss with sgd(lr = 0.1)
}
"""


def test_peak_bytes_by_hand(cli, in_tmp: Path) -> None:
    """Default order: matmul, xent, fill, xent_grad, matmul_tn_fold (dw), sgd (in place).

    w (48 B) is always resident. Live besides it, op by op: x+y (32) + logits (32) = 64;
    + loss (4) = 68; + seed (4) = 72; + dlogits (32) = 104, after which logits, y and the
    seed die (-> 60); + dw (48) = 108, after which x and dlogits die; the update is in place.
    Peak = 48 + 108 = 156 bytes.
    """
    write(in_tmp / "p.swp", PEAK_MODEL)
    code, out, err = cli("check", "p.swp", "--training", "--json")
    assert code == 0, err
    info = json.loads(out)
    assert info["peak_bytes"] == 156
    assert info["ops"] == 6
    assert info["flops"] == (2 * 2 * 4 * 3) + 6 * 8 + 0 + 6 * 8 + (2 * 3 * 4 * 2) + 3 * 12
    assert info["state_bytes"] == 0


def test_an_add_over_its_dead_operand_takes_no_new_bytes(cli, in_tmp: Path) -> None:
    """Forward only: m = x @ w (32 B); u = tanh(m) (+32 = 64); v = u + x, in place over u (still 64;
    96 if not, then u dies); sum(v) (+4 = 68, then v dies: 36); sum(m) (+4, then m dies: 8); the last
    add is in place too. Peak 68, not 96."""
    write(in_tmp / "p.swp", """model p(batch = 2) {
    input x: f32[batch, 4]
    param w: [4, 4] = zeros
    m = x @ w
    loss = sum(tanh(m) + x) + sum(m)
    minimize loss with sgd(lr = 0.1)
}
""")
    code, out, err = cli("check", "p.swp", "--json")
    assert code == 0, err
    assert json.loads(out)["activation_peak_bytes"] == 68


def test_training_json_has_the_figures(cli) -> None:
    code, out, _ = cli("check", MODELS / "tiny_resnet.swp", "--training", "--json")
    assert code == 0
    info = json.loads(out)
    for key in ("ops", "peak_bytes", "flops", "forward_ops", "params"):
        assert key in info
    assert info["flops"] > 2 * info["forward_flops"]  # backward costs about twice the forward
    assert info["peak_bytes"] > info["param_bytes"] + info["state_bytes"]


def test_training_ir_prints_state_and_updates(cli) -> None:
    code, out, _ = cli("check", MODELS / "mlp.swp", "--training", "--ir")
    assert code == 0
    assert "  state:\n    head.b/momentum: f32[10] = zeros" in out
    assert "  updates:\n" in out and "    head.b/momentum <- %" in out


def test_bad_steps_and_backend(cli) -> None:
    code, _, err = cli("exec", MODELS / "mlp.swp", "--steps", "0")
    assert (code, err.splitlines()[0]) == (2, "error: argument --steps: expected an integer at least 1, got 0")
    assert err.splitlines()[1] == "  = hint: see `swapdsl exec --help`"


def test_cupy_backend_without_gpu_is_a_clear_error(cli) -> None:
    from swapdsl.runtime.backend import cupy_available

    if cupy_available():
        pytest.skip("a GPU is present")
    code, _, err = cli("exec", MODELS / "mlp.swp", "--backend", "cupy")
    assert code == 2
    assert err.splitlines()[0] == "error: the cupy backend needs CuPy and a CUDA GPU, and none was found"


@pytest.mark.gpu
def test_cupy_matches_numpy() -> None:
    import cupy

    t = training_graph(build_graph(str(MODELS / "tiny_resnet.swp"), ["batch=4"])[1])
    ref = train(t, 3, seed=0, xp=np).losses
    gpu = train(t, 3, seed=0, xp=cupy).losses
    np.testing.assert_allclose(gpu, ref, rtol=1e-4)


SQUARE_MODEL = """model m(n = 4) {
    input x: f32[3, n]
    param w: f32[n, 2] = xavier
    loss = mean((x * x) @ w)
    minimize loss with sgd(lr = 0.1)
}
"""


def test_an_op_reading_one_tensor_twice_at_its_last_use(cli, in_tmp: Path) -> None:
    """`x * x` reads x twice in its last use: the reference frees it once (it crashed with KeyError)."""
    write(in_tmp / "m.swp", SQUARE_MODEL)
    code, out, err = cli("exec", "m.swp", "--steps", "2", "--backend", "numpy", "--json")
    assert code == 0, err
    assert len(json.loads(out)["loss"]) == 2
    code, _, err = cli("optimize", "m.swp", "--memory", "4KiB", "--method", "belady", "-o", "m.plan")
    assert code == 0, err
    code, out, err = cli("exec", "m.plan", "--steps", "2", "--check", "--backend", "numpy", "--json")
    assert code == 0, err
    assert json.loads(out)["max_rel_diff"] == 0.0
