"""The optimiser's inner loop, compiled: arena placement, swap planning and simulation on flat arrays.

``Evaluator`` makes, in C (``_fastplan.c``, built with the package), exactly
the program that the readable reference ``reference.plan_swaps_reference``
makes, and times it exactly as ``simulate.simulate`` does without building a
Plan: the genetic search scores thousands of candidates this way. Property
tests hold the compiled planner to the reference (same program) and the
compiled simulator to the Python one (same iteration time and bytes).

Encoding: the program is a list of records (bucket, kind, tensor, offset,
before) where bucket ``b`` holds what is issued after the op at schedule
position ``b - 1``, and kinds order a bucket as the reference does: the run,
then swap-outs, frees and swap-ins.
"""

from __future__ import annotations

import copy
import ctypes
import enum
import functools
import itertools
import sys
from collections.abc import Callable

import attrs
import numpy as np

from swapdsl.common.errors import SwpError
from swapdsl.graph.ir import Kind
from swapdsl.plan.program import Free, Instr, InstrKind, Region, Run, SwapIn, SwapOut
from swapdsl.planning import _fastplan
from swapdsl.planning.hostlane import Lane, last_copies
from swapdsl.planning.policy import INF, Policy
from swapdsl.planning.problem import Problem

NO_CAP = 1 << 62  # an arena with room for anything
# a fit among this many gaps or more reads a ranking kept up to date (_fastplan.c, "With many gaps")
RANK_GAPS = 48
Status = enum.IntEnum("Status", {name.upper(): code for name, code in _fastplan.STATUS.items()})


def policy_fields(policy: Policy, cap: int) -> np.ndarray:
    """The policy as the compiled planner reads it: int64 fields in ``_fastplan.POLICY_FIELDS`` order."""
    codes = _fastplan.POLICY_CODES
    fields = {"victim": codes["victim"][policy.victim], "prefetch": codes["prefetch"][policy.prefetch],
              "offload": int(policy.offload), "outputs": codes["outputs"][policy.outputs],
              "reserve": policy.reserve(cap), "horizon": INF if policy.horizon is None else policy.horizon}
    return np.array([fields[name] for name in _fastplan.POLICY_FIELDS], np.int64)


@attrs.frozen
class Timing:
    iteration_ms: float
    h2d_bytes: int
    d2h_bytes: int
    host_bytes: int  # the plan's ``host_bytes`` figure: every tensor with a host copy


def csr(rows: tuple[tuple[int, ...], ...]) -> tuple[np.ndarray, np.ndarray]:
    """Rows of indices as (pointers, indices): row r is indices[pointers[r]:pointers[r + 1]]."""
    ptr = np.zeros(len(rows) + 1, np.int64)
    ptr[1:] = np.cumsum(np.fromiter(map(len, rows), np.int64, len(rows)))
    return ptr, np.fromiter(itertools.chain.from_iterable(rows), np.int64, int(ptr[-1]))


@functools.cache
def _keep_freed_memory() -> None:
    """Each evaluation allocates and frees some tens of MB of scratch arrays. glibc gives freed blocks
    that large back to the kernel and takes them again page by page at the next evaluation (perf put
    page faults at 7% of an LSTM evaluation); with these thresholds raised it keeps them for reuse."""
    mallopt = getattr(ctypes.CDLL(None), "mallopt", None) if sys.platform.startswith("linux") else None
    if mallopt is not None:
        m_trim_threshold, m_mmap_threshold = -1, -3
        mallopt(m_mmap_threshold, 32 << 20)  # (glibc's largest allowed value)
        mallopt(m_trim_threshold, 512 << 20)


class Evaluator:
    """A Problem flattened once into arrays; each call plans and times one candidate."""

    def __init__(self, p: Problem, rank_gaps: int = RANK_GAPS, origin: tuple[int, ...] = ()) -> None:
        _keep_freed_memory()
        self.rank_gaps = rank_gaps  # (tests set 0 to rank every fit: the same program either way)
        n = len(p.names)
        self._problem: Problem | Callable[[], Problem] = p
        # what scoring reads of the problem (an extended one's are its base's)
        self.persistent_ids, self.loss, self.host_only_bytes = p.persistent, p.loss, p.host_only_bytes
        self.size = np.array(p.size, np.int64)
        self.nbytes = np.array(p.nbytes, np.int64)
        self.in_ptr, self.in_idx = csr(p.op_inputs)
        self.out_ptr, self.out_idx = csr(p.op_outputs)
        self.in_place = np.array(p.in_place, np.bool_)
        self.op_ms = np.array(p.op_ms, np.float64)
        self.net = np.zeros(len(p.op_ms), np.bool_)  # the network lane's ops (clones, past the graph's, never)
        self.net[list(p.net)] = True
        self.is_input = np.zeros(n, np.bool_)
        self.is_input[list(p.inputs)] = True
        # what may start on the host: unpinned persistent tensors, and what host ops make for the device
        self.persistent = np.zeros(n, np.bool_)
        self.persistent[list(p.starts_on_host)] = True
        self.fwd_act = (np.array(p.kinds, dtype=object) == Kind.activation.value).astype(np.bool_)
        # a new value of an unpinned persistent tensor is copied out once made; so is what host ops read,
        # as the new value of a parameter updated on the host (never pinned)
        self.upd_old = np.array([o for o, _ in p.updates] + [-1] * len(p.to_host), np.int64)  # (-1: always)
        self.upd_new = np.array([w for _, w in p.updates] + sorted(p.to_host), np.int64)
        # what may start on the device or the host: the persistent tensors and the inputs, by name
        self.by_name = np.array(sorted(p.starts_on_host | p.inputs, key=p.names.__getitem__), np.int64)
        self.lane = Lane.of(p) if p.host.ops else None
        # what host ops make for the device within the step: the ops each follows (its host copy's position)
        self.after_ptr, self.after_idx = csr(p.host_after or ((),))
        self.host_start = self.lane.host_start if self.lane else np.zeros(n, np.float64)
        # the tensor each one is a copy of, for recomputation's clones (clones.py); itself otherwise
        self.n_base = n - len(origin)
        self.origin = np.concatenate([np.arange(self.n_base), np.array(origin, np.int64)]).astype(np.int64)
        dev = p.device
        self.copy = np.array([dev.copy_latency_s, dev.h2d_bw, dev.d2h_bw], np.float64)
        # records, heap entries and free-position segments the planner makes room for; grown as needed
        # and kept for the next call
        self.room = np.array([4 * len(p.op_ms) + 16, n + 16, n + 16], np.int64)
        # what an op puts in the planner's work rows at most
        self.width = int(max(4, (2 * (np.diff(self.in_ptr) + np.diff(self.out_ptr)) + 4).max(initial=0)))

    @property
    def p(self) -> Problem:
        if not isinstance(self._problem, Problem):  # (an extended one's, made when first asked for)
            self._problem = self._problem()
        return self._problem

    def extended(self, ops: tuple[int, ...], origin: tuple[int, ...], backward: np.ndarray,
                 problem: Callable[[], Problem]) -> Evaluator:
        """The evaluator of this problem with clones of ``ops`` appended (``clones.Extended``: tensor
        ``n + j`` a clone of ``origin[j]``, read instead of it by the ops ``backward`` marks), made from
        these arrays; what ``Evaluator(problem(), origin=origin)`` makes, array for array, without the
        problem, which ``problem`` makes when first asked for."""
        assert self.n_base == len(self.size), "an extended problem is not extended again"
        n, k = len(self.size), len(ops)
        out = copy.copy(self)
        out._problem = problem
        sel = np.asarray(origin, np.int64)
        remap = np.arange(n, dtype=np.int64)
        remap[sel] = n + np.arange(len(sel), dtype=np.int64)
        rows = np.repeat(backward, np.diff(self.in_ptr))  # (per input: does a backward op read it)
        m = np.asarray(ops, np.int64)
        clone_in = remap[_rows(self.in_ptr, self.in_idx, m)]
        out.in_idx = np.concatenate([np.where(rows, remap[self.in_idx], self.in_idx), clone_in])
        out.in_ptr = _ptr_after(self.in_ptr, np.diff(self.in_ptr)[m])
        out.out_idx = np.concatenate([self.out_idx, remap[_rows(self.out_ptr, self.out_idx, m)]])
        out.out_ptr = _ptr_after(self.out_ptr, np.diff(self.out_ptr)[m])
        out.size = np.concatenate([self.size, self.size[sel]])
        out.nbytes = np.concatenate([self.nbytes, self.nbytes[sel]])
        out.in_place = np.concatenate([self.in_place, np.zeros(k, np.bool_)])
        out.op_ms = np.concatenate([self.op_ms, self.op_ms[m]])
        out.net = np.concatenate([self.net, np.zeros(k, np.bool_)])
        out.is_input, out.persistent = (np.concatenate([a, np.zeros(len(sel), np.bool_)])
                                        for a in (self.is_input, self.persistent))
        out.fwd_act = np.concatenate([self.fwd_act, self.fwd_act[sel]])
        out.host_start = np.concatenate([self.host_start, np.zeros(len(sel), np.float64)])
        out.origin = np.concatenate([self.origin, sel])
        out.room = np.array([4 * len(out.op_ms) + 16, len(out.size) + 16, len(out.size) + 16], np.int64)
        out.width = int(max(4, (2 * (np.diff(out.in_ptr) + np.diff(out.out_ptr)) + 4).max(initial=0)))
        return out

    def records(self, schedule: np.ndarray | list[int], cap: int, pinned: frozenset[int],
                policy: Policy) -> tuple[np.ndarray, np.ndarray, int, np.ndarray]:
        """The program as records (with the early swap-ins taken back, bucket -1: ``_program_order`` leaves
        them out), each tensor's offset when made (homes for what starts on the device), the highest byte
        the arena used, and the schedule as an array."""
        if not pinned <= self.persistent_ids:
            raise SwpError("internal: only persistent tensors can be pinned")
        pin = np.zeros(len(self.size), np.bool_)
        pin[list(pinned)] = True
        code = policy_fields(policy, cap)
        sched = np.asarray(schedule, np.int64)
        out_off = np.empty(len(self.size), np.int64)
        while True:
            recs = np.empty((self.room[0], 5), np.int64)
            nrec, peak, status = _fastplan.plan(
                sched, cap, pin, code, self.size, self.in_ptr, self.in_idx, self.out_ptr, self.out_idx,
                self.in_place, self.is_input, self.persistent, self.fwd_act, self.upd_old, self.upd_new,
                self.by_name, self.loss, self.width, self.rank_gaps, self.room, recs, out_off, self.after_ptr,
                self.after_idx)
            if status != Status.OUT_OF_RECORDS:
                break
            self.room[0] *= 2  # again, with twice the room
        if status == Status.NO_ROOM_FIXED:
            raise SwpError("internal: the cap is below the pinned tensors and inputs")
        if status == Status.NO_ROOM_TENSOR:
            raise SwpError("internal: the compiled swap planner found no room for a tensor")
        return recs[:nrec], out_off, int(peak), sched

    def __call__(self, schedule: np.ndarray | list[int], cap: int, pinned: frozenset[int],
                 policy: Policy) -> Timing:
        recs, out_off, peak, sched = self.records(schedule, cap, pinned, policy)
        done = np.empty(len(self.size), np.float64)
        ms, h2d, d2h = _fastplan.simulate(sched, recs, len(recs), out_off, peak, self.size, self.in_ptr,
                                          self.in_idx, self.out_ptr, self.out_idx, self.op_ms, self.nbytes, self.copy,
                                          self.host_start, done, self.net, *self._host_lane(recs))
        return Timing(float(ms), int(h2d), int(d2h), self.host_bytes(recs, pinned))

    def _host_lane(self, recs: np.ndarray) -> tuple[np.ndarray, ...]:
        """The simulator's host-lane arguments: ``Lane.arrays``, the lane's start clock (which the
        simulator writes its end into) before the last two."""
        arrays, start = _NO_LANE, 0.0
        if self.lane is not None:
            order = _program_order(recs)
            arrays = self.lane.arrays(last_copies(recs[order, 1], recs[order, 2], len(self.size)))
            start = self.lane.start_ms
        return (*arrays[:5], np.array([start], np.float64), *arrays[5:])

    def host_bytes(self, recs: np.ndarray, pinned: frozenset[int]) -> int:
        """Bytes of the inputs, the persistent tensors not pinned, and every other tensor swapped out (a
        clone's as its original's: one slot)."""
        n = self.n_base
        on_host = self.is_input[:n] | self.persistent[:n]
        if pinned:
            held = np.fromiter(pinned, np.int64, len(pinned))
            on_host[held] = self.is_input[held]
        on_host[self.origin[recs[(recs[:, 0] >= 0) & (recs[:, 1] == InstrKind.SWAP_OUT), 2]]] = True
        return int(self.nbytes[:n][on_host].sum() + self.host_only_bytes)

    def program(self, schedule: list[int], cap: int, pinned: frozenset[int],
                policy: Policy) -> tuple[list[Instr], dict[int, Region]]:
        """The plan's program and the home region of each pinned tensor and input."""
        recs, out_off, _, sched = self.records(schedule, cap, pinned, policy)
        p = self.p
        out: list[Instr] = []
        for r in _program_order(recs):
            bucket, kind, t, offset, before = (int(x) for x in recs[r])
            after = int(sched[bucket - 1]) if bucket > 0 else -1
            if kind == InstrKind.LAUNCH:
                outs = tuple((p.names[u], Region(int(out_off[u]), p.size[u])) for u in p.op_outputs[t])
                out.append(Run(t, outs, p.in_place[t]))
            elif kind == InstrKind.SWAP_IN:
                out.append(SwapIn(p.names[t], Region(offset, p.size[t]), after, before))
            elif kind == InstrKind.SWAP_OUT:
                out.append(SwapOut(p.names[t], after))
            else:
                out.append(Free(p.names[t], after))
        homes = {t: Region(int(out_off[t]), p.size[t]) for t in sorted(pinned | p.inputs)}
        return out, homes  # (with hollow runs: hostlane.with_host_runs makes them host runs)

    def no_swap_bytes(self, schedule: list[int]) -> int:
        """The arena ``schedule`` needs with every tensor resident from birth to last use."""
        return self.records(schedule, NO_CAP, self.p.pinnable, Policy("belady", "earliest"))[2]


_NO_LANE = (np.zeros(0, np.int64), np.zeros(1, np.int64), np.zeros(0, np.int64), np.zeros(0, np.float64),
            np.zeros(0, np.bool_), np.zeros(1, np.int64), np.zeros(0, np.int64))  # (Lane.arrays of no lane)


def _rows(ptr: np.ndarray, idx: np.ndarray, which: np.ndarray) -> np.ndarray:
    """The entries of CSR rows ``which``, one after another."""
    if not len(which):
        return idx[:0]
    return np.concatenate([idx[ptr[r]:ptr[r + 1]] for r in which.tolist()])


def _ptr_after(ptr: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """CSR pointers with rows of ``lengths`` appended."""
    return np.concatenate([ptr, ptr[-1] + np.cumsum(lengths, dtype=np.int64)])


def _program_order(recs: np.ndarray) -> np.ndarray:
    """The records in program order, by (bucket, kind), stable; those taken back (bucket -1) are left out."""
    kept = np.flatnonzero(recs[:, 0] >= 0)
    return kept[np.argsort(recs[kept, 0] * len(InstrKind) + recs[kept, 1], kind="stable")]


def priority_order(priority: np.ndarray, n_preds: np.ndarray, succ_ptr: np.ndarray,
                   succ_idx: np.ndarray) -> np.ndarray:
    """The topological order that always runs the ready op of highest priority (ties: lowest index)."""
    order = np.empty(len(priority), np.int64)
    done = _fastplan.priority_order(np.ascontiguousarray(priority, np.float64), n_preds, succ_ptr, succ_idx, order)
    return order[:done]


def no_swap_bytes(p: Problem, schedule: list[int] | None = None) -> int:
    """The arena ``schedule`` (default: the graph's order) needs with every tensor resident from birth
    to last use, placed as the swap planner places them."""
    return Evaluator(p).no_swap_bytes(list(range(p.n_ops)) if schedule is None else schedule)
