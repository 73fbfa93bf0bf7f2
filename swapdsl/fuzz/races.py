"""Happens-before over a plan's replay: an independent check of the waits the replay gives.

Every two accesses to the same device bytes or host memory, one of them a write, must be ordered by a chain
of stream order (each stream and lane runs its instructions in program order) and waits. The replay's waits
are what the simulator times and the interpreter synchronises on; this check reads only which bytes each
instruction touches, so a wait the replay forgets shows up here even where no timing reveals it.

Kernels' scratch is left out: each lane that runs kernels (compute, the network's, the host's) has a
scratch of its own (``runtime/interpreter.PlanRunner``) and runs one kernel at a time, in stream order,
so two uses of one scratch are always ordered.
"""

from __future__ import annotations

import attrs

from swapdsl.plan.program import Free, HostRun, Plan, Region, Run, SwapIn, SwapOut
from swapdsl.plan.replay import Step, walk


@attrs.frozen
class Access:
    index: int
    stream: str
    write: bool
    what: str  # for messages
    lo: int = 0  # device bytes [lo, hi), or
    hi: int = 0
    slot: str = ""  # a host slot


def unordered(plan: Plan) -> list[str]:
    """Pairs of conflicting accesses that no chain of stream order and waits orders."""
    sizes = {t.name: t.bytes for t in plan.tensors}
    slot = plan.host_slot_owner()
    known: dict[int, dict[str, int]] = {}  # instruction -> per stream, the latest index known done
    stream_of: dict[int, str] = {}
    last: dict[str, int] = {}
    seen: list[Access] = []
    found: list[str] = []
    for s in walk(plan):
        stream_of[s.index] = s.stream
        done: dict[str, int] = {}
        before = list(s.waits) + ([last[s.stream]] if s.stream and s.stream in last else [])
        for w in before:
            for lane, k in (*known[w].items(), (stream_of[w], w)):
                done[lane] = max(done.get(lane, -2), k)
        known[s.index] = done
        if s.stream:
            last[s.stream] = s.index
        mine = _accesses(plan, s, sizes, slot)
        for a in mine:
            for b in seen:
                if (a.write or b.write) and _overlap(a, b) and done.get(b.stream, -2) < b.index:
                    found.append(f"[{a.index}] {s.instr} ({a.what}) vs [{b.index}] {b.what} on {b.stream}")
        seen += mine
    return found


def _overlap(a: Access, b: Access) -> bool:
    return a.slot == b.slot if a.slot or b.slot else a.lo < b.hi and b.lo < a.hi


def _accesses(plan: Plan, s: Step, sizes: dict[str, int], slot: dict[str, str]) -> list[Access]:
    i, k, lane = s.instr, s.index, s.stream

    def dev(name: str, region: Region, write: bool) -> Access:
        return Access(k, lane, write, f"{'writes' if write else 'reads'} {name}", region.offset,
                      region.offset + sizes[name])

    def host(name: str, write: bool) -> Access:
        return Access(k, lane, write, f"{'writes' if write else 'reads'} host {name}", slot=slot[name])

    if isinstance(i, Run):
        op = plan.ops[i.op]
        return [dev(n, r, False) for n, r in zip(op.inputs, s.regions)] + [dev(n, r, True) for n, r in i.outs]
    if isinstance(i, SwapIn):
        return [host(i.tensor, False), dev(i.tensor, i.region, True)]
    if isinstance(i, SwapOut):
        return [dev(i.tensor, s.regions[0], False), host(i.tensor, True)]
    if isinstance(i, HostRun):
        op = plan.ops[i.op]
        return [host(n, False) for n in op.inputs] + [host(n, True) for n in op.outputs]
    assert isinstance(i, Free)
    return []
