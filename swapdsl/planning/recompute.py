"""Recomputation as a second lever: a swap-in of an activation becomes a rerun of the op that made it.

Where a plan swaps an activation out and back in once, and at the swap-in's place in the program every
input of the op that made it is on the device, the pair can become one ``recompute`` of that op into the
same region: the device-to-host copy disappears, the host-to-device copy becomes compute. Whether that
is faster depends on the streams (Capuchin's rule: recompute what is cheaper to rerun than its exposed
swap), so ``trade_swaps`` takes a rewrite only where the simulator says the step gets faster, one
candidate at a time, cheapest op first, and every plan it keeps passes the validator.
"""

from __future__ import annotations

from collections import Counter

import attrs

from swapdsl.plan.figures import plan_figures
from swapdsl.plan.program import Instr, Plan, Run, SwapIn, SwapOut
from swapdsl.plan.replay import Replay
from swapdsl.plan.simulate import simulate
from swapdsl.plan.validate import PlanError, validate


def candidates(plan: Plan) -> list[int]:
    """Program indices of the swap-ins that could become recomputations: an activation swapped out and in
    once, made by an op that did not work in place, whose inputs are all on the device (and not waiting
    for a swap-in due elsewhere) at the swap-in's place."""
    outs = Counter(i.tensor for i in plan.program if isinstance(i, SwapOut))
    ins = Counter(i.tensor for i in plan.program if isinstance(i, SwapIn))
    homed = {t.name for t in plan.tensors if t.home is not None}
    maker = {name: o for o in plan.ops for name in o.outputs}
    in_place = {i.op for i in plan.program if isinstance(i, Run) and i.in_place}
    found = []
    replay = Replay(plan)
    for _ in replay.homes():
        pass
    for k, instr in enumerate(plan.program):
        if isinstance(instr, SwapIn) and outs[instr.tensor] == 1 and ins[instr.tensor] == 1 \
                and instr.tensor not in homed:
            op = maker[instr.tensor]
            present = all(n in replay.loc and (n not in replay.due or replay.due[n][0] == op.index)
                          for n in op.inputs)
            if present and len(op.outputs) == 1 and op.index not in in_place and op.index in replay.ran:
                found.append(k)
        replay.apply(k, instr)
    return found


def rewrite(plan: Plan, swapins: list[int]) -> Plan:
    """``plan`` with the swap-ins at these program indices made recomputations (and their swap-outs gone)."""
    maker = {name: o.index for o in plan.ops for name in o.outputs}
    chosen = {plan.program[k].tensor for k in swapins}  # type: ignore[union-attr]
    program: list[Instr] = []
    for k, instr in enumerate(plan.program):
        if isinstance(instr, SwapOut) and instr.tensor in chosen:
            continue
        if k in swapins:
            assert isinstance(instr, SwapIn)
            instr = Run(maker[instr.tensor], ((instr.tensor, instr.region),), recompute=True)
        program.append(instr)
    return attrs.evolve(plan, program=tuple(program))


def trade_swaps(plan: Plan, limit: int = 64) -> Plan:
    """``plan`` with up to ``limit`` swap pairs traded for recomputations, each kept only if it validates
    and makes the simulated step faster."""
    best, best_ms = plan, simulate(plan).iteration_ms
    cost = {o.index: o.ms for o in plan.ops}
    maker = {name: o.index for o in plan.ops for name in o.outputs}
    tried: set[str] = set()
    for _ in range(limit):
        left = [k for k in candidates(best) if best.program[k].tensor not in tried]  # type: ignore[union-attr]
        if not left:
            break
        k = min(left, key=lambda j: cost[maker[best.program[j].tensor]])  # type: ignore[union-attr]
        tried.add(best.program[k].tensor)  # type: ignore[union-attr]
        trial = rewrite(best, [k])
        try:
            validate(trial)
        except PlanError:
            continue
        ms = simulate(trial).iteration_ms
        if ms < best_ms:
            best, best_ms = trial, ms
    if best is plan:
        return plan
    stored = dict(plan.figures)
    figures = plan_figures(best, simulate(best), *(stored.get(k) for k in ("bound_ms", "no_swap_bytes",
                                                                           "graph_peak_bytes")))
    extra = {k: v for k, v in stored.items() if k not in figures}  # the planner's own (search time, ...)
    return attrs.evolve(best, figures=tuple({**figures, **extra}.items()))
