"""One entry point for every planning method: the baselines by policy, and the genetic search."""

from __future__ import annotations

from swapdsl.common.errors import SwpError
from swapdsl.common.units import format_bytes
from swapdsl.plan.program import Plan
from swapdsl.planning.baselines import plan_baseline
from swapdsl.planning.ga import SearchOptions, genetic_search
from swapdsl.planning.policy import METHODS
from swapdsl.planning.problem import Request

METHOD_NAMES = ("ga", *sorted(METHODS))


def optimize(req: Request, method: str, search: SearchOptions | None = None) -> Plan:
    """The plan ``method`` makes for ``req``: ``ga`` (searching as ``search`` says) or a baseline."""
    if req.tensor_cap <= 0:
        raise SwpError(f"a cap of {format_bytes(req.cap)} does not even hold the {format_bytes(req.scratch)} of "
                       "scratch this model's kernels need",
                       hints=[f"the kernels' scratch ({req.scratch} bytes) is part of every plan's arena"])
    if method == "ga":
        return genetic_search(req, search or SearchOptions()).plan
    if method not in METHODS:
        raise SwpError(f"unknown method `{method}`", hints=[f"methods: {', '.join(METHOD_NAMES)}"])
    return plan_baseline(req, method)
