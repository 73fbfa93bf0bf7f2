"""Data-parallel collectives on CuPy: NCCL where every rank has a GPU of its own, MPI through pinned host
buffers where ranks share one (NCCL refuses two ranks on one device).

Each rank runs on the GPU whose index is its place among the ranks of its machine, modulo the GPUs it
sees. Every rank gathers every rank's machine, visible GPUs (their PCI bus ids, so that ranks given one
GPU each by ``CUDA_VISIBLE_DEVICES`` are told apart) and whether its CuPy has NCCL, and all ranks take
the same choice from them: a choice made alone would leave one rank in NCCL and another in MPI.

The communicators have the interface the ``allreduce_mean`` kernel calls (mpi4py's ``Allreduce``,
``Get_size``, ``Get_rank``). NCCL's all-reduce is enqueued on the current stream (the network lane's)
and a CUDA graph captures it; the staged one waits on the host for the bucket, so a step that uses it is
issued item by item, never captured.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Sequence
from typing import Any

import numpy as np

from swapdsl.common.errors import SwpError
from swapdsl.common.units import format_bytes
from swapdsl.runtime import hostfn
from swapdsl.runtime.backend import copy_fn, pinned

DTYPES = {"float32": "NCCL_FLOAT32", "float64": "NCCL_FLOAT64"}  # the dtypes a gradient is averaged in


def placements(seen: Sequence[tuple[str, Sequence[str], bool]]) -> list[tuple[int, str]]:
    """Each rank's GPU index and that GPU's machine-wide name (machine/bus id), from every rank's (machine,
    bus ids of the GPUs it sees, has NCCL)."""
    out = []
    for r, (host, buses, _) in enumerate(seen):
        if not buses:
            raise SwpError(f"rank {r} sees no GPU", hints=["run every rank on a machine with a CUDA GPU"])
        local = sum(1 for h, _, _ in seen[:r] if h == host)
        device = local % len(buses)
        out.append((device, f"{host}/{buses[device]}"))
    return out


def choice(seen: Sequence[tuple[str, Sequence[str], bool]]) -> str | None:
    """Why the ranks cannot use NCCL (the same answer on every rank), or None: they can."""
    places = [where for _, where in placements(seen)]
    shared = next((where for where in places if places.count(where) > 1), None)
    if shared is not None:
        ranks = [r for r, where in enumerate(places) if where == shared]
        return f"ranks {', '.join(map(str, ranks))} share GPU {shared}, and NCCL takes one rank per GPU"
    lacking = [r for r, (_, _, has) in enumerate(seen) if not has]
    if lacking:
        return f"rank {lacking[0]}'s CuPy has no NCCL"
    return None


def _nccl(cupy: Any) -> Any | None:
    nccl = getattr(cupy.cuda, "nccl", None)  # (a stand-in in tests carries its own)
    if nccl is None:
        try:
            from cupy.cuda import nccl
        except (ImportError, OSError, RuntimeError):  # no NCCL in this CuPy, or its library would not load
            return None
    return nccl if getattr(nccl, "available", False) else None


def gpu_comm(cupy: Any, watched: Any) -> tuple[Any, str]:
    """The communicator a CuPy step averages its gradients over, on this rank's GPU (made current here,
    before anything is allocated on it), and a note saying which and why. ``watched``: the MPI world as
    ``dist.comm_for`` gives it (its start collectives are watched)."""
    runtime, mpi = cupy.cuda.runtime, watched.comm
    buses = tuple(runtime.deviceGetPCIBusId(d) for d in range(runtime.getDeviceCount()))
    nccl = _nccl(cupy)
    with watched.dog.collective("the GPU placement check"):
        seen = mpi.allgather((socket.gethostname(), buses, nccl is not None))
    rank, size = mpi.Get_rank(), mpi.Get_size()
    device, where = placements(seen)[rank]
    cupy.cuda.Device(device).use()
    why = choice(seen)
    if why is not None:
        return Staged(cupy, watched), f"MPI through host memory ({why})"
    # connect to the peers here, where the wait is watched, not lazily at the first all-reduce (NCCL 2.22+)
    os.environ.setdefault("NCCL_RUNTIME_CONNECT", "0")
    free = runtime.memGetInfo()[0]
    with watched.dog.collective("NCCL's start"):
        uid = mpi.bcast(nccl.get_unique_id() if rank == 0 else None, root=0)
        comm = nccl.NcclCommunicator(size, uid, rank)
    taken = max(0, free - runtime.memGetInfo()[0])  # NCCL's own buffers: outside the plan's cap
    return (Nccl(cupy, nccl, comm, watched),
            f"NCCL on GPU {device} ({where}); its buffers take {format_bytes(taken)} outside the cap")


class Nccl:
    """NCCL's all-reduce on the current stream: asynchronous, captured by a CUDA graph. A rank that hangs
    leaves the others waiting at the step's end, so that wait is watched; NCCL reports its own failures (a
    peer's connection lost) only when asked, and its kernels may then never finish, so the wait asks it
    (``finish``)."""

    capturable = on_device = True

    def __init__(self, cupy: Any, nccl: Any, comm: Any, watched: Any) -> None:
        self.cupy, self.nccl, self.comm, self.watched = cupy, nccl, comm, watched
        self.status = hostfn.cuda_status(cupy)
        self.aborted = False

    def Get_size(self) -> int:  # noqa: N802 (mpi4py's names)
        return self.watched.Get_size()

    def Get_rank(self) -> int:  # noqa: N802
        return self.watched.Get_rank()

    def Allreduce(self, x: Any, out: Any) -> None:  # noqa: N802
        dtype = DTYPES.get(x.dtype.name)
        if dtype is None:
            raise SwpError(f"NCCL all-reduces here take {' or '.join(DTYPES)}, not {x.dtype.name}")
        self.comm.allReduce(x.data.ptr, out.data.ptr, x.size, getattr(self.nccl, dtype), self.nccl.NCCL_SUM,
                            self.cupy.cuda.get_current_stream().ptr)

    def finish(self, streams: Sequence[Any]) -> None:
        """Wait for the step's ``streams``, watched, asking NCCL meanwhile whether it has failed."""
        with self.watched.dog.collective("the step's all-reduces (NCCL's, and any of host copies)"):
            hostfn.wait(streams, self.status, between=self._check)
            self._check()

    def _check(self) -> None:
        try:
            self.comm.check_async_error()
        except self.nccl.NcclError as err:
            self.comm.abort()  # (NCCL's kernels stop waiting for the peer; the communicator is gone)
            self.aborted = True
            raise SwpError(f"NCCL failed in the all-reduces of step {self.watched.dog.step}: {err}",
                           hints=["a rank, its GPU or the network between them failed: see that rank's output, "
                                  "then --resume from the last checkpoint"]) from None

    def all_agree(self, mine: bool) -> bool:
        """Whether every rank says yes: a step's NCCL calls are captured in a CUDA graph on all ranks or on
        none (NCCL's rule for graphs)."""
        with self.watched.dog.collective("the CUDA graph check"):
            return all(self.watched.comm.allgather(mine))

    def close(self) -> None:
        if not self.aborted:
            self.comm.destroy()


class Staged:
    """MPI's all-reduce of a copy in pinned host memory: the host waits for the bucket on the current stream,
    averages it with the other ranks, and enqueues the copy back (``finish``: nothing more to watch)."""

    capturable = False
    on_device = True

    def __init__(self, cupy: Any, watched: Any) -> None:
        self.cupy, self.watched = cupy, watched
        self.status = hostfn.cuda_status(cupy)
        self._buffers: dict[tuple[tuple[int, ...], str], tuple[np.ndarray, np.ndarray]] = {}

    def Get_size(self) -> int:  # noqa: N802
        return self.watched.Get_size()

    def Get_rank(self) -> int:  # noqa: N802
        return self.watched.Get_rank()

    def Allreduce(self, x: Any, out: Any) -> None:  # noqa: N802
        send, recv = self._pair(x)
        stream = self.cupy.cuda.get_current_stream()
        copy_fn(self.cupy, x, send, to_device=False)()
        hostfn.wait([stream], self.status)  # (polled: never blocking in CUDA while the GIL may be held)
        self.watched.Allreduce(send, recv)
        copy_fn(self.cupy, out, recv, to_device=True)()
        hostfn.wait([stream], self.status)  # (recv is reused by the next bucket of this shape)

    def _pair(self, x: Any) -> tuple[np.ndarray, np.ndarray]:
        key = (tuple(x.shape), x.dtype.str)
        if key not in self._buffers:
            what = "a gradient bucket's host copy for MPI"
            self._buffers[key] = tuple(pinned(x.shape, x.dtype, what) for _ in range(2))  # type: ignore[assignment]
        return self._buffers[key]

    def finish(self, streams: Sequence[Any]) -> None:
        hostfn.wait(streams, self.status)  # (each bucket's exchange was already watched, in ``Allreduce``)

    def all_agree(self, mine: bool) -> bool:
        return mine  # (never captured)

    def close(self) -> None:
        self._buffers.clear()
