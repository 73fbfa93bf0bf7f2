"""A lower bound on every plan that runs its ops first in a given order: a mixed-integer program, solved
by HiGHS (SciPy's ``milp``).

Slot s is the s-th op of the order (its first run); gap q runs from the start of slot q's op to the
start of slot q + 1's (gap -1: before slot 0; gap n-1: to the step's end), its length in ms at
``d[q + 1]``; the objective is their sum, the step. For tensors t and slots s:

- ``r[t,s]`` (binary): t's region is held when slot s starts. An op's inputs and outputs are
  (``r = 1``), a tensor is not before the slot of the op that makes it, and the regions held fit the
  cap less the scratch (an op in place counted once). Inputs are held before slot 0; a persistent
  tensor is if pinned (``pin[t]``, binary), and pinned tensors fit the cap together.
- Taking a region again in gap s-1 (held at s, not at s-1): a copy in beside op s-1 or after it (the
  pair ``inn[t][s]``), or a rerun of the op i that makes t (``rc[i][s]``): their sum is at least
  ``r[t,s] - r[t,s-1]``. A rerun's inputs are there: held at s-1 or s, rebuilt in the gap, or copied in
  and gone again (``passing[t][s]``). A copy out (``ends[t][s]``: it ends in gap s-1) happens where t
  is held at s-1 (or rebuilt or brought in then), before any copy back in; an unpinned persistent
  tensor's new value is copied home, a pinned one is held at the last slot or brought back in the last
  gap (``home``, or a rerun there). A pinned tensor has no host copy, so one brought in again was copied
  out first, from a slot that held it or from the step's start (``saved[t][s]``: that copy ends in gap
  s-1, s >= 0). All of these are
  binary, as in a plan: its copies and reruns are whole (``INTEGER_MOVES``; relaxed to [0, 1], HiGHS
  proves more bounds in its time, 21 against 13 of the 40 graphs of docs/benchmarks.md at 8 s, lower by
  2.3% at the median and by up to 16%).

Time. Gap q holds op q and the reruns for slot q+1. A copy in for slot s starts in gap s-1 (the second
of the pair after op s-1) and lands before the next slot that reads t; a copy out starts after its maker;
a tensor copied back follows its maker, its copy out and its copy in, in that order (a pinned one: its
copy out from the step's start, then its copy in). Each copy stream
runs one copy at a time, so the copies that start after slot j and end before slot k take at most the
gaps between (rows for spans of up to ``WINDOW`` gaps, prefixes and suffixes). Memory in gap q: what is
held at both of its ends and not taken again in between is held throughout, and a copy beside op q
needs room next to that and op q's tensors, one after op q next to that. Copy times are the
simulator's (bytes over the link plus a latency).

Why it is a bound. Take any valid plan with that order and its simulated step. Set ``r`` from the
regions held as each first run starts, ``pin`` to the pinned tensors, the take, rerun and copy variables
to the plan's swap-ins, reruns and swap-outs in the gaps they start or end in, and ``d`` to the gaps
between the simulated starts. The simulator's rules make every row hold: an op waits for its inputs and
output regions; a region is held from a copy's or run's start to its free, and a free waits for the
swap-out; the compute, host-to-device and device-to-host streams are FIFO from time 0. So the plan is a
feasible point whose objective is its step, and the optimum, and any dual bound HiGHS proves, is at most
that step. ``tests/test_exact.py`` checks it against the plans of every method.

Left out, each only lowering the bound: the layout (bytes under the cap need not pack into regions),
memory at a rerun's moment, where a copy sits inside its window beyond the windows' rows (a copy may
be split between windows, as if it could pause), a rerun's inputs in the last gap. Refused: updates on the host
(graph/offload.py). Not decided: the order (``exact_bound`` takes one); no plan is made from a solution.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import attrs
import numpy as np

from swapdsl.common.errors import SwpError
from swapdsl.devices.costs import copy_ms
from swapdsl.plan.program import Plan, Run, scratch_offset
from swapdsl.planning.milp import INFEASIBLE, Milp, dual_bound
from swapdsl.planning.problem import Edges, Problem, edges


@attrs.frozen
class ExactBound:
    """What the program proved: ``bound_ms`` is at most the step of every plan with ``order`` (the optimum
    when ``optimal``, else HiGHS's dual bound at the time limit); ``relaxed_ms`` the best solution it found
    (a plan's step only where the program's relaxations cost nothing), and what that solution moves."""

    bound_ms: float
    relaxed_ms: float | None
    optimal: bool
    seconds: float
    order: tuple[int, ...] | None
    h2d_bytes: float | None
    d2h_bytes: float | None
    recompute_ms: float | None


@attrs.define
class _Vars:
    """The program's variables as it is built (module docstring): indices into ``Milp``'s columns."""

    p: Problem
    e: Edges
    prog: Milp
    order: list[int]
    tensor_cap: int
    slot: dict[int, int] = attrs.Factory(dict)  # op -> its first run's slot
    made: dict[int, int] = attrs.Factory(dict)  # tensor made in the step -> its maker's slot
    r: dict[int, list[int]] = attrs.Factory(dict)  # tensor -> held at each slot's start
    pin: dict[int, int] = attrs.Factory(dict)  # persistent tensor -> pinned
    inn: dict[int, dict[int, tuple[int, int]]] = attrs.Factory(dict)  # tensor -> slot -> copy in (beside, after)
    rc: dict[int, dict[int, int]] = attrs.Factory(dict)  # op -> slot s (n: the last gap) -> rerun in gap s-1
    passing: dict[int, dict[int, int]] = attrs.Factory(dict)  # tensor -> slot -> copied in for a rerun, gone
    out: dict[int, int] = attrs.Factory(dict)  # tensor made in the step -> copied out
    ends: dict[int, dict[int, int]] = attrs.Factory(dict)  # tensor -> slot s -> its copy out ends in gap s-1
    home: dict[int, int] = attrs.Factory(dict)  # a pinned tensor's new value -> brought back in the last gap
    saved: dict[int, dict[int, int]] = attrs.Factory(dict)  # persistent tensor -> slot s -> copied out by gap s-1
    d: list[int] = attrs.Factory(list)  # gap q at d[q + 1], q = -1 .. n-1

    @property
    def n(self) -> int:
        return self.p.n_ops


def exact_bound(p: Problem, cap: int, order: Sequence[int], time_limit_s: float = 60.0) -> ExactBound:
    """The program's bound on every plan of ``p`` under ``cap`` (the plan's cap, scratch included) whose
    ops first run in ``order``."""
    if p.host.ops:
        raise SwpError("the exact bound covers plans without updates on the host (--host-updates none)")
    if p.net:
        raise SwpError("the exact bound covers one rank's plans (its program has no network lane)")
    if sorted(order) != list(range(p.n_ops)) or not respects(p, order):
        raise SwpError("the order must run every op once, after the ops it depends on")
    started = time.perf_counter()
    prog, v = _build(p, scratch_offset(cap, p.scratch), list(order))
    res = prog.solve(time_limit_s)
    seconds = time.perf_counter() - started
    if res.status == INFEASIBLE:  # no plan with this order fits the cap
        return ExactBound(float("inf"), None, True, seconds, tuple(order), None, None, None)
    bound = dual_bound(res, sum(p.op_ms))
    if res.x is None:
        return ExactBound(bound, None, False, seconds, tuple(order), None, None, None)
    sol = res.x
    h2d = sum((sol[a] + sol[b] + sol[v.passing[t][s]]) * p.nbytes[t] for t, js in v.inn.items()
              for s, (a, b) in js.items())
    d2h = sum(sol[j] * p.nbytes[t] for t, j in v.out.items())
    rerun = sum(sol[j] * p.op_ms[i] for i, js in v.rc.items() for j in js.values())
    return ExactBound(bound, float(res.fun), res.status == 0, seconds, tuple(order), float(h2d), float(d2h),
                      float(rerun))


def precedences(p: Problem) -> set[tuple[int, int]]:
    """(i, j): op i's first run comes before op j's in every valid plan: i makes an input of j, or j works
    in place over a tensor that i also reads."""
    e = edges(p)
    pairs = {(e.producer[t], j) for j in range(p.n_ops) for t in p.op_inputs[j] if t in e.producer}
    for j in range(p.n_ops):
        if p.in_place[j] and p.op_inputs[j]:
            pairs |= {(i, j) for i in e.readers.get(p.op_inputs[j][0], []) if i != j}
    return {(i, j) for i, j in pairs if i != j}


def first_runs(plan: Plan) -> list[int]:
    """A plan's ops in the order of their first runs."""
    return list(dict.fromkeys(i.op for i in plan.program if isinstance(i, Run)))


def respects(p: Problem, order: Sequence[int]) -> bool:
    pos = {op: s for s, op in enumerate(order)}
    return all(pos[i] < pos[j] for i, j in precedences(p))


def _build(p: Problem, tensor_cap: int, order: list[int]) -> tuple[Milp, _Vars]:
    v = _Vars(p, edges(p), Milp(), order, tensor_cap, {op: s for s, op in enumerate(order)})
    _holding(v)
    _takes(v)
    _rerun_inputs(v)
    _copies_out(v)
    _pinning(v)
    _pinned_copies(v)
    v.d = [v.prog.var(ub=np.inf, cost=1.0) for _ in range(v.n + 1)]
    _streams(v)
    if INTEGER_MOVES:
        for j in _moves(v):
            v.prog.integer[j] = 1
    return v.prog, v


INTEGER_MOVES = True  # (module docstring)


def _moves(v: _Vars) -> set[int]:
    """The take, rerun and copy variables."""
    js = {j for pairs in v.inn.values() for pair in pairs.values() for j in pair}
    for table in (v.rc, v.passing, v.ends, v.saved):
        js |= {j for row in table.values() for j in row.values()}
    return js | set(v.out.values()) | set(v.home.values())


def _holding(v: _Vars) -> None:
    """``r`` and ``pin``: regions held at each slot's start, under the cap less the scratch (an op in place
    counted once); an op's inputs and outputs are held; a tensor made in the step is not before its slot."""
    p, prog, n = v.p, v.prog, v.n
    used = sorted({t for i in range(n) for t in (*p.op_inputs[i], *p.op_outputs[i])})
    v.made = {t: v.slot[v.e.producer[t]] for t in used if t in v.e.producer}
    v.r = {t: [prog.var(integer=True, ub=float(s >= v.made.get(t, 0))) for s in range(n)] for t in used}
    v.pin = {t: prog.var(integer=True) for t in used if t in p.persistent}
    for s, op in enumerate(v.order):
        for t in {*p.op_inputs[op], *p.op_outputs[op]}:
            prog.lb[v.r[t][s]] = 1.0
        coeffs = {v.r[t][s]: float(p.size[t]) for t in used}
        if p.in_place[op] and p.op_inputs[op] and p.op_outputs[op]:
            shared = min(p.size[p.op_inputs[op][0]], p.size[p.op_outputs[op][0]])
            coeffs[v.r[p.op_outputs[op][0]][s]] -= float(shared)
        prog.row(coeffs, ub=float(v.tensor_cap))


def _takes(v: _Vars) -> None:
    """``inn`` and ``rc``: a region held at s and not at s-1 was taken in gap s-1, by a copy in beside op
    s-1 or after it, or by a rerun of its maker (held before slot 0: inputs, and pinned tensors)."""
    p, prog, n = v.p, v.prog, v.n
    v.rc = {i: {s: prog.var() for s in range(v.slot[i] + 1, n + 1)} for i in range(n) if p.op_outputs[i]}
    for t, rs in v.r.items():
        maker = v.e.producer.get(t)
        v.inn[t] = {s: (prog.var(), prog.var()) for s in range(v.made[t] + 1 if t in v.made else 0, n)}
        for s, (a, b) in v.inn[t].items():
            coeffs, lb = {a: 1.0, b: 1.0, rs[s]: -1.0}, 0.0
            if s > 0:
                coeffs[rs[s - 1]] = 1.0
            elif t in v.pin:
                coeffs[v.pin[t]] = 1.0
            elif t in p.inputs:
                lb = -1.0
            if maker is not None:
                coeffs[v.rc[maker][s]] = 1.0
            prog.row(coeffs, lb=lb)


def _rerun_inputs(v: _Vars) -> None:
    """A rerun in gap s-1 reads inputs that are there: held at s-1 or s, rebuilt in the gap, or copied in
    for it and gone by s (``passing``). (Reruns in the last gap are left unconstrained.)"""
    prog = v.prog
    v.passing = {t: {s: prog.var() for s in js} for t, js in v.inn.items()}
    for i, js in v.rc.items():
        for s, j in js.items():
            if s == v.n:
                continue
            for a in dict.fromkeys(v.p.op_inputs[i]):
                coeffs = {v.r[a][s - 1]: 1.0, v.r[a][s]: 1.0, j: -1.0}
                maker = v.e.producer.get(a)
                if maker is not None and maker != i and s in v.rc[maker]:
                    coeffs[v.rc[maker][s]] = 1.0
                if s in v.passing[a]:
                    coeffs[v.passing[a][s]] = 1.0
                prog.row(coeffs, lb=0.0)


def _copies_out(v: _Vars) -> None:
    """``out`` and ``ends``: a tensor made in the step and copied back in was copied out first; a copy out
    ends in a gap whose start holds the tensor (or in which it was rebuilt or brought in)."""
    prog, n = v.prog, v.n
    v.out = {t: prog.var() for t in v.made}
    v.ends = {t: {s: prog.var() for s in range(v.made[t] + 1, n + 1)} for t in v.made}
    for t, j in v.out.items():
        prog.row({j: 1.0, **{k: -1.0 for k in v.ends[t].values()}}, lb=0.0, ub=0.0)
        maker = v.e.producer[t]
        for s, k in v.ends[t].items():
            coeffs = {k: 1.0, v.r[t][s - 1]: -1.0}
            if s in v.rc[maker]:
                coeffs[v.rc[maker][s]] = -1.0
            if s in v.passing[t]:
                coeffs[v.passing[t][s]] = -1.0
            prog.row(coeffs, ub=0.0)
        for u, (a, b) in v.inn[t].items():
            before = {k: 1.0 for s, k in v.ends[t].items() if s <= u}
            prog.row({**before, a: -1.0, b: -1.0, v.passing[t][u]: -1.0}, lb=0.0)


def _pinning(v: _Vars) -> None:
    """Pinned tensors fit the cap together; an unpinned one's new value is copied home, a pinned one's is
    held at the last slot or brought back (copied or rebuilt) in the last gap."""
    prog, n, new_of = v.prog, v.n, dict(v.p.updates)
    for t, j in v.pin.items():
        last = new_of.get(t, t)
        if last in v.r:
            v.home[last] = prog.var()
            coeffs = {v.r[last][n - 1]: 1.0, v.home[last]: 1.0, j: -1.0}
            maker = v.e.producer.get(last)
            if maker is not None:
                coeffs[v.rc[maker][n]] = 1.0
            prog.row(coeffs, lb=0.0)
            if last in v.out:
                prog.row({v.out[last]: 1.0, v.home[last]: -1.0}, lb=0.0)
        if last in v.out:
            prog.row({v.out[last]: 1.0, j: 1.0}, lb=1.0)
    if v.pin:
        prog.row({j: float(v.p.size[t]) for t, j in v.pin.items()}, ub=float(v.tensor_cap))


def _pinned_copies(v: _Vars) -> None:
    """``saved``: a pinned tensor has no host copy, so one brought in again was copied out first, from a
    slot that holds it or from the step's start (its copy out ends in gap s-1 for ``saved[t][s]``)."""
    prog, n = v.prog, v.n
    for t, pin in v.pin.items():
        v.saved[t] = {s: prog.var() for s in range(0, n + 1)}  # (s = 0: out before slot 0 starts)
        for s, k in v.saved[t].items():
            prog.row({k: 1.0, (v.r[t][s - 1] if s else pin): -1.0}, ub=0.0)
        for u, (a, b) in v.inn[t].items():
            before = {k: 1.0 for s, k in v.saved[t].items() if s <= u}
            prog.row({**before, a: -1.0, b: -1.0, v.passing[t][u]: -1.0, pin: -1.0}, lb=-1.0)


def _streams(v: _Vars) -> None:
    """Time, gap by gap (module docstring): compute runs each slot's op and the reruns for the next slot;
    each copy stream runs one copy at a time inside the windows its copies allow."""
    p, n = v.p, v.n
    for q in range(-1, n):
        op_ms = p.op_ms[v.order[q]] if q >= 0 else 0.0
        reruns = {js[q + 1]: -p.op_ms[i] for i, js in v.rc.items() if q + 1 in js}
        v.prog.row({v.d[q + 1]: 1.0, **reruns}, lb=op_ms)
        if 0 <= q < n - 1:
            _gap_memory(v, q)
    _copies_in_time(v)
    _copies_out_time(v)


def _span(v: _Vars, first: int, end: int) -> dict[int, float]:
    """The gaps from slot ``first``'s start to slot ``end``'s (slot -1: the step's start; n: its end)."""
    return {v.d[q + 1]: 1.0 for q in range(first, end)}


def _copies_in_time(v: _Vars) -> None:
    """A copy in for slot s starts in gap s-1 (after op s-1 for the second kind) and lands before the next
    slot that reads it; one copied back follows its maker and its copy out; one for a rerun lands in its
    gap; the stream runs one copy at a time in each window; pinned values brought home take the last gap."""
    p, prog, n, made = v.p, v.prog, v.n, v.made
    cin = {t: copy_ms(p.device, p.nbytes[t], True) for t in v.inn}
    back = {t: p.op_ms[v.e.producer[t]] + copy_ms(p.device, p.nbytes[t], False) for t in made}
    reads = _reads(p, v.order)
    landing = {t: {s: next((u for u in reads.get(t, []) if u >= s), n) for s in js} for t, js in v.inn.items()}

    def after_copy_out(t: int, end: int, copies: tuple[int, ...]) -> None:
        """A copy back in, landing by slot ``end``, follows the tensor's copy out: from its maker, or (a
        pinned value, only while pinned) from the step's start."""
        if t in made:
            chain = back[t] + cin[t]
            prog.row({**_span(v, made[t], end), **{j: -chain for j in copies}}, lb=0.0)
        elif t in v.pin:
            chain = copy_ms(p.device, p.nbytes[t], False) + cin[t]
            prog.row({**_span(v, -1, end), **{j: -chain for j in copies}, v.pin[t]: -chain}, lb=-chain)

    for t, js in v.inn.items():
        for s, (a, b) in js.items():
            op_ms = p.op_ms[v.order[s - 1]] if s > 0 else 0.0
            prog.row({**_span(v, s - 1, landing[t][s]), a: -cin[t], b: -(op_ms + cin[t])}, lb=0.0)
            after_copy_out(t, landing[t][s], (a, b))
    for t, js in v.passing.items():
        for s, j in js.items():
            prog.row({**_span(v, s - 1, s), j: -cin[t]}, lb=0.0)
            after_copy_out(t, s, (j,))
    copies = [(s - 1, landing[t][s], cin[t], pair) for t, js in v.inn.items() for s, pair in js.items()]
    copies += [(s - 1, s, cin[t], (j,)) for t, js in v.passing.items() for s, j in js.items()]
    for first, end in _windows(n, -1):
        terms = {j: -ms for start, land, ms, pair in copies if start >= first and land <= end for j in pair}
        if terms:
            prog.row({**_span(v, first, end), **terms}, lb=0.0)
    prog.row({v.d[n]: 1.0, **{j: -cin[t] for t, j in v.home.items() if t in cin}}, lb=0.0)


def _copies_out_time(v: _Vars) -> None:
    """A copy out starts once its tensor is made; the stream runs one copy at a time in each window."""
    p, prog, n = v.p, v.prog, v.n
    cout = {t: copy_ms(p.device, p.nbytes[t], False) for t in (*v.out, *v.saved)}
    for t, ks in v.ends.items():
        after = p.op_ms[v.e.producer[t]] + cout[t]
        for s, k in ks.items():
            prog.row({**_span(v, v.made[t], s), k: -after}, lb=0.0)
    for t, ks in v.saved.items():
        for s, k in ks.items():
            prog.row({**_span(v, -1, s), k: -cout[t]}, lb=0.0)
    starts = {**v.made, **{t: -1 for t in v.saved}}  # a pinned tensor may be copied out from the step's start
    for first, end in _windows(n, -1):
        terms = {k: -cout[t] for t, ks in (*v.ends.items(), *v.saved.items()) if starts[t] >= first
                 for s, k in ks.items() if s <= end}
        if terms:
            prog.row({**_span(v, first, end), **terms}, lb=0.0)


def _gap_memory(v: _Vars, q: int) -> None:
    """Memory in gap q. A tensor held when slots q and q + 1 start and not taken again in between is held
    throughout (``kept``); a copy taken beside op q holds its region next to those and op q's tensors, one
    taken after op q next to those alone."""
    p, prog, op = v.p, v.prog, v.order[q]
    mine = {*p.op_inputs[op], *p.op_outputs[op]}
    kept: dict[int, int] = {}
    for t, rs in v.r.items():
        k = kept[t] = prog.var()
        coeffs = {k: 1.0, rs[q]: -1.0, rs[q + 1]: -1.0}
        if q + 1 in v.inn[t]:
            a, b = v.inn[t][q + 1]
            coeffs |= {a: 1.0, b: 1.0}
            maker = v.e.producer.get(t)
            if maker is not None and q + 1 in v.rc[maker]:
                coeffs[v.rc[maker][q + 1]] = 1.0
        prog.row(coeffs, lb=-1.0)
    arriving = {t: js[q + 1] for t, js in v.inn.items() if q + 1 in js}
    beside = {kept[t]: float(p.size[t]) for t in kept if t not in mine}
    prog.row({**beside, **{a: float(p.size[t]) for t, (a, _) in arriving.items()}},
             ub=float(v.tensor_cap - _op_bytes(p, op)))
    after = {b: float(p.size[t]) for t, (_, b) in arriving.items()}
    prog.row({**{kept[t]: float(p.size[t]) for t in kept}, **after}, ub=float(v.tensor_cap))


WINDOW = 4  # a stream's windows: every span of up to this many gaps, and every prefix and suffix


def _windows(n: int, start: int) -> list[tuple[int, int]]:
    """(first, end) slot pairs for a stream's rows: short spans, and those from the start or to the end (a
    subset of all pairs keeps the program small; every row is valid on its own)."""
    pairs = {(first, end) for first in range(start, n) for end in range(first + 1, min(n, first + WINDOW) + 1)}
    pairs |= {(start, end) for end in range(start + 1, n + 1)} | {(first, n) for first in range(start, n)}
    return sorted(pairs)


def _reads(p: Problem, order: list[int]) -> dict[int, list[int]]:
    """For each tensor, the slots whose op reads it, in order."""
    out: dict[int, list[int]] = {}
    for s, op in enumerate(order):
        for t in dict.fromkeys(p.op_inputs[op]):
            out.setdefault(t, []).append(s)
    return out


def _op_bytes(p: Problem, op: int) -> int:
    """The bytes an op's inputs and outputs hold while it runs (an output in place shares its input's)."""
    held = sum(p.size[t] for t in {*p.op_inputs[op], *p.op_outputs[op]})
    if p.in_place[op] and p.op_inputs[op] and p.op_outputs[op] and p.op_outputs[op][0] not in p.op_inputs[op]:
        held -= min(p.size[p.op_inputs[op][0]], p.size[p.op_outputs[op][0]])
    return held
