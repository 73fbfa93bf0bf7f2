"""The swap planner: given a schedule and a pool, decide every swap-in, swap-out and free.

One pass over the schedule. Before each op, its missing inputs and its
outputs get slabs (largest first); when a class has no free slab, a victim
leaves: the least recently used one (``lru``) or the one needed furthest in
the future (``belady``). A victim still needed is copied to the host first,
unless it already has a host copy (tensors never change, so one copy is
enough). A swap-in starts on demand (``none``), as early as its slab and its
host copy allow (``earliest``), or one op ahead (``ahead``). ``offload``
(vDNN) copies every forward activation needed in the backward pass to the
host as soon as it is produced and frees it after its last forward use.
Instructions are placed at the op they follow, so a victim's free and swap-out
go back to its last use and a prefetch to when its slab fell free.
"""

from __future__ import annotations

import heapq

import attrs

from swapdsl.errors import SwpError
from swapdsl.plan import Free, Instr, Run, Slab, SwapIn, SwapOut
from swapdsl.pool import Pool, Slabs, resident_at_start
from swapdsl.problem import Problem

INF = 1 << 60
_OUT, _FREE, _IN = 0, 1, 2  # order of instructions issued after the same op


@attrs.frozen
class Policy:
    victim: str  # "lru" or "belady"
    prefetch: str  # "none", "earliest" or "ahead"
    offload: bool = False


def last_uses(p: Problem, schedule: list[int]) -> dict[int, int]:
    last = {t: -1 for t in range(len(p.names))}
    for pos, op in enumerate(schedule):
        for t in p.op_inputs[op]:
            last[t] = pos
    return last


def placement_order(p: Problem, tensors: list[int]) -> list[int]:
    """Largest slab first (so a small tensor never takes the slab a large one needs), then by id."""
    return sorted(dict.fromkeys(tensors), key=lambda t: (-p.slab_bytes[t], t))


class _Planner:
    def __init__(self, p: Problem, schedule: list[int], pool: Pool, pinned: frozenset[int], policy: Policy,
                 fast: bool = True) -> None:
        self.p, self.schedule, self.policy, self.fast = p, schedule, policy, fast
        # per class, a lazy heap of (victim key, tensor): the best victim on top, stale entries dropped on sight
        self.heaps: list[list[tuple[tuple[int, int], int]]] = [[] for _ in pool.sizes]
        self.slabs = Slabs(pool.sizes, pool.counts)
        self.pinned = set(pinned)
        self.uses = p.uses(schedule)
        self.next_i = [0] * len(p.names)
        self.where: dict[int, tuple[int, int]] = {}
        self.owners: list[dict[int, int]] = [{} for _ in pool.sizes]  # class -> {slab index: tensor}
        self.host = set(p.inputs) | (set(p.persistent) - self.pinned)
        self.host_at = {t: -1 for t in self.host}  # position after which the host copy exists
        self.released = {t: -1 for t in range(len(p.names))}
        self.free_since: dict[tuple[int, int], int] = {}
        self.last_access = [-1] * len(p.names)
        self.buckets: list[tuple[list[Instr], list[Instr], list[Instr]]] = [([], [], []) for _ in range(len(schedule) + 1)]
        self.runs: list[Run] = []
        self.write_back = {new for old, new in p.updates if old in p.persistent and old not in pinned}
        self.turn = next((i for i, op in enumerate(schedule)
                          if not p.is_forward_activation(p.op_outputs[op][0])), len(schedule))

    # -- helpers

    def op_at(self, pos: int) -> int:
        return self.schedule[pos] if pos >= 0 else -1

    def emit(self, pos: int, kind: int, instr: Instr) -> None:
        self.buckets[pos + 1][kind].append(instr)

    def next_use(self, t: int) -> int:
        uses, i = self.uses[t], self.next_i[t]
        return uses[i] if i < len(uses) else INF

    def place(self, t: int, slab: tuple[int, int]) -> None:
        self.where[t] = slab
        self.owners[slab[0]][slab[1]] = t
        self.note(t)

    def key(self, v: int) -> tuple[int, int]:
        """Smallest first: furthest next use (belady) or least recent use (lru); ties by tensor id."""
        if self.policy.victim == "belady":
            return (-self.next_use(v), -v)
        return (self.last_access[v], v)

    def note(self, t: int) -> None:
        if self.fast and t in self.where:
            heapq.heappush(self.heaps[self.where[t][0]], (self.key(t), t))

    def release(self, t: int, pos: int) -> tuple[int, int]:
        slab = self.where.pop(t)
        del self.owners[slab[0]][slab[1]]
        self.released[t] = pos
        self.free_since[slab] = pos
        return slab

    # -- the pass

    def run(self) -> tuple[list[Instr], dict[int, Slab]]:
        p = self.p
        homes: dict[int, Slab] = {}
        for t in resident_at_start(p, frozenset(self.pinned)):
            slab = self.slabs.take(p.slab_bytes[t], borrow=False)
            assert slab is not None, "pool sized below its pinned tensors"
            self.place(t, slab)
            homes[t] = Slab(*slab)
        for pos, op in enumerate(self.schedule):
            self.step(pos, op)
        program: list[Instr] = [i for kind in self.buckets[0] for i in kind]
        for pos, run in enumerate(self.runs):
            program.append(run)
            program += [i for kind in self.buckets[pos + 1] for i in kind]
        return program, homes

    def step(self, pos: int, op: int) -> None:
        p = self.p
        ins, outs = p.op_inputs[op], list(p.op_outputs[op])
        protect = set(ins) | set(outs)
        in_place_out = outs.pop(0) if p.in_place[op] else None
        placed: dict[int, tuple[int, int]] = {}
        resident_before = {t for t in ins if t in self.where}  # only these may be bounced: no copy in flight
        todo = placement_order(p, [t for t in ins if t not in self.where] + outs)
        while todo:
            t = todo.pop(0)
            slab, since, bounced = self.acquire(t, pos, protect, resident_before)
            resident_before.discard(bounced)  # type: ignore[arg-type]
            if bounced is not None:  # an input had to leave a borrowed slab: it comes back in its own turn
                todo = placement_order(p, todo + [bounced])
            if t in outs:
                placed[t] = slab
            else:
                self.emit(self.swapin_at(t, pos, since), _IN, SwapIn(p.names[t], Slab(*slab), -1, op))
            self.place(t, slab)
        if in_place_out is not None:
            old = ins[0]
            slab = self.where.pop(old)
            self.place(in_place_out, slab)
            placed = {in_place_out: slab, **placed}
            if old in self.pinned:
                self.pinned.add(in_place_out)
        self.runs.append(Run(op, tuple((p.names[t], Slab(*s)) for t, s in placed.items()), in_place_out is not None))
        for t in protect:
            self.last_access[t] = pos
        for t in ins:
            if self.next_i[t] < len(self.uses[t]) and self.uses[t][self.next_i[t]] == pos:
                self.next_i[t] += 1
        for t in protect:
            self.note(t)
        self.after_run(pos, op, protect)

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
            offloaded = self.policy.offload and t in self.host and pos < self.turn <= nxt < INF
            if nxt == INF or offloaded:
                self.emit(pos, _FREE, Free(p.names[t], self.op_at(pos)))
                self.slabs.give(self.release(t, pos))

    def copy_out(self, t: int, pos: int) -> None:
        self.emit(pos, _OUT, SwapOut(self.p.names[t], self.op_at(pos)))
        self.host.add(t)
        self.host_at[t] = pos

    def acquire(self, t: int, pos: int, protect: set[int],
                resident_inputs: set[int]) -> tuple[tuple[int, int], int, int | None]:
        """A slab for ``t``: free, or a victim's; as a last resort an input of this very op that
        sits in a larger class's slab is moved out (returned third, to be placed again)."""
        size = self.p.slab_bytes[t]
        slab = self.slabs.take(size)
        if slab is not None:
            return slab, self.free_since.get(slab, -1), None
        own = self.slabs.cls[size]
        for k in range(own, -1, -1):  # evict from the own class first, then larger ones
            victim = self.pop_victim(k, protect) if self.fast else self.scan_victim(k, protect)
            if victim is not None:
                return (*self.evict(victim, pos), None)
        for k in range(own, -1, -1):
            borrowed = [u for u in self.owners[k].values()
                        if u in resident_inputs and self.slabs.cls[self.p.slab_bytes[u]] > k
                        and u not in self.pinned and u not in self.p.inputs]
            if borrowed:
                u = min(borrowed)
                return (*self.evict(u, pos), u)
        raise SwpError(f"internal: no slab for `{self.p.names[t]}` at op {self.op_at(pos)}")

    def evictable(self, v: int) -> bool:
        return v not in self.pinned and v not in self.p.inputs

    def scan_victim(self, k: int, protect: set[int]) -> int | None:
        """The reference: look at every tenant of class ``k``."""
        victims = [v for v in self.owners[k].values() if v not in protect and self.evictable(v)]
        return min(victims, key=self.key) if victims else None

    def pop_victim(self, k: int, protect: set[int]) -> int | None:
        """The same choice from the class's heap, in logarithmic time."""
        heap, aside, found = self.heaps[k], [], None
        while heap:
            key, v = heap[0]
            slab = self.where.get(v)
            if slab is None or slab[0] != k or key != self.key(v) or not self.evictable(v):
                heapq.heappop(heap)  # stale, or never a victim
            elif v in protect:
                aside.append(heapq.heappop(heap))
            else:
                found = v
                break
        for entry in aside:
            heapq.heappush(heap, entry)
        return found

    def evict(self, v: int, pos: int) -> tuple[tuple[int, int], int]:
        k = self.last_access[v]
        needed = self.next_use(v) != INF or v == self.p.loss
        if needed and v not in self.host:
            self.copy_out(v, k)
        self.emit(k, _FREE, Free(self.p.names[v], self.op_at(k)))
        return self.release(v, k), k


def plan_swaps(p: Problem, schedule: list[int], pool: Pool, pinned: frozenset[int],
               policy: Policy, fast: bool = True) -> tuple[list[Instr], dict[int, Slab]]:
    """The program for ``schedule`` under ``pool``, and the home slab of each pinned tensor and input.

    ``fast=False`` picks victims by scanning every tenant (the reference the heaps must agree with)."""
    program, homes = _Planner(p, schedule, pool, pinned, policy, fast).run()
    return _fix_after(p, program, schedule), homes


def _fix_after(p: Problem, program: list[Instr], schedule: list[int]) -> list[Instr]:
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
