"""Executing plans on the device: step time, the host's share, what the process holds against the cap.

Usage: python bench/gpu_exec.py [--configs resnet50_b64 gpt2_small] [--ratios 2 4] [--steps 4]
                                [--graphs on off] [--no-check] [--backend cupy] [--method belady]
                                [--budget 20] [--json FILE]

For each configuration and ratio, plans the model under cap = its no-swap memory (tensors and scratch) /
ratio (ratio 1: no swaps), then runs the plan with `exec --check` (``--no-check``: without the reference
beside it, which sets the time of a large model's run) with the CUDA graph on and off, and prints one table
row per run: the median step after the warm-up (the first step, and the one that captures the CUDA graph;
give at least 4 steps with the graph on), the host's time to issue a step, the device bytes the
process holds (CuPy's memory pool) against the cap, the largest difference from the reference executor,
and the simulated step. `resnet152_b8` is the plan of the README's first GPU run (ga under 512 MiB);
the `tiny_*` configurations run on NumPy in seconds, to try the script on a CPU.
"""

from __future__ import annotations

import argparse
import json
import time

from swapdsl import api
from swapdsl.cli import parse_defines
from swapdsl.common.paths import STDLIB_DIR
from swapdsl.common.units import format_bytes

CONFIGS: dict[str, tuple[str, list[str], int | None]] = {  # name: (model, arguments, a fixed cap or None)
    "resnet50_b64": ("resnet", ["depth=50", "batch=64"], None),
    "gpt2_small": ("gpt", ["layers=12", "hidden=768", "heads=12", "seq=1024", "batch=8"], None),
    "resnet152_b8": ("resnet", ["depth=152", "batch=8"], 512 * 2**20),
    "tiny_resnet": ("tiny_resnet", ["batch=8"], None),
    "tiny_transformer": ("tiny_transformer", ["batch=4", "seq=32"], None),
}


def run_config(name: str, ratio: float, args: argparse.Namespace) -> list[dict]:
    model_name, defines, fixed = CONFIGS[name]
    model = api.load(STDLIB_DIR / "models" / f"{model_name}.swp", parse_defines(defines), args.precision)
    no_swap = int(api.optimize(model, 1 << 50, "lru").figure("no_swap_bytes"))
    cap = fixed or int(no_swap / ratio)
    t0 = time.perf_counter()
    plan = api.optimize(model, cap, args.method, budget_s=args.budget, seed=0)
    planned_s = time.perf_counter() - t0
    rows = []
    for graph in (g == "on" for g in args.graphs):
        if args.backend == "cupy":  # what the last run's arena left in CuPy's pool is not this run's
            import cupy
            cupy.get_default_memory_pool().free_all_blocks()
        run = api.execute_plan(plan, model.training, args.steps, 0, args.backend, check=args.check, graph=graph)
        f = run.figures
        rows.append({
            "config": name, "ratio": round(no_swap / cap, 2), "cap_bytes": cap, "method": args.method,
            "precision": args.precision,
            "graph": "on" if graph else "off", "graph_note": f["graph"],
            "step_ms": run.steady_ms(), "host_ms": run.steady_ms(f["host_ms_per_step"]),
            "steady_steps": max(0, run.steps - run.warmup_steps),
            "device_bytes_allocated": f["device_bytes_allocated"], "scratch_bytes": f["scratch_bytes"],
            "blas_workspace_bytes": f["blas_workspace_bytes"],
            "max_rel_diff": run.max_rel_diff if args.check else float("nan"),
            "max_rel_diff_at": run.max_rel_diff_at if args.check else None,
            "simulated_ms": f["simulated_ms"], "plan_s": planned_s,
        })
    return rows


def row_line(r: dict) -> str:
    warm = "" if r["steady_steps"] else " (warm-up)"  # too few steps: the times include one-off work
    return (f"| {r['config']} | {r['ratio']:.2f} | {format_bytes(r['cap_bytes'])} | {r['graph']} | "
            f"{r['step_ms']:.1f}{warm} | {r['host_ms']:.1f}{warm} | {format_bytes(r['device_bytes_allocated'])} | "
            f"{format_bytes(r['device_bytes_allocated'] - r['cap_bytes'])} | {r['max_rel_diff']:.1e} | "
            f"{r['simulated_ms']:.1f} |")


def table(rows: list[dict]) -> str:
    lines = ["| config | ratio | cap | graph | step ms | host ms | device held | held - cap | max rel diff | "
             "simulated ms |", "|---|---:|---:|---|---:|---:|---:|---:|---:|---:|"]
    lines += [row_line(r) for r in rows]
    notes = sorted({f"- {r['config']} graph {r['graph']}: {r['graph_note']}" for r in rows})
    notes += sorted({f"- held - cap includes cuBLAS's workspace beside the arena, {format_bytes(w)}"
                     for r in rows if (w := r.get("blas_workspace_bytes", 0))})
    return "\n".join(lines + [""] + notes)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--configs", nargs="+", default=["resnet50_b64", "gpt2_small"], choices=sorted(CONFIGS))
    ap.add_argument("--ratios", type=float, nargs="+", default=[2.0, 4.0])
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--graphs", nargs="+", default=["on", "off"], choices=["on", "off"])
    ap.add_argument("--no-check", dest="check", action="store_false", help="no reference beside the run")
    ap.add_argument("--backend", default="cupy")
    ap.add_argument("--method", default="belady")
    ap.add_argument("--precision", default="f32", choices=["f32", "f16", "bf16"],
                    help="the plans' precision (bf16 on CuPy as its bits: graph/ops/halfbits.py)")
    ap.add_argument("--budget", type=float, default=20.0, help="search seconds per plan (--method ga)")
    ap.add_argument("--json", metavar="FILE", help="also write the rows as JSON")
    args = ap.parse_args()
    rows = []
    for name in args.configs:
        for ratio in ([1.0] if CONFIGS[name][2] else args.ratios):
            new = run_config(name, ratio, args)
            print("\n".join(row_line(r) for r in new), flush=True)
            rows += new
    print(table(rows))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
