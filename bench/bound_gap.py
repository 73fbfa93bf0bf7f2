"""How tight is bound_ms? Compare it with the best plan found by trying every schedule.

Usage: python bench/bound_gap.py [--graphs 20] [--max-orders 3000] [--seed 0]

Small random training graphs (the property tests' generator, two hidden
layers) at a cap halfway between the smallest feasible one and the no-swap
arena. For each: every topological order (up to --max-orders, enumerated
depth-first), with both pinning choices, every output placement and every
early-swap-in setting of the search (``ga.EARLY``), planned by the Belady swap
planner and simulated (the compiled evaluator the search uses); the best
iteration time over all of them is set against the bound. A `+` after the
count of orders marks a graph with more orders than the limit: its best is
over a sample, not exhaustive.
"""

from __future__ import annotations

import argparse
import statistics

from swapdsl.fuzz.bound_gap import bound_gap


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--graphs", type=int, default=20)
    ap.add_argument("--max-orders", type=int, default=3000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    gaps = []
    for i in range(args.graphs):
        g = bound_gap(args.seed + i, args.max_orders)
        gaps.append(g.best_ms / g.bound_ms)
        print(f"graph {i:>2}: {g.ops:>3} ops, {g.orders:>5} orders{'+' if g.orders >= args.max_orders else ' '}"
              f"  bound {g.bound_ms:.4f} ms  best {g.best_ms:.4f} ms  best/bound {gaps[-1]:.3f}")
    print(f"best/bound: median {statistics.median(gaps):.3f}, max {max(gaps):.3f}, min {min(gaps):.3f}")


if __name__ == "__main__":
    main()
