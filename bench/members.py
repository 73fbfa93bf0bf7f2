"""Who shares an all-reduce bucket (issue 40): the step in DDP's 25 MiB buckets, at the best of
``optimize.BUCKET_CHOICES``' sizes, and with the members ``--bucket-mib auto`` searches from that size
(``planning/members.py``), in simulation.

Usage: python bench/members.py [--models gpt2_small gpt2_xl] [--memory 2GiB 16GiB] [--ranks 8]
                               [--links 25 100 400] [--method belady] [--device h100-80gb] [--json FILE]

Each model in bf16 with Adam, each rank on the model's batch. "Sizes" is the fastest plan of the five
sizes; "members" is ``api.optimize(..., bucket_mib="auto")``'s plan, which searches members from that
size and keeps them only where they plan faster; its seconds are the whole ``auto`` (sizes and members).
"""

from __future__ import annotations

import argparse
import json
import time

from swapdsl import api
from swapdsl.common.errors import SwpError
from swapdsl.common.paths import STDLIB_DIR
from swapdsl.common.units import format_bytes, parse_size
from swapdsl.graph.dataparallel import DEFAULT_BUCKET_MIB
from swapdsl.planning.optimize import BUCKET_CHOICES

MODELS = {  # name: (stdlib model, arguments)
    "gpt2_small": ("gpt", {"layers": 12, "hidden": 768, "heads": 12, "seq": 1024, "batch": 8}),
    "gpt2_xl": ("gpt", {"layers": 48, "hidden": 1600, "heads": 25, "seq": 1024, "batch": 8}),
    "llama2_7b": ("llama", {"batch": 1}),
}


def _ms(plan: object) -> float:
    return dict(plan.figures)["iteration_ms"]  # type: ignore[attr-defined]


def row(name: str, memory: str, ranks: int, link: float, args: argparse.Namespace) -> dict:
    model, defines = MODELS[name]
    m = api.load(STDLIB_DIR / "models" / f"{model}.swp", precision="bf16", ranks=ranks, link_gbps=link, **defines)
    key = {"model": name, "cap": parse_size(memory), "ranks": ranks, "link_gbps": link, "method": args.method}
    sizes = {}
    for mib in BUCKET_CHOICES:
        try:
            sizes[mib] = _ms(api.optimize(m, memory, args.method, args.device, bucket_mib=mib))
        except SwpError:
            continue
    if not sizes:
        return key | {"error": "no size fits"}
    started = time.perf_counter()
    plan = api.optimize(m, memory, args.method, args.device, bucket_mib="auto")
    best = min(sizes, key=lambda mib: (sizes[mib], mib != DEFAULT_BUCKET_MIB, mib))
    return key | {"ddp_ms": sizes.get(DEFAULT_BUCKET_MIB), "size_mib": best, "size_ms": sizes[best],
                  "members_ms": _ms(plan), "members_searched": bool(plan.bucket_members),
                  "buckets": max(plan.bucket_members) + 1 if plan.bucket_members else None,
                  "auto_s": time.perf_counter() - started}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=["gpt2_small", "gpt2_xl"], choices=sorted(MODELS))
    ap.add_argument("--memory", nargs="+", default=["2GiB", "16GiB"])
    ap.add_argument("--ranks", type=int, nargs="+", default=[8])
    ap.add_argument("--links", type=float, nargs="+", default=[25.0, 100.0, 400.0])
    ap.add_argument("--method", default="belady")
    ap.add_argument("--device", default="h100-80gb")
    ap.add_argument("--json", metavar="FILE")
    args = ap.parse_args()
    rows = []
    print("| model | cap | ranks | link Gb/s | 25 MiB: step ms | best size MiB | step ms | members: step ms | "
          "buckets | gain | auto s |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name in args.models:
        for memory in args.memory:
            for ranks in args.ranks:
                for link in args.links:
                    r = row(name, memory, ranks, link, args)
                    rows.append(r)
                    if "error" in r:
                        print(f"| {name} | {memory} | {ranks} | {link:g} | {r['error']} |", flush=True)
                        continue
                    ddp = f"{r['ddp_ms']:.1f}" if r["ddp_ms"] is not None else "-"
                    searched = f"{r['buckets']}" if r["members_searched"] else "(size's)"
                    print(f"| {name} | {format_bytes(r['cap'])} | {ranks} | {link:g} | {ddp} | {r['size_mib']:g} | "
                          f"{r['size_ms']:.1f} | {r['members_ms']:.1f} | {searched} | "
                          f"{1 - r['members_ms'] / r['size_ms']:+.1%} | {r['auto_s']:.0f} |", flush=True)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
