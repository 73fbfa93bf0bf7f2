"""The plan interpreter: plans run under their cap and match the reference executor."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import attrs
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from conftest import MODELS, REPO, build_graph, safety, write
from strategies import EVERY, training_graphs
from swapdsl.graph.autodiff import training_graph
from swapdsl.graph.ir import Graph
from swapdsl.plan.program import Plan, Run, SwapIn
from swapdsl.plan.validate import PlanInvalid, validate
from swapdsl.planning.policy import METHODS
from swapdsl.runtime import backend
from swapdsl.runtime.backend import to_host
from swapdsl.runtime.interpreter import PlanRunner
from swapdsl.runtime.reference import Trainer
from test_planners import caps, plan_for

SMALL = {
    "mlp": ["batch=8", "features=32", "hidden=16"],
    "tiny_transformer": ["batch=2", "seq=8", "vocab=32", "dim=16", "heads=2", "ffn=32"],
    "tiny_resnet": ["batch=4", "width=4", "blocks=1"],
    "resnet": ["depth=18", "base=4", "image=32", "batch=2", "classes=5"],
    "vgg": ["base=2", "fc=16", "image=32", "batch=2", "classes=5"],
    "inception_v4": ["image=75", "batch=1", "classes=5"],
    "nasnet": ["cells=2", "filters=8", "stem=4", "image=32", "batch=2", "classes=5"],
    "lstm_lm": ["layers=2", "hidden=8", "vocab=12", "seq=4", "batch=2"],
    "bert": ["layers=1", "hidden=16", "heads=2", "intermediate=32", "seq=4", "vocab=20", "positions=8",
             "batch=2"],
    "gpt": ["layers=1", "hidden=16", "heads=2", "seq=4", "vocab=20", "positions=8", "batch=2"],
}


_REFERENCE: dict[int, tuple[Graph, list[tuple[float, dict[str, np.ndarray]]]]] = {}


def reference_run(t: Graph, steps: int) -> list[tuple[float, dict[str, np.ndarray]]]:
    """(loss, persistent values) after each step, computed once per graph object."""
    cached = _REFERENCE.get(id(t))
    if cached is None or cached[0] is not t or len(cached[1]) < steps:
        ref = Trainer(t, 3, np)
        runs = [(ref.step(s), {k: to_host(v).copy() for k, v in ref.persistent.items()})
                for s in range(1, steps + 1)]
        _REFERENCE.clear()
        _REFERENCE[id(t)] = (t, runs)
    return _REFERENCE[id(t)][1]


def run_against_reference(plan: Plan, t: Graph, steps: int, drop_wait: tuple[int, int] | None = None,
                          **kw: object) -> float:
    """Max relative difference between the plan's execution and the reference, over all steps.
    ``drop_wait`` (instruction, the instruction it waits for): that one wait is left out."""
    runner = PlanRunner(plan, t, "numpy", np, seed=3, **kw)  # type: ignore[arg-type]
    if drop_wait is not None:
        k, w = drop_wait
        i = next(i for i, work in enumerate(runner.work) if work.index == k)
        assert w in runner.work[i].waits
        runner.work[i] = runner.work[i]._replace(waits=tuple(x for x in runner.work[i].waits if x != w))
    worst = 0.0
    try:
        assert runner.arena.nbytes == plan.cap
        for step, (expected, state) in enumerate(reference_run(t, steps)[:steps], start=1):
            loss, _ = runner.step(step)
            worst = max(worst, abs(loss - expected) / max(abs(expected), 1e-12))
            for name, value in runner.persistent_values().items():
                want = state[name]
                worst = max(worst, float(np.max(np.abs(value - want))) / max(float(np.max(np.abs(want))), 1e-12))
    finally:
        runner.close()
    return worst


@functools.cache
def small_training_graph(name: str) -> Graph:
    return training_graph(build_graph(str(MODELS / f"{name}.swp"), SMALL[name])[1])


def test_a_0d_value_reaches_the_device_as_0d() -> None:
    """A report's state is a 0-d tensor: on CuPy its initial value is copied with ``ndarray.set``, which
    refuses a (1,) array for a () one (``np.ascontiguousarray`` made that). A stand-in records the shape."""
    import types

    import ml_dtypes

    got = []
    dst = types.SimpleNamespace(set=lambda a: got.append((a.shape, a.dtype)), dtype=np.dtype(np.float32))
    PlanRunner._put(types.SimpleNamespace(backend="cupy"), dst, np.array(2.5, np.float32))
    PlanRunner._put(types.SimpleNamespace(backend="cupy"), dst, np.ones((2, 3), np.float32)[:, 1])
    bits = types.SimpleNamespace(set=dst.set, dtype=np.dtype(np.uint16))  # (bf16 on CuPy: its bits)
    PlanRunner._put(types.SimpleNamespace(backend="cupy"), bits, np.ones(3, ml_dtypes.bfloat16))
    assert got == [((), np.float32), ((2,), np.float32), ((3,), np.uint16)]


def test_the_cupy_backend_turns_off_cupys_reduction_accelerators(monkeypatch: pytest.MonkeyPatch) -> None:
    """CuPy 14's CUB and cuTENSOR reductions take temporaries from CuPy's pool, outside the arena: the cupy
    backend turns them off, before CuPy is imported (the environment) and after (a stand-in records it)."""
    import os
    import sys
    import types

    calls = []
    core = types.SimpleNamespace(set_routine_accelerators=lambda v: calls.append(("routine", v)),
                                 set_reduction_accelerators=lambda v: calls.append(("reduction", v)))
    fake = types.SimpleNamespace(_core=core)
    monkeypatch.setitem(sys.modules, "cupy", fake)
    monkeypatch.setattr(backend, "cupy_available", lambda: True)
    assert backend.array_module("cupy") == ("cupy", fake)
    assert calls == [("routine", []), ("reduction", [])]
    assert "CUPY_ACCELERATORS" in os.environ


@pytest.mark.parametrize("name", list(SMALL))
def test_plans_match_the_reference(name: str) -> None:
    t = small_training_graph(name)
    need, no_swap = caps(t)
    for cap in sorted({max(no_swap // 2, need), need}):  # (random graphs cover the caps between)
        for method in sorted(METHODS):
            plan = plan_for(t, cap, method)
            assert run_against_reference(plan, t, steps=3) <= 1e-5, (name, cap, method)


def test_gradient_sums_run_in_place() -> None:
    """The LSTM's weight gradients are summed over its time steps by matmuls that add into the sum so
    far, its other gradient sums by adds; at the smallest cap every one of them runs over the sum, in
    its region, and the steps still match the reference."""
    t = small_training_graph("lstm_lm")
    need, _ = caps(t)
    plan = plan_for(t, need, "belady")
    runs = [i for i in plan.program if isinstance(i, Run)]
    folds = [r for r in runs if t.ops[r.op].op == "matmul_tn_fold_acc"]
    assert len(folds) == 2 * 2 * (4 - 1)  # 2 layers, 2 matmul weights each, 4 steps: one first, 3 summed
    assert all(r.in_place for r in folds)
    assert any(r.in_place for r in runs if t.ops[r.op].op == "add")
    assert run_against_reference(plan, t, steps=3) <= 1e-5


@safety(20)
@given(training_graphs(**EVERY), st.floats(0.0, 1.0), st.sampled_from(sorted(METHODS)))
def test_random_plans_match_the_reference(t: Graph, where: float, method: str) -> None:
    need, no_swap = caps(t)
    plan = plan_for(t, int(need + where * (no_swap - need)), method)
    assert run_against_reference(plan, t, steps=2) <= 1e-5


def test_a_missing_synchronisation_is_caught_and_has_teeth() -> None:
    """The op that reads a swapped-in tensor waits for the copy's event: without that one wait, on a slow
    bus, it reads the region before the copy lands. A plan that moves the swap-in's deadline past that
    op is refused."""
    t = small_training_graph("tiny_resnet")
    need, _ = caps(t)
    plan = plan_for(t, need, "lru")
    k = first_swapin_over_other_data(plan)
    swapin = plan.program[k]
    reader = next(j for j, i in enumerate(plan.program) if isinstance(i, Run) and i.op == swapin.before)
    assert run_against_reference(plan, t, steps=1, copy_delay_s=0.02, drop_wait=(reader, k)) > 1e-3
    assert run_against_reference(plan, t, steps=1, copy_delay_s=0.02) <= 1e-5
    prog = list(plan.program)
    prog[k] = attrs.evolve(swapin, before=max(o.index for o in plan.ops))
    with pytest.raises(PlanInvalid, match="invariant 4"):
        validate(attrs.evolve(plan, program=tuple(prog)))


def first_swapin_over_other_data(plan: Plan) -> int:
    """A swap-in into bytes that last held another tensor, so reading it early gives wrong numbers;
    of those, the one issued closest to its use, so that a slow copy is surely still running, and
    with no later swap-in for the same op (waiting for that one would wait for it too: one stream)."""
    from swapdsl.plan.program import Region, Run

    position = {i.op: k for k, i in enumerate(i for i in plan.program if isinstance(i, Run))}
    writes: list[tuple[Region, str]] = [(t.home, t.name) for t in plan.tensors if isinstance(t.home, Region)]
    found: list[tuple[int, int]] = []
    for i, ins in enumerate(plan.program):
        if isinstance(ins, SwapIn):
            last = next((name for r, name in reversed(writes) if r.overlaps(ins.region)), None)
            alone = not any(isinstance(j, SwapIn) and j.before == ins.before for j in plan.program[i + 1:])
            if last is not None and last != ins.tensor and ins.after >= 0 and alone:
                found.append((position[ins.before] - position[ins.after], i))
            writes.append((ins.region, ins.tensor))
        elif isinstance(ins, Run):
            writes += [(r, name) for name, r in ins.outs]
    assert found, "no such swap-in"
    return min(found)[1]


def test_exec_json_and_check(cli, in_tmp: Path) -> None:
    write(in_tmp / "net.swp", (MODELS / "tiny_resnet.swp").read_text())
    args = ["-D", "batch=4", "-D", "width=4"]
    code, _, err = cli("optimize", "net.swp", "--memory", "1MiB", "--method", "vdnn", "-o", "net.plan", *args)
    assert code == 0, err
    code, out, err = cli("exec", "net.plan", "--steps", "3", "--check", "--backend", "numpy", "--json")
    assert code == 0, err
    info = json.loads(out)
    for key in ("backend", "steps", "loss", "step_ms", "h2d_bytes", "d2h_bytes", "device_arena_bytes",
                "max_rel_diff"):
        assert key in info
    assert info["device_arena_bytes"] == 2**20
    assert info["max_rel_diff"] <= 1e-5
    assert info["h2d_bytes"] > 0 and len(info["loss"]) == 3
    code, _, err = cli("exec", "net.plan", "-D", "batch=8")
    assert (code, err.splitlines()[0]) == (2, "error: -D does not apply to a plan: its model arguments are fixed "
                                                "in the plan")
    (in_tmp / "net.swp").write_text((in_tmp / "net.swp").read_text() + "# changed\n")
    code, _, err = cli("exec", "net.plan")
    assert (code, err.splitlines()[0]) == (2, "error: the model `net.swp` has changed since this plan was made")


def test_profile_feeds_the_planner(cli, in_tmp: Path) -> None:
    write(in_tmp / "m.swp", (MODELS / "mlp.swp").read_text())
    code, out, err = cli("profile", "m.swp", "-D", "batch=8", "-o", "p.json", "--backend", "numpy", "--repeat", "2")
    assert code == 0, err
    profile = json.loads((in_tmp / "p.json").read_text())
    assert profile["name"] == "measured-numpy" and profile["op_times"]
    assert all(v > 0 for v in profile["op_times"].values())
    # the step's kernel time by op name, costliest first, from the same measured times
    counts = _op_counts(in_tmp)
    line = next(x for x in out.splitlines() if x.startswith("kernel time of one step: "))
    step_ms = 1e3 * sum(profile["op_times"][k] * n for k, n in counts)
    assert float(line.split(": ")[1].split(" ms")[0]) == pytest.approx(step_ms, abs=0.06)
    shares = [float(part.split(" ms (")[1].split("%")[0]) for part in line.split("costliest ops: ")[1].split("), ")]
    assert shares == sorted(shares, reverse=True) and len(shares) == min(6, len({k.split("[")[0] for k, _ in counts}))
    code, out, err = cli("optimize", "m.swp", "-D", "batch=8", "--memory", "8MiB", "--device", "p.json",
                         "--method", "belady", "--json")
    assert code == 0, err
    info = json.loads(out)
    assert info["device"] == "measured-numpy" and info["notes"] == []
    # every op of the plan was timed: ideal_ms is the sum of measured times plus one launch overhead per op
    counts = _op_counts(in_tmp)
    expected = sum((profile["op_times"][k] + profile["launch_s"]) * n for k, n in counts)
    assert info["ideal_ms"] == pytest.approx(1e3 * expected)
    code, out, err = cli("optimize", "m.swp", "-D", "batch=8", "--memory", "8MiB", "--device", "p.json", "--method",
                         "belady")
    assert code == 0 and "note: the profile" not in out, err
    for other in (["-D", "batch=4"], ["-D", "batch=8", "--microbatches", "2"],
                  ["-D", "batch=8", "--precision", "bf16"]):
        code, out, err = cli("optimize", "m.swp", *other, "--memory", "8MiB", "--device", "p.json", "--method",
                             "belady")
        assert code == 0, err
        note = next(x for x in out.splitlines() if x.startswith("  note: the profile `p.json` has no time for "))
        missing, distinct = (int(w) for w in note.split(" ") if w.isdigit())
        assert 0 < missing <= distinct
    code, out, err = cli("optimize", "m.swp", *other, "--memory", "8MiB", "--device", "p.json", "--method", "belady",
                         "--json")
    assert code == 0 and json.loads(out)["notes"] == [note.removeprefix("  note: ")], err


def _op_counts(folder: Path) -> list[tuple[str, int]]:
    from collections import Counter

    from swapdsl.devices.costs import op_key

    t = training_graph(build_graph(str(folder / "m.swp"), ["batch=8"])[1])
    return list(Counter(op_key(t, op) for op in t.ops).items())


@pytest.mark.gpu
@pytest.mark.parametrize("graph", [False, True])
def test_host_updates_match_the_reference_on_cupy(graph: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """The host lane on CuPy (runtime/hostfn.py): every update handed between a stream of its own and a
    worker thread, ordered by events with the copies, eagerly and captured in a CUDA graph; its kernels split
    three ways (parts of 64 elements)."""
    import cupy

    from swapdsl.runtime import hostsplit

    monkeypatch.setattr(hostsplit, "MIN_PART", 64)

    from swapdsl.graph.offload import offloadable
    from swapdsl.plan.program import HostRun
    from swapdsl.planning.optimize import optimize
    from swapdsl.planning.problem import Request
    from test_planners import V100

    t = small_training_graph("mlp")
    need, no_swap = caps(t)
    plan = optimize(attrs.evolve(Request(t, V100, (need + no_swap) // 2, "mlp.swp", ()), host_updates=offloadable(t)),
                    "belady")
    assert any(isinstance(i, HostRun) for i in plan.program)
    runner = PlanRunner(plan, t, "cupy", cupy, seed=3, graph=graph, host_threads=3)
    ref = Trainer(t, 3, np)
    try:
        for step in range(1, 5):
            loss, _ = runner.step(step)
            assert loss == pytest.approx(ref.step(step), rel=1e-4)
        assert runner.graph_note.startswith("one CUDA graph") == graph, runner.graph_note
        assert runner.warmup_steps == (2 if graph else 1)  # the capture step is warm-up, not a steady step
    finally:
        runner.close()


BF16_ON_CUPY = {  # (large enough that half ops run a block at a time)
    "mlp": {"depth": 2, "batch": 64, "features": 256, "hidden": 1024},
    # weights shared by every time step: their half gradients summed in by matmul_tn_fold_acc through cuBLAS
    "lstm_lm": {"layers": 1, "hidden": 256, "vocab": 512, "seq": 8, "batch": 16, "lr": 0.1},
}


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(BF16_ON_CUPY))
def test_bf16_plans_run_on_cupy_as_bits(name: str) -> None:
    """bf16 tensors on CuPy are their bits in uint16 arrays (graph/ops/halfbits.py): a bf16 plan's losses
    follow NumPy's bf16 reference to bf16 precision (CuPy's f32 math rounds differently from NumPy's)."""
    import cupy

    import swapdsl

    t = swapdsl.load(MODELS / f"{name}.swp", BF16_ON_CUPY[name], precision="bf16").training
    need, no_swap = caps(t)
    runner = PlanRunner(plan_for(t, (need + no_swap) // 2, "belady"), t, "cupy", cupy, seed=3)
    ref = Trainer(t, 3, np)
    try:
        for step in range(1, 4):
            loss, _ = runner.step(step)
            assert loss == pytest.approx(ref.step(step), rel=1e-2)
        got, want = runner.persistent_values(), ref.state()
        for name, value in got.items():
            assert value.dtype == want[name].dtype
            np.testing.assert_allclose(value.astype(np.float64), want[name].astype(np.float64), rtol=2e-2, atol=1e-3)
    finally:
        runner.close()


@pytest.mark.gpu
@pytest.mark.parametrize("optimizer", ["sgd(lr = lr, momentum = 0.9, warmup = warmup, cosine = steps, clip = clip)",
                                       "adamw(lr = 0.01, warmup = 3, cosine = 20)"])
def test_scheduled_updates_on_cupy_follow_the_reference(tmp_path: Path, optimizer: str) -> None:
    """The fused updates take this step's rate from the device's counter (a warmup, then a cosine) and
    AdamW's decoupled decay: six steps of the digits MLP on CuPy follow NumPy's reference (they once took
    `lr` as written, and the load-time check at step 3 let a cosine through)."""
    import cupy

    import swapdsl

    source = (REPO / "examples" / "digits.swp").read_text()
    line = "minimize loss with sgd(lr = lr, momentum = 0.9, warmup = warmup, cosine = steps, clip = clip)"
    assert line in source
    model = tmp_path / "digits.swp"
    model.write_text(source.replace(line, f"minimize loss with {optimizer}"))
    t = swapdsl.load(model, {"warmup": 3, "steps": 20}).training
    need, no_swap = caps(t)
    runner = PlanRunner(plan_for(t, (need + no_swap) // 2, "belady"), t, "cupy", cupy, seed=3)
    ref = Trainer(t, 3, np)
    try:
        for step in range(1, 7):
            assert runner.step(step)[0] == pytest.approx(ref.step(step), rel=1e-4)
    finally:
        runner.close()


@pytest.mark.gpu
def test_plans_match_the_reference_on_cupy() -> None:
    import cupy

    t = small_training_graph("tiny_resnet")
    need, no_swap = caps(t)
    plan = plan_for(t, need, "belady")
    runner = PlanRunner(plan, t, "cupy", cupy, seed=3)
    ref = Trainer(t, 3, np)
    try:
        for step in range(1, 4):
            loss, _ = runner.step(step)
            assert loss == pytest.approx(ref.step(step), rel=1e-4)
    finally:
        runner.close()


@safety(8)
@given(training_graphs(max_depth=4), st.floats(0.0, 1.0))
def test_ga_plans_match_the_reference(t: Graph, where: float) -> None:
    from test_planners import ga_plan

    need, no_swap = caps(t)
    plan = ga_plan(t, int(need + where * (no_swap - need)), generations=2, polish=0.0)  # (test_polish: polished)
    assert run_against_reference(plan, t, steps=2) <= 1e-5


# -- recomputation (plan format 4)

def test_traded_swaps_recompute_and_train_exactly() -> None:
    """A small Inception-v4 at a quarter of its no-swap memory: `lru` swaps activations whose makers'
    inputs are still on the device; trading those swaps for recomputations keeps the plan valid, makes
    the simulated step faster, and trains exactly like the reference."""
    from swapdsl.plan.simulate import simulate
    from swapdsl.planning.recompute import candidates, trade_swaps

    t = small_training_graph("inception_v4")
    need, no_swap = caps(t)
    plan = plan_for(t, max(no_swap // 4, need), "lru")
    assert candidates(plan)
    traded = trade_swaps(plan)
    again = [i for i in traded.program if isinstance(i, Run) and i.recompute]
    assert again and simulate(traded).iteration_ms < simulate(plan).iteration_ms
    assert dict(traded.figures)["iteration_ms"] == simulate(traded).iteration_ms
    validate(traded, t)
    assert run_against_reference(traded, t, steps=3) <= 1e-5


@safety(20)
@given(training_graphs(), st.floats(0.0, 1.0), st.data())
def test_any_swap_traded_for_a_recompute_trains_exactly(t: Graph, where: float, data) -> None:  # noqa: ANN001
    """Every candidate swap pair of any plan (each method, two caps), made a recomputation, gives a valid
    plan that trains exactly (dropout included: a rerun hashes the same seed, step and elements)."""
    from swapdsl.planning.recompute import candidates, rewrite

    need, no_swap = caps(t)
    for method in sorted(METHODS):
        for cap in {int(need + where * (no_swap - need)), int(need + where * where * (no_swap - need))}:
            plan = plan_for(t, cap, method)
            found = candidates(plan)
            if found:
                traded = rewrite(plan, [data.draw(st.sampled_from(found))])
                validate(traded, t)
                assert run_against_reference(traded, t, steps=2) <= 1e-5


@safety(20)
@given(training_graphs(), st.floats(0.5, 1.3))
def test_checkpoint_plans_are_valid_and_train_exactly(t: Graph, where: float) -> None:
    """Chen's checkpointing (recomputation, no swapping) on random graphs, dropout included: where it fits
    it is valid, moves nothing, and trains exactly; where it does not, it says so."""
    from swapdsl.common.errors import SwpError
    from swapdsl.plan.simulate import simulate

    _, no_swap = caps(t)
    try:
        plan = plan_for(t, int(where * no_swap), "checkpoint")
    except SwpError as err:
        assert "checkpointing does not fit under this cap" in err.message or "below the smallest" in err.message
        return
    validate(plan, t)
    r = simulate(plan)
    assert r.h2d_bytes == r.d2h_bytes == 0 and r.iteration_ms >= dict(plan.figures)["bound_ms"]
    assert run_against_reference(plan, t, steps=2) <= 1e-5


@pytest.mark.parametrize("start", [0, 100])
def test_the_capture_step_is_this_runs_second_resumed_or_not(monkeypatch: pytest.MonkeyPatch, start: int) -> None:
    """On CuPy the second step of a run captures the CUDA graph: warm-up counts this run's steps, so a run
    resumed at step 100 (its runner's count starts there) still leaves out two, not 102. A stand-in runner
    whose streams and graph do nothing runs the runner's own step logic."""
    import types

    from swapdsl.runtime import interpreter

    monkeypatch.setattr(interpreter, "issue_cuda", lambda items, **kw: None)
    compute = types.SimpleNamespace(synchronize=lambda: None)
    r = types.SimpleNamespace(backend="cupy", steps_run=start, _cuda=None, _graph=None, _eager_steps=0,
                              graph_mode=True, warmup_steps=1, comm=None, hostfns=None, final_loc={},
                              g=types.SimpleNamespace(loss="loss"), streams={"compute": compute})
    r._capture = lambda: types.SimpleNamespace(launch=lambda stream: None)
    r._agreed = lambda graph: graph
    r._cuda_items = lambda: []
    r._read = lambda name, where: 0.0
    r._step_cuda = lambda: PlanRunner._step_cuda(r)
    for k in range(1, 5):
        PlanRunner.step(r, start + k)
    assert r.warmup_steps == 2 and r._graph is not None
