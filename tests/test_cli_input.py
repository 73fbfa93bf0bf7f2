"""Bad command lines and signals: one clear message and exit code 2 (130 for Ctrl-C), never a traceback,
nothing half-written, no process left behind."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from conftest import MODELS, REPO, write

TINY = ["-D", "batch=4", "-D", "width=4", "-D", "blocks=1"]


@pytest.mark.parametrize("args", [
    ["optimize", "m.swp", "--memory", "8MiB", "--seed", "-1"],
    ["optimize", "m.swp", "--memory", "8MiB", "--budget", "nan"],
    ["optimize", "m.swp", "--memory", "8MiB", "--budget", "inf"],
    ["optimize", "m.swp", "--memory", "8MiB", "--budget", "0"],
    ["optimize", "m.swp", "--memory", "8MiB", "--generations", "0"],
    ["optimize", "m.swp", "--memory", "8MiB", "--population", "1"],
    ["optimize", "m.swp", "--memory", "8MiB", "--workers", "1000"],
    ["optimize", "m.swp", "--memory", "8MiB", "--polish", "1"],
    ["optimize", "m.swp", "--memory", "8MiB", "--polish", "-0.5"],
    ["optimize", "m.swp", "--memory", "8MiB", "--polish", "nan"],
    ["exec", "m.swp", "--seed", "-1"],
    ["exec", "m.swp", "--steps", "0"],
    ["bench", "--budget", "nan"],
    ["bench", "--ratios", "nan"],  # (a traceback: the cap was int(no_swap / nan))
    ["bench", "--ratios", "inf"],
    ["bench", "--ratios", "2,4,2"],
    ["bench", "--methods", "lru,ga,lru"],
    ["bench", "--methods", "lru,bogus"],
], ids=lambda a: " ".join(a[1:]) if isinstance(a, list) else a)
def test_bad_numbers_are_refused_by_the_parser(cli, args: list[str]) -> None:
    code, out, err = cli(*args)
    assert code == 2 and out == ""
    assert err.startswith("error: argument --") and "Traceback" not in err
    assert err.splitlines()[-1].startswith("  = hint: see `swapdsl ")


@pytest.mark.parametrize("args, said, hint", [
    (["optimize", "M", "--memroy", "8MiB"], "unrecognized option --memroy", "did you mean --memory?"),
    (["optimize", "M", "--memory", "8MiB", "--budgte", "5"], "unrecognized arguments: --budgte 5",
     "did you mean --budget?"),
    (["exec", "M", "--stpes", "3"], "unrecognized arguments: --stpes 3", "did you mean --steps?"),
    (["optimize", "M", "--zzzz", "1"], "unrecognized option --zzzz", None),
    # a prefix argparse takes is no misspelling; nor is anything after `--`
    (["optimize", "--mem", "8MiB"], "the following arguments are required: FILE.swp", None),
    (["optimize", "M", "-o", "x.plan", "--", "--memroy"], "the following arguments are required: --memory", None),
    (["optimise", "M"], "argument COMMAND: invalid choice: 'optimise'", "did you mean optimize?"),
    (["zzzz"], "argument COMMAND: invalid choice: 'zzzz'", None),
])
def test_a_misspelt_option_is_named_with_the_one_it_is_close_to(cli, args: list[str], said: str,
                                                               hint: str | None) -> None:
    """argparse names a missing required option first (`--memory`), though the line has it misspelt."""
    code, out, err = cli(*[str(MODELS / "mlp.swp") if a == "M" else a for a in args])
    assert code == 2 and out == "" and err.startswith(f"error: {said}"), err
    assert (f"  = hint: {hint}" in err) == (hint is not None) and "Traceback" not in err, err


def test_a_plan_given_for_a_model_is_named_a_plan(cli, in_tmp: Path) -> None:
    assert cli("optimize", MODELS / "mlp.swp", "--memory", "4MiB", "--method", "lru", "-o", "m.plan")[0] == 0
    for argv in (["check", "m.plan"], ["optimize", "m.plan", "--memory", "4MiB", "-o", "n.plan"]):
        code, out, err = cli(*argv)
        assert code == 2 and "`m.plan` is a plan file, not a model" in err, err
    (in_tmp / "e.plan").write_text("")  # a damaged plan is read as a plan, by its name: not as a model
    for argv in (["exec", "e.plan"], ["predict", "e.plan", "--data", "d", "-o", "p.npz"]):
        code, out, err = cli(*argv)
        assert code == 2 and err.startswith("error: `e.plan` is not a plan file (plans start with `swapdsl-plan`)")
    (in_tmp / "log.jsonl").write_bytes(b"\x9e\x00binary")
    code, out, err = cli("plot-log", "log.jsonl", "-o", "x.png")
    assert code == 2 and "is not text (byte 0 is not UTF-8)" in err and "codec" not in err, err


@pytest.mark.parametrize("memory", ["1e30", str(2**63), "9999999TiB"])
def test_a_cap_past_the_limit_is_refused(cli, memory: str) -> None:
    code, _, err = cli("optimize", MODELS / "mlp.swp", "--memory", memory)
    assert code == 2 and err.startswith(f"error: the memory size `{memory}` is larger than the limit of 1 PiB")


@pytest.mark.parametrize("flag", ["--memory", "--host-memory"])
@pytest.mark.parametrize("size,expected", [("", "cannot read the memory size ``"), ("  ", "cannot read"),
                                           ("1.5PiB", "is larger than the limit of 1 PiB"),
                                           ("8G", "`G` could mean 8GiB (GiB: powers of 2) or 8GB (powers of 10)"),
                                           ("2ki", "`ki` could mean 2KiB (KiB: powers of 2) or 2KB (powers of 10)"),
                                           ("-5%", "cannot read the memory size `-5%`"),
                                           ("-1MiB", "cannot read the memory size `-1MiB`"),
                                           ("1.5", "the memory size `1.5` is not a whole number of bytes"),
                                           ("2.5B", "`2.5B` is not a whole number of bytes"),
                                           ("1e400", "`1e400` is larger than the limit of 1 PiB"),
                                           ("0.5", "`0.5` is not positive")])
def test_memory_sizes_are_read_or_refused(cli, flag: str, size: str, expected: str) -> None:
    argv = {"--memory": size, "--host-memory": "1GiB", "--method": "belady"} | {flag: size}
    code, out, err = cli("optimize", MODELS / "mlp.swp", *[x for kv in argv.items() for x in kv])
    assert code == 2 and out == "" and expected in err.splitlines()[0], err


def test_the_limit_itself_can_be_written_as_it_is_named() -> None:
    from swapdsl.common.units import MAX_BYTES, parse_size

    assert parse_size("1PiB") == MAX_BYTES == parse_size("1024TiB") and parse_size("1PB") == 10**15


@pytest.mark.parametrize("define,expected", [("lr=nan", "expected a finite number"),
                                             ("lr=1e999", "expected a finite number"),
                                             ("hidden=99999999999999999999999999", "expected an integer below 2**63")])
def test_bad_defines_are_refused(cli, define: str, expected: str) -> None:
    code, _, err = cli("check", MODELS / "mlp.swp", "-D", define)
    assert code == 2 and expected in err.splitlines()[0]


def test_an_unwritable_output_is_refused_before_the_search(cli, monkeypatch: pytest.MonkeyPatch,
                                                           in_tmp: Path) -> None:
    import swapdsl.api

    def no_search(*args: object, **kw: object) -> None:
        raise AssertionError("searched before checking -o")

    monkeypatch.setattr(swapdsl.api, "optimize", no_search)
    for target, why in [("/proc/x.plan", "cannot write the plan `/proc/x.plan`"),
                        ("missing/x.plan", "folder `missing` does not exist"), (".", "is a directory"),
                        ("m.swp/x.plan", "cannot write `m.swp/x.plan`: `m.swp` is a file, not a folder")]:
        (in_tmp / "m.swp").write_text("")
        code, _, err = cli("optimize", MODELS / "mlp.swp", "--memory", "8MiB", "-o", target)
        assert code == 2 and why in err.splitlines()[0]


def _raising(err: BaseException):  # noqa: ANN202
    def run(*args: object, **kw: object) -> None:
        raise err

    return run


class CUDARuntimeError(RuntimeError):  # (CuPy's names and their status attribute)
    def __init__(self, status: int) -> None:
        super().__init__(f"cudaError {status}")
        self.status = status


class OutOfMemoryError(MemoryError):
    pass


@pytest.mark.parametrize("err", [CUDARuntimeError(2), OutOfMemoryError("out of memory allocating 512 bytes")])
def test_a_gpu_out_of_memory_beside_the_arena_is_an_error_not_a_traceback(cli, monkeypatch: pytest.MonkeyPatch,
                                                                         err: BaseException) -> None:
    """A library beside the arena (cuBLAS, cuDNN, NCCL, a CUDA graph) or another process may take the GPU's
    last bytes: CUDA's or CuPy's failure to allocate is told as such, exit 2; any other CUDA error is a bug
    (its traceback), and the host's MemoryError keeps its own message."""
    import swapdsl.api

    monkeypatch.setattr(swapdsl.api, "execute", _raising(err))
    code, _, said = cli("exec", MODELS / "mlp.swp", "--backend", "numpy", "--steps", "1")
    assert code == 2 and said.startswith("error: the GPU ran out of memory beside the plan's arena"), said
    assert "= hint: plan for a --memory cap that leaves some of the GPU free" in said
    monkeypatch.setattr(swapdsl.api, "execute", _raising(MemoryError()))
    assert cli("exec", MODELS / "mlp.swp", "--backend", "numpy", "--steps", "1")[2].startswith(
        "error: ran out of memory\n  = hint: a smaller model")
    monkeypatch.setattr(swapdsl.api, "execute", _raising(CUDARuntimeError(700)))
    with pytest.raises(CUDARuntimeError):
        cli("exec", MODELS / "mlp.swp", "--backend", "numpy", "--steps", "1")


def test_host_memory_that_cannot_be_pinned_is_named_so(monkeypatch: pytest.MonkeyPatch) -> None:
    """cudaHostAlloc's out-of-memory is a CUDA error, as a GPU's would be: the host copies' pinned memory
    says it is the host's, with its size; any other CUDA error is left alone; what is pinned is exactly
    what is asked for."""
    import sys
    from types import SimpleNamespace

    from swapdsl.common.errors import SwpError
    from swapdsl.runtime.backend import pinned

    def cupy(status: int | None):  # noqa: ANN202
        asked: list[int] = []

        def host_alloc(nbytes: int) -> bytearray:
            asked.append(nbytes)
            if status is not None:
                raise CUDARuntimeError(status)
            return bytearray(nbytes)

        return SimpleNamespace(cuda=SimpleNamespace(PinnedMemory=host_alloc, asked=asked,
                                                    PinnedMemoryPointer=lambda mem, offset: mem))

    monkeypatch.setitem(sys.modules, "cupy", cupy(2))
    with pytest.raises(SwpError, match=r"^the plan's host copies: 3\.00 MiB of page-locked host memory could not"):
        pinned(3 << 20, "uint8", "the plan's host copies")
    monkeypatch.setitem(sys.modules, "cupy", cupy(700))
    with pytest.raises(CUDARuntimeError):
        pinned((4, 4), "float32", "a bucket")
    exact = cupy(None)  # exactly what is asked for: CuPy's pinned pool would round 5 MiB up to 8
    monkeypatch.setitem(sys.modules, "cupy", exact)
    got = pinned((5, 1 << 18), "float32", "the plan's host copies")
    assert got.shape == (5, 1 << 18) and got.dtype == np.float32 and exact.cuda.asked == [5 << 20]


def test_a_model_too_large_for_this_machine_says_how_much(cli) -> None:
    code, _, err = cli("exec", MODELS / "mlp.swp", "-D", "batch=100000000", "--backend", "numpy")
    assert code == 2
    assert err.startswith("error: training `mlp` with no cap needs ")
    assert "but there is only" in err.splitlines()[0]


def test_stale_temporary_files_are_cleaned_on_the_next_write(cli, in_tmp: Path) -> None:
    """A writer killed during the atomic write leaves `.NAME.PID.*.tmp`; the next write removes it
    when that process is gone, and leaves a live writer's alone."""
    write(in_tmp / "m.swp", (MODELS / "mlp.swp").read_text())
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = in_tmp / f".m.plan.{dead.pid}.abc123.tmp"
    live = in_tmp / f".m.plan.{os.getpid()}.def456.tmp"
    stale.write_text("half a plan")
    live.write_text("being written")
    code, _, err = cli("optimize", "m.swp", "--memory", "8MiB", "--method", "belady", "-o", "m.plan")
    assert code == 0, err
    assert not stale.exists() and live.exists()


def _swapdsl(*args: str, **kw: object) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen([sys.executable, "-m", "swapdsl", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, **kw)  # type: ignore[call-overload]


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_during_exec_exits_128_plus_its_number_quietly(in_tmp: Path, sig: signal.Signals) -> None:
    write(in_tmp / "m.swp", (MODELS / "tiny_resnet.swp").read_text())
    proc = _swapdsl("exec", "m.swp", "--steps", "100000", "--backend", "numpy", *TINY)
    assert proc.stdout is not None
    while "loss" not in proc.stdout.readline():  # the header, then a first step
        pass
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + sig  # 130 for Ctrl-C, 143 for SIGTERM
    assert re.fullmatch(r"swapdsl: interrupted after step \d+\n", err)  # the step under way was finished


def test_ctrl_c_while_the_libraries_load_exits_130_quietly() -> None:
    """The Ctrl-C lands (deterministically) as the command's modules import: no import traceback."""
    stub = ("import builtins, sys\n"
            "real = builtins.__import__\n"
            "def imports(name, *args, **kw):\n"
            "    if name == 'swapdsl.cli':\n"
            "        raise KeyboardInterrupt\n"
            "    return real(name, *args, **kw)\n"
            "builtins.__import__ = imports\n"
            "from swapdsl.entry import main\n"
            "sys.exit(main())\n")
    done = subprocess.run([sys.executable, "-c", stub, "check"], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert (done.returncode, done.stderr) == (130, "swapdsl: interrupted\n")


def test_ctrl_c_during_a_search_writes_the_best_plan_and_exits_130(in_tmp: Path) -> None:
    write(in_tmp / "m.swp", (MODELS / "tiny_resnet.swp").read_text())
    proc = _swapdsl("optimize", "m.swp", "--memory", "6MiB", "--budget", "120", "--workers", "1", "-o", "m.plan",
                    *TINY)
    assert proc.stderr is not None
    while "generation" not in proc.stderr.readline():  # the first progress line: the search is under way
        pass
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "ga: interrupted after" in err and err.endswith("swapdsl: stopped by SIGINT\n")
    assert "written to m.plan" in out and (in_tmp / "m.plan").read_text().startswith("swapdsl-plan")


def _workers_of(marker: str) -> list[int]:
    out = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


@pytest.mark.skipif(not sys.platform.startswith("linux") or (os.cpu_count() or 1) < 2,
                    reason="needs Linux (pgrep, PR_SET_PDEATHSIG) and two cores for worker processes")
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_a_stopped_search_leaves_no_workers(in_tmp: Path, sig: signal.Signals) -> None:
    """SIGTERM ends the search like Ctrl-C (the best plan so far is written); SIGKILL takes the workers
    with it. Either way no worker process outlives the search."""
    model = in_tmp / f"marker{int(sig)}x{os.getpid()}.swp"
    write(model, (MODELS / "tiny_resnet.swp").read_text())
    proc = _swapdsl("optimize", str(model), "--memory", "6MiB", "--budget", "120", "--workers", "2", "-o", "m.plan")
    deadline = time.monotonic() + 60
    while len(_workers_of(model.name)) < 3 and time.monotonic() < deadline:  # the search and its two workers
        time.sleep(0.1)
    assert len(_workers_of(model.name)) >= 3
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    deadline = time.monotonic() + 10
    while _workers_of(model.name) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _workers_of(model.name) == []
    if sig == signal.SIGTERM:
        assert proc.returncode == 143, err  # 128 + SIGTERM, and the best plan so far is written
        assert (in_tmp / "m.plan").read_text().startswith("swapdsl-plan")
        assert err.endswith("swapdsl: stopped by SIGTERM\n"), err


@pytest.mark.parametrize("text,expected", [
    ("[" * 100_000, "nested too deeply"),
    ("[]", "expected one JSON object"),
    ('{"name": "x"}', "is not a valid device profile"),
])
def test_bad_device_profiles_are_refused(cli, in_tmp: Path, text: str, expected: str) -> None:
    import json

    from swapdsl.devices.profiles import BUILTIN

    write(in_tmp / "p.json", text)
    code, out, err = cli("optimize", MODELS / "mlp.swp", "--memory", "8MiB", "--device", "p.json")
    assert code == 2 and out == "" and expected in err.splitlines()[0], err
    good = BUILTIN["v100-16gb"].to_json()
    for key, value in [("mem_bw", float("nan")), ("compute_efficiency", 0), ("flops", {"f32": -1.0}),
                       ("flops", {"f16": 1e12}), ("memory_bytes", 1.5), ("op_times", {"matmul": "inf"}),
                       ("memory_bytes", True), ("mem_bw", True), ("compute_efficiency", 1e300), ("flops", [1, 2]),
                       ("flops", {"f32": 1e12, "f8": 1e15}), ("memory_efficiency", 1.5), ("copy_latency_s", -1)]:
        write(in_tmp / "p.json", json.dumps({**good, key: value}))
        code, _, err = cli("optimize", MODELS / "mlp.swp", "--memory", "8MiB", "--device", "p.json")
        assert code == 2 and "is not a valid device profile" in err and "Traceback" not in err, (key, err)
    write(in_tmp / "p.json", json.dumps({k: v for k, v in good.items() if k != "flops"}))
    code, _, err = cli("optimize", MODELS / "mlp.swp", "--memory", "8MiB", "--device", "p.json")
    assert code == 2 and err.splitlines()[0].endswith("is not a valid device profile: missing field flops"), err
    os.mkfifo(in_tmp / "f.json")
    code, _, err = cli("optimize", MODELS / "mlp.swp", "--memory", "8MiB", "--device", "f.json")
    assert code == 2 and "is not a regular file" in err


@pytest.mark.parametrize("argv", [["check", "fifo"], ["optimize", "fifo", "--memory", "1MiB"], ["simulate", "fifo"],
                                  ["show", "fifo"], ["exec", "fifo"], ["plot-log", "fifo", "-o", "x.png"]])
def test_a_fifo_given_as_input_is_refused_not_read_forever(cli, in_tmp: Path, argv: list[str]) -> None:
    os.mkfifo(in_tmp / "fifo")
    code, out, err = cli(*argv)
    assert code == 2 and out == "" and "is not a regular file" in err.splitlines()[0], err


def test_a_cap_beyond_the_device_plans_with_a_note(cli, in_tmp: Path) -> None:
    code, out, err = cli("optimize", MODELS / "mlp.swp", "--memory", "17GiB", "--method", "belady")
    assert code == 0, err
    assert out.splitlines()[-1] == ("  note: the cap is more than the 16.00 GiB v100-16gb has: a study of the plan, "
                                    "not one that runs there (--device names the GPU to plan for)")
    code, out, _ = cli("optimize", MODELS / "mlp.swp", "--memory", "16GiB", "--method", "belady")
    assert code == 0 and "note: the cap" not in out


def test_cupy_only_flags_on_numpy_say_they_change_nothing(cli, in_tmp: Path) -> None:
    assert cli("optimize", MODELS / "mlp.swp", "--memory", "8MiB", "--method", "belady", "-o", "m.plan")[0] == 0
    code, out, err = cli("exec", "m.plan", "--steps", "1", "--backend", "numpy", "--tf32", "--graph", "off")
    assert code == 0, err
    assert out.splitlines()[1] == "  note: --tf32 and --graph off apply on CuPy only: nothing changes on numpy"
    code, out, _ = cli("exec", "m.plan", "--steps", "1", "--backend", "numpy")
    assert "CuPy only" not in out


def test_bench_out_never_writes_over_a_model_or_profile_it_reads(cli, in_tmp: Path) -> None:
    model = in_tmp / "bench.md"
    model.write_text((MODELS / "mlp.swp").read_text())
    before = model.read_bytes()
    code, _, err = cli("bench", "--models", model, "--ratios", "2", "--methods", "lru", "--out", in_tmp)
    assert code == 2 and "is the model" in err and "writing it would destroy it" in err
    assert model.read_bytes() == before and sorted(p.name for p in in_tmp.iterdir()) == ["bench.md"]


def test_bench_models_are_named_with_commas_as_ratios_and_methods_are(cli, in_tmp: Path) -> None:
    """`--models gpt,bert` looked for a file `gpt,bert.swp`; a file whose name has a comma is still one model."""
    odd = in_tmp / "a,b.swp"
    odd.write_text((MODELS / "mlp.swp").read_text())
    runs = [cli("bench", "--models", *models, "--ratios", "2", "--methods", "lru", "--json")
            for models in (["mlp,tiny_resnet"], ["mlp", "tiny_resnet"], ["mlp,", str(odd)])]
    assert all(code == 0 for code, _, _ in runs), runs
    rows = [[{k: v for k, v in r.items() if k != "search_seconds"} for r in json.loads(out)] for _, out, _ in runs]
    assert rows[0] == rows[1] and [r["model"] for r in rows[0]] == ["mlp", "tiny_resnet"]
    assert [r["model"] for r in rows[2]] == ["mlp", "a,b"]
    code, _, err = cli("bench", "--models", ",", "--ratios", "2", "--methods", "lru")
    assert code == 2 and err.startswith("error: --models names no model"), err
    code, _, err = cli("bench", "--models", "dir,x/m.swp", "--ratios", "2", "--methods", "lru")
    assert code == 2 and err.startswith("error: no such file: `dir,x/m.swp`"), err  # (a path, not names)


def test_a_ratio_whose_cap_passes_the_limit_is_refused(cli) -> None:
    code, out, err = cli("bench", "--models", "mlp", "--ratios", "1e-300", "--methods", "lru")
    assert code == 2 and "beyond the limit of 1,125,899,906,842,624 (1 PiB)" in err and "Traceback" not in err


def test_a_least_cap_past_the_limit_is_not_offered_as_a_memory_size(cli) -> None:
    """The hint said `use --memory 2406312000000512 or more`, which --memory then refuses."""
    code, _, err = cli("optimize", MODELS / "mlp.swp", "-D", "batch=2000000000", "-D", "hidden=100000",
                       "--memory", "1PiB", "--method", "belady")
    assert code == 2 and "hint: it is past the largest cap swapdsl plans under, 1024.00 TiB" in err
    assert "use --memory" not in err, err


@pytest.mark.parametrize("method, flags, notes", [
    ("belady", ["--budget", "9", "--generations", "5", "--polish", "0.5"],
     ["--budget, --generations, --polish do nothing with --method belady (ga's search flags)"]),
    ("exact", ["--budget", "1", "--seed", "3", "--network", "10"],
     ["--seed does nothing with --method exact (ga's search flags; exact reads --budget)",
      "--network does nothing on one rank (no gradients are averaged)"]),
    ("ga", ["--generations", "2", "--seed", "3", "--workers", "1"], []),
])
def test_flags_that_change_nothing_are_said_to(cli, method: str, flags: list[str], notes: list[str]) -> None:
    """A search flag given to a method that does not search, or an all-reduce flag to one rank, was taken in
    silence."""
    code, out, err = cli("optimize", MODELS / "mlp.swp", "--memory", "100%", "--method", method, *flags)
    said = [line.removeprefix("  note: ") for line in out.splitlines() if "do nothing" in line or "does nothing" in line]
    assert code == 0 and said == notes, out + err


def test_parameters_the_loss_does_not_reach_are_named(cli, in_tmp: Path) -> None:
    """A loss that reaches no parameter (`minimize sum(x)`), or a parameter nothing reads, checked, planned and
    trained at a constant loss in silence."""
    (in_tmp / "m.swp").write_text("model m(batch = 4) {\n    input x: f32[batch, 3]\n"
                                  "    param w: [3, 2] = normal(std = 0.1)\n"
                                  "    param u: [3, 2] = normal(std = 0.1)\n    h = x @ w\n"
                                  "    minimize sum(h) + sum(cast(argmax(x @ u), f32)) with sgd(lr = 0.1)\n}\n")
    note = "the loss does not depend on `u`: no gradient reaches it, so training leaves it as it starts"
    for argv in (["check", "m.swp", "--training"], ["exec", "m.swp", "--steps", "1"],
                 ["optimize", "m.swp", "--memory", "100%", "--method", "belady", "-o", "m.plan"],
                 ["exec", "m.plan", "--steps", "1"]):
        code, out, err = cli(*argv)
        assert code == 0 and out.count(note) + err.count(note) == 1, (argv, out, err)
        code, out, err = cli(*argv, "--json")  # (--json carries the notes too)
        assert code == 0 and json.loads(out)["notes"] == [note], (argv, out, err)
    code, out, _ = cli("check", MODELS / "mlp.swp", "--training")
    assert code == 0 and "does not depend" not in out
    assert json.loads(cli("check", MODELS / "mlp.swp", "--training", "--json")[1])["notes"] == []
    loss = next(line for line in out.splitlines() if line.lstrip().startswith("loss "))
    assert loss.split()[1:5] == ["softmax_cross_entropy(...)", "at", "line", "12,"], loss  # (it said `%62`)


@pytest.mark.parametrize("batch", ["-4", "0"])
def test_a_batch_below_one_is_refused_by_micro_batches_too(cli, batch: str) -> None:
    """`-D batch=-4 --microbatches 3` was isqrt's traceback once divisors took square roots."""
    code, _, err = cli("optimize", MODELS / "mlp.swp", "-D", f"batch={batch}", "--microbatches", "3",
                       "--memory", "1GiB", "--method", "belady")
    assert code == 2 and err.startswith(f"error: a batch of {batch} does not split into micro-batches"), err


def test_a_missing_plan_with_check_is_a_missing_file(cli, in_tmp: Path) -> None:
    """`exec typo.plan --check` said --check needs a .plan file; without --check it said no such file."""
    for argv in (["exec", "typo.plan", "--check"], ["exec", "typo.plan"]):
        code, out, err = cli(*argv)
        assert code == 2 and out == "" and err.startswith("error: no such file: `typo.plan`"), (argv, err)


def test_a_model_run_on_the_wrong_number_of_ranks_is_not_called_a_plan(cli) -> None:
    """`exec model.swp --ranks 2` without mpiexec said "the plan runs on 2 ranks ... or plan again"."""
    code, _, err = cli("exec", MODELS / "mlp.swp", "--ranks", "2", "--steps", "1")
    assert code == 2 and err.startswith("error: --ranks 2 runs the model on 2 ranks and this run has 1"), err
    assert "plan again" not in err and "hint: or give --ranks 1" in err
