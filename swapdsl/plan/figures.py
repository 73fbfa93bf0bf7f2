"""A plan's figures: what `optimize` stores in the plan and `simulate` recomputes, one function for both."""

from __future__ import annotations

from swapdsl.plan.program import Plan
from swapdsl.plan.simulate import Result


# the figure a micro-batched plan stores: the ideal step of one pass over the whole batch, what its speed
# is a fraction of (``api.one_pass_ideal_ms``)
ONE_PASS_IDEAL = "one_pass_ideal_ms"


def plan_figures(plan: Plan, r: Result, bound_ms: float | None, no_swap_bytes: float | None,
                 graph_peak_bytes: float | None, extra: dict[str, float] | None = None) -> dict[str, float]:
    """The figures of ``plan`` simulated as ``r``, in the order a plan file lists them. The planner's
    figures (the bound, the no-swap arena, the graph's peak) come from the planner; None leaves one out."""
    ideal = plan.ideal_ms()
    figures = {
        "ideal_ms": ideal,
        "bound_ms": bound_ms,
        "iteration_ms": r.iteration_ms,
        "fraction": ideal / r.iteration_ms if r.iteration_ms > 0 else 1.0,
        "swap_bytes": r.swap_bytes,
        "h2d_bytes": r.h2d_bytes,
        "d2h_bytes": r.d2h_bytes,
        "peak_device_bytes": r.peak_device_bytes,
        "scratch_bytes": plan.scratch,
        "host_bytes": r.host_bytes,
        "ratio": None if no_swap_bytes is None else no_swap_bytes / plan.cap,
        "no_swap_bytes": no_swap_bytes,
        "graph_peak_bytes": graph_peak_bytes,
    }
    return {k: float(v) for k, v in figures.items() if v is not None} | (extra or {})
