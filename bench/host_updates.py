"""GPT-2 XL under a cap with and without updates on the host (issue 37): the largest batch that plans, and
its fraction of the ideal step, per `--host-updates` choice.

Usage: python bench/host_updates.py [--memory 16GiB] [--device h100-80gb] [--precision bf16]
                                    [--method belady] [--batches 1,2,4,8,16] [--host-bw BYTES_PER_S]

Runs `swapdsl optimize` as a user would, once per (batch, choice), on GPT-2 XL (48 layers, 1600 wide,
25 heads, seq 1024, Adam), and prints one row per run: step, ideal, fraction, bytes over the bus, host
memory, and, for `auto`, how many parameters' updates it put on the host. `--host-bw` plans with a
device profile whose host lane sustains that many bytes/s instead of the built-in assumption.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from swapdsl.common.paths import STDLIB_DIR
from swapdsl.devices.profiles import BUILTIN

XL = ["-D", "layers=48", "-D", "hidden=1600", "-D", "heads=25", "-D", "seq=1024"]


def plan(batch: int, choice: str, args: argparse.Namespace, device: str, folder: Path) -> dict | None:
    out = folder / f"b{batch}-{choice}.plan"
    cmd = [sys.executable, "-m", "swapdsl", "optimize", str(Path(STDLIB_DIR) / "models" / "gpt.swp"), *XL,
           "-D", f"batch={batch}", "--memory", args.memory, "--device", device, "--precision", args.precision,
           "--method", args.method, "--host-updates", choice, "--json", "-o", str(out)]
    if args.method == "ga":
        cmd += ["--budget", str(args.budget), "--workers", "1"]
    run = subprocess.run(cmd, capture_output=True, text=True)
    if run.returncode != 0:
        return {"error": (run.stderr.splitlines() or ["?"])[0]}
    info = json.loads(run.stdout)
    info["host_ops"] = sum(line.startswith("host ") for line in out.read_text().splitlines())
    return info


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--memory", default="16GiB")
    ap.add_argument("--device", default="h100-80gb")
    ap.add_argument("--precision", default="bf16")
    ap.add_argument("--method", default="belady")
    ap.add_argument("--budget", type=float, default=60.0)
    ap.add_argument("--batches", default="1,2,4,8,16")
    ap.add_argument("--choices", default="none,all,auto")
    ap.add_argument("--host-bw", type=float)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        device = args.device
        if args.host_bw:
            profile = dict(BUILTIN[args.device].to_json(), name=f"{args.device}-host", host_bw=args.host_bw)
            (folder / "device.json").write_text(json.dumps(profile))
            device = str(folder / "device.json")
        print("| batch | host updates | step ms | ideal ms | fraction | h2d GB | d2h GB | host GB | host ops |")
        print("| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
        for batch in map(int, args.batches.split(",")):
            for choice in args.choices.split(","):
                f = plan(batch, choice, args, device, folder)
                if "error" in f:
                    print(f"| {batch} | {choice} | {f['error']} |||||||", flush=True)
                    continue
                print(f"| {batch} | {choice} | {f['iteration_ms']:.1f} | {f['ideal_ms']:.1f} | "
                      f"{f['ideal_ms'] / f['iteration_ms']:.3f} | {f['h2d_bytes'] / 1e9:.1f} | "
                      f"{f['d2h_bytes'] / 1e9:.1f} | {f['host_bytes'] / 1e9:.1f} | {f['host_ops']} |", flush=True)


if __name__ == "__main__":
    main()
