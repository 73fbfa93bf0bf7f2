"""Does any method's plan beat the exact plan for that plan's own order? (issue 42)

Usage: python bench/exact_beats.py [--seeds 40] [--max-ops 16] [--budget 1] [--time-limit 20]

For each of the property tests' random training graphs (``seeded_training_graph(seed, max_depth=2)``)
with at most ``--max-ops`` ops, at three caps between the smallest feasible and the no-swap one: every
method's plan (``ga`` with ``--budget`` seconds on one worker) against the exact planner's plan for the
order the method's plan runs its ops in, both simulated. Prints every plan that is faster, and the count.
"""

from __future__ import annotations

import argparse

from swapdsl.common.errors import SwpError
from swapdsl.devices.profiles import BUILTIN
from swapdsl.fuzz.graphs import seeded_training_graph
from swapdsl.plan.simulate import simulate
from swapdsl.planning.baselines import assemble
from swapdsl.planning.compiled import no_swap_bytes
from swapdsl.planning.exact import first_runs
from swapdsl.planning.exactplan import exact_plan
from swapdsl.planning.ga import SearchOptions
from swapdsl.planning.optimize import METHOD_NAMES, optimize
from swapdsl.planning.problem import Problem, Request
from swapdsl.planning.sizing import smallest_cap

DEVICE = BUILTIN["v100-16gb"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=40)
    ap.add_argument("--max-ops", type=int, default=16)
    ap.add_argument("--budget", type=float, default=1.0)
    ap.add_argument("--time-limit", type=float, default=20.0)
    args = ap.parse_args()
    beaten = total = missing = 0
    for seed in range(args.seeds):
        g = seeded_training_graph(seed, max_depth=2)
        p = Problem.build(g, DEVICE)
        if p.n_ops > args.max_ops:
            continue
        no_swap = no_swap_bytes(p)
        need = smallest_cap(p, no_swap)
        for where in (0.0, 0.3, 0.7):
            cap = int(need + where * (no_swap - need)) + p.scratch
            req = Request(g, DEVICE, cap, f"random-{seed}", ())
            for method in (m for m in METHOD_NAMES if m != "exact"):
                try:
                    # (ga unpolished: its own plan, not the exact planner's for its order)
                    plan = optimize(req, method, SearchOptions(budget_s=args.budget, workers=1, seed=0, polish=0.0))
                except SwpError:
                    continue  # (checkpoint does not fit every cap)
                step, total = simulate(plan).iteration_ms, total + 1
                x = exact_plan(p, cap, first_runs(plan), args.time_limit)
                if x.program is None or x.homes is None:
                    missing += 1
                    print(f"seed {seed} at {where:g}: no exact plan for {method}'s order ({x.why})")
                    continue
                exact = simulate(assemble(req, p, "exact", x.homes, x.program)).iteration_ms
                if step < exact * (1 - 1e-6):
                    beaten += 1
                    print(f"seed {seed} ({p.n_ops} ops) at {where:g} of the way to no swaps: {method} "
                          f"{step:.5f} ms, exact for its order {exact:.5f} ms"
                          f"{'' if x.optimal else ' (not proven)'}", flush=True)
    print(f"{beaten} of {total} plans beat the exact plan for their own order; {missing} orders without one")


if __name__ == "__main__":
    main()
