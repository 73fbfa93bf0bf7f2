"""Optimisers, learning-rate schedules and gradient clipping (issue 38, items 4 and 5): each against
PyTorch (torch.optim's SGD with Nesterov momentum, AdamW, the lr_scheduler classes and
clip_grad_norm_) over 5 steps to 1e-6 in f32, and Lion against its paper's update written in f64
NumPy (PyTorch has no Lion); and the hyper-parameters a model may not use."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import swapdsl
from conftest import MODELS, write
from swapdsl.common.errors import SwpError
from swapdsl.graph.ops.kernels import run_kernel
from swapdsl.runtime.data import init_persistent, synthetic_inputs
from swapdsl.runtime.reference import Trainer

ARGS = {"batch": 8, "features": 12, "hidden": 16, "depth": 2, "classes": 5}
MLP = (MODELS / "mlp.swp").read_text()


def _model(tmp_path: Path, minimize: str) -> swapdsl.Model:
    text = MLP.replace("minimize loss with sgd(lr = lr, momentum = 0.9)", f"minimize loss with {minimize}")
    assert text != MLP
    return swapdsl.load(write(tmp_path / "m.swp", text), **ARGS)


def _ours(m: swapdsl.Model, steps: int) -> tuple[list[float], dict[str, np.ndarray], dict[str, float]]:
    trainer = Trainer(m.training, 0, np)
    losses = [trainer.step(s) for s in range(1, steps + 1)]
    return losses, {p: np.asarray(trainer.persistent[p]) for p in m.training.params}, trainer.metrics()


def _relative(ours: dict[str, np.ndarray], theirs: dict[str, np.ndarray]) -> float:
    keys = sorted(theirs)
    a, b = (np.concatenate([d[k].ravel().astype(np.float64) for k in keys]) for d in (ours, theirs))
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


CASES = {
    "sgd-nesterov": ("sgd(lr = 0.1, momentum = 0.9, nesterov = 1, weight_decay = 0.01)",
                     lambda p, torch: torch.optim.SGD(p, lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01),
                     None, 0.0),
    "adamw": ("adamw(lr = 0.01, weight_decay = 0.1)",
              lambda p, torch: torch.optim.AdamW(p, lr=0.01, weight_decay=0.1), None, 0.0),
    "adam-l2": ("adam(lr = 0.01, weight_decay = 0.1)",
                lambda p, torch: torch.optim.Adam(p, lr=0.01, weight_decay=0.1), None, 0.0),
    "warmup-cosine-clip": (
        "adamw(lr = 0.02, warmup = 2, cosine = 5, min_lr = 0.002, clip = 0.5)",
        lambda p, torch: torch.optim.AdamW(p, lr=0.02),
        lambda o, torch: torch.optim.lr_scheduler.SequentialLR(o, [
            torch.optim.lr_scheduler.LinearLR(o, start_factor=0.5, total_iters=1),
            torch.optim.lr_scheduler.CosineAnnealingLR(o, T_max=3, eta_min=0.002)], milestones=[2]), 0.5),
    "linear": ("sgd(lr = 0.1, linear = 4, min_lr = 0.01)", lambda p, torch: torch.optim.SGD(p, lr=0.1),
               lambda o, torch: torch.optim.lr_scheduler.LinearLR(o, 1.0, 0.1, total_iters=4), 0.0),
    "step": ("sgd(lr = 0.1, momentum = 0.5, step_every = 2, gamma = 0.5, clip = 1.0)",
             lambda p, torch: torch.optim.SGD(p, lr=0.1, momentum=0.5),
             lambda o, torch: torch.optim.lr_scheduler.StepLR(o, 2, 0.5), 1.0),
}


@pytest.mark.parametrize("case", list(CASES))
def test_optimisers_schedules_and_clipping_match_pytorch(case: str, tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    from torch_twin import train

    minimize, optimizer, schedule, clip = CASES[case]
    m = _model(tmp_path, minimize)
    values = {**init_persistent(m.training, 0, np), **synthetic_inputs(m.training, 0, np)}
    theirs = train(m.graph, values, 5, lambda p: optimizer(p, torch),
                   None if schedule is None else (lambda o: schedule(o, torch)), clip)
    losses, params, metrics = _ours(m, 5)
    assert np.allclose(losses, theirs[0], rtol=1e-6, atol=0)
    assert _relative(params, theirs[2]) < 1e-6
    if clip:
        assert metrics["grad_norm"] > 0


@pytest.mark.parametrize("spec, rates", [
    ({"warmup": 4}, [0.25, 0.5, 0.75, 1, 1, 1]),
    ({"cosine": 4}, [1, (1 + np.cos(np.pi / 4)) / 2, 0.5, (1 + np.cos(3 * np.pi / 4)) / 2, 0, 0]),
    ({"warmup": 2, "linear": 4, "min_lr": 0.5}, [0.5, 1, 1, 0.75, 0.5, 0.5]),
    ({"step_every": 2, "gamma": 0.1}, [1, 1, 0.1, 0.1, 0.01, 0.01]),
])
def test_the_learning_rate_follows_the_device_s_step_counter(spec: dict, rates: list[float]) -> None:
    from swapdsl.graph.ops.optim import learning_rate
    from swapdsl.graph.ops.registry import KernelContext, Scratch

    for step, want in enumerate(rates, start=1):
        ctx = KernelContext(np, Scratch(np.zeros(4096, np.uint8)), np.array(step, np.int64))
        got = float(learning_rate(ctx, {"lr": 1.0, **spec}, np.dtype(np.float64)))
        assert got == pytest.approx(want, rel=1e-12, abs=1e-15)


def _lion_numpy(w: np.ndarray, m: np.ndarray, g: np.ndarray, lr: float, b1: float, b2: float, wd: float):
    """Lion (Chen et al. 2023, Algorithm 2) in f64: the oracle, PyTorch having no Lion."""
    c = b1 * m + (1 - b1) * g
    return w - lr * (np.sign(c) + wd * w), b2 * m + (1 - b2) * g


def test_lion_follows_its_paper() -> None:
    rng = np.random.default_rng(4)
    w, m, g = (rng.standard_normal(1000) for _ in range(3))
    a = {"lr": 0.01, "beta1": 0.9, "decoupled_wd": 0.1}
    new_w = np.asarray(run_kernel(np, "lion_apply", [w.copy(), m.copy(), g.copy()], a, 1))
    new_m = np.asarray(run_kernel(np, "lion_m", [m.copy(), g.copy()], {"beta2": 0.99}, 1))
    want_w, want_m = _lion_numpy(w, m, g, 0.01, 0.9, 0.99, 0.1)
    np.testing.assert_allclose(new_w, want_w, rtol=1e-14)
    np.testing.assert_allclose(new_m, want_m, rtol=1e-14)


def test_lion_trains(tmp_path: Path) -> None:
    losses = _ours(_model(tmp_path, "lion(lr = 0.003, weight_decay = 0.1)"), 20)[0]
    assert losses[-1] < 0.6 * losses[0]


def test_a_model_without_these_keeps_its_graph(tmp_path: Path) -> None:
    m = _model(tmp_path, "sgd(lr = lr, momentum = 0.9, warmup = 0, clip = 0, nesterov = 0)")
    assert str(m.graph.optimizer) == "sgd(lr=0.1, momentum=0.9, weight_decay=0.0)"


@pytest.mark.parametrize("minimize, message", [
    ("adam(lr = 0)", "`lr` must be positive"), ("adam(beta1 = 1)", "`beta1` must be in [0, 1)"),
    ("sgd(lr = 0.1, nesterov = 1)", "needs `momentum` > 0"), ("sgd(lr = 0.1, nesterov = 2)", "0 or 1"),
    ("adam(warmup = 2.5)", "whole number"), ("adam(cosine = 10, linear = 10)", "one decay at a time"),
    ("adam(warmup = 10, cosine = 5)", "after the warmup"), ("adam(min_lr = 1)", "`min_lr` must be in"),
    ("adam(clip = -1)", "must not be negative"), ("adam(gamma = 0, step_every = 3)", "`gamma` must be positive"),
    ("adam(schedule = 3)", "schedule"), ("lion(eps = 1e-8)", "eps"),
])
def test_bad_hyper_parameters_are_refused(minimize: str, message: str, tmp_path: Path) -> None:
    with pytest.raises(SwpError, match=message.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
        _model(tmp_path, minimize)


def test_lion_without_weight_decay_takes_only_the_scratch_it_declares(tmp_path: Path) -> None:
    losses = _ours(_model(tmp_path, "lion(lr = 0.003)"), 3)[0]  # the reference gives each kernel its declaration
    assert losses[-1] < losses[0]
