"""The one replay of a plan, and the names shared with the compiled planner."""

from __future__ import annotations

from swapdsl.plan.program import Free, InstrKind, Run, SwapIn, SwapOut
from swapdsl.plan.replay import START, walk
from swapdsl.planning import _fastplan
from swapdsl.planning.compiled import Status
from swapdsl.planning.policy import METHODS, OUTPUTS

from test_planners import caps, plan_for
from test_runtime import small_training_graph


def test_the_compiled_planner_numbers_instruction_kinds_as_the_plan_does() -> None:
    assert _fastplan.INSTR_KINDS == {k.name.lower(): k.value for k in InstrKind if k is not InstrKind.HOST}


def test_statuses_and_policy_codes_are_named_on_both_sides() -> None:
    assert {s.name.lower(): s.value for s in Status} == _fastplan.STATUS
    codes = _fastplan.POLICY_CODES
    assert set(codes["outputs"]) == set(OUTPUTS)
    assert {p.victim for p in METHODS.values()} <= set(codes["victim"])
    assert {p.prefetch for p in METHODS.values()} <= set(codes["prefetch"])
    assert _fastplan.POLICY_FIELDS == ("victim", "prefetch", "offload", "outputs", "reserve", "horizon")


def test_each_instruction_waits_for_what_it_needs() -> None:
    """Over a plan that swaps: waits point back to stream work, never forward or at a free; a run waits for
    the swap-in of each input due for it, a swap-in for the swap-out that wrote its host copy."""
    t = small_training_graph("tiny_resnet")
    need, _ = caps(t)
    plan = plan_for(t, need, "belady")
    steps = list(walk(plan))
    assert [s.index for s in steps] == list(range(len(plan.program)))
    kinds = {s.index: s.kind for s in steps}
    last_swapout: dict[str, int] = {}
    swapin: dict[str, int] = {}
    for s in steps:
        assert all(START < w < s.index and kinds[w] is not InstrKind.FREE for w in s.waits)
        if isinstance(s.instr, SwapIn):
            swapin[s.instr.tensor] = s.index
            if s.instr.tensor in last_swapout:
                assert last_swapout[s.instr.tensor] in s.waits
        elif isinstance(s.instr, SwapOut):
            last_swapout[s.instr.tensor] = s.index
        elif isinstance(s.instr, Run):
            due = [swapin[n] for n in plan.ops[s.instr.op].inputs if n in swapin
                   and plan.program[swapin[n]].before == s.instr.op]
            assert set(due) <= set(s.waits)
    assert any(isinstance(s.instr, SwapIn) for s in steps) and any(isinstance(s.instr, Free) for s in steps)
