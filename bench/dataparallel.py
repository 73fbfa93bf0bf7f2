"""Data-parallel plans in simulation (issue 40): step time, the all-reduce's share and the scaling
efficiency over 1, 2, 4 and 8 ranks at several network speeds, per model and cap.

Usage: python bench/dataparallel.py [--models gpt2_xl llama2_7b] [--memory 16GiB 24GiB] [--ranks 1 2 4 8]
                                    [--links 25 100 400] [--bucket-mib 25|auto] [--no-after] [--device h100-80gb]
                                    [--method belady] [--host-updates none|all] [--json FILE]

Each rank runs the model's batch (weak scaling: the global batch grows with the ranks), in bf16 with
Adam. The efficiency is the one-rank step over the N-rank step (examples per second per GPU, against
one GPU alone). The all-reduces run on the network lane beside the compute stream; "hidden" is the
share of their time that does not lengthen the step: 1 - (N-rank step - one-rank step) / all-reduce time. Each row is planned twice: in the
order the data-parallel pass gives (each update after the next all-reduce is issued) and, for
comparison, with every all-reduce after the backward pass and every update after them (DDP without
overlap; ``--no-after`` leaves it out). Gradients are averaged in buckets of ``--bucket-mib`` MiB (0: one
all-reduce each; auto: the size ``optimize --bucket-mib auto`` would choose, per row). With
``--host-updates all`` every update runs on the host (ZeRO-Offload's split) and the comparison is another:
each gradient all-reduced on the device (network lane) against its host copy all-reduced over MPI on the
host lane (``offload.host_split``'s ``reduce``). The JSON also holds each plan's bound (``bound_ms``).
"""

from __future__ import annotations

import argparse
import json

from swapdsl import api
from swapdsl.common.errors import SwpError
from swapdsl.common.paths import STDLIB_DIR
from swapdsl.common.units import format_bytes, parse_size
from swapdsl.graph.checker import check_graph
from swapdsl.graph.dataparallel import DEFAULT_BUCKET_MIB, data_parallel
from swapdsl.graph.offload import offloadable
from swapdsl.plan.simulate import simulate
from swapdsl.planning.optimize import best_buckets, optimize
from swapdsl.planning.problem import Request

MODELS = {  # name: (stdlib model, arguments)
    "gpt2_xl": ("gpt", {"layers": 48, "hidden": 1600, "heads": 25, "seq": 1024, "batch": 8}),
    "gpt2_large": ("gpt", {"layers": 36, "hidden": 1280, "heads": 20, "seq": 1024, "batch": 8}),
    "llama2_7b": ("llama", {"batch": 1}),
}


def row(name: str, cap: int, ranks: int, link: float, overlap: bool, args: argparse.Namespace,
        host_reduce: bool = False) -> dict:
    model_name, defines = MODELS[name]
    m = api.load(STDLIB_DIR / "models" / f"{model_name}.swp", precision="bf16", **defines)
    device = api.load_device(args.device)

    def request(mib: float) -> Request:
        t = data_parallel(m.training, ranks, link, overlap, mib)
        check_graph(t)
        host = offloadable(t) if args.host_updates == "all" else ()
        return Request(t, device, cap, m.path, m.graph.args, host_updates=host, host_reduce=host_reduce)

    key = {"model": name, "cap": cap, "ranks": ranks, "link_gbps": link, "overlap": overlap,
           "host_updates": args.host_updates, "host_reduce": host_reduce}
    try:
        req = best_buckets(request, args.method) if args.bucket_mib == "auto" else request(args.bucket_mib)
        plan = optimize(req, args.method)
    except SwpError as err:
        return key | {"bucket_mib": args.bucket_mib, "error": err.message}
    key["bucket_mib"] = req.graph.bucket_mib
    sim = simulate(plan)
    reduce_ms = sum(op.ms if op.host_ms is None else op.host_ms for op in plan.ops if op.op == "allreduce_mean")
    return key | {"step_ms": sim.iteration_ms, "bound_ms": dict(plan.figures)["bound_ms"], "ideal_ms": sim.compute_ms,
                  "allreduce_ms": reduce_ms,
                  "allreduces": sum(op.op == "allreduce_mean" for op in plan.ops),
                  "h2d_gb": sim.h2d_bytes / 1e9}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=["gpt2_xl", "llama2_7b"], choices=sorted(MODELS))
    ap.add_argument("--memory", nargs="+", default=["16GiB", "24GiB"])
    ap.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 4, 8])
    ap.add_argument("--links", type=float, nargs="+", default=[25.0, 100.0, 400.0])
    ap.add_argument("--bucket-mib", type=lambda v: v if v == "auto" else float(v), default=DEFAULT_BUCKET_MIB,
                    help="MiB, or auto: the size among optimize.BUCKET_CHOICES whose plan is fastest")
    ap.add_argument("--no-after", action="store_true", help="skip the after-backward plans (DDP without overlap)")
    ap.add_argument("--device", default="h100-80gb")
    ap.add_argument("--method", default="belady")
    ap.add_argument("--host-updates", choices=["none", "all"], default="none",
                    help="all: every update on the host, compared with its gradients averaged on the host lane")
    ap.add_argument("--json", metavar="FILE")
    args = ap.parse_args()
    rows = []
    other = "host-copy all-reduce" if args.host_updates == "all" else "after backward"
    print("| model | cap | ranks | link Gb/s | bucket MiB | all-reduces | all-reduce ms | step ms | efficiency | hidden | "
          f"GB in | {other}: step ms | efficiency | hidden | GB in |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name in args.models:
        for memory in args.memory:
            cap = parse_size(memory)
            alone = row(name, cap, 1, args.links[0], True, args)
            for ranks in args.ranks:
                for link in (args.links if ranks > 1 else args.links[:1]):
                    pair = [alone] if ranks == 1 else [row(name, cap, ranks, link, True, args)]
                    if ranks > 1 and args.host_updates == "all":
                        pair.append(row(name, cap, ranks, link, True, args, host_reduce=True))
                    elif ranks > 1 and not args.no_after:
                        pair.append(row(name, cap, ranks, link, False, args))
                    rows += pair
                    cells = []
                    for r in pair:
                        if "error" in r:
                            cells.append(f"{r['error']} | | | ")
                            continue
                        one = alone.get("step_ms", float("nan"))
                        hid = 1 - (r["step_ms"] - one) / r["allreduce_ms"] if r["allreduce_ms"] else float("nan")
                        cells.append(f"{r['step_ms']:.1f} | {one / r['step_ms']:.3f} | {hid:.2f} | {r['h2d_gb']:.1f}")
                    cells += ["- | - | - | -"] * (2 - len(cells))
                    reduce_ms = pair[0].get("allreduce_ms", float("nan"))
                    print(f"| {name} | {format_bytes(cap)} | {ranks} | {link:g} | {pair[0].get('bucket_mib', 0)} | "
                          f"{pair[0].get('allreduces', 0)} | "
                          f"{reduce_ms:.1f} | "
                          f"{cells[0]} | {cells[1]} |", flush=True)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
