"""Figures: matplotlib off-screen, each written in the format its file name asks for, all at once."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from swapdsl.common.atomic import check_suffix, write_bytes_atomically
from swapdsl.common.errors import SwpError

# matplotlib stamps these with the time of drawing: left out, the same figure is the same bytes
_UNDATED = {"pdf": {"CreationDate": None, "ModDate": None}, "svg": {"Date": None}}


def pyplot(needed_by: str | None) -> Any:
    """matplotlib's pyplot, drawing off-screen; without matplotlib: an error naming what needs it, or None
    where the figure is optional (``needed_by`` None)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        if needed_by is None:
            return None
        raise SwpError(f"{needed_by} needs matplotlib", hints=["pip install 'swapdsl[plot]'"]) from None
    return plt


def plain(text: str) -> str:
    """Text matplotlib draws as written: a `$` would start its mathematical notation (and fail unpaired)."""
    return text.replace("$", r"\$")


def figure_format(path: str | Path) -> str:
    """The format a figure's file name asks for: its suffix (PNG without one)."""
    check_suffix(path, "plot")
    return Path(path).suffix.lower()[1:] or "png"


def save(fig: Any, out: str | Path, what: str, dpi: int) -> None:
    """Write ``fig`` to ``out`` in the format its name asks for, all at once, and close it."""
    import io

    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    try:
        fmt = figure_format(out)
        with plt.rc_context({"svg.hashsalt": "swapdsl"}):  # an SVG's clip-path ids are random without it
            fig.savefig(buf, format=fmt, dpi=dpi, metadata=_UNDATED.get(fmt))
    finally:
        plt.close(fig)
    write_bytes_atomically(out, buf.getvalue(), what)
