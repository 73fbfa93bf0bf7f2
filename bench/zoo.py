"""The model zoo table: each default configuration's size, and how long `check --training` takes.

Usage: python bench/zoo.py [--models resnet gpt ...] [--markdown]

Runs `swapdsl check FILE --training --json` as a user would (a fresh process
per model) and reports its wall time with the figures it prints.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from swapdsl.common.paths import STDLIB_DIR

ZOO = ["resnet", "wide_resnet", "vgg", "inception_v4", "nasnet", "lstm_lm", "bert", "gpt", "llama"]


def row(name: str) -> dict:
    path = Path(STDLIB_DIR) / "models" / f"{name}.swp"
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "swapdsl", "check", str(path), "--training", "--json"],
                         check=True, capture_output=True, text=True).stdout
    seconds = time.perf_counter() - t0
    info = json.loads(out)
    config = ", ".join(f"{k}={v}" for k, v in info["args"].items() if k not in ("lr", "dropout_p"))
    return {"model": name, "config": config, "params": info["params"], "ops": info["ops"],
            "peak_gib": info["peak_bytes"] / 2**30, "tflop": info["flops"] / 1e12, "check_s": seconds}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=ZOO)
    ap.add_argument("--markdown", action="store_true", help="print a Markdown table (as in docs/benchmarks.md)")
    args = ap.parse_args()
    rows = [row(m) for m in args.models]
    if args.markdown:
        print("| model | default configuration | parameters | training ops | peak memory, no swapping "
              "| FLOPs per step | `check --training` |")
        print("| --- | --- | ---: | ---: | ---: | ---: | ---: |")
        for r in rows:
            print(f"| `{r['model']}` | {r['config']} | {r['params']:,} | {r['ops']:,} | {r['peak_gib']:.1f} GiB "
                  f"| {r['tflop']:.2f} T | {r['check_s']:.2f} s |")
        return
    print(f"{'model':<13} {'params':>13} {'ops':>7} {'peak GiB':>9} {'TFLOP':>8} {'check s':>8}  configuration")
    for r in rows:
        print(f"{r['model']:<13} {r['params']:>13,} {r['ops']:>7,} {r['peak_gib']:>9.1f} {r['tflop']:>8.2f} "
              f"{r['check_s']:>8.2f}  {r['config']}")


if __name__ == "__main__":
    main()
