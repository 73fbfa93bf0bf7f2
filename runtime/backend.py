"""Choosing the array module: NumPy everywhere, CuPy where a CUDA GPU is present."""

from __future__ import annotations

import contextlib
import functools
import gc
import math
import os
from collections.abc import Callable
from types import ModuleType
from typing import Any

import attrs
import numpy as np

from swapdsl.common.errors import SwpError
from swapdsl.common.units import format_bytes
from swapdsl.graph.ops.blas import workspace_bytes
from swapdsl.graph.ops.halfbits import from_module

BACKENDS = ("auto", "numpy", "cupy")
os.environ.setdefault("CUPY_ACCELERATORS", "")  # before anything imports CuPy (see without_accelerators)


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

    without_accelerators(cupy)
    return "cupy", cupy


def without_accelerators(cupy: Any) -> None:
    """CuPy 14 sends reductions (sum, max, mean with ``out=``) and some routines through CUB and cuTENSOR,
    which take temporaries and workspaces from CuPy's own pool, outside the arena: off for the runtime,
    both as CuPy reads them at import (``CUPY_ACCELERATORS``) and in a process that imported it before."""
    core = getattr(cupy, "_core", None)
    for setter in ("set_routine_accelerators", "set_reduction_accelerators", "set_elementwise_accelerators"):
        if hasattr(core, setter):
            getattr(core, setter)([])


def host_memory_available() -> int | None:
    """Bytes this machine can still give a process (MemAvailable), or None where it cannot tell."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def require_memory(xp: ModuleType, device_bytes: int, host_bytes: int, what: str) -> None:
    """Refuse, before allocating, what this machine cannot hold: on NumPy the device arena is host
    memory too; on CuPy it must fit the GPU's free memory."""
    if xp is np:
        need, have, where = device_bytes + host_bytes, host_memory_available(), "memory available on this machine"
    else:
        gc.collect()  # (a runner closed but not yet collected still holds its arena in CuPy's pool)
        xp.get_default_memory_pool().free_all_blocks()  # (what the pool caches is free to this process)
        need, have, where = device_bytes, int(xp.cuda.runtime.memGetInfo()[0]), "free GPU memory"
        require_memory(np, 0, host_bytes, what)
    if have is not None and need > have:
        raise SwpError(f"{what} needs {format_bytes(need)}, but there is only {format_bytes(have)} of {where}",
                       hints=["a smaller batch, model or --memory cap needs less",
                              "`optimize --host-memory SIZE` plans within a host budget (recomputing instead of "
                              "swapping where it must)"])


@attrs.frozen
class DeviceMemory:
    """What a plan runs in on the device: the arena, exactly its cap, and on CuPy cuBLAS's workspace beside
    it (the size cuBLAS would take itself, taken once: bound to our handle, so no CUDA graph takes another)."""

    arena: Any
    blas_workspace: Any = None

    @property
    def nbytes(self) -> int:
        return int(self.arena.nbytes) + (int(self.blas_workspace.nbytes) if self.blas_workspace is not None else 0)


def device_memory(xp: ModuleType, cap: int, host_bytes: int, what: str) -> DeviceMemory:
    """The device memory of a plan of ``cap`` bytes whose host copies take ``host_bytes``, refused before
    anything is allocated where the machine cannot hold it (``require_memory``)."""
    blas = 0 if xp is np else workspace_bytes(xp)
    said = f"{what} (and cuBLAS's workspace, {format_bytes(blas)})" if blas else what
    require_memory(xp, cap + blas, host_bytes, said)
    arena = xp.zeros(cap, dtype=np.uint8)
    return DeviceMemory(arena, xp.empty(blas, dtype=np.uint8) if blas else None)


def pinned(shape: int | tuple[int, ...], dtype: Any, what: str) -> np.ndarray:
    """Page-locked host memory (CuPy's copies to and from it are asynchronous and a CUDA graph captures
    them), exactly as much as asked: CuPy's pinned pool (``cupyx.empty_pinned``) rounds each block up to a
    power of two, up to twice the host memory a plan counts, and keeps it after a run. A machine that cannot
    pin that much gets an error saying so, not CUDA's out-of-memory, which names no host."""
    import cupy

    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    nbytes = math.prod(shape) * np.dtype(dtype).itemsize
    try:
        memory = cupy.cuda.PinnedMemoryPointer(cupy.cuda.PinnedMemory(nbytes), 0)
    except Exception as err:  # (cudaHostAlloc's failure is a CUDARuntimeError)
        if not _out_of_memory(err):
            raise
        raise SwpError(f"{what}: {format_bytes(nbytes)} of page-locked host memory could not be allocated",
                       hints=["pinned memory comes out of the machine's free memory",
                              "`optimize --host-memory SIZE` plans within a host budget"]) from None
    return np.ndarray(shape, dtype=dtype, buffer=memory)


# (class name, status) of a device library's failure to allocate: CUDA's runtime and driver, cuBLAS (CuPy's
# wrappers' errors and swapdsl's own CublasError alike); CuPy's pool raises its OutOfMemoryError
OUT_OF_MEMORY = {("CUDARuntimeError", 2), ("CUDADriverError", 2), ("CUBLASError", 3), ("CublasError", 3)}


def device_memory_error(err: BaseException) -> SwpError | None:
    """A GPU's out-of-memory failure (CuPy's pool's, CUDA's runtime's or driver's, cuBLAS's) as an error to
    the user; None for anything else. The arena holds the cap from the start, so such a failure is memory
    taken beside it (cuDNN, NCCL, a CUDA graph, a library's handle) or another process's. Pinned host
    memory has its own error (``pinned``)."""
    if not _out_of_memory(err):
        return None
    return SwpError(f"the GPU ran out of memory beside the plan's arena ({err})",
                    notes=["the arena takes exactly the cap; cuBLAS, cuDNN, NCCL and CUDA graphs take a little "
                           "beside it, as may other processes on this GPU"],
                    hints=["plan for a --memory cap that leaves some of the GPU free (`nvidia-smi` shows what "
                           "is in use)"])


def _out_of_memory(err: BaseException) -> bool:
    name = type(err).__name__
    return name == "OutOfMemoryError" or (name, getattr(err, "status", None)) in OUT_OF_MEMORY


def synchronize(xp: ModuleType) -> None:
    """Wait for queued device work (a no-op on NumPy), so timings are honest."""
    if xp is not np:
        xp.cuda.get_current_stream().synchronize()


def separate_pool(xp: ModuleType) -> Callable[[], contextlib.AbstractContextManager[object]]:
    """Contexts in which CuPy allocates from one memory pool of its own (no-ops on NumPy): what runs in
    them is not counted by ``device_bytes_held``."""
    if xp is np or not hasattr(xp, "cuda"):
        return contextlib.nullcontext
    pool = xp.cuda.MemoryPool()
    return lambda: xp.cuda.using_allocator(pool.malloc)


def device_bytes_held(xp: ModuleType, arena: object) -> int:
    """What the process holds on the device now: CuPy's memory pool (every device allocation goes through
    it); on NumPy, whose "device" is host memory, the arena array itself."""
    if xp is np:
        return int(arena.nbytes)  # type: ignore[attr-defined]
    return int(xp.get_default_memory_pool().total_bytes())


def copy_fn(xp: ModuleType, device: Any, host: np.ndarray, to_device: bool) -> Callable[[], None]:
    """One copy between an arena view and a host buffer, as stream work: on CuPy an asynchronous memcpy on
    the current stream (pinned host memory: it never blocks the host, and a CUDA graph can capture it),
    on NumPy ``np.copyto``."""
    if xp is np:
        dst, src = (device, host) if to_device else (host, device)
        return functools.partial(np.copyto, dst, src)
    runtime = xp.cuda.runtime
    kind = runtime.memcpyHostToDevice if to_device else runtime.memcpyDeviceToHost
    dst, src = (device.data.ptr, host.ctypes.data) if to_device else (host.ctypes.data, device.data.ptr)
    nbytes, stream = device.nbytes, xp.cuda.get_current_stream
    return lambda: runtime.memcpyAsync(dst, src, nbytes, kind, stream().ptr)


def to_host(a: object) -> np.ndarray:
    return from_module(a.get() if hasattr(a, "get") else np.asarray(a))  # (bf16 bits seen as bf16 again)
