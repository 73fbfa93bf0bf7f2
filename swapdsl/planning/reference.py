"""The swap planner: given a schedule and a cap, place every tensor in the device arena and decide
every swap-in, swap-out and free.

This is the reference, written for reading; ``compiled.py`` makes exactly the
same program in compiled code, and a property test holds them together.

The arena is one range of ``cap`` bytes. Pinned persistent tensors and inputs
are placed first, from offset 0, and never move. One pass over the schedule:
before each op, its missing inputs and its outputs are placed, largest first.
The planner remembers, for each byte, the position at which it last fell free.
A tensor goes into a gap between tenants that holds it, at the gap's start or
its end (the space above the last tenant, at its start, only when no gap
does): the place whose bytes have all been free longest, so that a swap-in
into it can start earliest, then the smallest gap, then the lowest offset.
With ``outputs`` "newest" (or "newest-backward", from the first op of the
backward pass on) an op's outputs take the place freed last instead, which
leaves the long-free bytes to swap-ins: short-lived tensors would otherwise
reset their age. When none is big enough, a
window of the arena is cleared: among the windows that start at a gap and
hold no tensor of this op, the one whose soonest-needed tenant is needed
latest (``belady``) or whose latest-used tenant was used longest ago
(``lru``), then the fewest bytes evicted, then the lowest offset. A victim
still needed is copied to the host first unless it already has a host copy
(tensors never change, so one copy is enough). If no window exists, the op's
own inputs already on the device may be moved out too ("bounced") and come
back in their turn; if that fails as well, everything that may move leaves,
and the op's tensors are packed from the bottom of the free space, so a cap
of ``sizing.need_bytes`` always suffices.

A swap-in starts on demand (``none``), as early as its region and its host
copy allow (``earliest``), or one op ahead (``ahead``); its region is free
since the latest position at which any of its bytes fell free. Those are
placed when the op that reads the tensor comes, so the ops in between have
already taken the bytes that fell free long before. With ``early`` set, after
each op the tensor needed soonest of those only on the host comes in at once
(placed as above, started as early as its region and host copy allow) while a
gap holds it and a share ``early`` of the cap stays free; repeated. Such a
tensor is a tenant like any other; if it must leave before its use, its swap-in
is taken back as if never made, and no tensor needed at or after that use
comes in early until then (else the same one would come and go at every op).
With ``horizon`` set, only tensors needed within that many ops come in early
(without one, 72-86% of the early swap-ins of the search's seeds on
``lstm_lm`` were taken back before use, their tensors needed 21,000 ops later
on average).
``offload`` (vDNN) copies every forward activation needed in the backward
pass to the host as soon as it is produced and frees it after its last
forward use; so it does with unpinned weights, which have a host copy, but
not with inputs, which never move (one brought back elsewhere would hold its
bytes for good, and a cap of ``need_bytes`` might no longer do). Instructions
are placed at the op they follow, so a victim's free and swap-out go back to
its last use and a prefetch to when its region fell free.
"""

from __future__ import annotations

import bisect
import heapq

import attrs

from swapdsl.common.errors import SwpError
from swapdsl.plan.program import Free, Instr, InstrKind, Region, Run, SwapIn, SwapOut
from swapdsl.plan.segments import Segments
from swapdsl.planning.policy import INF, Policy
from swapdsl.planning.problem import Problem
from swapdsl.planning.sizing import resident_at_start

def placement_order(p: Problem, tensors: list[int]) -> list[int]:
    """Largest first (the hardest to fit goes where there is most choice), then by id."""
    return sorted(dict.fromkeys(tensors), key=lambda t: (-p.size[t], t))


class Arena:
    """Tenants sorted by offset; gap i lies before tenant i (the last one above every tenant), and
    ``freed`` holds, for each byte, the latest schedule position at which it fell free (none: never
    used)."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.off: list[int] = []
        self.end: list[int] = []
        self.ten: list[int] = []
        self.used = 0
        self.freed: Segments[int] = Segments()

    def gap(self, i: int) -> tuple[int, int]:
        return (self.end[i - 1] if i else 0), (self.off[i] if i < len(self.off) else self.cap)

    def since(self, offset: int, size: int) -> int:
        """The position since which all of [offset, offset + size) is free (-1: never used)."""
        return max(self.freed.over(offset, offset + size), default=-1)

    def fit(self, size: int, newest: bool = False) -> tuple[int, int] | None:
        """Where ``size`` bytes go, as (gap, offset): of the gaps between tenants that hold them, at
        the start or the end of one, the place free longest (so a swap-in into it can start
        earliest) or, with ``newest``, freed last; then the smallest gap, then the lowest offset;
        else the start of the space above the last tenant if it holds them."""
        best: tuple[int, int, int, int] | None = None
        for i, (lo, hi) in enumerate(zip([0, *self.end[:-1]], self.off)):  # the gaps below each tenant
            if hi - lo < size:
                continue
            for offset in dict.fromkeys((lo, hi - size)):  # the start and the end (one place if it fits exactly)
                key = ((-1 if newest else 1) * self.since(offset, size), hi - lo, offset, i)
                if best is None or key < best:
                    best = key
        if best is not None:
            return best[3], best[2]
        lo, hi = self.gap(len(self.off))
        return (len(self.off), lo) if hi - lo >= size else None

    def largest_gap(self) -> int:
        return max(hi - lo for lo, hi in map(self.gap, range(len(self.off) + 1)))

    def insert(self, i: int, offset: int, size: int, t: int) -> int:
        """Put tenant ``t`` at ``offset`` in gap ``i``."""
        self.off.insert(i, offset)
        self.end.insert(i, offset + size)
        self.ten.insert(i, t)
        self.used += size
        return offset

    def index(self, offset: int) -> int:
        return bisect.bisect_left(self.off, offset)

    def rename(self, offset: int, t: int) -> None:
        """The tenant at ``offset`` is now ``t`` (an in-place op's output takes its input's bytes)."""
        self.ten[self.index(offset)] = t

    def remove(self, i: int, pos: int) -> None:
        """Tenant i leaves at position ``pos`` (-1: it was never written, its bytes keep their past)."""
        if pos >= 0:
            self.freed.assign(self.off[i], self.end[i], pos)
        self.used -= self.end[i] - self.off[i]
        del self.off[i], self.end[i], self.ten[i]


class _Planner:
    def __init__(self, p: Problem, schedule: list[int], cap: int, pinned: frozenset[int], policy: Policy) -> None:
        self.p, self.schedule, self.policy = p, schedule, policy
        self.arena = Arena(cap)
        self.pinned = set(pinned)
        self.fixed = set(pinned) | set(p.inputs)  # never leave the device
        self.uses = p.uses(schedule)
        self.next_i = [0] * len(p.names)
        self.where: dict[int, int] = {}  # tensor -> offset
        self.host = set(p.inputs) | (set(p.starts_on_host) - self.pinned)
        self.host_at = {t: -1 for t in self.host}  # position after which the host copy exists
        at = {op: pos for pos, op in enumerate(schedule)}
        for t, ops in enumerate(p.host_after):  # (made on the host from what these ops made: once they ran)
            if ops:
                self.host_at[t] = max(at.get(op, -1) for op in ops)
        self.released = [-1] * len(p.names)
        self.last_access = [-1] * len(p.names)
        # what is issued after the op at each position (the first: before any), one list per InstrKind
        self.buckets: list[tuple[list[Instr], ...]] = [tuple([] for _ in InstrKind) for _ in range(len(schedule) + 1)]
        self.write_back = {new for old, new in p.updates if old in p.persistent and old not in pinned} | p.to_host
        self.turn = next((i for i, op in enumerate(schedule)
                          if p.op_outputs[op] and not p.is_forward_activation(p.op_outputs[op][0])), len(schedule))
        # tensors needed again that are only on the host, by next use (stale entries are skipped), and
        # the early swap-ins not yet used: (position they follow, instruction)
        self.waiting = [(self.uses[t][0], t) for t in sorted(self.host - set(p.inputs)) if self.uses[t]]
        heapq.heapify(self.waiting)
        self.early: dict[int, tuple[int, SwapIn]] = {}
        self.early_limit = INF  # after one is taken back: none needed at or after its use, until then

    # -- helpers

    def op_at(self, pos: int) -> int:
        return self.schedule[pos] if pos >= 0 else -1

    def emit(self, pos: int, kind: InstrKind, instr: Instr) -> None:
        self.buckets[pos + 1][kind].append(instr)

    def next_use(self, t: int) -> int:
        uses, i = self.uses[t], self.next_i[t]
        return uses[i] if i < len(uses) else INF

    def region(self, t: int) -> Region:
        return Region(self.where[t], self.p.size[t])

    def place(self, t: int, spot: tuple[int, int]) -> int:
        """Put ``t`` at ``spot`` (gap, offset); returns the position since which its bytes are free."""
        gap, offset = spot
        self.where[t] = self.arena.insert(gap, offset, self.p.size[t], t)
        return self.arena.since(offset, self.p.size[t])

    def release(self, t: int, pos: int) -> None:
        self.arena.remove(self.arena.index(self.where.pop(t)), pos)
        self.released[t] = pos

    # -- the pass

    def run(self) -> tuple[list[Instr], dict[int, Region]]:
        homes: dict[int, Region] = {}
        for t in resident_at_start(self.p, frozenset(self.pinned)):
            gap = self.arena.fit(self.p.size[t])
            if gap is None:
                raise SwpError("internal: the cap is below the pinned tensors and inputs")
            self.place(t, gap)
            homes[t] = self.region(t)
        for pos, op in enumerate(self.schedule):
            self.step(pos, op)
        return [i for bucket in self.buckets for kind in bucket for i in kind], homes

    def step(self, pos: int, op: int) -> None:
        p = self.p
        ins, outs = p.op_inputs[op], list(p.op_outputs[op])
        protect = set(ins) | set(outs)
        in_place_out = outs.pop(0) if p.in_place[op] else None
        swapins = self.place_all(pos, ins, outs, protect)
        for t, since in swapins:
            self.emit(self.swapin_at(t, pos, since), InstrKind.SWAP_IN, SwapIn(p.names[t], self.region(t), -1, op))
        placed = {t: self.region(t) for t in outs}
        if in_place_out is not None:
            old = ins[0]
            self.where[in_place_out] = self.where.pop(old)
            self.arena.ten[self.arena.index(self.where[in_place_out])] = in_place_out
            placed = {in_place_out: self.region(in_place_out), **placed}
            if old in self.pinned:
                self.pinned.add(in_place_out)
                self.fixed.add(in_place_out)
        self.emit(pos, InstrKind.LAUNCH, Run(op, tuple((p.names[t], r) for t, r in placed.items()),
                                             in_place_out is not None))
        for t in protect:
            self.last_access[t] = pos
            self.early.pop(t, None)
        for t in ins:
            if self.next_i[t] < len(self.uses[t]) and self.uses[t][self.next_i[t]] == pos:
                self.next_i[t] += 1
        self.after_run(pos, op, protect)

    def place_all(self, pos: int, ins: tuple[int, ...], outs: list[int], protect: set[int]) -> list[tuple[int, int]]:
        """Places the op's missing inputs and its outputs; returns (input, free since) per swap-in."""
        resident = {t for t in ins if t in self.where}  # may be bounced: no copy of theirs is in flight
        todo = placement_order(self.p, [t for t in ins if t not in self.where] + outs)
        swapins: list[tuple[int, int]] = []
        packed = False
        while todo:
            t = todo.pop(0)
            got = self.acquire(t, pos, protect, resident, t in outs and self.policy.newest(pos, self.turn))
            if got is None and not packed:
                self.clear_all(pos, [u for u, _ in swapins] + [u for u in outs if u in self.where], resident)
                swapins, packed = [], True
                todo = placement_order(self.p, [u for u in ins if u not in self.where] + outs)
                continue
            if got is None:
                raise SwpError(f"internal: no room for `{self.p.names[t]}` at op {self.op_at(pos)}")
            since, bounced = got
            resident -= set(bounced)
            if bounced:
                todo = placement_order(self.p, todo + bounced)
            if t not in outs:
                swapins.append((t, since))
        return swapins

    def acquire(self, t: int, pos: int, protect: set[int], resident: set[int],
                newest: bool) -> tuple[int, list[int]] | None:
        """Room for ``t``: a gap, else a window cleared of tenants not of this op, else also of this
        op's inputs on the device (returned second, to be placed again). None if neither exists."""
        size = self.p.size[t]
        gap = self.arena.fit(size, newest)
        if gap is not None:
            return self.place(t, gap), []
        for movable in (set(), resident):
            victims = self.window(size, lambda v: v not in self.fixed and (v not in protect or v in movable))
            if victims is not None:
                for v in victims:
                    self.evict(v)
                gap = self.arena.fit(size, newest)
                assert gap is not None
                return self.place(t, gap), [v for v in victims if v in movable]
        return None

    def window(self, size: int, evictable: object) -> list[int] | None:
        """The tenants of the best window of ``size`` bytes to clear (see the module docstring)."""
        a = self.arena
        best: tuple[int, int, int] | None = None
        chosen: list[int] = []
        for k in range(len(a.off) + 1):
            lo = a.gap(k)[0]
            if lo + size > a.cap:
                break
            victims = []
            j = k
            while j < len(a.off) and a.off[j] < lo + size:
                victims.append(a.ten[j])
                j += 1
            if not victims or not all(evictable(v) for v in victims):  # type: ignore[operator]
                continue
            key = (self.score(victims), sum(self.p.size[v] for v in victims), lo)
            if best is None or key < best:
                best, chosen = key, victims
        return chosen if best is not None else None

    def score(self, victims: list[int]) -> int:
        """Smaller is a better window: its soonest next use is furthest away (belady), or its most
        recent use is longest ago (lru)."""
        if self.policy.victim == "belady":
            return -min(self.next_use(v) for v in victims)
        return max(self.last_access[v] for v in victims)

    def clear_all(self, pos: int, placed_now: list[int], resident: set[int]) -> None:
        """Last resort: take back what this op placed and evict everything that may move."""
        for t in placed_now:
            self.arena.remove(self.arena.index(self.where.pop(t)), -1)
        for v in [v for v in self.arena.ten if v not in self.fixed]:
            self.evict(v)
        resident.clear()

    def evict(self, v: int) -> None:
        nxt = self.next_use(v)
        if v in self.early:  # an early swap-in not used yet is taken back, as if never made
            at, instr = self.early.pop(v)
            bucket = self.buckets[at + 1][InstrKind.SWAP_IN]
            del bucket[next(i for i, x in enumerate(bucket) if x is instr)]
            self.arena.remove(self.arena.index(self.where.pop(v)), -1)
            heapq.heappush(self.waiting, (nxt, v))
            self.early_limit = min(self.early_limit, nxt)
            return
        k = self.last_access[v]
        if (nxt != INF or v == self.p.loss) and v not in self.host:
            self.copy_out(v, k)
        self.emit(k, InstrKind.FREE, Free(self.p.names[v], self.op_at(k)))
        self.release(v, k)
        if nxt != INF:
            heapq.heappush(self.waiting, (nxt, v))

    def swapin_at(self, t: int, pos: int, since: int) -> int:
        """Where the swap-in goes: the position it waits for; fixes up the placeholder ``after``."""
        floor = max(since, self.released[t], self.host_at.get(t, -1))
        chosen = {"none": pos - 1, "earliest": floor, "ahead": pos - 2}[self.policy.prefetch]
        return max(chosen, floor)

    def after_run(self, pos: int, op: int, touched: set[int]) -> None:
        p = self.p
        for t in p.op_outputs[op]:
            offload = self.policy.offload and pos < self.turn and p.is_forward_activation(t) \
                and self.next_use(t) != INF and self.uses[t][-1] >= self.turn
            if (t in self.write_back or offload) and t not in self.host:
                self.copy_out(t, pos)
        for t in sorted(touched):
            if t not in self.where or t in self.pinned or t == p.loss:
                continue
            nxt = self.next_use(t)
            offloaded = (self.policy.offload and t in self.host and t not in self.fixed
                         and pos < self.turn <= nxt < INF)
            if nxt == INF or offloaded:
                self.emit(pos, InstrKind.FREE, Free(p.names[t], self.op_at(pos)))
                self.release(t, pos)
                if offloaded:
                    heapq.heappush(self.waiting, (nxt, t))
        self.bring_early(pos)

    def bring_early(self, pos: int) -> None:
        """Early swap-ins: while the tensor needed soonest of those only on the host fits in a gap and
        leaves the reserve free, it comes in, as early as its region and its host copy allow."""
        reserve = self.policy.reserve(self.arena.cap)
        if pos >= self.early_limit:
            self.early_limit = INF
        while reserve >= 0 and self.waiting:
            nxt, t = self.waiting[0]
            if t in self.where or self.next_use(t) != nxt:
                heapq.heappop(self.waiting)
                continue
            if nxt >= self.early_limit or (self.policy.horizon is not None and nxt - pos > self.policy.horizon):
                return
            if self.host_at.get(t, -1) > pos:  # (its host copy is not made yet)
                return
            size = self.p.size[t]
            gap = self.arena.fit(size) if self.arena.cap - self.arena.used - size >= reserve else None
            if gap is None:
                return
            heapq.heappop(self.waiting)
            at = max(self.place(t, gap), self.released[t], self.host_at.get(t, -1))
            instr = SwapIn(self.p.names[t], self.region(t), -1, self.schedule[nxt])
            self.emit(at, InstrKind.SWAP_IN, instr)
            self.early[t] = (at, instr)

    def copy_out(self, t: int, pos: int) -> None:
        self.emit(pos, InstrKind.SWAP_OUT, SwapOut(self.p.names[t], self.op_at(pos)))
        self.host.add(t)
        self.host_at[t] = pos


def plan_swaps_reference(p: Problem, schedule: list[int], cap: int, pinned: frozenset[int],
                         policy: Policy) -> tuple[list[Instr], dict[int, Region]]:
    """The program for ``schedule`` in an arena of ``cap`` bytes, and the home region of each pinned
    tensor and input."""
    program, homes = _Planner(p, schedule, cap, pinned, policy).run()
    return _fix_after(program), homes


def _fix_after(program: list[Instr]) -> list[Instr]:
    """Swap-ins were queued with a placeholder ``after``: it is the op they now follow in the list."""
    out: list[Instr] = []
    last_op = -1
    for instr in program:
        if isinstance(instr, Run):
            last_op = instr.op
        elif isinstance(instr, SwapIn):
            instr = attrs.evolve(instr, after=last_op)
        out.append(instr)
    return out
