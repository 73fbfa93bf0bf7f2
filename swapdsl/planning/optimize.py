"""One entry point for every planning method: the baselines by policy, and the genetic search."""

from __future__ import annotations

from swapdsl.common.errors import SwpError
from swapdsl.plan.program import Plan
from swapdsl.planning.baselines import plan_baseline, plan_checkpoint
from swapdsl.planning.ga import SearchOptions, genetic_search
from swapdsl.planning.policy import METHODS
from swapdsl.planning.compiled import no_swap_bytes
from swapdsl.planning.problem import Problem, Request
from swapdsl.planning.sizing import below_smallest_cap

METHOD_NAMES = ("ga", *sorted([*METHODS, "checkpoint"]))


def optimize(req: Request, method: str, search: SearchOptions | None = None) -> Plan:
    """The plan ``method`` makes for ``req``: ``ga`` (searching as ``search`` says) or a baseline."""
    if req.tensor_cap <= 0:  # not even the kernels' scratch fits
        p = Problem.build(req.graph, req.device)
        raise below_smallest_cap(p, req.cap, no_swap_bytes(p, list(range(p.n_ops))))
    if method == "ga":
        return genetic_search(req, search or SearchOptions()).plan
    if method == "checkpoint":
        return plan_checkpoint(req)
    if method not in METHODS:
        raise SwpError(f"unknown method `{method}`", hints=[f"methods: {', '.join(METHOD_NAMES)}"])
    return plan_baseline(req, method)
