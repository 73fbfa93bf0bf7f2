"""The host lane on CuPy (runtime/hostfn.py), on a stand-in for the CUDA driver whose stream is a thread: each
piece of host work is a hand-off of two C calls (libc's sem_post and sem_wait, run here as the driver would
run them, with no Python in between) and the worker thread that runs the work in the stream's order. A GPU
run checks the real driver (tests/test_runtime.py)."""

from __future__ import annotations

import ctypes
import threading
import time
from typing import Any

import pytest

from swapdsl.runtime import hostfn
from swapdsl.runtime.hostfn import HostFuncs

HOSTFN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)


class Driver:
    """``cuLaunchHostFunc`` as the driver takes it: each (stream, C function, argument) is queued, and a
    thread (the stream) calls them in order, as the stream reaches them: ``play`` once for an eager step or
    for each replay of a captured one."""

    def __init__(self, status: int = 0) -> None:
        self.status = status
        self.launched: list[tuple[int, int, int]] = []

    def cuLaunchHostFunc(self, stream: Any, fn: Any, arg: Any) -> int:  # noqa: N802
        self.launched.append((stream.value, fn.value, arg.value))
        return self.status

    def play(self) -> threading.Thread:
        calls = list(self.launched)

        def stream() -> None:
            for _, fn, arg in calls:
                HOSTFN(fn)(arg)  # (the C function itself: sem_post or sem_wait)

        thread = threading.Thread(target=stream)
        thread.start()
        return thread


def test_host_work_runs_between_the_streams_hand_offs_in_order_at_every_replay() -> None:
    ran: list[str] = []
    driver = Driver()
    fns = HostFuncs(lambda: 77, driver)
    try:
        runs = [fns.enqueue(lambda n=n: ran.append(n)) for n in ("count the step", "adam")]
        for run in runs:
            run()
        assert len(driver.launched) == 4 and {s for s, _, _ in driver.launched} == {77}
        assert [fn for _, fn, _ in driver.launched] == [fns.post, fns.block] * 2
        for _ in range(3):  # an eager step, then replays of the same four host nodes
            driver.play().join(timeout=10)
            fns.finish()
        assert ran == ["count the step", "adam"] * 3
    finally:
        fns.close()
    assert not fns.worker.is_alive()


def test_the_stream_waits_for_the_host_work() -> None:
    """The stream's second call returns only once the work is done: what follows it on the stream (a copy of
    what the work made) cannot start early."""
    driver = Driver()
    fns = HostFuncs(lambda: 1, driver)
    started, release = threading.Event(), threading.Event()

    def slow() -> None:
        started.set()
        release.wait(10)

    try:
        fns.enqueue(slow)()
        stream = driver.play()
        assert started.wait(10)
        time.sleep(0.05)
        assert stream.is_alive()  # (blocked in sem_wait: the work is not done)
        release.set()
        stream.join(timeout=10)
        assert not stream.is_alive()
        fns.finish()
    finally:
        fns.close()


def test_an_error_in_host_work_skips_the_rest_of_the_step_and_is_raised_after_it() -> None:
    ran: list[str] = []
    driver = Driver()
    fns = HostFuncs(lambda: 5, driver)

    def broken() -> None:
        raise ValueError("a host kernel failed")

    try:
        for run in (fns.enqueue(broken), fns.enqueue(lambda: ran.append("after"))):
            run()
        driver.play().join(timeout=10)  # (the stream still goes on: the work hands back either way)
        with pytest.raises(ValueError, match="a host kernel failed"):
            fns.finish()
        assert ran == []
        driver.play().join(timeout=10)
        with pytest.raises(ValueError, match="a host kernel failed"):  # (each step tries again)
            fns.finish()
    finally:
        fns.close()


def test_a_launch_the_driver_refuses_is_an_error_at_once() -> None:
    fns = HostFuncs(lambda: 5, Driver(status=900))
    try:
        with pytest.raises(RuntimeError, match="cuLaunchHostFunc failed with CUDA error 900"):
            fns.enqueue(lambda: None)()
    finally:
        fns.close()


class Stream:
    def __init__(self, busy: int, error: int = 0) -> None:
        self.busy, self.error = busy, error

    def synchronize(self) -> None:
        raise RuntimeError(f"CUDA error {self.error} (from CUDA)")


def status(s: Stream) -> int:
    if s.error:
        return s.error
    s.busy -= 1
    return 0 if s.busy < 0 else hostfn.NOT_READY


def test_the_wait_polls_every_stream_until_each_is_done_and_raises_a_cuda_error() -> None:
    streams = [Stream(0), Stream(3)]
    polls: list[int] = []
    hostfn.wait(streams, status, between=lambda: polls.append(1))
    assert streams[1].busy == -1 and len(polls) == 4
    with pytest.raises(RuntimeError, match="CUDA error 700"):
        hostfn.wait([Stream(2), Stream(0, error=700)], status)
