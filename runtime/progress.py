"""What a training run looks like on the command line: one line rewritten in place on a terminal (step,
epoch, loss, reports, examples per second, time left), or one line per step when the output is a file;
evaluations and checkpoints on lines of their own."""

from __future__ import annotations

import sys
import time
from typing import TextIO

from swapdsl.common.units import format_bytes
from swapdsl.runtime.training import EvalRecord, SaveRecord, StepRecord


class Progress:
    """``live``: rewrite one line (default: when ``out`` is a terminal); else a line every ``every`` steps
    (about 25 lines a run; ``--log`` has them all) and at the last."""

    def __init__(self, last_step: int, per_epoch: int | None, out: TextIO | None = None,
                 live: bool | None = None, every: int = 1) -> None:
        out = sys.stdout if out is None else out
        self.last, self.per_epoch, self.out, self.every = last_step, per_epoch, out, every
        self.live = out.isatty() if live is None else live
        self.width = len(str(last_step))
        self.started: float | None = None
        self.first: int | None = None
        self.examples = 0
        self.aside = 0.0  # seconds of checking, evaluating and saving: not training, so not in ex/s
        self.shown = 0.0
        self.pending = False  # a live line is on screen without its newline

    def step(self, r: StepRecord) -> None:
        now, checking = time.perf_counter(), (r.check_ms or 0.0) / 1e3
        if self.started is None:  # the first step's time counts from its start
            self.started, self.first = now - r.step_ms / 1e3 - checking, r.step
        self.examples += r.examples
        self.aside += checking
        elapsed = now - self.started
        done = r.step - (self.first or r.step) + 1
        rate = self.examples / (elapsed - self.aside) if elapsed > self.aside else 0.0
        eta = (self.last - r.step) * elapsed / done
        epoch = f"  epoch {r.epoch}/{-(-self.last // self.per_epoch)}" if r.epoch and self.per_epoch else ""
        figures = "".join(f"  {k} {v:.4f}" for k, v in r.metrics.items())
        diff = f"  max rel diff {r.diff:.2e} ({r.diff_at})" if r.diff is not None else ""
        line = (f"  step {r.step:>{self.width}}/{self.last}{epoch}  loss {r.loss:.6f}{figures}  "
                f"{r.step_ms:8.1f} ms  {rate:,.0f} ex/s")
        if self.live:
            if now - self.shown >= 0.1 or r.step == self.last:
                self.out.write(f"\r\033[K{line}  ETA {_clock(eta)}{diff}")
                self.out.flush()
                self.shown, self.pending = now, True
        elif (r.step - (self.first or r.step)) % self.every == 0 or r.step == self.last:
            print(line + diff, file=self.out, flush=True)

    def evaluation(self, r: EvalRecord) -> None:
        self.aside += r.eval_ms / 1e3
        figures = "".join(f"  {k} {v:.4f}" for k, v in r.metrics.items())
        dropped = f", {r.dropped} in a partial batch left out" if r.dropped else ""
        self._line(f"  eval after step {r.step}: loss {r.loss:.6f}{figures}  ({r.examples} held-out examples"
                   f"{dropped}, {r.eval_ms:.0f} ms)")

    def save(self, r: SaveRecord) -> None:
        self.aside += r.write_ms / 1e3
        self._line(f"  saved step {r.step} to {r.path} ({format_bytes(r.nbytes)} in {r.write_ms:.0f} ms)")

    def close(self) -> None:
        if self.pending:
            self.out.write("\n")
            self.pending = False

    def _line(self, text: str) -> None:
        self.close()
        print(text, file=self.out, flush=True)


def _clock(seconds: float) -> str:
    s = int(round(seconds))
    h, rest = divmod(s, 3600)
    return f"{h}:{rest // 60:02d}:{rest % 60:02d}" if h else f"{rest // 60}:{rest % 60:02d}"
