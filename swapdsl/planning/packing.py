"""Packing regions that live over intervals into one arena (dynamic storage allocation): each item holds
``size`` bytes from one gap to another, and two items held in a common gap may not share a byte. Items
``together`` take one offset (a pinned value that leaves and comes back to its home).

Greedy first (lowest offset, items taken largest first, then by first gap; else by first gap), and
where neither fits, a mixed-integer program (HiGHS, ``milp.py``): an offset per item and, for each pair
that lives at once, which of the two lies below the other.
"""

from __future__ import annotations

from collections.abc import Sequence


from swapdsl.common.units import ALIGN
from swapdsl.planning.milp import Milp

Item = tuple[int, int, int]  # (first gap, last gap, bytes: a multiple of ALIGN)
Unit = tuple[list[tuple[int, int]], int]  # items that take one offset: their (first, last) gaps, the most bytes


def pack(items: Sequence[Item], cap: int, time_limit_s: float = 10.0,
         together: Sequence[Sequence[int]] = ()) -> tuple[list[int] | None, int]:
    """Offsets for ``items`` below ``cap`` (and 0), or ``None`` and the least overflow found."""
    groups = _groups(len(items), together)
    units: list[Unit] = [([items[k][:2] for k in g], max(items[k][2] for k in g)) for g in groups]
    least = None
    for key in (lambda k: (-units[k][1], _first(units[k]), k), lambda k: (_first(units[k]), -units[k][1], k)):
        offsets = _greedy(units, sorted(range(len(units)), key=key))
        overflow = max((o + units[k][1] for k, o in enumerate(offsets)), default=0) - cap
        if overflow <= 0:
            return _spread(groups, offsets, len(items)), 0
        least = overflow if least is None else min(least, overflow)
    offsets = _program(units, cap, time_limit_s)
    return (_spread(groups, offsets, len(items)), 0) if offsets is not None else (None, least or 0)


def _groups(n: int, together: Sequence[Sequence[int]]) -> list[list[int]]:
    """Every item in one group: those ``together``, the rest alone, by first index."""
    grouped = {k for g in together for k in g}
    return sorted([sorted(g) for g in together if g] + [[k] for k in range(n) if k not in grouped])


def _spread(groups: list[list[int]], offsets: list[int], n: int) -> list[int]:
    out = [0] * n
    for g, o in zip(groups, offsets):
        for k in g:
            out[k] = o
    return out


def _first(u: Unit) -> int:
    return min(first for first, _ in u[0])


def _together(a: Unit, b: Unit) -> bool:
    return any(x[0] <= y[1] and y[0] <= x[1] for x in a[0] for y in b[0])


def _greedy(units: Sequence[Unit], order: list[int]) -> list[int]:
    offsets = [0] * len(units)
    placed: list[int] = []
    for k in order:
        busy = sorted((offsets[j], offsets[j] + units[j][1]) for j in placed if _together(units[j], units[k]))
        offset = 0
        for lo, hi in busy:
            if lo - offset >= units[k][1]:
                break
            offset = max(offset, hi)
        offsets[k] = offset
        placed.append(k)
    return offsets


def _program(units: Sequence[Unit], cap: int, time_limit_s: float) -> list[int] | None:
    """Offsets in units of ALIGN: unit k at ``x[k]``, and for each pair that lives at once, ``below``
    says which lies under the other (the rows hold with the other relaxed by the cap)."""
    prog = Milp()
    x = [prog.var(ub=float((cap - size) // ALIGN), integer=True) for _, size in units]
    if any(prog.ub[j] < 0 for j in x):
        return None
    whole = float(cap // ALIGN)
    for a in range(len(units)):
        for b in range(a + 1, len(units)):
            if not _together(units[a], units[b]):
                continue
            below = prog.var(integer=True)
            prog.row({x[a]: 1.0, x[b]: -1.0, below: whole}, ub=whole - units[a][1] // ALIGN)
            prog.row({x[b]: 1.0, x[a]: -1.0, below: -whole}, ub=-units[b][1] // ALIGN)
    res = prog.solve(time_limit_s)
    if res.x is None:
        return None
    return [int(round(res.x[j])) * ALIGN for j in x]
