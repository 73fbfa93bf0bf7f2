"""Random command lines, good and bad values mixed: each ends with exit code 0, or 2 and one
`error:` message; never a traceback, never a hang. SWAPDSL_CLI_FUZZ sets the number of cases."""

from __future__ import annotations

import os
import random
from pathlib import Path

import numpy as np
import pytest

from conftest import MODELS, main, write
from swapdsl.fuzz import run_cli

CASES = int(os.environ.get("SWAPDSL_CLI_FUZZ", "120"))
SMALL = ["-D", "batch=2", "-D", "hidden=8", "-D", "features=8"]
LONG = "n" * 300  # a part of a path longer than any file system takes (ENAMETOOLONG); and one under a file (ENOTDIR)
FILES = ["m.swp", "m.plan", "missing.swp", "folder", "/proc/x.swp", "empty.swp", "binary.swp", "plan.swp",
         "model.plan", "l.jsonl", "ck.st", "fifo", "m.onnx", LONG + ".swp", "m.swp/x.swp"]
# option -> values a user might give it, good and bad
OPTIONS: dict[str, list[str]] = {
    "--memory": ["64KiB", "8MiB", "1e30", "lots", "-1", "0", "1KiB", "nan", "1.5GB", "9" * 40, "", "1PiB"],
    "--method": ["lru", "belady", "vdnn", "ga", "checkpoint", "capuchin", "exact", "bogus"],
    "--host-memory": ["1KiB", "64MiB", "0", "-1", "lots", "nan", "1e30", "", "1PiB"],
    "--host-share": ["0.5", "0", "-1", "nan", "inf", "x"],
    "--budget": ["0.2", "nan", "-1", "inf", "0", "x", "1e-9"],
    "--generations": ["1", "2", "0", "-5", "1e3", "x"],
    "--population": ["2", "4", "1", "1000000000", "x"],
    "--seed": ["0", "7", "-1", str(2**64), "x", str(2**63 - 1)],
    "--workers": ["1", "1000", "-1", "0"],
    "--polish": ["0", "0.5", "0.9", "1", "-0.1", "nan", "x", ""],
    "--steps": ["1", "2", "0", "-1", "x"],
    "-D": ["batch=2", "batch=0", "batch=x", "nonsense", "lr=nan", "=3", "batch=99999999999999999999",
           "hidden=1e26", "lr=1e999", "depth=100000000"],
    "-o": ["out.plan", "/proc/x.plan", "folder", "missing/x.plan", "", "fifo", "link.plan", LONG + ".plan",
           "m.swp/x.plan"],
    "--device": ["v100-16gb", "h200", "bogus", "empty.swp", "bad.json", "fifo.json", LONG + ".json"],
    "--backend": ["numpy", "cupy", "bogus"],
    "--ratios": ["2", "x", "-1", "nan", "2,,4", "1e400"],
    "--methods": ["lru", "belady,lru", "capuchin,checkpoint", "bogus", ""],
    "--models": ["mlp", "bogus", "m.swp"],
    "--plot": ["x.png", "/proc/x.png", "folder", LONG + ".png"],
    "--repeat": ["1", "0", "x"],
    "--data": ["d", "d.npz", "synthetic", "missing", "folder", "binary.swp", "wide", "fifo", "withfifo", LONG,
               "m.swp/d"],
    "--eval": ["d", "d.npz", "missing", "folder", "wide", "fifo", LONG],
    "--epochs": ["1", "2", "0", "x"],
    "--save": ["ck.st", "new.st", "/proc/x.st", "folder", "missing/x.st", "fifo", "link.plan", LONG + ".st"],
    "--save-every": ["1", "0", "x"],
    "--eval-every": ["1", "0", "x"],
    "--resume": ["ck.st", "binary.swp", "missing.st", "m.plan", "l.jsonl", "fifo", LONG + ".st"],
    "--init": ["ck.st", "binary.swp", "missing.st", "empty.swp", "fifo", LONG + ".st", "m.swp/ck.st"],
    "--log": ["l.jsonl", "/proc/x.jsonl", "folder", "fifo", LONG + ".jsonl"],
    "--base": ["v100-16gb", "bogus"],
    "--precision": ["f32", "bf16", "f16", "f8", ""],
    "--on-nonfinite": ["stop", "continue", "skip", ""],
    "--guard": ["none", "skip", "scale", "always"],
    "--host-updates": ["none", "all", "auto", "some", ""],
    "--microbatches": ["2", "1", "auto", "3", "0", "x", "99999", ""],
    "--ranks": ["2", "1", "0", "x", "99999", "-1", ""],
    "--network": ["100", "0", "-5", "nan", "inf", "1e999", "x", ""],
    "--bucket-mib": ["25", "0", "0.0005", "-1", "nan", "inf", "1e999", "x", "", "auto"],
    "--rank-timeout": ["5", "0", "-1", "nan", "inf", "x", ""],
    "--dim": ["batch=2", "sequence=5", "x", "=3", "n=0", "n=99999999999"],
    "--loss": ["cross_entropy", "mse", "bogus", ""],
    "--target": ["y", "target", "input", "1x", "logits", ""],
    "--optimizer": ["adam(lr = 1e-3)", "sgd(lr = 0.1)", "bogus(", "adam(lr = -1)", "", "sgd(lr = 1) }\nmodel x() {"],
    "--batch": ["4", "0", "x", "-1", "99999999999"],
    "--freeze": ["features_.*", ".*", "(", "", "[a-"],
    "--weights": ["w.st", "/proc/x.st", "folder", "fifo", "ck.st", LONG + ".st"],
}
FLAGS = ["--json", "--check", "--ir", "--training", "--help", "--version", "--shuffle", "--f32"]
COMMANDS = ["check", "exec", "optimize", "simulate", "show", "profile", "plot-log", "bench", "predict", "import",
            "devices", "bogus"]
# what keeps a good command line short: no search of a minute, no zoo-wide bench
QUICK = {"optimize": ["--memory", "64KiB", "--budget", "0.2", "--generations", "2", "--workers", "1"],
         "bench": ["--models", "mlp", "--ratios", "2", "--methods", "lru", "--budget", "0.2"],
         "exec": ["--steps", "1"], "profile": ["--repeat", "1"], "plot-log": ["-o", "p.png"],
         "predict": ["--data", "d", "-o", "pred.npz"], "import": ["-o", "imp.swp"]}


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("cli")
    with_output = "    output label = argmax(logits)\n    report accuracy"  # (so `predict` gets past the model)
    write(d / "m.swp", (MODELS / "mlp.swp").read_text().replace("    report accuracy", with_output))
    assert main(["optimize", str(d / "m.swp"), "--memory", "64KiB", "--method", "belady", *SMALL,
                 "-o", str(d / "m.plan")]) == 0
    (d / "folder").mkdir()
    (d / "m.onnx").write_bytes((MODELS.parents[1] / "examples" / "digits_cnn.onnx").read_bytes())
    write(d / "empty.swp", "")
    (d / "binary.swp").write_bytes(bytes(range(256)))
    write(d / "plan.swp", (d / "m.plan").read_text())
    write(d / "model.plan", (MODELS / "mlp.swp").read_text())
    write(d / "bad.json", '{"name": "x", "memory_bytes": -1}')
    rng = np.random.default_rng(0)
    arrays = {"x": rng.standard_normal((9, 8)).astype(np.float32), "y": rng.integers(0, 10, 9).astype(np.int32)}
    (d / "d").mkdir()
    (d / "wide").mkdir()
    for name, a in arrays.items():
        np.save(d / "d" / f"{name}.npy", a)
        np.save(d / "wide" / f"{name}.npy", a.reshape(9, -1).repeat(2, axis=1))
    np.savez(d / "d.npz", **arrays)
    # special files: reading one would block, writing over one would replace it
    os.mkfifo(d / "fifo")
    os.mkfifo(d / "fifo.json")
    (d / "withfifo").mkdir()
    np.save(d / "withfifo" / "x.npy", arrays["x"])
    os.mkfifo(d / "withfifo" / "y.npy")
    (d / "link.plan").symlink_to(d / "folder" / "target.plan")
    assert main(["exec", str(d / "m.plan"), "--data", str(d / "d"), "--steps", "2", "--save", str(d / "ck.st"),
                 "--log", str(d / "l.jsonl")]) == 0
    return d


def command_line(rng: random.Random) -> list[str]:
    """Half the time a plausible command line (the first values of each list are good ones, and the
    file is of the kind the command takes), else anything at all."""
    if rng.random() < 0.5:
        return _plausible(rng)
    command = rng.choice(COMMANDS)
    argv = [command] + QUICK.get(command, [])
    if rng.random() < 0.8:
        argv.append(rng.choice(FILES))
    if rng.random() < 0.5:
        argv += SMALL
    for _ in range(rng.randint(0, 4)):
        if rng.random() < 0.2:
            argv.append(rng.choice(FLAGS))
        else:
            option = rng.choice(list(OPTIONS))
            argv += [option, rng.choice(OPTIONS[option])]
    return argv


def _plausible(rng: random.Random) -> list[str]:
    command = rng.choice(COMMANDS[:-2])
    plan = command in ("simulate", "show") or (command == "exec" and rng.random() < 0.5)
    target = "l.jsonl" if command == "plot-log" else "m.onnx" if command == "import" else \
        "m.plan" if plan else "m.swp"
    argv = [command] + QUICK.get(command, []) + ([] if command == "bench" else [target])
    if command in ("check", "exec", "optimize", "profile") and not plan:
        argv += SMALL
    if command == "profile":
        argv += ["-o", "p.json"]
    option = rng.choice(list(OPTIONS))
    return argv + ([option, rng.choice(OPTIONS[option][:2])] if rng.random() < 0.5 else [])


@pytest.mark.parametrize("argv", [
    ["check", LONG + ".swp"], ["exec", LONG + ".plan"], ["import", LONG + ".onnx", "-o", "imp.swp"],
    ["exec", "m.swp", *SMALL, "--steps", "1", "--init", LONG + ".st"], ["simulate", "m.swp/x.plan"],
    ["exec", "m.swp", *SMALL, "--steps", "1", "--data", LONG], ["plot-log", LONG + ".jsonl", "-o", "p.png"],
    ["optimize", "m.swp", *SMALL, "--memory", "64KiB", "--method", "belady", "-o", LONG + ".plan"],
    ["optimize", "m.swp", *SMALL, "--memory", "64KiB", "--method", "belady", "--device", LONG + ".json"],
    ["exec", "m.swp", *SMALL, "--steps", "1", "--log", LONG + ".jsonl"], ["show", "m.plan", "--plot", LONG + ".png"],
    ["predict", "m.swp", *SMALL, "--data", "d", "--init", LONG + ".st", "-o", "p.npz"],
    ["import", "m.onnx", "-o", "imp.swp", "--weights", LONG + ".safetensors"],
])
def test_a_name_the_system_refuses_is_said_once(folder: Path, monkeypatch: pytest.MonkeyPatch, argv: list[str]) -> None:
    """A part of a path over 255 bytes was OSError's traceback (exit 1) in every command; a path under a
    file, in some."""
    monkeypatch.chdir(folder)
    run = run_cli(argv)
    assert run.code == 2 and run.out == "" and run.err.startswith("error: "), run.crash or run.err
    assert ("File name too long" in run.err or "Not a directory" in run.err or "longer than" in run.err
            or "no such" in run.err.lower()), run.err
    assert run.err.splitlines()[0].count("`") % 2 == 0, run.err  # (a shortened name is quoted whole)
    flag = next((a for a, b in zip(argv, argv[1:]) if LONG in b and a.startswith("--")), None)
    # (an input by its flag: `init`, not --init, was said; an output by its kind: "the plot's file name")
    said = {"--device": "the device profile `"}.get(flag, flag)
    assert flag is None or said in run.err.splitlines()[0] or "'s file name" in run.err, run.err
    assert not any(os.path.exists(a) for a in argv if LONG in a)  # (os.path.exists: False where stat fails)


def test_random_command_lines_end_cleanly(folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(folder)
    rng = random.Random(int(os.environ.get("SWAPDSL_FUZZ_SEED", "0")))
    bad = []
    for i in range(CASES):
        argv = command_line(rng)
        run = run_cli(argv, limit_s=30)
        help_or_version = "--help" in argv or "--version" in argv
        clean = (run.code == 0 or (run.code == 2 and run.err.startswith("error: ") and run.out == "")
                 or (run.code is None and help_or_version and "SystemExit: 0" in run.crash))
        if not clean:
            bad.append(f"case {i}: swapdsl {' '.join(argv)} -> exit {run.code}: {run.crash or run.err[-400:]}")
    assert not bad, "\n".join(bad)
