"""Work in child processes that end with the process that started them: the search's scoring workers
(``planning/ga.py``), and solver calls that must stop on time and on a Ctrl-C (``call_apart``).

HiGHS does not always keep to its time limit (a sub-MIP's presolve ran for minutes past a 3 s limit),
and while it runs, Python holds a Ctrl-C or SIGTERM until it returns. Run in a child, a solve that
overruns is killed, and the signal is handled at once."""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any, TypeVar

T = TypeVar("T")


def die_with(parent: int) -> None:
    """A child ends when ``parent`` ends, however it ends (even by SIGKILL), and leaves Ctrl-C and SIGTERM
    to it: the parent decides when its children stop."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if sys.platform.startswith("linux"):
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: the kernel kills this child when its parent dies
    if os.getppid() != parent:  # the parent died before the line above took effect
        os._exit(1)


def call_apart(fn: Callable[..., T], args: tuple[Any, ...], deadline_s: float) -> T | None:
    """``fn(*args)`` in a child process: its result (picklable), or None when it has not returned within
    ``deadline_s`` (the child is then killed). An exception in ``fn`` is raised here; a Ctrl-C or SIGTERM
    here kills the child. The child is forked where the system can (so a script that calls swapdsl
    needs no ``if __name__ == "__main__"``; no solver runs in the parent, so none of its threads is
    lost in the fork); a process that may not have children (a daemon) calls ``fn`` itself."""
    if multiprocessing.current_process().daemon:
        return fn(*args)
    ctx = multiprocessing.get_context("fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn")
    receive, send = ctx.Pipe(duplex=False)
    child = ctx.Process(target=_serve, args=(send, os.getpid(), fn, args), daemon=True)
    child.start()
    send.close()
    try:
        if not receive.poll(deadline_s):
            return None
        ok, value = receive.recv()
    except EOFError:  # (its pipe closes before it is reaped: wait for its exit code)
        child.join(5.0)
        raise ChildProcessError(f"a solver's process ended with exit code {child.exitcode}") from None
    finally:
        if child.is_alive():
            child.kill()
        child.join()
        receive.close()
    if not ok:
        raise value
    return value


def _serve(send: Connection, parent: int, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
    die_with(parent)
    try:
        result = (True, fn(*args))
    except Exception as err:  # (sent back whole, raised in the parent)
        result = (False, err)
    send.send(result)
    send.close()
