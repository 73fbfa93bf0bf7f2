"""Packing regions that live over intervals into one arena (dynamic storage allocation): each item holds
``size`` bytes from one gap to another, and two items held in a common gap may not share a byte.

Greedy first (lowest offset, items taken largest first, then by first gap; else by first gap), and
where neither fits, a mixed-integer program (HiGHS, ``milp.py``): an offset per item and, for each pair
that lives at once, which of the two lies below the other.
"""

from __future__ import annotations

from collections.abc import Sequence


from swapdsl.common.units import ALIGN
from swapdsl.planning.milp import Milp

Item = tuple[int, int, int]  # (first gap, last gap, bytes: a multiple of ALIGN)


def pack(items: Sequence[Item], cap: int, time_limit_s: float = 10.0) -> tuple[list[int] | None, int]:
    """Offsets for ``items`` below ``cap`` (and 0), or ``None`` and the least overflow found."""
    least = None
    for key in (lambda k: (-items[k][2], items[k][0], k), lambda k: (items[k][0], -items[k][2], k)):
        offsets = _greedy(items, sorted(range(len(items)), key=key))
        overflow = max((o + items[k][2] for k, o in enumerate(offsets)), default=0) - cap
        if overflow <= 0:
            return offsets, 0
        least = overflow if least is None else min(least, overflow)
    offsets = _program(items, cap, time_limit_s)
    return (offsets, 0) if offsets is not None else (None, least or 0)


def _together(a: Item, b: Item) -> bool:
    return a[0] <= b[1] and b[0] <= a[1]


def _greedy(items: Sequence[Item], order: list[int]) -> list[int]:
    offsets = [0] * len(items)
    placed: list[int] = []
    for k in order:
        busy = sorted((offsets[j], offsets[j] + items[j][2]) for j in placed if _together(items[j], items[k]))
        offset = 0
        for lo, hi in busy:
            if lo - offset >= items[k][2]:
                break
            offset = max(offset, hi)
        offsets[k] = offset
        placed.append(k)
    return offsets


def _program(items: Sequence[Item], cap: int, time_limit_s: float) -> list[int] | None:
    """Offsets in units of ALIGN: item k at ``x[k]``, and for each pair that lives at once, ``below``
    says which lies under the other (the rows hold with the other relaxed by the cap)."""
    prog = Milp()
    x = [prog.var(ub=float((cap - size) // ALIGN), integer=True) for _, _, size in items]
    if any(prog.ub[j] < 0 for j in x):
        return None
    units = float(cap // ALIGN)
    for a in range(len(items)):
        for b in range(a + 1, len(items)):
            if not _together(items[a], items[b]):
                continue
            below = prog.var(integer=True)
            prog.row({x[a]: 1.0, x[b]: -1.0, below: units}, ub=units - items[a][2] // ALIGN)
            prog.row({x[b]: 1.0, x[a]: -1.0, below: -units}, ub=-items[b][2] // ALIGN)
    res = prog.solve(time_limit_s)
    if res.x is None:
        return None
    return [int(round(res.x[j])) * ALIGN for j in x]
