"""Data-parallel ranks: the MPI world a run was started in (``mpiexec -n N swapdsl exec ...``).

Only a process an MPI launcher started imports mpi4py (the ``dist`` extra); every other run is one
rank, as before. Rank 0 prints, logs and checkpoints; every rank reads its own rows of each batch.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import sys
from collections.abc import Mapping
from typing import Any

import numpy as np

from swapdsl.common.errors import SwpError
from swapdsl.common.launcher import launched, launched_rank, launched_size
from swapdsl.graph.ir import Graph
from swapdsl.runtime.streams import WAIT_TIMEOUT_S
from swapdsl.runtime.watchdog import DEFAULT_TIMEOUT_S, Watchdog, within

_timeout_s = [DEFAULT_TIMEOUT_S]
_starting = [False]  # this command's ranks meet at start checks that have not all passed yet
_threads_ok = [True]  # the MPI library lets several threads call it at once

@functools.cache
def world() -> Any | None:
    """mpi4py's COMM_WORLD when this process is one of two or more MPI ranks, else None."""
    if not launched():
        return None
    try:
        from mpi4py import MPI
    except ImportError:  # one process, as far as swapdsl can tell: a data-parallel plan is refused (``join``)
        return None
    _threads_ok[0] = MPI.Query_thread() == MPI.THREAD_MULTIPLE  # (the lanes, the watchdog and the main thread)
    return MPI.COMM_WORLD if MPI.COMM_WORLD.Get_size() > 1 else None


def rank() -> int:
    comm = world()
    return 0 if comm is None else comm.Get_rank()


def begin(timeout_s: float) -> None:
    """A command that runs steps on every rank (``exec``) begins: its ranks will meet at the start checks
    (``join``, ``agree``), and wait ``timeout_s`` in a collective for the others before the run is stopped.
    The watchdog starts here, on every rank (it makes a communicator: a collective)."""
    _timeout_s[0] = timeout_s
    if world() is None:
        return
    if not _threads_ok[0]:
        raise EveryRank("this MPI library runs without MPI_THREAD_MULTIPLE, which data-parallel runs need",
                        hints=["use the MPICH that `pip install 'swapdsl[dist]'` installs, or an MPI built "
                               "with thread support"])
    watchdog()
    host_lane()  # (made here, where every rank comes: making a communicator is a collective)
    _starting[0] = True


def started() -> None:
    """Every start check passed, or the command ended: from here a rank's own error aborts the others
    (``abort_others``)."""
    _starting[0] = False


def failed_at_start(text: str) -> bool:
    """A rank's own error before the start checks passed: the others wait at the next one, so meet them
    there with the error instead of aborting them. True when this rank prints it: the lowest rank that
    has this error (an error every rank hits, such as a missing file, is printed once)."""
    comm = world()
    if comm is None:
        return True
    theirs = _start_gather(comm, ("error", text))
    return next(r for r, (kind, t) in enumerate(theirs) if kind == "error" and t == text) == comm.Get_rank()


def command_lines(text: str | None, timeout_s: float = DEFAULT_TIMEOUT_S) -> tuple[bool, bool]:
    """Whether every rank's command line parsed: ``text`` is this rank's argparse error (None: it parsed;
    "": it printed the help or the version, and exits).
    Under a launcher of several ranks the verdicts are gathered (launched by MPMD, a rank whose line is
    refused would leave the others waiting in their first collective): (stop, print): every rank stops
    when any line was refused, and each distinct error is printed by the lowest rank that has it. Without
    MPI, a rank stops on its own error, which rank 0 prints (every rank has the same line). MPI starts
    here, and its start waits for every rank: a rank that never comes (hung or dead before it) ends the
    run after ``timeout_s`` (``watchdog.within``)."""
    if not launched():
        return text is not None, text is not None
    with within(timeout_s, "the command-line check", launched_rank()):
        comm = world()
        theirs = None if comm is None else comm.allgather(text)
    if theirs is None:  # (no MPI world: one rank)
        return text is not None, text is not None and launched_rank() == 0
    if text is None:
        return any(t is not None for t in theirs), False
    return True, theirs.index(text) == comm.Get_rank()


def starting() -> bool:
    return _starting[0]


def lane_timeout_s(g: Graph) -> float:
    """How long a stream lane may wait for another's event: past the ranks' timeout where a lane may wait
    behind an all-reduce (the watchdog, not the lane, then says which rank is missing)."""
    return max(WAIT_TIMEOUT_S, _timeout_s[0] + 60.0) if g.ranks > 1 else WAIT_TIMEOUT_S


@functools.cache
def watchdog() -> Watchdog | None:
    comm = world()
    return None if comm is None else Watchdog(comm, _timeout_s[0])


@functools.cache
def host_lane() -> Watched | None:
    """The host lane's communicator (all-reduces of host copies), with a watchdog of its own: its
    collectives interleave with the network lane's differently on each rank, but come in the same order
    among themselves, so each lane counts its own."""
    comm = world()
    if comm is None:
        return None
    own = comm.Dup()
    return Watched(own, Watchdog(own, _timeout_s[0]), "host-copy all-reduce")


def at_step(step: int) -> None:
    """The step the next collectives belong to (for the watchdogs' errors)."""
    host = host_lane()
    for dog in (watchdog(), host.dog if host is not None else None):
        if dog is not None:
            dog.at_step(step)


class Watched:
    """The communicator the kernels see (``KernelContext.comm``): mpi4py's, each all-reduce watched."""

    def __init__(self, comm: Any, dog: Watchdog, what: str = "gradient all-reduce") -> None:
        self.comm, self.dog, self.what = comm, dog, what

    def Get_size(self) -> int:  # noqa: N802 (mpi4py's names)
        return int(self.comm.Get_size())

    def Get_rank(self) -> int:  # noqa: N802
        return int(self.comm.Get_rank())

    def Allreduce(self, x: np.ndarray, out: np.ndarray) -> None:  # noqa: N802
        with self.dog.collective(f"{self.what} {self.dog.index + 1}"):
            self.comm.Allreduce(x, out)


def comm_for(g: Graph, lane: str = "net") -> Watched | None:
    """The communicator a step of ``g`` averages its gradients over on ``lane`` (net: the network lane's,
    also the step's own; host: the host lane's), None for one rank."""
    if g.ranks == 1:
        return None
    if lane == "host":
        return host_lane()
    comm, dog = world(), watchdog()
    return Watched(comm, dog) if comm is not None and dog is not None else None


class EveryRank(SwpError):
    """An error every rank raises alike: rank 0 alone prints it."""


class Silent(EveryRank):
    """This rank stops because another stopped at the start, and printed why."""


def join(g: Graph, plan: str = "", backend: str = "") -> None:
    """Refuse, on every rank alike, a run whose ranks are not the plan's or whose ranks run different steps
    (``plan``: the plan's text, when a plan runs: every rank must run its collectives in the same order) or
    on different backends (their collectives are MPI's on NumPy, NCCL's on CuPy)."""
    comm = world()
    size = comm.Get_size() if comm is not None else launched_size()
    if comm is None and size > 1:  # N copies of one run, each writing the same files: refused
        raise EveryRank(f"this process is one of {size} processes an MPI launcher started, and mpi4py is not installed",
                        hints=["pip install 'swapdsl[dist]' (mpi4py and MPICH)", "or run without mpiexec"])
    # every rank meets here before any refusal (one that failed on its own meets them here too)
    odd, theirs = _first_odd(comm, f"{_digest(g, plan)} on {backend}", "plan") if comm is not None else (None, [])
    if g.ranks != size:
        how = f"`mpiexec -n {g.ranks} swapdsl exec ...`" if g.ranks > 1 else "without mpiexec"
        what = "the plan runs" if plan else f"--ranks {g.ranks}{' (the default)' * (g.ranks == 1)} runs the model"
        again = f"or plan again with --ranks {size}" if plan else f"or give --ranks {size}"
        raise EveryRank(f"{what} on {g.ranks} rank{'s' * (g.ranks > 1)} and this run has {size}",
                        hints=[f"run it {how}", again])
    if odd is not None:
        (step, _, other), (first, _, ours) = theirs[odd].partition(" on "), theirs[0].partition(" on ")
        if step == first:
            raise EveryRank(f"rank {odd} runs on {other}, rank 0 on {ours}",
                            hints=["give every rank the same --backend"])
        raise EveryRank(f"rank {odd} runs a different training step from rank 0 (another plan, model or "
                        f"arguments)", hints=["give every rank the same plan file"])


def abort_others(code: int) -> None:
    """End every rank now, after this one's error: a rank that stopped alone would leave the others waiting
    in an all-reduce for ever. (An ``EveryRank`` error needs none: every rank stops at it.)"""
    comm = world()
    if comm is not None:
        sys.stderr.flush()
        comm.Abort(code)


def agree(g: Graph, what: str, mine: str, verb: str = "runs") -> None:
    """Refuse, on every rank alike, a run whose ranks were given different ``what`` (steps, data, seed): a
    rank that stopped early would leave the others waiting in an all-reduce for ever."""
    comm = comm_for(g)
    if comm is None:
        return
    odd, theirs = _first_odd(comm.comm, mine, what)
    if odd is not None:
        raise EveryRank(f"rank {odd} {verb} {what} {theirs[odd]}, rank 0 {theirs[0]}",
                        hints=["give every rank the same command line"])


def _first_odd(comm: Any, mine: str, what: str) -> tuple[int | None, list[str]]:
    """Every rank's ``mine``, gathered, and the first rank whose differs from rank 0's (None: all agree).
    A rank that failed before this check sends its error instead (``failed_at_start``): every other rank
    then stops quietly."""
    theirs = _start_gather(comm, ("ok", mine))
    if any(kind == "error" for kind, _ in theirs):
        raise Silent(f"another rank stopped before the {what} check")
    texts = [t for _, t in theirs]
    return next((r for r, t in enumerate(texts) if t != texts[0]), None), texts


def _start_gather(comm: Any, mine: tuple[str, str]) -> list[tuple[str, str]]:
    with _watched("start check"):
        return list(comm.allgather(mine))


def _digest(g: Graph, plan: str) -> str:
    text = repr((g.name, g.args, g.source_sha256, [(op.op, op.inputs, op.outputs, op.attrs) for op in g.ops], plan))
    return hashlib.sha256(text.encode()).hexdigest()


def shard(g: Graph, batch: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """This rank's rows of a batch ``g.ranks`` times the step's (all of it for one rank)."""
    if g.ranks == 1:
        return dict(batch)
    r = rank()
    out = {}
    for name, value in batch.items():
        rows = g.type_of(name).shape[0]
        out[name] = value[r * rows:(r + 1) * rows]
    return out


def state_digest(values: Mapping[str, np.ndarray]) -> str:
    """A digest of a run's parameters and state (ranks must start from the same)."""
    h = hashlib.sha256()
    for name in sorted(values):
        h.update(name.encode())
        h.update(np.ascontiguousarray(values[name]).view(np.uint8).reshape(-1).data)
    return h.hexdigest()


def mean(value: float, g: Graph) -> float:
    """``value`` averaged over the ranks (a loss: each rank's is over its shard)."""
    return step_sync(value, False, g)[0]


def step_sync(loss: float, stop: bool, g: Graph) -> tuple[float, bool]:
    """After a step, in one all-reduce: the ranks' mean loss, and whether any rank was asked to stop (so that
    every rank stops after the same step)."""
    comm = comm_for(g)
    if comm is None:
        return loss, stop
    both = np.array([loss, float(stop)])
    with comm.dog.collective("end"):
        comm.comm.Allreduce(both.copy(), both)
    return float(both[0]) / comm.Get_size(), bool(both[1])


def _watched(what: str) -> contextlib.AbstractContextManager[None]:
    dog = watchdog()
    return contextlib.nullcontext() if dog is None else dog.collective(what)
