"""How far is ga from the best phased plan over *every* order? (issue 42)

Usage: python bench/exact_orders.py [--max-orders 1000] [--seeds 150] [--time-limit 10] [--budgets 10 60]
                                    [--shard K/N] [--json FILE]

The property tests' random graphs (``seeded_training_graph(seed, max_depth=2)``, seeds below ``--seeds``)
and the convolution-shaped ones (``fuzz/shaped.py``) with at most ``--max-orders`` orders of first runs
(the smallest have 12-14 ops), the first four of each family, at the smallest feasible cap and 0.3 of the
way from it to the no-swap arena, on ``v100-16gb``. For each: belady, capuchin, ga at each of
``--budgets`` s (one worker, seed 0, its polish included), the exact plan for the model's order, and the
exact planner over every order (``orders.best_over_orders``, HiGHS ``--time-limit`` s an order, the ga
plans' orders first): the
fastest phased plan of the graph, proven when every order is settled. Every plan is simulated; the exact
ones are validated and checked to simulate at or under their program's value.
"""

from __future__ import annotations

import argparse
import json
import statistics

from swapdsl.devices.profiles import BUILTIN
from swapdsl.fuzz.graphs import seeded_training_graph
from swapdsl.fuzz.shaped import SHAPES
from swapdsl.plan.simulate import simulate
from swapdsl.plan.validate import validate
from swapdsl.planning.baselines import assemble
from swapdsl.planning.compiled import no_swap_bytes
from swapdsl.planning.exact import first_runs
from swapdsl.planning.exactplan import ExactPlan, exact_plan
from swapdsl.planning.ga import SearchOptions
from swapdsl.planning.optimize import optimize
from swapdsl.planning.orders import best_over_orders, count_orders
from swapdsl.planning.problem import Problem, Request
from swapdsl.planning.sizing import smallest_cap

DEVICE = BUILTIN["v100-16gb"]
FAMILIES = {"mlp": lambda seed: seeded_training_graph(seed, max_depth=2), "conv": SHAPES["conv"]}
WHERE = (0.0, 0.3)


def graphs(max_orders: int, seeds: int, per_family: int = 4) -> list[tuple[str, int]]:
    found = []
    for family, make in FAMILIES.items():
        picked = [s for s in range(seeds) if count_orders(Problem.build(make(s), DEVICE)) <= max_orders]
        found += [(family, s) for s in picked[:per_family]]
    return found


def simulated(req: Request, p: Problem, x: ExactPlan) -> float:
    if x.program is None or x.homes is None:
        return float("inf")
    plan = assemble(req, p, "exact", x.homes, x.program)
    validate(plan, req.graph)
    step = simulate(plan).iteration_ms
    assert step <= x.objective_ms * (1 + 1e-9), (step, x.objective_ms)
    return step


def case(family: str, seed: int, where: float, args: argparse.Namespace) -> dict:
    g = FAMILIES[family](seed)
    p = Problem.build(g, DEVICE)
    no_swap = no_swap_bytes(p)
    need = smallest_cap(p, no_swap)
    req = Request(g, DEVICE, int(need + where * (no_swap - need)) + p.scratch, f"{family}-{seed}", ())
    row = {"family": family, "seed": seed, "ops": p.n_ops, "orders": count_orders(p), "where": where}
    for method in ("belady", "capuchin"):
        row[method] = simulate(optimize(req, method, SearchOptions(workers=1, seed=0))).iteration_ms
    plans = {b: optimize(req, "ga", SearchOptions(budget_s=b, workers=1, seed=0)) for b in args.budgets}
    for b, plan in plans.items():
        row[f"ga{b:g}"] = simulate(plan).iteration_ms
        row[f"ga{b:g}_order"] = first_runs(plan)
    row["exact_default"] = simulated(req, p, exact_plan(p, req.cap, list(range(p.n_ops)), args.time_limit))
    over = best_over_orders(p, req.cap, args.time_limit, first=[first_runs(plan) for plan in plans.values()])
    row["best_over_orders"] = simulated(req, p, over.best) if over.best else float("inf")
    row.update(proven=over.proven, settled=over.settled, bound_ms=over.bound_ms, seconds=over.seconds,
               best_order=list(over.best.order) if over.best else None)
    return row


def summary(rows: list[dict], budgets: list[float]) -> None:
    def stats(values: list[float]) -> str:
        return f"median {statistics.median(values):.3f}, worst {max(values):.3f}, best {min(values):.3f}"

    print(f"\n{len(rows)} cases; every order settled in {sum(r['proven'] for r in rows)}")
    for method in [*(f"ga{b:g}" for b in budgets), "belady", "capuchin", "exact_default"]:
        print(f"{method} / best phased plan over every order: "
              f"{stats([r[method] / r['best_over_orders'] for r in rows])}")
    for b in budgets:
        ga = f"ga{b:g}"
        print(f"{ga} faster than every phased plan: "
              f"{sum(r[ga] < r['best_over_orders'] * (1 - 1e-6) for r in rows)}; "
              f"in the best plan's order: {sum(r[ga + '_order'] == r['best_order'] for r in rows)}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--max-orders", type=int, default=1000)
    ap.add_argument("--seeds", type=int, default=150)
    ap.add_argument("--time-limit", type=float, default=10.0)
    ap.add_argument("--budgets", type=float, nargs="+", default=[10.0, 60.0])
    ap.add_argument("--shard", default="0/1", help="K/N: run the cases whose index is K modulo N")
    ap.add_argument("--json", metavar="FILE")
    args = ap.parse_args()
    k, n = map(int, args.shard.split("/"))
    cases = [(f, s, w) for f, s in graphs(args.max_orders, args.seeds) for w in WHERE]
    gas = [f"ga{b:g}" for b in args.budgets]
    print(f"| graph | ops | orders | cap | belady | capuchin | {' | '.join(f'ga {b:g} s' for b in args.budgets)} "
          f"| exact (model's order) | best over every order | settled | seconds | "
          f"{' | '.join(f'ga {b:g} s / best' for b in args.budgets)} |")
    print("|---|" + "---:|" * (9 + 2 * len(gas)))
    rows = []
    for i, (family, seed, where) in enumerate(cases):
        if i % n != k:
            continue
        r = case(family, seed, where, args)
        rows.append(r)
        print(f"| {family} {seed} | {r['ops']} | {r['orders']} | {where:g} | {r['belady']:.4f} | {r['capuchin']:.4f} | "
              + "".join(f"{r[ga]:.4f} | " for ga in gas)
              + f"{r['exact_default']:.4f} | {r['best_over_orders']:.4f} | {r['settled']}/{r['orders']} | "
              f"{r['seconds']:.0f} | " + " | ".join(f"{r[ga] / r['best_over_orders']:.3f}" for ga in gas) + " |",
              flush=True)
    summary(rows, args.budgets)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
