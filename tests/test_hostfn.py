"""The host lane on CuPy (runtime/hostfn.py), on a stand-in for the CUDA driver: each piece of host work is
enqueued as a host function on the current stream, stays callable for every replay of a captured step,
and an error in it is kept and raised after the step. A GPU run checks the real driver
(tests/test_runtime.py)."""

from __future__ import annotations

from typing import Any

import pytest

from swapdsl.runtime import hostfn
from swapdsl.runtime.hostfn import HostFuncs


class Driver:
    """``cuLaunchHostFunc`` as the driver takes it: the stream, the function and its argument, kept so that
    a test calls them when the stream gets there (and again, as a graph's replays do)."""

    def __init__(self, status: int = 0) -> None:
        self.status = status
        self.launched: list[tuple[int, Any]] = []

    def cuLaunchHostFunc(self, stream: Any, fn: Any, arg: Any) -> int:  # noqa: N802
        assert arg is None
        self.launched.append((stream.value, fn))
        return self.status


def test_host_work_is_a_host_function_on_the_current_stream_for_every_replay() -> None:
    ran: list[str] = []
    driver = Driver()
    fns = HostFuncs(lambda: 77, driver)
    runs = [fns.enqueue(lambda n=n: ran.append(n)) for n in ("count the step", "adam")]
    for run in runs:
        run()
    assert [s for s, _ in driver.launched] == [77, 77] and ran == []  # (enqueued: nothing runs on the host yet)
    for _ in range(3):  # the stream reaches them (eagerly, then each replay calls the same functions)
        for _, fn in driver.launched:
            fn(None)
    assert ran == ["count the step", "adam"] * 3 and len(fns.kept) == 2
    fns.raise_error()  # (none)


def test_an_error_in_host_work_skips_the_rest_and_is_raised_after_the_step() -> None:
    ran: list[str] = []
    driver = Driver()
    fns = HostFuncs(lambda: 5, driver)

    def broken() -> None:
        raise ValueError("a host kernel failed")

    for run in (fns.enqueue(broken), fns.enqueue(lambda: ran.append("after"))):
        run()
    for _, fn in driver.launched:
        fn(None)  # (a driver thread: nothing may propagate from here)
    assert ran == []
    with pytest.raises(ValueError, match="a host kernel failed"):
        fns.raise_error()
    fns.raise_error()  # (raised once)
    driver.launched[1][1](None)
    assert ran == ["after"]


def test_a_launch_the_driver_refuses_is_an_error_at_once() -> None:
    fns = HostFuncs(lambda: 5, Driver(status=900))
    with pytest.raises(RuntimeError, match="cuLaunchHostFunc failed with CUDA error 900"):
        fns.enqueue(lambda: None)()


def test_the_wait_polls_every_stream_until_each_is_done() -> None:
    class Stream:
        def __init__(self, busy: int) -> None:
            self.busy, self.queries = busy, 0

        @property
        def done(self) -> bool:
            self.queries += 1
            return self.queries > self.busy

    streams = [Stream(0), Stream(3)]
    hostfn.wait(streams)
    assert streams[1].queries == 4
