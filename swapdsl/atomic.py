"""Writing a file all at once or not at all."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from swapdsl.errors import SwpError


def write_text_atomically(path: str | Path, text: str, what: str = "file") -> None:
    """A temporary file in the same folder, flushed, then renamed over the target."""
    target = Path(path)
    if target.is_dir():
        raise SwpError(f"`{path}` is a directory; give a file name for the {what}")
    folder = target.parent if str(target.parent) else Path(".")
    if not folder.is_dir():
        raise SwpError(f"cannot write `{path}`: folder `{folder}` does not exist")
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
