"""One entry point for every planning method: the baselines by policy, and the genetic search."""

from __future__ import annotations

from swapdsl.common.errors import SwpError
from swapdsl.plan.program import Plan
from swapdsl.planning.baselines import plan_baseline
from swapdsl.planning.ga import SearchOptions, genetic_search
from swapdsl.planning.policy import METHODS
from swapdsl.planning.problem import Request

METHOD_NAMES = ("ga", *sorted(METHODS))


def optimize(req: Request, method: str, search: SearchOptions | None = None) -> Plan:
    """The plan ``method`` makes for ``req``: ``ga`` (searching as ``search`` says) or a baseline."""
    if method == "ga":
        return genetic_search(req, search or SearchOptions()).plan
    if method not in METHODS:
        raise SwpError(f"unknown method `{method}`", hints=[f"methods: {', '.join(METHOD_NAMES)}"])
    return plan_baseline(req, method)
