"""The one replay of a plan: what is resident, in flight and on the host at each instruction, and what
each instruction waits for.

The validator, the simulator and the interpreter's set-up each drive a ``Replay`` over the program in
order. Each instruction's ``waits`` are the program indices of the earlier instructions it must follow
(``START``, the iteration's start, is never listed):

- ``run``: whatever made its inputs complete (the op or swap-in that wrote them) and the frees of the
  bytes its outputs take; working in place, the network lane's runs that read the input it overwrites;
- ``swapin``: the run of op ``after``, the frees of its region, and the swap-out that wrote its host copy;
- ``swapout``: the run of op ``after``, whatever made the tensor complete, the host runs that read
  or wrote its host memory since a copy last wrote it, and the swap-ins that read that memory since;
- ``free``: the run of op ``after``, any swap-out of the tensor since it came onto the device, whatever
  made it complete, and the network lane's runs that read it. A new tenant of its bytes waits for all of
  these.
- ``host``: what wrote each input's host memory (a swap-out or another host run), and every swap-in that
  read host memory it writes over since that memory was last written.

A run of a collective op (``program.NET_OPS``) is on the network lane (``Step.stream``), every other run
on the compute stream: the runs the compute stream's order implies are done are not the network lane's,
so what must wait for those is listed (above), and an instruction "after" an all-reduce also waits for
the compute stream's latest run before it (``Replay.after``). Waits on the instruction's own stream are
kept: the stream's order already implies them (the simulator takes them in its maximum, the interpreter
skips them). An index may be listed twice.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator
from typing import NamedTuple

from swapdsl.plan.program import (Free, HOST, HostRun, Instr, InstrKind, KIND_OF, NET_OPS, Plan, PlanTensor, Region,
                                  Run, SwapIn, SwapOut)
from swapdsl.plan.segments import Segments

START = -1  # the iteration's start (an op index of -1 means the same)
STREAM = {InstrKind.LAUNCH: "compute", InstrKind.SWAP_IN: "h2d", InstrKind.SWAP_OUT: "d2h",
          InstrKind.HOST: "host"}  # frees: none; runs of NET_OPS: "net"
Waits = tuple[int, ...]


class Step(NamedTuple):  # (a NamedTuple: a long plan makes one per instruction, and these are cheap)
    """One instruction as replayed: its place in the program, what it waits for, and the regions it uses
    (a run: its inputs' regions in order; a copy or a free: the tensor's region)."""

    index: int
    instr: Instr
    kind: InstrKind
    waits: Waits
    regions: tuple[Region, ...]
    stream: str  # the stream or lane that runs it ("" for a free)


class Replay:
    """The state of a replay in progress. Callers check an instruction against it before applying it:
    the ``apply`` methods trust that the plan is valid up to that instruction."""

    def __init__(self, plan: Plan, overlaps: bool = False) -> None:
        """``overlaps``: keep the index ``tenant`` reads (the validator asks; a valid plan needs no asking)."""
        self.plan = plan
        self.overlaps = overlaps
        self.slot = plan.host_slot_owner()
        self.loc: dict[str, Region] = {}  # tensors on the device (or arriving): their regions
        self._starts: list[int] = []  # those regions' offsets, sorted, with ``_live`` beside them
        self._live: list[tuple[Region, str]] = []
        self.host: dict[str, str] = {}  # host slot -> the tensor whose value it holds
        self.host_written: dict[str, int] = {}  # host slot -> the swap-out or host run that last wrote it
        self.host_read: dict[str, list[int]] = {}  # host slot -> the swap-ins from it since it was written
        self.host_used: dict[str, list[int]] = {}  # host slot -> host runs that read or wrote it since a swap-out
        self.ran: dict[int, int] = {START: START}  # op -> its run's program index
        self.due: dict[str, tuple[int, int]] = {}  # swap-ins not yet read: tensor -> (op due before, index)
        self.ready: dict[str, int] = {}  # tensor on the device -> what made its bytes complete
        self.copied_out: dict[str, int] = {}  # tensor -> its swap-out since it last came onto the device
        # per byte: the run after which it fell free, and what its next tenant waits for
        self.freed: Segments[tuple[int, Waits]] = Segments()
        self.net_reads: dict[str, list[int]] = {}  # tensor -> the network lane's runs that read it
        self.net = {o.index for o in plan.ops if o.op in NET_OPS}
        self.last_compute = START  # the compute stream's latest run
        self.compute_before: dict[int, int] = {}  # network-lane op -> the compute stream's latest run before it
        self._handlers = {InstrKind.LAUNCH: self.launch, InstrKind.SWAP_IN: self.swap_in,
                          InstrKind.SWAP_OUT: self.swap_out, InstrKind.FREE: self.free, InstrKind.HOST: self.host_run}

    # -- queries

    def tenant(self, region: Region) -> tuple[Region, str] | None:
        """A resident tensor whose region overlaps ``region``, if any (with ``overlaps`` set)."""
        i = bisect.bisect_left(self._starts, region.offset)
        for j in (i - 1, i):
            if 0 <= j < len(self._live) and self._live[j][0].overlaps(region):
                return self._live[j]
        return None

    def free_waits(self, region: Region) -> list[int]:
        """What a new tenant of ``region`` waits for: the latest free of each of its bytes."""
        return [w for _, waits in self.freed.over(region.offset, region.end) for w in waits]

    def free_since(self, region: Region) -> int:
        """The run after which all of ``region`` is free (START: since the iteration began)."""
        return max([after for after, _ in self.freed.over(region.offset, region.end)], default=START)

    # -- the iteration's start

    def homes(self) -> Iterator[tuple[int, PlanTensor]]:
        """Put every tensor with a home where it starts; yields each (tensor line, tensor) first, so that
        a caller can check it before it is placed."""
        for i, t in enumerate(self.plan.tensors):
            if t.home is None:
                continue
            yield i, t
            if t.home == HOST or t.kind == "input":
                self.host[self.slot[t.name]] = t.name
                self.host_written[self.slot[t.name]] = START
            if isinstance(t.home, Region):
                self.occupy(t.name, t.home)
                self.ready[t.name] = START

    def steps(self) -> Iterator[Step]:
        """Replay a valid plan from the start: its tensors' homes, then every instruction in order."""
        for _ in self.homes():
            pass
        for k, instr in enumerate(self.plan.program):
            yield self.apply(k, instr)

    # -- instructions

    def apply(self, k: int, instr: Instr) -> Step:
        """Apply instruction ``k`` of the program."""
        kind = KIND_OF[type(instr)]
        waits, regions = self._handlers[kind](k, instr)
        stream = "" if kind is InstrKind.FREE else "net" if kind is InstrKind.LAUNCH and instr.op in self.net else \
            STREAM[kind]
        return Step(k, instr, kind, waits, regions, stream)

    def launch(self, k: int, instr: Run) -> tuple[Waits, tuple[Region, ...]]:
        op = self.plan.ops[instr.op]
        loc, ready, due = self.loc, self.ready, self.due
        regions = tuple([loc[n] for n in op.inputs])
        waits = [w for n in op.inputs if (w := ready[n]) != START]
        for name in op.inputs:
            if name in due and due[name][0] == instr.op:
                del due[name]
        for name, region in instr.outs:
            waits += self.free_waits(region)
            if instr.in_place and name == op.outputs[0]:
                waits += self.net_reads.pop(op.inputs[0], [])
                self.occupy(name, self.vacate(op.inputs[0]))
            else:
                self.occupy(name, region)
            ready[name] = k
        if instr.op in self.net:
            for name in op.inputs:
                self.net_reads.setdefault(name, []).append(k)
            self.compute_before[instr.op] = self.last_compute
        else:
            self.last_compute = k
        self.ran[instr.op] = k
        return tuple(waits), regions

    def swap_in(self, k: int, instr: SwapIn) -> tuple[Waits, tuple[Region, ...]]:
        slot = self.slot[instr.tensor]
        self.host_read.setdefault(slot, []).append(k)
        waits = _known(*self.after(instr.after), self.host_written[slot])
        waits += tuple(self.free_waits(instr.region))
        self.occupy(instr.tensor, instr.region)
        self.due[instr.tensor] = (instr.before, k)
        self.ready[instr.tensor] = k
        return waits, (instr.region,)

    def swap_out(self, k: int, instr: SwapOut) -> tuple[Waits, tuple[Region, ...]]:
        name = instr.tensor
        slot = self.slot[name]
        self.host[slot] = name
        self.host_written[slot] = self.copied_out[name] = k
        reading = self.host_read.pop(slot, ())  # done before a run that ran by then, unless that was the network's
        return _known(*self.after(instr.after), self.ready[name], *self.host_used.pop(slot, ()), *reading), \
            (self.loc[name],)

    def host_run(self, k: int, instr: HostRun) -> tuple[Waits, tuple[Region, ...]]:
        op = self.plan.ops[instr.op]
        waits = list(_known(*(self.host_written[self.slot[n]] for n in op.inputs)))
        for name in (*op.inputs, *op.outputs):
            self.host_used.setdefault(self.slot[name], []).append(k)
        for name in op.outputs:
            slot = self.slot[name]
            waits += self.host_read.pop(slot, ())
            waits += _known(self.host_written.get(slot, START))
            self.host[slot] = name
            self.host_written[slot] = k
        self.ran[instr.op] = k
        return tuple(waits), ()

    def free(self, k: int, instr: Free) -> tuple[Waits, tuple[Region, ...]]:
        name = instr.tensor
        after = self.ran[instr.after]
        waits = _known(*self.after(instr.after), self.copied_out.pop(name, START), self.ready[name],
                       *self.net_reads.pop(name, ()))
        region = self.vacate(name)
        self.freed.assign(region.offset, region.end, (after, waits))
        return waits, (region,)

    def after(self, op: int) -> tuple[int, int]:
        """What "once op ``op`` has finished" waits for: its run, and where that run is the network lane's,
        the compute stream's latest run before it too (the validator reads ``after`` as a point in the
        program: every run before it done)."""
        k = self.ran[op]
        return k, self.compute_before.get(op, START) if op in self.net else START

    # -- residency

    def occupy(self, name: str, region: Region) -> None:
        if self.overlaps:
            i = bisect.bisect_left(self._starts, region.offset)
            self._starts.insert(i, region.offset)
            self._live.insert(i, (region, name))
        self.loc[name] = region
        self.copied_out.pop(name, None)

    def vacate(self, name: str) -> Region:
        region = self.loc.pop(name)
        if self.overlaps:
            i = bisect.bisect_left(self._starts, region.offset)
            del self._starts[i], self._live[i]
        self.ready.pop(name, None)
        return region


def walk(plan: Plan) -> Iterator[Step]:
    """Replay a valid plan: its tensors' homes, then every instruction in order."""
    return Replay(plan).steps()


def _known(*waits: int) -> Waits:
    return tuple([w for w in waits if w != START])
