"""The host lane on CuPy: host work handed between a CUDA stream and a Python thread.

An update on the host starts after the swap-out that wrote its input and ends before the swap-in that reads
what it made; on CuPy those copies are CUDA stream work. So each piece of host work has a place on a CUDA
stream of its own (the host stream, ordered with the copies by events like any stream): two host functions
(the driver's ``cuLaunchHostFunc``) that are C library calls, not Python, ``sem_post(ready)`` then
``sem_wait(done)``. A worker thread takes the host work in the stream's order: it waits for ``ready``
(outside the GIL), runs the work, and posts ``done``, which lets the stream on. So the driver's thread never
runs Python (no GIL, no garbage collection that could free a CUDA object there), and a CUDA graph captures
the two calls as host nodes and replays them. An error in host work is kept, the step's later host work
skipped, and raised once the step is done. The host polls for the step's end (``wait``), raising CUDA's own
error where a stream reports one, and then waits for the worker too. (A signal is delivered to the main
thread, which does not block it, so the driver's ``sem_wait`` is not interrupted.)
"""

from __future__ import annotations

import ctypes
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

POLL_S = 0.0002
NOT_READY = 600  # cudaErrorNotReady: the stream still has work
SEM_BYTES = 64  # at least a sem_t (32 bytes with glibc)


def driver() -> Any:
    """The CUDA driver library (every machine that runs CuPy has it)."""
    return ctypes.CDLL("libcuda.so.1")


class HostFuncs:
    """Host work made CUDA stream work; ``current_stream()``: the handle of the stream it is enqueued on."""

    def __init__(self, current_stream: Callable[[], int], lib: Any = None) -> None:
        self.current_stream = current_stream
        self.lib = lib if lib is not None else driver()
        self.libc = ctypes.CDLL(None, use_errno=True)
        self.ready, self.done = ctypes.create_string_buffer(SEM_BYTES), ctypes.create_string_buffer(SEM_BYTES)
        for sem in (self.ready, self.done):
            if self.libc.sem_init(sem, 0, 0) != 0:
                raise OSError(ctypes.get_errno(), "sem_init failed")
        # the host functions: libc's own, called by the driver with the semaphore's address
        self.post, self.block = (ctypes.cast(f, ctypes.c_void_p).value for f in (self.libc.sem_post,
                                                                                 self.libc.sem_wait))
        self.works: list[Callable[[], None]] = []  # in the host stream's order
        self.error: BaseException | None = None
        self.served = self.steps = 0
        self.closing = False
        self.worker = threading.Thread(target=self._serve, name="swapdsl-host-lane", daemon=True)
        self.worker.start()

    def enqueue(self, work: Callable[[], None]) -> Callable[[], None]:
        """``work`` as stream work: run, when called, enqueues its hand-off on the current stream."""
        self.works.append(work)

        def run() -> None:
            stream = ctypes.c_void_p(self.current_stream())
            for fn, sem in ((self.post, self.ready), (self.block, self.done)):
                status = self.lib.cuLaunchHostFunc(stream, ctypes.c_void_p(fn), ctypes.cast(sem, ctypes.c_void_p))
                if status != 0:
                    raise RuntimeError(f"cuLaunchHostFunc failed with CUDA error {status}")

        return run

    def _serve(self) -> None:
        while True:
            self._wait(self.ready)
            if self.closing:
                return
            work = self.works[self.served % len(self.works)]
            if self.error is None:
                try:
                    work()
                except BaseException as exc:  # (raised by the host after the step: ``finish``)
                    self.error = exc
            self.served += 1
            self.libc.sem_post(self.done)

    def _wait(self, sem: Any) -> None:
        while self.libc.sem_wait(sem) != 0:  # (EINTR: a signal; wait again)
            pass

    def finish(self) -> None:
        """After a step's streams are done: wait until the worker has handed back the step's host work (each
        step, eager or replayed, runs every piece once), then raise the error host work met, if any."""
        self.steps += 1
        while self.served < self.steps * len(self.works):
            time.sleep(POLL_S)
        if self.error is not None:
            error, self.error = self.error, None
            raise error

    def close(self) -> None:
        self.closing = True
        self.libc.sem_post(self.ready)
        self.worker.join(timeout=5.0)


def wait(streams: Sequence[Any], status: Callable[[Any], int], between: Callable[[], None] | None = None) -> None:
    """Wait for ``streams`` by polling ``status(stream)`` (0 done, ``NOT_READY`` busy), never blocking in CUDA
    (where the GIL may be held); ``between`` runs at each poll. Another status is the stream's CUDA error:
    ``synchronize`` raises it with CUDA's message."""
    pending = list(streams)
    while True:
        if between is not None:
            between()
        for s in list(pending):
            code = status(s)
            if code == 0:
                pending.remove(s)
            elif code != NOT_READY:
                s.synchronize()
                raise RuntimeError(f"a CUDA stream reported error {code}")
        if not pending:
            return
        time.sleep(POLL_S)


def cuda_status(cupy: Any) -> Callable[[Any], int]:
    """A CuPy stream's status: ``cudaStreamQuery``'s code, unchecked."""
    return lambda s: cupy.cuda.runtime.streamQuery(s.ptr)
