"""The ``checkpoint`` baseline: Chen et al. (2016), sublinear memory by recomputation and no swapping.

The default schedule, with every input and persistent tensor on the device for the whole step. The
forward pass keeps a value at the end of each segment (about sqrt(n) segments, balanced by bytes; five
segment lengths are tried and the one that fits with the least recomputation kept) and drops the other
activations the backward pass needs, once the forward pass has read them for the last time. When a
backward op needs a dropped activation, the op that made it runs again (``recompute``), its own dropped
inputs first, back to a kept one: a segment at a time, as Chen's method recomputes. The device must hold
the persistent tensors, one segment and the backward pass's working set at once; below that, an error.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Iterable

from swapdsl.common.errors import SwpError
from swapdsl.common.units import format_bytes
from swapdsl.plan.program import Free, Instr, Region, Run
from swapdsl.planning.policy import INF
from swapdsl.planning.problem import Problem
from swapdsl.planning.reference import Arena


Chosen = tuple[set[int], set[int], dict[int, int]]  # kept and dropped activations, when each kept one may go
SPACINGS = (0.25, 0.5, 1.0, 2.0, 4.0)  # segment bytes, in units of (forward bytes / sqrt(forward values))


def checkpoint_program(p: Problem, cap: int) -> tuple[list[Instr], dict[int, Region]]:
    """The program of Chen's checkpointing under ``cap`` bytes of tensors, and the homes it starts from: of
    the segment lengths in ``SPACINGS``, with checkpoints at separators of the forward graph or at any
    value, the plan that fits with the least recomputation."""
    choices = list(itertools.product(SPACINGS, (True, False)))
    costs: dict[tuple[float, bool], float] = {}
    chosen: dict[tuple[float, bool], Chosen] = {}
    for choice in choices:  # (what a build runs does not depend on where it puts tensors: see _Tally)
        dry = _Checkpointing(p, cap, *choice, arena=_Tally(cap))
        chosen[choice] = dry.chosen
        try:
            program, _ = dry.build()
        except SwpError:  # (it holds more than the cap at once: no arena of the cap holds it)
            continue
        costs[choice] = sum(p.op_ms[i.op] for i in program if isinstance(i, Run) and i.recompute)
    for choice in sorted(costs, key=lambda c: (costs[c], choices.index(c))):
        try:
            return _Checkpointing(p, cap, *choice, chosen=chosen[choice]).build()
        except SwpError:
            continue
    return _Checkpointing(p, cap, chosen=chosen[1.0, True]).build()  # (it raises: the square-root spacing's reason)


def rebuilt_makers(p: Problem, cap: int, spacing: float = 1.0, at_cuts: bool = True) -> set[int]:
    """The ops Chen's rule runs again at this segment length: the makers of the values it drops for the
    backward pass and of every value rebuilding them walks back through (what the genetic search starts its
    recomputation genes from: with the makers of the dropped values alone, a rebuild would stop at the
    first value behind them, which the plan would then have to keep)."""
    c = _Checkpointing(p, cap, spacing, at_cuts)
    return {c.maker[u] for u in c.walk(c.droppable, c.kept)[1]}


class _Checkpointing:
    def __init__(self, p: Problem, cap: int, spacing: float = 1.0, at_cuts: bool = True,
                 arena: Arena | _Tally | None = None, chosen: Chosen | None = None) -> None:
        self.p, self.cap, self.spacing, self.at_cuts = p, cap, spacing, at_cuts
        self.schedule = list(range(p.n_ops))
        self.uses = p.uses(self.schedule)
        self.next_i = [0] * len(p.names)
        self.maker = p.makers()
        self.arena = Arena(cap) if arena is None else arena
        self.where: dict[int, int] = {}
        self.program: list[Instr] = []
        self.fixed = set(p.persistent) | set(p.inputs) | set(p.host_made)  # (host_made: from the host each step)
        self.finals = {new for _, new in p.updates} | {p.loss}
        self.turn = next((i for i in self.schedule if p.op_outputs[i] and not p.is_forward_activation(p.op_outputs[i][0])),
                         p.n_ops)  # (an op without outputs runs on the host: problem.py)
        self.chosen = self.choose() if chosen is None else chosen  # (another build's at this spacing)
        self.kept, self.droppable, self.last_need = self.chosen
        self.pending: dict[int, list[int]] = {}  # position -> kept tensors to free after it (see choose)
        self.held: Counter[int] = Counter()  # inputs of recomputations under way

    def choose(self) -> Chosen:
        """Kept and dropped forward activations, and how long each kept one (or input) must stay.

        Forward values (those that stay where they are made: not one an op overwrites in place) are kept
        by Chen's greedy rule: one whenever the values since the last reach the segment budget, ``spacing``
        times their bytes over the square root of their count (about sqrt(n) segments); with ``at_cuts``,
        the first separator (``separators``) after that, so that a rebuild stays within its segment. In forward order, an activation the backward pass reads
        is dropped if rebuilding it reads no parameter that an in-place update has overwritten by its
        last use (else it is kept too); rebuilding walks back through every forward value that is not
        kept to kept ones, inputs and parameters, and each kept one it reaches stays until that last use."""
        p, turn = self.p, self.turn
        consumed = {p.op_inputs[op][0] for op in self.schedule if p.in_place[op] and p.op_inputs[op]}
        outputs = [t for i in range(turn) for t in p.op_outputs[i] if t not in consumed]  # those that stay
        segment = self.spacing * sum(p.size[t] for t in outputs) / max(1.0, math.sqrt(len(outputs)))
        cuts = (self.separators(consumed) if self.at_cuts else set()) or set(outputs)
        kept, held = set(), 0
        for t in outputs:  # Chen's greedy: a checkpoint at the first cut after a segment's values reach the budget
            held += p.size[t]
            if held >= segment and t in cuts:
                kept.add(t)
                held = 0
        kept |= {t for i in p.net if i < turn for t in p.op_outputs[i]}  # (an all-reduce never runs again)
        updated_at = {p.op_inputs[op][0]: op for op in self.schedule if p.in_place[op] and p.op_inputs[op]
                      and p.op_inputs[op][0] in p.persistent}
        dropped: set[int] = set()
        last_need: dict[int, int] = {}
        for i in range(turn):
            for t in p.op_outputs[i]:
                if t in kept or not any(u >= turn for u in self.uses[t]):
                    continue
                roots = self.roots(t, kept)
                last = self.uses[t][-1]
                if any(updated_at.get(r, INF) < last for r in roots):
                    kept.add(t)
                    continue
                dropped.add(t)
                for r in roots:
                    last_need[r] = max(last_need.get(r, -1), last)
        return kept, dropped, last_need

    def separators(self, consumed: set[int]) -> set[int]:
        """Forward values that are, just after the op that makes them, the only value (besides inputs and
        persistent tensors) the rest of the forward pass reads from what came before: a rebuild that starts
        from one never walks back past it."""
        p, turn = self.p, self.turn
        crossing = [0] * (turn + 1)
        for i in range(turn):
            for t in p.op_outputs[i]:
                last = max((u for u in self.uses[t] if u < turn), default=i)
                crossing[i] += 1
                crossing[last] -= 1
        live, cuts = 0, set()
        for i in range(turn):
            live += crossing[i]
            if not p.op_outputs[i]:  # (a host op)
                continue
            t = p.op_outputs[i][0]
            if live == 1 and t not in consumed and any(i < u < turn for u in self.uses[t]):
                cuts.add(t)
        return cuts

    def roots(self, t: int, kept: set[int]) -> set[int]:
        """What rebuilding ``t`` reads that is not rebuilt itself: kept activations, inputs, parameters."""
        return self.walk({t}, kept)[0]

    def walk(self, ts: Iterable[int], kept: set[int]) -> tuple[set[int], set[int]]:
        """Rebuilding ``ts``: what that reads that is not rebuilt (``roots``), and what it rebuilds (``ts`` too)."""
        rebuilt = set(ts)
        found, stack = set(), list(rebuilt)
        while stack:
            for u in self.p.op_inputs[self.maker[stack.pop()]]:
                if u in rebuilt or u in found:
                    continue
                if u in kept or u in self.fixed:
                    found.add(u)
                else:
                    rebuilt.add(u)
                    stack.append(u)
        return found, rebuilt

    def build(self) -> tuple[list[Instr], dict[int, Region]]:
        homes = {t: Region(self.place(t, -1), self.p.size[t]) for t in sorted(self.fixed)}
        for pos, op in enumerate(self.schedule):
            for t in self.p.op_inputs[op]:
                if t not in self.where:
                    self.rebuild(t, op)
            self.run(op, recompute=False)
            for t in self.p.op_inputs[op]:
                self.next_i[t] += 1
            self.release_after(op, pos)
            for t in self.pending.pop(pos, ()):
                if t in self.where:
                    self.free(t, op, pos)
        return self.program, homes

    def next_use(self, t: int) -> int:
        uses, i = self.uses[t], self.next_i[t]
        return uses[i] if i < len(uses) else INF

    def place(self, t: int, op: int) -> int:
        size = self.p.size[t]
        spot = self.arena.fit(size)
        if spot is None:
            where = f"at op {op} `{self.p.graph.ops[op].op}`" if op >= 0 else "at the start"
            used = self.arena.used
            apart = "" if used + size > self.cap else (  # (enough bytes, none of them together: no tensor moves)
                f", and the largest free region of the {format_bytes(self.cap - used)} left is "
                f"{format_bytes(self.arena.largest_gap())}")
            raise SwpError(f"checkpointing does not fit under this cap: {where}, {format_bytes(used)} of tensors are "
                           f"on the device and `{self.p.names[t]}` needs {format_bytes(size)} more (the cap leaves "
                           f"{format_bytes(self.cap)}){apart}",
                           hints=["checkpointing keeps every parameter and input on the device and swaps "
                                  "nothing; a larger cap, or a method that swaps (ga, belady), may fit"])
        gap, offset = spot
        self.where[t] = self.arena.insert(gap, offset, size, t)
        return offset

    def run(self, op: int, recompute: bool) -> None:
        p = self.p
        outs = []
        for t in p.op_outputs[op]:
            if p.in_place[op] and t == p.op_outputs[op][0]:
                first = p.op_inputs[op][0]
                self.arena.rename(self.where[first], t)
                self.where[t] = self.where.pop(first)
            else:
                self.place(t, op)
            outs.append((p.names[t], Region(self.where[t], p.size[t])))
        self.program.append(Run(op, tuple(outs), p.in_place[op], recompute))

    def rebuild(self, t: int, needed_by: int) -> None:
        """Run ``t``'s maker again, its missing inputs first (depth first, without recursion: a chain may be
        thousands of ops long), each holding its inputs while their siblings are rebuilt; after each
        recomputation, free what only it read."""
        stack = [(self._maker_of(t, needed_by), False)]
        while stack:
            op, ready = stack.pop()
            inputs = self.p.op_inputs[op]
            if ready:
                self.run(op, recompute=True)
                self.held.subtract(inputs)
                self._free_spent(inputs, op)
            elif not all(o in self.where for o in self.p.op_outputs[op]):  # (a sibling may have rebuilt it)
                self.held.update(inputs)
                stack.append((op, True))
                stack += [(self._maker_of(u, op), False) for u in reversed(inputs) if u not in self.where]

    def _maker_of(self, t: int, needed_by: int) -> int:
        op = self.maker.get(t, INF)
        assert op < self.turn, f"{self.p.names[t]}, needed by op {needed_by}, is gone and not a forward value"
        return op

    def _free_spent(self, inputs: tuple[int, ...], op: int) -> None:
        for u in set(inputs):
            if (u in self.where and u not in self.fixed and not self.held[u] and self.next_use(u) == INF
                    and u not in self.finals and self.last_need.get(u, -1) < 0):
                self.free(u, op)

    def release_after(self, op: int, pos: int) -> None:
        for t in dict.fromkeys(self.p.op_inputs[op] + self.p.op_outputs[op]):
            if t not in self.where or t in self.fixed or t in self.finals:
                continue
            nxt = self.next_use(t)
            if t in self.droppable and pos < self.turn <= nxt:
                self.free(t, op, pos)
            elif nxt == INF:
                need = self.last_need.get(t, -1)
                if need <= pos:
                    self.free(t, op, pos)
                else:  # a rebuild reads it until then
                    self.pending.setdefault(need, []).append(t)

    def free(self, t: int, after: int, pos: int = -1) -> None:
        self.program.append(Free(self.p.names[t], after))
        self.arena.remove(self.arena.index(self.where.pop(t)), pos)


class _Tally:
    """An arena that counts bytes and has no places, for a build that learns what it runs and whether it ever
    holds more than the cap at once: the ops a build runs, and when it frees what, follow from the graph and
    the kept values alone; only the offsets (and whether gaps of the cap hold them) depend on the arena."""

    def __init__(self, cap: int) -> None:
        self.cap, self.used, self.tenants = cap, 0, 0
        self.sizes: dict[int, int] = {}  # a key per tenant (what this arena gives as its offset) -> its bytes

    def fit(self, size: int) -> tuple[int, int] | None:
        return (0, 0) if self.used + size <= self.cap else None

    def insert(self, i: int, offset: int, size: int, t: int) -> int:
        key = self.tenants
        self.tenants += 1
        self.sizes[key] = size
        self.used += size
        return key

    def rename(self, offset: int, t: int) -> None:
        pass

    def index(self, offset: int) -> int:
        return offset

    def remove(self, i: int, pos: int) -> None:
        self.used -= self.sizes.pop(i)
