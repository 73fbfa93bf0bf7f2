"""One entry point for every planning method: the baselines by policy, and the genetic search."""

from __future__ import annotations

from swapdsl.common.errors import SwpError
from swapdsl.plan.program import Plan
from swapdsl.planning.baselines import host_budget_error, plan_baseline, plan_capuchin, plan_checkpoint
from swapdsl.planning.ga import SearchOptions, genetic_search
from swapdsl.planning.policy import METHODS
from swapdsl.planning.compiled import no_swap_bytes
from swapdsl.planning.problem import Problem, Request
from swapdsl.planning.sizing import below_smallest_cap

PLANNERS = {"capuchin": plan_capuchin, "checkpoint": plan_checkpoint}  # besides the policies of METHODS
METHOD_NAMES = ("ga", *sorted([*METHODS, *PLANNERS]))


def optimize(req: Request, method: str, search: SearchOptions | None = None) -> Plan:
    """The plan ``method`` makes for ``req``: ``ga`` (searching as ``search`` says) or a baseline."""
    if req.tensor_cap <= 0:  # not even the kernels' scratch fits
        p = Problem.build(req.graph, req.device)
        raise below_smallest_cap(p, req.cap, no_swap_bytes(p, list(range(p.n_ops))))
    if method == "ga":
        return genetic_search(req, search or SearchOptions()).plan  # (it keeps to the host budget itself)
    if method not in PLANNERS and method not in METHODS:
        raise SwpError(f"unknown method `{method}`", hints=[f"methods: {', '.join(METHOD_NAMES)}"])
    plan = PLANNERS[method](req) if method in PLANNERS else plan_baseline(req, method)
    host = dict(plan.figures)["host_bytes"]
    if req.host_excess(int(host)):
        raise host_budget_error(req, host, method)
    return plan
