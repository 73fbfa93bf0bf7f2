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
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from graphs import seeded_training_graph  # noqa: E402

from swapdsl.devices.profiles import BUILTIN  # noqa: E402
from swapdsl.planning.bound import bound_ms  # noqa: E402
from swapdsl.planning.compiled import no_swap_bytes
from swapdsl.planning.ga import EARLY, Decoder, policy_of  # noqa: E402
from swapdsl.planning.policy import OUTPUTS
from swapdsl.planning.problem import Request
from swapdsl.planning.sizing import need_bytes  # noqa: E402


def orders(d: Decoder, limit: int) -> list[list[int]]:
    found: list[list[int]] = []
    waiting = [len(p) for p in d.preds]
    prefix: list[int] = []

    def walk() -> None:
        if len(found) >= limit:
            return
        ready = [op for op in range(len(waiting)) if waiting[op] == 0 and op not in done]
        if not ready:
            found.append(list(prefix))
            return
        for op in ready:
            done.add(op)
            prefix.append(op)
            for nxt in d.succs[op]:
                waiting[nxt] -= 1
            walk()
            for nxt in d.succs[op]:
                waiting[nxt] += 1
            prefix.pop()
            done.discard(op)

    done: set[int] = set()
    walk()
    return found


def best_over_orders(d: Decoder, cap: int, limit: int) -> tuple[float, int]:
    best = float("inf")
    all_orders = orders(d, limit)
    policies = [policy_of(outputs, early) for outputs in range(len(OUTPUTS)) for early in range(len(EARLY))]
    for pinned in (frozenset(d.p.persistent), frozenset()):
        if need_bytes(d.p, pinned) > cap:
            continue
        for schedule in all_orders:
            for policy in policies:
                best = min(best, d.evaluator(schedule, cap, pinned, policy).iteration_ms)
    return best, len(all_orders)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--graphs", type=int, default=20)
    ap.add_argument("--max-orders", type=int, default=3000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    gaps = []
    for i in range(args.graphs):
        t = seeded_training_graph(args.seed + i, max_depth=2, extras=False)
        d = Decoder(Request(t, BUILTIN["v100-16gb"], 1 << 40, "g", ()))
        need = need_bytes(d.p, frozenset())
        no_swap = no_swap_bytes(d.p)
        cap = (need + no_swap) // 2
        d = Decoder(Request(t, BUILTIN["v100-16gb"], cap, "g", ()))
        best, n_orders = best_over_orders(d, cap, args.max_orders)
        bound = bound_ms(d.p, cap)
        gaps.append(best / bound)
        print(f"graph {i:>2}: {d.p.n_ops:>3} ops, {n_orders:>5} orders{'+' if n_orders >= args.max_orders else ' '}"
              f"  bound {bound:.4f} ms  best {best:.4f} ms  best/bound {best / bound:.3f}")
    print(f"best/bound: median {statistics.median(gaps):.3f}, max {max(gaps):.3f}, min {min(gaps):.3f}")


if __name__ == "__main__":
    main()
