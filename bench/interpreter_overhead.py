"""The interpreter's own cost per instruction: a plan run on NumPy with every kernel stubbed out.

Usage: python bench/interpreter_overhead.py [--model tiny_resnet] [-D batch=2 ...] [--ratio 2]
                                            [--method belady] [--steps 30]

Plans the model at the given memory ratio (cap = no-swap arena / ratio), then runs it with each kernel
replaced by one that does nothing (copies still move their bytes), and reports the median step over the
program's instructions and over its ops: what the interpreter and its three streams cost, which the
simulator does not model.
"""

from __future__ import annotations

import argparse
import statistics

import numpy as np

from swapdsl import api
from swapdsl.cli import parse_defines
from swapdsl.common.paths import STDLIB_DIR
from swapdsl.runtime import interpreter


class _Stub:
    @staticmethod
    def kernel(ctx: object, ins: object, out: object, attrs: object) -> None:
        return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="tiny_resnet")
    ap.add_argument("-D", dest="define", action="append", help="model arguments (default: batch=2 width=4)")
    ap.add_argument("--ratio", type=float, default=2.0)
    ap.add_argument("--method", default="belady")
    ap.add_argument("--steps", type=int, default=30)
    args = ap.parse_args()
    model = api.load(STDLIB_DIR / "models" / f"{args.model}.swp", parse_defines(args.define or ["batch=2", "width=4"]))
    no_swap = int(api.optimize(model, 1 << 40, "lru").figure("no_swap_bytes"))
    plan = api.optimize(model, int(no_swap / args.ratio), args.method, generations=5, seed=0)
    interpreter.REGISTRY = {op: _Stub for op in {o.op for o in plan.ops}}  # type: ignore[assignment]
    runner = interpreter.PlanRunner(plan, model.training, "numpy", np, 0)
    try:
        times = [runner.step(step)[1] for step in range(1, args.steps + 1)][args.steps // 3:]  # after warm-up
    finally:
        runner.close()
    ms = statistics.median(times)
    print(f"{args.model} {args.method} at ratio {args.ratio:g}: {len(plan.program)} instructions, {len(plan.ops)} ops; "
          f"median step {ms:.2f} ms with kernels stubbed: {1e3 * ms / len(plan.program):.1f} us per instruction, "
          f"{1e3 * ms / len(plan.ops):.1f} us per op")


if __name__ == "__main__":
    main()
