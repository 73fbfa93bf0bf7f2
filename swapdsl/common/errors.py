"""Source spans and user-facing errors, rendered rustc style."""

from __future__ import annotations

import errno
import os
import unicodedata
from pathlib import Path

import attrs


@attrs.frozen
class Span:
    """A region of one source file; lines and columns count from 1."""

    file: str
    line: int
    col: int
    end_line: int
    end_col: int

    @staticmethod
    def point(file: str, line: int, col: int) -> Span:
        return Span(file, line, col, line, col + 1)

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.col}"


class SwpError(Exception):
    """A mistake in the user's input: reported without a traceback, exit code 2."""

    def __init__(
        self,
        message: str,
        span: Span | None = None,
        hints: tuple[str, ...] | list[str] = (),
        notes: tuple[str, ...] | list[str] = (),
    ) -> None:
        super().__init__(message)
        self.message = message
        self.span = span
        self.hints = (hints,) if isinstance(hints, str) else tuple(hints)  # (one hint given as text is one)
        self.notes = (notes,) if isinstance(notes, str) else tuple(notes)

    def with_span(self, span: Span) -> SwpError:
        """The same error, placed at ``span`` if it has no place yet."""
        if self.span is None:
            self.span = span
        return self

    def render(self, sources: dict[str, str] | None = None) -> str:
        lines = [f"error: {self.message}"]
        if self.span is not None:
            lines += _render_span(self.span, sources or {})
        lines += [f"  = note: {n}" for n in self.notes]
        lines += [f"  = hint: {h}" for h in self.hints]
        return "\n".join(lines)


SHOWN_COLUMNS = 120  # of a source line, around the place an error names


def _source_line(span: Span, sources: dict[str, str]) -> str | None:
    text = sources.get(span.file)
    if text is None:
        try:
            text = Path(span.file).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            return None
    all_lines = text.split("\n")  # (as the parser counts lines: a form feed or U+2028 ends none)
    if 1 <= span.line <= len(all_lines):
        return all_lines[span.line - 1].removesuffix("\r")
    return None


def _render_span(span: Span, sources: dict[str, str]) -> list[str]:
    out = [f" --> {span}"]
    src = _source_line(span, sources)
    if src is None:
        return out
    gutter = " " * len(str(span.line))
    src = src.expandtabs(1)
    end = span.end_col if span.end_line == span.line else len(src) + 1
    width = max(1, min(end, len(src) + 1) - span.col)
    start, stop = _window(src, min(span.col - 1, len(src)))  # (a window on a long line)
    window = src[start:stop]
    before = span.col - 1 - start
    marked = window[before:before + width]
    shown = ("..." if start else "") + window
    # (in terminal cells: a wide character takes two, a combining mark none)
    caret = " " * (_cells(window[:before]) + (3 if start else 0)) + "^" * max(1, _cells(marked))
    shown += "..." if stop < len(src) else ""
    out += [f"{gutter} |", f"{span.line} | {shown}", f"{gutter} | {caret}"]
    return out


def _window(src: str, at: int) -> tuple[int, int]:
    """The characters of ``src`` shown around index ``at``: at most SHOWN_COLUMNS terminal cells, half of
    them before it where the line allows, the rest after it (and before it again at the line's end)."""
    cells = [_cell(c) for c in src]
    start, stop, room = at, at, SHOWN_COLUMNS // 2
    while start > 0 and cells[start - 1] <= room:
        start, room = start - 1, room - cells[start - 1]
    room += SHOWN_COLUMNS - SHOWN_COLUMNS // 2
    while stop < len(src) and cells[stop] <= room:
        stop, room = stop + 1, room - cells[stop]
    while start > 0 and cells[start - 1] <= room:
        start, room = start - 1, room - cells[start - 1]
    return start, stop


def _cell(c: str) -> int:
    """How many terminal cells a character takes: none for a mark or a format character (a Thai vowel sign,
    a combining accent, a zero-width joiner), two for a wide character."""
    return 0 if unicodedata.category(c) in ("Mn", "Me", "Cf") else 2 if unicodedata.east_asian_width(c) in "WF" else 1


def _cells(text: str) -> int:
    return sum(map(_cell, text))


# what the system says of a path itself, not of the program: a name too long, a loop of links, no permission
PATH_ERRNOS = frozenset({errno.ENAMETOOLONG, errno.ELOOP, errno.EACCES, errno.EPERM, errno.ENOTDIR})


def path_refused(err: BaseException) -> SwpError | None:
    """``err`` as a user's mistake where the system refused a path it names (None: any other error)."""
    if not isinstance(err, OSError) or err.errno not in PATH_ERRNOS or err.filename is None:
        return None
    name = os.fsdecode(err.filename)
    shown = name if len(name) <= 120 else f"{name[:60]}...{name[-40:]}"
    hints = ["each part of a path may be 255 bytes at most"] if err.errno == errno.ENAMETOOLONG else []
    return SwpError(f"`{shown}`: {err.strerror}", hints=hints)


def did_you_mean(name: str, candidates: list[str] | tuple[str, ...] | set[str]) -> list[str]:
    """A "did you mean" hint for ``name`` among ``candidates``, or nothing."""
    import difflib

    same = [c for c in sorted(candidates) if c.lower() == name.lower()]  # (F32 is f32, whatever is close)
    close = same or difflib.get_close_matches(name, sorted(candidates), n=1, cutoff=0.6)
    return [f"did you mean `{close[0]}`?"] if close else []
