"""Baseline planners across the zoo: every (model, ratio, method) on one device.

Usage: python bench/baselines.py [--models ...] [--ratios 2,4,8] [--methods lru,vdnn,belady]
                                 [--device v100-16gb] [--markdown]

The cap for ratio r is the memory the default schedule needs with no
swapping (the planner's no-swap pool) divided by r. Each plan is checked by
the validator before its figures count.
"""

from __future__ import annotations

import argparse
import time

from swapdsl.autodiff import training_graph
from swapdsl.cli import build_graph
from swapdsl.devices import load_device
from swapdsl.errors import SwpError
from swapdsl.paths import STDLIB_DIR
from swapdsl.planners import METHODS, Request, optimize
from swapdsl.pool import class_sizes, no_swap_counts
from swapdsl.problem import Problem
from swapdsl.validate import validate

ZOO = ["resnet", "wide_resnet", "vgg", "inception_v4", "nasnet", "lstm_lm", "bert", "gpt"]


def rows(model: str, ratios: list[float], methods: list[str], device_name: str) -> list[dict]:
    _, g = build_graph(str(STDLIB_DIR / "models" / f"{model}.swp"), [])
    t = training_graph(g)
    device = load_device(device_name)
    p = Problem.build(t, device)
    no_swap = sum(s * n for s, n in zip(class_sizes(p), no_swap_counts(p, list(range(p.n_ops)))))
    out = []
    for ratio in ratios:
        cap = int(no_swap / ratio)
        for method in methods:
            started = time.perf_counter()
            try:
                plan = optimize(Request(t, device, cap, model, g.args), method)
                validate(plan)
            except SwpError as exc:
                out.append({"model": model, "ratio": ratio, "method": method, "error": exc.message})
                continue
            f = dict(plan.figures)
            out.append({"model": model, "ratio": ratio, "method": method, "cap_gib": cap / 2**30,
                        "fraction": f["fraction"], "iteration_ms": f["iteration_ms"],
                        "bound_fraction": f["ideal_ms"] / f["bound_ms"], "swap_gb": f["swap_bytes"] / 1e9,
                        "seconds": time.perf_counter() - started})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=ZOO)
    ap.add_argument("--ratios", default="2,4,8")
    ap.add_argument("--methods", default="lru,vdnn,belady")
    ap.add_argument("--device", default="v100-16gb")
    ap.add_argument("--markdown", action="store_true")
    args = ap.parse_args()
    ratios = [float(r) for r in args.ratios.split(",")]
    methods = [m for m in args.methods.split(",") if m in METHODS]
    table = [r for m in args.models for r in rows(m, ratios, methods, args.device)]
    if args.markdown:
        print("| model | ratio | cap | " + " | ".join(f"{m}: fraction (swap GB)" for m in methods)
              + " | ideal / bound |")
        print("| --- | ---: | ---: | " + " | ".join("---:" for _ in methods) + " | ---: |")
    for model in args.models:
        for ratio in ratios:
            cells = [r for r in table if r["model"] == model and r["ratio"] == ratio]
            ok = [r for r in cells if "error" not in r]
            if args.markdown:
                cap = f"{ok[0]['cap_gib']:.2f} GiB" if ok else "-"
                vals = [f"{r['fraction']:.3f} ({r['swap_gb']:.0f})" if "error" not in r else "infeasible"
                        for r in cells]
                bound = f"{ok[0]['bound_fraction']:.3f}" if ok else "-"
                print(f"| `{model}` | {ratio:g} | {cap} | " + " | ".join(vals) + f" | {bound} |")
                continue
            for r in cells:
                if "error" in r:
                    print(f"{model:<13} {ratio:>4g} {r['method']:<7} {r['error']}")
                else:
                    print(f"{model:<13} {ratio:>4g} {r['method']:<7} cap {r['cap_gib']:6.2f} GiB  fraction "
                          f"{r['fraction']:.3f}  ideal/bound {r['bound_fraction']:.3f}  iteration "
                          f"{r['iteration_ms']:9.1f} ms  swap {r['swap_gb']:7.1f} GB  {r['seconds']:.1f} s")


if __name__ == "__main__":
    main()
