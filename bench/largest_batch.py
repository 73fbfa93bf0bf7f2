"""The largest batch whose training step plans under each cap, in f32 and in a half precision (issue 37):
how much more a cap holds when activations are half.

Usage: python bench/largest_batch.py [--models resnet inception_v4 bert gpt] [--ratios 2,4,8,12]
                                     [--device h100-80gb] [--precision bf16] [--method belady]

The caps are each model's f32 no-swap arena at its written batch divided by each ratio (the f32 zoo's
caps). For each cap and precision, a binary search over the batch finds the largest whose smallest
feasible cap (what never moves, the most one op touches, and the kernels' scratch) fits; that batch is
then planned with `--method` to show it plans, and its fraction of the ideal step is printed.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from swapdsl.api import load, load_device
from swapdsl.common.errors import SwpError
from swapdsl.common.units import format_bytes
from swapdsl.plan.validate import validate
from swapdsl.planning.bench import model_path
from swapdsl.planning.compiled import no_swap_bytes
from swapdsl.planning.optimize import optimize
from swapdsl.planning.problem import Problem, Request
from swapdsl.planning.sizing import smallest_cap


LIMIT = 1 << 16  # the largest batch tried


def least_cap(name: str, batch: int, precision: str, device) -> tuple[int, int]:  # noqa: ANN001
    """(the smallest feasible cap, the no-swap arena) of ``name``'s step at ``batch``."""
    m = load(model_path(name), precision=precision, batch=batch)
    p = Problem.build(m.training, device)
    no_swap = no_swap_bytes(p)
    return smallest_cap(p, no_swap) + p.scratch, no_swap


def largest_batch(name: str, cap: int, precision: str, device, start: int) -> int:  # noqa: ANN001
    """The largest batch (0: none) whose smallest feasible cap is at most ``cap``: doubling from ``start``,
    then bisecting."""
    fits = {}

    def ok(b: int) -> bool:
        if b not in fits:
            try:
                fits[b] = least_cap(name, b, precision, device)[0] <= cap
            except SwpError:  # (a batch the model refuses)
                fits[b] = False
        return fits[b]

    lo, hi = 0, max(1, start)
    while hi <= LIMIT and ok(hi):
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    return lo


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", nargs="+", default=["resnet", "inception_v4", "bert", "gpt"])
    ap.add_argument("--ratios", default="2,4,8,12")
    ap.add_argument("--device", default="h100-80gb")
    ap.add_argument("--precision", default="bf16")
    ap.add_argument("--method", default="belady")
    args = ap.parse_args()
    device = load_device(args.device)
    precisions = ["f32", args.precision]
    print(f"| model | written batch | ratio | cap | {' | '.join(f'largest batch {p} ({args.method} fraction)' for p in precisions)} |")
    print("| --- | ---: | ---: | ---: |" + " ---: |" * len(precisions))
    for name in args.models:
        written = dict(load(model_path(name)).graph.args)["batch"]
        _, no_swap = least_cap(name, written, "f32", device)
        for ratio in map(float, args.ratios.split(",")):
            cap = int(no_swap / ratio)
            cells = []
            for precision in precisions:
                batch = largest_batch(name, cap, precision, device, written)
                cells.append(_planned(name, batch, cap, precision, device, args.method) if batch else "none")
            print(f"| {Path(name).stem} | {written} | {ratio:g} | {format_bytes(cap)} | {' | '.join(cells)} |",
                  flush=True)


def _planned(name: str, batch: int, cap: int, precision: str, device, method: str) -> str:  # noqa: ANN001
    m = load(model_path(name), precision=precision, batch=batch)
    try:
        plan = optimize(Request(m.training, device, cap, m.path, m.graph.args), method)
        validate(plan)
    except SwpError as err:
        return f"{batch} (refused: {err.message})"
    return f"{batch} ({dict(plan.figures)['fraction']:.3f})"


if __name__ == "__main__":
    main()
