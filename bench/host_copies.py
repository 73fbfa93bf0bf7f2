"""Gradients updated on the device, averaged over their host copies (issue 40, ``Request.reduce_all``): the
smallest feasible cap and the step, against the device's all-reduce, in simulation.

Usage: python bench/host_copies.py [--models gpt2_small gpt2_xl] [--memory 2GiB 8GiB] [--ranks 8]
                                   [--link 100] [--method belady] [--device h100-80gb]

Each model in bf16 with Adam, every update on the device, 25 MiB buckets; "host copies" averages every
gradient on the host lane and brings its mean back up for the update (``offload.host_split``'s ``every``).
"""

from __future__ import annotations

import argparse

from swapdsl import api
from swapdsl.common.errors import SwpError
from swapdsl.common.paths import STDLIB_DIR
from swapdsl.common.units import format_bytes, parse_size
from swapdsl.planning.optimize import optimize
from swapdsl.planning.problem import Problem, Request
from swapdsl.planning.sizing import least_cap

MODELS = {  # name: (stdlib model, arguments)
    "gpt2_small": ("gpt", {"layers": 12, "hidden": 768, "heads": 12, "seq": 1024, "batch": 8}),
    "gpt2_xl": ("gpt", {"layers": 48, "hidden": 1600, "heads": 25, "seq": 1024, "batch": 8}),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=["gpt2_small", "gpt2_xl"], choices=sorted(MODELS))
    ap.add_argument("--memory", nargs="+", default=["2GiB", "8GiB"])
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--link", type=float, default=100.0)
    ap.add_argument("--method", default="belady")
    ap.add_argument("--device", default="h100-80gb")
    args = ap.parse_args()
    print("| model | cap | device: smallest cap | step ms | host copies: smallest cap | step ms |")
    print("|---|---:|---:|---:|---:|---:|")
    for name in args.models:
        model, defines = MODELS[name]
        m = api.load(STDLIB_DIR / "models" / f"{model}.swp", precision="bf16", ranks=args.ranks,
                     link_gbps=args.link, **defines)
        for memory in args.memory:
            cells = []
            for every in (False, True):
                req = Request(m.training, api.load_device(args.device), parse_size(memory), m.path, m.graph.args,
                              reduce_all=every)
                try:
                    ms = f"{dict(optimize(req, args.method).figures)['iteration_ms']:.1f}"
                except SwpError:
                    ms = "below its smallest cap"
                cells += [format_bytes(least_cap(Problem.of(req))), ms]
            print(f"| {name} | {memory} | {' | '.join(cells)} |", flush=True)


if __name__ == "__main__":
    main()
