"""Does the simulator predict this machine? Profile, plan with the profile, execute, compare.

Usage: python bench/fidelity.py [--ratios 2 4] [--steps 5] [--backend numpy] [--method belady] [--budget 60]

For each model: `swapdsl profile` measures op times and copy bandwidths on
the backend, `optimize --device` plans with them at each ratio (of the no-swap
arena), `exec` runs the plan, and the median measured step is set against the
simulated `iteration_ms`.
"""

from __future__ import annotations

import argparse
import statistics

from swapdsl import api
from swapdsl.cli import parse_defines
from swapdsl.common.paths import STDLIB_DIR
from swapdsl.devices.profiles import BUILTIN
from swapdsl.graph.autodiff import training_graph
from swapdsl.planning.compiled import no_swap_bytes
from swapdsl.planning.ga import SearchOptions
from swapdsl.planning.optimize import optimize
from swapdsl.planning.problem import Problem, Request
from swapdsl.runtime.backend import array_module
from swapdsl.runtime.interpreter import PlanRunner
from swapdsl.runtime.profile import profile

MODELS = {
    "tiny_resnet": ["batch=32", "width=16"],
    "tiny_transformer": ["batch=8", "seq=128", "dim=256", "heads=4", "ffn=1024", "vocab=2048"],
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ratios", type=float, nargs="+", default=[2.0, 4.0])
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--backend", default="numpy")
    ap.add_argument("--method", default="belady")
    ap.add_argument("--budget", type=float, default=60.0, help="search seconds per plan (--method ga)")
    args = ap.parse_args()
    backend, xp = array_module(args.backend)
    print(f"{'model':<17} {'ratio':>5} {'cap MiB':>8} {'simulated ms':>13} {'measured ms':>12} {'error':>7} "
          f"{'swap MiB':>9}")
    for name, defines in MODELS.items():
        g = api.load(STDLIB_DIR / "models" / f"{name}.swp", parse_defines(defines)).graph
        t = training_graph(g)
        device = profile(t, xp, backend, BUILTIN["v100-16gb"], repeat=5)
        p = Problem.build(t, device)
        no_swap = no_swap_bytes(p)
        for ratio in args.ratios:
            cap = int((no_swap + p.scratch) / ratio)  # the no-swap memory holds the kernels' scratch too
            plan = optimize(Request(t, device, cap, name, g.args), args.method, SearchOptions(budget_s=args.budget))
            runner = PlanRunner(plan, t, backend, xp, seed=0)
            try:
                times = [runner.step(step)[1] for step in range(1, args.steps + 1)]
            finally:
                runner.close()
            measured = statistics.median(times[1:] if len(times) > 1 else times)
            simulated = plan.figure("iteration_ms")
            print(f"{name:<17} {ratio:>5g} {cap / 2**20:>8.1f} {simulated:>13.1f} {measured:>12.1f} "
                  f"{(measured - simulated) / simulated:>+7.1%} {plan.figure('swap_bytes') / 2**20:>9.1f}")


if __name__ == "__main__":
    main()
