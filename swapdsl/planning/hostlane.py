"""The host lane of a plan whose updates run on the host: where its host runs go, and when they finish.

The swap planner plans the device's part of the problem (host ops are hollow there: ``problem.py``).
Its program then gets its host runs here, by one rule that the plan and the compiled scoring share:

- *start* ops (the forward casts of parameters updated on the host: inputs only persistent tensors,
  outputs no new values) come first, in op order, before any device instruction, so that their
  outputs' swap-ins can begin as soon as they are made;
- every other host op comes right after the last instruction it must follow: the swap-out of each
  input made on the device, the host run of each input made on the host, and every swap-in from host
  memory it writes over (a parameter read on the device, in f32, whose update writes its host copy);
  ties in op order.

The lane is FIFO, so the simulator's time for it is a fold over that order, which the compiled simulator
takes in its pass (``Lane.arrays``: each op after the record it follows), so that a candidate's score is its
plan's time. A collective on the lane (an all-reduce of host copies) holds the network link that the
network lane's all-reduces hold too: it waits for the collectives before it in program order.
"""

from __future__ import annotations

import attrs
import numpy as np

from swapdsl.plan.program import KIND_OF, NET_OPS, Free, HostRun, Instr, InstrKind, Run, SwapIn, SwapOut
from swapdsl.planning.problem import Problem


@attrs.frozen
class Lane:
    start: tuple[int, ...]  # start ops, in op order
    later: tuple[int, ...]  # the other host ops, in op order
    copies: dict[int, tuple[int, ...]]  # later op -> tensors whose last copy it follows (a read tensor's swap-out,
    # an overwritten value's last swap-in: ``last_copies``)
    deps: dict[int, tuple[int, ...]]  # later op -> later host ops that make its inputs
    host_ms: tuple[float, ...]  # per op
    host_start: np.ndarray  # per tensor: when the start ops have made it (ms; 0 otherwise)
    start_ms: float  # when the start ops are done
    collective: frozenset[int]  # later ops that hold the network link (all-reduces of host copies)
    makes: dict[int, tuple[int, ...]]  # later op -> what it makes for the device within the step (a mean)

    @staticmethod
    def of(p: Problem) -> Lane:
        g, index = p.graph, {n: i for i, n in enumerate(p.names)}
        makers = {t: i for i in p.host.ops for t in g.ops[i].outputs}
        news = {new: old for old, new in g.updates}
        start: list[int] = []
        persistent, started = set(g.persistent), set()
        for i in sorted(p.host.ops):
            op = g.ops[i]
            if all(t in persistent or makers.get(t) in started for t in op.inputs) and \
                    not any(t in news for t in op.outputs):
                start.append(i)
                started.add(i)
        later = tuple(i for i in sorted(p.host.ops) if i not in started)
        after = set(later)
        copies = {i: tuple(sorted({index[t] for t in g.ops[i].inputs if t in p.host.read}
                                  | {index[news[t]] for t in g.ops[i].outputs if t in news}))
                  for i in later}
        deps = {i: tuple(sorted({makers[t] for t in g.ops[i].inputs if makers.get(t) in after})) for i in later}
        host_start = np.zeros(len(p.names), np.float64)
        clock = 0.0
        for i in start:
            clock += p.host_ms[i]
            for t in g.ops[i].outputs:
                host_start[index[t]] = clock
        coll = frozenset(i for i in later if g.ops[i].op in NET_OPS)
        makes = {i: tuple(index[t] for t in g.ops[i].outputs if index[t] in p.host_made) for i in later}
        return Lane(tuple(start), later, copies, deps, p.host_ms, host_start, clock, coll, makes)

    def order(self, last_copy: np.ndarray | dict[int, int]) -> list[tuple[int, int]]:
        """The later ops as (program position they follow, op), in lane order; ``last_copy``: per tensor,
        the position of its last copy (-1: none)."""
        at: dict[int, int] = {}
        for i in self.later:
            at[i] = max([int(last_copy[t]) for t in self.copies[i]] + [at[d] for d in self.deps[i]], default=-1)
        return sorted((at[i], i) for i in self.later)

    def arrays(self, last_copy: np.ndarray) -> tuple[np.ndarray, ...]:
        """The later ops in lane order, for the compiled simulator: the position each follows, the tensors
        whose copies it waits for (CSR: pointers, indices), its time (ms), whether it is a collective, and
        what it makes for the device (CSR)."""
        order = self.order(last_copy)
        ptr = np.cumsum([0] + [len(self.copies[i]) for _, i in order], dtype=np.int64)
        idx = np.array([t for _, i in order for t in self.copies[i]], np.int64)
        out_ptr = np.cumsum([0] + [len(self.makes[i]) for _, i in order], dtype=np.int64)
        out_idx = np.array([t for _, i in order for t in self.makes[i]], np.int64)
        return (np.array([k for k, _ in order], np.int64), ptr, idx,
                np.array([self.host_ms[i] for _, i in order], np.float64),
                np.array([i in self.collective for _, i in order], np.bool_), out_ptr, out_idx)


def last_copies(order_kinds: np.ndarray, order_tensors: np.ndarray, n_tensors: int) -> np.ndarray:
    """Per tensor, the position in program order of its swap-out, or if it has none of its last swap-in
    (-1: neither); the compiled simulator's copy ends (``copy_done``) follow the same rule."""
    out = np.full(n_tensors, -1, np.int64)
    ins = np.flatnonzero(order_kinds == InstrKind.SWAP_IN)
    np.maximum.at(out, order_tensors[ins], ins)
    outs = np.flatnonzero(order_kinds == InstrKind.SWAP_OUT)
    out[order_tensors[outs]] = outs  # (a tensor goes to the host once)
    return out


def with_host_runs(p: Problem, lane: Lane, program: list[Instr]) -> list[Instr]:
    """The device program with its hollow runs taken out (instructions after one now follow the device
    run before it) and the host runs put in."""
    device: list[Instr] = []
    last_run = -1
    for instr in program:
        if isinstance(instr, Run) and p.hollow(instr.op):
            continue
        if isinstance(instr, (SwapIn, SwapOut, Free)) and instr.after >= 0 and p.hollow(instr.after):
            instr = attrs.evolve(instr, after=last_run)
        if isinstance(instr, Run):
            last_run = instr.op
        device.append(instr)
    index = {n: i for i, n in enumerate(p.names)}
    kinds = np.array([KIND_OF[type(i)] for i in device], np.int64)
    tensors = np.array([index[i.tensor] if isinstance(i, (SwapIn, SwapOut)) else 0 for i in device], np.int64)
    last = last_copies(kinds, tensors, len(p.names))
    after: dict[int, list[int]] = {}
    for k, i in lane.order(last):
        after.setdefault(k, []).append(i)
    out: list[Instr] = [HostRun(i) for i in lane.start] + [HostRun(i) for i in after.get(-1, ())]
    for k, instr in enumerate(device):
        out.append(instr)
        out += [HostRun(i) for i in after.get(k, ())]
    return out
