"""Micro-batches (issue 38, item 1): the graph pass, exact against one pass over the whole batch in f64,
plans that swap and recompute executing exactly like the reference, the plan file's `microbatches`
line, `--microbatches K|auto` on the command line, and the refusals."""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import swapdsl
from conftest import MODELS, write
from strategies import EVERY, training_graphs
from swapdsl.common.errors import SwpError
from swapdsl.devices.profiles import BUILTIN, DEFAULT_DEVICE
from swapdsl.graph.checker import check_graph
from swapdsl.graph.ir import DType, Graph, retyped
from swapdsl.graph.microbatch import divisors, microbatched
from swapdsl.plan.file import format_plan
from swapdsl.plan.validate import validate
from swapdsl.planning import optimize as optimize_module
from swapdsl.planning.ga import Search, SearchOptions
from swapdsl.planning.optimize import PATIENCE, climb_microbatches, optimize
from swapdsl.planning.problem import Request
from swapdsl.runtime import reference
from swapdsl.runtime.data import integer_ranges
from test_planners import caps
from test_runtime import run_against_reference

H100 = BUILTIN["h100-80gb"]
MLP = {"batch": 8, "features": 12, "hidden": 8, "classes": 4}
TRANSFORMER = {"batch": 4, "seq": 8, "vocab": 32, "dim": 16, "heads": 2, "depth": 1, "ffn": 32}
DROPOUT_MLP = """\
import layers

model drop(batch = 8, features = 6, classes = 3) {
    input x: f32[batch, features]
    input y: i32[batch]
    h = dropout(relu(dense(x, 16)), 0.3)
    logits = dense(h, classes) as head
    minimize softmax_cross_entropy(logits, y) with adam(lr = 0.01)
    report accuracy = mean(cast(argmax(logits) == y, f32))
}
"""


def _train_f64(path: Path | str, k: int, steps: int = 5, precision: str = "f32", **args: int):
    t = swapdsl.load(path, precision=precision, microbatches=k, **args).training
    if precision == "f32":
        t = retyped(t, DType.f32, DType.f64)
    return reference.train(t, steps, 3, np)


def _rel(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> float:
    """Largest difference over all persistent tensors, relative to the largest magnitude among them."""
    scale = max(float(np.max(np.abs(v.astype(np.float64)))) for v in b.values())
    return max(float(np.max(np.abs(a[n].astype(np.float64) - v.astype(np.float64)))) for n, v in b.items()) / scale


@pytest.mark.parametrize("k", [2, 4])
@pytest.mark.parametrize("model", ["mlp", "tiny_transformer", "dropout", "clipped", "weight_dropout"])
def test_micro_batches_train_like_one_pass_over_the_batch(model: str, k: int, tmp_path: Path) -> None:
    """(weight_dropout: a dropout over a parameter draws one mask for the whole batch; its gradient's, per
    micro-batch, drew other masks than the forward's before)."""
    clipped = DROPOUT_MLP.replace("adam(lr = 0.01)", "adamw(lr = 0.01, clip = 0.3, warmup = 2, cosine = 6)")
    weights = DROPOUT_MLP.replace("    h = dropout(relu(dense(x, 16)), 0.3)\n",
                                  "    param w: f32[features, 16] = normal(0.5)\n    h = relu(x @ dropout(w, 0.3))\n")
    path, args = {"mlp": (MODELS / "mlp.swp", MLP), "tiny_transformer": (MODELS / "tiny_transformer.swp", TRANSFORMER),
                  "dropout": (write(tmp_path / "drop.swp", DROPOUT_MLP), {}),
                  "clipped": (write(tmp_path / "clip.swp", clipped), {}),
                  "weight_dropout": (write(tmp_path / "wdrop.swp", weights), {})}[model]
    whole, split = _train_f64(path, 1, **args), _train_f64(path, k, **args)
    assert max(abs(a - b) / abs(b) for a, b in zip(split.losses, whole.losses)) < 1e-12
    # (1e-10: Adam divides by the root of the gradient's square, so the round-off of a gradient that is
    # zero in exact arithmetic, such as an attention key's bias, moves a weight by lr-sized steps)
    assert _rel(split.persistent, whole.persistent) < (1e-12 if model == "mlp" else 1e-10)
    assert split.losses[-1] < split.losses[0]


def test_the_step_graph_runs_each_micro_batch_then_one_update() -> None:
    one = swapdsl.load(MODELS / "mlp.swp", **MLP).training
    t = swapdsl.load(MODELS / "mlp.swp", microbatches=4, **MLP).training
    check_graph(t)
    assert t.microbatches == 4 and one.microbatches == 1
    assert [t.type_of(n) for n in t.inputs] == [one.type_of(n) for n in one.inputs]
    count = {op: sum(o.op == op for o in t.ops) for op in ("sgd_apply", "momentum", "report", "slice")}
    assert count == {"sgd_apply": len(one.params), "momentum": len(one.params), "report": 1, "slice": 2 * 4}
    assert t.ops[-1].op == "report"
    seed = next(op for op in t.ops if op.outputs == (t.seed,))
    assert seed.op == "mul_scalar" and seed.attr("value") == 0.25
    assert [p for p, _ in t.grads] == [p for p, _ in one.grads]
    for _, g in t.grads:  # each parameter's gradient is the sum over the micro-batches
        assert next(op for op in t.ops if g in op.outputs).op == "add"


def test_half_copies_of_parameters_are_made_once_and_shared() -> None:
    t = swapdsl.load(MODELS / "tiny_transformer.swp", precision="bf16", microbatches=2, **TRANSFORMER).training
    casts = [op for op in t.ops if op.op == "cast" and op.inputs[0] in t.params]
    assert casts and len({op.inputs[0] for op in casts}) == len(casts)


def test_f16_with_the_loss_scaler_trains_in_micro_batches() -> None:
    whole = _train_f64(MODELS / "tiny_transformer.swp", 1, 8, "f16", **TRANSFORMER)
    split = _train_f64(MODELS / "tiny_transformer.swp", 2, 8, "f16", **TRANSFORMER)
    assert all(np.isfinite(split.losses)) and split.losses[-1] < split.losses[0]
    assert max(abs(a - b) / abs(b) for a, b in zip(split.losses, whole.losses)) < 1e-2


def test_batch_norm_takes_each_micro_batch_s_statistics() -> None:
    args = {"batch": 4, "image": 8, "width": 4, "blocks": 1}
    whole, split = _train_f64(MODELS / "tiny_resnet.swp", 1, 1, **args), _train_f64(MODELS / "tiny_resnet.swp", 2, 1, **args)
    assert abs(split.losses[0] - whole.losses[0]) / whole.losses[0] > 1e-6  # documented: not the whole batch's


def test_labels_keep_their_range_through_the_slices() -> None:
    t = swapdsl.load(MODELS / "tiny_transformer.swp", microbatches=2, **TRANSFORMER).training
    assert integer_ranges(t) == {"tokens": 32, "targets": 32}


@pytest.mark.parametrize("method", ["ga", "belady", "capuchin", "lru"])
def test_plans_of_micro_batches_execute_exactly_like_the_reference(method: str) -> None:
    for precision, model, args in (("f32", "mlp", MLP), ("bf16", "tiny_transformer", TRANSFORMER)):
        t = swapdsl.load(MODELS / f"{model}.swp", precision=precision, microbatches=2, **args).training
        cap = caps(t)[0]
        plan = optimize(Request(t, H100, cap, "m.swp", ()), method, swapdsl.SearchOptions(budget_s=1, workers=1))
        assert plan.microbatches == 2
        assert run_against_reference(plan, t, 3) == 0.0


@settings(max_examples=12, deadline=None)
@given(training_graphs(max_depth=4, **EVERY), st.sampled_from([2, 3]))
def test_random_graphs_split_into_micro_batches_plan_and_execute_exactly(g: Graph, k: int) -> None:
    t = microbatched(g, k)
    check_graph(t)
    assert all(t.type_of(n).shape[0] == k * g.type_of(n).shape[0] for n in g.inputs)
    plan = optimize(Request(t, H100, caps(t)[0], "m.swp", ()), "capuchin")
    assert run_against_reference(plan, t, 2) == 0.0


def test_a_plan_records_its_micro_batches(cli, in_tmp: Path) -> None:
    model = write(in_tmp / "mlp.swp", (MODELS / "mlp.swp").read_text())
    code, out, err = cli("optimize", model, "--memory", "64MiB", "--microbatches", "4", "-o", "m.plan",
                         "-D", "batch=16", "--method", "belady")
    assert code == 0, err
    text = (in_tmp / "m.plan").read_text()
    assert "\nmicrobatches 4\n" in text
    assert swapdsl.read("m.plan").microbatches == 4
    code, out, err = cli("exec", "m.plan", "--steps", "2", "--check")
    assert code == 0, err
    assert "max rel diff against the reference 0.00e+00" in out
    code, _, err = cli("exec", "m.plan", "--steps", "1", "--microbatches", "2")
    assert code == 2 and "the plan was made for 4" in err


@pytest.mark.parametrize("line, message", [
    ("microbatches 1", "a plan runs 2 to"), ("microbatches 0", "a plan runs 2 to"),
    ("microbatches 99999", "a plan runs 2 to"), ("microbatches 2", "differs from the model's training graph"),
    ("microbatches x", "")])
def test_a_bad_microbatches_line_is_refused(cli, in_tmp: Path, line: str, message: str) -> None:
    model = write(in_tmp / "mlp.swp", (MODELS / "mlp.swp").read_text())
    assert cli("optimize", model, "--memory", "64MiB", "--microbatches", "4", "-o", "m.plan", "-D", "batch=16",
               "--method", "belady")[0] == 0
    plan = in_tmp / "m.plan"
    plan.write_text(plan.read_text().replace("microbatches 4", line))
    code, out, err = cli("exec", "m.plan", "--steps", "1")
    assert code == 2 and "Traceback" not in err and message in err


@pytest.mark.parametrize("flag, message", [
    ("3", "does not split into 3 equal micro-batches"), ("0", "expected a whole number from 1 to"),
    ("-2", "expected a whole number"), ("two", "expected a whole number"), ("1e9", "expected a whole number")])
def test_a_bad_microbatches_flag_is_refused(cli, in_tmp: Path, flag: str, message: str) -> None:
    model = write(in_tmp / "mlp.swp", (MODELS / "mlp.swp").read_text())
    code, _, err = cli("optimize", model, "--memory", "64MiB", f"--microbatches={flag}", "-D", "batch=16",
                       "-o", "m.plan")
    assert code == 2 and message in err and "Traceback" not in err
    assert not (in_tmp / "m.plan").exists()


def test_a_model_without_a_batch_argument_is_refused(tmp_path: Path) -> None:
    text = (MODELS / "mlp.swp").read_text().replace("model mlp(batch = 64,", "model mlp(rows = 64,")
    path = write(tmp_path / "rows.swp", text.replace("[batch", "[rows"))
    with pytest.raises(SwpError, match="has none"):
        swapdsl.load(path, microbatches=2)


def test_auto_chooses_a_count_under_a_cap_one_pass_cannot_meet(tmp_path: Path) -> None:
    m = swapdsl.load(MODELS / "tiny_transformer.swp", **{**TRANSFORMER, "batch": 8})
    cap = int(0.7 * caps(m.training)[0])
    with pytest.raises(SwpError, match="below the smallest feasible cap"):
        swapdsl.optimize(m, cap, "belady", "h100-80gb")
    plan = swapdsl.optimize(m, cap, "belady", "h100-80gb", microbatches="auto")
    assert plan.microbatches > 1
    assert "microbatches" in format_plan(plan)


def test_below_the_floor_the_error_names_the_op_and_the_micro_batches_that_fit(cli, in_tmp: Path) -> None:
    model = write(in_tmp / "t.swp", (MODELS / "tiny_transformer.swp").read_text())
    code, _, err = cli("optimize", model, "--memory", "2MiB", "--method", "belady")
    assert code == 2 and "Traceback" not in err
    assert "what sets it: op" in err and "`gelu_grad`" in err and "layers.swp:" in err
    assert "--microbatches 2 (or auto) fits it" in err
    code, _, err = cli("optimize", model, "--memory", "200KiB", "--method", "belady")
    assert code == 2 and "micro-batches do not bring it under the cap" in err


def test_the_micro_batch_hint_counts_the_updates_the_host_takes() -> None:
    """At 700 KB the small transformer fits no count with its updates on the device, but 8 micro-batches with
    them on the host (660,736 bytes at the least): the hint says so, and the plan it names exists."""
    m = swapdsl.load(MODELS / "tiny_transformer.swp")
    for host, said in (("none", "micro-batches do not bring it under the cap"),
                       ("all", "--microbatches 8 (or auto) fits it: its smallest feasible cap is 645.25 KiB")):
        with pytest.raises(SwpError) as refused:
            swapdsl.optimize(m, 700_000, "belady", host_updates=host)
        assert said in refused.value.render(), host
    plan = swapdsl.optimize(m, 700_000, "belady", host_updates="all", microbatches=8)
    assert plan.microbatches == 8 and plan.cap == 700_000


BN_MODEL = """\
import layers

model bnx(batch = 6, c = 3) {
    input x: f32[batch, c, 4, 4]
    input y: i32[batch]
    h = batchnorm(x) as bn
    loss = softmax_cross_entropy(dense(global_avg_pool(relu(h)), 5), y)
    minimize loss with sgd(lr = 0.1)
}
"""


def test_running_statistics_take_one_update_per_micro_batch(tmp_path: Path) -> None:
    """Three micro-batches update a running statistic as three forward passes of torch.nn.BatchNorm2d
    would, one after another (in f64, to round-off): folded into one update in place over it."""
    path = write(tmp_path / "bnx.swp", BN_MODEL)
    t = retyped(swapdsl.load(path, microbatches=3).training, DType.f32, DType.f64)
    trainer = reference.Trainer(t, 3, np)
    x = np.asarray(trainer.inputs["x"])
    trainer.step(1)
    mean, var = np.zeros(3), np.ones(3)
    for part in np.split(x, 3):
        mean = 0.9 * mean + 0.1 * part.mean(axis=(0, 2, 3))
        var = 0.9 * var + 0.1 * part.var(axis=(0, 2, 3), ddof=1)
    np.testing.assert_allclose(trainer.persistent["bn.running_mean"], mean, rtol=1e-12)
    np.testing.assert_allclose(trainer.persistent["bn.running_var"], var, rtol=1e-12)
    merge = next(op for op in t.ops if op.outputs[0] == dict(t.updates)["bn.running_mean"])
    assert merge.op == "running_merge" and merge.inputs[0] == "bn.running_mean"


def test_the_loss_scale_and_sgd_steps_are_those_of_one_pass(tmp_path: Path) -> None:
    """f16 with dynamic loss scaling and plain SGD (whose step, unlike Adam's, shows a gradient k times too
    large): the loss scale and the parameters after 4 steps are one pass's, to f16 round-off."""
    text = (MODELS / "mlp.swp").read_text().replace("sgd(lr = lr, momentum = 0.9)", "sgd(lr = lr)")
    path = write(tmp_path / "sgd.swp", text)
    runs = {}
    for k in (1, 2):
        trainer = reference.Trainer(swapdsl.load(path, precision="f16", microbatches=k, **MLP).training, 3, np)
        for step in range(1, 5):
            trainer.step(step)
        runs[k] = trainer
    assert runs[2].metrics()["loss_scale"] == runs[1].metrics()["loss_scale"] == 65536.0
    params = {p: np.asarray(runs[1].persistent[p]) for p in runs[1].g.params}
    assert _rel({p: np.asarray(runs[2].persistent[p]) for p in params}, params) < 2e-3


@pytest.mark.parametrize("edit, message", [
    ("    report correct = sum(cast(argmax(logits) == y, i32))\n", "not a float scalar"),
    ("    input m: f32[features]\n    logits = logits + mean(m)\n", "is not the batch's|first axis"),
])
def test_what_micro_batches_cannot_split_is_refused(tmp_path: Path, edit: str, message: str) -> None:
    text = (MODELS / "mlp.swp").read_text().replace("    loss = softmax_cross_entropy", edit + "    loss = softmax_cross_entropy")
    with pytest.raises(SwpError, match=message):
        swapdsl.load(write(tmp_path / "m.swp", text), microbatches=2, **MLP).training


def _climb_setup(batch: int = 8, share: float = 0.3) -> Callable[[int], Request]:
    """Requests for tiny_transformer at ``batch`` in k micro-batches, at ``share`` of one pass's no-swap arena."""
    m = swapdsl.load(MODELS / "tiny_transformer.swp", **{**TRANSFORMER, "batch": batch})
    cap = int(share * caps(m.training)[1])

    def request_at(k: int) -> Request:
        mk = m if k == 1 else swapdsl.load(MODELS / "tiny_transformer.swp", microbatches=k,
                                           **{**TRANSFORMER, "batch": batch})
        return Request(mk.training, H100, cap, str(m.path), m.graph.args)

    return request_at


GA_GENERATIONS = SearchOptions(budget_s=1e6, generations=30, population=8, workers=1)


def test_ga_auto_keeps_the_count_whose_search_did_best_and_is_fixed_by_the_seed(monkeypatch) -> None:
    """With a generation limit, ``climb_microbatches`` is a function of the seed. It climbs while no more than
    ``PATIENCE`` counts in a row fail to beat the best probe so far, and keeps the count whose probe did
    best, its plan no slower than that."""
    probed: dict[int, float] = {}

    class Recorded(Search):
        def run(self, until: float, generations: int) -> None:
            super().run(until, generations)
            probed.setdefault(self.req.graph.microbatches, self.best)  # (its first run is its probe)

    monkeypatch.setattr(optimize_module, "Search", Recorded)
    plan = climb_microbatches(_climb_setup(), [1, 2, 4, 8], GA_GENERATIONS)
    tried = list(probed.values())
    assert len(tried) >= 2, probed
    best, misses = math.inf, 0
    for value in tried:
        assert misses <= PATIENCE, probed  # (a count more is probed only while the misses are within patience)
        misses = 0 if value < best else misses + 1
        best = min(best, value)
    assert plan.microbatches == min(probed, key=lambda k: probed[k])
    assert dict(plan.figures)["iteration_ms"] <= min(tried) + 1e-9
    assert format_plan(plan) == format_plan(climb_microbatches(_climb_setup(), [1, 2, 4, 8], GA_GENERATIONS))
    validate(plan)


def test_ga_auto_chooses_a_count_under_a_cap_one_pass_cannot_meet() -> None:
    request_at = _climb_setup(batch=16, share=0.3)
    with pytest.raises(SwpError, match="below the smallest feasible cap"):
        optimize(request_at(1), "ga", GA_GENERATIONS)
    plan = climb_microbatches(request_at, [1, 2, 4, 8], GA_GENERATIONS)
    assert plan.microbatches > 1
    validate(plan)


class _Scripted:
    """Stands in for ``ga.Search`` in ``climb_microbatches``: each count's probe scores as scripted."""

    best_of: dict[int, float] = {}
    interrupted_at: set[int] = set()
    log: list[tuple[str, int]] = []

    def __init__(self, req: object, opts: SearchOptions, started: float | None = None) -> None:
        self.k = req.graph.microbatches  # type: ignore[attr-defined]
        self.best, self.interrupted = self.best_of[self.k], False
        self.breeding_ends = math.inf
        self.log.append(("probe", self.k))

    def closing(self) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()

    def run(self, until: float, generations: int) -> None:
        self.interrupted |= self.k in self.interrupted_at
        if not self.interrupted:
            self.log.append(("run", self.k))

    def interrupt(self) -> None:
        self.interrupted = True

    def close(self) -> None:
        self.log.append(("close", self.k))

    def finish(self) -> SimpleNamespace:
        self.log.append(("finish", self.k))
        return SimpleNamespace(plan=self.k)


def _fake_request(k: int) -> SimpleNamespace:
    if k == 64:
        raise RuntimeError("a count that cannot be built")
    return SimpleNamespace(graph=SimpleNamespace(ops=(), microbatches=k), tensor_cap=1)


@pytest.mark.parametrize("best, interrupted, silent, chosen, probed", [
    ({1: 10, 2: 11, 4: 9, 8: 12, 16: 13, 32: 1}, set(), None, 4, [1, 2, 4, 8, 16]),  # two misses in a row end it
    ({1: 10, 2: 11, 4: 12, 8: 1}, set(), None, 1, [1, 2, 4]),
    ({1: 10, 2: 9, 4: 8, 8: 7}, set(), 4, 4, [1, 2, 4]),  # past a count whose belady plan swaps nothing
    ({1: 10, 2: 11, 4: 1}, {2}, None, 1, [1, 2]),  # a Ctrl-C in a probe that lost: the leader stops too
    ({1: 10, 2: 9, 4: 1}, {2}, None, 2, [1, 2])])
def test_the_climb_probes_counts_until_two_in_a_row_do_no_better(monkeypatch, best, interrupted, silent, chosen,
                                                                  probed) -> None:
    monkeypatch.setattr(_Scripted, "best_of", best)
    monkeypatch.setattr(_Scripted, "interrupted_at", interrupted)
    monkeypatch.setattr(_Scripted, "log", [])
    swaps = lambda req, method: SimpleNamespace(figures=(("h2d_bytes", float(req.graph.microbatches != silent)),
                                                         ("d2h_bytes", 0.0)))  # noqa: E731
    monkeypatch.setattr(optimize_module, "Search", _Scripted)
    monkeypatch.setattr(optimize_module, "optimize", swaps)
    monkeypatch.setattr(optimize_module, "ideal_ms", lambda p: 0.0)
    monkeypatch.setattr(optimize_module.Problem, "of", staticmethod(lambda req: req))
    assert climb_microbatches(_fake_request, [1, 2, 4, 8, 16, 32], GA_GENERATIONS) == chosen
    log = _Scripted.log
    assert [k for what, k in log if what == "probe"] == probed
    assert sorted(k for what, k in log if what == "close") == sorted(set(probed) - {chosen})  # every loser's workers
    assert log[-1] == ("finish", chosen) and (("run", chosen) in log[-2:]) == (not interrupted)


def test_the_climb_stops_the_leaders_workers_when_a_count_fails(monkeypatch) -> None:
    monkeypatch.setattr(_Scripted, "best_of", {1: 10, 2: 9})
    monkeypatch.setattr(_Scripted, "log", [])
    monkeypatch.setattr(optimize_module, "Search", _Scripted)
    monkeypatch.setattr(optimize_module, "optimize", lambda req, method: SimpleNamespace(
        figures=(("h2d_bytes", 1.0), ("d2h_bytes", 1.0))))
    monkeypatch.setattr(optimize_module, "ideal_ms", lambda p: 0.0)
    monkeypatch.setattr(optimize_module.Problem, "of", staticmethod(lambda req: req))
    with pytest.raises(RuntimeError, match="cannot be built"):
        climb_microbatches(_fake_request, [1, 2, 64], GA_GENERATIONS)
    assert _Scripted.log[-1] == ("close", 2)


def test_optimize_gives_a_micro_batched_plan_s_speed_against_one_pass(cli, in_tmp: Path) -> None:
    """A micro-batched step's own ideal is slower than one pass's; the fraction a user reads is of one pass."""
    model = write(in_tmp / "mlp.swp", (MODELS / "mlp.swp").read_text())
    code, out, _ = cli("optimize", model, "--memory", "64MiB", "--microbatches", "4", "-D", "batch=16",
                       "--method", "belady", "--json")
    f = json.loads(out)
    whole = swapdsl.load(model, batch=16)
    one = swapdsl.api.one_pass_ideal_ms(whole, BUILTIN[DEFAULT_DEVICE])
    assert code == 0 and f["one_pass_ideal_ms"] == pytest.approx(one) and one < f["ideal_ms"]
    assert f["one_pass_fraction"] == pytest.approx(one / f["iteration_ms"])
    assert f["one_pass_fraction"] < f["fraction"]
    code, out, _ = cli("optimize", model, "--memory", "64MiB", "--microbatches", "4", "-D", "batch=16",
                       "--method", "belady", "-o", "k4.plan")
    assert code == 0 and f"{f['one_pass_fraction']:.3f} of the infinite-memory speed (one pass: " in out
    # the plan file keeps the one-pass ideal: `simulate` gives the same fraction, without the model
    (in_tmp / "mlp.swp").unlink()
    code, out, _ = cli("simulate", "k4.plan", "--json")
    again = json.loads(out)
    assert code == 0 and again["one_pass_fraction"] == pytest.approx(f["one_pass_fraction"])
    code, out, _ = cli("simulate", "k4.plan")
    assert code == 0 and f"{f['one_pass_fraction']:.3f} of the infinite-memory speed (one pass: " in out
    code, out, _ = cli("show", "k4.plan")
    assert code == 0 and f"over the whole batch: this step runs at {f['one_pass_fraction']:.3f} of it (4 " in out
    write(in_tmp / "mlp.swp", (MODELS / "mlp.swp").read_text())
    code, out, _ = cli("optimize", model, "--memory", "64MiB", "-D", "batch=16", "--method", "belady", "--json",
                       "-o", "k1.plan")
    assert code == 0 and "one_pass_fraction" not in json.loads(out)
    code, out, _ = cli("simulate", "k1.plan", "--json")
    assert code == 0 and "one_pass_fraction" not in json.loads(out)


@given(st.integers(1, 5000))
def test_divisors_are_every_divisor_ascending(n: int) -> None:
    assert divisors(n) == [d for d in range(1, n + 1) if n % d == 0]


def test_a_huge_batchs_divisors_come_without_counting_to_it() -> None:
    """The error for a batch of two billion rows took 95 s listing the batch's divisors one by one."""
    assert divisors(2**31 - 1) == [1, 2**31 - 1] and divisors(2**40)[-2:] == [2**39, 2**40]
    assert divisors(0) == divisors(-4) == []
