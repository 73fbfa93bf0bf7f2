"""How tight is the bound? The best plan over every schedule of a small graph, set against ``bound_ms``.

bench/bound_gap.py prints it for many graphs; a test holds that no schedule beats the bound.
"""

from __future__ import annotations

import attrs

from swapdsl.devices.profiles import BUILTIN
from swapdsl.fuzz.graphs import seeded_training_graph
from swapdsl.planning.bound import bound_ms
from swapdsl.planning.compiled import no_swap_bytes
from swapdsl.planning.ga import Decoder, EARLY, policy_of
from swapdsl.planning.policy import OUTPUTS
from swapdsl.planning.problem import Request
from swapdsl.planning.sizing import need_bytes


@attrs.frozen
class Gap:
    ops: int
    orders: int  # schedules tried (at most the limit)
    bound_ms: float
    best_ms: float  # the best plan over those schedules, both pinning choices and every policy of the search


def bound_gap(seed: int, max_orders: int) -> Gap:
    """Graph ``seed`` of the generator (two hidden layers, the graphs of the published figures) at a cap
    halfway between its smallest feasible one and its no-swap arena."""
    t = seeded_training_graph(seed, max_depth=2, extras=False)
    d = Decoder(Request(t, BUILTIN["v100-16gb"], 1 << 40, "g", ()))
    cap = (need_bytes(d.p, frozenset()) + no_swap_bytes(d.p)) // 2
    d = Decoder(Request(t, BUILTIN["v100-16gb"], cap, "g", ()))
    best, n_orders = best_over_orders(d, cap, max_orders)
    return Gap(d.p.n_ops, n_orders, bound_ms(d.p, cap), best)


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
