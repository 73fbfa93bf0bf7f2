"""A watchdog over the ranks' collectives.

Every rank runs the same collectives in the same order (``dist.join`` holds them to one plan), so the n-th
collective a rank enters is the n-th of every rank. A rank that hangs, or dies under a launcher that leaves
the others running, would leave them waiting in the next one for ever. So each collective is entered
through ``Watchdog.collective``; a thread of its own notices a wait longer than ``ANNOUNCE_S`` and tells
the other ranks which collective it waits in (a message on a communicator of its own, sent and received
by these threads alone), and one longer than the timeout ends the run: the lowest waiting rank prints an
error naming the ranks that did not come and the step, then every rank is aborted with exit 2 (a waiting
rank whose lowest fellow said nothing in ``GRACE_S`` says it itself; a collective that completes meanwhile
ends nothing). (A rank killed by a signal is the launcher's business: MPICH's and Open MPI's end the others
at once.)
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import attrs
import numpy as np

from swapdsl.common.errors import SwpError

DEFAULT_TIMEOUT_S = 600.0  # a rank may wait this long for the others (a checkpoint of a large model takes minutes)
ANNOUNCE_S = 1.0  # a wait this long is told to the other ranks (or a quarter of the timeout, if shorter)
POLL_S = 0.05
GRACE_S = 10.0  # a waiting rank that does not report waits this long for the one that does to end the run
TAG = 40
EXIT_CODE = 2


@attrs.frozen
class Wait:
    """Where a rank waits: its ``seq``-th collective, the ``index``-th of step ``step`` (0: before the first)."""

    seq: int
    step: int
    index: int
    what: str
    since: float

    def place(self) -> str:
        return f"{self.what} of step {self.step}" if self.step else f"{self.what} before the first step"


class Watchdog:
    def __init__(self, comm: Any, timeout_s: float) -> None:
        self.comm = comm.Dup()  # its messages never meet the step's
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        self.timeout_s = timeout_s
        self.seq = self.step = self.index = 0
        self.current: Wait | None = None  # replaced whole, so the thread reads one consistent value
        self.seen: dict[int, int] = {}  # rank -> the collective it last said it waits in
        self.announced = 0
        self.sends: list[tuple[Any, np.ndarray]] = []
        threading.Thread(target=self._watch, name="swapdsl-watchdog", daemon=True).start()

    def at_step(self, step: int) -> None:
        self.step, self.index = step, 0

    @contextlib.contextmanager
    def collective(self, what: str) -> Iterator[None]:
        self.seq += 1
        self.index += 1
        self.current = Wait(self.seq, self.step, self.index, what, time.monotonic())
        try:
            yield
        finally:
            self.current = None

    def _watch(self) -> None:
        announce_after = min(ANNOUNCE_S, self.timeout_s / 4)
        while True:
            time.sleep(POLL_S)
            self._receive()  # (every poll: a rank that never waits long keeps no backlog)
            wait = self.current
            if wait is None or time.monotonic() - wait.since < announce_after:
                continue
            if self.announced < wait.seq:
                self._announce(wait.seq)
            if time.monotonic() - wait.since >= self.timeout_s:
                self._expire(wait, announce_after)

    def _announce(self, seq: int) -> None:
        self.announced = seq
        for peer in range(self.size):
            if peer != self.rank:
                buf = np.array([seq], dtype=np.int64)
                self.sends.append((self.comm.Isend(buf, dest=peer, tag=TAG), buf))

    def _receive(self) -> None:
        from mpi4py import MPI

        self.sends = [(r, b) for r, b in self.sends if not r.Test()]
        status = MPI.Status()
        while self.comm.Iprobe(source=MPI.ANY_SOURCE, tag=TAG, status=status):
            buf = np.empty(1, dtype=np.int64)
            self.comm.Recv(buf, source=status.Get_source(), tag=TAG)
            self.seen[status.Get_source()] = int(buf[0])

    def _expire(self, wait: Wait, settle_s: float) -> None:
        """End the run, unless the collective completes meanwhile: the lowest waiting rank says why; the
        others give it ``GRACE_S`` to, then say it themselves."""
        time.sleep(settle_s)  # the last announcements in flight
        self._receive()
        waiting = sorted({self.rank} | {r for r, seq in self.seen.items() if seq == wait.seq})
        if self.current is not wait:
            return
        if self.rank != waiting[0]:
            time.sleep(GRACE_S)
            if self.current is not wait:
                return
        print(timed_out(wait, waiting, self.size, self.timeout_s).render(), file=sys.stderr, flush=True)
        sys.stdout.flush()
        self.comm.Abort(EXIT_CODE)


def timed_out(wait: Wait, waiting: list[int], size: int, timeout_s: float) -> SwpError:
    """The one error of a run whose ranks did not all reach a collective within the timeout."""
    missing = [r for r in range(size) if r not in waiting]
    who = _ranks(missing) if missing else "no rank"
    return SwpError(f"{who} did not reach the {wait.place()} within {timeout_s:g} s, where {_ranks(waiting)} "
                    f"waited for {'it' if len(missing) == 1 else 'them'} (hung, or ended without the launcher "
                    "noticing): the run is stopped",
                    notes=["a checkpoint is replaced whole or not at all: the last one written is intact"],
                    hints=["if that rank is only slow (rank 0 saving a large checkpoint, a first step that compiles "
                           "kernels), give every rank a longer --rank-timeout SECONDS"])


def _ranks(ranks: list[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))


@contextlib.contextmanager
def within(timeout_s: float, what: str, rank: int) -> Iterator[None]:
    """The enclosed start of the ranks (MPI's start-up, which waits for every rank, and the first collective)
    done within ``timeout_s``, or this rank's error and the run ended. A forked process watches: MPI's
    start-up holds the interpreter, so no thread of this one could. A rank waits a tenth of a second per
    rank before it longer (10 s at most), so the lowest prints; the watcher of a rank that ends first sees
    its pipe close and leaves quietly."""
    read, write = os.pipe()
    parent = os.getpid()
    pid = os.fork()
    if pid == 0:
        os.close(write)
        ready, _, _ = select.select([read], [], [], timeout_s + min(0.1 * rank, 10.0))
        if not ready and os.getppid() == parent:
            err = SwpError(f"not every rank reached {what} within {timeout_s:g} s (rank {rank} waited): a rank "
                           f"hangs or stopped before it", hints=["run each rank's command alone to see where it stops",
                                                                  "or give `exec` a longer --rank-timeout"])
            os.write(2, (err.render() + "\n").encode())
            os.kill(parent, signal.SIGKILL)  # (the launcher then ends the other ranks)
        os._exit(0)
    os.close(read)
    try:
        yield
    finally:
        os.close(write)
        os.waitpid(pid, 0)
