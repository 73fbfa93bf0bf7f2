"""The plan validator: replays a plan instruction by instruction and checks DESIGN.md's invariants 1-7.

It trusts nothing a planner says: it needs only the plan, and names the first
broken invariant with the op and the tensor involved.
"""

from __future__ import annotations

from collections import Counter

from swapdsl.errors import SwpError
from swapdsl.ops import REGISTRY
from swapdsl.plan import HOST, Free, Plan, PlanOp, Run, Slab, SwapIn, SwapOut

INVARIANTS = {
    1: "the schedule is a topological order",
    2: "memory stays within the cap",
    3: "no two live tensors share bytes",
    4: "an op finds its inputs resident and their swap-ins complete",
    5: "a slab is reused only after its tenant is gone",
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
        self.loc: dict[str, Slab] = {}
        self.owner: dict[Slab, str] = {}
        self.host: set[str] = set()
        self.produced: set[str] = set()
        self.ran: dict[int, int] = {-1: -1}  # op -> position in run order
        self.last_touch: dict[str, int] = {}  # tensor -> run position of its latest read or write
        self.released_at: dict[Slab, int] = {}  # slab -> run position after which it fell free
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

    def slab(self, slab: Slab, name: str) -> Slab:
        pool = self.plan.pool
        if not (0 <= slab.cls < len(pool) and 0 <= slab.index < pool[slab.cls].slabs):
            raise SwpError(f"plan puts `{name}` in slab {slab}, which the pool does not have",
                           hints=[f"the pool has {len(pool)} classes"])
        if pool[slab.cls].bytes < self.tensors[name].bytes:
            raise PlanInvalid(3, f"`{name}` ({self.tensors[name].bytes} bytes) does not fit slab {slab} "
                                 f"({pool[slab.cls].bytes} bytes); it would overlap its neighbour")
        return slab

    def occupy(self, name: str, slab: Slab, context: str) -> None:
        if slab in self.owner:
            raise PlanInvalid(5, f"{context}: slab {slab} still holds `{self.owner[slab]}` when `{name}` moves in")
        self.loc[name] = slab
        self.owner[slab] = name

    def vacate(self, name: str) -> Slab:
        slab = self.loc.pop(name)
        del self.owner[slab]
        return slab

    def position(self, op: int, context: str) -> int:
        if op not in self.ran:
            raise PlanInvalid(1, f"{context} waits for op {op}, which has not run yet at that point")
        return self.ran[op]

    # -- instructions

    def start(self) -> None:
        if self.plan.pool_bytes > self.plan.cap:
            raise PlanInvalid(2, f"the pool takes {self.plan.pool_bytes} bytes, more than the cap of {self.plan.cap}")
        for t in self.plan.tensors:
            if t.home is None:
                continue
            self.produced.add(t.name)
            if t.home == HOST or t.kind == "input":
                self.host.add(t.name)
            if isinstance(t.home, Slab):
                self.occupy(t.name, self.slab(t.home, t.name), "at the start")

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
        for name, slab in instr.outs:
            if not (instr.in_place and name == op.outputs[0]):
                self.occupy(name, self.slab(slab, name), self.what(op))
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
            raise PlanInvalid(3, f"{self.what(op)} works in place but `{out}` is not in its first input's slab")
        if self.readers_left[first] > 1 or first == self.plan.loss:
            raise PlanInvalid(3, f"{self.what(op)} overwrites `{first}`, which is still needed")
        self.vacate(first)
        self.loc[out] = dict(instr.outs)[out]
        self.owner[self.loc[out]] = out

    def swapin(self, instr: SwapIn) -> None:
        name = self.tensor(instr.tensor)
        context = f"the swap-in of `{name}`"
        after = self.position(instr.after, context)
        if instr.before in self.ran or instr.before not in self.ops:
            raise PlanInvalid(4, f"{context} is due before op {instr.before}, which has already run or does not exist")
        if name not in self.host:
            raise PlanInvalid(6, f"{context}: `{name}` has no copy on the host")
        if name in self.loc:
            raise PlanInvalid(3, f"{context}: `{name}` is already on the device in slab {self.loc[name]}")
        slab = self.slab(instr.slab, name)
        if self.released_at.get(slab, -1) > after:
            raise PlanInvalid(5, f"{context} may start after op {instr.after}, before slab {slab} falls free")
        self.occupy(name, slab, context)
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
            raise PlanInvalid(5, f"{context}: `{name}` holds no slab")
        if self.last_touch.get(name, -1) > after:
            raise PlanInvalid(5, f"{context} after op {instr.after} comes before its last use so far")
        if name in self.due:
            raise PlanInvalid(5, f"{context} comes before the op its swap-in is due for; the copy may still be "
                                 "writing the slab")
        if self.still_needed(name) and name not in self.host:
            raise PlanInvalid(6, f"{context}: `{name}` is needed later but was never copied to the host")
        self.released_at[self.vacate(name)] = after

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
            if isinstance(t.home, Slab) and self.loc.get(final) != t.home:
                raise PlanInvalid(7, f"`{t.name}` starts in slab {t.home} but its final value `{final}` ends in "
                                     f"{self.loc.get(final, 'no slab')}")
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
