"""What each micro-batch count is worth to each planner: the evidence behind `--microbatches auto`'s climb.

Usage: python bench/microbatch_counts.py MODEL RATIO COUNTS [--budget 60] [--workers 2]
                                         [--device h100-80gb] [--precision bf16] [--probe 6]
e.g.   python bench/microbatch_counts.py bert 12 1,2,4,8,16

The cap is the model's no-swap arena of one pass / RATIO (as `--memory 1/RATIO`). For each count: the
graph's ops, its own ideal step, `belady`'s and `capuchin`'s steps, and `ga` searched alone with the whole
budget: the time it took to set up (its first generation), its step after `--probe` seconds of search
(what the climb's probe sees at a 60 s budget) and at the end. Steps in ms; one JSON line per count.
"""

from __future__ import annotations

import argparse
import json
import time

from swapdsl.api import load, load_device, no_swap_arena
from swapdsl.common.errors import SwpError
from swapdsl.planning.bench import model_path
from swapdsl.planning.bound import ideal_ms
from swapdsl.planning.ga import SearchOptions, SearchProgress
from swapdsl.planning.optimize import optimize
from swapdsl.planning.problem import Problem, Request


def step_ms(req: Request, method: str, search: SearchOptions | None = None) -> float | None:
    try:
        return dict(optimize(req, method, search).figures)["iteration_ms"]
    except SwpError:
        return None


def count_row(args: argparse.Namespace, k: int, cap: int, one_pass_ms: float) -> dict:
    m = load(model_path(args.model), precision=args.precision, microbatches=k)
    req = Request(m.training, load_device(args.device), cap, str(m.path), m.graph.args)
    own = ideal_ms(Problem.of(req))
    trace: list[SearchProgress] = []
    search = SearchOptions(budget_s=args.budget, workers=args.workers, progress=trace.append)
    row = {"model": args.model, "ratio": args.ratio, "k": k, "ops": len(req.graph.ops), "ideal_ms": own,
           "one_pass_ideal_ms": one_pass_ms, "belady_ms": step_ms(req, "belady"),
           "capuchin_ms": step_ms(req, "capuchin"), "ga_ms": step_ms(req, "ga", search)}
    if trace and trace[0].best_fraction:
        first = trace[0].seconds
        probed = [p for p in trace if p.seconds <= first + args.probe]
        row |= {"ga_setup_s": first, "ga_probe_ms": own / probed[-1].best_fraction}
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("ratio", type=float)
    ap.add_argument("counts", help="micro-batch counts, comma-separated (each must divide the batch)")
    ap.add_argument("--budget", type=float, default=60.0)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--device", default="h100-80gb")
    ap.add_argument("--precision", default="bf16")
    ap.add_argument("--probe", type=float, default=6.0, help="seconds of search after set-up for ga_probe_ms")
    args = ap.parse_args()
    whole = load(model_path(args.model), precision=args.precision)
    cap = int(no_swap_arena(whole.training) / args.ratio)
    one = ideal_ms(Problem.of(Request(whole.training, load_device(args.device), cap, str(whole.path),
                                      whole.graph.args)))
    for k in [int(c) for c in args.counts.split(",")]:
        started = time.perf_counter()
        row = count_row(args, k, cap, one)
        print(json.dumps(row | {"seconds": round(time.perf_counter() - started, 1)}), flush=True)


if __name__ == "__main__":
    main()
