"""The exact planner (planning/exactplan.py): its plans are ordinary plans, at most the program's value,
never below the exact bound for their order, and train exactly like the reference; and packing
(planning/packing.py) finds a layout wherever one exists."""

from __future__ import annotations

import itertools
import random
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from conftest import MODELS
from strategies import training_graphs
from swapdsl.common.errors import SwpError
from swapdsl.common.units import ALIGN
from swapdsl.fuzz.graphs import seeded_training_graph
from swapdsl.fuzz.shaped import SHAPES
from swapdsl.graph.ir import Graph
from swapdsl.plan.program import Region, SwapOut
from swapdsl.plan.simulate import simulate
from swapdsl.plan.validate import validate
from swapdsl.planning import exactplan
from swapdsl.planning.baselines import assemble
from swapdsl.planning.compiled import no_swap_bytes
from swapdsl.planning.exact import exact_bound, first_runs
from swapdsl.planning.ga import SearchOptions
from swapdsl.planning.optimize import optimize
from swapdsl.planning.packing import pack
from swapdsl.planning.problem import Problem, Request
from swapdsl.planning.sizing import need_bytes
from test_planners import V100, caps
from test_runtime import run_against_reference

LIMIT = SearchOptions(budget_s=3.0)


def exact(t: Graph, cap: int):  # noqa: ANN201
    return optimize(Request(t, V100, cap, "random.swp", ()), "exact", LIMIT)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(training_graphs(max_depth=2), st.floats(0.0, 1.0))
def test_exact_plans_keep_their_schedule_and_train_like_the_reference(t: Graph, where: float) -> None:
    """From the smallest feasible cap to the no-swap one: the plan validates, simulates at most at the
    program's value (its proof) and at least at both bounds (the exact bound for its order, and
    ``recompute_bound_ms``), and trains exactly like the reference."""
    p = Problem.build(t, V100)
    assume(p.n_ops <= 24)
    need, no_swap = caps(t)
    cap = int(need + where * (no_swap - need))
    plan = exact(t, cap)
    validate(plan, t)
    f = dict(plan.figures)
    assert f["iteration_ms"] <= f["exact_schedule_ms"] * (1 + 1e-9)
    assert f["exact_bound_ms"] <= f["exact_schedule_ms"] * (1 + 1e-9)
    assert f["iteration_ms"] >= f["bound_ms"] * (1 - 1e-9)
    assert f["iteration_ms"] >= exact_bound(p, cap, first_runs(plan), 2.0).bound_ms * (1 - 1e-9)
    assert run_against_reference(plan, t, steps=2) <= 1e-5


@pytest.mark.parametrize("family", sorted(SHAPES))
def test_the_shaped_graphs_plan_exactly_too(family: str) -> None:
    t = SHAPES[family](1)
    need, no_swap = caps(t)
    plan = exact(t, (need + no_swap) // 2)
    validate(plan, t)
    assert simulate(plan).iteration_ms <= dict(plan.figures)["exact_schedule_ms"] * (1 + 1e-9)
    assert run_against_reference(plan, t, steps=2) <= 1e-5


def test_the_schedule_recomputed_from_the_binaries_is_the_programs_value() -> None:
    """``schedule_ms`` times the rounded solution as the rows allow; HiGHS's objective is the same step
    up to its tolerances."""
    p = Problem.build(seeded_training_graph(4, max_depth=2), V100)
    v = exactplan._build(p, need_bytes(p, frozenset()), list(range(p.n_ops)))
    res = v.prog.solve(30.0)
    assert res.status == 0
    assert exactplan.schedule_ms(v, np.round(res.x).astype(int)) == pytest.approx(res.fun, rel=1e-6)


def test_with_room_for_everything_the_exact_plan_is_the_ideal_step() -> None:
    """The program prices time only: a copy the bus hides costs nothing, so it may keep one."""
    t = seeded_training_graph(2, max_depth=2)
    _, no_swap = caps(t)
    f = dict(exact(t, no_swap).figures)
    assert f["iteration_ms"] == pytest.approx(f["ideal_ms"], rel=exactplan.PROVEN_GAP)
    assert f["exact_optimal"] == 1.0


def test_what_the_exact_planner_does_not_plan_is_refused() -> None:
    t = seeded_training_graph(1, max_depth=2)
    need, _ = caps(t)
    with pytest.raises(SwpError, match="below the smallest feasible cap"):
        exact(t, need - ALIGN)
    with pytest.raises(SwpError, match="keeps every update on the device"):
        optimize(Request(t, V100, need, "random.swp", ()), "exact", LIMIT, host_updates="all")


def test_the_cli_plans_exactly_and_refuses_large_graphs(cli, in_tmp: Path) -> None:  # noqa: ANN001
    model = str(MODELS / "mlp.swp")
    code, out, _ = cli("optimize", model, "--memory", "2.7MiB", "--method", "exact", "--budget", "5", "-o", "m.plan")
    assert code == 0 and "exact plan" in out
    code, out, _ = cli("exec", "m.plan", "--check", "--steps", "2")
    assert code == 0 and "max rel diff against the reference 0.00e+00" in out
    code, _, err = cli("optimize", str(MODELS / "tiny_transformer.swp"), "--memory", "1/2", "--method", "exact")
    assert code == 2 and "at most 150 ops" in err and "Traceback" not in err


# ---- packing ------------------------------------------------------------------------------------

def _fits(items: list[tuple[int, int, int]], offsets: list[int], cap: int) -> bool:
    for (a, b) in itertools.combinations(range(len(items)), 2):
        (f1, l1, s1), (f2, l2, s2) = items[a], items[b]
        if f1 <= l2 and f2 <= l1 and offsets[a] < offsets[b] + s2 and offsets[b] < offsets[a] + s1:
            return False
    return all(o % ALIGN == 0 and o + s <= cap for o, (_, _, s) in zip(offsets, items))


def _any_packing(items: list[tuple[int, int, int]], cap: int) -> bool:
    slots = [range(0, cap - s + 1, ALIGN) for _, _, s in items]
    return any(_fits(items, list(o), cap) for o in itertools.product(*slots))


@pytest.mark.parametrize("seed", range(40))
def test_packing_finds_a_layout_wherever_one_exists(seed: int) -> None:
    """Brute force over every offset of up to five items in an arena of up to six units: ``pack`` finds a
    layout exactly when one exists (greedy first, the program where greedy fails), and what it returns
    fits."""
    rng = random.Random(seed)
    items = []
    for _ in range(rng.randint(2, 5)):
        first = rng.randint(0, 4)
        items.append((first, first + rng.randint(0, 3), ALIGN * rng.randint(1, 3)))
    cap = ALIGN * rng.randint(3, 6)
    offsets, overflow = pack(items, cap)
    assert (offsets is not None) == _any_packing(items, cap)
    if offsets is not None:
        assert _fits(items, offsets, cap) and overflow == 0
    else:
        assert overflow > 0


def test_no_swap_out_after_an_op_works_in_place_over_its_tensor() -> None:
    """Such a swap-out would copy the op's output: a review forced one and the plan failed validation."""
    p = Problem.build(seeded_training_graph(1, max_depth=2), V100)
    v = exactplan._build(p, need_bytes(p, frozenset()), list(range(p.n_ops)))
    overwritten = [t for t in v.co if t in v.consumed]
    assert overwritten
    for t in overwritten:
        assert max(v.co[t]) <= v.consumed[t]


def test_a_pinned_weight_leaves_mid_step_and_comes_back_home() -> None:
    """The conv-shaped graph 1 at a quarter of its no-swap bytes, its copies 1000x slower: asked to let pinned
    values leave, the exact planner keeps the first layer's weight on the device between steps, copies it
    out as the step starts and back into its home before its update (0.136 ms; the best phased plan, which
    keeps pinned values home, 0.239). The plan validates, keeps its schedule and trains exactly like the
    reference."""
    dev = V100.slower_bus(1000)
    t = SHAPES["conv"](1)
    p = Problem.build(t, dev)
    cap = max(int(no_swap_bytes(p) / 4), need_bytes(p, frozenset())) + p.scratch
    x = exactplan.exact_plan(p, cap, list(range(p.n_ops)), 30.0, leave=True)
    assert x.program is not None and x.homes is not None
    plan = assemble(Request(t, dev, cap, "g", ()), p, "exact", x.homes, x.program)
    validate(plan, t)
    homed = {u.name for u in plan.tensors if isinstance(u.home, Region) and u.kind != "input"}
    assert any(isinstance(i, SwapOut) and i.tensor in homed for i in plan.program)
    assert simulate(plan).iteration_ms <= x.objective_ms * (1 + 1e-9)
    assert run_against_reference(plan, t, steps=2) <= 1e-5
    home = exactplan.exact_plan(p, cap, list(range(p.n_ops)), 30.0)
    assert home.optimal and x.objective_ms < 0.6 * home.objective_ms


@pytest.mark.parametrize("depth", [1, 3])
def test_where_nothing_need_swap_exact_is_the_ideal_step_without_highs(depth: int,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Under a cap the no-swap arena fits, `--budget 5` gave a plan at 0.852 of the ideal speed (HiGHS not
    done); the plan that swaps nothing takes the ideal step, which bounds every plan: proven, HiGHS not run."""
    import swapdsl

    monkeypatch.setattr(exactplan, "exact_plan", lambda *a, **k: pytest.fail("HiGHS ran"))
    model = swapdsl.api.load(MODELS / "mlp.swp", {"depth": depth})
    plan = swapdsl.optimize(model, "100%", method="exact", budget_s=5)
    f = dict(plan.figures)
    assert plan.method == "exact" and f["exact_optimal"] == 1.0 and f["iteration_ms"] == f["ideal_ms"]
    assert f["h2d_bytes"] == f["d2h_bytes"] == 0 and f["exact_bound_ms"] == f["exact_schedule_ms"] == f["ideal_ms"]
