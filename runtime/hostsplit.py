"""The host lane's element-wise kernels, each split across threads: a host has many cores and one lane.

An optimiser update on the host (and the casts around it) computes each element from the same element of
its inputs alone, so its flat range is cut into contiguous parts, one per worker, each run by the op's own
kernel with a scratch of its own: the same operations on every element as one call, so the same bits.
NumPy's ufuncs release the GIL, so the parts run at once (ZeRO-Offload's CPU Adam is multithreaded for the
same reason). Everything else on the lane (an all-reduce of host copies, a bucket's pack) runs as one call.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, wait

import numpy as np

from swapdsl.common.errors import SwpError
from swapdsl.graph.ir import TensorType
from swapdsl.graph.offload import UPDATE_OPS
from swapdsl.graph.ops import KernelContext
from swapdsl.graph.ops.kernels import kernel_of, scratch_need
from swapdsl.graph.ops.registry import Array, Attrs, Scratch

SPLIT_OPS = UPDATE_OPS | {"cast"}
MIN_PART = 1 << 18  # elements: a smaller part costs more to hand to a thread than its share of the work saves
THREADS_ENV = "SWAPDSL_HOST_THREADS"


MAX_THREADS = 1024


def host_threads() -> int:
    """Workers for the host lane's kernels: ``SWAPDSL_HOST_THREADS``, else every core (at most 16)."""
    text = os.environ.get(THREADS_ENV, "").strip()
    if not text:
        return min(16, _cores())
    if not (text.isascii() and text.isdigit() and len(text) <= 4) or not 1 <= int(text) <= MAX_THREADS:
        raise SwpError(f"{THREADS_ENV}={text!r}: expected a whole number of threads from 1 to {MAX_THREADS}",
                       hints=[f"unset it to use every core (at most 16), or set {THREADS_ENV}=1 for one thread"])
    return int(text)


def _cores() -> int:
    """The cores this process may run on (its affinity, where the system says; else every core)."""
    affinity = getattr(os, "sched_getaffinity", None)
    return len(affinity(0)) if affinity is not None else os.cpu_count() or 1


def parts(n: int, threads: int) -> list[tuple[int, int]]:
    """[lo, hi) ranges covering ``n`` elements, at most ``threads`` of them, none under ``MIN_PART``."""
    count = max(1, min(threads, n // MIN_PART))
    step = math.ceil(n / count)
    return [(lo, min(n, lo + step)) for lo in range(0, n, step)]


class HostKernels:
    """Builds the host lane's launchers; ``close`` ends its threads."""

    def __init__(self, threads: int) -> None:
        self.threads = threads
        self.pool = ThreadPoolExecutor(threads - 1, thread_name_prefix="swapdsl-host") if threads > 1 else None
        # one scratch per part, shared by every op (the lane runs one op at a time), as large as the most any
        # op's part takes: the host holds the largest op's scratch once, as one call's would be
        self.scratch: list[Scratch] = []

    def launcher(self, op: str, ins: list[Array], out: Array, a: Attrs, types: tuple[TensorType, ...],
                 out_type: TensorType, ctx: KernelContext) -> Callable[[], None]:
        """The op as host-lane work over these arrays: split where it may be, else one call in ``ctx``."""
        ranges = parts(out.size, self.threads) if op in SPLIT_OPS and self.pool is not None else [(0, out.size)]
        if len(ranges) == 1:
            kernel = kernel_of(op, types, out_type, a)

            def whole() -> None:
                ctx.scratch.reset()
                kernel(ctx, ins, out, a)

            return whole
        calls = [self._part(op, ins, out, a, types, out_type, ctx, k, lo, hi) for k, (lo, hi) in enumerate(ranges)]
        pool = self.pool

        def run() -> None:
            assert pool is not None
            waiting = [pool.submit(call) for call in calls[1:]]
            try:
                calls[0]()  # (the lane's own thread takes the first part)
            finally:  # (no part may still be writing once the lane moves on, even after an error)
                wait(waiting)
            for w in waiting:
                w.result()

        return run

    def _part(self, op: str, ins: list[Array], out: Array, a: Attrs, types: tuple[TensorType, ...],
              out_type: TensorType, ctx: KernelContext, k: int, lo: int, hi: int) -> Callable[[], None]:
        n = out.size

        def cut(x: Array, t: TensorType) -> tuple[Array, TensorType]:
            if x.size != n:  # (a scalar: a gated update's flag)
                return x, t
            return x.reshape(-1)[lo:hi], TensorType((hi - lo,), t.dtype)

        cuts = {id(x): cut(x, t) for x, t in zip([*ins, out], [*types, out_type])}  # (one view per array)
        ins_k = [cuts[id(x)][0] for x in ins]
        out_k, out_t = cuts[id(out)]
        types_k = tuple(cuts[id(x)][1] for x in ins)
        kernel = kernel_of(op, types_k, out_t, a)
        own = KernelContext(np, self._scratch(k, scratch_need(op, types_k, out_t, a)), ctx.step)

        def call() -> None:
            own.scratch.reset()
            kernel(own, ins_k, out_k, a)

        return call

    def _scratch(self, k: int, need: int) -> Scratch:
        """Part ``k``'s scratch, grown to ``need`` bytes if it is smaller (every kernel that uses it sees the
        larger buffer: a ``Scratch`` takes from its buffer as it is at the call)."""
        while len(self.scratch) <= k:
            self.scratch.append(Scratch(np.zeros(1, np.uint8)))
        if self.scratch[k].buffer.size < need:
            self.scratch[k].buffer = np.zeros(need, np.uint8)
        return self.scratch[k]

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown()
