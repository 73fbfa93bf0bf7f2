"""The plan: everything `exec` needs to run a training step under a memory cap.

A plan holds the model's identity, the device profile, the cap (the size of
the one device arena), every tensor (bytes, kind, and for inputs and
persistent tensors where it lives when an iteration starts), every op (with
its modelled time), and the program: one ordered list of instructions for the
three streams. A tensor on the device occupies a region of the arena: a byte
offset and its size rounded up to 256 bytes.

- ``Run(op, outs)``: the compute stream runs op ``op``; each output goes to a
  region. An ``in_place`` output reuses the region of the op's first input,
  whose last use this is (optimiser updates).
- A run of a collective op (``NET_OPS``: a data-parallel gradient's
  all-reduce) goes on the network lane, a stream of its own beside compute,
  so it overlaps the ops after it; what reads its output waits for it, and
  its input's region is not freed or written over before it is done.
- ``Run(op, outs, recompute=True)`` (``recompute`` in the file): op ``op`` runs
  again, after its first run, to rebuild outputs that were dropped from the
  device; its inputs must be on the device then (resident, swapped in or
  themselves rebuilt). It reads them without using up a read, and it gives the
  same values: its inputs are the same tensors, and the only randomness,
  dropout, hashes (op seed, step, element), all three the same within a step;
  batch statistics come from the same input. It may work in place, as the
  first run did, over a first input rebuilt for it. Instructions that name op
  ``op`` in ``after`` mean its latest run at that point of the program.
- ``SwapIn(t, region, after, before)``: host -> device copy of ``t`` into
  ``region``; it may start once op ``after`` has finished (-1: the iteration's
  start) and must be complete before op ``before`` starts.
- ``SwapOut(t, after)``: device -> host copy of ``t``, once op ``after`` has
  finished. The region stays ``t``'s until a ``Free``.
- ``Free(t, after)``: ``t`` gives up its region once op ``after`` has finished
  and any swap-out of ``t`` is complete. If ``t`` is still needed, it lives
  on in its host copy.
- ``HostRun(op)`` (``host`` in the file): the host lane runs op ``op`` (an
  optimiser update moved off the device, ``graph/offload.py``) on host memory:
  its inputs must be on the host, where their copies have landed; its outputs
  take host memory (a new value of a persistent tensor, its old value's); it
  starts once the copies that wrote its inputs are done and, where it writes
  over host memory, once every swap-in reading that memory is.

The list is in issue order: every instruction comes after those it waits for,
so one pass replays it (``replay.py``, which the simulator, the validator and
the runtime all drive).
"""

from __future__ import annotations

import enum
import itertools
from collections.abc import Iterable
from typing import Union

import attrs

from swapdsl.devices.profiles import Device
from swapdsl.common.units import ALIGN, arena_bytes  # noqa: F401  (re-exported: plans are laid out by these)

HOST = "host"


@attrs.frozen(order=True)
class Region:
    offset: int
    size: int

    @property
    def end(self) -> int:
        return self.offset + self.size

    def overlaps(self, other: Region) -> bool:
        return self.offset < other.end and other.offset < self.end

    def __str__(self) -> str:
        return f"@{self.offset}+{self.size}"


@attrs.frozen
class PlanTensor:
    name: str
    bytes: int
    kind: str  # an ir.Kind value
    home: Region | str | None = None  # inputs and persistent tensors: HOST or a region; others None


@attrs.frozen
class PlanOp:
    index: int
    op: str
    ms: float  # its time on the device (what the ideal step sums, wherever it runs)
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    host_ms: float | None = None  # its time on the host lane, for an op the program runs there


@attrs.frozen
class Run:
    op: int
    outs: tuple[tuple[str, Region], ...]
    in_place: bool = False
    recompute: bool = False  # a second (or later) run that rebuilds dropped outputs


@attrs.frozen
class SwapIn:
    tensor: str
    region: Region
    after: int
    before: int


@attrs.frozen
class SwapOut:
    tensor: str
    after: int


@attrs.frozen
class Free:
    tensor: str
    after: int


@attrs.frozen
class HostRun:
    op: int


Instr = Union[Run, SwapIn, SwapOut, Free, HostRun]


class InstrKind(enum.IntEnum):
    """The instruction kinds, numbered in the order a planner issues those that follow the same op (the
    compiled planner's records use the same numbers: ``_fastplan.INSTR_KINDS``)."""

    LAUNCH = 0  # Run
    SWAP_OUT = 1
    FREE = 2
    SWAP_IN = 3
    HOST = 4  # HostRun: only in plans, after the swap planner (planning/hostlane.py places them)


KIND_OF: dict[type, InstrKind] = {Run: InstrKind.LAUNCH, SwapOut: InstrKind.SWAP_OUT, Free: InstrKind.FREE,
                                  SwapIn: InstrKind.SWAP_IN, HostRun: InstrKind.HOST}


def scratch_offset(cap: int, scratch: int) -> int:
    """The offset of a scratch region of ``scratch`` bytes at the top of an arena of ``cap`` bytes (aligned
    down): the bytes below it are the tensors'. Negative when the scratch does not fit."""
    return (cap - scratch) // ALIGN * ALIGN


NET_OPS = frozenset({"allreduce_mean"})  # ops the network lane runs beside the compute stream (replay.py)


def ideal_ms(op_ms: Iterable[float], on_net: Iterable[bool] = ()) -> float:
    """The iteration time with infinite memory: the compute stream's ops back to back, or the network lane's
    (``on_net``: per op, whether it runs there; none when left out), whichever takes longer."""
    lanes = [0.0, 0.0]
    for ms, net in itertools.zip_longest(op_ms, on_net, fillvalue=False):
        lanes[bool(net)] += float(ms)
    return max(lanes)


@attrs.frozen
class Origin:
    """Where a plan was read from: its file and the line of each statement, for error messages.

    ``lines`` maps a section (``tensor``, ``op``, ``update``, ``program``) to the line of each of its
    entries in order, and a single statement (``cap``, ``loss``, ``device``) to a one-element tuple.
    """

    file: str
    lines: dict[str, tuple[int, ...]] = attrs.field(factory=dict, hash=False)

    def line(self, section: str, index: int = 0) -> int | None:
        """The line of entry ``index`` of ``section``; past the end, the section's last line."""
        found = self.lines.get(section, ())
        return found[min(index, len(found) - 1)] if found and index >= 0 else None


@attrs.frozen
class Plan:
    """A training step's program under a memory cap: the model it is for, the device it was timed on, its
    tensors and ops, the instructions of the three streams (and the host lane) in issue order, and the
    figures its planner recorded. ``swapdsl.optimize`` and ``swapdsl.read`` give one; ``plan/file.py``
    writes and reads it as text."""

    model_path: str
    model_sha256: str
    args: tuple[tuple[str, int | float | bool], ...]
    method: str
    device: Device
    cap: int
    scratch: int  # bytes at the top of the arena for the kernels' temporaries and the runtime's state
    tensors: tuple[PlanTensor, ...]
    ops: tuple[PlanOp, ...]
    loss: str
    updates: tuple[tuple[str, str], ...]  # (persistent tensor, the value that replaces it)
    program: tuple[Instr, ...]
    figures: tuple[tuple[str, float], ...] = ()
    precision: str = "f32"  # the training graph's mixed-precision policy (a `precision` line when not f32)
    guard: str = "none"  # the training graph's guarded step (a `guard` line when not none)
    microbatches: int = 1  # the step's forward and backward passes (a `microbatches` line when not 1)
    ranks: int = 1  # data-parallel ranks running the plan (a `ranks` line, with their link, when not 1)
    link_gbps: float = 0.0
    bucket_mib: float = 0.0  # their gradients' all-reduce buckets (graph/dataparallel.py; 0: one per gradient)
    bucket_members: tuple[int, ...] = ()  # or each gradient's bucket, as a search chose them (a `members` list)
    origin: Origin | None = attrs.field(default=None, eq=False, repr=False)  # set when read from a file

    @property
    def tensor_cap(self) -> int:
        """Where the scratch region starts: every tensor's region ends at or below it."""
        return scratch_offset(self.cap, self.scratch)

    def ideal_ms(self) -> float:
        return ideal_ms((o.ms for o in self.ops), (o.op in NET_OPS for o in self.ops))

    def tensor_map(self) -> dict[str, PlanTensor]:
        return {t.name: t for t in self.tensors}

    def figure(self, name: str) -> float:
        return dict(self.figures)[name]

    def host_copies(self) -> list[str]:
        """The tensors that ever have a host copy, once each, in the order the interpreter lays them out:
        inputs and host-homed persistent tensors, then every tensor swapped out."""
        names = [t.name for t in self.tensors if t.home == HOST or t.kind == "input"]
        names += [i.tensor for i in self.program if isinstance(i, SwapOut)]
        names += [n for i in self.program if isinstance(i, HostRun) and 0 <= i.op < len(self.ops)
                  for n in self.ops[i.op].outputs]
        return list(dict.fromkeys(names))

    def host_slot_owner(self) -> dict[str, str]:
        """Whose host memory each tensor's host copy uses: its own, except that a persistent tensor's new
        value writes into the old value's memory when that has any, so the next step reads it there.

        Host memory belongs to inputs, host-homed persistent tensors, every tensor swapped out and every
        output of a host run."""
        has_memory = set(self.host_copies())
        owner = {t.name: t.name for t in self.tensors}
        for old, new in self.updates:
            if old in has_memory:
                owner[new] = old
        return owner
