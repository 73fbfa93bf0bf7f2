"""The ``capuchin`` baseline: swap or recompute each activation by its measured cost (Capuchin, ASPLOS 2020).

The default schedule, Belady's victims and earliest prefetch, as ``belady``; then, as Capuchin ranks
recomputation candidates by the memory they free per second of recomputation, the forward ops whose
outputs the backward pass reads are tried cheapest per byte first, and each is kept where it makes the
measured (simulated) step faster: a swap the bus hides stays a swap, one it exposes becomes a
recompute. With a host budget, a candidate that brings the plan's host copies closer to it is kept
first (so recomputation also trades host memory). A recompute's gain is not additive: a few alone
may free too little to retire any exposed swap. So the prefixes of that order at every eighth (none,
an eighth, ..., all) are scored, and the empty one and the best two are grown: the candidates after
each are tried in growing runs (doubling while they help, halving when one does not). The best growth
wins; a few hundred evaluations at most decide it.
"""

from __future__ import annotations

from collections.abc import Callable

from swapdsl.planning.clones import Extensions
from swapdsl.planning.policy import Policy
from swapdsl.planning.problem import Request

EVALUATIONS = 256  # the most candidate sets one greedy growth tries
PREFIXES = 8
STARTS = 2  # the best prefixes grown


def capuchin_set(req: Request, ext: Extensions, schedule: list[int], pinned: frozenset[int],
                 policy: Policy, evaluations: int | None = None) -> tuple[int, ...]:
    """The forward ops to recompute on ``schedule``, chosen as the module docstring says; ``evaluations``:
    the most candidate sets scored in all (None: ``EVALUATIONS`` per growth)."""
    order = ext.candidates.cheapest(ext.p)

    def key(chosen: list[int]) -> float:
        _, evaluator, merged = ext.prepare(schedule, chosen)
        t = evaluator(merged, req.tensor_cap, pinned, policy)
        return req.score(t.iteration_ms, t.host_bytes)

    scored = {n: key(order[:n]) for n in sorted({len(order) * k // PREFIXES for k in range(PREFIXES + 1)})}
    starts = sorted({0, *sorted(scored, key=lambda n: (scored[n], n))[:STARTS]})
    left = EVALUATIONS * len(starts) if evaluations is None else max(0, evaluations - len(scored))
    each = min(EVALUATIONS, left // len(starts))
    grown = [_grow(key, order, n, scored[n], each) for n in starts]
    return tuple(sorted(min(grown)[1]))


def _grow(key: Callable[[list[int]], float], order: list[int], i: int, best: float,
          evaluations: int = EVALUATIONS) -> tuple[float, list[int]]:
    """Greedy growth of ``order[:i]`` (scored ``best``) by runs of the candidates after it."""
    chosen, run = order[:i], max(1, len(order) // 16)
    for _ in range(evaluations):
        if i >= len(order):
            break
        trial = chosen + order[i:i + run]
        k = key(trial)
        if k < best:
            chosen, best, i, run = trial, k, i + run, run * 2
        elif run > 1:
            run //= 2
        else:
            i += 1
    return best, chosen
