"""The plan validator: replays a plan instruction by instruction and checks DESIGN.md's invariants 1-7.

It trusts nothing a planner says: it needs only the plan, and names the first
broken invariant with the op and the tensor involved.
"""

from __future__ import annotations

import bisect
from collections import Counter

from swapdsl.errors import SwpError
from swapdsl.ops import REGISTRY
from swapdsl.arena import Segments
from swapdsl.plan import HOST, Free, Plan, PlanOp, Region, Run, SwapIn, SwapOut
from swapdsl.problem import ALIGN

INVARIANTS = {
    1: "the schedule is a topological order",
    2: "memory stays within the cap",
    3: "no two live tensors share bytes",
    4: "an op finds its inputs resident and their swap-ins complete",
    5: "memory is reused only after its tenant is gone",
    6: "a tensor still needed is on the device or fully on the host",
    7: "an iteration ends in the residency it started in",
}


class PlanInvalid(SwpError):
    def __init__(self, invariant: int, detail: str) -> None:
        super().__init__(f"plan breaks invariant {invariant} ({INVARIANTS[invariant]}): {detail}",
                         hints=["the plan was edited, or made for a different model; run `swapdsl optimize` again"])
        self.invariant = invariant


class _Replay:
    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self.tensors = plan.tensor_map()
        self.ops = {o.index: o for o in plan.ops}
        self.loc: dict[str, Region] = {}
        self.starts: list[int] = []  # live regions, sorted by offset
        self.live: list[tuple[Region, str]] = []
        self.host: set[str] = set()
        self.produced: set[str] = set()
        self.ran: dict[int, int] = {-1: -1}  # op -> position in run order
        self.last_touch: dict[str, int] = {}  # tensor -> run position of its latest read or write
        self.released_at: Segments[int] = Segments()  # per byte, the run position after which it fell free
        self.due: dict[str, int] = {}  # tensor -> op its pending swap-in is due before
        self.readers_left = Counter(n for o in plan.ops for n in set(o.inputs))
        new = dict(plan.updates)
        self.finals = {new.get(t.name, t.name) for t in plan.tensors if t.home is not None and t.kind != "input"}

    def what(self, op: PlanOp) -> str:
        return f"op {op.index} `{op.op}`"

    def tensor(self, name: str) -> str:
        if name not in self.tensors:
            raise SwpError(f"plan names an unknown tensor `{name}`",
                           hints=["the plan was edited, or is damaged; run `swapdsl optimize` again"])
        return name

    def region(self, region: Region, name: str) -> Region:
        if region.offset % ALIGN or region.offset < 0:
            raise SwpError(f"plan puts `{name}` at offset {region.offset}, which is not a multiple of {ALIGN}",
                           hints=["the plan was edited, or is damaged; run `swapdsl optimize` again"])
        if region.end > self.plan.cap:
            raise PlanInvalid(2, f"`{name}` at {region} ends past the cap of {self.plan.cap} bytes")
        if region.size < self.tensors[name].bytes:
            raise PlanInvalid(3, f"`{name}` ({self.tensors[name].bytes} bytes) does not fit region {region}; "
                                 "it would overlap its neighbour")
        return region

    def occupy(self, name: str, region: Region, context: str) -> None:
        i = bisect.bisect_left(self.starts, region.offset)
        for j in (i - 1, i):
            if 0 <= j < len(self.live) and self.live[j][0].overlaps(region):
                raise PlanInvalid(5, f"{context}: {self.live[j][0]} still holds `{self.live[j][1]}` when `{name}` "
                                     f"moves into {region}")
        self.starts.insert(i, region.offset)
        self.live.insert(i, (region, name))
        self.loc[name] = region

    def vacate(self, name: str) -> Region:
        region = self.loc.pop(name)
        i = bisect.bisect_left(self.starts, region.offset)
        del self.starts[i], self.live[i]
        return region

    def position(self, op: int, context: str) -> int:
        if op not in self.ran:
            raise PlanInvalid(1, f"{context} waits for op {op}, which has not run yet at that point")
        return self.ran[op]

    # -- instructions

    def start(self) -> None:
        for t in self.plan.tensors:
            if t.home is None:
                continue
            self.produced.add(t.name)
            if t.home == HOST or t.kind == "input":
                self.host.add(t.name)
            if isinstance(t.home, Region):
                self.occupy(t.name, self.region(t.home, t.name), "at the start")

    def run(self, instr: Run) -> None:
        if instr.op not in self.ops:
            raise SwpError(f"plan runs op {instr.op}, which it does not define")
        op = self.ops[instr.op]
        if instr.op in self.ran:
            raise PlanInvalid(1, f"{self.what(op)} runs twice")
        for name in op.inputs:
            self.check_input(op, name)
        outs = dict(instr.outs)
        if set(outs) != set(op.outputs):
            raise SwpError(f"plan places {sorted(outs)} for {self.what(op)}, whose outputs are {list(op.outputs)}")
        if instr.in_place:
            self.in_place(op, instr)
        pos = len(self.ran) - 1
        self.ran[op.index] = pos
        for name, region in instr.outs:
            if not (instr.in_place and name == op.outputs[0]):
                self.occupy(name, self.region(region, name), self.what(op))
            self.produced.add(name)
        for name in set(op.inputs) | set(op.outputs):
            self.last_touch[name] = pos
        for name in set(op.inputs):
            self.readers_left[name] -= 1
            self.due.pop(name, None)

    def check_input(self, op: PlanOp, name: str) -> None:
        if name not in self.produced:
            raise PlanInvalid(1, f"{self.what(op)} reads `{name}` before the op that makes it has run")
        if name not in self.loc:
            raise PlanInvalid(4, f"{self.what(op)} reads `{name}`, which is not on the device")
        if self.due.get(name, op.index) != op.index:
            raise PlanInvalid(4, f"{self.what(op)} reads `{name}`, whose swap-in is only due before op "
                                 f"{self.due[name]}")

    def in_place(self, op: PlanOp, instr: Run) -> None:
        first = op.inputs[0] if op.inputs else None
        out = op.outputs[0]
        if not REGISTRY[op.op].in_place:
            raise PlanInvalid(3, f"{self.what(op)} may not write its output over its input")
        if first is None or dict(instr.outs)[out] != self.loc.get(first):
            raise PlanInvalid(3, f"{self.what(op)} works in place but `{out}` is not in its first input's region")
        if self.readers_left[first] > 1 or first == self.plan.loss:
            raise PlanInvalid(3, f"{self.what(op)} overwrites `{first}`, which is still needed")
        self.occupy(out, self.vacate(first), self.what(op))

    def swapin(self, instr: SwapIn) -> None:
        name = self.tensor(instr.tensor)
        context = f"the swap-in of `{name}`"
        after = self.position(instr.after, context)
        if instr.before in self.ran or instr.before not in self.ops:
            raise PlanInvalid(4, f"{context} is due before op {instr.before}, which has already run or does not exist")
        if name not in self.host:
            raise PlanInvalid(6, f"{context}: `{name}` has no copy on the host")
        if name in self.loc:
            raise PlanInvalid(3, f"{context}: `{name}` is already on the device at {self.loc[name]}")
        region = self.region(instr.region, name)
        if max(self.released_at.over(region.offset, region.end), default=-1) > after:
            raise PlanInvalid(5, f"{context} may start after op {instr.after}, before region {region} falls free")
        self.occupy(name, region, context)
        self.due[name] = instr.before

    def swapout(self, instr: SwapOut) -> None:
        name = self.tensor(instr.tensor)
        context = f"the swap-out of `{name}`"
        self.position(instr.after, context)
        if name not in self.loc:
            raise PlanInvalid(6, f"{context}: `{name}` is not on the device")
        if name in self.due:
            raise PlanInvalid(6, f"{context} starts before its swap-in has been used")
        self.host.add(name)

    def free(self, instr: Free) -> None:
        name = self.tensor(instr.tensor)
        context = f"the free of `{name}`"
        after = self.position(instr.after, context)
        if name not in self.loc:
            raise PlanInvalid(5, f"{context}: `{name}` holds no region")
        if self.last_touch.get(name, -1) > after:
            raise PlanInvalid(5, f"{context} after op {instr.after} comes before its last use so far")
        if name in self.due:
            raise PlanInvalid(5, f"{context} comes before the op its swap-in is due for; the copy may still be "
                                 "writing its region")
        if self.still_needed(name) and name not in self.host:
            raise PlanInvalid(6, f"{context}: `{name}` is needed later but was never copied to the host")
        gone = self.vacate(name)
        self.released_at.assign(gone.offset, gone.end, after)

    def still_needed(self, name: str) -> bool:
        return self.readers_left[name] > 0 or name == self.plan.loss or name in self.finals

    def end(self) -> None:
        missing = [o.index for o in self.plan.ops if o.index not in self.ran]
        if missing:
            raise PlanInvalid(1, f"ops {missing[:5]} never run")
        new = dict(self.plan.updates)
        for t in self.plan.tensors:
            if t.home is None or t.kind == "input":
                continue
            final = new.get(t.name, t.name)
            if isinstance(t.home, Region) and self.loc.get(final) != t.home:
                raise PlanInvalid(7, f"`{t.name}` starts at {t.home} but its final value `{final}` ends at "
                                     f"{self.loc.get(final, 'no region')}")
            if t.home == HOST and final not in self.host:
                raise PlanInvalid(7, f"`{t.name}` starts on the host but its final value `{final}` is never "
                                     "written back")


def validate(plan: Plan) -> None:
    """Raise PlanInvalid (or SwpError for a malformed plan) at the first broken rule."""
    r = _Replay(plan)
    r.start()
    handlers = {Run: r.run, SwapIn: r.swapin, SwapOut: r.swapout, Free: r.free}
    for instr in plan.program:
        handlers[type(instr)](instr)  # type: ignore[operator]
    r.end()
