"""Recomputation in plans (format 4): the file, the validator's refusals, `show`."""

from __future__ import annotations

from pathlib import Path

import attrs
import pytest

from swapdsl.plan import file as planfile
from swapdsl.plan.program import Free, Run
from swapdsl.plan.show import summary
from swapdsl.plan.simulate import simulate
from swapdsl.plan.validate import PlanError, PlanInvalid, validate
from swapdsl.planning.recompute import candidates, rewrite, trade_swaps
from test_planners import caps, plan_for
from test_runtime import small_training_graph


@pytest.fixture(scope="module")
def traded():
    t = small_training_graph("inception_v4")
    need, no_swap = caps(t)
    plan = plan_for(t, max(no_swap // 4, need), "lru")
    return t, plan, trade_swaps(plan)


def recomputes(plan) -> list[int]:  # noqa: ANN001
    return [k for k, i in enumerate(plan.program) if isinstance(i, Run) and i.recompute]


def test_recompute_lines_round_trip(traded, tmp_path: Path) -> None:
    _, _, plan = traded
    planfile.write_plan(plan, str(tmp_path / "p.plan"))
    text = (tmp_path / "p.plan").read_text()
    assert text.startswith("swapdsl-plan 4\n") and "\nrecompute " in text
    again = planfile.read_plan(str(tmp_path / "p.plan"))
    assert again.program == plan.program
    assert "recomputed      " in summary(again, simulate(again))


def test_older_plans_are_refused(traded, tmp_path: Path) -> None:
    _, plan, _ = traded
    planfile.write_plan(plan, str(tmp_path / "p.plan"))
    path = tmp_path / "p.plan"
    path.write_text(path.read_text().replace("swapdsl-plan 4", "swapdsl-plan 3", 1))
    with pytest.raises(planfile.SwpError, match="plan format version 3 is not supported .this swapdsl reads 4."):
        planfile.read_plan(str(path))


def test_the_validator_refuses_bad_recomputations(traded) -> None:
    t, plan, good = traded
    k = recomputes(good)[0]
    again = good.program[k]
    assert isinstance(again, Run)

    def refused(program: list, invariant: int, words: str) -> None:  # noqa: ANN001
        with pytest.raises(PlanInvalid) as err:
            validate(attrs.evolve(good, program=tuple(program)), t)
        assert err.value.invariant == invariant and words in err.value.message, err.value.message

    program = list(good.program)
    first = next(j for j, i in enumerate(program) if isinstance(i, Run) and i.op == again.op and not i.recompute)
    refused(program[:first] + [again] + program[first:], 1, "recomputed before its first run")
    refused(program[:first + 1] + [attrs.evolve(again, recompute=False)] + program[first + 1:], 1,
            "runs twice; a second run is a `recompute`")
    refused(program[:k] + program[k + 1:], 6, "no later recompute rebuilds it")
    # rebuilt while still on the device: once more, right after its first run
    refused(program[:first + 1] + [again] + program[first + 1:], 3, "still on the device")
    # in place over a first input that is not there
    with pytest.raises(PlanInvalid):
        validate(attrs.evolve(good, program=tuple(program[:k] + [attrs.evolve(again, in_place=True)] + program[k:])), t)


def test_a_recompute_needs_its_inputs_on_the_device(traded) -> None:
    """Moved to just after the last free of one of its inputs, the recomputation reads bytes that are gone."""
    t, _, good = traded
    k = recomputes(good)[0]
    again = good.program[k]
    op = good.ops[again.op]
    program = [i for j, i in enumerate(good.program) if j != k]
    frees = [j for j, i in enumerate(program) if isinstance(i, Free) and i.tensor in op.inputs and j >= k]
    if not frees:
        pytest.skip("every input of this recomputation stays on the device to the end")
    program.insert(frees[0] + 1, again)
    with pytest.raises(PlanError):
        validate(attrs.evolve(good, program=tuple(program)), t)


def test_candidates_are_swap_ins_of_activations(traded) -> None:
    _, plan, _ = traded
    found = candidates(plan)
    assert found and all(type(plan.program[k]).__name__ == "SwapIn" for k in found)
    assert recomputes(rewrite(plan, found[:1])) != []
