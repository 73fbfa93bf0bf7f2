"""Data-parallel plans in simulation (issue 40): step time, the all-reduce's share and the scaling
efficiency over 1, 2, 4 and 8 ranks at several network speeds, per model and cap.

Usage: python bench/dataparallel.py [--models gpt2_xl llama2_7b] [--memory 16GiB 24GiB] [--ranks 1 2 4 8]
                                    [--links 25 100 400] [--device h100-80gb] [--method belady] [--json FILE]

Each rank runs the model's batch (weak scaling: the global batch grows with the ranks), in bf16 with
Adam. The efficiency is the one-rank step over the N-rank step (examples per second per GPU, against
one GPU alone). The all-reduce runs on the compute stream (this first part does not overlap it with
compute), so its time adds to the step in full.
"""

from __future__ import annotations

import argparse
import json

from swapdsl import api
from swapdsl.common.errors import SwpError
from swapdsl.common.paths import STDLIB_DIR
from swapdsl.common.units import format_bytes, parse_size

MODELS = {  # name: (stdlib model, arguments)
    "gpt2_xl": ("gpt", {"layers": 48, "hidden": 1600, "heads": 25, "seq": 1024, "batch": 8}),
    "gpt2_large": ("gpt", {"layers": 36, "hidden": 1280, "heads": 20, "seq": 1024, "batch": 8}),
    "llama2_7b": ("llama", {"batch": 1}),
}


def row(name: str, cap: int, ranks: int, link: float, args: argparse.Namespace) -> dict:
    model_name, defines = MODELS[name]
    m = api.load(STDLIB_DIR / "models" / f"{model_name}.swp", precision="bf16", ranks=ranks, link_gbps=link,
                 **defines)
    try:
        plan = api.optimize(m, cap, args.method, args.device)
    except SwpError as err:
        return {"model": name, "cap": cap, "ranks": ranks, "link_gbps": link, "error": err.message}
    f = dict(plan.figures)
    reduce_ms = sum(op.ms for op in plan.ops if op.op == "allreduce_mean")
    return {"model": name, "cap": cap, "ranks": ranks, "link_gbps": link, "step_ms": f["iteration_ms"],
            "ideal_ms": f["ideal_ms"], "allreduce_ms": reduce_ms, "h2d_gb": f["h2d_bytes"] / 1e9}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=["gpt2_xl", "llama2_7b"], choices=sorted(MODELS))
    ap.add_argument("--memory", nargs="+", default=["16GiB", "24GiB"])
    ap.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 4, 8])
    ap.add_argument("--links", type=float, nargs="+", default=[25.0, 100.0, 400.0])
    ap.add_argument("--device", default="h100-80gb")
    ap.add_argument("--method", default="belady")
    ap.add_argument("--json", metavar="FILE")
    args = ap.parse_args()
    rows = []
    print("| model | cap | ranks | link Gb/s | step ms | all-reduce ms | efficiency | GB in per step |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for name in args.models:
        for memory in args.memory:
            cap = parse_size(memory)
            alone = row(name, cap, 1, args.links[0], args)
            for ranks in args.ranks:
                for link in (args.links if ranks > 1 else args.links[:1]):
                    r = alone if ranks == 1 else row(name, cap, ranks, link, args)
                    rows.append(r)
                    if "error" in r:
                        print(f"| {name} | {format_bytes(cap)} | {ranks} | {link:g} | {r['error']} | | | |")
                        continue
                    eff = alone.get("step_ms", float("nan")) / r["step_ms"]
                    print(f"| {name} | {format_bytes(cap)} | {ranks} | {link:g} | {r['step_ms']:.1f} | "
                          f"{r['allreduce_ms']:.1f} | {eff:.3f} | {r['h2d_gb']:.1f} |", flush=True)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
