"""How far are the planners from the best plan with their own order? The exact program's bound
(swapdsl/planning/exact.py, HiGHS through SciPy) for the order of each method's plan, on random graphs.

Usage: python bench/exact_gap.py [--graphs 12] [--ratios 2 4 8] [--ga-budget 5] [--time-limit 60]

For each graph (the property tests' generator, ``seeded_training_graph(seed, max_depth=3)``) and each cap
(no-swap bytes / ratio, at least the smallest feasible cap, plus the scratch), plans with belady, capuchin
and ga (its budget in seconds, one worker), simulates each, and solves the program for that plan's order
of first runs: the bound no plan with that order can beat. Prints one row per (graph, ratio, method): the
plan's step, the bound, their ratio and whether the solver proved the optimum, with the swap-only bound
and ``recompute_bound_ms`` beside them; then the median and worst plan / bound per method. A plan below
its bound would be a bug in the program, and is reported as one.
"""

from __future__ import annotations

import argparse
import json
import statistics

from swapdsl.devices.profiles import BUILTIN
from swapdsl.fuzz.graphs import seeded_training_graph
from swapdsl.plan.simulate import simulate
from swapdsl.planning.bound import recompute_bound_ms
from swapdsl.planning.compiled import no_swap_bytes
from swapdsl.planning.exact import exact_bound, first_runs
from swapdsl.planning.ga import SearchOptions
from swapdsl.planning.optimize import optimize
from swapdsl.planning.problem import Problem, Request
from swapdsl.planning.sizing import need_bytes

METHODS = ("belady", "capuchin", "ga")


def rows_for(seed: int, ratios: list[float], args: argparse.Namespace) -> list[dict]:
    dev = BUILTIN["v100-16gb"]
    g = seeded_training_graph(seed, max_depth=3)
    p = Problem.build(g, dev)
    no_swap, need = no_swap_bytes(p), need_bytes(p, frozenset())
    rows = []
    for ratio in ratios:
        cap = max(int(no_swap / ratio), need) + p.scratch
        req = Request(g, dev, cap, f"random-{seed}", ())
        for method in METHODS:
            plan = optimize(req, method, SearchOptions(budget_s=args.ga_budget, workers=1, seed=0))
            step = simulate(plan).iteration_ms
            b = exact_bound(p, cap, first_runs(plan), args.time_limit)
            rows.append({"seed": seed, "ops": p.n_ops, "ratio": ratio, "cap": cap, "method": method,
                         "plan_ms": step, "bound_ms": b.bound_ms, "optimal": b.optimal, "solve_s": b.seconds,
                         "recompute_bound_ms": recompute_bound_ms(p, cap - p.scratch),
                         "below_bound": step < b.bound_ms * (1 - 1e-9)})
            r = rows[-1]
            print(f"| {seed} | {p.n_ops} | {ratio:g} | {method} | {step:.4f} | {b.bound_ms:.4f} | "
                  f"{step / b.bound_ms:.3f} | {'yes' if b.optimal else 'no'} | {r['recompute_bound_ms']:.4f} |"
                  + (" BELOW THE BOUND" if r["below_bound"] else ""), flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--graphs", type=int, default=12)
    ap.add_argument("--ratios", type=float, nargs="+", default=[2.0, 4.0, 8.0])
    ap.add_argument("--ga-budget", type=float, default=5.0)
    ap.add_argument("--time-limit", type=float, default=60.0)
    ap.add_argument("--json", metavar="FILE")
    args = ap.parse_args()
    print("| graph | ops | ratio | method | plan ms | bound (its order) ms | plan / bound | proven | "
          "recompute_bound_ms |\n|---:|---:|---:|---|---:|---:|---:|---|---:|")
    rows = [r for seed in range(args.graphs) for r in rows_for(seed, args.ratios, args)]
    for method in METHODS:
        gaps = [r["plan_ms"] / r["bound_ms"] for r in rows if r["method"] == method]
        print(f"{method}: plan / bound median {statistics.median(gaps):.3f}, worst {max(gaps):.3f}")
    print(f"plans below their bound: {sum(r['below_bound'] for r in rows)} of {len(rows)}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
