"""Data-parallel plans in one process, for the plan fuzzer: a world of N ranks that are all this one.

Every rank of a loopback world runs the same step on the same rows, so an all-reduce's sum is N times this
rank's value and its mean that over N (the value itself, exactly, for N a power of two): a data-parallel
plan run this way must match the reference run the same way bit for bit, while its all-reduces still run
on their own lane with every wait the plan's replay gives them.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from typing import Any

import numpy as np

from swapdsl.runtime import dist

RANKS_LINE = re.compile(r"^ranks (\d+) link ", re.MULTILINE)


class Loopback:
    """The part of mpi4py's communicator that swapdsl's runtime uses, for N copies of this process."""

    def __init__(self, size: int) -> None:
        self.size = size

    def Get_size(self) -> int:  # noqa: N802 (mpi4py's names)
        return self.size

    def Get_rank(self) -> int:  # noqa: N802
        return 0

    def Allreduce(self, x: np.ndarray, out: np.ndarray) -> None:  # noqa: N802
        np.multiply(x, out.dtype.type(self.size), out=out)

    def allgather(self, value: Any) -> list[Any]:
        return [value] * self.size

    def Dup(self) -> Loopback:  # noqa: N802
        return self

    def Abort(self, code: int) -> None:  # noqa: N802
        """No other rank to end: this one reports its own error and exits as one rank would."""


@contextlib.contextmanager
def loopback_world(plan_text: str) -> Iterator[None]:
    """Run the enclosed commands in a loopback world of the ranks ``plan_text``'s ``ranks`` line names (none:
    one rank, the world untouched)."""
    found = RANKS_LINE.search(plan_text)
    size = int(found.group(1)) if found else 1
    if not 2 <= size <= 64:
        yield
        return
    saved = dist.world, dist.watchdog, dist.host_lane
    dist.world = lambda: Loopback(size)  # type: ignore[assignment]
    dist.watchdog = _Unwatched  # type: ignore[assignment]
    lane = dist.Watched(Loopback(size), _Unwatched(), "host-copy all-reduce")  # type: ignore[arg-type]
    dist.host_lane = lambda: lane  # type: ignore[assignment]
    try:
        yield
    finally:
        dist.world, dist.watchdog, dist.host_lane = saved  # type: ignore[assignment]


class _Unwatched:
    """A watchdog for one process: no rank to wait for."""

    index = 0

    def at_step(self, step: int) -> None:
        self.index = 0

    def collective(self, what: str) -> contextlib.AbstractContextManager[None]:
        self.index += 1
        return contextlib.nullcontext()
