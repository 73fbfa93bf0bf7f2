"""The exact planner over every order of a small graph (planning/orders.py), and its swap-ins for reruns."""

from __future__ import annotations

import random

import pytest

from swapdsl.devices.profiles import BUILTIN
from swapdsl.fuzz.graphs import Builder, seeded_training_graph
from swapdsl.graph.autodiff import training_graph
from swapdsl.graph.ir import DType, Graph, Kind, Optimizer
from swapdsl.plan.program import Run, SwapIn
from swapdsl.plan.simulate import simulate
from swapdsl.plan.validate import validate
from swapdsl.planning import exactplan
from swapdsl.planning.baselines import assemble
from swapdsl.planning.compiled import no_swap_bytes
from swapdsl.planning.exact import exact_bound, first_runs, precedences, respects
from swapdsl.planning.exactplan import exact_plan
from swapdsl.planning.ga import SearchOptions
from swapdsl.planning.optimize import optimize
from swapdsl.planning.orders import best_over_orders, count_orders, orders
from swapdsl.planning.problem import Problem, Request
from swapdsl.planning.sizing import smallest_cap
from test_runtime import run_against_reference

DEVICE = BUILTIN["v100-16gb"]


def linear(layers: int) -> Graph:
    """``layers`` hidden layers and a softmax head, trained by plain SGD: 6 ops and 9 orders with none."""
    b = Builder()
    h = b.declare("x", (8, 32), Kind.input)
    y = b.declare("y", (8,), Kind.input, DType.i32)
    for k in range(layers):
        h = b.op("relu", [b.op("matmul", [h, b.declare(f"w{k}", (32, 32), Kind.param)])])
    loss = b.op("softmax_cross_entropy", [b.op("matmul", [h, b.declare("head", (32, 3), Kind.param)]), y])
    sgd = Optimizer("sgd", (("lr", 0.1), ("momentum", 0.0), ("weight_decay", 0.0)))
    return training_graph(b.forward(loss, sgd))


def request(g: Graph, where: float) -> tuple[Request, Problem]:
    p = Problem.build(g, DEVICE)
    no_swap = no_swap_bytes(p)
    need = smallest_cap(p, no_swap)
    return Request(g, DEVICE, int(need + where * (no_swap - need)) + p.scratch, "g", ()), p


def random_order(p: Problem, rng: random.Random) -> list[int]:
    before = {j: {i for i, k in precedences(p) if k == j} for j in range(p.n_ops)}
    order: list[int] = []
    while len(order) < p.n_ops:
        order.append(rng.choice([j for j in range(p.n_ops) if j not in order and before[j] <= set(order)]))
    return order


def test_the_orders_are_every_order_of_first_runs_once() -> None:
    """Counted over the down-sets and listed one by one, the same number; each respects the precedences,
    the model's comes first, and 300 orders drawn at random are all among them."""
    p = Problem.build(linear(1), DEVICE)
    listed = [tuple(o) for o in orders(p)]
    assert len(listed) == len(set(listed)) == count_orders(p) == 462
    assert listed[0] == tuple(range(p.n_ops)) and all(respects(p, o) for o in listed)
    rng = random.Random(0)
    assert {tuple(random_order(p, rng)) for _ in range(300)} <= set(listed)


@pytest.mark.parametrize("where", [0.0, 0.5])
def test_the_best_over_every_order_beats_each_orders_plan_and_every_plan_beats_the_bound(where: float) -> None:
    """Every order settled: the best plan is at most each order's exact plan, trains like the reference,
    and simulates at most at its program's value; no plan of any method (ga, belady, capuchin, the exact
    plan of each order) is faster than the least exact bound over every order, which bounds every plan."""
    g = linear(0)
    req, p = request(g, where)
    over = best_over_orders(p, req.cap, 10.0)
    assert over.proven and over.count == count_orders(p) == 9 and over.best is not None
    each = [exact_plan(p, req.cap, o, 10.0).objective_ms for o in orders(p)]
    assert over.best.objective_ms <= min(each) * (1 + 1e-9)
    assert over.bound_ms <= over.best.objective_ms
    plan = assemble(req, p, "exact", over.best.homes, over.best.program)
    validate(plan, g)
    assert simulate(plan).iteration_ms <= over.best.objective_ms * (1 + 1e-9)
    assert run_against_reference(plan, g, steps=2) <= 1e-5
    floor = min(exact_bound(p, req.cap, o, 10.0).bound_ms for o in orders(p))
    steps = [simulate(optimize(req, m, SearchOptions(budget_s=2.0, workers=1, seed=0))).iteration_ms
             for m in ("ga", "belady", "capuchin")]
    assert min([*steps, *each]) >= floor * (1 - 1e-9)


def test_an_order_cut_off_below_its_best_plan_has_none_and_says_so() -> None:
    req, p = request(linear(0), 0.0)
    order = list(range(p.n_ops))
    x = exact_plan(p, req.cap, order, 10.0)
    cut = exact_plan(p, req.cap, order, 10.0, below_ms=x.objective_ms * 0.99)
    assert cut.program is None and cut.optimal and cut.bound_ms == pytest.approx(x.objective_ms * 0.99)
    assert "within" in cut.why
    again = exact_plan(p, req.cap, order, 10.0, below_ms=x.objective_ms * 1.01)
    assert again.objective_ms == pytest.approx(x.objective_ms, rel=1e-3)


def test_a_swap_in_for_a_rerun_makes_a_faster_plan_that_trains_like_the_reference(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Graph 25 in this order, 0.3 of the way to no swaps: the exact plan copies a tensor in for a rerun
    (a swap-in due before an op whose next run is a recompute), and is faster than without such copies."""
    g = seeded_training_graph(25, max_depth=2)
    req, p = request(g, 0.3)
    order = [5, 0, 1, 2, 3, 6, 7, 4, 10, 8, 11, 9, 12, 13]
    x = exact_plan(p, req.cap, order, 20.0)
    assert x.program is not None and x.homes is not None
    plan = assemble(req, p, "exact", x.homes, x.program)
    validate(plan, g)
    prog = plan.program
    for_rerun = [k for k, i in enumerate(prog) if isinstance(i, SwapIn) and next(
        r for r in prog[k:] if isinstance(r, Run) and r.op == i.before).recompute]
    assert for_rerun and first_runs(plan) == order
    assert simulate(plan).iteration_ms <= x.objective_ms * (1 + 1e-9)
    assert run_against_reference(plan, g, steps=2) <= 1e-5
    monkeypatch.setattr(exactplan, "RERUN_LEAD", -p.n_ops)  # (no gap may start one)
    without = exact_plan(p, req.cap, order, 20.0)
    assert x.objective_ms < without.objective_ms * 0.99
