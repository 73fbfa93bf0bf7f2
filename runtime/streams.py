"""Streams: lanes of prepared work ordered by events, run by threads on NumPy and by CUDA on CuPy.

A step is the same prepared program every time: for each stream a list of
``Item``s (the events it waits for, the work, the event it fires), built
once per plan. On NumPy each stream is a worker thread that walks its list;
an event is a ``threading.Lock`` held until it fires (released), and waiting
is acquiring and releasing it again, so every waiter passes once it has
fired; before each step every lock is taken again. Copies and
large kernels release the GIL, so the lanes overlap, and a missing wait
shows up as a wrong number. On CuPy the host walks the program in order and
enqueues each item on its CUDA stream (``issue_cuda``), which a CUDA graph
can capture once and replay.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

WAIT_TIMEOUT_S = 120.0
# host: ops a plan runs on the host (on CuPy, host functions on a stream: runtime/hostfn.py); net: all-reduces
STREAMS = ("compute", "h2d", "d2h", "host", "net")


class Item(NamedTuple):
    """One instruction as a stream runs it: wait for ``waits``, run ``run``, then fire ``signal``."""

    waits: tuple[Any, ...]
    run: Callable[[], None]
    signal: Any  # an event, or None when no other stream waits for this item


class ThreadLanes:
    """One worker thread per stream; ``run`` hands each its list for a step and waits for all of them."""

    def __init__(self, wait_timeout_s: float = WAIT_TIMEOUT_S) -> None:
        """``wait_timeout_s``: how long a lane waits for another's event before calling the plan deadlocked
        (longer under data-parallel ranks, where a lane may wait for another rank's all-reduce)."""
        self.wait_timeout_s = wait_timeout_s
        self._inbox: dict[str, queue.SimpleQueue[tuple[list[Item], list[threading.Lock]] | None]] = {}
        self._done: queue.SimpleQueue[BaseException | None] = queue.SimpleQueue()
        self._threads = []
        for name in STREAMS:
            self._inbox[name] = queue.SimpleQueue()
            thread = threading.Thread(target=self._work, args=(name,), name=f"swapdsl-{name}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def _work(self, name: str) -> None:
        inbox = self._inbox[name]
        while (task := inbox.get()) is not None:
            items, events = task
            try:
                for waits, run, signal in items:
                    for event in waits:
                        if not event.acquire(timeout=self.wait_timeout_s):
                            raise RuntimeError("an event never fired: the plan's streams deadlocked")
                        event.release()
                    run()
                    if signal is not None:
                        signal.release()
            except BaseException as exc:  # reported by run(), on the caller's thread
                for event in events:  # release the other lanes: the step is lost anyway
                    if event.locked():
                        event.release()
                self._done.put(exc)
            else:
                self._done.put(None)

    def run(self, lanes: dict[str, list[Item]], events: Sequence[threading.Lock]) -> None:
        """Run one step: every lane's items, in order on its own thread; returns when all are done.
        ``events``: every lock an item fires (each held from the start of the step until it fires)."""
        for event in events:
            event.acquire(blocking=False)
        shared = list(events)
        for name, items in lanes.items():
            self._inbox[name].put((items, shared))
        errors = [self._done.get() for _ in lanes]
        first = next((e for e in errors if e is not None), None)
        if first is not None:
            raise first

    def close(self) -> None:
        for inbox in self._inbox.values():
            inbox.put(None)
        for thread in self._threads:
            thread.join(timeout=WAIT_TIMEOUT_S)


class CudaItem(NamedTuple):
    """One instruction as the host enqueues it on CuPy: its stream, the events it waits for, the work
    (launched with the stream current), and the event it records or None."""

    stream: Any
    waits: tuple[Any, ...]
    run: Callable[[], None]
    signal: Any


def cuda_streams() -> dict[str, Any]:
    import cupy

    return {name: cupy.cuda.Stream(non_blocking=True) for name in STREAMS}


def issue_cuda(items: Sequence[CudaItem], on_item: Callable[[int], None] | None = None) -> None:
    """Enqueue a step's items in program order; nothing here waits for the device."""
    for k, (stream, waits, run, signal) in enumerate(items):
        if on_item is not None:
            on_item(k)
        for event in waits:
            stream.wait_event(event)
        with stream:
            run()
        if signal is not None:
            signal.record(stream)
