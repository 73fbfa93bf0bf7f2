"""Adversarial inputs for swapdsl's own checks: mutated plan files, model files and command lines.

The test suite runs a few hundred cases of each; ``bench/mutate_plans.py`` and ``bench/fuzz_models.py``
run as many as asked and print the counts per class.
"""

from __future__ import annotations

import contextlib
import io
import signal
import traceback

import attrs


class _Timeout(BaseException):
    """Raised by the alarm: not an Exception, so nothing on the way up mistakes it for a user error."""


@attrs.frozen
class Outcome:
    """How one in-process run of the command line ended."""

    code: int | None  # the exit code; None: a traceback or a hang
    out: str
    err: str
    crash: str = ""  # the traceback, or "hang"

    @property
    def placed(self) -> bool:
        """The error names a file position (` --> FILE:LINE:COL`)."""
        return any(line.startswith(" --> ") for line in self.err.splitlines())


def run_cli(argv: list[str], limit_s: float | None = None) -> Outcome:
    """``swapdsl ARGV`` in this process, its output captured, stopped after ``limit_s`` seconds."""
    from swapdsl.cli import main

    out, err = io.StringIO(), io.StringIO()

    def alarm(signum: int, frame: object) -> None:
        raise _Timeout

    previous = signal.signal(signal.SIGALRM, alarm) if limit_s else None
    if limit_s:
        signal.setitimer(signal.ITIMER_REAL, limit_s)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(argv)
    except _Timeout:
        return Outcome(None, out.getvalue(), err.getvalue(), "hang")
    except BaseException:  # noqa: BLE001 - a crash is what the fuzzers look for (SystemExit included)
        return Outcome(None, out.getvalue(), err.getvalue(), traceback.format_exc(limit=-4))
    finally:
        if limit_s:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
    return Outcome(code, out.getvalue(), err.getvalue())
