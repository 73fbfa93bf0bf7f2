"""The library API: what a notebook user calls instead of the command line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import swapdsl
from conftest import MODELS

TINY = MODELS / "tiny_resnet.swp"


def test_load_optimize_save_read_execute(tmp_path: Path) -> None:
    model = swapdsl.load(TINY, batch=4, width=4)
    assert model.args["batch"] == 4 and model.summary()["model"] == "tiny_resnet"
    plan = swapdsl.optimize(model, memory="1MiB", method="belady")
    assert plan.cap == 1 << 20 and plan.method == "belady"
    swapdsl.save(plan, tmp_path / "t.plan")
    again = swapdsl.read(tmp_path / "t.plan")
    assert again.program == plan.program
    figures = swapdsl.simulate(again)
    assert figures == pytest.approx(dict(plan.figures))
    run = swapdsl.execute(tmp_path / "t.plan", steps=2, check=True, backend="numpy")
    assert run.max_rel_diff == 0.0 and len(run.losses) == 2
    assert run.figures["device_arena_bytes"] == plan.cap
    assert json.loads(json.dumps(run.to_json()))["loss"] == run.losses


def test_the_same_request_gives_the_same_plan() -> None:
    a = swapdsl.optimize(TINY, memory="6MiB", generations=3, seed=5, workers=1)
    b = swapdsl.optimize(TINY, memory="6MiB", generations=3, seed=5, workers=1)
    assert a == b


def test_training_a_model_without_a_cap() -> None:
    seen: list[int] = []
    run = swapdsl.execute(swapdsl.load(MODELS / "mlp.swp", depth=1), steps=3,
                          on_step=lambda step, loss, ms, diff: seen.append(step))
    assert seen == [1, 2, 3] and run.losses[-1] < run.losses[0] and run.max_rel_diff is None


@pytest.mark.parametrize("call, message", [
    (lambda: swapdsl.load(TINY, batch=1.5), "model argument `batch` = 1.5: expected an integer"),
    (lambda: swapdsl.load(TINY, depth=3), "has no argument `depth`"),
    (lambda: swapdsl.optimize(TINY, memory="2MiB", budget=3), "unknown search option"),
    (lambda: swapdsl.optimize(TINY, memory="lots"), "cannot read the memory size"),
    (lambda: swapdsl.execute(swapdsl.load(TINY), check=True), "give a plan"),
])
def test_mistakes_raise_the_command_lines_message(call, message: str) -> None:  # noqa: ANN001
    with pytest.raises(swapdsl.SwpError, match=message.replace("(", r"\(")):
        call()
