"""Mutated model files through `swapdsl check --training`: exit 0, or exit 2 at a file position.

Usage: python bench/fuzz_models.py [--cases 20000] [--seed 0] [--workers 0] [--models mlp tiny_resnet ...]

Each case mutates a stdlib model (or the layers file it imports) once: characters, tokens, lines, an
odd number, deep nesting or a very long line (swapdsl.fuzz.models), and runs `check --training` on it
in process, with a 10 s limit. Case i of seed s is the same on every machine. Prints the counts per
mutation kind, the slowest cases, and every traceback, hang or unplaced error; exits 1 if any.
"""

from __future__ import annotations

import argparse
import collections
import multiprocessing
import os
import sys
import tempfile
import time
from pathlib import Path

from swapdsl.fuzz.models import KINDS, SMALL, VERDICTS, case_of, judge, seeds

_SOURCES: dict[str, dict[str, str]] = {}
_FOLDER: Path | None = None


def _setup(models: tuple[str, ...]) -> None:
    global _FOLDER
    _SOURCES.update(seeds(models))
    _FOLDER = Path(tempfile.mkdtemp(prefix="swapdsl-fuzz-"))


def _one(job: tuple[int, int]) -> tuple[int, str, str, str, str, float]:
    seed, index = job
    assert _FOLDER is not None
    model, case = case_of(seed, index, _SOURCES)
    started = time.perf_counter()
    verdict = judge(case, _FOLDER)
    return index, model, case.kind, f"{case.file}: {case.what}", f"{verdict.verdict}: {verdict.detail}", \
        time.perf_counter() - started


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", type=int, default=20_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workers", type=int, default=0, help="processes (0: every core)")
    ap.add_argument("--models", nargs="+", default=list(SMALL), help=f"stdlib models (default {' '.join(SMALL)})")
    args = ap.parse_args()
    workers = args.workers or os.cpu_count() or 1
    counts = {k: collections.Counter() for k in KINDS}
    bad, times = [], []
    started = time.perf_counter()
    with multiprocessing.get_context("fork").Pool(workers, _setup, (tuple(args.models),)) as pool:
        jobs = ((args.seed, i) for i in range(args.cases))
        for index, model, kind, what, verdict, seconds in pool.imap_unordered(_one, jobs, chunksize=8):
            counts[kind][verdict.split(":")[0]] += 1
            times.append((seconds, index, model, what))
            if not verdict.startswith(("ok:", "refused:")):
                bad.append(f"case {index} ({model}, {what}) -> {verdict}")
                print(bad[-1], flush=True)
    wall = time.perf_counter() - started
    print(f"\n{args.cases} cases (seed {args.seed}, models {' '.join(args.models)}) in {wall:.0f} s on {workers} "
          f"processes\n")
    print(f"| kind | {' | '.join(VERDICTS)} |\n|---|{'---:|' * len(VERDICTS)}")
    for kind in KINDS:
        print(f"| {kind} | {' | '.join(str(counts[kind][v]) for v in VERDICTS)} |")
    print(f"| all | {' | '.join(str(sum(counts[k][v] for k in KINDS)) for v in VERDICTS)} |")
    times.sort()
    print(f"\nmedian case {times[len(times) // 2][0]:.2f} s; slowest:")
    for seconds, index, model, what in times[-3:]:
        print(f"  {seconds:.2f} s  case {index} ({model}, {what[:100]})")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
