"""Solver calls in child processes (common/children.py): a result comes back, an overrun is killed at its
deadline, an error is raised in the parent, a signal in the parent stops the child at once; and HiGHS's
programs (planning/milp.py) keep to their time through it."""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time

import pytest

from swapdsl.common.children import call_apart
from swapdsl.planning import milp
from swapdsl.planning.milp import TIME_LIMIT, Milp


def test_the_result_comes_back() -> None:
    assert call_apart(sum, ([1, 2, 3],), 30.0) == 6


def test_a_call_past_its_deadline_is_killed() -> None:
    started = time.perf_counter()
    assert call_apart(time.sleep, (60,), 0.5) is None
    assert time.perf_counter() - started < 10
    assert not multiprocessing.active_children()


def test_an_error_in_the_child_is_raised_in_the_parent() -> None:
    with pytest.raises(ValueError, match="invalid literal"):
        call_apart(int, ("x",), 30.0)


def test_a_child_that_dies_is_an_error() -> None:
    with pytest.raises(ChildProcessError, match="exit code 3"):
        call_apart(os._exit, (3,), 30.0)


class _Stop(Exception):
    pass


def test_a_signal_in_the_parent_stops_the_child_at_once() -> None:
    def stop(*_: object) -> None:
        raise _Stop

    previous = signal.signal(signal.SIGUSR1, stop)
    timer = threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGUSR1))
    started = time.perf_counter()
    try:
        timer.start()
        with pytest.raises(_Stop):
            call_apart(time.sleep, (60,), 60.0)
    finally:
        timer.cancel()
        signal.signal(signal.SIGUSR1, previous)
    assert time.perf_counter() - started < 10
    assert not multiprocessing.active_children()


def test_a_solve_that_overruns_its_limit_ends_without_a_solution(monkeypatch: pytest.MonkeyPatch) -> None:
    """What happened with HiGHS: a sub-MIP's presolve ran for minutes past a 3 s time limit."""
    monkeypatch.setattr(milp, "_solve", lambda *_: time.sleep(60))
    monkeypatch.setattr(milp, "GRACE_S", 0.5)
    prog = Milp()
    x = prog.var(integer=True, cost=1.0)
    prog.row({x: 1.0}, lb=1.0)
    started = time.perf_counter()
    res = prog.solve(0.5)
    assert res.status == TIME_LIMIT and res.x is None and res.mip_dual_bound is None
    assert time.perf_counter() - started < 10


def test_a_small_program_is_solved() -> None:
    prog = Milp()
    x, y = prog.var(integer=True, cost=1.0, ub=10), prog.var(integer=True, cost=2.0, ub=10)
    prog.row({x: 1.0, y: 1.0}, lb=3.5)
    res = prog.solve(10.0)
    assert res.status == 0 and res.fun == pytest.approx(4.0)
