"""The exact planner: for a given order of first runs, the fastest plan of the *phased* class, found by a
mixed-integer program (HiGHS, ``milp.py``) and written out as an ordinary plan (docs/design.md, "Exact
plans", states every row).

Gap 0 is the step's prologue, gap g (1..n) runs op ``order[g-1]``, gap n+1 is the tail. The program's
segment for gap g is, in this order: the swap-outs that start in it, the frees, the swap-ins, the reruns,
the op. Everything before the op follows the latest run before the segment.

Variables (binary unless said), for tensors t and gaps g:

- ``r[t][g]``: t holds a region in gap g. What an op reads is held in its gap and the one before (unless
  copied in or rebuilt in its own segment), what it makes in its gap; inputs from the start to their last
  read; nothing before it is made, or after an op works in place over it.
- ``pin[p]``: persistent p starts and ends the step at its home on the device (its new value, made in
  place over it, to the end; only pinnable tensors with no new value or one made in place); the others
  start on the host and their new value is copied home. ``leave[p]`` (only when ``exact_plan`` is asked,
  outside the phased class): pinned p leaves mid-step: its one swap-out (a ``co``, as below) starts right
  after a read (or in gap 1), it is dropped, and swap-ins (``cin``) bring it back to its home (the packing
  gives its residencies one offset, ``layout``).
- ``cin[t][a]``: a swap-in of t starts in gap a and lands before the op of the first gap at or after a
  that reads t (``due``); t is held in between. A tensor made in the step comes back only after its one
  swap-out has ended.
- ``cr[t][a, g]``: a swap-in of t starts in gap a (up to ``RERUN_LEAD`` gaps early) and lands before the
  reruns of gap g, t held in between; no op or rerun of gaps a..g-1 reads t (graphs of at most
  ``RERUN_EXTRAS_MAX_OPS`` ops).
- ``late[t][g]``: t, held in g-1 and read in g only by g's reruns, stays for them and is freed before g's
  op (graphs of at most ``RERUN_EXTRAS_MAX_OPS`` ops, as ``cr``); then what is held while g's reruns run
  fits too (its op's outputs are not made yet), and the packing places residencies over phases (a gap's
  reruns, then its op).
- ``co[t][b]``: t's swap-out starts in gap b, t held in b-1; what takes a region in a gap that no longer
  holds t starts after the copy ends (``E[t]``, continuous), and so does a swap-in of t.
- ``rc[i][g]``: op i reruns in gap g, before g's op: its outputs were gone in g-1 and are back in g; its
  inputs are held in g and were in g-1 or are rebuilt by an earlier rerun of gap g; none is a swap-in
  still due for an op.
- ``T[g]``, ``R[g]``, ``S[g]`` (continuous): when gap g, its reruns and its op start; each copy stream
  starts gap g's copies at ``B[g] >= max(T[g], F[g-1])`` and runs them back to back (swap-ins by the gap
  they land for), done by ``F[g]``. The objective is ``T[n+2]``, the step's end.

Memory: the regions held in each gap fit the cap less the scratch (an op in place counted once). Frees
come before anything in a segment takes a region, so the tensors held in gap g are exactly those resident
from g's frees to the next segment's; ``packing.pack`` gives each residency one region.

Why its plan takes at most the program's value: a solution is a schedule (each op at ``S[g]``, reruns
from ``R[g]``, each stream's copies back to back from ``B[g]``) that meets every wait of the plan written
from it (``replay.py``: an op waits for its inputs and output regions, a copy for the run it follows, its
region and its host copy, a free for its tensor's swap-out) and keeps each stream's program order. The
simulator starts every instruction as early as those waits and its stream allow: none starts later than
in the solution. ``schedule_ms`` recomputes the step from the rounded binaries, since HiGHS's own times
may pass the rows by its tolerances.

What the class leaves out (so its optimum is the best phased plan for the order; ``exact.py`` bounds
every plan with that order): a copy timed before its segment, a tensor swapped out twice, reruns of ops
that work in place or make a new value, a swap-in for a rerun more than ``RERUN_LEAD`` gaps early, a
rerun's output or a tensor brought in for reruns alone freed before the gap's op (past
``RERUN_EXTRAS_MAX_OPS`` ops, every swap-in for a rerun and every rerun input freed before the gap's op),
a tensor not held in the gap before brought in for both a rerun of the gap and its op, a pinned value
leaving the device. That last one the program may be asked for (``leave``): where the regions of a
solution that sends a pinned value away do not pack, it is solved again for the same step with those
values held in the fewest gaps (``_held_least``); where they still do not pack, with none leaving."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence

import attrs
import numpy as np

from swapdsl.common.errors import SwpError
from swapdsl.common.units import ALIGN
from swapdsl.devices.costs import copy_ms
from swapdsl.plan.program import Free, Instr, Plan, Region, Run, SwapIn, SwapOut, scratch_offset
from swapdsl.planning.baselines import assemble, baseline, baseline_timing, with_figures
from swapdsl.planning.bound import ideal_ms
from swapdsl.planning.compiled import no_swap_bytes
from swapdsl.planning.exact import respects
from swapdsl.planning.milp import INFEASIBLE, Milp, dual_bound
from swapdsl.planning.packing import pack
from swapdsl.planning.problem import Edges, Problem, Request, edges
from swapdsl.planning.sizing import below_smallest_cap, need_bytes

# HiGHS rounds a binary within 1e-6 of an integer; rounded, the big-M rows may move the step a little past
# the program's value. A step within this much of the dual bound is still called proven.
PROVEN_GAP = 2e-4  # (of the bound, which ``dual_bound`` already took BOUND_SLACK = 1e-4 lower)
MIN_LIMIT_S = 1.0  # each solve gets at least this long


@attrs.frozen
class ExactPlan:
    """The phased program's solution for ``order``: its ``program`` and ``homes`` (``None`` when no
    phased plan fits), ``objective_ms`` (the plan's simulated step is at most this), ``bound_ms`` (HiGHS's
    dual bound: no phased plan with this order is faster), whether HiGHS proved it ``optimal``, and
    ``why`` there is no plan when there is none."""

    program: tuple[Instr, ...] | None
    homes: dict[int, Region] | None
    objective_ms: float
    bound_ms: float
    optimal: bool
    seconds: float
    order: tuple[int, ...]
    why: str = ""


@attrs.define
class _V:
    """The program as it is built: indices into ``Milp``'s columns (module docstring)."""

    p: Problem
    e: Edges
    prog: Milp
    order: list[int]
    tensor_cap: int
    top: float  # an upper bound on the step, for the rows that hold only when a binary is set
    gap: dict[int, int] = attrs.Factory(dict)  # op -> the gap of its first run
    made: dict[int, int] = attrs.Factory(dict)  # tensor made in the step -> its maker's gap
    reads: dict[int, list[int]] = attrs.Factory(dict)  # tensor -> the gaps whose op reads it
    consumed: dict[int, int] = attrs.Factory(dict)  # tensor an op works in place over -> that op's gap
    finals: set[int] = attrs.Factory(set)  # tensors the step must leave somewhere: the loss, new values
    new_of: dict[int, int] = attrs.Factory(dict)  # persistent tensor -> its new value
    r: dict[int, list[int]] = attrs.Factory(dict)
    pin: dict[int, int] = attrs.Factory(dict)
    leave: dict[int, int] = attrs.Factory(dict)  # pinnable tensor -> it leaves mid-step and comes back home
    cin: dict[int, dict[int, int]] = attrs.Factory(dict)
    due: dict[int, dict[int, int]] = attrs.Factory(dict)  # tensor -> swap-in gap -> the gap it lands for
    cr: dict[int, dict[tuple[int, int], int]] = attrs.Factory(dict)  # tensor -> (gap a, gap g) -> a swap-in
    # starting in a for the reruns of g
    late: dict[int, dict[int, int]] = attrs.Factory(dict)  # tensor -> gap g: held through g's reruns only
    co: dict[int, dict[int, int]] = attrs.Factory(dict)
    E: dict[int, int] = attrs.Factory(dict)
    rc: dict[int, dict[int, int]] = attrs.Factory(dict)
    T: list[int] = attrs.Factory(list)
    R: list[int] = attrs.Factory(list)  # gap -> when its reruns start
    S: list[int] = attrs.Factory(list)  # gap -> when its op starts
    Fin: list[int] = attrs.Factory(list)
    Fout: list[int] = attrs.Factory(list)
    Bin: list[int] = attrs.Factory(list)  # gap -> when the stream starts that gap's copies
    Bout: list[int] = attrs.Factory(list)

    @property
    def n(self) -> int:
        return self.p.n_ops

    def op_ms(self, g: int) -> float:
        return self.p.op_ms[self.order[g - 1]] if 1 <= g <= self.n else 0.0


def exact_plan(p: Problem, cap: int, order: Sequence[int], time_limit_s: float = 60.0,
               below_ms: float | None = None, leave: bool = False) -> ExactPlan:
    """The fastest phased plan of ``p`` under ``cap`` (scratch included) whose ops first run in ``order``,
    as far as HiGHS gets in ``time_limit_s``. Where the regions of its solution do not pack, the program is
    solved again with that much less room (three solves in all): the plan is then no longer proven best,
    and the bound is the first solution's (bytes under the whole cap). ``below_ms``: only plans whose
    program value is at most that (a cutoff: proven "none" is then a bound of ``below_ms``). ``leave``:
    pinned values may also leave mid-step (``leave[p]``, outside the phased class: ``ga``'s polish asks for
    them; where such a solution's regions do not pack even when held least, the program is solved again
    without, and the plan is not called proven)."""
    check_supported(p)
    if sorted(order) != list(range(p.n_ops)) or not respects(p, order):
        raise SwpError("the order must run every op once, after the ops it depends on")
    started = time.perf_counter()

    def left() -> float:
        return max(MIN_LIMIT_S, time_limit_s - (time.perf_counter() - started))

    tensor_cap = scratch_offset(cap, p.scratch)
    # with room for every tensor from birth to last use in this order, no pinned value need leave
    room, bound, fell_back = tensor_cap, None, False
    leave = leave and no_swap_bytes(p, list(order)) > tensor_cap
    for _ in range(3 + leave):  # (one more where a solve with pinned values leaving may not pack)
        v = _build(p, room, list(order), leave)
        if below_ms is not None:
            v.prog.ub[v.T[v.n + 2]] = min(v.top, below_ms)
        res = v.prog.solve(left())
        if bound is None:
            bound = dual_bound(res)
        if res.x is None:
            proven = res.status == INFEASIBLE and room == tensor_cap
            none = float("inf") if below_ms is None else below_ms
            why = (("no phased plan fits this cap" if below_ms is None else f"no phased plan within {below_ms:g} ms")
                   if proven else f"HiGHS found no plan in {time_limit_s:g} s")
            return ExactPlan(None, None, float("inf"), none if proven else bound, proven,
                             time.perf_counter() - started, tuple(order), why)
        sol = np.round(res.x).astype(int)
        regions, overflow = layout(v, sol, tensor_cap, left())
        if overflow and _left(v, sol):  # the same step with what leaves held least; else none may leave
            again = _held_least(v, res, left())
            if again is not None:
                sol = again
                regions, overflow = layout(v, sol, tensor_cap, left())
            if overflow:
                leave, fell_back = False, True
                continue
        if not overflow:
            program, homes = _program(v, sol, regions)
            step = schedule_ms(v, sol)  # (HiGHS's bound may pass it by its tolerances)
            proven = res.status == 0 and room == tensor_cap and not fell_back and step <= bound * (1 + PROVEN_GAP)
            return ExactPlan(tuple(program), homes, step, min(bound, step), proven,
                             time.perf_counter() - started, tuple(order))
        room -= -(-overflow // ALIGN) * ALIGN
    return ExactPlan(None, None, float("inf"), bound, False, time.perf_counter() - started, tuple(order),
                     "the regions of three solutions did not pack into the cap")


def _left(v: _V, sol: np.ndarray) -> list[int]:
    """The pinned values a solution sends away mid-step."""
    return [t for t, j in v.leave.items() if sol[j]]


# the second solve's step may pass the first's by this much (at 1e-6 HiGHS found the program infeasible)
HELD_LEAST_SLACK = 1e-4


def _held_least(v: _V, res: object, limit_s: float) -> np.ndarray | None:
    """A solution as fast as ``res``'s whose pinned values that leave are held in the fewest gaps: a home
    is a region the bytes of others may take only between its value's leaving and its return, so the
    longer it is away, the likelier the regions pack. None if HiGHS finds none in ``limit_s``."""
    prog, end = v.prog, v.T[v.n + 2]
    sol = np.round(res.x).astype(int)  # type: ignore[attr-defined]
    prog.ub[end] = min(prog.ub[end], float(res.fun) * (1 + HELD_LEAST_SLACK))  # type: ignore[attr-defined]
    prog.cost[end] = 0.0
    for t in _left(v, sol):
        prog.lb[v.leave[t]] = 1.0
        for j in v.r[t]:
            prog.cost[j] = 1.0
    again = prog.solve(limit_s)
    return None if again.x is None else np.round(again.x).astype(int)


def check_supported(p: Problem) -> None:
    """The exact planner plans one rank, with every update on the device."""
    if p.host.ops:
        raise host_updates_refused()
    if p.net:
        raise SwpError("the exact planner plans one rank", hints=["plan data-parallel graphs with ga or a baseline"])


def host_updates_refused() -> SwpError:
    return SwpError("the exact planner keeps every update on the device", hints=["use --host-updates none"])


def _build(p: Problem, tensor_cap: int, order: list[int], leave: bool = False) -> _V:
    """The program; ``leave``: pinned values may leave mid-step."""
    e = edges(p)
    v = _V(p, e, Milp(), order, tensor_cap, _top(p))
    v.gap = {op: s + 1 for s, op in enumerate(order)}
    v.made = {t: v.gap[op] for t, op in e.producer.items()}
    for op in order:
        for t in dict.fromkeys(p.op_inputs[op]):
            v.reads.setdefault(t, []).append(v.gap[op])
        if p.in_place[op] and p.op_inputs[op] and p.op_outputs[op]:
            v.consumed[p.op_inputs[op][0]] = v.gap[op]
    v.new_of = dict(p.updates)
    v.finals = {p.loss, *v.new_of.values()}
    v.co = {t: {} for t, m in v.made.items() if _may_copy_out(v, t, m)}
    _time(v)
    _held(v)
    _pins(v, leave)
    v.co.update({t: {} for t in v.leave})
    _copies_in(v)
    _copies_out(v)
    _reruns(v)
    _arrivals(v)
    _reads_ready(v)
    _memory(v)
    return v


def _top(p: Problem) -> float:
    """More than any step the program need consider: every op, and every tensor copied in for each read
    and out twice, one after another, twice over."""
    reads: dict[int, int] = {}
    for ins in p.op_inputs:
        for t in ins:
            reads[t] = reads.get(t, 0) + 1
    copies = sum(copy_ms(p.device, p.nbytes[t], True) * (k + 1) for t, k in reads.items())
    copies += sum(2 * copy_ms(p.device, p.nbytes[t], False) for ts in p.op_outputs for t in ts)
    return 2 * (2 * sum(p.op_ms) + copies) + 1.0


def _time(v: _V) -> None:
    """The times: ``T`` (the objective is ``T[n+2]``, the step's end), ``R`` and ``S``, and the copy
    streams' ``B`` and ``F``, whose rows take their copies once those exist (``_streams``)."""
    prog, n = v.prog, v.n
    v.T = [prog.var(ub=0.0 if g == 0 else v.top, cost=1.0 if g == n + 2 else 0.0) for g in range(n + 3)]
    v.Fin = [prog.var(ub=v.top) for _ in range(n + 2)]
    v.Fout = [prog.var(ub=v.top) for _ in range(n + 2)]
    v.Bin = [prog.var(ub=v.top) for _ in range(n + 2)]
    v.Bout = [prog.var(ub=v.top) for _ in range(n + 2)]
    v.R = [prog.var(ub=v.top) for _ in range(n + 2)]
    v.S = [prog.var(ub=v.top) for _ in range(n + 2)]
    for g in range(n + 2):
        prog.row({v.R[g]: 1.0, v.T[g]: -1.0}, lb=0.0)
        prog.row({v.Fin[g]: 1.0, v.T[n + 2]: -1.0}, ub=0.0)
        prog.row({v.Fout[g]: 1.0, v.T[n + 2]: -1.0}, ub=0.0)


def _held(v: _V) -> None:
    """``r``, with what the order forces: inputs from the start to their last read; what an op reads, in
    its gap; what it makes, in its gap; nothing before it is made or after an op works in place over it
    (``_reads_ready`` adds the gap before a read)."""
    p, prog, n = v.p, v.prog, v.n
    used = sorted({t for op in v.order for t in (*p.op_inputs[op], *p.op_outputs[op])} | set(p.inputs))
    for t in used:
        first = v.made.get(t, 0)
        last = v.consumed.get(t, n + 1)
        v.r[t] = [prog.var(integer=True, ub=float(first <= g <= last)) for g in range(n + 2)]
        if t in p.inputs:  # at home from the start, until it is read for the last time
            for g in range(max(v.reads.get(t, [0])) + 1):
                prog.lb[v.r[t][g]] = 1.0
    for t, gs in v.reads.items():
        for g in gs:
            v.prog.lb[v.r[t][g]] = 1.0
    for t, g in v.made.items():
        prog.lb[v.r[t][g]] = 1.0


def _pins(v: _V, leave: bool) -> None:
    """``pin``: only where the new value is made in place over the old one (or there is none); pinned, the
    value and then its new value are held from the start to the end, unless (with ``leave``) the value
    leaves mid-step (``leave[p]``), and then at the start and the end."""
    p, prog, n = v.p, v.prog, v.n
    for t in sorted(p.persistent & set(v.r)):
        new = v.new_of.get(t)
        if new is not None and v.consumed.get(t) != v.made.get(new):
            continue
        if t not in p.pinnable:
            continue
        j = v.pin[t] = prog.var(integer=True)
        until = v.made[new] if new is not None else n + 1
        away = {}
        if leave:
            lv = v.leave[t] = prog.var(integer=True)
            prog.row({lv: 1.0, j: -1.0}, ub=0.0)
            away = {lv: 1.0}
        for g in range(until + 1):  # held throughout, unless it leaves; at home at the start and the end
            ends = g == 0 or g == n + 1
            prog.row({v.r[t][g]: 1.0, j: -1.0, **({} if ends else away)}, lb=0.0)
        if new is not None:
            for g in range(until, n + 2):
                prog.row({v.r[new][g]: 1.0, j: -1.0}, lb=0.0)


def _copies_in(v: _V) -> None:
    """``cin``: persistent tensors not pinned from the prologue on, tensors made in the step once they may
    have been copied out; each due for the first gap at or after it whose op reads the tensor, held until
    then; never into a region the tensor already holds."""
    p, prog, n = v.p, v.prog, v.n
    for t, rs in v.r.items():
        start = _first_copy_in(v, t)
        if start is None:
            continue
        reads = v.reads.get(t, [])
        v.cin[t], v.due[t] = {}, {}
        for a in range(start, n + 1):
            u = next((g for g in reads if g >= a), None)
            if u is None:
                continue
            j = v.cin[t][a] = prog.var(integer=True)
            v.due[t][a] = u
            if t in v.pin:  # (pinned, only after it left)
                prog.row({j: 1.0, v.pin[t]: 1.0, **({v.leave[t]: -1.0} if t in v.leave else {})}, ub=1.0)
            if a:
                prog.row({j: 1.0, rs[a - 1]: 1.0}, ub=1.0)
            for g in range(a, u + 1):
                prog.row({rs[g]: 1.0, j: -1.0}, lb=0.0)


def _first_copy_in(v: _V, t: int) -> int | None:
    """The first gap a swap-in of t may start in (an input is never copied; a tensor made in the step only
    once it may have been copied out), or None."""
    if t in v.p.inputs or (t in v.made and t not in v.co):
        return None
    return 0 if t in v.p.persistent else v.made[t] + 2


def _copies_out(v: _V) -> None:
    """``co`` and ``E``: one swap-out of a tensor made in the step (a final value, or one read again later),
    while held; the gaps that drop it after start after it ends; a swap-in of it starts after that too;
    an unpinned parameter's new value is copied home, and the loss is held at the end or copied."""
    p, prog, n = v.p, v.prog, v.n
    old_of = {new: old for old, new in v.new_of.items()}
    for t in v.co:
        m = v.made.get(t, 0)  # (a pinned value that leaves: from the prologue on)
        u = v.consumed.get(t)  # (a swap-out after the op that works in place over t would read its output)
        gaps = range(m + 1, n + 2 if u is None else u + 1)
        if t not in v.made:  # a pinned value leaves right after a read (or from the start)
            gaps = [b for b in gaps if b == 1 or b - 1 in v.reads.get(t, [])]
        co = v.co[t] = {b: prog.var(integer=True) for b in gaps}
        e = v.E[t] = prog.var(ub=v.top)
        for b, j in co.items():
            prog.row({j: 1.0, v.r[t][b - 1]: -1.0}, ub=0.0)
            if u is not None:  # an op works in place over t only once it came back: not held since
                prog.row({j: 1.0, **{v.r[t][f]: 1.0 for f in range(b, u)}}, ub=float(u - b))
        for f in range(m + 1, n + 2):
            before = {j: v.top for b, j in co.items() if b <= f}
            for waits in (v.R[f], v.Bin[f]):  # what takes a region in gap f starts after the copy
                prog.row({e: 1.0, waits: -1.0, v.r[t][f]: -v.top, **before}, ub=v.top)
            if t in v.finals:
                prog.row({v.r[t][f - 1]: 1.0, v.r[t][f]: -1.0, **{j: -1.0 for j in before}}, ub=0.0)
        # a swap-in follows the swap-out (of a pinned value that left: only while pinned, none otherwise)
        while_pinned = {} if t in v.made else {v.pin[t]: 1.0}
        for a, j in v.cin.get(t, {}).items():  # (E is free where there is no swap-out)
            prog.row({j: 1.0, **{k: -1.0 for b, k in co.items() if b < a}, **while_pinned},
                     ub=float(len(while_pinned)))
            prog.row({e: 1.0, v.Bin[a]: -1.0, j: v.top}, ub=v.top)
        old = old_of.get(t)
        if t in v.leave:
            prog.row({**{j: 1.0 for j in co.values()}, v.leave[t]: -1.0}, lb=0.0, ub=0.0)
        elif old is not None:
            pinned = {v.pin[old]: 1.0} if old in v.pin else {}
            prog.row({**{j: 1.0 for j in co.values()}, **pinned}, lb=1.0, ub=1.0)
        else:
            prog.row({j: 1.0 for j in co.values()}, ub=1.0)
    if p.loss in v.r:
        prog.row({v.r[p.loss][n + 1]: 1.0, **{j: 1.0 for j in v.co.get(p.loss, {}).values()}}, lb=1.0)


def _may_copy_out(v: _V, t: int, m: int) -> bool:
    """A tensor made at gap m may be swapped out if it must be left somewhere or may be copied back for a
    later read."""
    return t in v.finals or max(v.reads.get(t, [0])) >= m + 2


def _reruns(v: _V) -> None:
    """``rc``: an op (not in place, making no new value) reruns in a gap after its first run, up to the
    last read of what it makes, before that gap's op; its outputs were gone and are back, its inputs are
    there (held in the gap before, or rebuilt by an earlier rerun of the gap), and none is still due."""
    p, prog, n = v.p, v.prog, v.n
    news = set(v.new_of.values())
    for i in v.order:
        outs = p.op_outputs[i]
        if not outs or p.in_place[i] or news & set(outs):
            continue
        last = max(g for t in outs for g in v.reads.get(t, [0]))
        if last >= v.gap[i] + 2:
            v.rc[i] = {g: prog.var(integer=True) for g in range(v.gap[i] + 1, last + 1)}
    _rerun_copies(v)
    _late_frees(v)
    for i, js in v.rc.items():
        for g, j in js.items():
            for o in p.op_outputs[i]:
                prog.row({j: 1.0, v.r[o][g - 1]: 1.0}, ub=1.0)
                prog.row({v.r[o][g]: 1.0, j: -1.0}, lb=0.0)
            for t in dict.fromkeys(p.op_inputs[i]):
                late = {v.late[t][g]: 1.0} if g in v.late.get(t, {}) else {}
                prog.row({v.r[t][g]: 1.0, **late, j: -1.0}, lb=0.0)
                maker = v.e.producer.get(t)
                again = {v.rc[maker][g]: 1.0} if maker in v.rc and g in v.rc[maker] else {}
                if (g, g) in v.cr.get(t, {}):
                    again[v.cr[t][g, g]] = 1.0
                prog.row({v.r[t][g - 1]: 1.0, **again, j: -1.0}, lb=0.0)
                for a, k in v.cin.get(t, {}).items():
                    if a <= g <= v.due[t][a]:
                        prog.row({j: 1.0, k: 1.0}, ub=1.0)
            for o in p.op_outputs[i]:
                same = [k for (a, _), k in v.cr.get(o, {}).items() if a == g]
                for k in [*same, *([v.cin[o][g]] if g in v.cin.get(o, {}) else [])]:
                    prog.row({j: 1.0, k: 1.0}, ub=1.0)
    for g in range(n + 2):
        reruns = {js[g]: -p.op_ms[i] for i, js in v.rc.items() if g in js}
        prog.row({v.S[g]: 1.0, v.R[g]: -1.0, **reruns}, lb=0.0)
        prog.row({v.T[g + 1]: 1.0, v.S[g]: -1.0}, lb=v.op_ms(g))
    _streams(v)


def _rerun_reads(v: _V) -> Iterator[tuple[int, int]]:
    """Every (tensor, gap) where a rerun the program may place in that gap reads the tensor."""
    for i, js in v.rc.items():
        for t in dict.fromkeys(v.p.op_inputs[i]):
            for g in js:
                yield t, g


def _rerun_readers(v: _V, t: int, g: int) -> list[int]:
    """The ops that may rerun in gap g and read t, in the order their reruns run."""
    return sorted((i for i, js in v.rc.items() if g in js and t in v.p.op_inputs[i]), key=v.gap.__getitem__)


def _rerun_copies(v: _V) -> None:
    """``cr``: a swap-in of t starting in gap a (up to ``RERUN_LEAD`` gaps early) for the reruns of gap g,
    landing before they start, t held in between: only with a rerun of g that reads t, where no op of gaps
    a..g-1 reads t and no rerun of them does, into a region t did not hold in a-1, never beside another
    swap-in of t starting in a, and (a tensor made in the step) after its swap-out ends."""
    p, prog = v.p, v.prog
    if v.n > RERUN_EXTRAS_MAX_OPS:
        return
    for t, g in _rerun_reads(v):
        start = _first_copy_in(v, t)
        read = max((h for h in v.reads.get(t, []) if h < g), default=-1)
        for a in range(max(start if start is not None else g + 1, read + 1, g - RERUN_LEAD), g + 1):
            if (a, g) not in v.cr.get(t, {}):
                v.cr.setdefault(t, {})[a, g] = prog.var(integer=True)
    for t, spans in v.cr.items():
        for (a, g), j in spans.items():
            prog.row({j: 1.0, **{v.rc[i][g]: -1.0 for i in _rerun_readers(v, t, g)}}, ub=0.0)
            for i, js in v.rc.items():
                if t in p.op_inputs[i]:
                    for h in range(a, g):
                        if h in js:
                            prog.row({j: 1.0, js[h]: 1.0}, ub=1.0)
            if a:
                prog.row({j: 1.0, v.r[t][a - 1]: 1.0}, ub=1.0)
            for h in range(a, g + 1):
                prog.row({v.r[t][h]: 1.0, j: -1.0}, lb=0.0)
            if t in v.pin:
                prog.row({j: 1.0, v.pin[t]: 1.0}, ub=1.0)
            if t in v.co and t in v.made:
                prog.row({j: 1.0, **{k: -1.0 for b, k in v.co[t].items() if b < a}}, ub=0.0)
                prog.row({v.E[t]: 1.0, v.Bin[a]: -1.0, j: v.top}, ub=v.top)
        for a in {a for a, _ in spans}:
            starting = {k: 1.0 for (a2, _), k in spans.items() if a2 == a}
            if a in v.cin.get(t, {}):
                starting[v.cin[t][a]] = 1.0
            prog.row(starting, ub=1.0)


RERUN_LEAD = 3  # a swap-in for a rerun starts at most this many gaps before it
# Past this many ops, neither swap-ins for reruns (``cr``) nor late frees (``late``): their rows slowed
# HiGHS more than they gained in a polish's time (bench/exact_gap.py's graphs, the model's order: attention
# 9 at 1/4 0.3716 ms proven in 2.8 s without ``cr``, 0.3767 unproven in 6.5 s with it; ga at 10 s on lstm 9
# at 1/4 0.2209 without ``late``, 0.2309 with it; docs/benchmarks.md)
RERUN_EXTRAS_MAX_OPS = 20


def _late_frees(v: _V) -> None:
    """``late``: a tensor held in gap g-1 that only g's reruns read in g may stay for them and be freed
    before g's op (its bytes then count in g's rerun phase, ``_memory``, not in g); not past an op that
    works in place over it."""
    p, prog = v.p, v.prog
    if v.n > RERUN_EXTRAS_MAX_OPS:
        return
    for t, g in _rerun_reads(v):
        if (t not in p.inputs and g not in v.reads.get(t, []) and g <= v.consumed.get(t, v.n + 1)
                and prog.lb[v.r[t][g]] < 1 and g not in v.late.get(t, {})):
            v.late.setdefault(t, {})[g] = prog.var(integer=True)
    for t, gs in v.late.items():
        for g, j in gs.items():
            prog.row({j: 1.0, **{v.rc[i][g]: -1.0 for i in _rerun_readers(v, t, g)}}, ub=0.0)
            prog.row({j: 1.0, v.r[t][g - 1]: -1.0}, ub=0.0)
            prog.row({j: 1.0, v.r[t][g]: 1.0}, ub=1.0)


def _landings(v: _V, a: int, on: Callable[[int], bool]) -> list[tuple[int, int, int, bool]]:
    """The swap-ins starting in gap a that ``on`` takes, as (variable, tensor, gap, for its reruns), in the
    order the stream runs them: by the gap they land for (a rerun's before that gap's op), then by
    tensor."""
    mine = [(g, 0, t, j) for t, spans in v.cr.items() for (a2, g), j in spans.items() if a2 == a and on(j)]
    mine += [(v.due[t][a], 1, t, js[a]) for t, js in v.cin.items() if a in js and on(js[a])]
    return [(j, t, g, not late) for g, late, t, j in sorted(mine)]


def _streams(v: _V) -> None:
    """Each copy stream starts gap g's copies at ``B[g]``, once the gap has begun and the previous gap's
    copies are done, and runs them back to back (swap-ins by the gap they land for, then by tensor): a
    swap-in lands before its op starts, a swap-out ends by ``E``."""
    p, prog, n = v.p, v.prog, v.n
    for starts, ends, to_device in ((v.Bin, v.Fin, True), (v.Bout, v.Fout, False)):
        for g in range(n + 2):
            # (copy variable, tensor, the start its copy lands by: None for a swap-out)
            batch = ([(j, t, v.R[u] if rerun else v.S[u]) for j, t, u, rerun in _landings(v, g, lambda j: True)]
                     if to_device else
                     [(js[g], t, None) for t, js in sorted(v.co.items()) if g in js])
            ms = {j: copy_ms(p.device, p.nbytes[t], to_device) for j, t, _ in batch}
            prog.row({starts[g]: 1.0, v.T[g]: -1.0}, lb=0.0)
            if g:
                prog.row({starts[g]: 1.0, ends[g - 1]: -1.0}, lb=0.0)
            prog.row({ends[g]: 1.0, starts[g]: -1.0, **{j: -ms[j] for j in ms}}, lb=0.0)
            for k, (j, t, by) in enumerate(batch):
                sofar = {j2: ms[j2] for j2, _, _ in batch[:k + 1]}
                if by is not None:  # (j's own time is in ``sofar``)
                    prog.row({starts[g]: 1.0, **sofar, by: -1.0, j: v.top + ms[j]}, ub=v.top)
                else:
                    prog.row({v.E[t]: 1.0, starts[g]: -1.0, **{c: -x for c, x in sofar.items()},
                              j: -v.top - ms[j]}, lb=-v.top)


def _arrivals(v: _V) -> None:
    """A region held in gap g and not in g-1 was taken in g: by a swap-in or a rerun (a pinned tensor is
    held from before the prologue)."""
    prog = v.prog
    for t, rs in v.r.items():
        first = v.made.get(t, 0)
        maker = v.e.producer.get(t)
        for g in range(first + (t in v.made), v.n + 2):
            coeffs = {rs[g]: 1.0}
            if g > 0:
                coeffs[rs[g - 1]] = -1.0
            elif t in v.pin:
                coeffs[v.pin[t]] = -1.0
            elif t in v.p.inputs:
                continue
            if g in v.cin.get(t, {}):
                coeffs[v.cin[t][g]] = -1.0
            for (a, _), k in v.cr.get(t, {}).items():
                if a == g:
                    coeffs[k] = -1.0
            if maker in v.rc and g in v.rc[maker]:
                coeffs[v.rc[maker][g]] = -1.0
            prog.row(coeffs, ub=0.0)


def _reads_ready(v: _V) -> None:
    """What an op reads was held in the gap before, or arrives in its own gap's segment: copied in (the op
    waits for it) or rebuilt."""
    for t, gs in v.reads.items():
        if t in v.p.inputs:
            continue
        maker = v.e.producer.get(t)
        for g in gs:
            late = {v.cin[t][g]: 1.0} if g in v.cin.get(t, {}) else {}
            if maker in v.rc and g in v.rc[maker]:
                late[v.rc[maker][g]] = 1.0
            v.prog.row({v.r[t][g - 1]: 1.0, **late}, lb=1.0)


def _memory(v: _V) -> None:
    """The regions held in each gap fit; where a tensor stays for a gap's reruns only, so do those held
    while the reruns run: the gap's, less its op's outputs (not made yet), and the late ones."""
    p = v.p
    for g in range(v.n + 2):
        coeffs = {rs[g]: float(p.size[t]) for t, rs in v.r.items()}
        late = {gs[g]: float(p.size[t]) for t, gs in v.late.items() if g in gs}
        if late:
            before_op = {rs[g]: float(p.size[t]) for t, rs in v.r.items() if v.made.get(t) != g}
            v.prog.row({**before_op, **late}, ub=float(v.tensor_cap))
        room = float(v.tensor_cap)
        if 1 <= g <= v.n:
            op = v.order[g - 1]
            if p.in_place[op] and p.op_inputs[op] and p.op_outputs[op]:
                room += min(p.size[p.op_inputs[op][0]], p.size[p.op_outputs[op][0]])
        v.prog.row(coeffs, ub=room)


def schedule_ms(v: _V, sol: np.ndarray) -> float:
    """The step of a solution's schedule, computed again from its binaries alone, each time as early as
    the program's rows allow (HiGHS's own times may sit a feasibility tolerance past them): the value
    the plan's simulated step is at most."""
    p, n = v.p, v.n
    on = lambda x: bool(sol[x])  # noqa: E731
    T, land, done = [0.0] * (n + 3), {}, {}
    fin = fout = 0.0
    for g in range(n + 2):
        out = sorted(t for t, js in v.co.items() if g in js and on(js[g]))
        start = max(T[g], fout)
        for t in out:
            start = done[t] = start + copy_ms(p.device, p.nbytes[t], False)
        fout = start
        dropped = [done[t] for t in done if not on(v.r[t][g])]
        arriving = _landings(v, g, on)
        start = max([T[g], fin, *dropped, *(done[t] for _, t, _, _ in arriving if t in done)])
        for _, t, u, rerun in arriving:
            start = start + copy_ms(p.device, p.nbytes[t], True)
            land.setdefault((u, rerun), []).append(start)
        fin = start
        reruns = sum(p.op_ms[i] for i, js in v.rc.items() if g in js and on(js[g]))
        ready = max([T[g], *dropped, *land.get((g, True), [])])  # when the reruns may start
        T[g + 1] = max([ready + reruns, *land.get((g, False), [])]) + v.op_ms(g)
    return max(T[n + 2], fin, fout)


def residencies(v: _V, sol: np.ndarray) -> list[tuple[list[tuple[int, int]], int, int]]:
    """The regions a solution needs: each a chain of (tensor, first gap) residencies that share it (an
    output made in place joins its input's), with the first and last *phase* it is held in: gap g's
    reruns (and the copies before them) are phase 2g, its op 2g + 1. An op's outputs are taken in its
    phase, and a tensor that stays for the reruns of the gap after its last (``late``) is held to theirs."""
    chains: dict[tuple[int, int], list[tuple[int, int]]] = {}
    last: dict[tuple[int, int], int] = {}
    into = {out: src for src, g in v.consumed.items() for out in v.p.op_outputs[v.order[g - 1]][:1]}
    spans = []
    for t, rs in v.r.items():
        held = [g for g in range(v.n + 2) if sol[rs[g]]]
        spans += [(g, t, _end(held, g)) for g in held if g - 1 not in held]
    for g, t, end in sorted(spans):
        src = into.get(t)
        if src is not None and g == v.made[t]:
            key = next(k for k, ch in chains.items() if ch[-1] == (src, _start(v, sol, src, g)))
            chains[key].append((t, g))
        else:
            key = (t, g)
            chains[key] = [(t, g)]
        stays = end + 1 in v.late.get(t, {}) and sol[v.late[t][end + 1]]
        last[key] = max(last.get(key, 0), 2 * end + 1 + bool(stays))
    return [(ch, 2 * ch[0][1] + (v.made.get(ch[0][0]) == ch[0][1]), last[k]) for k, ch in chains.items()]


def _end(held: list[int], g: int) -> int:
    while g + 1 in held:
        g += 1
    return g


def _start(v: _V, sol: np.ndarray, t: int, g: int) -> int:
    """The first gap of t's residency that holds gap g."""
    while g > 0 and sol[v.r[t][g - 1]]:
        g -= 1
    return g


def layout(v: _V, sol: np.ndarray, tensor_cap: int, time_limit_s: float = 10.0
           ) -> tuple[dict[tuple[int, int], Region], int]:
    """A region for every residency chain (``packing.pack``): the regions and 0, or none and the least
    overflow found."""
    chains = residencies(v, sol)
    items = [(first, end, max(v.p.size[t] for t, _ in chain)) for chain, first, end in chains]
    homes: dict[int, list[int]] = {}  # a pinned value that left comes back to its home
    for k, (chain, _, _) in enumerate(chains):
        for t in {t for t, _ in chain if t in v.pin and sol[v.pin[t]]}:
            homes.setdefault(t, []).append(k)
    offsets, overflow = pack(items, tensor_cap, time_limit_s, list(homes.values()))
    if offsets is None:
        return {}, max(overflow, ALIGN)
    return {link: Region(o, size) for (chain, _, _), o, (_, _, size) in zip(chains, offsets, items)
            for link in chain}, 0


def _program(v: _V, sol: np.ndarray, regions: dict[tuple[int, int], Region]) -> tuple[list[Instr], dict[int, Region]]:
    """The solution as instructions, gap by gap (module docstring), and the homes of inputs and pinned
    tensors."""
    p, n = v.p, v.n
    on = {t: [g for g in range(n + 2) if sol[rs[g]]] for t, rs in v.r.items()}

    def region(t: int, g: int) -> Region:
        return regions[(t, _start(v, sol, t, g))]

    homes = {t: region(t, 0) for t in v.r if t in p.inputs or (t in v.pin and sol[v.pin[t]])}
    program: list[Instr] = []
    anchor = -1  # the latest run so far: what the segment's copies and frees follow
    name = p.names.__getitem__
    for g in range(n + 2):  # (each stream's copies in the order ``_streams`` and ``schedule_ms`` time them)
        program += [SwapOut(name(t), anchor) for t in sorted(t for t, js in v.co.items() if g in js and sol[js[g]])]
        dropped = [t for t in v.r if g - 1 in on[t] and g not in on[t] and v.consumed.get(t) != g - 1]
        stay = {t for t in dropped if g in v.late.get(t, {}) and sol[v.late[t][g]]}
        program += [Free(name(t), anchor) for t in dropped if t not in stay]
        reruns = sorted((i for i, js in v.rc.items() if g in js and sol[js[g]]), key=v.gap.__getitem__)
        for _, t, u, rerun in _landings(v, g, lambda j: bool(sol[j])):
            before = v.order[u - 1] if not rerun else next(i for i in _rerun_readers(v, t, u) if sol[v.rc[i][u]])
            program.append(SwapIn(name(t), region(t, g), anchor, before))
        for i in reruns:
            program.append(Run(i, tuple((name(t), region(t, g)) for t in p.op_outputs[i]), recompute=True))
        program += [Free(name(t), reruns[-1]) for t in dropped if t in stay]
        if 1 <= g <= n:
            op = v.order[g - 1]
            in_place = bool(p.in_place[op] and p.op_inputs[op] and p.op_outputs[op])
            program.append(Run(op, tuple((name(t), region(t, g)) for t in p.op_outputs[op]), in_place))
            anchor = op
    return program, homes


def _swapping_nothing(req: Request, p: Problem, no_swap: int) -> Plan | None:
    """Where the no-swap arena fits the cap, the plan that swaps nothing in the model's order (belady's
    there), proven optimal without HiGHS: no plan's step is below the ideal one, which it takes. (HiGHS,
    given seconds, could return a slower plan there.) None where it does not fit, or is not that fast."""
    if no_swap > req.tensor_cap:
        return None
    step = baseline_timing(req, "belady").iteration_ms  # (the compiled simulator: no plan built to be refused)
    if step > ideal_ms(p) * (1 + 1e-12):
        return None
    extra = {"exact_schedule_ms": step, "exact_bound_ms": step, "exact_optimal": 1.0}
    return with_figures(attrs.evolve(baseline(req, p, "belady")[0], method="exact"), p, no_swap, extra,
                        recomputes=True)


EXACT_MAX_OPS = 150  # the program grows with ops x gaps x tensors: past this, HiGHS rarely finishes in minutes


class TooLarge(SwpError):
    """A graph past ``EXACT_MAX_OPS``: refused by the method, not infeasible under the cap."""


def plan_exact(req: Request, time_limit_s: float = 60.0) -> Plan:
    """``--method exact``: the fastest phased plan of ``req``'s graph in its own order (the default
    schedule), HiGHS given ``time_limit_s``; its figures add the program's value (``exact_schedule_ms``,
    at least the simulated step), HiGHS's dual bound for phased plans in that order (``exact_bound_ms``;
    the ideal step where nothing need swap: ``_swapping_nothing``) and whether it proved the optimum
    (``exact_optimal``)."""
    p = Problem.of(req)
    check_supported(p)
    if p.n_ops > EXACT_MAX_OPS:
        raise TooLarge(f"the exact planner takes graphs of at most {EXACT_MAX_OPS} ops; this one has {p.n_ops}",
                       hints=["use --method ga (bench/exact_gap.py measures how close it comes on small graphs)"])
    no_swap = no_swap_bytes(p)
    if req.tensor_cap < need_bytes(p, frozenset()):
        raise below_smallest_cap(p, req.cap, no_swap)
    if (whole := _swapping_nothing(req, p, no_swap)) is not None:
        return whole
    time_limit_s = max(MIN_LIMIT_S, time_limit_s)
    x = exact_plan(p, req.cap, list(range(p.n_ops)), time_limit_s)
    if x.program is None or x.homes is None:
        raise SwpError(f"the exact planner made no plan: {x.why}",
                       hints=["give a larger --memory or --budget, or use --method ga"])
    plan = assemble(req, p, "exact", x.homes, x.program)
    extra = {"exact_schedule_ms": x.objective_ms, "exact_bound_ms": x.bound_ms, "exact_optimal": float(x.optimal)}
    return with_figures(plan, p, no_swap, extra, recomputes=True)
