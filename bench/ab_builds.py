"""Two builds of the compiled inner loop timed against each other, interleaved, on the same candidates.

Usage: python bench/ab_builds.py OLD.so NEW.so [--model lstm_lm] [--ratio 4] [--seconds 30]
                                 [--samples 120] [--reps 5]

Runs one after the other vary by 10-15% on this machine, so the README's per-change figures come from
this rather than from `bench/simulator.py` run twice. A search of `--seconds` on one core records
every candidate it evaluates; `--samples` of them, evenly spaced, plus the belady plan, are then timed
by both builds in turn, `--reps` times each (best kept), and the two results are asserted equal (the
builds must make the same programs). Prints the belady plan's times, the candidates' medians and the
median of the paired ratios NEW / OLD.

Builds from before 3119697 (no `rank_gaps` argument, a name order over every tensor) are called the
way they expect.
"""

from __future__ import annotations

import argparse
import importlib.machinery
import importlib.util
import statistics
import time
import types
from typing import Any

import numpy as np

from swapdsl import api
from swapdsl.common.paths import STDLIB_DIR
from swapdsl.devices.profiles import load_device
from swapdsl.graph.autodiff import training_graph
from swapdsl.planning import compiled
from swapdsl.planning.baselines import baseline_setup
from swapdsl.planning.compiled import no_swap_bytes
from swapdsl.planning.ga import SearchOptions, genetic_search
from swapdsl.planning.problem import Problem, Request


def _load(name: str, path: str) -> Any:
    loader = importlib.machinery.ExtensionFileLoader(name, path)
    spec = importlib.util.spec_from_file_location(name, path, loader=loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    if "rank_gaps" in (module.plan.__doc__ or ""):
        return module
    old = types.SimpleNamespace(simulate=module.simulate, priority_order=module.priority_order)
    old.plan = lambda *a: module.plan(*a[:18], *a[19:])  # (no rank_gaps)
    old.every_name = True
    return old


def _capture(req: Request, seconds: float) -> list[tuple[np.ndarray, int, frozenset[int], Any]]:
    calls = []
    call = compiled.Evaluator.__call__

    def recording(self: compiled.Evaluator, schedule: Any, cap: int, pinned: frozenset[int], policy: Any) -> Any:
        calls.append((np.array(schedule, np.int64), cap, pinned, policy))
        return call(self, schedule, cap, pinned, policy)

    compiled.Evaluator.__call__ = recording  # type: ignore[method-assign]
    try:
        genetic_search(req, SearchOptions(budget_s=seconds, workers=1, polish=0.0))  # (the search loop alone)
    finally:
        compiled.Evaluator.__call__ = call  # type: ignore[method-assign]
    return calls


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("old")
    ap.add_argument("new")
    ap.add_argument("--model", default="lstm_lm")
    ap.add_argument("--ratio", type=float, default=4.0)
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--samples", type=int, default=120)
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    device = load_device("v100-16gb")
    g = api.load(STDLIB_DIR / "models" / f"{args.model}.swp").graph
    t = training_graph(g)
    p = Problem.build(t, device)
    req = Request(t, device, int(no_swap_bytes(p) / args.ratio), args.model, g.args)
    calls = _capture(req, args.seconds)
    s, _ = baseline_setup(p, "belady", req.cap)
    cases = [(np.asarray(s.schedule, np.int64), req.cap, s.pinned, s.policy)]
    cases += [calls[i] for i in np.linspace(0, len(calls) - 1, args.samples).astype(int)]
    builds = [_load("old._fastplan", args.old), _load("new._fastplan", args.new)]
    every_name = np.array(sorted(range(len(p.names)), key=p.names.__getitem__), np.int64)
    evaluators = []
    for build in builds:
        ev = compiled.Evaluator(p)
        if getattr(build, "every_name", False):
            ev.by_name = every_name
        evaluators.append(ev)
    best: list[list[float]] = [[], []]
    for case in cases:
        times: list[list[float]] = [[], []]
        results: list[object] = [None, None]
        for _ in range(args.reps):
            for k, (build, ev) in enumerate(zip(builds, evaluators)):
                compiled._fastplan = build
                started = time.perf_counter()
                results[k] = ev(*case)
                times[k].append(time.perf_counter() - started)
        assert results[0] == results[1], f"the builds disagree: {results}"
        for k in range(2):
            best[k].append(1e3 * min(times[k]))
    ratios = [b / a for a, b in zip(best[0][1:], best[1][1:])]
    print(f"{args.model}: belady plan {best[0][0]:.2f} -> {best[1][0]:.2f} ms ({best[1][0] / best[0][0]:.3f}); "
          f"{len(cases) - 1} search candidates, medians {statistics.median(best[0][1:]):.2f} -> "
          f"{statistics.median(best[1][1:]):.2f} ms, paired ratio {statistics.median(ratios):.3f}; same results")


if __name__ == "__main__":
    main()
