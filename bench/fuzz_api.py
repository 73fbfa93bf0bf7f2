"""Fuzz the library API (each public function called with one argument replaced by an adversary's value)
and print the count of each verdict per function; every case must be `ok` or `refused`.

    python bench/fuzz_api.py --cases 3000 --seed 1
"""

from __future__ import annotations

import argparse
import collections
import sys
import tempfile
from pathlib import Path

from swapdsl.fuzz.api_args import calls, case_of, judge, make_seeds
from swapdsl.fuzz.files import tally


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        table = calls(make_seeds(Path(tmp) / "seeds"))
        counts: dict[str, collections.Counter[str]] = {name: collections.Counter() for name in sorted(table)}
        for i in range(args.cases):
            case = case_of(args.seed, i, table)
            work = Path(tmp) / f"case{i}"
            work.mkdir()
            verdict = judge(case, table, work)
            counts[case.function][verdict.verdict] += 1
            if verdict.verdict not in ("ok", "refused"):
                print(f"case {i}: {case.function}({case.argument} = {case.value}) -> {verdict.verdict}: "
                      f"{verdict.detail}")
    return tally(counts, "function")


if __name__ == "__main__":
    sys.exit(main())
