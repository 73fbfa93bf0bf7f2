"""Updates on the host (issue 37, ZeRO-Offload's lever): the split of a training graph, plans with host
runs (validated, simulated as the compiled scorer times them, executed exactly like the reference), the
validator's rules for them, and the command line."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import attrs
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import swapdsl
from conftest import MODELS, write
from strategies import EVERY, training_graphs
from swapdsl.devices.profiles import BUILTIN, device_from_json
from swapdsl.graph.ir import Graph
from swapdsl.graph.offload import host_split, offloadable
from swapdsl.plan.file import format_plan, parse_plan, read_plan
from swapdsl.plan.program import HostRun, Plan, SwapIn, SwapOut
from swapdsl.plan.simulate import simulate
from swapdsl.plan.validate import PlanError, PlanInvalid, validate
from swapdsl.planning.compiled import Evaluator
from swapdsl.planning.ga import SearchOptions
from swapdsl.planning.optimize import host_choices, optimize
from swapdsl.planning.policy import METHODS
from swapdsl.planning.problem import Problem, Request
from test_planners import V100, caps
from test_runtime import run_against_reference

H100 = BUILTIN["h100-80gb"]


def _mlp(precision: str) -> Graph:
    m = swapdsl.load(MODELS / "mlp.swp", {"depth": 2, "batch": 8, "features": 32, "hidden": 16}, precision=precision)
    return m.training


def _transformer(precision: str) -> Graph:  # (Adam)
    args = {"batch": 2, "seq": 8, "vocab": 32, "dim": 16, "heads": 2, "ffn": 32}
    return swapdsl.load(MODELS / "tiny_transformer.swp", args, precision=precision).training


def _plan(t: Graph, cap: int, method: str, host: tuple[str, ...], device=V100) -> Plan:
    req = attrs.evolve(Request(t, device, cap, "random.swp", ()), host_updates=host)
    return optimize(req, method, SearchOptions(generations=2, population=8, workers=1))


def test_the_split_moves_each_update_group_and_its_casts() -> None:
    t = _mlp("bf16")
    split = host_split(t, ["layer0.dense.w"])
    ops = {t.ops[i].op for i in split.ops}
    assert ops == {"cast", "momentum", "sgd_apply"}
    assert split.made == {"layer0.dense.w/bf16"}  # the forward's half copy comes up from the host
    (grad,) = split.read  # the half gradient goes down; its cast to f32 runs on the host
    assert t.type_of(grad).dtype.label == "bf16"
    f32 = _mlp("f32")
    split = host_split(f32, ["layer0.dense.w"])
    assert {f32.ops[i].op for i in split.ops} == {"momentum", "sgd_apply"} and not split.made
    assert offloadable(f32) == f32.params
    with pytest.raises(ValueError, match="not parameters"):
        host_split(f32, ["nope"])


@pytest.mark.parametrize("precision", ["f32", "bf16", "f16"])
@pytest.mark.parametrize("method", ["ga", *sorted(METHODS), "capuchin"])
@pytest.mark.parametrize("model", [_mlp, _transformer])
def test_plans_with_host_updates_are_valid_timed_and_exact(model, precision: str, method: str) -> None:
    t = model(precision)
    need, no_swap = caps(t)
    plan = _plan(t, (need + no_swap) // 2, method, offloadable(t))
    validate(plan, t)
    assert any(isinstance(i, HostRun) for i in plan.program)
    back = parse_plan(format_plan(plan))
    assert format_plan(back) == format_plan(plan)
    assert simulate(back).iteration_ms == pytest.approx(dict(plan.figures)["iteration_ms"], rel=1e-12)
    assert run_against_reference(plan, t, steps=3) <= 1e-5
    assert run_against_reference(plan, t, steps=1, copy_delay_s=0.005, kernel_delay_s=0.002) <= 1e-5


@settings(max_examples=25, deadline=None)
@given(training_graphs(**EVERY), st.floats(0.0, 1.0), st.sampled_from(sorted(METHODS)), st.randoms(use_true_random=False))
def test_random_host_updates_match_the_reference_and_the_compiled_timing(t: Graph, where: float, method: str,
                                                                       rnd) -> None:
    candidates = offloadable(t)
    host = tuple(p for p in candidates if rnd.random() < 0.5)
    p = Problem.build(t, V100, host)
    need, no_swap = caps(t)
    plan = _plan(t, int(need + where * (no_swap - need)), method, host)
    validate(plan, t)
    assert sum(isinstance(i, HostRun) for i in plan.program) == len(p.host.ops)
    assert run_against_reference(plan, t, steps=2) <= 1e-5
    # the compiled scorer's time of the same schedule is the plan's
    pinned = frozenset(i for i, x in enumerate(plan.tensors) if x.home is not None and x.home != "host"
                       and x.kind != "input")
    timing = Evaluator(p)(list(range(p.n_ops)), plan.tensor_cap, pinned, METHODS[method])
    if method != "vdnn":  # (vdnn's offload is off when everything fits: the baseline decides, not the policy)
        assert timing.iteration_ms == pytest.approx(simulate(plan).iteration_ms, rel=1e-9)


def test_auto_picks_among_the_largest_parameters_first() -> None:
    t = _mlp("bf16")
    choices = host_choices(t)
    assert choices[0] == () and set(choices[-1]) == set(offloadable(t))
    sizes = [t.tensors[p].type.nbytes for p in choices[1]]
    assert min(sizes) >= max(t.tensors[p].type.nbytes for p in offloadable(t) if p not in choices[1])


def _host_plan() -> tuple[Plan, Graph]:
    t = _mlp("f32")
    need, no_swap = caps(t)
    return _plan(t, need, "belady", offloadable(t)), t


def test_a_host_run_needs_its_inputs_on_the_host() -> None:
    plan, t = _host_plan()
    prog = list(plan.program)
    k = next(k for k, i in enumerate(prog) if isinstance(i, SwapOut)
             and any(i.tensor in t.ops[h.op].inputs for h in prog if isinstance(h, HostRun)))
    del prog[k]
    with pytest.raises(PlanInvalid, match="invariant [46]"):
        validate(attrs.evolve(plan, program=tuple(prog)), t)


def test_a_host_update_before_a_swap_in_of_its_old_value_is_refused() -> None:
    """In f32 the device reads the parameter itself, swapped in from the host memory its update writes:
    an update moved before the last such swap-in would hand that swap-in the new value."""
    plan, t = _host_plan()
    prog = list(plan.program)
    news = {new: old for old, new in t.updates}
    for k, i in enumerate(prog):
        if isinstance(i, HostRun) and t.ops[i.op].outputs[0] in news:
            old = news[t.ops[i.op].outputs[0]]
            first = next((j for j, s in enumerate(prog) if isinstance(s, SwapIn) and s.tensor == old), None)
            if first is not None:
                break
    else:
        pytest.skip("no parameter is swapped in at this cap")
    prog.insert(first, prog.pop(k))
    with pytest.raises(PlanInvalid):
        validate(attrs.evolve(plan, program=tuple(prog)), t)


def test_host_runs_twice_or_without_a_time_are_refused() -> None:
    plan, t = _host_plan()
    k = next(k for k, i in enumerate(plan.program) if isinstance(i, HostRun))
    prog = list(plan.program)
    prog.insert(k + 1, prog[k])
    with pytest.raises(PlanInvalid, match="invariant 1"):
        validate(attrs.evolve(plan, program=tuple(prog)), t)
    op = plan.program[k].op
    ops = list(plan.ops)
    ops[op] = attrs.evolve(ops[op], host_ms=None)
    with pytest.raises(PlanError, match="host_ms"):
        validate(attrs.evolve(plan, ops=tuple(ops)), t)
    text = format_plan(plan).replace(f"host {op}\n", f"host {len(plan.ops) + 5}\n")
    with pytest.raises(PlanError, match="does not define"):
        validate(parse_plan(text), t)


def test_a_profile_checks_host_bw() -> None:
    profile = json.loads(json.dumps(BUILTIN["a100-40gb"].to_json()))
    assert device_from_json(profile).host_bw == 20e9
    for bad in (0, -1.0, float("inf")):
        with pytest.raises(ValueError, match="host_bw"):
            device_from_json(dict(profile, host_bw=bad))


def test_the_command_line_plans_and_trains_with_host_updates(cli, in_tmp: Path) -> None:
    write(in_tmp / "m.swp", (MODELS / "mlp.swp").read_text())
    small = ["-D", "batch=8", "-D", "features=32", "-D", "hidden=16"]
    code, out, err = cli("optimize", "m.swp", *small, "--memory", "40KiB", "--method", "belady", "--precision",
                         "bf16", "--host-updates", "all", "-o", "m.plan", "--json")
    assert code == 0, err
    assert "\nhost " in (in_tmp / "m.plan").read_text()
    code, out, err = cli("exec", "m.plan", "--steps", "3", "--check", "--backend", "numpy", "--json")
    assert code == 0, err
    assert json.loads(out)["max_rel_diff"] <= 1e-5
    code, out, err = cli("show", "m.plan", "--plot", "m.png")
    assert code == 0, err
    assert "update ops" in out and (in_tmp / "m.png").stat().st_size > 0
    code, _, err = cli("optimize", "m.swp", *small, "--memory", "40KiB", "--method", "checkpoint",
                       "--host-updates", "all")
    assert code == 2 and "checkpoint" in err and "Traceback" not in err
    code, _, err = cli("optimize", "m.swp", "--memory", "1MiB", "--host-updates", "some")
    assert code == 2 and "invalid choice" in err


def test_a_swap_out_waits_for_the_host_runs_reading_its_host_memory(tmp_path: Path) -> None:
    """From an outside review: a plan (edited by hand) runs op 18 on the host, reading `head.w` from its host
    memory, while the device's update writes `head.w`'s new value back into that memory. The swap-out must
    wait for the host run; without that wait the run raced and trained wrong (max rel diff 0.24)."""
    from swapdsl.plan.replay import walk

    shutil.copy(MODELS / "mlp.swp", tmp_path / "mlp.swp")
    shutil.copy(Path(__file__).parent / "golden" / "host_read_race.plan", tmp_path / "race.plan")
    plan = read_plan(tmp_path / "race.plan")
    t = _mlp_graph_of(plan)
    validate(plan, t)
    host = next(k for k, i in enumerate(plan.program) if isinstance(i, HostRun) and i.op == 18)
    out = next(s for s in walk(plan) if isinstance(s.instr, SwapOut) and s.instr.tensor == "%21")
    assert host in out.waits
    assert run_against_reference(plan, t, steps=3, kernel_delay_s=0.003) <= 1e-6


def _mlp_graph_of(plan: Plan) -> Graph:
    return swapdsl.load(MODELS / "mlp.swp", dict(plan.args)).training


def test_ga_plans_where_the_device_still_reads_a_weight_its_host_update_overwrote() -> None:
    """From the review: in f32 the device may still read a parameter's resident copy after its update on
    the host wrote the new value; ga's schedules make that happen (seed 1), and the plan is valid."""
    t = _mlp("f32")
    req = attrs.evolve(Request(t, V100, 12 * 1024, "random.swp", ()), host_updates=offloadable(t))
    plan = optimize(req, "ga", SearchOptions(generations=300, seed=1, workers=1))
    validate(plan, t)
    assert run_against_reference(plan, t, steps=2) <= 1e-6


def test_chens_dropped_set_seeds_ga_on_problems_with_host_ops() -> None:
    """Found by the CI profile's mutant property: ga seeds its recompute genes from Chen's rule, which met
    hollow ops (no outputs) and host-made weights (no device maker) on problems with host updates."""
    from swapdsl.planning.checkpoint import rebuilt_makers

    t = _mlp("bf16")
    p = Problem.build(t, V100, offloadable(t))
    need, _ = caps(t)
    for at_cuts in (True, False):
        assert all(not p.hollow(op) for op in rebuilt_makers(p, need, 1.0, at_cuts))
