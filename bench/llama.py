"""Llama-2-7B fine-tuning on one GPU that is too small (issue 39): bf16, batch 1, sequence 2048, AdamW,
under 24 GiB and 48 GiB on `h100-80gb`, per method, with the updates on the device or on the host.

Usage: python bench/llama.py [--caps 24GiB,48GiB] [--methods belady,capuchin,ga] [--host-updates none,all]
                             [--budget 120] [--precision bf16] [--device h100-80gb] [--lora RANK] [--json]

Runs `swapdsl optimize` as a user would, once per (cap, method, host-updates), and prints one row per
run: the simulated step, the ideal (infinite memory) step, their fraction, bytes over the bus each way
and the host memory the plan keeps; a cap a method cannot plan prints its refusal.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from swapdsl.common.paths import STDLIB_DIR

GIB = 2**30


def plan(cap: str, method: str, host: str, args: argparse.Namespace, folder: Path) -> dict:
    cmd = [sys.executable, "-m", "swapdsl", "optimize", str(Path(STDLIB_DIR) / "models" / "llama.swp"),
           "--memory", cap, "--device", args.device, "--precision", args.precision, "--method", method,
           "--host-updates", host, "-D", f"lora={args.lora}", "--json",
           "-o", str(folder / f"{method}-{host}-{cap}.plan")]
    if method == "ga":
        cmd += ["--budget", str(args.budget), "--workers", "1", "--seed", "1"]
    run = subprocess.run(cmd, capture_output=True, text=True)
    if run.returncode != 0:
        return {"cap": cap, "method": method, "host_updates": host,
                "error": (run.stderr.splitlines() or ["?"])[0]}
    return {"cap": cap, "method": method, "host_updates": host, **json.loads(run.stdout)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--caps", default="24GiB,48GiB")
    ap.add_argument("--methods", default="belady,capuchin,ga")
    ap.add_argument("--host-updates", default="none,all")
    ap.add_argument("--budget", type=float, default=120.0)
    ap.add_argument("--precision", default="bf16")
    ap.add_argument("--device", default="h100-80gb")
    ap.add_argument("--lora", type=int, default=0, help="LoRA rank (0: full fine-tuning)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for cap in args.caps.split(","):
            for host in args.host_updates.split(","):
                for method in args.methods.split(","):
                    r = plan(cap, method, host, args, Path(tmp))
                    rows.append(r)
                    if "error" in r:
                        print(f"{cap:>6} {method:<9} host {host:<4}  {r['error']}", flush=True)
                        continue
                    print(f"{cap:>6} {method:<9} host {host:<4}  fraction {r['fraction']:.3f}  step "
                          f"{r['iteration_ms']:9.1f} ms  ideal {r['ideal_ms']:8.1f} ms  in "
                          f"{r['h2d_bytes'] / GIB:6.1f} GiB  out {r['d2h_bytes'] / GIB:6.1f} GiB  host "
                          f"{r['host_bytes'] / GIB:6.1f} GiB  search {r['search_seconds']:.0f} s", flush=True)
    if args.json:
        print(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
