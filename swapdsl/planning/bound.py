"""Lower bounds on any plan's iteration time under a memory cap.

``ideal_ms`` is the sum of op times: every op runs on the one compute stream,
so no plan is faster, with any amount of memory. (Data-parallel all-reduces run
on the network lane beside it: the ideal is the longer lane's sum, and F and B
below count the compute stream's ops alone. The lane's all-reduces read
gradients, made after T below, so end - T is also at least N: the time of the
op that makes the first all-reduce's input, the lane's sum, and the time of an
op that reads the last one's mean; and, since the host lane's all-reduces share
the one network link, at least the sum of every all-reduce after T on both.)

``bound_ms`` adds what the bus must carry. Let C be the ops that read the
gradient seed (the `fill` that starts the backward pass), A the ops that are
ancestors of every op in C, and D the descendants of the seed (not the seed
itself: it reads nothing, so it may run at any time). In any valid
order every op of A runs before any op of D: let T be the moment the first
op of D starts. Let S be the tensors that exist at T and are read by an op of
D: those made by an op of A, plus persistent tensors and inputs read by D;
S_a the part made by A. At T at most `cap` bytes are on the device (tensors
in flight count: their bytes are taken), so

- at least |S_a| - cap bytes of S_a are on the host, which they reached by
  device-to-host copies finished before T;
- at least |S| - cap bytes of S are on the host, and every one of them is
  read after T, so host-to-device copies after T carry at least that much.

Persistent tensors start where they end, and at most `cap` bytes of them
start on the device, so of those read by A at least P_A - cap come in before
T, and of those updated (by ops of D) at least P_upd - cap are written back
after T. Copies in one direction share one stream, so with every excess
floored at zero:

    T       >= max(F, (|S_a| - cap) / d2h, (P_A - cap) / h2d)
    end - T >= max(B, N, (|S| - cap) / h2d, (P_upd - cap) / d2h)

and the bound is the larger of ideal and their sum. Each excess also pays one
copy latency per tensor for the fewest tensors that add up to it (a copy
moves one whole tensor). Whole-iteration traffic gives two more terms, kept
for graphs where they are larger: (|S_a| - cap + P_read - cap) / h2d and
(|S_a| - cap + P_upd - cap) / d2h.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable

import attrs

from swapdsl.devices.profiles import Device
from swapdsl.plan import program
from swapdsl.plan.program import NET_OPS
from swapdsl.planning.problem import Edges, Problem, edges


def ideal_ms(p: Problem) -> float:
    net = p.net
    return program.ideal_ms(p.op_ms, (i in net for i in range(p.n_ops)))


def compute_ms(p: Problem) -> float:
    """The compute stream's op times (all but the network lane's all-reduces)."""
    net = p.net
    return sum(ms for i, ms in enumerate(p.op_ms) if i not in net)


def _closure(start: set[int], links: list[list[int]]) -> set[int]:
    seen, todo = set(start), list(start)
    while todo:
        for nxt in links[todo.pop()]:
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


@attrs.frozen
class _Cut:
    """What the bounds read at T, the start of the first op that descends from the gradient seed."""

    f: float  # op time before T (ops of A)
    b: float  # op time after T (ops of D)
    crossing: list[int]  # S_a: made by A, read by D
    standing: list[int]  # persistent tensors and inputs read by D
    fwd_read: list[int]  # persistent tensors read by A
    updated: list[int]  # persistent tensors updated in place on the device
    read: int  # bytes of persistent tensors read at all
    rebuilds: list[tuple[float, int]]  # per op of A making part of S_a: (its time, those bytes)
    net: float  # the network lane's least time after T (``_net_after``)


def _cut(p: Problem) -> _Cut | None:
    e = edges(p)
    producer, consumers, preds, succs = e.producer, e.readers, e.preds, e.succs
    seeds = [op for op in range(p.n_ops) if not p.op_inputs[op] and p.op_outputs[op]
             and p.kinds[p.op_outputs[op][0]] == "gradient"]
    if not seeds:
        return None
    first = {c for s in seeds for c in succs[s]}
    backward = _closure(set(seeds), succs)
    before = set.intersection(*(_closure({c}, preds) - {c} for c in first)) if first else set()
    before -= backward
    read_after = {t for op in backward for t in p.op_inputs[op]}
    crossing = {t for op in before for t in p.op_outputs[op]} & read_after
    read_before = {t for op in before for t in p.op_inputs[op]}
    net = p.net  # (the network lane's all-reduces: not compute time on either side of T, and never rerun)
    before, backward = before - net, backward - net - set(seeds)  # (a seed has no inputs: it may run before T)
    rebuilds = [(p.op_ms[op], sum(p.nbytes[t] for t in p.op_outputs[op] if t in crossing)) for op in sorted(before)]
    return _Cut(sum(p.op_ms[op] for op in before), sum(p.op_ms[op] for op in backward),
                [p.nbytes[t] for t in crossing], [p.nbytes[t] for t in read_after - producer.keys()],
                [p.nbytes[t] for t in p.persistent if t in read_before], [p.nbytes[old] for old, new in p.updates if new in producer],
                sum(p.nbytes[t] for t in p.persistent if t in consumers), [r for r in rebuilds if r[1] > 0],
                _net_after(p, e, backward))


def _net_after(p: Problem, e: Edges, after: set[int]) -> float:
    """The least time from T to the end that the network lane needs: its all-reduces of tensors made by
    ``after`` (compute ops that start at T or later) run one at a time after T, the first once the op
    that made its input has run, and the last before an op that reads its mean (0 when one has no
    reader)."""
    late = [i for i in sorted(p.net) if any(q in after for q in e.preds[i])]
    # the host lane's all-reduces average gradients (made after T) over the same link
    link = sum(p.op_ms[i] for i in late) + sum(p.host_ms[i] for i in p.host.ops if p.graph.ops[i].op in NET_OPS)
    if not late:
        return link
    head = min(max(p.op_ms[q] for q in e.preds[i] if q in after) for i in late)
    readers = [[r for t in p.op_outputs[i] for r in e.readers.get(t, [])] for i in late]
    tail = min((min(p.op_ms[r] for r in rs) if rs else 0.0) for rs in readers)
    return max(head + sum(p.op_ms[i] for i in late) + tail, link)


def bound_ms(p: Problem, cap: int) -> float:
    """The bound on plans that swap and never recompute (the module docstring)."""
    ideal, c = ideal_ms(p), _cut(p)
    if c is None:
        return ideal
    dev = p.device
    excess = max(0, sum(c.crossing) - cap)
    until_t = max(c.f, _copies_ms(c.crossing, cap, dev.d2h_bw, dev), _copies_ms(c.fwd_read, cap, dev.h2d_bw, dev))
    after_t = max(c.b, c.net, _copies_ms(c.crossing + c.standing, cap, dev.h2d_bw, dev),
                  _copies_ms(c.updated, cap, dev.d2h_bw, dev))
    return max(ideal, until_t + after_t,
               1e3 * (excess + max(0, c.read - cap)) / dev.h2d_bw,
               1e3 * (excess + max(0, sum(c.updated) - cap)) / dev.d2h_bw)


def recompute_bound_ms(p: Problem, cap: int) -> float:
    """A bound on every plan, recomputing or not.

    Proof. Take any valid plan and T as in the module docstring. A tensor of S_a that at T is neither on
    the device nor on the host is read after T, so it is rebuilt after T, by running again the op of A
    that made it; say the plan runs again after T a set Q of such ops, taking c ms of compute and
    rebuilding y bytes of S_a. Then the device and host hold at least |S_a| - y bytes of S_a at T, so

        T       >= max(F, (|S_a| - cap - y) / d2h, (P_A - cap) / h2d)
        end - T >= max(B + c, N, (|S| - cap - y) / h2d, (P_upd - cap) / d2h)
        end     >= max(compute + c, (|S_a| - cap - y + P_read - cap) / h2d, (|S_a| - cap - y + P_upd - cap) / d2h)

    (excesses floored at zero, as before; the rebuilt tensors' recomputations run on the one compute
    stream after T, and each op's run rebuilds at most the bytes of its outputs in S_a). Let y*(c) be the
    most bytes any set of ops of A costing at most c can rebuild, with ops taken fractionally: the
    greedy cheapest-per-byte frontier, concave and piecewise linear. The plan's y <= y*(c), every term
    above falls as y grows, so end >= g(c), the terms with y*(c) in place of y. Each term is convex in c
    (an affine function of the concave y*, negated and floored, or affine in c), so g is convex and
    piecewise linear, and its minimum over c >= 0 lies at a breakpoint of y*, or where two of its
    affine pieces meet between breakpoints: the least of g over those points is the bound. (It leaves
    out the per-copy latencies of ``bound_ms``, so with no recomputation it is at most that bound.)
    """
    ideal, c = ideal_ms(p), _cut(p)
    if c is None:
        return ideal
    dev = p.device
    xa, x = sum(c.crossing) - cap, sum(c.crossing) + sum(c.standing) - cap
    ms = 1e3
    g1 = [lambda _c, _y: c.f, lambda _c, y: ms * (xa - y) / dev.d2h_bw,
          lambda _c, _y: ms * max(0, sum(c.fwd_read) - cap) / dev.h2d_bw]
    g2 = [lambda cc, _y: c.b + cc, lambda _c, _y: c.net, lambda _c, y: ms * (x - y) / dev.h2d_bw,
          lambda _c, _y: ms * max(0, sum(c.updated) - cap) / dev.d2h_bw]
    read, upd = max(0, c.read - cap), max(0, sum(c.updated) - cap)
    compute = compute_ms(p)
    g3 = [lambda cc, _y: compute + cc, lambda _c, _y: ms * read / dev.h2d_bw, lambda _c, y: ms * (xa - y + read) / dev.h2d_bw,
          lambda _c, _y: ms * upd / dev.d2h_bw, lambda _c, y: ms * (xa - y + upd) / dev.d2h_bw]

    def g(cost: float, y: float) -> float:
        return max(max(h(cost, y) for h in g1) + max(h(cost, y) for h in g2), max(h(cost, y) for h in g3))

    best = math.inf
    for (c0, y0), (c1, y1) in itertools.pairwise(_frontier(c.rebuilds)):
        best = min(best, _segment_min(g, (g1, g2, g3), c0, y0, c1, y1))
    return max(ideal, best)
def _copies_ms(sizes: list[int], cap: int, bw: float, dev: Device) -> float:
    """The least time one link needs to move all but ``cap`` bytes of these tensors, a whole tensor
    per copy: the bytes, plus a latency for each of the fewest tensors that add up to them."""
    excess = sum(sizes) - cap
    if excess <= 0:
        return 0.0
    copies, moved = 0, 0
    for size in sorted(sizes, reverse=True):
        if moved >= excess:
            break
        copies, moved = copies + 1, moved + size
    return 1e3 * (excess / bw + copies * dev.copy_latency_s)


def _frontier(rebuilds: list[tuple[float, int]]) -> list[tuple[float, float]]:
    """The most bytes ops can rebuild for their time, ops taken fractionally, cheapest per byte first:
    (time, bytes) at each breakpoint, from (0, 0) (ops that take no time first)."""
    points = [(0.0, 0.0)]
    for cost, size in sorted(rebuilds, key=lambda r: (r[0] / r[1], r)):
        last = points[-1]
        points.append((last[0] + cost, last[1] + size))
    if len(points) == 1:
        points.append((0.0, 0.0))
    return points


Term = Callable[[float, float], float]


def _segment_min(g: Callable[[float, float], float], groups: tuple[list[Term], ...], c0: float, y0: float,
                 c1: float, y1: float) -> float:
    """The least of ``g`` on the segment where y grows linearly from (c0, y0) to (c1, y1): every term is
    affine there, so the least lies at an end, where two terms of one group meet (a kink of that group's
    maximum), or where the sum of the first two groups meets a term of the third."""
    def at(s: float) -> tuple[float, float]:
        return c0 + s * (c1 - c0), y0 + s * (y1 - y0)

    points = {0.0, 1.0}
    for group in groups:
        lines = [_line(h, at) for h in group]
        points |= {s for a, b in itertools.combinations(lines, 2) if (s := _meet(a, b)) is not None}
    ordered = sorted(points)
    for lo, hi in itertools.pairwise(ordered):  # between kinks, the sum is one affine function
        mid = (lo + hi) / 2
        top = [max(groups[k], key=lambda h: h(*at(mid))) for k in (0, 1)]
        first = _line(lambda c, y: top[0](c, y) + top[1](c, y), at)
        for h in groups[2]:
            s = _meet(first, _line(h, at))
            if s is not None and lo <= s <= hi:
                points.add(s)
    return min(g(*at(s)) for s in points)


def _line(h: Term, at: Callable[[float], tuple[float, float]]) -> tuple[float, float]:
    """An affine term as (value at s = 0, slope in s)."""
    v0 = h(*at(0.0))
    return v0, h(*at(1.0)) - v0


def _meet(a: tuple[float, float], b: tuple[float, float]) -> float | None:
    """Where two affine functions of s in [0, 1] meet, if they cross there."""
    if a[1] == b[1]:
        return None
    s = (b[0] - a[0]) / (a[1] - b[1])
    return s if 0.0 <= s <= 1.0 else None
