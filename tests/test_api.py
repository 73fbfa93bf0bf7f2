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
    assert run.warmup_steps == 1 and run.steady_ms() == run.step_ms[1]  # NumPy: only the first step warms up
    assert json.loads(json.dumps(run.to_json()))["loss"] == run.losses


def test_steady_step_times_leave_out_the_warm_up() -> None:
    """The step that captures the CUDA graph issues every item from Python: a median over too few steps
    would take it in (bench/gpu_exec.py's `--steps 3` once averaged it into a belady plan's step time)."""
    run = swapdsl.Execution("m", "cupy", 5, 0, [1.0] * 5, [900.0, 1100.0, 100.0, 120.0, 110.0],
                            {"warmup_steps": 2, "host_ms_per_step": [800.0, 1000.0, 0.5, 0.7, 0.6]})
    assert run.steady_ms() == 110.0 and run.steady_ms(run.figures["host_ms_per_step"]) == 0.6
    short = swapdsl.Execution("m", "cupy", 2, 0, [1.0] * 2, [900.0, 1100.0], {"warmup_steps": 2})
    assert short.steady_ms() == 1000.0  # no steady step: all of them, as bench/gpu_exec.py marks "(warm-up)"


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
    (lambda: swapdsl.optimize(TINY, memory=-5), "`memory` must be a positive whole number of bytes"),
    (lambda: swapdsl.optimize(TINY, memory=2.5), "`memory` must be a positive whole number of bytes"),
    (lambda: swapdsl.optimize(TINY, memory="2MiB", budget_s=-1), "`budget_s` must be a positive, finite number"),
    (lambda: swapdsl.optimize(TINY, memory="2MiB", workers=True), "`workers` must be an integer from 0 to 1024"),
    (lambda: swapdsl.simulate(swapdsl.load(TINY)), "simulate takes a Plan"),
    (lambda: swapdsl.execute(swapdsl.load(TINY), steps="3"), "`steps` must be an integer at least 1, not '3'"),
    (lambda: swapdsl.execute(swapdsl.load(TINY), steps=-1), "`steps` must be an integer at least 1, not -1"),
    (lambda: swapdsl.execute(TINY, options=swapdsl.Options(shuffle=1)), "`shuffle` must be True or False"),
])
def test_mistakes_raise_the_command_lines_message(call, message: str) -> None:  # noqa: ANN001
    with pytest.raises(swapdsl.SwpError, match=message.replace("(", r"\(")):
        call()


def test_a_search_reports_its_progress_to_a_callback() -> None:
    seen: list = []
    model = swapdsl.load(MODELS / "tiny_resnet.swp", batch=4, width=4, blocks=1)
    plan = swapdsl.optimize(model, memory="6MiB", generations=3, population=8, workers=1, progress=seen.append)
    assert [p.generation for p in seen] == [0, 1, 2, 3]
    assert all(a.seconds <= b.seconds and a.evaluations <= b.evaluations for a, b in zip(seen, seen[1:]))
    assert seen[-1].best_fraction == pytest.approx(dict(plan.figures)["fraction"], rel=0.05)
    assert not any(p.interrupted for p in seen)


def test_optimize_prints_progress_lines_when_stderr_is_not_a_terminal(cli, monkeypatch: pytest.MonkeyPatch) -> None:
    import swapdsl.cli

    monkeypatch.setattr(swapdsl.cli, "PROGRESS_EVERY_S", 0.0)  # a line for every generation
    code, _, err = cli("optimize", MODELS / "tiny_resnet.swp", "-D", "batch=4", "-D", "width=4", "-D", "blocks=1",
                       "--memory", "6MiB", "--generations", "2", "--population", "8", "--workers", "1")
    assert code == 0
    lines = err.splitlines()
    assert len(lines) == 3 and all(line.startswith("ga: ") and " of 60 s, generation " in line for line in lines)
    code, _, err = cli("optimize", MODELS / "tiny_resnet.swp", "-D", "batch=4", "-D", "width=4", "-D", "blocks=1",
                       "--memory", "6MiB", "--generations", "2", "--population", "8", "--workers", "1", "--json")
    assert code == 0 and err == ""


def test_the_api_is_listed_and_documented() -> None:
    assert set(swapdsl.__all__) <= set(dir(swapdsl))
    for name in swapdsl.__all__:
        assert getattr(swapdsl, name).__doc__, name


@pytest.mark.parametrize("text, share", [("1/3", 1 / 3), ("33%", 0.33), (" 1 / 2 ", 0.5), ("100%", 1.0),
                                         ("2.5%", 0.025), ("8GiB", None), ("1e3", None)])
def test_memory_shares_are_read(text: str, share: float | None) -> None:
    from swapdsl.common.units import parse_share
    assert parse_share(text) == (pytest.approx(share) if share is not None else None)


@pytest.mark.parametrize("text", ["0/3", "1/0", "3/2", "0%", "150%"])
def test_memory_shares_outside_one_are_refused(text: str) -> None:
    from swapdsl.common.units import parse_share
    with pytest.raises(swapdsl.SwpError, match="not in"):
        parse_share(text)


def test_check_and_optimize_give_the_same_no_swap_arena_and_shares_divide_it(cli, tmp_path: Path) -> None:
    model = str(MODELS / "tiny_transformer.swp")
    code, out, _ = cli("check", model, "--training", "--json")
    no_swap = json.loads(out)["no_swap_bytes"]
    code, out, err = cli("optimize", model, "--memory", "1/2", "--method", "belady", "--json")
    assert code == 0, err
    figures = json.loads(out)
    assert figures["no_swap_bytes"] == no_swap
    assert figures["memory_bytes"] == no_swap // 2 and figures["ratio"] == pytest.approx(2, rel=1e-6)
    code, out, _ = cli("optimize", model, "--memory", "25%", "--method", "belady", "--microbatches", "4", "--json")
    figures = json.loads(out)
    assert code == 0 and figures["memory_bytes"] == int(0.25 * no_swap)  # a share of one pass's arena
    code, out, _ = cli("check", model, "--training", "--microbatches", "4", "--json")
    checked = json.loads(out)  # both arenas: the share's (one pass) and the ratio's (the micro-batches')
    assert checked["no_swap_bytes"] == no_swap and checked["microbatched_no_swap_bytes"] == figures["no_swap_bytes"]
    assert figures["no_swap_bytes"] < no_swap
    assert "microbatched_no_swap_bytes" not in json.loads(cli("check", model, "--training", "--json")[1])


def test_what_stands_for_a_value_is_taken_as_it() -> None:
    """NumPy integers and booleans, and Path objects, are what many callers hold: taken as the ints, bools
    and strings the options want (the checks refuse only what is wrong)."""
    import numpy as np

    opts = swapdsl.Options(steps=np.int64(2), seed=np.int64(1), data=Path("d"), shuffle=np.bool_(True))
    assert (opts.steps, opts.seed, opts.data, opts.shuffle) == (2, 1, "d", True)
    assert type(opts.steps) is int and type(opts.shuffle) is bool
    search = swapdsl.SearchOptions(seed=np.int64(3), budget_s=np.float32(3))
    assert (search.seed, search.budget_s) == (3, 3.0)
    assert swapdsl.optimize(TINY, memory=np.int64(2**23), method="belady").cap == 2**23
    with pytest.raises(swapdsl.SwpError, match="`steps` must be an integer at least 1, not 2.0"):
        swapdsl.Options(steps=2.0)


def _plan() -> swapdsl.Plan:
    return swapdsl.optimize(TINY, memory="8MiB", method="belady")


@pytest.mark.parametrize("call, message", [  # (each was a TypeError, AttributeError or the like from inside)
    (lambda: swapdsl.load(None), "`path` must name a file"),
    (lambda: swapdsl.load(123), "`path` must name a file"),
    (lambda: swapdsl.load(TINY, overrides="batch=8"), "`overrides` must map model arguments"),
    (lambda: swapdsl.load(TINY, overrides={1: 2}), "`overrides` must map model arguments"),
    (lambda: swapdsl.load(TINY, microbatches=True), "`microbatches` must be an integer at least 1, not True"),
    (lambda: swapdsl.load(TINY, ranks=2, bucket_members=None), "`bucket_members` must be a sequence"),
    (lambda: swapdsl.optimize(None, memory="8MiB"), "`model` must name a file"),
    (lambda: swapdsl.optimize(TINY, memory=1e30), "larger than the limit of 1 PiB"),
    (lambda: swapdsl.optimize(TINY, memory="8MiB", method=["ga"]), "`method` must be one of ga, "),
    (lambda: swapdsl.optimize(TINY, memory="8MiB", device=1), "`device` must be a profile name"),
    (lambda: swapdsl.optimize(TINY, memory="8MiB", search=5), "`search` must be a SearchOptions or None"),
    (lambda: swapdsl.optimize(TINY, memory="8MiB", progress=5), "`progress` must be a function or None"),
    (lambda: swapdsl.optimize(TINY, memory="8MiB", polish="x"), "the polish's share of the budget must be"),
    (lambda: swapdsl.optimize(TINY, memory="8MiB", microbatches=True), "`microbatches` must be an integer"),
    (lambda: swapdsl.save(None, "x.plan"), "`plan` must be a Plan"),
    (lambda: swapdsl.save(_plan(), None), "`path` must name a file"),
    (lambda: swapdsl.save(_plan(), "x.swp"), "plan files take `.plan`"),
    (lambda: swapdsl.execute(None), "the target must be a Plan, a Model or a file naming one"),
    (lambda: swapdsl.execute(TINY, graph="no"), "`graph` must be True or False, not 'no'"),
    (lambda: swapdsl.execute(TINY, options=None), "`options` must be an Options"),
    (lambda: swapdsl.execute(TINY, hooks={}), "`hooks` must be a Hooks"),
    (lambda: swapdsl.execute(TINY, on_step=5), "`on_step` must be a function, given once"),
    (lambda: swapdsl.execute(TINY, on_step=print, hooks=swapdsl.Hooks(on_step=print)), "given once"),
    (lambda: swapdsl.Hooks(on_save=5), "`on_save` must be a function or None"),
    (lambda: swapdsl.predict(TINY, None), "`data` must name a file"),
    (lambda: swapdsl.predict(TINY, "d", seed=-1), "`seed` must be an integer from 0 to"),
    (lambda: swapdsl.predict(TINY, "d", backend="gpu"), "`backend` must be one of auto, numpy, cupy"),
    (lambda: swapdsl.evaluate(TINY, "nope.npz"), "nope.npz"),
    (lambda: swapdsl.import_onnx("m.onnx", "m.swp", batch=8.5), "`batch` must be an integer at least 1"),
    (lambda: swapdsl.import_onnx("m.onnx", "m.swp", dims="x"), "`dims` must map"),
    (lambda: swapdsl.import_onnx("m.onnx", "m.swp", freeze=5), "`freeze` must be a string or None"),
    (lambda: swapdsl.import_onnx(None, "m.swp"), "`path` must name a file"),
    (lambda: swapdsl.import_onnx("m.onnx", "m.swp", optimizer="adam(lr = 1e-3)"), "give `loss` too"),
])
def test_a_wrong_argument_is_an_error_naming_it(call, message: str, in_tmp: Path) -> None:  # noqa: ANN001
    with pytest.raises(swapdsl.SwpError, match=message.replace("(", r"\(").replace(".", r"\.")):
        call()


def test_save_never_writes_over_the_plans_model(tmp_path: Path) -> None:
    """`save(plan, "net.swp")` replaced the plan's own model (the command line refused it)."""
    model = tmp_path / "m.swp"
    model.write_text(TINY.read_text())
    plan = swapdsl.optimize(str(model), memory="8MiB", method="belady")
    before = model.read_bytes()
    with pytest.raises(swapdsl.SwpError, match="is named as a `.swp` file"):
        swapdsl.save(plan, model)
    (tmp_path / "link.plan").symlink_to(model)
    with pytest.raises(swapdsl.SwpError, match="writing it would destroy it"):
        swapdsl.save(plan, tmp_path / "link.plan")
    assert model.read_bytes() == before


def test_numpy_model_arguments_and_a_path_for_a_device_are_taken_as_what_they_stand_for(
        cli, tmp_path: Path) -> None:
    import numpy as np

    assert dict(swapdsl.load(TINY, batch=np.int64(8)).graph.args)["batch"] == 8
    code, out, _ = cli("devices", "--json")
    profile = tmp_path / "gpu.json"
    profile.write_text(json.dumps(json.loads(out)["v100-16gb"]))
    assert swapdsl.optimize(TINY, memory="8MiB", method="belady", device=profile).device.name == "v100-16gb"
