"""Inference (issue 38, item 7): `output` statements, the prediction graph, `swapdsl predict` on a plan
(under its cap) and on a model (the reference executor), and its refusals."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import swapdsl
from conftest import MODELS, write
from swapdsl.common.errors import SwpError
from swapdsl.graph.autodiff import prediction_graph
from swapdsl.graph.checker import check_graph
from swapdsl.planning.sizing import BelowSmallestCap

MLP = (MODELS / "mlp.swp").read_text().replace(
    "    report accuracy = mean(cast(argmax(logits) == y, f32))\n",
    "    report accuracy = mean(cast(argmax(logits) == y, f32))\n    output logits = logits\n"
    "    output label = argmax(logits)\n")
ARGS = ["-D", "batch=8", "-D", "features=16", "-D", "hidden=32", "-D", "lr=0.05"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("predict")
    write(d / "m.swp", MLP)
    rng = np.random.default_rng(0)
    for name, n in (("train", 96), ("test", 29)):
        x = rng.standard_normal((n, 16)).astype(np.float32)
        (d / name).mkdir()
        np.save(d / name / "x.npy", x)
        np.save(d / name / "y.npy", np.argmax(x[:, :10], axis=1).astype(np.int32))
    return d


def test_predict_evaluates_only_where_the_data_has_the_targets(cli, folder: Path, tmp_path: Path) -> None:
    """Without `y` there is nothing to score: the outputs alone; with a `y` that is out of range, the command
    fails as `exec --eval` would, and writes no prediction."""
    (tmp_path / "x_only").mkdir()
    np.save(tmp_path / "x_only" / "x.npy", np.load(folder / "test" / "x.npy"))
    code, out, err = cli("predict", folder / "m.swp", *ARGS, "--data", tmp_path / "x_only", "-o", tmp_path / "a.npz")
    assert code == 0 and "held out" not in out and (tmp_path / "a.npz").exists(), err
    (tmp_path / "bad_y").mkdir()
    np.save(tmp_path / "bad_y" / "x.npy", np.load(folder / "test" / "x.npy"))
    np.save(tmp_path / "bad_y" / "y.npy", np.full(29, 10, np.int32))
    code, out, err = cli("predict", folder / "m.swp", *ARGS, "--data", tmp_path / "bad_y", "-o", tmp_path / "b.npz")
    assert code == 2 and "y" in err and "Traceback" not in err and not (tmp_path / "b.npz").exists(), err


def test_a_plans_partial_batch_runs_in_the_same_arena(cli, folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """29 examples in batches of 8: the last 5 by a runner at their size, in the first runner's arena (a GPU
    whose free memory holds one arena of the cap holds the prediction), with the same outputs as the model's."""
    from swapdsl import api

    plan = folder / "m.plan"
    if not plan.exists():
        assert cli("optimize", folder / "m.swp", *ARGS, "--memory", "2/3", "--method", "belady", "-o", plan)[0] == 0
    arenas: list[object] = []

    class Recorded(api.PlanRunner):
        def __init__(self, *args: object, **kw: object) -> None:
            super().__init__(*args, **kw)
            arenas.append(self.arena)

    monkeypatch.setattr(api, "PlanRunner", Recorded)
    got = api.predict(plan, str(folder / "test"))
    held = api.evaluate(plan, str(folder / "test"))
    assert got["logits"].shape == (29, 10) and held is not None and held.examples == 29 and held.dropped == 0
    assert len(arenas) == 4 and all(a is arenas[0] for a in arenas[:2]) and arenas[2] is arenas[3]
    model = api.load(folder / "m.swp", batch=8, features=16, hidden=32, lr=0.05)  # (as ARGS give it)
    want = api.predict(model, str(folder / "test"))  # (the reference executor)
    np.testing.assert_array_equal(got["logits"], want["logits"])


def test_fewer_examples_than_a_batch_are_one_partial_batch(cli, folder: Path, tmp_path: Path) -> None:
    """One image predicts (and, with its label, evaluates) as the first row of the whole set does; none is an
    error."""
    plan = folder / "m.plan"
    if not plan.exists():
        assert cli("optimize", folder / "m.swp", *ARGS, "--memory", "2/3", "--method", "belady", "-o", plan)[0] == 0
    one, none = tmp_path / "one", tmp_path / "none"
    for d, rows in ((one, 1), (none, 0)):
        d.mkdir()
        for name in ("x", "y"):
            np.save(d / f"{name}.npy", np.load(folder / "test" / f"{name}.npy")[:rows])
    code, out, err = cli("predict", plan, "--data", one, "-o", tmp_path / "one.npz")
    assert code == 0 and "1 examples" in out and "held out: loss" in out, err
    code, _, err = cli("predict", plan, "--data", folder / "test", "-o", tmp_path / "all.npz")
    np.testing.assert_allclose(np.load(tmp_path / "one.npz")["logits"], np.load(tmp_path / "all.npz")["logits"][:1],
                               rtol=1e-5)  # (one row's product rounds as BLAS's matrix-vector kernel does)
    code, out, err = cli("exec", plan, "--data", folder / "train", "--steps", "1", "--eval", one, "--json")
    assert code == 0 and json.loads(out)["eval"][-1]["examples"] == 1, err
    code, out, err = cli("predict", plan, "--data", none, "-o", tmp_path / "none.npz")
    assert code == 2 and err.startswith(f"error: --data `{none}` holds no examples"), err


def test_one_pass_predicts_and_scores_as_two_do(folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`predict` with the targets there runs one graph of the outputs, the loss and the reports
    (``evaluation_graph(..., outputs=True)``): the same outputs and figures as the two passes it replaced,
    which it falls back to where a plan's cap does not hold the graph of both."""
    from swapdsl import api

    plan = folder / "m.plan"
    if not plan.exists():
        model = api.load(folder / "m.swp", batch=8, features=16, hidden=32, lr=0.05)
        api.save(api.optimize(model, memory="2/3", method="belady"), plan)
    data = str(folder / "test")
    for target in (str(plan), api.load(folder / "m.swp", batch=8, features=16, hidden=32, lr=0.05)):
        outputs, held = api.predict_scored(target, data)
        alone, scored = api.predict(target, data), api.evaluate(target, data)
        assert held is not None and scored is not None
        assert outputs.keys() == alone.keys() and all(np.array_equal(outputs[k], alone[k]) for k in alone)
        assert (held.loss, held.metrics, held.examples, held.dropped) == (scored.loss, scored.metrics, 29, 0)
    graphs: list[bool] = []
    both, inference = api.evaluation_graph, api._inference

    def refused(g: object, outputs: bool = False) -> object:
        graphs.append(outputs)
        if outputs:
            raise BelowSmallestCap("the graph of both does not plan under the cap")
        return both(g)

    monkeypatch.setattr(api, "evaluation_graph", refused)
    outputs, held = api.predict_scored(str(plan), data)
    assert True in graphs and held is not None and held.loss == scored.loss
    assert np.array_equal(outputs["logits"], alone["logits"])
    bad = folder / "bad_labels"  # (an error of the data is no reason to try two passes: it is raised)
    bad.mkdir(exist_ok=True)
    np.save(bad / "x.npy", np.load(folder / "test" / "x.npy"))
    np.save(bad / "y.npy", np.full(29, 10, np.int32))
    monkeypatch.setattr(api, "evaluation_graph", both)
    passes: list[object] = []
    monkeypatch.setattr(api, "_inference", lambda *a, **kw: passes.append(a) or inference(*a, **kw))
    with pytest.raises(SwpError, match="outside"):
        api.predict_scored(str(plan), str(bad))
    assert len(passes) == 1


def test_held_out_data_no_evaluation_could_take_is_refused_before_training(
        cli, folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Fewer held-out examples than a batch, in a partial batch that does not plan under the cap (stood
    for by a model that refuses every other batch): refused at the start, not after the training."""
    from swapdsl import api

    plan = folder / "m.plan"
    if not plan.exists():
        assert cli("optimize", folder / "m.swp", *ARGS, "--memory", "2/3", "--method", "belady", "-o", plan)[0] == 0
    few = tmp_path / "few"
    few.mkdir()
    for name in ("x", "y"):
        np.save(few / f"{name}.npy", np.load(folder / "test" / f"{name}.npy")[:3])
    monkeypatch.setattr(api, "_at_batch", lambda m, rows: None)
    code, out, err = cli("exec", plan, "--data", folder / "train", "--steps", "50", "--eval", few)
    assert code == 2 and "step 1/" not in out, out
    assert err.startswith(f"error: none of the 3 examples of `{few}` could be evaluated: a partial batch of 3 "
                          "does not plan under the cap"), err


def test_the_prediction_graph_reads_no_labels(tmp_path: Path) -> None:
    m = swapdsl.load(write(tmp_path / "m.swp", MLP), batch=4, features=8, hidden=8)
    g = prediction_graph(m.graph)
    check_graph(g)
    assert g.inputs == ("x",) and g.state == ("output/logits", "output/label") and not g.grads


def test_predict_on_a_plan_and_on_its_model_agree_with_evaluation(cli, folder: Path) -> None:
    m = folder / "m.swp"
    assert cli("optimize", m, *ARGS, "--memory", "2/3", "--method", "belady", "-o", folder / "m.plan")[0] == 0
    code, run, err = cli("exec", folder / "m.plan", "--data", folder / "train", "--epochs", "4", "--eval",
                         folder / "test", "--save", folder / "m.st", "--json")
    assert code == 0, err
    import json
    accuracy = json.loads(run)["eval"][-1]["metrics"]["accuracy"]
    for target, extra in ((folder / "m.plan", []), (m, ARGS)):
        code, out, err = cli("predict", target, *extra, "--data", folder / "test", "--init", folder / "m.st",
                             "-o", folder / f"{target.suffix[1:]}.npz")
        assert code == 0, err
        assert "29 examples" in out
        assert f"held out: loss {json.loads(run)['eval'][-1]['loss']:.6f}, accuracy {accuracy:.4f} (29 examples" in out
    a, b = np.load(folder / "plan.npz"), np.load(folder / "swp.npz")
    assert a["logits"].shape == (29, 10) and a["label"].dtype == np.int32
    np.testing.assert_array_equal(a["logits"], b["logits"])
    y = np.load(folder / "test" / "y.npy")
    assert float(np.mean(a["label"] == y)) == pytest.approx(accuracy, abs=1e-6)
    np.testing.assert_array_equal(a["label"], np.argmax(a["logits"], axis=1))


@pytest.mark.parametrize("case, message", [
    ("no-output", "has no `output`"), ("missing-init", "no such checkpoint file"),
    ("other-init", "--init"), ("no-data", "--data"), ("bad-out", "prediction"), ("labels-only", "has no array"),
])
def test_bad_requests_are_refused(cli, folder: Path, case: str, message: str) -> None:
    plain = write(folder / "plain.swp", (MODELS / "mlp.swp").read_text())
    other = folder / "other.st"
    if case == "other-init" and not other.exists():
        assert cli("exec", plain, "-D", "batch=8", "--steps", "1", "--save", other)[0] == 0
    only_y = folder / "only_y"
    only_y.mkdir(exist_ok=True)
    np.save(only_y / "y.npy", np.zeros(8, np.int32))
    argv = {"no-output": [plain, *ARGS, "--data", folder / "test"],
            "missing-init": [folder / "m.swp", *ARGS, "--data", folder / "test", "--init", folder / "none.st"],
            "other-init": [folder / "m.swp", *ARGS, "--data", folder / "test", "--init", other],
            "no-data": [folder / "m.swp", *ARGS, "--data", folder / "nothing"],
            "bad-out": [folder / "m.swp", *ARGS, "--data", folder / "test"],
            "labels-only": [folder / "m.swp", *ARGS, "--data", only_y]}[case]
    out = folder / "folder-out" if case == "bad-out" else folder / f"{case}.npz"
    if case == "bad-out":
        out.mkdir(exist_ok=True)
    code, _, err = cli("predict", *argv, "-o", out)
    assert code == 2 and message in err and "Traceback" not in err
    assert case == "bad-out" or not out.exists()


@pytest.mark.parametrize("line, message", [("output loss2 = loss", "row per example"),
                                           ("output accuracy = logits", "already"),
                                           ("output w = mean(logits, axes = 0)", "first axis is")])
def test_bad_outputs_are_refused(tmp_path: Path, line: str, message: str) -> None:
    text = MLP.replace("    output label = argmax(logits)\n", f"    {line}\n")
    with pytest.raises(SwpError, match=message):
        swapdsl.load(write(tmp_path / "m.swp", text), batch=4)


def test_bf16_outputs_are_written_as_f32_that_numpy_reads(cli, folder: Path, tmp_path: Path) -> None:
    """A bf16 output was stored as bf16 records: NumPy without ml_dtypes read `|V2` bytes. Now f32, exactly
    the values the library returns, and the summary line says so."""
    write(tmp_path / "h.swp", MLP.replace("    output logits = logits\n", "    output logits = cast(logits, bf16)\n"))
    code, out, err = cli("predict", tmp_path / "h.swp", *ARGS, "--data", folder / "test", "-o", tmp_path / "h.npz")
    assert code == 0 and "logits [29, 10] float32 (bf16, widened)" in out, err
    with np.load(tmp_path / "h.npz") as got:
        logits = got["logits"]
    model = swapdsl.api.load(tmp_path / "h.swp", {"batch": 8, "features": 16, "hidden": 32, "lr": 0.05})
    ours = swapdsl.predict(model, str(folder / "test"))
    assert logits.dtype == np.float32 and ours["logits"].dtype.name == "bfloat16"
    assert np.array_equal(logits, ours["logits"].astype(np.float32))
