"""The ``capuchin`` baseline: swap or recompute each activation by its measured cost (Capuchin, ASPLOS 2020).

The default schedule, Belady's victims and earliest prefetch, as ``belady``; then, as Capuchin ranks
recomputation candidates by the memory they free per second of recomputation, the forward ops whose
outputs the backward pass reads are tried cheapest per byte first, and each is kept where it makes the
measured (simulated) step faster: a swap the bus hides stays a swap, one it exposes becomes a
recompute. With a host budget, a candidate that brings the plan's host copies closer to it is kept
first (so recomputation also trades host memory). Candidates are tried in growing runs (doubling
while they help, halving when one does not) so that a few hundred evaluations at most decide them.
"""

from __future__ import annotations

from swapdsl.planning.clones import Extensions
from swapdsl.planning.policy import Policy
from swapdsl.planning.problem import Request

EVALUATIONS = 256  # the most candidate sets one plan tries


def capuchin_set(req: Request, ext: Extensions, schedule: list[int], pinned: frozenset[int],
                 policy: Policy) -> tuple[int, ...]:
    """The forward ops to recompute on ``schedule``, chosen as the module docstring says."""
    order = ext.candidates.cheapest(ext.p)

    def key(chosen: list[int]) -> float:
        _, evaluator, merged = ext.prepare(schedule, chosen)
        t = evaluator(merged, req.tensor_cap, pinned, policy)
        return req.score(t.iteration_ms, t.host_bytes)

    chosen: list[int] = []
    best = key(chosen)
    i, run = 0, max(1, len(order) // 16)
    for _ in range(EVALUATIONS):
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
    return tuple(sorted(chosen))

