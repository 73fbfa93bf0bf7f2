"""A lower bound on every plan that runs its ops first in a given order: a mixed-integer program, solved
by HiGHS (SciPy's ``milp``).

Slot s is the s-th op of the order (its first run); gap q runs from the start of slot q's op to the
start of slot q + 1's (gap -1: before slot 0; gap n-1: to the step's end), ``d[q]`` ms long; the
objective is ``Σ d[q]``, the step. For tensors t and slots s:

- ``r[t,s]`` (binary): t's region is held when slot s starts. An op's inputs and outputs are
  (``r = 1``), a tensor is not before the slot of the op that makes it, and the regions held fit the
  cap less the scratch (an op in place counted once). Inputs are held before slot 0; a persistent
  tensor is if pinned (``p[t]``, binary), and pinned tensors fit the cap together.
- Taking a region again in gap s-1 (held at s, not at s-1): a copy in beside op s-1 (``a[t,s]``) or
  after it (``b[t,s]``), or a rerun of the op that makes t (``rc[i,s]``): ``a + b + rc >= r[t,s] -
  r[t,s-1]``. A rerun's inputs are there: held at s-1 or s, rebuilt in the gap, or copied in and gone
  again (``c[t,s]``). A copy out (``o[t,s]``: ends in gap s-1) happens where t is held at s-1, before
  any copy back in; an unpinned persistent tensor's new value is copied home, a pinned one is held at
  the last slot or brought back (``h[t]``). All of these but ``r`` and ``p`` are in [0, 1].

Time. Gap q holds op q and the reruns for slot q+1. A copy in for slot s starts in gap s-1 (after op
s-1 for ``b``) and lands before the next slot that reads t; a copy out starts after the op that made t;
a tensor copied back follows its maker, its copy out and its copy in, in that order. Each copy stream
runs one copy at a time, so the copies that start after slot j and end before slot k take at most the
gaps between (rows for spans of up to ``WINDOW`` gaps, prefixes and suffixes). Memory in gap q: what is
held at both of its ends and not taken again in between is held throughout, and a copy beside op q
needs room next to that and op q's tensors, one after op q next to that. Copy times are the
simulator's (bytes over the link plus a latency).

Why it is a bound. Take any valid plan with that order and its simulated step. Set ``r`` from the
regions held as each first run starts, ``p`` to the pinned tensors, the take, rerun and copy variables
to the plan's swap-ins, reruns and swap-outs in the gaps they start or end in, and ``d`` to the gaps
between the simulated starts. The simulator's rules make every row hold: an op waits for its inputs and
output regions; a region is held from a copy's or run's start to its free, and a free waits for the
swap-out; the compute, host-to-device and device-to-host streams are FIFO from time 0. So the plan is a
feasible point whose objective is its step, and the optimum, and any dual bound HiGHS proves, is at most
that step. ``tests/test_exact.py`` checks it against the plans of every method.

Left out, each only lowering the bound: the layout (bytes under the cap need not pack into regions),
memory at a rerun's moment, where a copy sits inside its window beyond the windows' rows, and pinned
tensors copied out and back. Refused: updates on the host (graph/offload.py). Not decided: the order
(``exact_bound`` takes one), and no plan is made from the solution yet.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import attrs
import numpy as np

from swapdsl.common.errors import SwpError
from swapdsl.devices.costs import copy_ms
from swapdsl.plan.program import scratch_offset
from swapdsl.planning.problem import Problem, edges


@attrs.frozen
class ExactBound:
    """What the program proved: ``bound_ms`` is at most every plan's step (the optimum when ``optimal``,
    else HiGHS's dual bound at the time limit); ``relaxed_ms`` the best solution it found (the optimum of
    the program, a plan's step only where its relaxations cost nothing); ``order`` that solution's."""

    bound_ms: float
    relaxed_ms: float | None
    optimal: bool
    seconds: float
    order: tuple[int, ...] | None
    h2d_bytes: float | None
    d2h_bytes: float | None
    recompute_ms: float | None


class _Program:
    """Variables and rows for ``scipy.optimize.milp``, added by name."""

    def __init__(self) -> None:
        self.lb: list[float] = []
        self.ub: list[float] = []
        self.cost: list[float] = []
        self.integer: list[int] = []
        self.rows: list[tuple[dict[int, float], float, float]] = []

    def var(self, lb: float = 0.0, ub: float = 1.0, integer: bool = False, cost: float = 0.0) -> int:
        self.lb.append(lb)
        self.ub.append(ub)
        self.cost.append(cost)
        self.integer.append(int(integer))
        return len(self.lb) - 1

    def row(self, coeffs: dict[int, float], lb: float = -np.inf, ub: float = np.inf) -> None:
        self.rows.append((coeffs, lb, ub))

    def solve(self, time_limit_s: float):  # noqa: ANN201
        from scipy.optimize import Bounds, LinearConstraint, milp
        from scipy.sparse import coo_matrix

        rows, cols, vals = [], [], []
        for k, (coeffs, _, _) in enumerate(self.rows):
            for j, v in coeffs.items():
                rows.append(k)
                cols.append(j)
                vals.append(v)
        a = coo_matrix((vals, (rows, cols)), shape=(len(self.rows), len(self.lb))).tocsr()
        constraint = LinearConstraint(a, [r[1] for r in self.rows], [r[2] for r in self.rows])
        return milp(np.array(self.cost), integrality=np.array(self.integer), bounds=Bounds(self.lb, self.ub),
                    constraints=constraint, options={"time_limit": time_limit_s, "disp": False})


@attrs.frozen
class _Vars:
    """The program's variable indices (module docstring), for a fixed order: ``pos`` is each op's slot."""

    pos: list[int]
    r: dict[int, list[int]]  # tensor -> per slot
    p: dict[int, int]  # persistent tensor -> pinned
    inn: dict[int, dict[int, tuple[int, int]]]  # tensor -> slot -> copies in (beside the op before, after it)
    rc: dict[int, dict[int, int]]  # op -> slot -> run again before it
    out: dict[int, int]  # tensor made in the step -> copied out
    d: list[int]  # slots -1..n-1
    home: dict[int, int]  # pinned new value -> brought back home in the last gap
    ends: dict[int, dict[int, int]]  # tensor -> slot s -> its copy out ends in gap s - 1
    passing: dict[int, dict[int, int]]  # tensor -> slot s -> copied in during gap s - 1 and gone by slot s


def exact_bound(p: Problem, cap: int, order: Sequence[int], time_limit_s: float = 60.0) -> ExactBound:
    """The program's bound on every plan of ``p`` under ``cap`` (the plan's cap, scratch included) whose
    ops first run in ``order``."""
    if p.host.ops:
        raise SwpError("the exact bound covers plans without updates on the host (--host-updates none)")
    if sorted(order) != list(range(p.n_ops)) or not _respects(p, order):
        raise SwpError("the order must run every op once, after the ops it depends on")
    started = time.perf_counter()
    prog, v = _build(p, scratch_offset(cap, p.scratch), list(order))
    res = prog.solve(time_limit_s)
    seconds = time.perf_counter() - started
    ideal = sum(p.op_ms)
    dual = getattr(res, "mip_dual_bound", None)
    if res.x is None:
        if res.status == 2:  # infeasible: no plan with this order fits the cap
            return ExactBound(float("inf"), None, True, seconds, tuple(order), None, None, None)
        return ExactBound(max(ideal, dual if dual is not None else ideal), None, False, seconds, tuple(order),
                          None, None, None)
    bound = max(ideal, min(res.fun, dual) if dual is not None and np.isfinite(dual) else res.fun)
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


def _respects(p: Problem, order: Sequence[int]) -> bool:
    pos = {op: s for s, op in enumerate(order)}
    return all(pos[i] < pos[j] for i, j in precedences(p))


def _build(p: Problem, tensor_cap: int, order: list[int]) -> tuple[_Program, _Vars]:
    n, e = p.n_ops, edges(p)
    pos = [0] * n
    for s, op in enumerate(order):
        pos[op] = s
    prog = _Program()
    used = sorted({t for i in range(n) for t in (*p.op_inputs[i], *p.op_outputs[i])})
    made = {t: pos[e.producer[t]] for t in used if t in e.producer}
    # a tensor made in the step holds nothing before its op's slot
    r = {t: [prog.var(integer=True, ub=float(s >= made.get(t, 0))) for s in range(n)] for t in used}
    pin = {t: prog.var(integer=True) for t in used if t in p.persistent}
    for s, op in enumerate(order):
        for t in {*p.op_inputs[op], *p.op_outputs[op]}:
            prog.lb[r[t][s]] = 1.0  # an op's inputs and outputs are on the device while it runs
    for s, op in enumerate(order):
        coeffs = {r[t][s]: float(p.size[t]) for t in used}
        if p.in_place[op] and p.op_inputs[op] and p.op_outputs[op]:  # one region for both
            coeffs[r[p.op_outputs[op][0]][s]] -= float(min(p.size[p.op_inputs[op][0]], p.size[p.op_outputs[op][0]]))
        prog.row(coeffs, ub=float(tensor_cap))
    inn, rc, out, home, ends, passing = _comings(p, e, prog, pos, r, pin, made, tensor_cap)
    d = [prog.var(ub=np.inf, cost=1.0) for _ in range(n + 1)]  # d[0] is slot -1
    v = _Vars(pos, r, pin, inn, rc, out, d, home, ends, passing)
    _streams(p, e, prog, v, order, made, tensor_cap)
    return prog, v


def _comings(p: Problem, e, prog: _Program, pos: list[int], r: dict[int, list[int]],  # noqa: ANN001
             pin: dict[int, int], made: dict[int, int], tensor_cap: int
             ) -> tuple[dict[int, dict[int, tuple[int, int]]], dict[int, dict[int, int]], dict[int, int],
                        dict[int, int], dict[int, dict[int, int]], dict[int, dict[int, int]]]:
    """Copies in (beside the previous slot's op, or after it), reruns and copies out: what a tensor held
    again after a gap costs, where a plan starts and ends (module docstring)."""
    n = p.n_ops
    rc = {i: {s: prog.var() for s in range(pos[i] + 1, n)} for i in range(n) if p.op_outputs[i]}
    inn: dict[int, dict[int, tuple[int, int]]] = {}
    for t in r:
        first = made[t] + 1 if t in made else 0
        inn[t] = {s: (prog.var(), prog.var()) for s in range(first, n)}
        maker = e.producer.get(t)
        for s in range(first, n):
            a, b = inn[t][s]
            coeffs, lb = {a: 1.0, b: 1.0, r[t][s]: -1.0}, 0.0
            if s > 0:
                coeffs[r[t][s - 1]] = 1.0
            elif t in pin:
                coeffs[pin[t]] = 1.0
            elif t in p.inputs:
                lb = -1.0  # held before slot 0: r[t,-1] = 1
            if maker is not None:
                coeffs[rc[maker][s]] = 1.0
            prog.row(coeffs, lb=lb)
    # a copy in that a rerun before slot s reads and that is gone again when slot s starts
    passing = {t: {s: prog.var() for s in js} for t, js in inn.items()}
    for i, js in rc.items():  # a rerun's inputs are there: held when the gap starts or ends, or brought
        for s, j in js.items():  # in the gap, by a rerun of their own or a passing copy
            for a in dict.fromkeys(p.op_inputs[i]):
                maker = e.producer.get(a)
                coeffs = {r[a][s - 1]: 1.0, r[a][s]: 1.0, j: -1.0}
                if maker is not None and s in rc[maker] and maker != i:
                    coeffs[rc[maker][s]] = 1.0
                if s in passing[a]:
                    coeffs[passing[a][s]] = 1.0
                prog.row(coeffs, lb=0.0)
    out = {t: prog.var() for t in made}
    ends = {t: {s: prog.var() for s in range(made[t] + 1, n + 1)} for t in made}
    for t, j in out.items():  # a copy out ends in a gap whose start holds t, before t is copied back
        prog.row({j: 1.0, **{k: -1.0 for k in ends[t].values()}}, lb=0.0, ub=0.0)
        for s, k in ends[t].items():
            prog.row({k: 1.0, r[t][s - 1]: -1.0}, ub=0.0)
        for u, (a, b) in inn[t].items():
            prog.row({**{k: 1.0 for s, k in ends[t].items() if s <= u}, a: -1.0, b: -1.0, passing[t][u]: -1.0},
                     lb=0.0)
    new_of = dict(p.updates)
    home: dict[int, int] = {}  # a pinned tensor's new value brought back home after the last slot starts
    for t, j in pin.items():
        last = new_of.get(t, t)
        if last in r:  # pinned: at home when the step ends, held since the last slot or brought back
            home[last] = prog.var()
            prog.row({r[last][n - 1]: 1.0, home[last]: 1.0, j: -1.0}, lb=0.0)
            if last in out:
                prog.row({out[last]: 1.0, home[last]: -1.0}, lb=0.0)
        if last in out:
            prog.row({out[last]: 1.0, j: 1.0}, lb=1.0)  # not pinned: the new value goes home
    if pin:  # when the step starts (and ends) every pinned tensor is home at once
        prog.row({j: float(p.size[t]) for t, j in pin.items()}, ub=float(tensor_cap))
    return inn, rc, out, home, ends, passing


def _streams(p: Problem, e, prog: _Program, v: _Vars, order: list[int], made: dict[int, int],  # noqa: ANN001
             tensor_cap: int) -> None:
    """Time in each gap (slot q's op to the next; q = -1: before slot 0). What slot s holds again was taken
    in gap s - 1: a rerun runs there after that gap's op; a copy in starts there (beside the op, its region
    next to the op's tensors, or after it) and lands before the next slot that reads it. Copies out follow
    what they copy (module docstring)."""
    n, dev = p.n_ops, p.device
    gap = v.d  # gap[q + 1] is gap q
    cin = {t: copy_ms(dev, p.nbytes[t], True) for t in v.inn}
    cout = {t: copy_ms(dev, p.nbytes[t], False) for t in v.out}
    reads = _reads(p, order)
    landing = {t: {s: next((u for u in reads.get(t, []) if u >= s), n) for s in js} for t, js in v.inn.items()}

    def span(first: int, end: int) -> dict[int, float]:  # the gaps from slot first's start to slot end's
        return {gap[q + 1]: 1.0 for q in range(first, end)}

    for q in range(-1, n):
        op_ms = p.op_ms[order[q]] if q >= 0 else 0.0
        prog.row({gap[q + 1]: 1.0, **{js[q + 1]: -p.op_ms[i] for i, js in v.rc.items() if q + 1 in js}},
                 lb=op_ms)  # the op, then the reruns for slot q + 1
        if 0 <= q < n - 1:
            _gap_memory(p, e, prog, v, order, q, tensor_cap)
    for t, js in v.inn.items():
        for s, (a, b) in js.items():
            op_ms = p.op_ms[order[s - 1]] if s > 0 else 0.0
            prog.row({**span(s - 1, landing[t][s]), a: -cin[t], b: -(op_ms + cin[t])}, lb=0.0)
            if t in made:  # made, copied out, copied back: in that order
                chain = p.op_ms[e.producer[t]] + cout[t] + cin[t]
                prog.row({**span(made[t], landing[t][s]), a: -chain, b: -chain}, lb=0.0)
    copies = [(s - 1, landing[t][s], cin[t], pair) for t, js in v.inn.items() for s, pair in js.items()]
    copies += [(s - 1, s, cin[t], (j,)) for t, js in v.passing.items() for s, j in js.items()]
    for t, js in v.passing.items():
        for s, j in js.items():
            chain = (p.op_ms[e.producer[t]] + cout[t] if t in made else 0.0) + cin[t]
            prog.row({**span(made.get(t, -1) if t in made else s - 1, s), j: -chain}, lb=0.0)
    for first, end in _windows(n, -1):  # the host-to-device stream: the copies taken in gap >= first and
        terms = {j: -ms for start, land, ms, pair in copies if start >= first and land <= end for j in pair}
        if terms:  # landing by slot end run one at a time between those slots
            prog.row({**span(first, end), **terms}, lb=0.0)
    prog.row({gap[n]: 1.0, **{j: -cin[t] for t, j in v.home.items()}}, lb=0.0)  # brought home at the end
    for t, ks in v.ends.items():  # a copy out starts once its tensor is made
        made_ms = p.op_ms[e.producer[t]] + cout[t]
        for s, k in ks.items():
            prog.row({**span(made[t], s), k: -made_ms}, lb=0.0)
    for first, end in _windows(n, 0):  # the device-to-host stream: copies out of tensors made at slot >= first
        terms = {k: -cout[t] for t, ks in v.ends.items() if made[t] >= first for s, k in ks.items() if s <= end}
        if terms:  # that end by slot end run one at a time between those slots
            prog.row({**span(first, end), **terms}, lb=0.0)


def _gap_memory(p: Problem, e, prog: _Program, v: _Vars, order: list[int], q: int, tensor_cap: int) -> None:  # noqa: ANN001
    """Memory in gap q. A tensor held when slots q and q + 1 start and not taken again in between is held
    throughout (``kept``); a copy taken beside op q holds its region next to those and op q's tensors, one
    taken after op q next to those alone."""
    op = order[q]
    mine = {*p.op_inputs[op], *p.op_outputs[op]}
    kept: dict[int, int] = {}
    for t, rs in v.r.items():
        k = kept[t] = prog.var()
        coeffs = {k: 1.0, rs[q]: -1.0, rs[q + 1]: -1.0}
        if q + 1 in v.inn[t]:
            a, b = v.inn[t][q + 1]
            coeffs |= {a: 1.0, b: 1.0}
            maker = e.producer.get(t)
            if maker is not None and q + 1 in v.rc[maker]:
                coeffs[v.rc[maker][q + 1]] = 1.0
        prog.row(coeffs, lb=-1.0)
    arriving = {t: js[q + 1] for t, js in v.inn.items() if q + 1 in js}
    beside = {kept[t]: float(p.size[t]) for t in kept if t not in mine}
    prog.row({**beside, **{a: float(p.size[t]) for t, (a, _) in arriving.items()}},
             ub=float(tensor_cap - _op_bytes(p, op)))
    prog.row({**{kept[t]: float(p.size[t]) for t in kept}, **{b: float(p.size[t]) for t, (_, b) in arriving.items()}},
             ub=float(tensor_cap))


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
