"""A training run's log (``exec --log FILE.jsonl``: one JSON object per step, evaluation and checkpoint),
appended a whole line at a time, read back and drawn: loss and each report against the step, evaluations as
points."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from swapdsl.common.drawing import plain, pyplot, save
from swapdsl.common.errors import Span, SwpError

EVENTS = ("step", "eval", "save")


RECORD_START = b'{"event": '  # how every line `exec --log` writes begins


def open_log(path: str) -> BinaryIO:
    """The log, opened to append. A file that is not empty must be a log `exec` wrote (``check_log``): any
    other file is refused, neither appended to nor cut. A last record left incomplete (a run killed while
    writing it: a cut line, or the zeros a crash leaves) is cut off, one whole but for its newline ended.
    Appends and this repair hold the file's lock where the file system has locks, so runs sharing a log
    lose no line."""
    try:
        f = open(path, "a+b", buffering=0)  # noqa: SIM115  (the caller closes it)
    except OSError as exc:
        raise SwpError(f"cannot write the log `{path}`: {exc.strerror or exc}") from None
    try:
        with _locked(f):
            end, tail = _judged(f, path)
            if tail and _whole(tail.decode("utf-8", "replace")):
                os.write(f.fileno(), b"\n")
            elif tail:
                os.ftruncate(f.fileno(), end)
    except BaseException:
        f.close()
        raise
    return f


def check_log(path: str) -> None:
    """Refuse, before a run, a ``--log`` that is a file `exec` did not write, or one `plot-log` would refuse
    (every whole line is read and checked as a record; read only: every rank may)."""
    if not os.path.isfile(path):
        return
    with open(path, "rb") as f:
        end, tail = _judged(f, path)
        f.seek(0)
        n = 0
        try:
            while f.tell() < end:  # (a line at a time: a long log is not held in memory)
                n += 1
                _record(f.readline().decode("utf-8"), path, n)
            if tail and _whole(tail.decode("utf-8", "replace")):  # (open_log ends it: it becomes a record)
                n += 1
                _record(tail.decode("utf-8"), path, n)
        except (OSError, UnicodeDecodeError, SwpError) as exc:
            why = exc.message if isinstance(exc, SwpError) else f"line {n} is not UTF-8 text"
            raise SwpError(f"`{path}` is not a log `swapdsl exec --log` wrote, so it is not appended to: {why}",
                           exc.span if isinstance(exc, SwpError) else None,
                           hints=["give --log a new file, or a log an earlier run wrote"]) from None


def _judged(f: BinaryIO, path: str) -> tuple[int, bytes]:
    """Where the log's last whole line ends and what follows it (a torn record, or nothing), or an error
    where the file is not a log `exec` wrote: its first whole line, and what follows the last, begin as
    its records do (what follows may also be a torn start of one, or zeros)."""
    try:
        size = os.fstat(f.fileno()).st_size
        end = _last_line_end(f, size)
        f.seek(0)
        head = f.read(len(RECORD_START))
        f.seek(end)
        tail = f.read()
    except OSError as exc:
        raise SwpError(f"cannot read the log `{path}`: {exc.strerror or exc}") from None
    torn = tail.lstrip(b"\0")
    if (end and head != RECORD_START) or not (torn.startswith(RECORD_START) or RECORD_START.startswith(torn)):
        raise SwpError(f"`{path}` is not a log `swapdsl exec --log` wrote, so it is not appended to",
                       hints=["give --log a new file, or a log an earlier run wrote"])
    return end, tail


# file systems without locks (NFS without its lock daemon, Lustre mounted noflock): the log goes unlocked
_NO_LOCKS = (errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL)


@contextlib.contextmanager
def _locked(f: BinaryIO) -> Iterator[None]:
    try:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        locked = True
    except OSError as exc:
        if exc.errno not in _NO_LOCKS:
            raise SwpError(f"cannot lock the log `{f.name!s}`: {exc.strerror or exc}") from None
        locked = False
    try:
        yield
    finally:
        if locked:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def _last_line_end(r: BinaryIO, size: int, chunk: int = 1 << 16) -> int:
    """Where the last whole line of a file of ``size`` bytes ends (0: none)."""
    at = size
    while at > 0:
        start = max(0, at - chunk)
        r.seek(start)
        found = r.read(at - start).rfind(b"\n")
        if found >= 0:
            return start + found + 1
        at = start
    return 0


def append(log: BinaryIO, record: dict) -> None:
    """One record, as one line, written whole or not at all (a full disk leaves the log as it was)."""
    data = (json.dumps(record) + "\n").encode("utf-8")
    fd = log.fileno()
    with _locked(log):
        at = os.fstat(fd).st_size
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
        except OSError as exc:
            try:
                os.ftruncate(fd, at)
            except OSError:
                pass
            raise SwpError(f"cannot write the log `{log.name!s}`: {exc.strerror or exc}",
                           hints=["the log holds every record before this one; free some space (with --save, "
                                  "--resume from its checkpoint)"]) from None


def read_log(path: str, notes: list[str] | None = None) -> list[dict]:
    """The log's records, each checked for what the plot reads; a bad line is an error at that line. A
    step or evaluation logged again (a resumed run repeats the steps after its checkpoint; a run started
    over, all of them) is taken as logged last, which ``notes`` says."""
    if Path(path).exists() and not Path(path).is_file():
        raise SwpError(f"the log `{path}` is not a regular file")
    try:
        text = Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise SwpError(f"the log `{path}` is not text (byte {exc.start} is not UTF-8)",
                       hints=["give the JSON-lines file `swapdsl exec --log FILE` wrote"]) from None
    except OSError as exc:
        raise SwpError(f"cannot read the log `{path}`: {exc.strerror or exc}") from None
    lines = text.splitlines()
    if lines and not text.endswith("\n") and not _whole(lines[-1]):  # (a run stopped while writing it)
        lines.pop()
        if notes is not None:
            notes.append(f"the last line of `{path}` is incomplete (a run stopped while writing it): left out")
    records = [r for n, line in enumerate(lines, 1) if (r := _record(line, path, n)) is not None]
    if not any(r["event"] == "step" for r in records):
        raise SwpError(f"the log `{path}` holds no training steps")
    latest = {(r["event"], r["step"]): r for r in records}
    if len(latest) < len(records) and notes is not None:
        notes.append(f"{len(records) - len(latest)} records of steps logged again (a resumed or repeated run) "
                     "are drawn as logged last")
    return sorted(latest.values(), key=lambda r: (r["step"], EVENTS.index(r["event"])))


def _record(line: str, path: str, n: int) -> dict | None:
    """Line ``n`` of the log as the record it holds (None for a blank line), each field the plot reads
    checked (a loss may be NaN or infinite: `--on-nonfinite continue` logs it), or an error at that line."""
    if not line.strip():
        return None
    try:
        r = json.loads(line)
    except json.JSONDecodeError as exc:
        raise SwpError(f"not a JSON object: {exc.msg}", Span.point(path, n, exc.colno)) from None
    except ValueError:  # (an integer of more digits than Python converts)
        raise SwpError("not a record of `swapdsl exec --log`: a number too long to read",
                       Span.point(path, n, 1)) from None
    except RecursionError:
        raise SwpError("not a record of `swapdsl exec --log`: nested too deeply", Span.point(path, n, 1)) from None
    if not (isinstance(r, dict) and r.get("event") in EVENTS and isinstance(r.get("step"), int)
            and not isinstance(r["step"], bool) and r["step"] >= 1
            and (r["event"] == "save" or (_number(r.get("loss")) and isinstance(r.get("metrics"), dict)
                                          and all(map(_number, r["metrics"].values()))))):
        raise SwpError("not a record of `swapdsl exec --log`", Span.point(path, n, 1),
                       hints=['each line is {"event": "step"|"eval"|"save", "step": N (1 or more), "loss": X, '
                              '"metrics": {...}, ...}'])
    return r


def _whole(line: str) -> bool:
    try:
        json.loads(line)
        return True
    except (ValueError, RecursionError):
        return False


def _number(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def plot_log(records: list[dict], out: str, title: str = "") -> None:
    """Loss (and, below it, each report) against the step; evaluations as points. Written atomically."""
    plt = pyplot("plot-log")
    steps = [r for r in records if r["event"] == "step"]
    evals = [r for r in records if r["event"] == "eval"]
    names = sorted({k for r in steps + evals for k in r["metrics"]})
    fig, axes = plt.subplots(1 + len(names), 1, figsize=(8, 3 + 2 * len(names)), sharex=True, squeeze=False)
    for ax, key in zip(axes[:, 0], ["loss", *names]):
        def value(r: dict) -> float | None:
            return r["loss"] if key == "loss" else r["metrics"].get(key)

        pts = [(r["step"], value(r)) for r in steps if value(r) is not None]
        ax.plot([s for s, _ in pts], [v for _, v in pts], color="#4c72b0", linewidth=1, label="training")
        held = [(r["step"], value(r)) for r in evals if value(r) is not None]
        if held:
            ax.plot([s for s, _ in held], [v for _, v in held], "o-", color="#c44e52", label="held out")
        ax.set_ylabel(key)
        ax.grid(alpha=0.3)
        ax.legend(loc="best")
    axes[0, 0].set_title(plain(title))
    axes[-1, 0].set_xlabel("step")
    fig.tight_layout()
    save(fig, out, "plot", dpi=100)
