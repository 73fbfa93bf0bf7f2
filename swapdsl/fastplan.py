"""The optimiser's inner loop, compiled: arena placement, swap planning and simulation on flat arrays.

``plan_swaps`` makes, in numba-compiled code, exactly the program that the
readable reference ``swapplan.plan_swaps_reference`` makes, and
``Evaluator`` times it exactly as ``simulate.simulate`` does without
building a Plan: the genetic search scores thousands of candidates this way.
Property tests hold the compiled planner to the reference (same program) and
the compiled simulator to the Python one (same iteration time and bytes).

Encoding: the program is a list of records (bucket, kind, tensor, offset,
before) where bucket ``b`` holds what is issued after the op at schedule
position ``b - 1``, and kinds order a bucket as the reference does: the run,
then swap-outs, frees and swap-ins.
"""

from __future__ import annotations

import ctypes
import functools
import sys

import attrs
import numba
import numpy as np
from llvmlite import ir
from numba.core import types
from numba.extending import intrinsic

from swapdsl.errors import SwpError
from swapdsl.ir import Kind
from swapdsl.plan import Free, Instr, Region, Run, SwapIn, SwapOut
from swapdsl.problem import Problem
from swapdsl.swapplan import INF, OUTPUTS, Policy

NO_CAP = 1 << 62  # an arena with room for anything
RUN, OUT, FREE, IN = 0, 1, 2, 3
VICTIMS = {"lru": 0, "belady": 1}
PREFETCH = {"none": 0, "earliest": 1, "ahead": 2}

# Leaf functions take arrays from their caller and allocate nothing, so they are compiled without the
# runtime's reference counting (numba's ``_nrt`` option): at each call numba would otherwise count a
# reference to every array argument, atomically, and perf put that at 11-23% of the LSTM's planning.
# So the planner's and the simulator's loops are leaves, behind wrappers that allocate.
_leaf = numba.njit(cache=True, _nrt=False)
# Inlined (at numba's IR level) only into leaf functions: inlined into one that counts references, each
# call would count a reference to every array it is given. A call passes each array as its seven to
# nine fields, which cost the LSTM's candidates 10-15% before the small helpers were inlined.
_inline = numba.njit(cache=True, inline="always")


@attrs.frozen
class Timing:
    iteration_ms: float
    h2d_bytes: int
    d2h_bytes: int


def _csr(rows: tuple[tuple[int, ...], ...]) -> tuple[np.ndarray, np.ndarray]:
    ptr = np.zeros(len(rows) + 1, np.int64)
    ptr[1:] = np.cumsum([len(r) for r in rows])
    return ptr, np.array([t for r in rows for t in r], np.int64)


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

    def __init__(self, p: Problem) -> None:
        _keep_freed_memory()
        n = len(p.names)
        self.p = p
        self.size = np.array(p.size, np.int64)
        self.nbytes = np.array(p.nbytes, np.int64)
        self.in_ptr, self.in_idx = _csr(p.op_inputs)
        self.out_ptr, self.out_idx = _csr(p.op_outputs)
        self.in_place = np.array(p.in_place, np.bool_)
        self.op_ms = np.array(p.op_ms, np.float64)
        self.is_input = np.zeros(n, np.bool_)
        self.is_input[list(p.inputs)] = True
        self.persistent = np.zeros(n, np.bool_)
        self.persistent[list(p.persistent)] = True
        self.fwd_act = np.array([k == Kind.activation.value for k in p.kinds], np.bool_)
        self.upd_old = np.array([o for o, _ in p.updates], np.int64)
        self.upd_new = np.array([w for _, w in p.updates], np.int64)
        self.by_name = np.array(sorted(range(n), key=p.names.__getitem__), np.int64)
        dev = p.device
        self.copy = np.array([dev.copy_latency_s, dev.h2d_bw, dev.d2h_bw], np.float64)
        # records, heap entries and free-position segments the planner makes room for; grown as needed
        self.room = np.array([4 * len(p.op_ms) + 16, n + 16, n + 16], np.int64)
        # what an op puts in the planner's work rows at most
        self.width = int(max(4, (2 * (np.diff(self.in_ptr) + np.diff(self.out_ptr)) + 4).max(initial=0)))

    def records(self, schedule: np.ndarray | list[int], cap: int, pinned: frozenset[int],
                policy: Policy) -> tuple[np.ndarray, np.ndarray, int, np.ndarray]:
        """The program as records (with the early swap-ins taken back, bucket -1: ``_program_order`` leaves
        them out), each tensor's offset when made (homes for what starts on the device), the highest byte
        the arena used, and the schedule as an array."""
        pin = np.zeros(len(self.size), np.bool_)
        pin[list(pinned)] = True
        code = np.array([VICTIMS[policy.victim], PREFETCH[policy.prefetch], int(policy.offload),
                         OUTPUTS.index(policy.outputs), policy.reserve(cap),
                         INF if policy.horizon is None else policy.horizon], np.int64)
        sched = np.asarray(schedule, np.int64)
        recs, out_off, peak, status = _plan(
            sched, cap, pin, code, self.size, self.in_ptr, self.in_idx, self.out_ptr, self.out_idx,
            self.in_place, self.is_input, self.persistent, self.fwd_act, self.upd_old, self.upd_new,
            self.by_name, self.p.loss, self.room, self.width)
        if status == 1:
            raise SwpError("internal: the cap is below the pinned tensors and inputs")
        if status == 2:
            raise SwpError("internal: the compiled swap planner found no room for a tensor")
        return recs, out_off, int(peak), sched

    def __call__(self, schedule: np.ndarray | list[int], cap: int, pinned: frozenset[int],
                 policy: Policy) -> Timing:
        recs, out_off, peak, sched = self.records(schedule, cap, pinned, policy)
        ms, h2d, d2h = _simulate(sched, recs, out_off, peak, self.size, self.in_ptr, self.in_idx, self.out_ptr,
                                 self.out_idx, self.op_ms, self.nbytes, self.copy)
        return Timing(float(ms), int(h2d), int(d2h))

    def program(self, schedule: list[int], cap: int, pinned: frozenset[int],
                policy: Policy) -> tuple[list[Instr], dict[int, Region]]:
        """The plan's program and the home region of each pinned tensor and input."""
        recs, out_off, _, sched = self.records(schedule, cap, pinned, policy)
        p = self.p
        out: list[Instr] = []
        for r in _program_order(recs, len(sched)):
            bucket, kind, t, offset, before = (int(x) for x in recs[r])
            after = int(sched[bucket - 1]) if bucket > 0 else -1
            if kind == RUN:
                outs = tuple((p.names[u], Region(int(out_off[u]), p.size[u])) for u in p.op_outputs[t])
                out.append(Run(t, outs, p.in_place[t]))
            elif kind == IN:
                out.append(SwapIn(p.names[t], Region(offset, p.size[t]), after, before))
            elif kind == OUT:
                out.append(SwapOut(p.names[t], after))
            else:
                out.append(Free(p.names[t], after))
        homes = {t: Region(int(out_off[t]), p.size[t]) for t in sorted(pinned | p.inputs)}
        return out, homes

    def no_swap_bytes(self, schedule: list[int]) -> int:
        """The arena ``schedule`` needs with every tensor resident from birth to last use."""
        return self.records(schedule, NO_CAP, self.p.persistent, Policy("belady", "earliest"))[2]


# -- compiled helpers


@_inline
def _record(recs: np.ndarray, n: int, bucket: int, kind: int, t: int, offset: int, before: int) -> int:
    """Record ``n`` (room for it was made: see ``_plan_loop``); returns n + 1."""
    recs[n, 0], recs[n, 1], recs[n, 2], recs[n, 3], recs[n, 4] = bucket, kind, t, offset, before
    return n + 1


@numba.njit(cache=True)
def _uses(schedule: np.ndarray, in_ptr: np.ndarray, in_idx: np.ndarray, n_t: int) -> tuple:
    """For each tensor, the positions that read it (CSR, with repeats), as Problem.uses."""
    ptr = np.zeros(n_t + 1, np.int64)
    for op in schedule:
        for j in range(in_ptr[op], in_ptr[op + 1]):
            ptr[in_idx[j] + 1] += 1
    for t in range(n_t):
        ptr[t + 1] += ptr[t]
    fill = ptr[:-1].copy()
    pos_of = np.empty(ptr[n_t], np.int64)
    for pos in range(len(schedule)):
        op = schedule[pos]
        for j in range(in_ptr[op], in_ptr[op + 1]):
            t = in_idx[j]
            pos_of[fill[t]] = pos
            fill[t] += 1
    return ptr, pos_of


@_inline
def _sort_todo(todo: np.ndarray, n: int, tr: np.ndarray) -> None:
    """placement_order: largest first, then by id (insertion sort; an op touches few tensors)."""
    for i in range(1, n):
        t = todo[i]
        j = i - 1
        while j >= 0 and (tr[todo[j], SIZE] < tr[t, SIZE] or (tr[todo[j], SIZE] == tr[t, SIZE] and todo[j] > t)):
            todo[j + 1] = todo[j]
            j -= 1
        todo[j + 1] = t


@_inline
def _sort_ints(a: np.ndarray, n: int) -> None:
    for i in range(1, n):
        x, j = a[i], i - 1
        while j >= 0 and a[j] > x:
            a[j + 1] = a[j]
            j -= 1
        a[j + 1] = x


# -- the arena, a doubly linked list of nodes in offset order. Row ``a[m]`` of node m: NX/PV link the nodes,
# OFF/END/TEN describe its tenant, GPOS is the place of the gap before m in the set of gaps that are not
# empty; RUN_AT and RUN_END serve ``_window``; NLB and NUB bound its bytes' free positions as GLB and GUB
# (below) bound a gap's. Node HEAD (end 0) starts the list and TOP (offset cap) ends it; column NODE of a
# tensor's row of ``tr`` (below) is its node. Row FREE_ROW of ``aux`` is a stack of unused nodes. The set of
# gaps is unordered, so that ``_fit`` reads few: its q-th gap lies before node aux[GS, q] and spans
# [aux[GLO, q], aux[GHI, q]). Rows KNOW0 to KNOW0 + 3 hold what is known of the gap's first bytes, two (size,
# since) pairs, the one ``_fit`` asked last first: since which position its first ``size`` bytes are free
# (size -1: nothing); rows KNOW1 on, the same of its last bytes. (Two sizes, since outputs and swap-ins of
# other sizes alternate: with one, an LSTM candidate with early swap-ins looked up twice as many.) A gap keeps
# what it knows of an end while it is no shorter than the size and that end stays. Rows GLB and GUB bound the
# positions at which the gap's bytes fell free (the least and the most, or looser): the since of any place in
# it lies between them, so ``_fit`` skips a gap whose bound is worse than the best place found (this cut the
# since looked up on an LSTM candidate from 20 of the 29 gaps each fit sees to 4). A gap cut by a tenant
# leaves both parts, and the tenant, the whole gap's bounds; gaps joined by a tenant's leaving take the least
# and the most of the three. ``cnt`` holds [tenants, gaps in the set, free nodes, free-position segments in
# use]; fs/fval/findex/fshift are the segments (below) of the position at which each byte last fell free;
# cnt[4] counts the bytes tenants take, cnt[5] the entries of the heap of tensors waiting on the host (below),
# cnt[6] the early swap-ins taken back; cnt[7] is the planner's early_limit, cnt[8] counts ``_window``'s
# searches.

NX, PV, OFF, END, TEN, GPOS, RUN_AT, RUN_END = range(8)
FREE_ROW, GS, GLO, GHI = range(4)
NLB, NUB = 8, 9
KNOW0, KNOW1, GLB, GUB, AUX_ROWS = 4, 8, 12, 13, 14

# -- what the planner keeps of each tensor, a row of ``tr`` per tensor (three cache lines; an array per
# field made the LSTM's candidates 5-12% slower). WHERE its offset (-1: not on the device), OUT_OFF where it
# was made; MARK == the op's stamp: touched by the current op, RESIDENT: an input on the device before it,
# IS_OUT: an output of it, QUEUED == the queue's tag: an input already queued; LAST the position of its last
# access; NEXT_I its next use (in use_pos), NEXT_USE that use's position (INF: none), USE_END the end of its
# uses in use_pos, LAST_USE the last one's position; NODE its arena node; RK_* rank it for ``_window``;
# EARLY_REC is the record of an early swap-in not used yet; FIXED, PINNED, HOST, WRITE_BACK are flags,
# HOST_AT and RELEASED positions (when its host copy was made, it last left).

WHERE, MARK, RESIDENT, IS_OUT, QUEUED, LAST, NEXT_I, NEXT_USE = range(8)
SIZE, NODE, RK_NEXT, RK_PREV, RK_KEY, EARLY_REC, FIXED, PINNED = range(8, 16)
OUT_OFF, HOST_AT, RELEASED, HOST, WRITE_BACK, USE_END, LAST_USE = range(16, 23)
TR_COLS = 24


@numba.njit(cache=True)
def _arena(n_t: int, cap: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    a = np.full((n_t + 2, 10), -1, np.int64)
    aux = np.empty((AUX_ROWS, n_t + 2), np.int64)
    head, top = n_t, n_t + 1
    a[head, END], a[head, NX], a[top, PV], a[top, OFF] = 0, top, head, cap
    aux[FREE_ROW, :n_t] = np.arange(n_t - 1, -1, -1)
    cnt = np.array([0, 0, n_t, 1, 0, 0, 0, INF, 0], np.int64)
    if cap > 0:
        _gap_put(a, aux, cnt, top, 0, cap, -1, -1)
    return a, aux, cnt


@_inline
def _gap_put(a: np.ndarray, aux: np.ndarray, cnt: np.ndarray, g: int, lo: int, hi: int, lb: int, ub: int) -> int:
    """The gap before node ``g`` is [lo, hi), not empty, its bytes free since [lb, ub] (GLB, GUB); returns
    its place in the set. A new one knows nothing of its ends."""
    q = a[g, GPOS]
    if q < 0:
        q = cnt[1]
        cnt[1] += 1
        aux[GS, q], a[g, GPOS] = g, q
        aux[KNOW0, q] = aux[KNOW0 + 2, q] = aux[KNOW1, q] = aux[KNOW1 + 2, q] = -1
    aux[GLO, q], aux[GHI, q], aux[GLB, q], aux[GUB, q] = lo, hi, lb, ub
    return q


@_inline
def _know(aux: np.ndarray, src: int, dst: int, row: int, length: int) -> None:
    """Gap ``dst`` takes what gap ``src`` knows of an end (rows ``row`` on) of sizes up to ``length``."""
    for k in range(row, row + 4, 2):
        aux[k, dst], aux[k + 1, dst] = aux[k, src] if aux[k, src] <= length else -1, aux[k + 1, src]


@_inline
def _since(aux: np.ndarray, q: int, row: int, size: int, lo: int, fs: np.ndarray, fval: np.ndarray,
           findex: np.ndarray, fshift: int) -> int:
    """Since which position the ``size`` bytes from ``lo``, an end of gap ``q``, are free (rows ``row`` on
    know it, or learn it)."""
    if aux[row, q] == size:
        return aux[row + 1, q]
    since = aux[row + 3, q]
    if aux[row + 2, q] != size:
        since = int(_seg_max(lo, lo + size, fs, fval, findex, fshift))
    aux[row + 2, q], aux[row + 3, q] = aux[row, q], aux[row + 1, q]
    aux[row, q], aux[row + 1, q] = size, since
    return since


@_inline
def _gap_drop(a: np.ndarray, aux: np.ndarray, cnt: np.ndarray, g: int) -> None:
    """There is no gap before node ``g`` (any more)."""
    q = a[g, GPOS]
    if q < 0:
        return
    cnt[1] -= 1
    last = cnt[1]
    for row in range(GS, AUX_ROWS):
        aux[row, q] = aux[row, last]
    a[aux[GS, q], GPOS] = q
    a[g, GPOS] = -1


@_leaf
def _fit(a: np.ndarray, aux: np.ndarray, cnt: np.ndarray, fs: np.ndarray, fval: np.ndarray,
         findex: np.ndarray, fshift: int, size: int, newest: bool) -> tuple[int, int, int]:
    """Arena.fit: (node after the gap, offset, position since which the bytes are free) of the best
    place at the start or end of a gap that holds ``size``, else at the start of the gap above the
    last tenant; node -1 if none holds it."""
    if newest:  # (a loop for each direction: the compiler folds the sign away)
        return _fit_by(a, aux, cnt, fs, fval, findex, fshift, size, -1, GUB)
    return _fit_by(a, aux, cnt, fs, fval, findex, fshift, size, 1, GLB)


@_inline
def _fit_by(a: np.ndarray, aux: np.ndarray, cnt: np.ndarray, fs: np.ndarray, fval: np.ndarray,
            findex: np.ndarray, fshift: int, size: int, sign: int, bound: int) -> tuple[int, int, int]:
    """``_fit`` ranking places by ``sign`` * since (least first); row ``bound`` of ``aux`` bounds a gap's."""
    top_q = a[a.shape[0] - 1, GPOS]
    best, best_off, best_key, best_len = -1, 0, INF, 0
    for q in range(cnt[1]):
        lo, hi = aux[GLO, q], aux[GHI, q]
        if hi - lo < size or q == top_q or sign * aux[bound, q] > best_key:
            continue
        key, offset = sign * _since(aux, q, KNOW0, size, lo, fs, fval, findex, fshift), lo
        if hi - lo > size:  # the end, unless it is the start: better only by its since
            key1 = sign * _since(aux, q, KNOW1, size, hi - size, fs, fval, findex, fshift)
            if key1 < key:
                key, offset = key1, hi - size
        if key < best_key or (key == best_key and (hi - lo < best_len or (hi - lo == best_len and offset < best_off))):
            best, best_off, best_key, best_len = aux[GS, q], offset, key, hi - lo
    if best < 0 and top_q >= 0 and aux[GHI, top_q] - aux[GLO, top_q] >= size:
        lo = aux[GLO, top_q]
        return a.shape[0] - 1, lo, int(_seg_max(lo, lo + size, fs, fval, findex, fshift))
    return best, best_off, sign * best_key


@_inline
def _insert(a: np.ndarray, aux: np.ndarray, cnt: np.ndarray, tr: np.ndarray, kh: np.ndarray, g: int, offset: int,
            size: int, t: int, key: int) -> int:
    """Tenant ``t`` takes [offset, offset + size) in the gap before node ``g``; ranked by ``key`` unless -1
    (it never moves). What lies before it keeps the gap's start, what lies after its end."""
    cnt[2] -= 1
    m, before, q = aux[FREE_ROW, cnt[2]], a[g, PV], a[g, GPOS]
    lo, hi = aux[GLO, q], aux[GHI, q]
    a[m, NX], a[m, PV], a[before, NX], a[g, PV] = g, before, m, m
    a[m, OFF], a[m, END], a[m, TEN], a[m, GPOS], tr[t, NODE] = offset, offset + size, t, -1, m
    a[m, NLB], a[m, NUB] = aux[GLB, q], aux[GUB, q]
    if offset > lo:
        _know(aux, q, _gap_put(a, aux, cnt, m, lo, offset, aux[GLB, q], aux[GUB, q]), KNOW0, offset - lo)
    if offset + size == hi:
        _gap_drop(a, aux, cnt, g)
    else:
        aux[GLO, q], aux[KNOW0, q], aux[KNOW0 + 2, q] = offset + size, -1, -1
        _know(aux, q, q, KNOW1, hi - offset - size)
    cnt[0] += 1
    cnt[4] += size
    if key >= 0:
        _rank_add(tr, kh, t, key)
    return offset


@_inline
def _remove(a: np.ndarray, aux: np.ndarray, cnt: np.ndarray, tr: np.ndarray, kh: np.ndarray, fs: np.ndarray,
            fval: np.ndarray, findex: np.ndarray, fshift: int, t: int, pos: int) -> None:
    """Tenant ``t`` leaves at ``pos`` (-1: never written, its bytes keep their past); it and the gaps
    either side become one gap, which keeps the start of the one before and the end of the one after."""
    m = tr[t, NODE]
    before, after = a[m, PV], a[m, NX]
    if pos >= 0:
        cnt[3] = _seg_assign_call(a[m, OFF], a[m, END], float(pos), fs, fval, findex, fshift, cnt[3])
    qm, qa = a[m, GPOS], a[after, GPOS]
    lb, ub = (pos, pos) if pos >= 0 else (a[m, NLB], a[m, NUB])
    if qa >= 0:
        lb, ub = min(lb, aux[GLB, qa]), max(ub, aux[GUB, qa])
    if qm >= 0:
        lb, ub = min(lb, aux[GLB, qm]), max(ub, aux[GUB, qm])
    qa = _gap_put(a, aux, cnt, after, a[before, END], a[after, OFF], lb, ub)
    aux[KNOW0, qa], aux[KNOW0 + 2, qa] = -1, -1
    if qm >= 0:
        _know(aux, qm, qa, KNOW0, INF)
        _gap_drop(a, aux, cnt, m)
    a[before, NX], a[after, PV] = after, before
    aux[FREE_ROW, cnt[2]] = m
    cnt[2] += 1
    cnt[0] -= 1
    cnt[4] -= a[m, END] - a[m, OFF]
    _rank_drop(tr, kh, t)


# -- tenants that may move, ranked for ``_window``: a key is the tenant's next use (belady, INF as the
# number of ops) or the number of ops less its last access (lru), so a larger key is a better victim.
# Row 0 of ``kh`` heads a list of the tenants of each key (linked by their RK_NEXT and RK_PREV; RK_KEY
# is the key, -1 if unranked). Rows 1 to 3 are bitmaps, 32 bits a word: bit b of word w of row r is set
# when index 32 w + b of the row above holds anything (row 0: a tenant), so the best key below any
# other is found in a few steps.


@_inline
def _rank_add(tr: np.ndarray, kh: np.ndarray, t: int, key: int) -> None:
    h = kh[0, key]
    tr[t, RK_NEXT], tr[t, RK_PREV], tr[t, RK_KEY] = h, -1, key
    kh[0, key] = t
    if h >= 0:
        tr[h, RK_PREV] = t
        return
    y = key
    for r in range(1, 4):
        w = y >> 5
        was = kh[r, w]
        kh[r, w] = was | (1 << (y & 31))
        if was != 0:
            return
        y = w


@_inline
def _rank_drop(tr: np.ndarray, kh: np.ndarray, t: int) -> None:
    key = tr[t, RK_KEY]
    if key < 0:
        return
    after, before = tr[t, RK_NEXT], tr[t, RK_PREV]
    if before >= 0:
        tr[before, RK_NEXT] = after
    else:
        kh[0, key] = after
    if after >= 0:
        tr[after, RK_PREV] = before
    tr[t, RK_KEY] = -1
    if kh[0, key] >= 0:
        return
    y = key
    for r in range(1, 4):
        w = y >> 5
        kh[r, w] &= ~(1 << (y & 31))
        if kh[r, w] != 0:
            return
        y = w


@intrinsic
def _high_bit(typingctx, x):  # type: ignore[no-untyped-def]
    """The place of the highest bit set in ``x`` (an int64 above 0): LLVM's count of leading zeros."""
    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        zeros = builder.ctlz(args[0], ir.Constant(ir.IntType(1), 1))
        return builder.sub(ir.Constant(ir.IntType(64), 63), zeros)
    return types.int64(types.int64), codegen


@_inline
def _best_key(kh: np.ndarray, x: int) -> int:
    """The largest key at most ``x`` that some tenant has, else -1: up the bitmaps to a word with a
    set bit at or below the place sought, then down by the highest bits."""
    if x < 0:
        return -1
    r, y = 1, x  # y: the highest index of row r - 1 sought
    while True:
        w = y >> 5
        bits = kh[r, w] & ((2 << (y & 31)) - 1)
        if bits != 0:
            y = 32 * w + _high_bit(bits)
            break
        if r == 3:
            while bits == 0:
                w -= 1
                if w < 0:
                    return -1
                bits = kh[3, w]
            y = 32 * w + _high_bit(bits)
            break
        y, r = w - 1, r + 1
        if y < 0:
            return -1
    while r > 1:
        r -= 1
        y = 32 * y + _high_bit(kh[r, y])
    return y


@_leaf
def _window(size, a, tr, kh, stamp, bounce, cnt, found) -> tuple:
    """The best window to clear (swapplan._Planner.window): returns (its first tenant's node, the node after
    its last); (-1, -1) if none.

    A window is as good as its worst tenant, so the best windows are found by admitting tenants best key
    first: admitted neighbours form runs (RUN_END of a run's first node is its last, and the other way
    round), and the first key at which a run, with the gaps around it, spans ``size`` bytes is the best
    score. Every window of that score lies in such a run and holds a tenant of that key (else it would
    have spanned ``size`` at a better key), so only the windows around those tenants are compared, by
    bytes, then offset.
    A tenant that may not move (fixed, or this op's unless bouncing one that was on the device before
    the op) is never admitted."""
    cnt[8] += 1
    scan = cnt[8]
    x, spanned = _best_key(kh, kh.shape[1] - 1), False
    while x >= 0 and not spanned:
        t, nkey = kh[0, x], 0
        while t >= 0:
            if not (tr[t, FIXED] or (tr[t, MARK] == stamp and not (bounce and tr[t, RESIDENT] == stamp))):
                m = tr[t, NODE]
                first = a[a[m, PV], RUN_END] if a[a[m, PV], RUN_AT] == scan else m
                last = a[a[m, NX], RUN_END] if a[a[m, NX], RUN_AT] == scan else m
                a[m, RUN_AT] = scan
                a[first, RUN_END], a[last, RUN_END] = last, first
                found[nkey] = m
                nkey += 1
                spanned = spanned or a[a[last, NX], OFF] - a[a[first, PV], END] >= size
            t = tr[t, RK_NEXT]
        x = _best_key(kh, x - 1)
    best_k, best_j, b_total, b_lo = -1, -1, 0, 0
    for q in range(nkey if spanned else 0):
        f = found[q]
        k = f  # back to the first node of f's run whose window (starting at the gap before it) reaches f
        while a[a[k, PV], RUN_AT] == scan and a[a[a[k, PV], PV], END] + size > a[f, OFF]:
            k = a[k, PV]
        j, total = k, 0
        while True:  # the windows from k to f, as swapplan._Planner.window slides them
            lo = a[a[k, PV], END]
            while a[j, RUN_AT] == scan and a[j, OFF] < lo + size:
                total += a[j, END] - a[j, OFF]
                j = a[j, NX]
            if a[j, OFF] < lo + size:
                break
            if j == k:  # a gap that holds ``size`` is no window (and is not there when no gap fits)
                if k == f:
                    break
                k = j = a[k, NX]
                continue
            if best_k < 0 or total < b_total or (total == b_total and lo < b_lo):
                best_k, best_j, b_total, b_lo = k, j, total, lo
            if k == f:
                break
            total -= a[k, END] - a[k, OFF]
            k = a[k, NX]
    return best_k, best_j


@_inline
def _rank(t: int, belady: bool, n_ops: int, tr: np.ndarray) -> int:
    """The key that ranks tenant ``t`` as a victim (above ``_rank_add``)."""
    if belady:
        return tr[t, NEXT_USE] if tr[t, NEXT_USE] != INF else n_ops
    return n_ops - 1 - tr[t, LAST]


@numba.njit(cache=True)
def _plan(schedule, cap, pinned0, policy, size, in_ptr, in_idx, out_ptr, out_idx, in_place, is_input,
          persistent, fwd_act, upd_old, upd_new, by_name, loss, room, width):  # pragma: no cover - compiled
    """Makes and fills the arrays ``_plan_loop`` works on and runs it; again, with twice the room, where it
    ran out (``room``: records, heap entries and free-position segments to start with, kept for the
    next call; ``width``: the work rows an op needs at most)."""
    n_t, n_ops = len(size), len(schedule)
    use_ptr, use_pos = _uses(schedule, in_ptr, in_idx, n_t)
    turn = n_ops
    for pos in range(n_ops):
        if not fwd_act[out_idx[out_ptr[schedule[pos]]]]:
            turn = pos
            break
    while True:
        a, aux, cnt = _arena(n_t, cap)
        fs, fval, findex, fshift = _segments(min(cap, size.sum()), room[2], -1.0)
        kh = np.zeros((4, n_ops + 1), np.int64)
        kh[0] = -1
        tr = _tensor_rows(size, use_ptr, use_pos, pinned0, is_input, persistent, upd_old, upd_new)
        hp = np.empty((2, room[1]), np.int64)
        recs = np.empty((room[0], 5), np.int64)
        nrec, peak, status = _plan_loop(
            schedule, cap, policy, in_ptr, in_idx, out_ptr, out_idx, in_place, is_input, fwd_act, by_name,
            loss, use_pos, turn, a, aux, cnt, fs, fval, findex, fshift, tr, kh,
            np.empty(n_t, np.int64), hp, recs, np.empty((3, width), np.int64))
        if status < 3:
            break
        # twice the rows that ran out (_segments makes 2 n + 2 rows for n assignments)
        room[status - 3] = 2 * recs.shape[0] if status == 3 else (2 * hp.shape[1] if status == 4 else fs.shape[0])
    out_off = tr[:, OUT_OFF].copy()
    if status > 0:
        return recs[:0], out_off, peak, status
    return recs[:nrec], out_off, peak, 0


@numba.njit(cache=True)
def _tensor_rows(size, use_ptr, use_pos, pinned0, is_input, persistent, upd_old, upd_new) -> np.ndarray:
    """Each tensor's row of ``tr`` as the planner starts."""
    n_t = len(size)
    tr = np.empty((n_t, TR_COLS), np.int64)
    for t in range(n_t):
        row = tr[t]
        row[:] = -1
        row[MARK], row[RESIDENT], row[IS_OUT], row[QUEUED] = 0, 0, 0, 0
        row[SIZE], row[NEXT_I], row[USE_END] = size[t], use_ptr[t], use_ptr[t + 1]
        has_use = use_ptr[t + 1] > use_ptr[t]
        row[NEXT_USE] = use_pos[use_ptr[t]] if has_use else INF
        row[LAST_USE] = use_pos[use_ptr[t + 1] - 1] if has_use else -1
        row[PINNED], row[FIXED] = pinned0[t], pinned0[t] or is_input[t]
        row[HOST], row[WRITE_BACK] = is_input[t] or (persistent[t] and not pinned0[t]), 0
    for j in range(len(upd_old)):
        if persistent[upd_old[j]] and not pinned0[upd_old[j]]:
            tr[upd_new[j], WRITE_BACK] = 1
    return tr


@_leaf
def _plan_loop(schedule, cap, policy, in_ptr, in_idx, out_ptr, out_idx, in_place, is_input, fwd_act, by_name,
               loss, use_pos, turn, a, aux, cnt, fs, fval, findex, fshift, tr, kh, found, hp, recs,
               work) -> tuple:  # pragma: no cover - compiled
    """The planner's pass over the schedule (see swapplan.py); returns (records made, the highest byte
    used, status): 0 done, 1 or 2 no room (for what never moves, for a tensor), 3 to 5 the records, the
    heap or the free-position segments ran out of room."""
    n_t, n_ops = tr.shape[0], len(schedule)
    belady, prefetch, offload, reserve, horizon = policy[0] == 1, policy[1], policy[2] == 1, policy[4], policy[5]
    newest_from = n_ops if policy[3] == 0 else (0 if policy[3] == 1 else turn)
    todo = work[0]
    pend, pend_since = work[1], work[2]  # swap-ins of this op: tensor, and since when its bytes are free
    peak = nrec = 0
    for t in range(n_t):
        if tr[t, HOST] and not is_input[t] and tr[t, NEXT_USE] != INF:
            if cnt[5] == hp.shape[1]:
                return nrec, peak, 4
            _hp_push(hp, cnt, tr[t, NEXT_USE], t)
    for sweep in range(2):  # pinned tensors by name, then inputs by name
        for t in by_name:
            if (sweep == 0 and tr[t, PINNED]) or (sweep == 1 and is_input[t]):
                g, offset, _ = _fit(a, aux, cnt, fs, fval, findex, fshift, tr[t, SIZE], False)
                if g < 0:
                    return nrec, peak, 1
                tr[t, WHERE] = tr[t, OUT_OFF] = _insert(a, aux, cnt, tr, kh, g, offset, tr[t, SIZE], t, -1)
                peak = max(peak, tr[t, WHERE] + tr[t, SIZE])
    for pos in range(n_ops):
        op, stamp = schedule[pos], pos + 1
        i0, i1, o0, o1 = in_ptr[op], in_ptr[op + 1], out_ptr[op], out_ptr[op + 1]
        width = 2 * ((i1 - i0) + (o1 - o0)) + 4
        # this op removes at most the tenants there now and its own tensors twice (by a window, then
        # all at once) and its own once more (frees), each with two records, one free and a heap entry
        most = 2 * cnt[0] + 3 * width
        if nrec + 2 * most + width > recs.shape[0]:
            return nrec, peak, 3
        if cnt[5] + most > hp.shape[1]:
            return nrec, peak, 4
        if cnt[3] + 2 * most > fs.shape[0]:
            return nrec, peak, 5
        ipo = out_idx[o0] if in_place[op] else -1
        for j in range(i0, i1):
            t = in_idx[j]
            tr[t, MARK] = stamp
            if tr[t, WHERE] >= 0:
                tr[t, RESIDENT] = stamp
        for j in range(o0, o1):
            t = out_idx[j]
            tr[t, MARK] = stamp
            if t != ipo:
                tr[t, IS_OUT] = stamp
        ntodo = _queue(todo, i0, i1, o0, o1, in_idx, out_idx, ipo, tr, stamp)
        npend = 0
        packed = False
        while ntodo > 0:
            t = todo[0]
            ntodo -= 1
            for j in range(ntodo):
                todo[j] = todo[j + 1]
            newest = tr[t, IS_OUT] == stamp and pos >= newest_from
            g, offset, since = _fit(a, aux, cnt, fs, fval, findex, fshift, tr[t, SIZE], newest)
            if g < 0:
                for bounce in (False, True):
                    k, kj = _window(tr[t, SIZE], a, tr, kh, stamp, bounce, cnt, found)
                    if k < 0:
                        continue
                    while k != kj:
                        v, k = a[k, TEN], a[k, NX]
                        if tr[v, RESIDENT] == stamp and bounce:
                            tr[v, RESIDENT] = 0
                            todo[ntodo] = v
                            ntodo += 1
                        nrec = _evict(v, recs, nrec, a, aux, cnt, tr, kh, fs, fval, findex, fshift, loss, hp)
                    _sort_todo(todo, ntodo, tr)
                    g, offset, since = _fit(a, aux, cnt, fs, fval, findex, fshift, tr[t, SIZE], newest)
                    break
            if g < 0 and not packed:  # last resort: take back this op's placements, clear everything
                for j in range(npend):
                    u = pend[j]
                    _remove(a, aux, cnt, tr, kh, fs, fval, findex, fshift, u, -1)
                    tr[u, WHERE] = -1
                for j in range(o0, o1):
                    u = out_idx[j]
                    if u != ipo and tr[u, WHERE] >= 0:
                        _remove(a, aux, cnt, tr, kh, fs, fval, findex, fshift, u, -1)
                        tr[u, WHERE] = -1
                k, top = a[n_t, NX], n_t + 1
                while k != top:
                    v, k = a[k, TEN], a[k, NX]
                    if not tr[v, FIXED]:
                        tr[v, RESIDENT] = 0
                        nrec = _evict(v, recs, nrec, a, aux, cnt, tr, kh, fs, fval, findex, fshift, loss, hp)
                npend, packed = 0, True
                ntodo = _queue(todo, i0, i1, o0, o1, in_idx, out_idx, ipo, tr, -stamp)
                continue
            if g < 0:
                return nrec, peak, 2
            tr[t, WHERE] = _insert(a, aux, cnt, tr, kh, g, offset, tr[t, SIZE], t, _rank(t, belady, n_ops, tr))
            peak = max(peak, tr[t, WHERE] + tr[t, SIZE])
            if tr[t, IS_OUT] == stamp:
                tr[t, OUT_OFF] = tr[t, WHERE]
            else:
                pend[npend], pend_since[npend] = t, since
                npend += 1
        for j in range(npend):
            t = pend[j]
            floor = max(max(pend_since[j], tr[t, RELEASED]), tr[t, HOST_AT])
            at = pos - 1 if prefetch == 0 else (floor if prefetch == 1 else pos - 2)
            nrec = _record(recs, nrec, max(at, floor) + 1, IN, t, tr[t, WHERE], op)
        if ipo >= 0:
            old = in_idx[i0]
            tr[ipo, WHERE] = tr[ipo, OUT_OFF] = tr[old, WHERE]
            tr[old, WHERE] = -1
            tr[ipo, NODE] = tr[old, NODE]
            a[tr[ipo, NODE], TEN] = ipo
            _rank_drop(tr, kh, old)
            if tr[old, PINNED]:
                tr[ipo, PINNED] = tr[ipo, FIXED] = 1
            else:
                _rank_add(tr, kh, ipo, _rank(ipo, belady, n_ops, tr))
        nrec = _record(recs, nrec, pos + 1, RUN, op, -1, -1)
        for j in range(i0, i1):
            t = in_idx[j]
            tr[t, LAST], tr[t, EARLY_REC] = pos, -1
        for j in range(o0, o1):
            tr[out_idx[j], LAST] = pos
        for j in range(i0, i1):
            t = in_idx[j]
            if tr[t, NEXT_USE] == pos:
                i = tr[t, NEXT_I] + 1
                tr[t, NEXT_I], tr[t, NEXT_USE] = i, use_pos[i] if i < tr[t, USE_END] else INF
        for j in range(i0, o1 + i1 - o0):  # the op's tensors still ranked take their new keys
            t = in_idx[j] if j < i1 else out_idx[j - i1 + o0]
            if tr[t, RK_KEY] >= 0:
                key = _rank(t, belady, n_ops, tr)
                if key != tr[t, RK_KEY]:
                    _rank_drop(tr, kh, t)
                    _rank_add(tr, kh, t, key)
        # after the run: write-backs and vDNN offloads, then frees of what is done with (by tensor id)
        for j in range(o0, o1):
            t = out_idx[j]
            nxt = tr[t, NEXT_USE]
            off_t = offload and pos < turn and fwd_act[t] and nxt != INF and tr[t, LAST_USE] >= turn
            if (tr[t, WRITE_BACK] or off_t) and not tr[t, HOST]:
                nrec = _record(recs, nrec, pos + 1, OUT, t, -1, -1)
                tr[t, HOST], tr[t, HOST_AT] = 1, pos
        nt = 0
        for j in range(i0, i1):
            todo[nt] = in_idx[j]
            nt += 1
        for j in range(o0, o1):
            todo[nt] = out_idx[j]
            nt += 1
        _sort_ints(todo, nt)
        for j in range(nt):
            t = todo[j]
            if (j > 0 and todo[j - 1] == t) or tr[t, WHERE] < 0 or tr[t, PINNED] or t == loss:
                continue
            nxt = tr[t, NEXT_USE]
            if nxt == INF or (offload and tr[t, HOST] and not tr[t, FIXED] and pos < turn and turn <= nxt):
                nrec = _record(recs, nrec, pos + 1, FREE, t, -1, -1)
                _remove(a, aux, cnt, tr, kh, fs, fval, findex, fshift, t, pos)
                tr[t, WHERE], tr[t, RELEASED] = -1, pos
                if nxt != INF:
                    _hp_push(hp, cnt, nxt, t)
        if pos >= cnt[7]:
            cnt[7] = INF
        while reserve >= 0 and cnt[5] > 0:  # early swap-ins (swapplan._Planner.bring_early)
            nxt, t = hp[0, 0], hp[1, 0]
            if tr[t, WHERE] >= 0 or tr[t, NEXT_USE] != nxt:
                _hp_pop(hp, cnt)
                continue
            if nxt >= cnt[7] or nxt - pos > horizon:
                break
            if cap - cnt[4] - tr[t, SIZE] < reserve:
                break
            g, offset, since = _fit(a, aux, cnt, fs, fval, findex, fshift, tr[t, SIZE], False)
            if g < 0:
                break
            _hp_pop(hp, cnt)
            if nrec == recs.shape[0]:
                return nrec, peak, 3
            tr[t, WHERE] = _insert(a, aux, cnt, tr, kh, g, offset, tr[t, SIZE], t, _rank(t, belady, n_ops, tr))
            peak = max(peak, tr[t, WHERE] + tr[t, SIZE])
            tr[t, EARLY_REC] = nrec
            at = max(max(since, tr[t, RELEASED]), tr[t, HOST_AT])
            nrec = _record(recs, nrec, at + 1, IN, t, tr[t, WHERE], schedule[nxt])
    return nrec, peak, 0


@_inline
def _queue(todo, i0, i1, o0, o1, in_idx, out_idx, ipo, tr, tag) -> int:
    """Queue the op's inputs not on the device (once each: QUEUED marks them with ``tag``) and its
    outputs other than an in-place one, largest first."""
    ntodo = 0
    for j in range(i0, i1):
        t = in_idx[j]
        if tr[t, WHERE] < 0 and tr[t, QUEUED] != tag:
            tr[t, QUEUED] = tag
            todo[ntodo] = t
            ntodo += 1
    for j in range(o0, o1):
        if out_idx[j] != ipo:
            todo[ntodo] = out_idx[j]
            ntodo += 1
    _sort_todo(todo, ntodo, tr)
    return ntodo


@_leaf
def _evict(v, recs, nrec, a, aux, cnt, tr, kh, fs, fval, findex, fshift, loss, hp) -> int:  # pragma: no cover
    """Tenant ``v`` leaves after its last use so far: copied out first if still needed; an early swap-in
    not used yet is taken back instead, as if never made (its record marked, bucket -1)."""
    nxt = tr[v, NEXT_USE]
    if tr[v, EARLY_REC] >= 0:
        recs[tr[v, EARLY_REC], 0] = -1
        cnt[6] += 1
        tr[v, EARLY_REC] = -1
        _remove(a, aux, cnt, tr, kh, fs, fval, findex, fshift, v, -1)
        tr[v, WHERE] = -1
        cnt[7] = min(cnt[7], nxt)
        _hp_push(hp, cnt, nxt, v)
        return nrec
    kp = tr[v, LAST]
    if (nxt != INF or v == loss) and not tr[v, HOST]:
        nrec = _record(recs, nrec, kp + 1, OUT, v, -1, -1)
        tr[v, HOST], tr[v, HOST_AT] = 1, kp
    nrec = _record(recs, nrec, kp + 1, FREE, v, -1, -1)
    _remove(a, aux, cnt, tr, kh, fs, fval, findex, fshift, v, kp)
    tr[v, WHERE], tr[v, RELEASED] = -1, kp
    if nxt != INF:
        _hp_push(hp, cnt, nxt, v)
    return nrec


# -- tensors waiting on the host, a binary heap by (next use, tensor) in ``hp`` (rows: next use, tensor)
# with cnt[5] entries; as in the reference (heapq), stale entries stay until they reach the top.


@_inline
def _hp_less(hp: np.ndarray, i: int, j: int) -> bool:
    return hp[0, i] < hp[0, j] or (hp[0, i] == hp[0, j] and hp[1, i] < hp[1, j])


@_inline
def _hp_push(hp: np.ndarray, cnt: np.ndarray, key: int, t: int) -> None:
    i = cnt[5]
    cnt[5] += 1
    hp[0, i], hp[1, i] = key, t
    while i > 0 and _hp_less(hp, i, (i - 1) // 2):
        up = (i - 1) // 2
        hp[0, i], hp[0, up], hp[1, i], hp[1, up] = hp[0, up], hp[0, i], hp[1, up], hp[1, i]
        i = up


@_inline
def _hp_pop(hp: np.ndarray, cnt: np.ndarray) -> None:
    cnt[5] -= 1
    n = cnt[5]
    hp[0, 0], hp[1, 0] = hp[0, n], hp[1, n]
    j = 0
    while True:
        s, left, right = j, 2 * j + 1, 2 * j + 2
        if left < n and _hp_less(hp, left, s):
            s = left
        if right < n and _hp_less(hp, right, s):
            s = right
        if s == j:
            return
        hp[0, j], hp[0, s], hp[1, j], hp[1, s] = hp[0, s], hp[0, j], hp[1, s], hp[1, j]
        j = s


@numba.njit(cache=True)
def _program_order(recs: np.ndarray, n_ops: int) -> np.ndarray:
    """The records in program order, by (bucket, kind), stable (a counting sort); those taken back
    (bucket -1) are left out."""
    n_keys = 4 * (n_ops + 1)
    start = np.zeros(n_keys + 1, np.int64)
    for r in range(recs.shape[0]):
        if recs[r, 0] >= 0:
            start[recs[r, 0] * 4 + recs[r, 1] + 1] += 1
    for k in range(n_keys):
        start[k + 1] += start[k]
    order = np.empty(start[n_keys], np.int64)
    for r in range(recs.shape[0]):
        if recs[r, 0] >= 0:
            key = recs[r, 0] * 4 + recs[r, 1]
            order[start[key]] = r
            start[key] += 1
    return order


# -- when each byte of the arena fell free (arena.Segments, compiled; the planner keeps schedule
# positions, the simulator times): segments tile [0, top) as a doubly linked list in offset order
# (columns SLO, SHI, SNX, SPV of ``s``, a row per segment; values in ``val``), and ``bucket[b]`` is the
# segment holding byte b << shift (a power of two, so no division), so a look-up walks a few segments,
# not a list.

SLO, SHI, SNX, SPV = range(4)
BUCKETS = 4096


@numba.njit(cache=True)
def _segments(top: int, n_assign: int, first: float) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """Room for ``n_assign`` assignments over [0, top), every byte holding ``first``."""
    s = np.empty((2 * n_assign + 2, 4), np.int64)
    s[0, SLO], s[0, SHI], s[0, SNX], s[0, SPV] = 0, max(top, 1), -1, -1
    shift = 8
    while BUCKETS << shift < top:
        shift += 1
    return s, np.full(2 * n_assign + 2, first, np.float64), np.zeros(BUCKETS + 1, np.int64), shift


@_inline
def _first_bucket(b: int, shift: int) -> int:
    """The first bucket that starts at or after byte ``b``."""
    return (b + (1 << shift) - 1) >> shift


@_inline
def _seg_find(lo: int, s: np.ndarray, bucket: np.ndarray, shift: int) -> int:
    x = bucket[lo >> shift]
    while s[x, SHI] <= lo:
        x = s[x, SNX]
    return x


@_inline
def _seg_max(lo: int, hi: int, s: np.ndarray, val: np.ndarray, bucket: np.ndarray, shift: int) -> float:
    x = _seg_find(lo, s, bucket, shift)
    most = -np.inf  # (the segments tile the range: some value is met)
    while x >= 0 and s[x, SLO] < hi:
        most = max(most, val[x])
        x = s[x, SNX]
    return most


@_inline
def _seg_point(lo: int, hi: int, x: int, bucket: np.ndarray, shift: int) -> None:
    """Buckets whose first byte lies in [lo, hi) now start in segment x."""
    for b in range(_first_bucket(lo, shift), _first_bucket(hi, shift)):
        bucket[b] = x


@_inline
def _seg_new(s: np.ndarray, val: np.ndarray, n: int, lo: int, hi: int, v: float, prev: int, nxt: int) -> None:
    """Node n takes [lo, hi) between prev and nxt."""
    s[n, SLO], s[n, SHI], s[n, SPV], s[n, SNX], val[n] = lo, hi, prev, nxt, v
    if prev >= 0:
        s[prev, SNX] = n
    if nxt >= 0:
        s[nxt, SPV] = n


@_inline
def _seg_assign(lo: int, hi: int, v: float, s: np.ndarray, val: np.ndarray, bucket: np.ndarray, shift: int,
                n: int) -> int:
    """[lo, hi) now holds ``v``; returns how many nodes are in use. A segment cut in three keeps its id
    for the side with more buckets, so re-pointing buckets costs little overall."""
    x = _seg_find(lo, s, bucket, shift)
    x_lo, x_hi, x_v = s[x, SLO], s[x, SHI], val[x]
    if x_hi >= hi:  # one segment holds [lo, hi)
        if x_lo == lo and x_hi == hi:
            val[x] = v
            return n
        left = _first_bucket(lo, shift) - _first_bucket(x_lo, shift)
        right = _first_bucket(x_hi, shift) - _first_bucket(hi, shift)
        if x_lo < lo and (x_hi == hi or left >= right):  # x keeps the left part
            s[x, SHI] = lo
            _seg_new(s, val, n, lo, hi, v, x, s[x, SNX])
            _seg_point(lo, hi, n, bucket, shift)
            if x_hi > hi:
                _seg_new(s, val, n + 1, hi, x_hi, x_v, n, s[n, SNX])
                _seg_point(hi, x_hi, n + 1, bucket, shift)
                return n + 2
            return n + 1
        s[x, SLO] = hi  # x keeps the right part
        _seg_new(s, val, n, lo, hi, v, s[x, SPV], x)
        _seg_point(lo, hi, n, bucket, shift)
        if x_lo < lo:
            _seg_new(s, val, n + 1, x_lo, lo, x_v, s[n, SPV], n)
            _seg_point(x_lo, lo, n + 1, bucket, shift)
            return n + 2
        return n + 1
    y = s[x, SNX]  # [lo, hi) spans several segments: drop those inside, trim the two at the ends
    while s[y, SHI] <= hi and s[y, SNX] >= 0:
        y = s[y, SNX]
    if s[y, SHI] <= hi:  # the last segment ends at hi exactly (top of the arena)
        y_next = -1
    else:
        s[y, SLO] = max(s[y, SLO], hi)
        y_next = y
    if x_lo < lo:
        s[x, SHI] = lo
        _seg_new(s, val, n, lo, hi, v, x, y_next)
    else:
        _seg_new(s, val, n, lo, hi, v, s[x, SPV], y_next)
    _seg_point(lo, hi, n, bucket, shift)
    return n + 1


# One compiled copy for the planner, which removes tenants at five places (inlined at each, numba took
# 40 s more to compile), while the simulator's loop inlines its one call.
_seg_assign_call = _leaf(_seg_assign.py_func)


@numba.njit(cache=True)
def _simulate(schedule, recs, out_off, top, size, in_ptr, in_idx, out_ptr, out_idx, op_ms, nbytes,
              copy):  # pragma: no cover - compiled
    """simulate.simulate on the records: three FIFO streams, one pass in program order."""
    n_t = len(out_off)
    s, val, index, shift = _segments(top, recs.shape[0], 0.0)
    times = np.zeros((3, n_t), np.float64)
    return _simulate_loop(schedule, recs, _program_order(recs, len(schedule)), out_off, out_off.copy(), size,
                          in_ptr, in_idx, out_ptr, out_idx, op_ms, nbytes, copy, s, val, index, shift, times,
                          np.zeros(len(schedule), np.float64))


@_leaf
def _simulate_loop(schedule, recs, order, out_off, where, size, in_ptr, in_idx, out_ptr, out_idx, op_ms, nbytes,
                   copy, s, val, index, shift, times, op_end) -> tuple:  # pragma: no cover - compiled
    """``_simulate``'s pass; ``where`` starts as the home offsets of what starts on the device (runs set
    the rest), ``times`` holds when each tensor is ready, its host copy is, and it was copied out."""
    ready, host_ready, copied_out = times[0], times[1], times[2]
    n_s = 1
    latency, h2d_bw, d2h_bw = copy[0], copy[1], copy[2]
    compute = h2d_clock = d2h_clock = 0.0
    h2d = d2h = 0
    for r in order:
        bucket, kind, t, offset = recs[r, 0], recs[r, 1], recs[r, 2], recs[r, 3]
        after = op_end[bucket - 1] if bucket > 0 else 0.0
        if kind == RUN:
            op = t
            start = compute
            for j in range(in_ptr[op], in_ptr[op + 1]):
                start = max(start, ready[in_idx[j]])
            for j in range(out_ptr[op], out_ptr[op + 1]):
                u = out_idx[j]
                start = max(start, _seg_max(out_off[u], out_off[u] + size[u], s, val, index, shift))
            end = start + op_ms[op]
            compute = op_end[bucket - 1] = end
            for j in range(out_ptr[op], out_ptr[op + 1]):
                u = out_idx[j]
                where[u], ready[u] = out_off[u], end
        elif kind == IN:
            start = max(max(h2d_clock, after),
                        max(_seg_max(offset, offset + size[t], s, val, index, shift), host_ready[t]))
            h2d_clock = ready[t] = start + 1e3 * (latency + nbytes[t] / h2d_bw)
            where[t] = offset
            h2d += nbytes[t]
        elif kind == OUT:
            start = max(max(d2h_clock, after), ready[t])
            d2h_clock = host_ready[t] = copied_out[t] = start + 1e3 * (latency + nbytes[t] / d2h_bw)
            d2h += nbytes[t]
        else:
            when = max(max(after, copied_out[t]), ready[t])
            n_s = _seg_assign(where[t], where[t] + size[t], when, s, val, index, shift, n_s)
            copied_out[t] = 0.0
            where[t] = -1
    return max(compute, max(h2d_clock, d2h_clock)), h2d, d2h


@_inline
def _before(priority: np.ndarray, a: int, b: int) -> bool:
    return priority[a] > priority[b] or (priority[a] == priority[b] and a < b)


@_leaf
def _ready_push(heap: np.ndarray, size: int, op: int, priority: np.ndarray) -> None:
    i = size
    heap[i] = op
    while i > 0 and _before(priority, heap[i], heap[(i - 1) // 2]):
        heap[i], heap[(i - 1) // 2] = heap[(i - 1) // 2], heap[i]
        i = (i - 1) // 2


@_leaf
def _ready_pop(heap: np.ndarray, size: int, priority: np.ndarray) -> int:
    top = heap[0]
    size -= 1
    heap[0] = heap[size]
    j = 0
    while True:
        s, left, right = j, 2 * j + 1, 2 * j + 2
        if left < size and _before(priority, heap[left], heap[s]):
            s = left
        if right < size and _before(priority, heap[right], heap[s]):
            s = right
        if s == j:
            return top
        heap[s], heap[j] = heap[j], heap[s]
        j = s


@numba.njit(cache=True)
def priority_order(priority: np.ndarray, n_preds: np.ndarray, succ_ptr: np.ndarray,
                   succ_idx: np.ndarray) -> np.ndarray:  # pragma: no cover - compiled
    """The topological order that always runs the ready op of highest priority (ties: lowest index)."""
    n = len(priority)
    waiting = n_preds.copy()
    heap = np.empty(n, np.int64)
    order = np.empty(n, np.int64)
    size = done = 0
    for op in range(n):
        if waiting[op] == 0:
            _ready_push(heap, size, op, priority)
            size += 1
    while size > 0:
        top = _ready_pop(heap, size, priority)
        size -= 1
        order[done] = top
        done += 1
        for k in range(succ_ptr[top], succ_ptr[top + 1]):
            nxt = succ_idx[k]
            waiting[nxt] -= 1
            if waiting[nxt] == 0:
                _ready_push(heap, size, nxt, priority)
                size += 1
    return order[:done]
