"""Choosing the array module: NumPy everywhere, CuPy where a CUDA GPU is present."""

from __future__ import annotations

from types import ModuleType

import numpy as np

from swapdsl.errors import SwpError

BACKENDS = ("auto", "numpy", "cupy")


def cupy_available() -> bool:
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # no CuPy, no driver, or no device: all mean "not here"
        return False


def array_module(name: str) -> tuple[str, ModuleType]:
    """(backend name, its array module) for ``auto``, ``numpy`` or ``cupy``."""
    if name not in BACKENDS:
        raise SwpError(f"unknown backend `{name}`", hints=[f"backends: {', '.join(BACKENDS)}"])
    if name == "numpy" or (name == "auto" and not cupy_available()):
        return "numpy", np
    if not cupy_available():
        raise SwpError("the cupy backend needs CuPy and a CUDA GPU, and none was found",
                       hints=["install the gpu extra (pip install 'swapdsl[gpu]') or use --backend numpy"])
    import cupy

    return "cupy", cupy


def synchronize(xp: ModuleType) -> None:
    """Wait for queued device work (a no-op on NumPy), so timings are honest."""
    if xp is not np:
        xp.cuda.get_current_stream().synchronize()


def to_host(a: object) -> np.ndarray:
    return a.get() if hasattr(a, "get") else np.asarray(a)
