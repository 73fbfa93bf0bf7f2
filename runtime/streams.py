"""Streams and events behind one small interface: CUDA's on CuPy, worker threads on NumPy.

A stream runs submitted work in order; ``record`` returns an event that fires
when everything submitted before it is done; ``wait`` makes later work on the
stream wait for an event of another stream. The NumPy streams are real
threads: copies and large kernels release the GIL, so they overlap, and a
missing wait shows up as a wrong number.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any, Protocol

WAIT_TIMEOUT_S = 120.0


class Event(Protocol):
    def synchronize(self) -> None: ...


class Stream(Protocol):
    def submit(self, fn: Callable[[], None]) -> None: ...

    def record(self) -> Any: ...

    def wait(self, event: Any) -> None: ...

    def synchronize(self) -> None: ...

    def close(self) -> None: ...


class ThreadEvent:
    def __init__(self) -> None:
        self._done = threading.Event()

    def fire(self) -> None:
        self._done.set()

    def synchronize(self) -> None:
        if not self._done.wait(WAIT_TIMEOUT_S):
            raise RuntimeError("an event never fired: the plan's streams deadlocked")


class ThreadStream:
    """A worker thread that runs its queue in order."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._queue: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._work, name=f"swapdsl-{name}", daemon=True)
        self._thread.start()

    def _work(self) -> None:
        while (fn := self._queue.get()) is not None:
            if self._error is not None and not isinstance(fn, _Fire):
                continue
            try:
                fn()
            except BaseException as exc:  # reported by synchronize, on the caller's thread
                self._error = exc

    def submit(self, fn: Callable[[], None]) -> None:
        self._queue.put(fn)

    def record(self) -> ThreadEvent:
        event = ThreadEvent()
        self._queue.put(_Fire(event))
        return event

    def wait(self, event: ThreadEvent) -> None:
        self._queue.put(event.synchronize)

    def synchronize(self) -> None:
        self.record().synchronize()
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(timeout=WAIT_TIMEOUT_S)


class _Fire:
    """Fires its event even on a stream that has failed, so nobody waits forever."""

    def __init__(self, event: ThreadEvent) -> None:
        self.event = event

    def __call__(self) -> None:
        self.event.fire()


class CudaStream:
    """A CUDA stream: work is launched asynchronously under ``with stream``."""

    def __init__(self, name: str) -> None:
        import cupy

        self.name = name
        self._cupy = cupy
        self.stream = cupy.cuda.Stream(non_blocking=True)

    def submit(self, fn: Callable[[], None]) -> None:
        with self.stream:
            fn()

    def record(self) -> Any:
        event = self._cupy.cuda.Event(disable_timing=True)
        event.record(self.stream)
        return event

    def wait(self, event: Any) -> None:
        self.stream.wait_event(event)

    def synchronize(self) -> None:
        self.stream.synchronize()

    def close(self) -> None:
        self.stream.synchronize()


def make_streams(backend: str) -> dict[str, Stream]:
    kind = CudaStream if backend == "cupy" else ThreadStream
    return {name: kind(name) for name in ("compute", "h2d", "d2h")}
