"""Candidate evaluation speed on the largest zoo training graphs.

Usage: python bench/simulator.py [--models lstm_lm nasnet bert resnet] [--ratio 4] [--seconds 3] [--seeds 64]
                                 [--search 0]

A plan is made once (belady at the given ratio, default schedule). Then, each
repeated for the time budget and reported as a median:

- `evaluate ms`: what the search pays per candidate for swap planning plus
  simulation, in the compiled inner loop (swapdsl/planning/compiled.py), one core;
- `candidate ms`: the same plus decoding a genome (schedule from priorities,
  pinning, pool), i.e. one whole fitness evaluation of the genetic search;
- `seeds ms`: the median of one such evaluation over the search's own first
  population (`--seeds` genomes: other schedules, pinning shares, output
  placements and early swap-ins, which cost more than the plan above);
- `search ms` (with `--search S`): the median evaluation of an S-second search
  on one core (one worker process), from its first generation to its last: what
  the search itself pays per candidate as its population converges; `search
  evaluate ms`: the same search's swap planning plus simulation alone (as
  `evaluate ms`, without decoding the genome);
- `simulate ms`: the Python simulator replaying the finished plan (what
  `swapdsl simulate` runs), and `validate ms`: the validator, once.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import numpy as np

from swapdsl import api
from swapdsl.common.paths import STDLIB_DIR
from swapdsl.devices.profiles import load_device
from swapdsl.graph.autodiff import training_graph
from swapdsl.plan.simulate import simulate
from swapdsl.plan.validate import validate
from swapdsl.planning.baselines import baseline_setup
from swapdsl.planning.compiled import Evaluator, no_swap_bytes
from swapdsl.planning.ga import Decoder, SearchOptions, _seeds, genetic_search
from swapdsl.planning.optimize import optimize
from swapdsl.planning.problem import Problem, Request


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=["lstm_lm", "nasnet", "bert", "resnet"])
    ap.add_argument("--ratio", type=float, default=4.0)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--device", default="v100-16gb")
    ap.add_argument("--seeds", type=int, default=64)
    ap.add_argument("--search", type=float, default=0.0, help="seconds of search to time (0: none)")
    args = ap.parse_args()
    device = load_device(args.device)
    print(f"{'model':<10} {'ops':>7} {'instructions':>12} {'plan s':>7} {'validate ms':>12} "
          f"{'simulate ms':>12} {'evaluate ms':>12} {'candidate ms':>13} {'seeds ms':>9} {'search ms':>10} "
          f"{'search evaluate ms':>19}")
    for model in args.models:
        g = api.load(STDLIB_DIR / "models" / f"{model}.swp").graph
        t = training_graph(g)
        p = Problem.build(t, device)
        no_swap = no_swap_bytes(p)
        started = time.perf_counter()
        plan = optimize(Request(t, device, int(no_swap / args.ratio), model, g.args), "belady")
        plan_s = time.perf_counter() - started
        started = time.perf_counter()
        validate(plan)
        validate_ms = 1e3 * (time.perf_counter() - started)
        d = Decoder(Request(t, device, plan.cap, model, g.args))
        s, _ = baseline_setup(p, "belady", plan.cap)
        schedule = np.asarray(s.schedule, np.int64)
        population = _seeds(d, np.random.default_rng(0), args.seeds)
        genome = population[0]
        d.score(genome)  # compile, or load the compiled code
        print(f"{model:<10} {len(plan.ops):>7} {len(plan.program):>12} {plan_s:>7.1f} {validate_ms:>12.1f} "
              f"{_median_ms(lambda: simulate(plan), args.seconds):>12.2f} "
              f"{_median_ms(lambda: d.evaluator(schedule, plan.cap, s.pinned, s.policy), args.seconds):>12.2f} "
              f"{_median_ms(lambda: d.score(genome), args.seconds):>13.2f} "
              f"{statistics.median(_ms(lambda: d.score(g)) for g in population):>9.2f} "
              f"{_search_ms(d.req, args.search)}")


def _search_ms(req: Request, seconds: float) -> str:
    """The median times of ``Decoder.score`` and of the evaluator call inside it over a search of
    ``seconds`` in this process, as two right-aligned columns."""
    if seconds <= 0:
        return f"{'-':>10} {'-':>19}"
    times: dict[str, list[float]] = {"score": [], "evaluate": []}
    score, evaluate = Decoder.score, Evaluator.__call__

    def timed(f: Callable[..., float], into: list[float]) -> Callable[..., float]:
        def run(*a: object) -> float:
            started = time.perf_counter()
            result = f(*a)
            into.append(1e3 * (time.perf_counter() - started))
            return result
        return run

    Decoder.score = timed(score, times["score"])  # type: ignore[method-assign]
    Evaluator.__call__ = timed(evaluate, times["evaluate"])  # type: ignore[method-assign]
    try:
        genetic_search(req, SearchOptions(budget_s=seconds, workers=1, polish=0.0))  # (the search loop alone)
    finally:
        Decoder.score, Evaluator.__call__ = score, evaluate  # type: ignore[method-assign]
    return f"{statistics.median(times['score']):>10.2f} {statistics.median(times['evaluate']):>19.2f}"


def _ms(f: Callable[[], object]) -> float:
    started = time.perf_counter()
    f()
    return 1e3 * (time.perf_counter() - started)


def _median_ms(f: Callable[[], object], seconds: float) -> float:
    times: list[float] = []
    started = time.perf_counter()
    while time.perf_counter() - started < seconds or len(times) < 3:
        times.append(_ms(f))
    return statistics.median(times)


if __name__ == "__main__":
    main()
