"""A mixed-integer program built row by row, solved by HiGHS through SciPy's ``milp`` (SciPy is already a
dependency) in a child process: what the exact bound (``exact.py``), the exact planner (``exactplan.py``)
and packing (``packing.py``) share."""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Iterator
from typing import Any

import numpy as np

from swapdsl.common.children import call_apart

MIP_GAP = 1e-6  # the relative gap at which HiGHS may call a solution optimal
BOUND_SLACK = 1e-4  # a bound HiGHS proves is taken this much (relative) lower (``dual_bound``)
TIME_LIMIT = 1  # scipy.optimize.milp's statuses: a limit was reached
INFEASIBLE = 2  # the program has no solution
SOLVE_ERROR = 4  # "HiGHS Status 4: Solve error"
# past its time limit, HiGHS has this long to return before its process is killed (the no-presolve retry
# after a solve error may take up to a second more than the limit)
GRACE_S = 2.5


class Milp:
    """Variables and rows for ``scipy.optimize.milp``, added by name."""

    def __init__(self) -> None:
        self.lb: list[float] = []
        self.ub: list[float] = []
        self.cost: list[float] = []
        self.integer: list[int] = []
        self.rows: list[tuple[dict[int, float], float, float]] = []

    def var(self, lb: float = 0.0, ub: float = 1.0, integer: bool = False, cost: float = 0.0) -> int:
        self.lb.append(lb)
        self.ub.append(ub)
        self.cost.append(cost)
        self.integer.append(int(integer))
        return len(self.lb) - 1

    def row(self, coeffs: dict[int, float], lb: float = -np.inf, ub: float = np.inf) -> None:
        self.rows.append((coeffs, lb, ub))

    def solve(self, time_limit_s: float) -> Any:  # scipy.optimize.OptimizeResult
        """HiGHS's result, in a child process (``common/children.py``) killed ``GRACE_S`` past the limit
        when HiGHS has not kept to it: then a result with no solution and no bound."""
        from scipy.optimize import OptimizeResult
        from scipy.sparse import coo_matrix

        rows, cols, vals = [], [], []
        for k, (coeffs, _, _) in enumerate(self.rows):
            for j, v in coeffs.items():
                rows.append(k)
                cols.append(j)
                vals.append(v)
        a = coo_matrix((vals, (rows, cols)), shape=(len(self.rows), len(self.lb))).tocsr()
        program = (np.array(self.cost), np.array(self.integer), np.array(self.lb), np.array(self.ub), a,
                   np.array([r[1] for r in self.rows]), np.array([r[2] for r in self.rows]))
        res = call_apart(_solve, (*program, time_limit_s), time_limit_s + GRACE_S)
        if res is None:
            return OptimizeResult(status=TIME_LIMIT, x=None, fun=None, mip_dual_bound=None,
                                  message=f"HiGHS ran {GRACE_S:g} s past its time limit and was stopped")
        return res


def _solve(cost: np.ndarray, integrality: np.ndarray, lb: np.ndarray, ub: np.ndarray, a: Any, low: np.ndarray,
           high: np.ndarray, time_limit_s: float) -> Any:
    from scipy.optimize import Bounds, LinearConstraint, milp

    constraint = LinearConstraint(a, low, high)
    started = time.perf_counter()

    def run(limit_s: float, **extra: bool) -> Any:
        options = {"time_limit": limit_s, "disp": False, "mip_rel_gap": MIP_GAP, **extra}
        return milp(cost, integrality=integrality, bounds=Bounds(lb, ub), constraints=constraint, options=options)

    with _quiet():
        res = run(time_limit_s)
        if res.status == SOLVE_ERROR:  # HiGHS's presolve fails on a few of these programs; without it, not
            res = run(max(1.0, time_limit_s - (time.perf_counter() - started)), presolve=False)
    return res


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Standard output closed to the solver: HiGHS 1.x prints some of its internal checks there whatever
    ``disp`` says, and a planner's output is the plan and its report."""
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 1)
            yield
    finally:
        os.dup2(saved, 1)
        os.close(saved)


def dual_bound(res: Any, floor: float = 0.0) -> float:
    """What HiGHS proved of a minimum: its dual bound; without one, the optimum less the gap it may stop
    at, or only ``floor`` (an incumbent is no bound). Less ``BOUND_SLACK``: HiGHS meets rows only to its
    feasibility tolerance, and on these programs' big-M rows that moved a proven bound 9e-6 above a
    plan's simulated step (a random 19-op graph, tests/test_exact_plan.py)."""
    dual = getattr(res, "mip_dual_bound", None)
    if dual is not None and np.isfinite(dual):
        return max(floor, float(dual) * (1 - BOUND_SLACK))
    if res.status == 0 and res.fun is not None:
        return max(floor, float(res.fun) * (1 - MIP_GAP - BOUND_SLACK))
    return floor
