"""Fuzz the files a training run reads (data folders, .npz archives, checkpoints, logs, device profiles) and
print the count of each verdict per surface; every case must be `ok` or `refused`.

    python bench/fuzz_files.py --cases 5000 --seed 1
"""

from __future__ import annotations

import argparse
import collections
import sys
import tempfile
from pathlib import Path

from swapdsl.common.paths import STDLIB_DIR
from swapdsl.fuzz.files import SURFACES, case_of, judge, make_seeds, tally


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    model = STDLIB_DIR / "models" / "mlp.swp"
    counts: dict[str, collections.Counter[str]] = {s: collections.Counter() for s in SURFACES}
    with tempfile.TemporaryDirectory() as tmp:
        seeds = make_seeds(Path(tmp) / "seeds", model)
        for i in range(args.cases):
            work = Path(tmp) / f"case{i}"
            work.mkdir()
            case, argv = case_of(args.seed, i, seeds, model, work)
            verdict = judge(argv)
            counts[case.surface][verdict.verdict] += 1
            if verdict.verdict not in ("ok", "refused"):
                print(f"case {i}: {case.surface} {case.kind} {case.what} -> {verdict.verdict}: {verdict.detail}")
    return tally(counts, "surface")


if __name__ == "__main__":
    sys.exit(main())
