"""Every order of a graph's first runs, and the exact planner over all of them (issue 42).

The exact planner (``exactplan.py``) finds the fastest phased plan for one order. On graphs with few
enough orders, ``best_over_orders`` solves it for every one, each order's program cut off just below the
best plan so far: HiGHS then proves most orders infeasible (no phased plan with that order is faster)
without finding a plan. When every order is settled so, no phased plan of the graph, whatever its order,
has a lower program value (``ExactPlan.objective_ms``, which its simulated step is at most; a plan of
another order with a higher value may still simulate faster); where a solve stops at its time limit, its
dual bound still bounds that order, and the least of those bounds is the proven part.

An order here is one in which every op's first run may come (``exact.precedences``): the orders are
counted over the graph's down-sets (sets of ops closed under those precedences), so a count is quick where
the orders are far too many to list.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from functools import lru_cache

import attrs

from swapdsl.planning.exact import precedences
from swapdsl.planning.exactplan import ExactPlan, check_supported, exact_plan
from swapdsl.planning.problem import Problem

# an order's plan must beat the best so far by this much of it to replace it; so the best over all orders
# is proven to within this
CUTOFF = 1e-4


def _before(p: Problem) -> list[int]:
    """Per op, the bit set of ops whose first runs come before its own in every plan."""
    before = [0] * p.n_ops
    for i, j in precedences(p):
        before[j] |= 1 << i
    return before


def count_orders(p: Problem) -> int:
    """How many orders of first runs ``p`` has (by its down-sets, memoised: the count of orders that
    finish a down-set is the sum over the ops that may come next)."""
    before, full = _before(p), (1 << p.n_ops) - 1

    @lru_cache(maxsize=None)
    def finish(done: int) -> int:
        if done == full:
            return 1
        return sum(finish(done | 1 << j) for j in range(p.n_ops)
                   if not done >> j & 1 and before[j] & ~done == 0)

    return finish(0)


def orders(p: Problem) -> Iterator[list[int]]:
    """Every order of first runs, the model's first, then in lexicographic order of op indices."""
    before, n = _before(p), p.n_ops
    order: list[int] = []

    def extend(done: int) -> Iterator[list[int]]:
        if len(order) == n:
            yield list(order)
            return
        for j in range(n):
            if not done >> j & 1 and before[j] & ~done == 0:
                order.append(j)
                yield from extend(done | 1 << j)
                order.pop()

    yield from extend(0)


def neighbours(p: Problem, order: Sequence[int]) -> Iterator[list[int]]:
    """The orders one op's move away from ``order``, each once: first every op moved as early and as late
    as its precedences allow (where the best orders of small graphs put their fills and updates), then
    the other moves, the shortest first."""
    return _moves(order, *_masks(p))


def near(p: Problem, order: Sequence[int]) -> Iterator[list[int]]:
    """The orders one op's move from ``order`` (``neighbours``), then those two moves from it, each once."""
    masks = _masks(p)
    first = list(_moves(order, *masks))
    seen = {tuple(order), *map(tuple, first)}
    yield from first
    for o in first:
        for moved in _moves(o, *masks):
            if tuple(moved) not in seen:
                seen.add(tuple(moved))
                yield moved


def _masks(p: Problem) -> tuple[list[int], list[int]]:
    """Per op, the bit sets of ops whose first runs come before and after its own in every plan."""
    before = _before(p)
    return before, [sum(1 << j for j in range(p.n_ops) if before[j] >> i & 1) for i in range(p.n_ops)]


def _moves(order: Sequence[int], before: list[int], after: list[int]) -> Iterator[list[int]]:
    places = []  # (how far, the op, its place in the order without it)
    for k, op in enumerate(order):
        rest = [q for q in order if q != op]
        lo = max((r + 1 for r, q in enumerate(rest) if before[op] >> q & 1), default=0)
        hi = min((r for r, q in enumerate(rest) if after[op] >> q & 1), default=len(rest))
        places += [(0, op, lo), (0, op, hi)] + [(abs(to - k), op, to) for to in range(lo + 1, hi)]
    seen = {tuple(order)}
    for _, op, to in sorted(places, key=lambda x: x[0]):
        rest = [q for q in order if q != op]
        moved = [*rest[:to], op, *rest[to:]]
        if tuple(moved) not in seen:
            seen.add(tuple(moved))
            yield moved


@attrs.frozen
class OverOrders:
    """``best``: the fastest phased plan found over every order (``None`` if none fits); ``bound_ms``: no
    phased plan of any order is faster (the least of every order's proven bound, the cutoffs counted);
    ``settled``: orders whose program HiGHS proved (a plan, or none under the cutoff), of ``count``."""

    best: ExactPlan | None
    bound_ms: float
    settled: int
    count: int
    seconds: float

    @property
    def proven(self) -> bool:
        return self.settled == self.count


def best_over_orders(p: Problem, cap: int, limit_s: float, first: Sequence[Sequence[int]] = ()) -> OverOrders:
    """The exact planner for every order of ``p`` under ``cap``, HiGHS given ``limit_s`` for each; the
    orders in ``first`` (a search's, say) are solved before the rest so the cutoff starts low."""
    check_supported(p)
    started = time.perf_counter()
    best: ExactPlan | None = None
    bound, settled, count, seen = float("inf"), 0, 0, set()
    for order in [*map(list, first), *orders(p)]:
        if tuple(order) in seen:
            continue
        seen.add(tuple(order))
        count += 1
        cut = None if best is None else best.objective_ms * (1 - CUTOFF)
        x = exact_plan(p, cap, order, limit_s, below_ms=cut)
        settled += x.optimal
        bound = min(bound, x.bound_ms)
        if x.program is not None and (best is None or x.objective_ms < best.objective_ms):
            best = x
    if best is not None:
        bound = min(bound, best.objective_ms)
    return OverOrders(best, bound, settled, count, time.perf_counter() - started)
