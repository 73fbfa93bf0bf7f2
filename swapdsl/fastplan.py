"""The optimiser's inner loop, compiled: swap planning plus simulation on flat arrays.

``Evaluator`` makes exactly the program ``swapplan.plan_swaps`` makes and
times it exactly as ``simulate.simulate`` does, but on integer arrays in
numba-compiled code and without building a Plan: the genetic search scores
thousands of candidates this way and builds a real Plan only for the winner.
The Python planner and simulator stay the reference; a property test holds
the two to the same iteration time and bus bytes on random graphs, caps and
policies.

Encoding: slab ``(k, i)`` is the global slab ``base[k] + i``; the program is
a list of records (bucket, kind, tensor, slab) where bucket ``b`` holds what
is issued after the op at schedule position ``b - 1``, and kinds order a
bucket as the Python planner does: run, swap-outs, frees, swap-ins.
"""

from __future__ import annotations

import attrs
import numba
import numpy as np

from swapdsl.errors import SwpError
from swapdsl.ir import Kind
from swapdsl.pool import Pool
from swapdsl.problem import Problem
from swapdsl.swapplan import Policy

INF = 1 << 60
RUN, OUT, FREE, IN = 0, 1, 2, 3
VICTIMS = {"lru": 0, "belady": 1}
PREFETCH = {"none": 0, "earliest": 1, "ahead": 2}


@attrs.frozen
class Timing:
    iteration_ms: float
    h2d_bytes: int
    d2h_bytes: int


def _csr(rows: tuple[tuple[int, ...], ...]) -> tuple[np.ndarray, np.ndarray]:
    ptr = np.zeros(len(rows) + 1, np.int64)
    ptr[1:] = np.cumsum([len(r) for r in rows])
    return ptr, np.array([t for r in rows for t in r], np.int64)


class Evaluator:
    """A Problem flattened once into arrays; each call plans and times one candidate."""

    def __init__(self, p: Problem, sizes: tuple[int, ...]) -> None:
        n = len(p.names)
        cls_of = {s: k for k, s in enumerate(sizes)}
        self.cls = np.array([cls_of[b] for b in p.slab_bytes], np.int64)
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
        self.loss = p.loss
        dev = p.device
        self.copy = np.array([dev.copy_latency_s, dev.h2d_bw, dev.d2h_bw], np.float64)
        self.n_sizes = len(sizes)

    def __call__(self, schedule: list[int], pool: Pool, pinned: frozenset[int], policy: Policy) -> Timing:
        if len(pool.counts) != self.n_sizes:
            raise ValueError("pool does not match the problem's size classes")
        pin = np.zeros(len(self.cls), np.bool_)
        pin[list(pinned)] = True
        policy_code = np.array([VICTIMS[policy.victim], PREFETCH[policy.prefetch], int(policy.offload)], np.int64)
        recs, out_slab, status = _plan(
            np.asarray(schedule, np.int64), np.asarray(pool.counts, np.int64), pin, policy_code,
            self.cls, self.in_ptr, self.in_idx, self.out_ptr, self.out_idx, self.in_place, self.is_input,
            self.persistent, self.fwd_act, self.upd_old, self.upd_new, self.by_name, self.loss)
        if status != 0:
            raise SwpError("internal: the compiled swap planner found no slab" if status == 2
                           else "internal: pool sized below its pinned tensors")
        ms, h2d, d2h = _simulate(np.asarray(schedule, np.int64), recs, out_slab, self.in_ptr, self.in_idx,
                                 self.out_ptr, self.out_idx, self.op_ms, self.nbytes, self.copy, int(sum(pool.counts)))
        return Timing(float(ms), int(h2d), int(d2h))


# -- compiled helpers: free slabs per class as min-heaps of slab indices


@numba.njit(cache=True, inline="always")
def _heap_push(heap: np.ndarray, lo: int, size: int, value: int) -> None:
    i = size
    heap[lo + i] = value
    while i > 0:
        parent = (i - 1) // 2
        if heap[lo + parent] <= heap[lo + i]:
            break
        heap[lo + parent], heap[lo + i] = heap[lo + i], heap[lo + parent]
        i = parent


@numba.njit(cache=True, inline="always")
def _heap_pop(heap: np.ndarray, lo: int, size: int) -> int:
    top = heap[lo]
    size -= 1
    heap[lo] = heap[lo + size]
    i = 0
    while True:
        small, left, right = i, 2 * i + 1, 2 * i + 2
        if left < size and heap[lo + left] < heap[lo + small]:
            small = left
        if right < size and heap[lo + right] < heap[lo + small]:
            small = right
        if small == i:
            return top
        heap[lo + small], heap[lo + i] = heap[lo + i], heap[lo + small]
        i = small


@numba.njit(cache=True, inline="always")
def _take(k: int, borrow: bool, heap: np.ndarray, hlen: np.ndarray, base: np.ndarray) -> int:
    """A free slab of class k or (borrowing) of a larger class, as a global slab; -1 if none."""
    stop = -1 if borrow else k - 1
    for c in range(k, stop, -1):
        if hlen[c] > 0:
            i = _heap_pop(heap, base[c], hlen[c])
            hlen[c] -= 1
            return base[c] + i
    return -1


@numba.njit(cache=True, inline="always")
def _record(recs: np.ndarray, n: int, bucket: int, kind: int, t: int, g: int) -> np.ndarray:
    if n == recs.shape[0]:
        bigger = np.empty((2 * n, 4), np.int64)
        bigger[:n] = recs
        recs = bigger
    recs[n, 0], recs[n, 1], recs[n, 2], recs[n, 3] = bucket, kind, t, g
    return recs


@numba.njit(cache=True, inline="always")
def _next_use(t: int, next_i: np.ndarray, use_ptr: np.ndarray, use_pos: np.ndarray) -> int:
    return use_pos[next_i[t]] if next_i[t] < use_ptr[t + 1] else INF


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


@numba.njit(cache=True, inline="always")
def _sort_todo(todo: np.ndarray, n: int, cls: np.ndarray) -> None:
    """placement_order: largest class first (lowest class index), then by id; insertion sort."""
    for i in range(1, n):
        t = todo[i]
        j = i - 1
        while j >= 0 and (cls[todo[j]] > cls[t] or (cls[todo[j]] == cls[t] and todo[j] > t)):
            todo[j + 1] = todo[j]
            j -= 1
        todo[j + 1] = t


@numba.njit(cache=True, inline="always")
def _sort_ints(a: np.ndarray, n: int) -> None:
    for i in range(1, n):
        x, j = a[i], i - 1
        while j >= 0 and a[j] > x:
            a[j + 1] = a[j]
            j -= 1
        a[j + 1] = x


@numba.njit(cache=True, inline="always")
def _victim(k: int, base: np.ndarray, owner: np.ndarray, mark: np.ndarray, stamp: int, pinned: np.ndarray,
            is_input: np.ndarray, belady: bool, last_access: np.ndarray, slab_next: np.ndarray) -> int:
    """The tenant of class k to evict: furthest next use (belady) or least recent use, ties by id.

    ``slab_next`` caches each tenant's next use by slab, so the scan reads one array in order and
    looks a tenant up only when it would win."""
    best, k1, k2 = -1, 0, 0
    for g in range(base[k], base[k + 1]):
        v = owner[g]
        if v < 0:
            continue
        if belady:
            a, b = -slab_next[g], -v
        else:
            a, b = last_access[v], v
        if (best < 0 or a < k1 or (a == k1 and b < k2)) and mark[v] != stamp and not pinned[v] \
                and not is_input[v]:
            best, k1, k2 = v, a, b
    return best


@numba.njit(cache=True)
def _plan(schedule, counts, pinned0, policy, cls, in_ptr, in_idx, out_ptr, out_idx, in_place, is_input,
          persistent, fwd_act, upd_old, upd_new, by_name, loss):  # pragma: no cover - compiled
    n_t, n_ops, n_cls = len(cls), len(schedule), len(counts)
    belady, prefetch, offload = policy[0] == 1, policy[1], policy[2] == 1
    base = np.zeros(n_cls + 1, np.int64)
    for k in range(n_cls):
        base[k + 1] = base[k] + counts[k]
    n_slabs = base[n_cls]
    heap = np.empty(n_slabs, np.int64)
    hlen = counts.copy()
    for k in range(n_cls):
        for i in range(counts[k]):
            heap[base[k] + i] = i
    slab_cls = np.empty(n_slabs, np.int64)
    for k in range(n_cls):
        slab_cls[base[k]:base[k + 1]] = k
    owner = np.full(n_slabs, -1, np.int64)
    free_since = np.full(n_slabs, -1, np.int64)
    slab_next = np.zeros(n_slabs, np.int64)  # the next use of each slab's tenant (see _victim)
    where = np.full(n_t, -1, np.int64)
    out_slab = np.full(n_t, -1, np.int64)
    pinned = pinned0.copy()
    host = is_input | (persistent & ~pinned0)
    host_at = np.full(n_t, -1, np.int64)
    released = np.full(n_t, -1, np.int64)
    last_access = np.full(n_t, -1, np.int64)
    mark = np.zeros(n_t, np.int64)  # == stamp: touched by the current op
    resident = np.zeros(n_t, np.int64)  # == stamp: an input already on the device before the current op
    is_out = np.zeros(n_t, np.int64)
    write_back = np.zeros(n_t, np.bool_)
    for j in range(len(upd_old)):
        if persistent[upd_old[j]] and not pinned0[upd_old[j]]:
            write_back[upd_new[j]] = True
    use_ptr, use_pos = _uses(schedule, in_ptr, in_idx, n_t)
    next_i = use_ptr[:-1].copy()
    turn = n_ops
    for pos in range(n_ops):
        if not fwd_act[out_idx[out_ptr[schedule[pos]]]]:
            turn = pos
            break
    recs = np.empty((4 * n_ops + 16, 4), np.int64)
    nrec = 0
    for sweep in range(2):  # pinned tensors by name, then inputs by name
        for t in by_name:
            if (sweep == 0 and pinned[t]) or (sweep == 1 and is_input[t]):
                g = _take(cls[t], False, heap, hlen, base)
                if g < 0:
                    return recs[:0], out_slab, 1
                where[t], owner[g], out_slab[t] = g, t, g  # (out_slab doubles as the home slab)
                slab_next[g] = _next_use(t, next_i, use_ptr, use_pos)
    todo = np.empty(64, np.int64)
    for pos in range(n_ops):
        op, stamp = schedule[pos], pos + 1
        i0, i1, o0, o1 = in_ptr[op], in_ptr[op + 1], out_ptr[op], out_ptr[op + 1]
        ipo = out_idx[o0] if in_place[op] else -1
        if todo.shape[0] < (i1 - i0) + (o1 - o0) + 4:
            todo = np.empty(2 * ((i1 - i0) + (o1 - o0) + 4), np.int64)
        ntodo = 0
        for j in range(i0, i1):
            t = in_idx[j]
            mark[t] = stamp
            if where[t] >= 0:
                resident[t] = stamp
            elif is_out[t] != -stamp:  # not yet queued (inputs may repeat)
                is_out[t] = -stamp
                todo[ntodo] = t
                ntodo += 1
        for j in range(o0, o1):
            t = out_idx[j]
            mark[t] = stamp
            if t != ipo:
                is_out[t] = stamp
                todo[ntodo] = t
                ntodo += 1
        _sort_todo(todo, ntodo, cls)
        while ntodo > 0:
            t = todo[0]
            ntodo -= 1
            for j in range(ntodo):
                todo[j] = todo[j + 1]
            # acquire: a free slab, else a victim's, else bounce an input out of a larger class's slab
            g, since, bounced = _take(cls[t], True, heap, hlen, base), -1, -1
            if g >= 0:
                since = free_since[g]
            else:
                v = -1
                for k in range(cls[t], -1, -1):
                    v = _victim(k, base, owner, mark, stamp, pinned, is_input, belady, last_access, slab_next)
                    if v >= 0:
                        break
                if v < 0:
                    for k in range(cls[t], -1, -1):
                        for h in range(base[k], base[k + 1]):
                            u = owner[h]
                            if u >= 0 and resident[u] == stamp and cls[u] > k and not pinned[u] \
                                    and not is_input[u] and (v < 0 or u < v):
                                v = u
                        if v >= 0:
                            break
                    if v < 0:
                        return recs[:0], out_slab, 2
                    bounced = v
                    resident[v] = 0
                kp = last_access[v]
                if (_next_use(v, next_i, use_ptr, use_pos) != INF or v == loss) and not host[v]:
                    recs = _record(recs, nrec, kp + 1, OUT, v, -1)
                    nrec += 1
                    host[v], host_at[v] = True, kp
                recs = _record(recs, nrec, kp + 1, FREE, v, -1)
                nrec += 1
                g = where[v]
                where[v], owner[g], released[v], free_since[g] = -1, -1, kp, kp
                since = kp
            if bounced >= 0:
                todo[ntodo] = bounced
                ntodo += 1
                _sort_todo(todo, ntodo, cls)
            if is_out[t] == stamp:
                out_slab[t] = g
            else:
                floor = max(since, released[t], host_at[t])
                at = pos - 1 if prefetch == 0 else (floor if prefetch == 1 else pos - 2)
                recs = _record(recs, nrec, max(at, floor) + 1, IN, t, g)
                nrec += 1
            where[t], owner[g], slab_next[g] = g, t, _next_use(t, next_i, use_ptr, use_pos)
        if ipo >= 0:
            old = in_idx[i0]
            g = where[old]
            where[old] = -1
            where[ipo], owner[g], out_slab[ipo] = g, ipo, g
            slab_next[g] = _next_use(ipo, next_i, use_ptr, use_pos)
            if pinned[old]:
                pinned[ipo] = True
        recs = _record(recs, nrec, pos + 1, RUN, op, -1)
        nrec += 1
        for j in range(i0, i1):
            last_access[in_idx[j]] = pos
        for j in range(o0, o1):
            last_access[out_idx[j]] = pos
        for j in range(i0, i1):
            t = in_idx[j]
            if next_i[t] < use_ptr[t + 1] and use_pos[next_i[t]] == pos:
                next_i[t] += 1
                if where[t] >= 0:
                    slab_next[where[t]] = _next_use(t, next_i, use_ptr, use_pos)
        # after the run: write-backs and vDNN offloads, then frees of what is done with (by tensor id)
        for j in range(o0, o1):
            t = out_idx[j]
            nxt = _next_use(t, next_i, use_ptr, use_pos)
            off = offload and pos < turn and fwd_act[t] and nxt != INF and use_pos[use_ptr[t + 1] - 1] >= turn
            if (write_back[t] or off) and not host[t]:
                recs = _record(recs, nrec, pos + 1, OUT, t, -1)
                nrec += 1
                host[t], host_at[t] = True, pos
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
            if (j > 0 and todo[j - 1] == t) or where[t] < 0 or pinned[t] or t == loss:
                continue
            nxt = _next_use(t, next_i, use_ptr, use_pos)
            if nxt == INF or (offload and host[t] and pos < turn and turn <= nxt):
                recs = _record(recs, nrec, pos + 1, FREE, t, -1)
                nrec += 1
                g = where[t]
                where[t], owner[g], released[t], free_since[g] = -1, -1, pos, pos
                k = slab_cls[g]
                _heap_push(heap, base[k], hlen[k], g - base[k])
                hlen[k] += 1
    return recs[:nrec], out_slab, 0


@numba.njit(cache=True)
def _program_order(recs: np.ndarray, n_ops: int) -> np.ndarray:
    """Records in program order: by (bucket, kind), stable (a counting sort)."""
    n_keys = 4 * (n_ops + 1)
    start = np.zeros(n_keys + 1, np.int64)
    for r in range(recs.shape[0]):
        start[recs[r, 0] * 4 + recs[r, 1] + 1] += 1
    for k in range(n_keys):
        start[k + 1] += start[k]
    order = np.empty(recs.shape[0], np.int64)
    for r in range(recs.shape[0]):
        key = recs[r, 0] * 4 + recs[r, 1]
        order[start[key]] = r
        start[key] += 1
    return order


@numba.njit(cache=True)
def _simulate(schedule, recs, out_slab, in_ptr, in_idx, out_ptr, out_idx, op_ms, nbytes, copy,
              n_slabs):  # pragma: no cover - compiled
    """simulate.simulate on the records: three FIFO streams, one pass in program order."""
    free_at = np.zeros(max(n_slabs, 1), np.float64)
    n_t = len(out_slab)
    ready = np.zeros(n_t, np.float64)
    host_ready = np.zeros(n_t, np.float64)
    copied_out = np.zeros(n_t, np.float64)
    where = out_slab.copy()  # the home slabs of what starts on the device; runs set the rest
    op_end = np.zeros(len(schedule), np.float64)
    latency, h2d_bw, d2h_bw = copy[0], copy[1], copy[2]
    compute = h2d_clock = d2h_clock = 0.0
    h2d = d2h = 0
    for r in _program_order(recs, len(schedule)):
        bucket, kind, t, g = recs[r, 0], recs[r, 1], recs[r, 2], recs[r, 3]
        after = op_end[bucket - 1] if bucket > 0 else 0.0
        if kind == RUN:
            op = t
            start = compute
            for j in range(in_ptr[op], in_ptr[op + 1]):
                start = max(start, ready[in_idx[j]])
            for j in range(out_ptr[op], out_ptr[op + 1]):
                start = max(start, free_at[out_slab[out_idx[j]]])
            end = start + op_ms[op]
            compute = op_end[bucket - 1] = end
            for j in range(out_ptr[op], out_ptr[op + 1]):
                u = out_idx[j]
                where[u], ready[u] = out_slab[u], end
        elif kind == IN:
            start = max(max(h2d_clock, after), max(free_at[g], host_ready[t]))
            h2d_clock = ready[t] = start + 1e3 * (latency + nbytes[t] / h2d_bw)
            where[t] = g
            h2d += nbytes[t]
        elif kind == OUT:
            start = max(max(d2h_clock, after), ready[t])
            d2h_clock = host_ready[t] = copied_out[t] = start + 1e3 * (latency + nbytes[t] / d2h_bw)
            d2h += nbytes[t]
        else:
            free_at[where[t]] = max(max(after, copied_out[t]), ready[t])
            copied_out[t] = 0.0
            where[t] = -1
    return max(compute, max(h2d_clock, d2h_clock)), h2d, d2h


@numba.njit(cache=True, inline="always")
def _before(priority: np.ndarray, a: int, b: int) -> bool:
    return priority[a] > priority[b] or (priority[a] == priority[b] and a < b)


@numba.njit(cache=True, inline="always")
def _ready_push(heap: np.ndarray, size: int, op: int, priority: np.ndarray) -> None:
    i = size
    heap[i] = op
    while i > 0 and _before(priority, heap[i], heap[(i - 1) // 2]):
        heap[i], heap[(i - 1) // 2] = heap[(i - 1) // 2], heap[i]
        i = (i - 1) // 2


@numba.njit(cache=True, inline="always")
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
