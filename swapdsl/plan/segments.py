"""Byte ranges of the device arena with a value each: what the simulator, the validator and the
runtime remember about freed memory (when it fell free, at which position, which events to wait for).

``Segments`` keeps disjoint ranges sorted by offset; assigning a range
overwrites what it covers, so each byte holds the value of the latest free
that covered it, and a new tenant waits for every value over its region.
"""

from __future__ import annotations

import bisect
from typing import Generic, TypeVar

V = TypeVar("V")


class Segments(Generic[V]):
    def __init__(self) -> None:
        self.lo: list[int] = []
        self.hi: list[int] = []
        self.val: list[V] = []

    def over(self, lo: int, hi: int) -> list[V]:
        """The values of the ranges that overlap [lo, hi)."""
        i = bisect.bisect_right(self.hi, lo)
        out = []
        while i < len(self.lo) and self.lo[i] < hi:
            out.append(self.val[i])
            i += 1
        return out

    def assign(self, lo: int, hi: int, value: V) -> None:
        """[lo, hi) now holds ``value``; ranges it cuts keep their value outside it."""
        i = bisect.bisect_right(self.hi, lo)
        j = i
        while j < len(self.lo) and self.lo[j] < hi:
            j += 1
        pieces: list[tuple[int, int, V]] = []
        if i < j and self.lo[i] < lo:
            pieces.append((self.lo[i], lo, self.val[i]))
        pieces.append((lo, hi, value))
        if i < j and self.hi[j - 1] > hi:
            pieces.append((hi, self.hi[j - 1], self.val[j - 1]))
        self.lo[i:j] = [a for a, _, _ in pieces]
        self.hi[i:j] = [b for _, b, _ in pieces]
        self.val[i:j] = [v for _, _, v in pieces]
