"""Training on a user's data: data checks, batches, checkpoints, resume, evaluation, the log, Ctrl-C."""

from __future__ import annotations

import json
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import attrs
import numpy as np
import pytest
from safetensors.numpy import load_file

import swapdsl
from conftest import MODELS, REPO
from swapdsl.common.errors import SwpError
from swapdsl.runtime import checkpoint, training
from swapdsl.runtime.dataset import Loader, Order, gather, open_dataset
from swapdsl.runtime.log import append, open_log, read_log

MLP = MODELS / "mlp.swp"
ARGS = {"batch": 8, "features": 16, "hidden": 32, "depth": 3, "lr": 0.01}
DEFINES = [x for k, v in ARGS.items() for x in ("-D", f"{k}={v}")]
CAP = 20 * 1024  # half the no-swap memory: the plan swaps


def make_data(folder: Path, n: int, seed: int = 0, features: int = 16, classes: int = 10) -> Path:
    """A learnable task: the class is the index of the largest of the first ``classes`` features."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, features)).astype(np.float32)
    folder.mkdir(parents=True, exist_ok=True)
    np.save(folder / "x.npy", x)
    np.save(folder / "y.npy", np.argmax(x[:, :classes], axis=1).astype(np.int32))
    return folder


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("training")
    model = swapdsl.load(MLP, **ARGS)
    plan = swapdsl.optimize(model, memory=CAP, method="belady")
    assert dict(plan.figures)["h2d_bytes"] > 0
    swapdsl.save(plan, d / "m.plan")
    return {"dir": d, "plan": d / "m.plan", "train": make_data(d / "train", 100),
            "test": make_data(d / "test", 44, seed=1)}


def run_json(cli, *argv: object) -> dict:
    code, out, err = cli("exec", *argv, "--json")
    assert code == 0, err
    return json.loads(out)


# -- data

def test_data_errors_name_the_input_and_what_was_expected(cli, tmp_path: Path) -> None:
    good = make_data(tmp_path / "good", 20)
    x, y = np.load(good / "x.npy"), np.load(good / "y.npy")
    cases = {
        "missing": ({"x": x}, "has no array for input `y`"),
        "dtype": ({"x": x.astype(np.float64), "y": y}, "input `x` has dtype float64, expected float32"),
        "shape": ({"x": x[:, :15], "y": y}, "input `x` has shape [20, 15], expected [N, 16]"),
        "rank": ({"x": x, "y": y[:, None]}, "input `y` has shape [20, 1], expected [N]"),
        "few": ({"x": x[:5], "y": y[:5]}, "holds 5 examples, fewer than one batch of 8"),
        "counts": ({"x": x, "y": y[:10]}, "different numbers of examples"),
        "labels": ({"x": x, "y": np.where(np.arange(20) == 7, 10, y).astype(np.int32)},
                   "holds 10 at flat index 7, outside [0, 10)"),
    }
    for name, (arrays, message) in cases.items():
        folder = tmp_path / name
        folder.mkdir()
        for k, v in arrays.items():
            np.save(folder / f"{k}.npy", v)
        code, out, err = cli("exec", MLP, *DEFINES, "--data", folder, "--steps", "1")
        assert code == 2 and out == "" and message in err, (name, err)
        assert "Traceback" not in err
    code, _, err = cli("exec", MLP, *DEFINES, "--epochs", "2")
    assert code == 2 and "--epochs needs --data" in err
    code, _, err = cli("exec", MLP, *DEFINES, "--save-every", "2")
    assert code == 2 and "--save-every needs --save PATH" in err


def _npy_with_header(path: Path, shape: str) -> Path:
    """A .npy file whose header claims ``shape`` (and holds 64 bytes of data)."""
    header = f"{{'descr': '<f4', 'fortran_order': False, 'shape': {shape}, }}"
    header += " " * (63 - (10 + len(header)) % 64) + "\n"
    path.write_bytes(b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header.encode() + bytes(64))
    return path


def test_damaged_or_special_data_files_are_refused(cli, tmp_path: Path) -> None:
    """The outside check's files: each a clear error before training, none a traceback or a hang."""
    good = make_data(tmp_path / "good", 20)

    def folder(name: str) -> Path:
        d = tmp_path / name
        d.mkdir()
        np.save(d / "x.npy", np.load(good / "x.npy"))
        return d

    (folder("empty") / "y.npy").write_bytes(b"")
    (folder("text") / "y.npy").write_bytes(b"hello\n")  # (np.load suggested loading it as a pickle)
    _npy_with_header(folder("negative") / "y.npy", "(-20,)")
    _npy_with_header(folder("huge") / "y.npy", "(2**62, 2**62)")
    os.mkfifo(folder("fifo") / "y.npy")
    cases = {"empty": "y.npy` is not a .npy file (it does not start with NumPy's header)",
             "text": "y.npy` is not a .npy file", "negative": "cannot read `", "huge": "cannot read `",
             "fifo": "y.npy` is not a regular file"}
    for name, message in cases.items():
        code, out, err = cli("exec", MLP, *DEFINES, "--data", tmp_path / name, "--steps", "1")
        assert code == 2 and out == "" and message in err.splitlines()[0], (name, err)
        assert "Traceback" not in err and "pickle" not in err
    os.mkfifo(tmp_path / "data.npz")
    code, _, err = cli("exec", MLP, *DEFINES, "--data", tmp_path / "data.npz", "--steps", "1")
    assert code == 2 and "is not a regular file or a folder" in err


def test_a_corrupt_npz_member_is_caught_by_its_crc(cli, tmp_path: Path) -> None:
    good = make_data(tmp_path / "good", 20)
    arrays = {k: np.load(good / f"{k}.npy") for k in ("x", "y")}
    for save in (np.savez, np.savez_compressed):
        np.savez(tmp_path / "d.npz", **arrays) if save is np.savez else save(tmp_path / "d.npz", **arrays)
        data = bytearray((tmp_path / "d.npz").read_bytes())
        at = data.find(b"\x93NUMPY") + 200 if save is np.savez else 400  # inside x's values
        data[at] ^= 0x40
        (tmp_path / "d.npz").write_bytes(bytes(data))
        code, out, err = cli("exec", MLP, *DEFINES, "--data", tmp_path / "d.npz", "--steps", "1")
        assert code == 2 and out == "", err
        assert "cannot read `" in err and ("CRC" in err or "Error -3" in err), err


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_float_inputs_are_refused_naming_file_and_index(cli, tmp_path: Path, bad: float) -> None:
    folder = make_data(tmp_path / "d", 20)
    x = np.load(folder / "x.npy")
    x[13, 5] = bad
    np.save(folder / "x.npy", x)
    code, out, err = cli("exec", MLP, *DEFINES, "--data", folder, "--steps", "1")
    assert code == 2 and out == ""
    assert f"--data `{folder}`: input `x` holds {bad} at flat index {13 * 16 + 5} (example 13)" in err, err


def test_a_model_without_inputs_trains_and_refuses_data(cli, tmp_path: Path) -> None:
    model = tmp_path / "noin.swp"
    model.write_text("model noin() {\n    param w: f32[8] = ones\n    loss = sum(w * w)\n"
                     "    minimize loss with sgd(lr = 0.1)\n}\n")
    run = run_json(cli, model, "--steps", "3")
    assert run["loss"][0] == 8.0 and run["loss"][-1] < run["loss"][0]
    assert cli("optimize", model, "--memory", "1MiB", "--method", "belady", "-o", tmp_path / "m.plan")[0] == 0
    assert run_json(cli, tmp_path / "m.plan", "--steps", "3", "--check")["max_rel_diff"] == 0.0
    code, out, err = cli("exec", model, "--data", make_data(tmp_path / "d", 20), "--steps", "1")
    assert code == 2 and out == "" and "the model `noin` has no inputs" in err


def test_npz_members_are_memory_mapped_when_stored(tmp_path: Path) -> None:
    g = swapdsl.load(MLP, **ARGS).training
    folder = make_data(tmp_path / "d", 30)
    arrays = {k: np.load(folder / f"{k}.npy") for k in ("x", "y")}
    np.savez(tmp_path / "stored.npz", **arrays)
    np.savez_compressed(tmp_path / "packed.npz", **arrays)
    stored, packed = open_dataset(str(tmp_path / "stored.npz"), g), open_dataset(str(tmp_path / "packed.npz"), g)
    assert isinstance(stored.arrays["x"], np.memmap) and not isinstance(packed.arrays["x"], np.memmap)
    for ds in (stored, packed):
        assert all(np.array_equal(ds.arrays[k], arrays[k]) for k in arrays)
        assert (ds.examples, ds.batch, ds.batches_per_epoch, ds.dropped) == (30, 8, 3, 6)


def test_shuffled_order_covers_each_epoch_once_and_depends_on_the_seed() -> None:
    order = Order(50, 8, shuffle=True, seed=3)
    epoch = np.concatenate([order.indices(k) for k in range(order.per_epoch)])
    assert len(set(epoch.tolist())) == 48 and not np.array_equal(epoch, np.sort(epoch))
    assert not np.array_equal(order.indices(order.per_epoch), order.indices(0))  # a new permutation
    assert not np.array_equal(Order(50, 8, True, 4).indices(0), order.indices(0))
    assert Order(50, 8, False, 3).indices(1) == slice(8, 16)


def test_gather_keeps_the_order_asked_for(tmp_path: Path) -> None:
    g = swapdsl.load(MLP, **ARGS).training
    ds = open_dataset(str(make_data(tmp_path / "d", 20)), g)
    where = np.array([5, 1, 19, 0, 7, 7, 3, 2])
    batch = gather(ds, where)
    assert np.array_equal(batch["x"], np.asarray(ds.arrays["x"])[where])


def test_the_next_batch_is_read_while_the_step_runs(tmp_path: Path) -> None:
    """Each step waits until the loader has started reading the following batch: a loader that reads only
    when asked would never start it, and the step would time out."""
    g = swapdsl.load(MLP, **ARGS).training
    ds = open_dataset(str(make_data(tmp_path / "d", 64)), g)
    started = [threading.Event() for _ in range(ds.batches_per_epoch + 2)]

    def slow_read(d, where):  # noqa: ANN001, ANN202
        position = where.start // d.batch
        started[position].set()
        time.sleep(0.05)
        return gather(d, where)

    loader = Loader(ds, Order(64, 8, False, 0), 0, read=slow_read)
    try:
        for k in range(ds.batches_per_epoch - 1):
            position, batch = loader.next()
            assert position == k and batch["x"].shape == (8, 16)
            assert started[k + 1].wait(timeout=10), f"batch {k + 1} was not read during step {k}"
    finally:
        loader.close()


def test_data_loading_errors_reach_the_caller(tmp_path: Path) -> None:
    g = swapdsl.load(MLP, **ARGS).training
    ds = open_dataset(str(make_data(tmp_path / "d", 16)), g)

    def broken(d, where):  # noqa: ANN001, ANN202
        raise OSError("disk gone")

    loader = Loader(ds, Order(16, 8, False, 0), 0, read=broken)
    with pytest.raises(OSError, match="disk gone"):
        loader.next()
    loader.close()


# -- training on data, plans and reference alike

def test_a_plan_trains_on_data_exactly_like_the_reference(cli, setup: dict[str, Path]) -> None:
    run = run_json(cli, setup["plan"], "--data", setup["train"], "--epochs", "3", "--shuffle", "--check")
    assert run["steps"] == 36 and run["max_rel_diff"] == 0.0 and run["dropped_per_epoch"] == 4
    ref = run_json(cli, MLP, *DEFINES, "--data", setup["train"], "--epochs", "3", "--shuffle")
    assert ref["loss"] == run["loss"] and ref["metrics"] == run["metrics"]
    assert run["loss"][-1] < run["loss"][0]


def test_evaluation_runs_inside_the_cap_and_matches_the_reference(cli, setup: dict[str, Path]) -> None:
    argv = ["--data", setup["train"], "--steps", "30", "--eval", setup["test"], "--eval-every", "10"]
    run = run_json(cli, setup["plan"], *argv)
    ref = run_json(cli, MLP, *DEFINES, *argv)
    assert [e["step"] for e in run["eval"]] == [10, 20, 30]
    assert run["eval"] == [dict(e, eval_ms=r["eval_ms"]) for e, r in zip(ref["eval"], run["eval"])]
    assert run["eval"][0]["examples"] == 44 and run["eval"][0]["dropped"] == 0  # the partial batch too
    assert 0.0 <= run["eval"][-1]["metrics"]["accuracy"] <= 1.0
    assert run["device_bytes_allocated"] == run["cap_bytes"] == CAP
    assert run["loss"] == ref["loss"]


@pytest.mark.parametrize("memory", [CAP, 1 << 30])
def test_evaluation_leaves_the_training_state_as_it_found_it(cli, setup: dict[str, Path], tmp_path: Path,
                                                             memory: int) -> None:
    """Under a tight cap (parameters on the host) and a roomy one (all on the device, where evaluation
    overwrites them in the shared arena and must put them back)."""
    plan = swapdsl.optimize(swapdsl.load(MLP, **ARGS), memory=memory, method="belady")
    swapdsl.save(plan, tmp_path / "p.plan")
    argv = [tmp_path / "p.plan", "--data", setup["train"], "--steps", "12", "--save", tmp_path / "c.st"]
    plain = run_json(cli, *argv)
    a = load_file(tmp_path / "c.st")
    evaluated = run_json(cli, *argv, "--eval", setup["test"], "--eval-every", "3")
    b = load_file(tmp_path / "c.st")
    assert evaluated["loss"] == plain["loss"] and all(np.array_equal(a[k], b[k]) for k in a)


def test_accuracy_report_is_the_fraction_of_right_answers(setup: dict[str, Path]) -> None:
    """The report, checked against NumPy on the same parameters and batch."""
    model = swapdsl.load(MLP, **ARGS)
    from swapdsl.graph.autodiff import evaluation_graph
    from swapdsl.runtime.reference import Trainer

    forward = Trainer(evaluation_graph(model.graph), 0, np)
    batch = {k: np.load(setup["test"] / f"{k}.npy")[:8] for k in ("x", "y")}
    forward.set_batch(batch)
    forward.run_step(1)
    p = forward.state()
    h = batch["x"]
    for layer in range(3):
        h = np.maximum(h @ p[f"layer{layer}.dense.w"] + p[f"layer{layer}.dense.b"], 0)
    logits = h @ p["head.w"] + p["head.b"]
    assert forward.metrics()["accuracy"] == pytest.approx(np.mean(np.argmax(logits, 1) == batch["y"]), abs=1e-7)


# -- checkpoints

def test_resume_is_bit_exact_under_a_swapping_plan(cli, setup: dict[str, Path], tmp_path: Path) -> None:
    data = ["--data", setup["train"], "--shuffle", "--seed", "4"]
    whole = run_json(cli, setup["plan"], *data, "--steps", "20", "--save", tmp_path / "whole.st")
    run_json(cli, setup["plan"], *data, "--steps", "10", "--save", tmp_path / "half.st")
    rest = run_json(cli, setup["plan"], "--data", setup["train"], "--shuffle", "--steps", "20",
                    "--resume", tmp_path / "half.st", "--save", tmp_path / "half.st")
    assert rest["first_step"] == 11 and rest["seed"] == 4 and rest["loss"] == whole["loss"][10:]
    a, b = load_file(tmp_path / "whole.st"), load_file(tmp_path / "half.st")
    assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


def test_resume_refuses_other_data_or_another_order(cli, setup: dict[str, Path], tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    run_json(cli, setup["plan"], "--data", setup["train"], "--shuffle", "--steps", "2", "--save", tmp_path / "c.st")
    for argv, said in [(["--data", setup["train"]], "was written by a run with --shuffle: resume with it"),
                       (["--data", setup["test"], "--shuffle"], f"was written by a run on `{setup['train']}`, "
                                                                f"not `{setup['test']}`")]:
        code, out, err = cli("exec", setup["plan"], *argv, "--steps", "4", "--resume", tmp_path / "c.st")
        assert code == 2 and out == "" and said in err.splitlines()[0], err
    code, out, err = cli("exec", setup["plan"], "--shuffle", "--steps", "4", "--resume", tmp_path / "c.st")
    assert code == 2 and "not on synthetic data: give its --data" in err.splitlines()[0], err
    run_json(cli, setup["plan"], "--steps", "2", "--save", tmp_path / "s.st")
    code, out, err = cli("exec", setup["plan"], "--data", setup["train"], "--steps", "4", "--resume", tmp_path / "s.st")
    assert code == 2 and "was written by a run on synthetic data (no --data)" in err.splitlines()[0], err
    monkeypatch.chdir(setup["train"].parent)  # (the same folder, spelt another way from another folder)
    again = run_json(cli, setup["plan"], "--data", f"./{setup['train'].name}/", "--shuffle", "--steps", "4",
                     "--resume", tmp_path / "c.st")
    assert again["first_step"] == 3


def test_labels_of_another_integer_type_train_as_the_models(cli, setup: dict[str, Path], tmp_path: Path) -> None:
    """PyTorch's labels are int64 (and some are uint8): refused before, with a hint to convert. Any integer
    type is read now, its range checked, narrowed batch by batch: the same losses, shuffled or not."""
    y = np.load(setup["train"] / "y.npy")
    for dtype in (np.int64, np.uint8):
        data = tmp_path / np.dtype(dtype).name
        data.mkdir()
        shutil.copy(setup["train"] / "x.npy", data / "x.npy")
        np.save(data / "y.npy", y.astype(dtype))
        for order in ([], ["--shuffle"]):
            ours = run_json(cli, setup["plan"], "--data", data, "--steps", "6", *order)
            theirs = run_json(cli, setup["plan"], "--data", setup["train"], "--steps", "6", *order)
            assert ours["loss"] == theirs["loss"], dtype
    np.save(data / "y.npy", np.where(np.arange(len(y)) == 5, 300, y).astype(np.int64))
    code, out, err = cli("exec", setup["plan"], "--data", data, "--steps", "2")
    assert code == 2 and "input `y` holds 300 at flat index 5, outside [0, " in err, err
    np.save(data / "y.npy", y.astype(np.float32))  # (not an integer type: refused as before)
    code, out, err = cli("exec", setup["plan"], "--data", data, "--steps", "2")
    assert code == 2 and "input `y` has dtype float32, expected int32" in err, err


def test_resume_refuses_data_changed_at_the_same_path(cli, setup: dict[str, Path], tmp_path: Path) -> None:
    """Data regenerated or cut at the path a checkpoint names gave other batches and a recounted epoch in
    silence; the checkpoint records the data's examples and fingerprint."""
    data = tmp_path / "data"
    shutil.copytree(setup["train"], data)
    run_json(cli, setup["plan"], "--data", data, "--shuffle", "--steps", "2", "--save", tmp_path / "c.st")
    x = np.load(data / "x.npy")
    for changed, said in [(x[:-8], f"held {len(x)} examples; it holds {len(x) - 8} now"),
                          (x + np.float32(1), f"has changed since (the same {len(x)} examples, other contents)")]:
        np.save(data / "x.npy", changed)
        np.save(data / "y.npy", np.load(setup["train"] / "y.npy")[:len(changed)])
        code, out, err = cli("exec", setup["plan"], "--data", data, "--shuffle", "--steps", "4", "--resume",
                             tmp_path / "c.st")
        assert code == 2 and out == "" and err.splitlines()[0] == (
            f"error: --resume `{tmp_path / 'c.st'}`: the data `{data}` it was written on {said}"), err
    np.save(data / "x.npy", x)
    np.save(data / "y.npy", np.load(setup["train"] / "y.npy"))
    again = run_json(cli, setup["plan"], "--data", data, "--shuffle", "--steps", "4", "--resume", tmp_path / "c.st")
    assert again["first_step"] == 3


def test_resume_with_check_starts_the_reference_from_the_checkpoint(cli, setup: dict[str, Path],
                                                                    tmp_path: Path) -> None:
    run_json(cli, setup["plan"], "--data", setup["train"], "--steps", "3", "--save", tmp_path / "c.st")
    run = run_json(cli, setup["plan"], "--data", setup["train"], "--steps", "6", "--resume", tmp_path / "c.st",
                   "--check")
    assert run["max_rel_diff"] == 0.0 and run["steps"] == 3


def test_checkpoint_round_trips_through_safetensors_numpy(setup: dict[str, Path], tmp_path: Path) -> None:
    model = swapdsl.load(MLP, **ARGS)
    run = swapdsl.execute(model, steps=3, options=training.Options(save=str(tmp_path / "c.st")), backend="numpy")
    values = load_file(tmp_path / "c.st")
    assert set(values) == set(model.training.persistent)
    assert all(values[n].shape == model.training.type_of(n).shape for n in values)
    ck = checkpoint.read(str(tmp_path / "c.st"), "--resume")
    assert (ck.step, ck.position, ck.seed, ck.meta["model"]) == (3, 3, 0, "mlp")
    assert json.loads(ck.meta["args"]).items() >= ARGS.items()
    assert run.outcome is not None and run.outcome.saves[-1].nbytes == (tmp_path / "c.st").stat().st_size


def test_checkpoints_of_other_runs_are_refused(cli, setup: dict[str, Path], tmp_path: Path) -> None:
    run_json(cli, MLP, *DEFINES, "--steps", "2", "--save", tmp_path / "c.st")
    other = [x for k, v in {**ARGS, "hidden": 16}.items() for x in ("-D", f"{k}={v}")]
    code, out, err = cli("exec", MLP, *other, "--steps", "4", "--resume", tmp_path / "c.st")
    assert code == 2 and out == "" and "its model arguments differ" in err
    code, _, err = cli("exec", MLP, *other, "--steps", "4", "--init", tmp_path / "c.st")
    assert code == 2 and "tensor `layer0.dense.w` is float32[16, 32], the model's is f32[16,16]" in err
    code, _, err = cli("exec", MLP, *DEFINES, "--steps", "2", "--resume", tmp_path / "c.st")
    assert code == 2 and "nothing left to do" in err
    code, _, err = cli("exec", MLP, *DEFINES, "--steps", "4", "--resume", tmp_path / "c.st", "--seed", "1")
    assert code == 2 and "--seed 0" in err
    (tmp_path / "junk.st").write_bytes(b"not a checkpoint")
    code, _, err = cli("exec", MLP, *DEFINES, "--steps", "4", "--resume", tmp_path / "junk.st")
    assert code == 2 and "is not a safetensors file" in err


def _edited(src: Path, dst: Path, **fields: str | None) -> Path:
    """``src`` rewritten with metadata ``fields`` changed (None: removed), tensors as they were."""
    from safetensors import safe_open
    from safetensors.numpy import save_file

    with safe_open(str(src), framework="np") as f:
        meta = dict(f.metadata())
        values = {k: f.get_tensor(k) for k in f.keys()}
    for key, value in fields.items():
        if value is None:
            meta.pop(key)
        else:
            meta[key] = value
    save_file(values, str(dst), metadata=meta)
    return dst


@pytest.mark.parametrize("field,value,expected", [
    ("step", "abc", "metadata field `step` is 'abc', not an integer from 0 to 2^63-1"),
    ("step", "1e3", "metadata field `step` is '1e3'"),
    ("step", "9" * 23, "metadata field `step` is '99999999999999999999999'"),
    ("step", "-5", "metadata field `step` is '-5'"),
    ("step", None, "metadata field `step` is missing"),
    ("seed", "abc", "metadata field `seed` is 'abc'"),
    ("seed", "-1", "metadata field `seed` is '-1'"),
    ("seed", str(2**70), "metadata field `seed` is '1180591620717411303424'"),
    ("seed", None, "metadata field `seed` is missing"),
    ("position", "xyz", "metadata field `position` is 'xyz'"),
    ("position", "1", "data position 1 at step 3"),
    ("shuffle", "maybe", "metadata field `shuffle` is 'maybe', not true or false"),
    ("sha256", "{}", "metadata field `sha256` does not list a digest for each tensor"),
    ("sha256", None, "metadata field `sha256` does not list a digest for each tensor"),
    ("version", None, "metadata field `version` is missing"),  # (it said "checkpoint version None")
])
def test_edited_checkpoint_metadata_is_refused(cli, tmp_path: Path, field: str, value: str | None,
                                               expected: str) -> None:
    run_json(cli, MLP, *DEFINES, "--steps", "3", "--save", tmp_path / "c.st")
    bad = _edited(tmp_path / "c.st", tmp_path / "bad.st", **{field: value})
    flags = ["--resume"] if field == "sha256" else ["--resume", "--init"]
    for flag in flags:
        code, out, err = cli("exec", MLP, *DEFINES, "--steps", "9", flag, bad)
        assert code == 2 and out == "", err
        assert err.startswith("error: ") and "Traceback" not in err
        assert expected in err.splitlines()[0], err


def _flipped(path: Path, name: str) -> bytes:
    """The checkpoint's bytes with the last byte of tensor ``name`` flipped."""
    data = bytearray(path.read_bytes())
    size = int.from_bytes(data[:8], "little")
    end = json.loads(data[8:8 + size])[name]["data_offsets"][1]
    data[8 + size + end - 1] ^= 0x01
    return bytes(data)


def test_a_flipped_byte_in_a_tensor_is_named(cli, tmp_path: Path) -> None:
    """In a tensor the run reads: --init reads only the parameters (and running statistics), so a damaged
    optimiser state is --resume's refusal alone."""
    run_json(cli, MLP, *DEFINES, "--steps", "3", "--save", tmp_path / "c.st")
    state = next(k for k in load_file(tmp_path / "c.st") if k.endswith("/momentum"))
    param = state.removesuffix("/momentum")
    for flag, name, refused in (("--resume", state, True), ("--init", param, True), ("--init", state, False)):
        (tmp_path / "bad.st").write_bytes(_flipped(tmp_path / "c.st", name))
        code, out, err = cli("exec", MLP, *DEFINES, "--steps", "2", flag, tmp_path / "bad.st")
        if not refused:
            assert code == 0, err
            continue
        assert code == 2 and out == ""
        assert re.match(rf"error: {flag} `.*bad\.st`: tensor `{re.escape(name)}` does not match the digest recorded "
                        r"when it was saved$", err.splitlines()[0]), err


def test_init_reads_the_parameters_alone_of_a_checkpoint(cli, tmp_path: Path) -> None:
    """--init read every tensor of the file, the optimiser's state too (Adam's: twice the parameters)."""
    from swapdsl.runtime import checkpoint

    run_json(cli, MLP, *DEFINES, "--steps", "2", "--save", tmp_path / "c.st")
    g = swapdsl.load(MLP, ARGS).training
    ck = checkpoint.read(str(tmp_path / "c.st"), "--init", wanted=checkpoint.for_init(g))
    assert set(ck.values) == set(g.params) and set(ck.names) == set(g.persistent) > set(g.params)


def test_init_takes_parameters_only(cli, setup: dict[str, Path], tmp_path: Path) -> None:
    first = run_json(cli, MLP, *DEFINES, "--steps", "5", "--save", tmp_path / "c.st")
    run = run_json(cli, setup["plan"], "--steps", "1", "--init", tmp_path / "c.st", "--check")
    assert run["first_step"] == 1 and run["max_rel_diff"] == 0.0
    assert run["loss"][0] < first["loss"][0]  # trained parameters, fresh optimiser state


def test_init_takes_weights_alone_as_pytorch_writes_them(cli, setup: dict[str, Path], tmp_path: Path) -> None:
    """A safetensors file of parameters with no swapdsl metadata (`safetensors.torch.save_file`) was
    refused as "not a swapdsl checkpoint", though the language doc sends users to --init with one."""
    import ml_dtypes
    from safetensors.numpy import save_file

    run_json(cli, MLP, *DEFINES, "--steps", "5", "--save", tmp_path / "c.st")
    params = {k: v for k, v in load_file(tmp_path / "c.st").items() if "/" not in k}
    save_file(params, str(tmp_path / "plain.st"), metadata={"format": "pt"})
    save_file({k: v.astype(ml_dtypes.bfloat16) for k, v in params.items()}, str(tmp_path / "half.st"))
    ours = run_json(cli, setup["plan"], "--steps", "2", "--init", tmp_path / "c.st")
    assert run_json(cli, setup["plan"], "--steps", "2", "--init", tmp_path / "plain.st")["loss"] == ours["loss"]
    half = run_json(cli, setup["plan"], "--steps", "2", "--init", tmp_path / "half.st", "--check")
    assert half["max_rel_diff"] == 0.0 and half["loss"] != ours["loss"]  # (widened exactly from bf16)
    renamed = {k.replace(".w", ".weight"): v for k, v in params.items()}
    save_file(renamed, str(tmp_path / "torch.st"))
    code, _, err = cli("exec", setup["plan"], "--steps", "1", "--init", tmp_path / "torch.st")
    assert code == 2 and "has no tensor `" in err and "= hint: did you mean `" in err and ".weight`?" in err
    code, _, err = cli("exec", setup["plan"], "--steps", "1", "--resume", tmp_path / "plain.st")
    assert code == 2 and "is a safetensors file but not a swapdsl checkpoint" in err
    wide = next(k for k, v in params.items() if v.ndim == 2 and v.shape[0] != v.shape[1])
    save_file({**params, wide: np.ascontiguousarray(params[wide].T)}, str(tmp_path / "t.st"))
    code, _, err = cli("exec", setup["plan"], "--steps", "1", "--init", tmp_path / "t.st")
    assert code == 2 and f"tensor `{wide}` is float32" in err and "= hint: its transpose fits" in err, err


BN = """import layers
model bn(batch = 4) {
    input x: f32[batch, 3, 4, 4]
    param fixed: [3] = ones frozen
    h = batchnorm(x) as stem
    h = h * reshape(fixed, [1, 3, 1, 1])
    minimize mean(h * h) with sgd(0.1)
}
"""


def test_init_weights_alone_are_widened_checked_for_finite_values_and_narrowed_only_where_they_fit(
        cli, tmp_path: Path) -> None:
    """f16 running statistics were refused where f16 parameters were widened; a NaN weight ran, and the
    non-finite report then blamed the kernels' rounding; a frozen weight past f16's range became inf."""
    from safetensors.numpy import save_file

    model = tmp_path / "bn.swp"
    model.write_text(BN)
    good = {"stem.scale": np.full(3, 1.5), "stem.shift": np.zeros(3), "fixed": np.ones(3),
            "stem.running_mean": np.zeros(3), "stem.running_var": np.ones(3)}

    def run(values: dict, *extra: str) -> tuple[int, str]:
        save_file({k: np.asarray(v, dtype=np.float16 if k != "fixed" else np.float32) for k, v in values.items()},
                  str(tmp_path / "w.st"))
        code, _, err = cli("exec", model, "--steps", "1", "--init", tmp_path / "w.st", *extra)
        return code, err

    assert run(good) == (0, "")
    code, err = run({**good, "stem.shift": np.array([0.0, np.nan, 0.0])})
    assert code == 2 and err.startswith(f"error: --init `{tmp_path / 'w.st'}`: tensor `stem.shift` holds a value "
                                        "that is not finite"), err
    code, err = run({**good, "fixed": np.full(3, 7e4)}, "--precision", "f16")
    assert code == 2 and "tensor `fixed` holds 70000, beyond float16's range" in err, err
    code, err = run({k: v for k, v in good.items() if k != "stem.shift"})
    assert code == 2 and "has no tensor `stem.shift`" in err and "= hint" not in err, err  # (no empty hint)


# -- the log, and what the run looks like

def test_log_records_every_step_and_evaluation(cli, setup: dict[str, Path], tmp_path: Path) -> None:
    log = tmp_path / "run.jsonl"
    run_json(cli, setup["plan"], "--data", setup["train"], "--steps", "12", "--eval", setup["test"],
             "--eval-every", "6", "--log", log, "--save", tmp_path / "c.st")
    records = [json.loads(line) for line in log.read_text().splitlines()]
    steps = [r for r in records if r["event"] == "step"]
    assert [r["step"] for r in steps] == list(range(1, 13))
    assert {"loss", "metrics", "step_ms", "h2d_bytes", "d2h_bytes", "epoch"} <= set(steps[0])
    assert steps[0]["h2d_bytes"] > 0 and "accuracy" in steps[0]["metrics"]
    assert [r["step"] for r in records if r["event"] == "eval"] == [6, 12]
    assert [r["step"] for r in records if r["event"] == "save"] == [12]
    code, out, err = cli("plot-log", log, "-o", tmp_path / "loss.png")
    assert code == 0, err
    assert (tmp_path / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_log_refuses_what_is_not_a_log(cli, tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"event": "step", "step": 1, "loss": 1.0, "metrics": {}}\n{"event": "step"\n')
    code, out, err = cli("plot-log", bad, "-o", tmp_path / "x.png")
    assert code == 2 and f"{bad}:2:" in err and not (tmp_path / "x.png").exists()
    bad.write_text('{"event": "eval", "step": 1, "loss": 1.0, "metrics": {}}\n')
    code, _, err = cli("plot-log", bad, "-o", tmp_path / "x.png")
    assert code == 2 and "no training steps" in err


def test_plot_log_refuses_deep_nesting_and_special_files(cli, tmp_path: Path) -> None:
    bad = tmp_path / "deep.jsonl"
    bad.write_text('{"event": "step", "step": 1, "loss": 1.0, "metrics": {}}\n' + "[" * 100_000 + "\n")
    code, out, err = cli("plot-log", bad, "-o", tmp_path / "x.png")
    assert code == 2 and out == "" and err.splitlines()[0].endswith("nested too deeply"), err
    assert f"{bad}:2:1" in err and not (tmp_path / "x.png").exists()
    os.mkfifo(tmp_path / "fifo.jsonl")
    code, _, err = cli("plot-log", tmp_path / "fifo.jsonl", "-o", tmp_path / "x.png")
    assert code == 2 and "is not a regular file" in err


def test_plot_log_draws_a_step_logged_again_as_logged_last_and_leaves_out_a_torn_last_line(
        cli, tmp_path: Path) -> None:
    log = tmp_path / "run.jsonl"
    line = '{{"event": "step", "step": {}, "loss": {}, "metrics": {{}}}}\n'.format
    log.write_text(line(1, 3.0) + line(2, 2.0) + line(1, 9.0) + '{"event": "step", "st')
    notes: list[str] = []
    assert [(r["step"], r["loss"]) for r in read_log(str(log), notes)] == [(1, 9.0), (2, 2.0)]
    assert notes == [f"the last line of `{log}` is incomplete (a run stopped while writing it): left out",
                     "1 records of steps logged again (a resumed or repeated run) are drawn as logged last"]
    log.write_text(line(1, 3.0) + '{"event": "step", "step": ' + "9" * 5000 + ', "loss": 1, "metrics": {}}\n')
    code, out, err = cli("plot-log", log, "-o", tmp_path / "x.png")
    assert code == 2 and err.startswith("error: not a record of `swapdsl exec --log`: a number too long to read")


def test_appending_to_a_log_ends_a_whole_last_line_and_cuts_a_torn_one(tmp_path: Path) -> None:
    log, record = tmp_path / "run.jsonl", '{"event": "step", "step": 1, "loss": 1.0, "metrics": {}}'
    torn = '{"event": "step", "loss": ' + "1" * 100_000  # (longer than the chunk the end is found in)
    for tail, kept in [(record, record + "\n"), ('{"event": "st', ""), (torn, ""), ('{"ev', ""), ("\0" * 20, ""),
                       ("\0" * 8 + '{"event": "st', "")]:  # (a crash leaves zeros where it was writing)
        log.write_text(record + "\n" + tail)
        with open_log(str(log)) as f:
            append(f, {"event": "save", "step": 2})
        assert log.read_text() == record + "\n" + kept + '{"event": "save", "step": 2}\n', tail[:20]
    for foreign in ("line1\nline2 without its newline", "x" * 1000, record + "\nnot ours"):
        log.write_text(foreign)
        with pytest.raises(SwpError, match="is not a log `swapdsl exec --log` wrote, so it is not appended to"):
            open_log(str(log))
        assert log.read_text() == foreign  # neither cut nor appended to
    log.write_text('{"ev')
    with open_log(str(log)) as f:
        append(f, {"event": "save", "step": 2})
    assert log.read_text() == '{"event": "save", "step": 2}\n'


def test_a_log_that_exec_did_not_write_is_refused_before_the_run(cli, setup: dict[str, Path], tmp_path: Path) -> None:
    notes = tmp_path / "notes.jsonl"
    notes.write_text("my notes\n")
    code, out, err = cli("exec", setup["plan"], "--steps", "2", "--log", notes)
    assert code == 2 and out == "" and "is not a log `swapdsl exec --log` wrote" in err.splitlines()[0], err
    assert notes.read_text() == "my notes\n"
    record = '{"event": "step", "step": 1, "loss": 1.0, "metrics": {}}\n'
    for damaged, line in [(record + "hello world\n", 2), (record + '{"event": "step"}\n' + record, 2),
                          (record + record.replace('"step": 1', '"step": -5'), 2),
                          (record + '{"event": "step", "step": 0, "loss": "x"}', 2),  # (whole, unended)
                          (record + "caf\u00e9 \udcff\n", 2)]:
        notes.write_bytes(damaged.encode("utf-8", "surrogateescape"))  # (plot-log would refuse the log)
        code, out, err = cli("exec", setup["plan"], "--steps", "2", "--log", notes)
        assert code == 2 and out == "" and "is not a log `swapdsl exec --log` wrote" in err.splitlines()[0], err
        assert f"{notes}:{line}:" in err or f"line {line} is not UTF-8" in err, err
        assert notes.read_bytes() == damaged.encode("utf-8", "surrogateescape")
        code, _, err = cli("plot-log", notes, "-o", tmp_path / "x.png")
        assert code == 2 and (f"{notes}:{line}:" in err or "not UTF-8" in err), err
    notes.write_text(record.replace("1.0", "NaN"))  # (--on-nonfinite continue logs a NaN loss)
    assert cli("exec", setup["plan"], "--steps", "2", "--log", notes)[0] == 0
    assert len(read_log(str(notes))) == 2


def test_a_log_on_a_file_system_without_locks_is_written_unlocked(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    import errno
    import fcntl

    def refused(fd: int, how: int) -> None:
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", refused)
    with open_log(str(tmp_path / "run.jsonl")) as f:
        append(f, {"event": "save", "step": 1})
    assert (tmp_path / "run.jsonl").read_text() == '{"event": "save", "step": 1}\n'

    def broken(fd: int, how: int) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(fcntl, "flock", broken)
    with pytest.raises(SwpError, match="cannot lock the log .*: Input/output error"):
        open_log(str(tmp_path / "run.jsonl"))


def test_a_run_that_cannot_write_its_log_or_checkpoint_stops_with_both_whole(setup: dict[str, Path],
                                                                               tmp_path: Path) -> None:
    """A file-size limit (as a full disk fails a write: in the middle of it) on a real run: the log keeps
    whole lines only, the checkpoint before stays, and the error is one line, exit 2."""
    log, ck = tmp_path / "run.jsonl", tmp_path / "c.safetensors"

    def run(limit: int, *flags: object) -> subprocess.CompletedProcess[str]:
        def limited() -> None:
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # (a write past the limit then fails with EFBIG)
            resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

        return subprocess.run([sys.executable, "-m", "swapdsl", "exec", str(setup["plan"]), "--data",
                               str(setup["train"]), *map(str, flags)], capture_output=True, text=True,
                              preexec_fn=limited, cwd=tmp_path, timeout=120)

    done = run(700, "--steps", "6", "--log", log)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.startswith(f"error: cannot write the log `{log}`: File too large")
    text = log.read_text()
    assert text.endswith("\n") and 0 < len(text.splitlines()) < 6 and len(text) <= 700
    assert all(json.loads(x)["event"] == "step" for x in text.splitlines())
    assert run(1 << 20, "--steps", "2", "--save", ck).returncode == 0
    before = ck.read_bytes()
    done = run(len(before) - 1, "--steps", "4", "--resume", ck, "--save", ck)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.startswith(f"error: cannot write the checkpoint `{ck}`: ")
    assert ck.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["c.safetensors", "run.jsonl"]


def test_progress_lines_show_epoch_loss_reports_and_rate(cli, setup: dict[str, Path]) -> None:
    code, out, err = cli("exec", setup["plan"], "--data", setup["train"], "--epochs", "1", "--eval", setup["test"])
    assert code == 0, err
    lines = out.splitlines()
    assert "12 batches of 8 an epoch, 4 in a partial batch left out" in lines[1]
    assert "step 12/12  epoch 1/1  loss" in out and "accuracy" in lines[2] and "ex/s" in lines[2]
    assert "eval after step 12: loss" in out and "held out: loss" in next(x for x in lines if x.startswith("loss "))


def test_the_rate_leaves_out_checking_evaluating_and_saving(monkeypatch: pytest.MonkeyPatch) -> None:
    """ex/s counted --check's reference steps as training: a checked run showed a fifth of its rate."""
    import io

    from swapdsl.runtime import progress

    clock = iter([1.0, 1.5, 2.6])
    monkeypatch.setattr(progress.time, "perf_counter", lambda: next(clock))
    out = io.StringIO()
    shown = progress.Progress(3, None, out, live=False)
    step = training.StepRecord(1, None, 1.0, {}, 100.0, 10, 0, 0, 0.0, "loss", check_ms=400.0)
    shown.step(step)
    shown.step(attrs.evolve(step, step=2))
    shown.evaluation(training.EvalRecord(2, 1.0, {}, 5, 0, 1000.0))
    shown.step(attrs.evolve(step, step=3, check_ms=None))
    assert re.findall(r"([\d,]+) ex/s", out.getvalue()) == ["100", "100", "100"]


# -- Ctrl-C

def test_ctrl_c_finishes_the_step_saves_and_exits_130(setup: dict[str, Path], tmp_path: Path) -> None:
    ck = tmp_path / "c.st"
    proc = subprocess.Popen([sys.executable, "-m", "swapdsl", "exec", str(setup["plan"]), "--data",
                             str(setup["train"]), "--epochs", "100000", "--save", str(ck)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert proc.stdout is not None
    while "step" not in proc.stdout.readline():  # the header, then the first step
        pass
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "interrupted after step" in err and str(ck) in err
    saved = checkpoint.read(str(ck), "--resume")
    assert saved.step >= 1 and set(saved.values) == set(swapdsl.load(MLP, **ARGS).training.persistent)


def test_api_refuses_steps_and_epochs_together() -> None:
    with pytest.raises(SwpError, match="not both"):
        swapdsl.execute(swapdsl.load(MLP, **ARGS), options=training.Options(steps=2, epochs=1, data="x"))


def test_digits_example_learns_under_a_third_of_its_memory(cli, tmp_path: Path) -> None:
    """The README's real-data tour: scikit-learn's digits, an MLP with a warmup, a cosine decay and
    clipping, under 1/3 of its no-swap memory."""
    pytest.importorskip("sklearn")
    subprocess.run([sys.executable, str(REPO / "examples" / "digits.py"), str(tmp_path)], check=True,
                   capture_output=True)
    code, out, err = cli("optimize", REPO / "examples" / "digits.swp", "--memory", "1/3", "--method", "belady",
                         "-o", tmp_path / "d.plan")
    assert code == 0 and "memory ratio     3.00" in out, err
    run = run_json(cli, tmp_path / "d.plan", "--data", tmp_path / "train", "--shuffle", "--epochs", "60",
                   "--eval", tmp_path / "test", "--save", tmp_path / "d.st")
    assert run["examples"] == 1438 and run["eval"][-1]["examples"] == 359
    assert run["eval"][-1]["metrics"]["accuracy"] >= 0.93  # 0.969 when measured (docs/benchmarks.md)
    assert 0 < run["metrics"][0]["grad_norm"] < 10
    code, out, err = cli("predict", tmp_path / "d.plan", "--data", tmp_path / "test", "--init", tmp_path / "d.st",
                         "-o", tmp_path / "digits.npz")
    assert code == 0, err
    digit = np.load(tmp_path / "digits.npz")["digit"]
    assert float(np.mean(digit == np.load(tmp_path / "test" / "y.npy"))) == pytest.approx(
        run["eval"][-1]["metrics"]["accuracy"], abs=1e-6)


def test_exec_says_which_device_the_simulated_step_is_for(cli, setup: dict[str, Path]) -> None:
    code, out, _ = cli("exec", setup["plan"], "--steps", "1", "--backend", "numpy")
    assert code == 0
    lines = out.splitlines()
    assert re.match(r"simulated step [0-9.e+-]+ ms on v100-16gb; ", lines[-2]), lines
    assert lines[-1].startswith("  note: the simulated step is for a v100-16gb GPU") and "swapdsl profile" in lines[-1]


# -- non-finite steps

NAN16 = """model nan16(batch = 16, features = 32, hidden = 64, classes = 10, lr = 0.001) {
    input x: DT[batch, features]
    input y: i32[batch]
    param w1: DT[features, hidden] = xavier
    param w2: DT[hidden, classes] = xavier
    h = relu(x @ w1)
    loss = softmax_cross_entropy(h @ w2, y)
    minimize loss with adam(lr = lr)
}
"""


def test_a_nonfinite_loss_stops_the_run_naming_the_op_and_keeps_the_good_checkpoint(cli, tmp_path: Path) -> None:
    """f16 parameters and Adam state (declared by the model): a weight overflows f16 after step 1 and
    step 2's product is infinite. The run stops there with exit 2, names that op, and leaves the last good
    checkpoint as it was; the same holds for a plan of the model."""
    model = write_model(tmp_path / "nan16.swp", NAN16.replace("DT", "f16"))
    code, out, err = cli("exec", model, "--steps", "40", "--save", tmp_path / "c.st", "--save-every", "1")
    assert code == 2
    lines = err.splitlines()
    assert lines[0] == "error: the loss of step 2 is nan; stopped, and saved nothing over the last good checkpoint"
    assert lines[1] == f"  = note: the first non-finite value was made in step 2 by op 2, `matmul` at {model}:7:34"
    assert "--precision f32, or f32 parameters and optimiser state often help" in err  # (f16 as declared)
    f32 = write_model(tmp_path / "nan32.swp", NAN16.replace("DT", "f32").replace("lr = 0.001", "lr = 1e38"))
    code, _, err = cli("exec", f32, "--steps", "40")
    assert code == 2 and err.splitlines()[-1] == "  = hint: a lower learning rate often helps", err
    assert checkpoint.read(str(tmp_path / "c.st"), "--resume").step == 1
    assert cli("optimize", model, "--memory", "64KiB", "--method", "belady", "-o", tmp_path / "m.plan")[0] == 0
    code, _, err = cli("exec", tmp_path / "m.plan", "--steps", "40")
    assert code == 2 and err.splitlines()[:2] == lines[:2]
    run = run_json(cli, model, "--steps", "3", "--on-nonfinite", "continue")
    assert np.isnan(run["loss"][-1])


@pytest.mark.parametrize("precision", ["bf16", "f16"])
def test_the_same_model_in_f32_trains_in_half_precision_with_f32_masters(cli, tmp_path: Path, precision: str) -> None:
    model = write_model(tmp_path / "nan32.swp", NAN16.replace("DT", "f32"))
    run = run_json(cli, model, "--steps", "200", "--precision", precision)
    assert all(np.isfinite(run["loss"])) and run["loss"][-1] < 0.05


def write_model(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


@pytest.mark.parametrize("target", ["plan", "model"])
def test_evaluation_covers_every_held_out_example(cli, setup: dict[str, Path], target: str) -> None:
    """44 held-out examples in batches of 8: five whole batches and a partial one of 4, evaluated by the
    forward graph at 4 (planned under the same cap for a plan): the loss and accuracy over all 44 are those
    of one pass over all of them."""
    d = setup["dir"]
    what = [setup["plan"]] if target == "plan" else [MLP, *DEFINES]
    run = run_json(cli, *what, "--data", setup["train"], "--steps", "6", "--eval", setup["test"],
                   "--save", d / f"ev-{target}.st")
    last = run["eval"][-1]
    assert last["examples"] == 44 and last["dropped"] == 0
    from swapdsl.runtime import checkpoint
    state = checkpoint.read(str(d / f"ev-{target}.st"), "--resume").values
    whole = swapdsl.load(MLP, **{**ARGS, "batch": 44}).evaluation
    from swapdsl.runtime.reference import Trainer
    ref = Trainer(whole, 0, np)
    ref.load_state(state, 6)
    ref.set_batch({"x": np.load(setup["test"] / "x.npy"), "y": np.load(setup["test"] / "y.npy")})
    loss = ref.step(7)
    assert last["loss"] == pytest.approx(loss, rel=1e-5)
    assert last["metrics"]["accuracy"] == pytest.approx(ref.metrics()["accuracy"], abs=1e-6)


FROZEN = """import layers
model fz(batch = 8) {
    input x: f32[batch, 6]
    input y: i32[batch]
    param w0: [6, 16] = xavier frozen
    h = relu(x @ w0)
    logits = dense(h, 3) as head
    loss = softmax_cross_entropy(logits, y)
    minimize loss with adam(lr = 1e-2)
}
"""


@pytest.mark.parametrize("precision", ["f32", "bf16"])
def test_a_frozen_parameter_is_loaded_and_saved_but_never_trained(tmp_path: Path, precision: str) -> None:
    """No gradient, no optimiser state, no update for `frozen` (in bf16 it is stored half: no master copy
    to update); the others train as before, and a plan of the model runs exactly like the reference."""
    import swapdsl
    from swapdsl.runtime.data import init_persistent

    (tmp_path / "fz.swp").write_text(FROZEN)
    m = swapdsl.load(tmp_path / "fz.swp", precision=precision)
    t = m.training
    assert t.type_of("w0").dtype.label == precision
    assert t.frozen == ("w0",) and "w0" in t.params
    assert [p for p, _ in t.grads] == ["head.b", "head.w"] and not any(s.startswith("w0") for s in t.state)
    from swapdsl.graph.printer import print_graph

    assert f"w0: {precision}[6,16] = xavier_uniform frozen" in print_graph(m.graph)
    plan = swapdsl.optimize(m, memory="4KiB", method="belady")
    run = swapdsl.execute(plan, check=True, options=swapdsl.Options(steps=5, save=str(tmp_path / "ck.st")))
    assert run.max_rel_diff == 0.0 and run.losses[-1] < run.losses[0]
    from safetensors.numpy import load_file

    after, before = load_file(str(tmp_path / "ck.st")), init_persistent(t, 0, np)
    assert np.array_equal(after["w0"], before["w0"]) and not np.array_equal(after["head.w"], before["head.w"])
    if precision == "bf16":  # an f32 checkpoint starts the bf16 model, its frozen weight rounded
        f32 = swapdsl.load(tmp_path / "fz.swp")
        swapdsl.execute(f32, options=swapdsl.Options(steps=1, save=str(tmp_path / "f32.st")))
        run = swapdsl.execute(m, options=swapdsl.Options(steps=1, init=str(tmp_path / "f32.st")))
        assert np.isfinite(run.losses[0])


def test_schedules_and_clipping_are_set_from_the_command_line_through_model_arguments(cli) -> None:
    """examples/digits.swp takes its warmup and clipping as arguments: -D changes them for exec and
    optimize alike (clip = 0: no global norm, no `grad_norm` report)."""
    import swapdsl

    digits = REPO / "examples" / "digits.swp"
    ops = {c: {o.op for o in swapdsl.load(digits, clip=c).training.ops} for c in (1.0, 0.0)}
    assert "global_norm" in ops[1.0] and "global_norm" not in ops[0.0]
    code, out, err = cli("exec", digits, "-D", "clip=0", "-D", "warmup=2", "--steps", "2", "--json")
    assert code == 0, err
    assert "grad_norm" not in json.loads(out)["metrics"][0]


class _Fixed:
    """A stepper whose loss and state are given (for ``training.Beside``)."""

    def __init__(self, loss: float, state: dict[str, np.ndarray]) -> None:
        self.loss, self._state = loss, state

    def set_batch(self, batch: object) -> None:
        pass

    def run_step(self, step: int) -> tuple[float, float]:
        return self.loss, 0.0

    def state(self) -> dict[str, np.ndarray]:
        return self._state


def test_the_check_says_where_the_largest_difference_is() -> None:
    import contextlib

    ref = _Fixed(2.0, {"w": np.array([1.0, 4.0]), "b": np.array([0.5])})
    beside = training.Beside(ref, contextlib.nullcontext)
    mine = _Fixed(2.0, {"w": np.array([1.0, 3.0]), "b": np.array([0.5])})
    assert beside(None, 1, 2.0, mine) == (0.25, "w")
    assert beside(None, 2, 2.2, _Fixed(2.2, ref.state())) == (pytest.approx(0.1), "loss")
    assert beside(None, 3, 2.0, _Fixed(2.0, ref.state())) == (0.0, "loss")
    assert beside(None, 4, float("nan"), _Fixed(2.0, ref.state())) == (float("inf"), "loss")  # never hidden


BF16_MODEL = """model m(batch = 4) {
    input x: bf16[batch, 3]
    input y: bf16[batch, 2]
    param w: bf16[3, 2] = normal(std = 0.1)
    h = x @ w
    minimize mean((h - y) * (h - y)) with sgd(lr = 0.1)
}
"""


def test_bf16_inputs_are_read_as_numpy_stores_them(cli, tmp_path: Path) -> None:
    """`numpy.save` of an ml_dtypes.bfloat16 array writes two-byte void records (`|V2` when read back): a bf16
    model refused every such file, and its hint named `numpy.bfloat16`, which does not exist."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    (tmp_path / "m.swp").write_text(BF16_MODEL)
    rng = np.random.default_rng(0)
    x, y = (rng.standard_normal((8, n)).astype(ml_dtypes.bfloat16) for n in (3, 2))
    (tmp_path / "d").mkdir()
    np.save(tmp_path / "d" / "x.npy", x)
    np.save(tmp_path / "d" / "y.npy", y)
    np.savez(tmp_path / "d.npz", x=x, y=y)
    runs = [swapdsl.execute(str(tmp_path / "m.swp"), options=training.Options(data=str(tmp_path / data), steps=2))
            for data in ("d", "d.npz")]
    assert runs[0].losses == runs[1].losses and np.isfinite(runs[0].losses).all()
    np.save(tmp_path / "d" / "x.npy", x.astype(np.float32))
    code, _, err = cli("exec", tmp_path / "m.swp", "--data", tmp_path / "d", "--steps", "1")
    assert code == 2 and "has dtype float32, expected bfloat16" in err and "a.astype(ml_dtypes.bfloat16)" in err, err
