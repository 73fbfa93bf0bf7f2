"""The genetic search's last stage on small graphs: the exact planner (``exactplan.py``) given the order of the
search's best plan, the model's, and those of other bred plans (``polish_orders``), then the orders one
or two op moves from the best and from each order tried (``descend``). The search's swap
planner decides online, op by op: it cannot see that a tensor placed now will split the room a later op
needs in one piece, nor keep a tensor on the device after copying it out so that dropping it later costs
nothing. The exact program decides the whole step at once, in bytes, and then packs the regions. On random
graphs of 12-36 ops it beat ``ga``'s decoder in the same order in 26 cases of 40 (docs/benchmarks.md); past
``POLISH_MAX_OPS`` ops HiGHS rarely improves on the search in the time a search has, so larger graphs keep
the search's plan as it is."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence

from swapdsl.common.errors import SwpError
from swapdsl.plan.program import Plan
from swapdsl.planning.baselines import assemble, with_figures
from swapdsl.planning.exact import first_runs
from swapdsl.planning.exactplan import MIN_LIMIT_S, exact_plan
from swapdsl.planning.orders import CUTOFF, near, neighbours
from swapdsl.planning.problem import Problem, Request

POLISH_MAX_OPS = 40
POLISH_SHARE = 0.5  # the default share of ga's budget the polish takes on a graph it polishes
# a search stopped early by its generation limit still gives HiGHS this long (a small graph's program is
# mostly proven in a second or two)
POLISH_MIN_S = 3.0


def check_share(share: float) -> None:
    if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0 <= share < 1:
        raise SwpError(f"the polish's share of the budget must be from 0 to below 1, not {share}")


def polish_limit(share: float, elapsed_s: float, budget_s: float) -> float | None:
    """HiGHS's time for the polish of a search that has run ``elapsed_s`` of ``budget_s`` and breeds for
    ``1 - share`` of it: as long as the search took times ``share / (1 - share)`` (its share of the
    budget, for a search that ran to its end), at least ``POLISH_MIN_S``, not past the budget. None: no
    polish (``share`` 0, or under ``MIN_LIMIT_S`` left)."""
    left = budget_s - elapsed_s
    if not share or left < MIN_LIMIT_S:
        return None
    return min(left, max(POLISH_MIN_S, elapsed_s * share / (1 - share)))


def polishable(p: Problem) -> bool:
    """Does the search end with the exact program on ``p``? Small graphs of one rank, updates on the device
    (the exact planner's class)."""
    return p.n_ops <= POLISH_MAX_OPS and not p.host.ops and not p.net


ORDER_NAMES = ("the search's order", "the model's order", "another bred plan's order",
               "an order one or two moves from the best")
POLISH_ORDERS = 5  # the most orders the polish tries
# the model's order gets at least this long, where the polish has it: HiGHS found the best plan of three
# 25-30-op graphs in that order in 4 s and not in 2 s (docs/benchmarks.md, issue 42, ga at 10 s)
MODEL_ORDER_S = 4.0
NEIGHBOUR_S = 1.0  # HiGHS's limit for an order one move away (cut off below the best, most are proven empty fast)
# up to this many ops, the polish lets pinned values leave mid-step (``exact_plan``'s ``leave``): on the 12
# such graphs of issue 42's 40, ga at 10 s median 0.918 of before, up to 17% faster, none slower; past it,
# where HiGHS is slower with it, some plans got up to 10.8% slower (docs/benchmarks.md, 2026-12-07)
LEAVE_MAX_OPS = 20


def polish_orders(p: Problem, plans: Iterable[Plan | None]) -> list[tuple[int, list[int]]]:
    """The orders the polish tries, each with its index in ``ORDER_NAMES``: the first runs of the first of
    ``plans`` (the search's best, then its population from the fittest), the model's own order, and the
    first runs of the next plans in ``plans`` with other orders, ``POLISH_ORDERS`` in all. The search's
    decoder can score an order well below what the exact planner makes of another (docs/benchmarks.md,
    issue 42), so its best order is not always the best order to polish."""
    it = iter(plans)
    best = next(it)
    assert best is not None
    orders = [(0, first_runs(best))]
    if orders[0][1] != list(range(p.n_ops)):
        orders.append((1, list(range(p.n_ops))))
    for plan in it:
        if len(orders) == POLISH_ORDERS:
            break
        if plan is not None and (order := first_runs(plan)) not in [o for _, o in orders]:
            orders.append((2, order))
    return orders


def polish(req: Request, p: Problem, plan: Plan, orders: Sequence[tuple[int, list[int]]], no_swap: int,
           extra: dict[str, float], time_limit_s: float) -> Plan:
    """``plan`` or, when faster (``Request.plan_score``), the fastest of the exact planner's plans for
    ``orders`` (``polish_orders``), with ``extra`` among its figures, ``polished_from_ms`` (``plan``'s
    step), ``polish_optimal`` (1: HiGHS proved it the best phased plan for its order) and ``polish_order``
    (its order's index in ``ORDER_NAMES``). Each order gets an equal share of the time still left, so one
    HiGHS proves quickly leaves more to the next, and the model's order at least ``MODEL_ORDER_S``; a solve
    whose regions do not pack may take a few seconds more (``exact_plan`` solves again, each solve given
    at least ``MIN_LIMIT_S``). The time still left goes to ``descend``. On graphs of up to ``LEAVE_MAX_OPS``
    ops, the exact planner may let pinned values leave mid-step and come back home."""
    deadline = time.perf_counter() + time_limit_s
    best = plan

    def better(name: int, order: list[int], limit_s: float, than: Plan, below_ms: float | None = None) -> Plan | None:
        try:
            x = exact_plan(p, req.cap, order, limit_s, below_ms, p.n_ops <= LEAVE_MAX_OPS)
        except SwpError:  # (the polish only ever improves a plan: none of its failures costs the search's)
            return None
        if x.program is None or x.homes is None:
            return None
        figures = {**extra, "polished_from_ms": dict(plan.figures)["iteration_ms"],
                   "polish_optimal": float(x.optimal), "polish_order": float(name)}
        exact = with_figures(assemble(req, p, plan.method, x.homes, x.program), p, no_swap, figures,
                             recomputes=True)
        return exact if req.plan_score(exact) < req.plan_score(than) else None

    tried: dict[tuple[int, ...], float] = {}  # order -> the cutoff it was solved under (inf: none)
    for k, (name, order) in enumerate(orders):
        left = deadline - time.perf_counter()
        if left < MIN_LIMIT_S:
            break
        share = left / (len(orders) - k)
        tried[tuple(order)] = float("inf")
        best = better(name, order, min(left, max(MODEL_ORDER_S, share)) if name == 1 else share, best) or best
    starts = list(dict.fromkeys(tuple(o) for o in [first_runs(best), *(order for _, order in orders)]))
    for moves in (neighbours, near):  # (every order's single moves before any order's pairs)
        for start in starts:
            best = descend(best, better, p, list(start), moves, deadline, tried)
    return best


def descend(best: Plan, better: Callable[[int, list[int], float, Plan, float], Plan | None], p: Problem,
            order: list[int], moves: Callable[[Problem, list[int]], Iterable[list[int]]], deadline: float,
            tried: dict[tuple[int, ...], float]) -> Plan:
    """From ``order``, the exact planner for each order ``moves`` gives (``orders.neighbours``: one op's
    move away; ``orders.near``: one or two), cut off below ``best``'s step; the first faster plan becomes
    ``best`` and its order the next to move from, until no order near helps or the time is up.
    (``polish`` descends by single moves from the best plan's order and from each order it tried, then by
    pairs: on graphs of 12-14 ops the best phased plan over every order was one to three moves from one
    of them, docs/benchmarks.md, issue 42.) An order in ``tried`` under a cutoff at least as high is not
    solved again: the cutoff only falls, so what had no plan under it has none now."""
    moved = True
    while moved:
        moved = False
        for candidate in moves(p, order):
            left = deadline - time.perf_counter()
            if left < MIN_LIMIT_S:
                return best
            cut = dict(best.figures)["iteration_ms"] * (1 - CUTOFF)
            if tried.get(tuple(candidate), -1.0) >= cut:
                continue
            tried[tuple(candidate)] = cut
            found = better(3, candidate, min(left, NEIGHBOUR_S), best, cut)
            if found is not None:
                best, order, moved = found, candidate, True
                break
    return best
