"""The host lane on CuPy: each host op a host function on a CUDA stream of its own.

An update on the host starts after the swap-out that wrote its input and ends before the swap-in that reads
what it made; on CuPy those copies are CUDA stream work. So each piece of host work is enqueued as a host
function (the driver's ``cuLaunchHostFunc``) on the host stream: that stream waits for the copies' events
before it, and the event recorded after it releases the copies that wait for it, all in CUDA's own order,
which a CUDA graph captures as host nodes and replays. ctypes, not CuPy's ``launch_host_func``: CuPy lets go
of its callback after one call, and a graph calls it at every replay, so these callbacks live as long as
the runner. A host function runs on a driver thread and must make no CUDA call (NumPy on pinned host memory
makes none); an error there is kept, the step's later host work skipped, and it is raised once the step is
done (``raise_error``). The thread takes the GIL to run, so the host never blocks in a CUDA wait while
host functions are pending: it polls (``wait``).
"""

from __future__ import annotations

import ctypes
import time
from collections.abc import Callable, Sequence
from typing import Any

HOSTFN = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
POLL_S = 0.0002


def driver() -> Any:
    """The CUDA driver library (every machine that runs CuPy has it)."""
    return ctypes.CDLL("libcuda.so.1")


class HostFuncs:
    """Host work made CUDA stream work; ``current_stream()``: the handle of the stream it is enqueued on."""

    def __init__(self, current_stream: Callable[[], int], lib: Any = None) -> None:
        self.current_stream = current_stream
        self.lib = lib if lib is not None else driver()
        self.kept: list[Any] = []  # the callbacks, alive for as long as a captured step may call them
        self.error: BaseException | None = None

    def enqueue(self, work: Callable[[], None]) -> Callable[[], None]:
        """``work`` as stream work: run, when called, enqueues it on the current stream."""

        def call(_: Any) -> None:
            if self.error is not None:
                return  # (the step failed on the host: what follows would read what was never made)
            try:
                work()
            except BaseException as exc:  # (it cannot propagate out of a driver thread)
                self.error = exc

        fn = HOSTFN(call)
        self.kept.append(fn)

        def run() -> None:
            status = self.lib.cuLaunchHostFunc(ctypes.c_void_p(self.current_stream()), fn, None)
            if status != 0:
                raise RuntimeError(f"cuLaunchHostFunc failed with CUDA error {status}")

        return run

    def raise_error(self) -> None:
        """The error host work met in the step just waited for, if any (then cleared)."""
        if self.error is not None:
            error, self.error = self.error, None
            raise error


def wait(streams: Sequence[Any]) -> None:
    """Wait for ``streams`` without blocking in CUDA (which may hold the GIL a host function needs)."""
    while not all(s.done for s in streams):
        time.sleep(POLL_S)
