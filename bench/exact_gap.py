"""How far from optimal is ga? Exact plans (planning/exactplan.py) and exact bounds (planning/exact.py),
both solved by HiGHS, beside every method's plan, on small random graphs.

Usage: python bench/exact_gap.py [--per-family 10] [--families mlp conv attention lstm] [--ratios 2 4 8 12]
                                 [--ops 10 30] [--time-limit 20] [--bound-limit 10] [--budgets 10 60] [--bus 1]
                                 [--shard K/N] [--json FILE]
       python bench/exact_gap.py --explain FAMILY:SEED:RATIO   (ga's plan beside the exact plan for its order)

Case k of a family is its k-th graph of 10-30 ops (``--ops``; by seed) at ratio ``ratios[k % len(ratios)]``
(cap: no-swap bytes / ratio, at least the smallest feasible cap, plus the scratch), on ``v100-16gb`` (with
its copies ``--bus`` times slower). For each case: belady, capuchin, ga at each of ``--budgets`` seconds (one
worker, seed 0; with its polish, and its search's plan before it), the exact planner's plan for the default
order and for the order of ga's longest search (HiGHS
``--time-limit`` each; the plan's simulated step is at most the program's value), the exact bound for those
two orders (no plan with that order is faster; ``--bound-limit``), and
``recompute_bound_ms``, which bounds every plan. Prints a row per case, then the summary.
"""

from __future__ import annotations

import argparse
import json
import statistics

import attrs

from swapdsl.common.errors import SwpError

from swapdsl.devices.profiles import BUILTIN
from swapdsl.fuzz.graphs import seeded_training_graph
from swapdsl.fuzz.shaped import SHAPES
from swapdsl.graph.ir import Graph
from swapdsl.plan.program import Plan, Region, Run, SwapIn, SwapOut
from swapdsl.plan.simulate import simulate
from swapdsl.plan.validate import validate
from swapdsl.planning.baselines import assemble
from swapdsl.planning.bound import recompute_bound_ms
from swapdsl.planning.compiled import no_swap_bytes
from swapdsl.planning.exact import exact_bound, first_runs
from swapdsl.planning.exactplan import exact_plan
from swapdsl.planning.ga import SearchOptions
from swapdsl.planning.optimize import optimize
from swapdsl.planning.problem import Problem, Request
from swapdsl.planning.sizing import need_bytes

DEVICE = BUILTIN["v100-16gb"]
FAMILIES = {"mlp": lambda seed: seeded_training_graph(seed, max_depth=3), **SHAPES}


def exact_ms(req: Request, p: Problem, order: list[int], limit: float) -> tuple[float, bool]:
    """The exact planner's plan for ``order``: its simulated step (checked against the program's value and
    validated) and whether HiGHS proved it optimal among phased plans."""
    x = exact_plan(p, req.cap, order, limit)
    if x.program is None or x.homes is None:
        return float("inf"), x.optimal
    plan = assemble(req, p, "exact", x.homes, x.program)
    validate(plan, req.graph)
    step = simulate(plan).iteration_ms
    assert step <= x.objective_ms * (1 + 1e-9), (step, x.objective_ms)
    return step, x.optimal


def seeds(family: str, count: int, lo: int, hi: int) -> list[int]:
    """The first ``count`` seeds whose graph of ``family`` has ``lo`` to ``hi`` ops."""
    found: list[int] = []
    for seed in range(100 * count):
        if len(found) == count:
            break
        if lo <= Problem.build(FAMILIES[family](seed), DEVICE).n_ops <= hi:
            found.append(seed)
    return found


def request(family: str, seed: int, ratio: float, bus: float = 1.0) -> tuple[Request, Problem]:
    """Case ``seed`` of ``family`` at ``ratio`` (module docstring), with the bus ``bus`` times slower."""
    g, dev = FAMILIES[family](seed), DEVICE.slower_bus(bus)
    p = Problem.build(g, dev)
    cap = max(int(no_swap_bytes(p) / ratio), need_bytes(p, frozenset())) + p.scratch
    return Request(g, dev, cap, f"{family}-{seed}", ()), p


def case(family: str, seed: int, ratio: float, args: argparse.Namespace) -> dict:
    req, p = request(family, seed, ratio, args.bus)
    cap = req.cap
    row: dict = {"family": family, "seed": seed, "ops": p.n_ops, "ratio": ratio, "cap": cap,
                 "ideal_ms": sum(p.op_ms), "recompute_bound_ms": recompute_bound_ms(p, cap - p.scratch)}
    for method in ("belady", "capuchin"):
        row[method] = simulate(optimize(req, method)).iteration_ms
    ga_order: list[int] = []
    for budget in args.budgets:
        plan = optimize(req, "ga", SearchOptions(budget_s=budget, workers=1, seed=0))
        row[f"ga{budget}"] = simulate(plan).iteration_ms
        # the search's own plan, before the exact planner reworked it in its order (planning/polish.py)
        row[f"ga{budget}_searched"] = dict(plan.figures).get("polished_from_ms", row[f"ga{budget}"])
        ga_order = first_runs(plan)
    for name, order in (("default", list(range(p.n_ops))), ("ga_order", ga_order)):
        row[f"exact_{name}"], row[f"exact_{name}_proven"] = exact_ms(req, p, order, args.time_limit)
        b = exact_bound(p, cap, order, args.bound_limit)
        row[f"bound_{name}"], row[f"bound_{name}_proven"] = b.bound_ms, b.optimal
    row["best_plan"] = min(row[k] for k in ("belady", "capuchin", *(f"ga{b}" for b in args.budgets), "exact_default",
                                            "exact_ga_order"))
    return row


def decisions(plan: Plan) -> str:
    """What a plan decided: pinned tensors, swaps (count, MB each way), reruns, and its step."""
    r = simulate(plan)
    pinned = sum(1 for t in plan.tensors if isinstance(t.home, Region) and t.kind != "input")
    ins = sum(isinstance(i, SwapIn) for i in plan.program)
    outs = sum(isinstance(i, SwapOut) for i in plan.program)
    reruns = sum(isinstance(i, Run) and i.recompute for i in plan.program)
    return (f"step {r.iteration_ms:.4f} ms (ideal {plan.ideal_ms():.4f}); pinned {pinned}; swap-ins {ins} "
            f"({r.h2d_bytes / 1e3:.1f} kB), swap-outs {outs} ({r.d2h_bytes / 1e3:.1f} kB); reruns {reruns}")


def _swap_out_early(plan: Plan, k: int) -> Plan | None:
    """``plan`` with instruction ``k``, a swap-out, moved back to just after the run that made its tensor."""
    out, prog = plan.program[k], plan.program
    if not isinstance(out, SwapOut):
        return None
    made = [i for i, x in enumerate(prog[:k]) if isinstance(x, Run) and out.tensor in dict(x.outs)]
    if not made or made[-1] == k - 1:
        return None
    j = made[-1]
    return attrs.evolve(plan, program=(*prog[:j + 1], attrs.evolve(out, after=prog[j].op), *prog[j + 1:k],
                                       *prog[k + 1:]))


def eager_swap_outs(plan: Plan, graph: Graph) -> Plan:
    """``plan`` with its swap-outs started as soon as their tensors are made, one at a time, each move kept
    where the plan stays valid and simulates faster: what starting copies early would gain."""
    best, step, k = plan, simulate(plan).iteration_ms, 0
    while k < len(best.program):
        candidate, k = _swap_out_early(best, k), k + 1
        if candidate is None:
            continue
        try:
            validate(candidate, graph)
        except SwpError:
            continue
        if (s := simulate(candidate).iteration_ms) < step * (1 - 1e-9):
            best, step, k = candidate, s, 0
    return best


def explain(what: str, limit: float, bus: float) -> None:
    """``--explain FAMILY:SEED:RATIO``: ga's 60 s plan, unpolished, beside the exact plan for its order."""
    family, seed, ratio = what.split(":")
    req, p = request(family, int(seed), float(ratio), bus)
    ga = optimize(req, "ga", SearchOptions(budget_s=60, workers=1, seed=0, polish=0.0))
    x = exact_plan(p, req.cap, first_runs(ga), limit)
    print(f"ga 60 s, no polish:   {decisions(ga)}")
    print(f"  swap-outs early:    {decisions(eager_swap_outs(ga, req.graph))}")
    if x.program is not None and x.homes is not None:
        print(f"exact, ga's order:    {decisions(assemble(req, p, 'exact', x.homes, x.program))}")
    for name, plan in (("ga", ga), ("exact", assemble(req, p, "exact", x.homes or {}, x.program or ()))):
        print(f"\n{name}'s program:")
        for instr in plan.program:
            print(f"  {instr}")


def summary(rows: list[dict], budgets: list[int]) -> None:
    def stats(values: list[float]) -> str:
        return f"median {statistics.median(values):.3f}, worst {max(values):.3f}"

    top = f"ga{max(budgets)}"
    print(f"\n{len(rows)} cases")
    for method in (*(f"ga{b}" for b in budgets), *(f"ga{b}_searched" for b in budgets), "belady", "capuchin",
                   "exact_default", "exact_ga_order"):
        print(f"{method} / best plan: {stats([r[method] / r['best_plan'] for r in rows])}")
    print(f"{top} / exact plan for ga's own order: {stats([r[top] / r['exact_ga_order'] for r in rows])}")
    print(f"{top} / exact bound for ga's own order: {stats([r[top] / r['bound_ga_order'] for r in rows])}")
    print(f"best plan / exact bound for ga's own order: {stats([r['best_plan'] / r['bound_ga_order'] for r in rows])}")
    print(f"{top} / recompute_bound_ms: {stats([r[top] / r['recompute_bound_ms'] for r in rows])}")
    print(f"best plan / recompute_bound_ms: {stats([r['best_plan'] / r['recompute_bound_ms'] for r in rows])}")
    for budget in budgets:
        polished = sum(r[f"ga{budget}"] < r[f"ga{budget}_searched"] for r in rows)
        print(f"ga{budget}: the polish made the plan faster in {polished} of {len(rows)} cases")
    beaten = sum(r[top] > r["best_plan"] * (1 + 1e-9) for r in rows)
    print(f"cases where a plan beats {top}: {beaten} of {len(rows)}")


def table_row(r: dict, budgets: list[int]) -> str:
    mark = {True: "", False: "*"}
    exact = [f"{r[k]:.4f}{mark[r[k + '_proven']]}" for k in ("exact_default", "exact_ga_order", "bound_default",
                                                              "bound_ga_order")]
    ga = [f"{r[f'ga{b}']:.4f}" for b in budgets] + [f"{r[f'ga{max(budgets)}_searched']:.4f}"]
    cells = [r["family"], str(r["seed"]), str(r["ops"]), f"{r['ratio']:g}", f"{r['ideal_ms']:.4f}",
             f"{r['recompute_bound_ms']:.4f}", f"{r['belady']:.4f}", f"{r['capuchin']:.4f}", *ga, *exact]
    return "| " + " | ".join(cells) + " |"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--per-family", type=int, default=10)
    ap.add_argument("--families", nargs="+", default=list(FAMILIES), choices=list(FAMILIES))
    ap.add_argument("--ratios", type=float, nargs="+", default=[2.0, 4.0, 8.0, 12.0])
    ap.add_argument("--ops", type=int, nargs=2, default=[10, 30], metavar=("LO", "HI"),
                    help="take the graphs of LO to HI ops (the first --per-family seeds that give one)")
    ap.add_argument("--time-limit", type=float, default=20.0)
    ap.add_argument("--bound-limit", type=float, default=10.0)
    ap.add_argument("--budgets", type=int, nargs="+", default=[10, 60], help="ga's search budgets, in seconds")
    ap.add_argument("--bus", type=float, default=1.0,
                    help="copies this many times slower (latency aside): tensors that much larger beside the op times")
    ap.add_argument("--shard", default="0/1", help="K/N: run the cases whose index is K modulo N")
    ap.add_argument("--json", metavar="FILE")
    ap.add_argument("--explain", metavar="FAMILY:SEED:RATIO", help="print ga's plan and the exact plan for its order")
    args = ap.parse_args()
    if args.explain:
        explain(args.explain, args.time_limit, args.bus)
        return
    k, n = map(int, args.shard.split("/"))
    cases = [(f, s, args.ratios[k % len(args.ratios)]) for f in args.families
             for k, s in enumerate(seeds(f, args.per_family, *args.ops))]
    ga = [f"ga {b} s" for b in args.budgets] + [f"ga {max(args.budgets)} s, searched"]
    heads = ["family", "seed", "ops", "ratio", "ideal", "recompute_bound", "belady", "capuchin", *ga,
             "exact (default order)", "exact (ga's order)", "bound (default)", "bound (ga's order)"]
    print("| " + " | ".join(heads) + " |")
    print("|---|" + "---:|" * (len(heads) - 1))
    rows = []
    for i, (family, seed, ratio) in enumerate(cases):
        if i % n != k:
            continue
        rows.append(case(family, seed, ratio, args))
        print(table_row(rows[-1], args.budgets), flush=True)
    summary(rows, args.budgets)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
