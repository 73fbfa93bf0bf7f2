"""Where the grammar and the stdlib live, installed or in a source checkout."""

from __future__ import annotations

from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent.parent  # swapdsl/


def _data_dir(name: str) -> Path:
    # In a wheel, grammar/ and stdlib/ are installed inside the package; in a
    # checkout (editable install, or tests run from the tree) they sit beside it.
    inside = _PACKAGE / name
    return inside if inside.is_dir() else _PACKAGE.parent / name


GRAMMAR_DIR = _data_dir("grammar")
STDLIB_DIR = _data_dir("stdlib")
