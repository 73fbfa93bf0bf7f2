"""The host lane's kernels split across threads (runtime/hostsplit.py): each part is the op's own kernel on a
contiguous range, so the result is the same bits as one call, for every update and cast an optimiser puts
on the host, and a whole training run with host updates is the same whatever the threads."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import swapdsl
from conftest import MODELS, write
from swapdsl.graph.ir import DType, Graph, TensorType
from swapdsl.graph.offload import host_split, offloadable
from swapdsl.graph.ops import KernelContext
from swapdsl.graph.ops.kernels import kernel_of, scratch_need
from swapdsl.graph.ops.registry import np_dtype
from swapdsl.plan.program import HostRun
from swapdsl.runtime import hostsplit
from swapdsl.runtime.interpreter import PlanRunner
from test_host_updates import _plan
from test_planners import caps

OPTIMISERS = ["sgd(lr = lr, momentum = 0.9, weight_decay = 0.01)", "sgd(lr = lr, momentum = 0.9, nesterov = 1)",
              "sgd(lr = lr)", "adam(lr = lr, weight_decay = 0.01)", "lion(lr = lr, weight_decay = 0.01)"]


def mlp_with(tmp: Path, optimiser: str, precision: str) -> Graph:
    """The mlp with ``optimiser``; in f16 with the guard that skips a step's updates (gated updates: a flag
    input beside the tensors)."""
    text = (MODELS / "mlp.swp").read_text().replace("sgd(lr = lr, momentum = 0.9)", optimiser)
    args = {"depth": 2, "batch": 8, "features": 32, "hidden": 16}
    guard = "skip" if precision == "f16" else None
    return swapdsl.load(write(tmp / "m.swp", text), args, precision=precision, guard=guard).training


def run_split(op: str, ins: list, out: np.ndarray, a: dict, types: tuple, out_type: TensorType,
              ctx: KernelContext, threads: int) -> None:
    """One call of ``op`` as the host lane makes it, on ``threads`` workers."""
    kernels = hostsplit.HostKernels(threads)
    try:
        kernels.launcher(op, ins, out, a, types, out_type, ctx)()
    finally:
        kernels.close()


def test_parts_cover_the_range_and_none_is_small() -> None:
    assert hostsplit.parts(10, 4) == [(0, 10)]
    n = 5 * hostsplit.MIN_PART + 3
    got = hostsplit.parts(n, 4)
    assert len(got) == 4 and got[0][0] == 0 and got[-1][1] == n
    assert all(a[1] == b[0] for a, b in zip(got, got[1:]))
    assert min(hi - lo for lo, hi in got) >= hostsplit.MIN_PART


@pytest.mark.parametrize("precision", ["f32", "bf16", "f16"])
@pytest.mark.parametrize("optimiser", OPTIMISERS)
def test_each_host_op_split_gives_the_bits_of_one_call(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                       optimiser: str, precision: str) -> None:
    monkeypatch.setattr(hostsplit, "MIN_PART", 7)  # (parts of a few elements: these tensors are small)
    t = mlp_with(tmp_path, optimiser, precision)
    split = host_split(t, offloadable(t))
    rng = np.random.default_rng(0)
    seen = set()
    for i in sorted(split.ops):
        op = t.ops[i]
        types, out_t = tuple(map(t.type_of, op.inputs)), t.type_of(op.outputs[0])
        for flag in (0.0, 1.0) if op.attr_dict.get("gated") else (None,):
            ins = [rng.uniform(0.1, 0.9, x.shape).astype(np_dtype(np, x.dtype.label)) for x in types]
            if flag is not None:
                ins[-1][...] = flag  # (the guard's flag: 1 applies the update, 0 keeps the old value)
            whole, split_out = (np.zeros(out_t.shape, np_dtype(np, out_t.dtype.label)) for _ in range(2))
            ctx = KernelContext.standalone(np, scratch_need(op.op, types, out_t, op.attr_dict), step=3)
            kernel_of(op.op, types, out_t, op.attr_dict)(ctx, ins, whole, op.attr_dict)
            run_split(op.op, ins, split_out, op.attr_dict, types, out_t, ctx, threads=3)
            assert whole.tobytes() == split_out.tobytes(), (op.op, flag)
        seen.add(op.op)
    assert seen & hostsplit.SPLIT_OPS == seen
    assert precision != "f16" or any(t.ops[i].attr_dict.get("gated") for i in split.ops)


def test_the_parts_share_one_scratch_each_across_ops(monkeypatch: pytest.MonkeyPatch) -> None:
    """Host memory for the split kernels' scratch is the most one op's part takes, per part, not a sum over
    the lane's ops."""
    monkeypatch.setattr(hostsplit, "MIN_PART", 64)
    kernels = hostsplit.HostKernels(3)
    try:
        ctx = KernelContext.standalone(np, 1 << 16)
        t = TensorType((3000,), DType.f32)
        a = {"beta1": 0.9, "weight_decay": 0.0}
        for _ in range(5):
            m, g, w = (np.ones(3000, np.float32) for _ in range(3))
            kernels.launcher("adam_m", [m, g, w], m, a, (t, t, t), t, ctx)()
        need = scratch_need("adam_m", (TensorType((1000,), DType.f32),) * 3, TensorType((1000,), DType.f32), a)
        assert len(kernels.scratch) == 3 and all(s.buffer.size == need for s in kernels.scratch)
    finally:
        kernels.close()


def test_a_run_with_host_updates_is_the_same_bits_on_one_thread_and_three(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hostsplit, "MIN_PART", 16)
    t = swapdsl.load(MODELS / "tiny_transformer.swp", {"batch": 2, "seq": 8, "vocab": 32, "dim": 16, "heads": 2,
                                                        "ffn": 32}, precision="bf16").training
    need, no_swap = caps(t)
    plan = _plan(t, (need + no_swap) // 2, "belady", offloadable(t))
    assert any(isinstance(i, HostRun) for i in plan.program)
    ends = []
    for threads in (1, 3):
        runner = PlanRunner(plan, t, "numpy", np, seed=3, host_threads=threads)
        try:
            losses = [runner.step(s)[0] for s in (1, 2, 3)]
            ends.append((losses, {k: v.tobytes() for k, v in runner.persistent_values().items()}))
        finally:
            runner.close()
    assert ends[0] == ends[1]


@pytest.mark.parametrize("value", ["abc", "0", "-2", "1.5", "1e3", "99999", "\u0663"])
def test_a_thread_count_that_is_no_count_is_refused_by_exec(cli, in_tmp: Path, monkeypatch: pytest.MonkeyPatch,
                                                             value: str) -> None:
    """``SWAPDSL_HOST_THREADS`` is read when a plan with host updates starts: anything but 1-1024 is an error
    naming it (exit 2), not a silent default."""
    model = write(in_tmp / "m.swp", (MODELS / "mlp.swp").read_text())
    code, _, err = cli("optimize", model, "--host-updates", "all", "--method", "belady", "--memory", "1/2",
                       "-o", "h.plan")
    assert code == 0, err
    monkeypatch.setenv(hostsplit.THREADS_ENV, value)
    code, _, err = cli("exec", "h.plan", "--steps", "1")
    assert code == 2 and "Traceback" not in err
    assert "SWAPDSL_HOST_THREADS" in err and "from 1 to 1024" in err
    monkeypatch.setenv(hostsplit.THREADS_ENV, " 2 ")
    code, _, err = cli("exec", "h.plan", "--steps", "1")
    assert code == 0, err
