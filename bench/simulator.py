"""Simulator speed: evaluations per second on the largest zoo training graphs.

Usage: python bench/simulator.py [--models lstm_lm nasnet bert] [--ratio 4] [--seconds 3]

A plan is made once (belady at the given ratio); then the simulator replays
it as many times as fit in the time budget. The optimiser's fitness is this
replay, so this figure bounds how many candidates a search can score.
"""

from __future__ import annotations

import argparse
import time

from swapdsl.autodiff import training_graph
from swapdsl.cli import build_graph
from swapdsl.devices import load_device
from swapdsl.paths import STDLIB_DIR
from swapdsl.planners import Request, optimize
from swapdsl.pool import no_swap_bytes
from swapdsl.problem import Problem
from swapdsl.simulate import simulate
from swapdsl.validate import validate


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=["lstm_lm", "nasnet", "bert", "resnet"])
    ap.add_argument("--ratio", type=float, default=4.0)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--device", default="v100-16gb")
    args = ap.parse_args()
    device = load_device(args.device)
    print(f"{'model':<10} {'ops':>7} {'instructions':>12} {'plan s':>7} {'validate ms':>12} "
          f"{'simulate ms':>12} {'evals/s':>8}")
    for model in args.models:
        _, g = build_graph(str(STDLIB_DIR / "models" / f"{model}.swp"), [])
        t = training_graph(g)
        p = Problem.build(t, device)
        no_swap = no_swap_bytes(p)
        started = time.perf_counter()
        plan = optimize(Request(t, device, int(no_swap / args.ratio), model, g.args), "belady")
        plan_s = time.perf_counter() - started
        started = time.perf_counter()
        validate(plan)
        validate_ms = 1e3 * (time.perf_counter() - started)
        runs, started = 0, time.perf_counter()
        while time.perf_counter() - started < args.seconds:
            simulate(plan)
            runs += 1
        per = (time.perf_counter() - started) / runs
        print(f"{model:<10} {len(plan.ops):>7} {len(plan.program):>12} {plan_s:>7.1f} {validate_ms:>12.1f} "
              f"{1e3 * per:>12.1f} {1 / per:>8.1f}")


if __name__ == "__main__":
    main()
