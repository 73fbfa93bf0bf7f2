"""The exact program's bound (planning/exact.py): no plan with a given order of first runs beats it."""

from __future__ import annotations

import pytest

from conftest import slow_bus
from swapdsl.common.errors import SwpError
from swapdsl.devices.profiles import BUILTIN
from swapdsl.fuzz.graphs import seeded_training_graph
from swapdsl.fuzz.shaped import SHAPES
from swapdsl.plan.simulate import simulate
from swapdsl.planning.bound import ideal_ms
from swapdsl.planning.compiled import no_swap_bytes
from swapdsl.planning.exact import exact_bound, first_runs, precedences
from swapdsl.planning.ga import SearchOptions
from swapdsl.planning.optimize import optimize
from swapdsl.planning.problem import Problem, Request
from swapdsl.planning.sizing import need_bytes

DEVICE = BUILTIN["v100-16gb"]


def problem(seed: int) -> Problem:
    return Problem.build(seeded_training_graph(seed, max_depth=2), DEVICE)


def cap_at(p: Problem, ratio: float) -> int:
    return max(int(no_swap_bytes(p) / ratio), need_bytes(p, frozenset())) + p.scratch


def test_with_room_for_everything_the_bound_is_the_sum_of_op_times() -> None:
    p = problem(0)
    b = exact_bound(p, no_swap_bytes(p) + p.scratch, list(range(p.n_ops)))
    assert b.optimal and b.bound_ms == pytest.approx(ideal_ms(p))


def test_under_a_tight_cap_the_bound_counts_copies() -> None:
    p = problem(4)
    b = exact_bound(p, cap_at(p, 8), list(range(p.n_ops)), time_limit_s=20.0)
    assert b.bound_ms > ideal_ms(p) * 1.01 and b.h2d_bytes > 0


def test_an_order_that_breaks_a_dependency_is_refused() -> None:
    p = problem(1)
    i, j = next(iter(precedences(p)))
    order = [op for op in range(p.n_ops) if op != i]
    order.insert(order.index(j) + 1, i)
    with pytest.raises(SwpError, match="after the ops it depends on"):
        exact_bound(p, cap_at(p, 2), order)


@pytest.mark.parametrize("seed", range(4))
def test_no_plan_beats_the_bound_for_its_own_order(seed: int) -> None:
    """Every method's plan, at two caps, simulates at or above the program's bound for its order: the
    program leaves nothing out that a plan could use (planning/exact.py's proof, checked). A short time
    limit only lowers the bound HiGHS proves."""
    g = seeded_training_graph(seed, max_depth=2)
    p = Problem.build(g, DEVICE)
    for ratio in (2.0, 12.0):
        cap = cap_at(p, ratio)
        for method in ("belady", "capuchin", "ga"):
            plan = optimize(Request(g, DEVICE, cap, "g", ()), method,
                            SearchOptions(budget_s=2.0, generations=4, workers=1, seed=seed))
            b = exact_bound(p, cap, first_runs(plan), time_limit_s=1.5)
            assert simulate(plan).iteration_ms >= b.bound_ms * (1 - 1e-9), (ratio, method)


def test_a_pinned_value_brought_back_was_copied_out_first() -> None:
    """The conv-shaped graph 6 at 1/8, its copies 1000x slower: around the peak a pinned weight must leave,
    and it has no host copy, so the bound counts its copy out as well as back in (0.393 ms; 0.256 when it
    let the weight come back from a host copy that never existed). The exact plan for that order is no
    faster than the bound."""
    dev = slow_bus(DEVICE, 1000)
    t = SHAPES["conv"](6)
    p = Problem.build(t, dev)
    cap = max(int(no_swap_bytes(p) / 8), need_bytes(p, frozenset())) + p.scratch
    order = list(range(p.n_ops))
    b = exact_bound(p, cap, order, time_limit_s=20.0)
    assert b.optimal and b.bound_ms > 0.35
    plan = optimize(Request(t, dev, cap, "g", ()), "exact", SearchOptions(budget_s=20.0))
    assert first_runs(plan) == order and simulate(plan).iteration_ms >= b.bound_ms * (1 - 1e-9)
