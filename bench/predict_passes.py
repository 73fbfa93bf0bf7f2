"""`predict` on data with its targets: one pass that predicts and scores (``api.predict_scored``) against the
two it replaced (``api.predict``, then ``api.evaluate``), on the same plan and data.

Usage: python bench/predict_passes.py [--copies 100] [--repeat 7]

Plans examples/digits.swp under a third of its no-swap arena (`belady`), makes a held-out set of
scikit-learn's 1,797 digits repeated ``--copies`` times (labels included), and reports the best and the
median of ``--repeat`` timings of each way, in process, from the seed's parameters; both give the same
outputs and figures (checked).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from swapdsl import api

REPO = Path(__file__).resolve().parent.parent


def timed(f: Callable[[], object], repeat: int) -> tuple[float, float]:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        f()
        times.append(time.perf_counter() - started)
    return min(times), statistics.median(times)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--copies", type=int, default=100)
    ap.add_argument("--repeat", type=int, default=7)
    args = ap.parse_args()
    from sklearn.datasets import load_digits

    digits = load_digits()
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp)
        np.save(data / "x.npy", np.tile((digits.data / 16).astype(np.float32), (args.copies, 1)))
        np.save(data / "y.npy", np.tile(digits.target.astype(np.int32), args.copies))
        plan = api.optimize(api.load(REPO / "examples" / "digits.swp"), memory="1/3", method="belady")
        one = api.predict_scored(plan, str(data))
        two = (api.predict(plan, str(data)), api.evaluate(plan, str(data)))
        assert all(np.array_equal(one[0][k], two[0][k]) for k in two[0]) and one[1] is not None
        assert two[1] is not None and (one[1].loss, one[1].metrics) == (two[1].loss, two[1].metrics)
        rows = len(digits.target) * args.copies
        a = timed(lambda: api.predict_scored(plan, str(data)), args.repeat)
        b = timed(lambda: (api.predict(plan, str(data)), api.evaluate(plan, str(data))), args.repeat)
    print(f"{rows:,} examples, digits plan under {plan.cap:,} bytes (belady), best and median of {args.repeat}:")
    print(f"  one pass (predict_scored)       {a[0]:.3f} s  {a[1]:.3f} s")
    print(f"  two passes (predict, evaluate)  {b[0]:.3f} s  {b[1]:.3f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
