"""The `swapdsl` command's entry point: a Ctrl-C while the libraries load (NumPy, ml_dtypes, Lark: about
0.3 s) exits 130 like one at any later moment, not with the import's traceback."""

from __future__ import annotations

import sys


def main() -> int:
    try:
        from swapdsl.cli import main as run
    except KeyboardInterrupt:
        print("swapdsl: interrupted", file=sys.stderr)
        return 130
    return run()
