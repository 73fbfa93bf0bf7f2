"""The device memory pool: size classes of fixed-size slabs that together fit the cap.

A tensor lives in a slab of its own size class or, when none is free, of a
larger class ("borrowing"), so a pool need not reserve every class's worst
case at once. ``Slabs`` is the allocator both the pool sizing and the swap
planner use, so a pool sized for "no swapping" really needs no swapping.
"""

from __future__ import annotations

import heapq
from collections import Counter

import attrs

from swapdsl.errors import SwpError
from swapdsl.problem import Problem
from swapdsl.units import format_bytes


@attrs.frozen
class Pool:
    sizes: tuple[int, ...]  # slab bytes per class, largest first
    counts: tuple[int, ...]

    @property
    def bytes(self) -> int:
        return sum(s * c for s, c in zip(self.sizes, self.counts))


class Slabs:
    """Free slabs per class; ``take`` prefers the tensor's own class, then the smallest larger one.

    With ``grow`` set, a class with no free slab gets a new one instead (sizing a pool).
    """

    def __init__(self, sizes: tuple[int, ...], counts: tuple[int, ...] | None = None, grow: bool = False) -> None:
        self.sizes = sizes
        self.cls = {s: i for i, s in enumerate(sizes)}
        self.counts = list(counts) if counts is not None else [0] * len(sizes)
        self.free: list[list[int]] = [list(range(n)) for n in self.counts]
        self.grow = grow

    def take(self, size: int, borrow: bool = True) -> tuple[int, int] | None:
        """A free slab (class, index) that fits ``size``-class tensors, or None.

        Own class first, then (with ``borrow``) ever larger ones; with ``grow``, a new own-class slab.
        """
        c = self.cls[size]
        for k in range(c, -1 if borrow else c - 1, -1):
            if self.free[k]:
                return k, heapq.heappop(self.free[k])
        if self.grow:
            self.counts[c] += 1
            return c, self.counts[c] - 1
        return None

    def give(self, slab: tuple[int, int]) -> None:
        heapq.heappush(self.free[slab[0]], slab[1])


def class_sizes(p: Problem) -> tuple[int, ...]:
    return tuple(sorted(set(p.slab_bytes), reverse=True))


def resident_at_start(p: Problem, pinned: frozenset[int]) -> list[int]:
    """Tensors on the device when an iteration starts: pinned persistent tensors, then inputs."""
    return sorted(pinned, key=p.names.__getitem__) + sorted(p.inputs, key=p.names.__getitem__)


def no_swap_counts(p: Problem, schedule: list[int]) -> tuple[int, ...]:
    """Slabs per class to run ``schedule`` with every tensor resident from birth to last use."""
    from swapdsl.swapplan import last_uses, placement_order  # the planner's own orders

    slabs = Slabs(class_sizes(p), grow=True)
    where: dict[int, tuple[int, int]] = {}
    for t in resident_at_start(p, p.persistent):
        where[t] = slabs.take(p.slab_bytes[t], borrow=False)  # type: ignore[assignment]
    last = last_uses(p, schedule)
    kept = p.persistent | {new for _, new in p.updates} | {p.loss}
    for pos, op in enumerate(schedule):
        outs = list(p.op_outputs[op])
        if p.in_place[op]:
            where[outs.pop(0)] = where.pop(p.op_inputs[op][0])
        for t in placement_order(p, outs):
            where[t] = slabs.take(p.slab_bytes[t])  # type: ignore[assignment]
        for t in dict.fromkeys(p.op_inputs[op]):
            if last[t] == pos and t not in kept and t in where:
                slabs.give(where.pop(t))
    return tuple(slabs.counts)


def no_swap_bytes(p: Problem, schedule: list[int] | None = None) -> int:
    """The pool bytes ``schedule`` (default: the graph's order) needs to run with no swapping."""
    counts = no_swap_counts(p, list(range(p.n_ops)) if schedule is None else schedule)
    return sum(s * n for s, n in zip(class_sizes(p), counts))


def need_counts(p: Problem, schedule: list[int], pinned: frozenset[int]) -> tuple[int, ...]:
    """The fewest slabs per class with which every op can find room for all it touches.

    Hall's condition over nested sets of classes: the k largest classes must
    hold the pinned tensors and inputs of those classes plus the most tensors of
    those classes any one op touches.
    """
    sizes = class_sizes(p)
    cls = {s: i for i, s in enumerate(sizes)}
    fixed = Counter(cls[p.slab_bytes[t]] for t in set(resident_at_start(p, pinned)))
    most = [0] * len(sizes)
    replaced = {new for _, new in p.updates}
    for op in schedule:
        touched = Counter(cls[p.slab_bytes[t]] for t in set(p.op_inputs[op]) | set(p.op_outputs[op])
                          if t not in pinned and t not in p.inputs and not (p.in_place[op] and t in replaced))
        running = 0
        for k in range(len(sizes)):
            running += touched[k]
            most[k] = max(most[k], running)
    counts: list[int] = []
    fixed_cum = 0
    for k in range(len(sizes)):
        fixed_cum += fixed[k]
        counts.append(max(fixed[k], fixed_cum + most[k] - sum(counts)))
    return tuple(counts)


def fit_pool(sizes: tuple[int, ...], peak: tuple[int, ...], need: tuple[int, ...], cap: int) -> Pool:
    """Scale every class from its no-swap count towards its need until the pool fits the cap.

    All classes shrink by the same fraction (never below their need); bytes left
    over go back to the classes in order of their shortfall.
    """
    need_bytes = sum(s * n for s, n in zip(sizes, need))
    if need_bytes > cap:
        raise SwpError(f"a cap of {format_bytes(cap)} is below the smallest feasible cap for this plan, "
                       f"{format_bytes(need_bytes)} ({need_bytes} bytes)",
                       hints=[f"use --memory {need_bytes} or more"])
    if sum(s * c for s, c in zip(sizes, peak)) <= cap:
        return Pool(sizes, peak)  # (peak may borrow where need counts per class: both are feasible)
    peak = tuple(max(pk, n) for pk, n in zip(peak, need))
    lo, hi = 0.0, 1.0
    for _ in range(40):
        mid = (lo + hi) / 2
        if _scaled(sizes, peak, need, mid)[1] <= cap:
            lo = mid
        else:
            hi = mid
    counts_t, used = _scaled(sizes, peak, need, lo)
    counts = list(counts_t)
    for i in sorted(range(len(sizes)), key=lambda i: counts[i] / max(peak[i], 1)):
        extra = min(peak[i] - counts[i], (cap - used) // sizes[i])
        counts[i] += extra
        used += extra * sizes[i]
    return Pool(sizes, tuple(counts))


def _scaled(sizes: tuple[int, ...], peak: tuple[int, ...], need: tuple[int, ...],
            alpha: float) -> tuple[tuple[int, ...], int]:
    counts = tuple(max(n, int(pk * alpha)) for pk, n in zip(peak, need))
    return counts, sum(s * c for s, c in zip(sizes, counts))
