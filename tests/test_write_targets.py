"""Where a command writes (-o, --save, --log's plot, show --plot, profile -o): regular files are replaced
atomically, symbolic links are followed, and anything else (a device, a FIFO, a socket) is refused before
any work and left as it was."""

from __future__ import annotations

import os
import re
import socket
import stat
from pathlib import Path

import numpy as np
import pytest

from conftest import MODELS, write
from swapdsl.common.atomic import write_text_atomically
from swapdsl.common.errors import SwpError

MLP = ["-D", "batch=4", "-D", "features=8", "-D", "hidden=8", "-D", "depth=1"]


def _specials(folder: Path) -> dict[str, Path]:
    fifo = folder / "fifo"
    os.mkfifo(fifo)
    sock = folder / "sock"
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(sock))
    s.close()
    found = {"a FIFO": fifo, "a socket": sock}
    if os.geteuid() == 0:  # a private /dev/null (1, 3): a regression must not replace the machine's own
        os.mknod(folder / "null", 0o666 | stat.S_IFCHR, os.makedev(1, 3))
        found["a character device"] = folder / "null"
    return found


@pytest.mark.parametrize("kind", ["a FIFO", "a socket", "a character device"])
def test_a_target_that_is_not_a_regular_file_is_refused_and_kept(cli, in_tmp: Path, kind: str) -> None:
    specials = _specials(in_tmp)
    if kind not in specials:
        pytest.skip("making a character device needs root")
    target = specials[kind]
    mode = target.stat().st_mode
    write(in_tmp / "m.swp", (MODELS / "mlp.swp").read_text())
    for argv in (["optimize", "m.swp", "--memory", "8MiB", "--method", "belady", *MLP, "-o", target],
                 ["exec", "m.swp", *MLP, "--steps", "1", "--save", target],
                 ["exec", "m.swp", *MLP, "--steps", "1", "--log", target],
                 ["profile", "m.swp", *MLP, "--repeat", "1", "-o", target]):
        code, out, err = cli(*argv)
        assert code == 2, (argv, err)
        assert err.splitlines()[0] == f"error: cannot write the {_what(argv)} `{target}`: it is {kind}, not a " \
                                      "regular file"
        assert out == ""  # refused before any work
        assert target.stat().st_mode == mode  # still what it was


def _what(argv: list) -> str:
    flag = argv[-2]
    return {"-o": "plan" if argv[0] == "optimize" else "profile", "--save": "checkpoint", "--log": "log"}[flag]


def test_plots_refuse_special_targets_too(cli, in_tmp: Path) -> None:
    fifo = _specials(in_tmp)["a FIFO"]
    write(in_tmp / "m.swp", (MODELS / "mlp.swp").read_text())
    assert cli("optimize", "m.swp", "--memory", "8MiB", "--method", "belady", *MLP, "-o", "m.plan")[0] == 0
    code, _, err = cli("show", "m.plan", "--plot", fifo)
    assert code == 2 and "it is a FIFO, not a regular file" in err
    assert stat.S_ISFIFO(fifo.stat().st_mode)


def test_a_symlink_is_followed_and_its_target_replaced_in_its_own_folder(in_tmp: Path) -> None:
    (in_tmp / "real").mkdir()
    real = in_tmp / "real" / "out.txt"
    real.write_text("old")
    link = in_tmp / "link.txt"
    link.symlink_to(real)
    write_text_atomically(link, "new")
    assert link.is_symlink() and os.readlink(link) == str(real)
    assert real.read_text() == "new"
    assert sorted(p.name for p in in_tmp.iterdir()) == ["link.txt", "real"]  # no temporary file left here


def test_a_dangling_symlink_creates_its_target(in_tmp: Path) -> None:
    link = in_tmp / "link.txt"
    link.symlink_to(in_tmp / "made.txt")
    write_text_atomically(link, "x")
    assert (in_tmp / "made.txt").read_text() == "x" and link.is_symlink()


def test_a_symlink_to_a_fifo_is_refused(in_tmp: Path) -> None:
    link = in_tmp / "link"
    link.symlink_to(_specials(in_tmp)["a FIFO"])
    with pytest.raises(SwpError, match="it is a FIFO, not a regular file"):
        write_text_atomically(link, "x")


def _digest(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def test_no_output_may_replace_an_input_or_another_output(cli, in_tmp: Path) -> None:
    """Each way the outside check overwrote an input (the same name, a link of either kind, a file in a
    data folder, two outputs on one file) is refused before any work, every file kept byte for byte."""
    write(in_tmp / "m.swp", (MODELS / "mlp.swp").read_text())
    assert cli("optimize", "m.swp", "--memory", "8MiB", "--method", "belady", *MLP, "-o", "m.plan")[0] == 0
    assert cli("exec", "m.plan", "--steps", "1", "--save", "c.safetensors")[0] == 0
    (in_tmp / "data").mkdir()
    np.save(in_tmp / "data" / "x.npy", np.zeros((4, 8), np.float32))
    np.save(in_tmp / "data" / "y.npy", np.zeros(4, np.int32))
    np.savez(in_tmp / "d.npz", x=np.zeros((4, 8), np.float32), y=np.zeros(4, np.int32))
    (in_tmp / "link.plan").symlink_to("m.swp")
    os.link(in_tmp / "m.swp", in_tmp / "hard.plan")
    os.link(in_tmp / "data" / "x.npy", in_tmp / "x.npz")
    (in_tmp / "log.jsonl").write_text("")
    (in_tmp / "log.png").symlink_to("log.jsonl")
    before = _digest(in_tmp)
    for argv, said in [
        (["optimize", "m.swp", "--memory", "8MiB", *MLP, "-o", "link.plan"], "the plan `link.plan` is the model"),
        (["optimize", "m.swp", "--memory", "8MiB", *MLP, "-o", "hard.plan"], "the plan `hard.plan` is the model"),
        (["exec", "m.plan", "--steps", "1", "--data", "d.npz", "--log", "c.jsonl", "--save", "c.safetensors",
          "--init", "c.safetensors"], None),  # (a checkpoint over the one it starts from: allowed)
        (["predict", "m.plan", "--data", "d.npz", "-o", "d.npz"], "the prediction `d.npz` is the data `d.npz`"),
        (["predict", "m.plan", "--data", "data", "-o", "x.npz"], "is the data `data` (a file in `data`)"),
        (["plot-log", "log.jsonl", "-o", "log.png"], "the plot `log.png` is the log `log.jsonl`"),
        (["exec", "m.plan", "--steps", "1", "--log", "c.jsonl", "--save", "c.safetensors", "--eval", "data"], None),
    ]:
        code, out, err = cli(*argv)
        if said is None:
            assert code == 0, (argv, err)
            before = _digest(in_tmp)
            continue
        assert code == 2 and said in err and "writing it would destroy it" in err, (argv, err)
        assert out == "" and _digest(in_tmp) == before, argv
    code, _, err = cli("exec", "m.plan", "--steps", "1", "--save", "two.safetensors", "--log", "two.safetensors")
    assert code == 2 and "log files take `.jsonl`" in err
    for _ in range(2):  # (what a run writes beside the arrays of a data folder is no input of the next)
        code, _, err = cli("exec", "m.plan", "--steps", "1", "--data", "data", "--save", "data/c.safetensors",
                           "--log", "data/run.json")
        assert code == 0, err


@pytest.mark.parametrize("flag, name, said", [
    ("-o", "", "the plan's file name is empty"),
    ("-o", "net.swp", "`net.swp` is named as a `.swp` file; plan files take `.plan`"),
    ("-o", "net.npz", "plan files take `.plan`"),
])
def test_an_output_named_for_another_kind_of_file_is_refused(cli, in_tmp: Path, flag: str, name: str,
                                                             said: str) -> None:
    write(in_tmp / "m.swp", (MODELS / "mlp.swp").read_text())
    code, out, err = cli("optimize", "m.swp", "--memory", "8MiB", "--method", "belady", *MLP, flag, name)
    assert code == 2 and said in err and out == ""
    assert sorted(p.name for p in in_tmp.iterdir()) == ["m.swp"]


def test_import_refuses_weights_over_its_model_or_its_source(tmp_path: Path) -> None:
    onnx_file = Path(__file__).parent.parent / "examples" / "digits_cnn.onnx"
    copy = tmp_path / "cnn.onnx"
    copy.write_bytes(onnx_file.read_bytes())
    from swapdsl import api

    for out, weights, said in [(tmp_path / "i.swp", tmp_path / "i.swp", "weights files take `.safetensors`"),
                               (tmp_path / "i.swp", copy, "weights files take `.safetensors`")]:
        with pytest.raises(SwpError, match=re.escape(said)):
            api.import_onnx(str(copy), str(out), str(weights))
    (tmp_path / "w.safetensors").symlink_to(copy)
    with pytest.raises(SwpError, match="is the ONNX model"):
        api.import_onnx(copy, tmp_path / "i.swp", tmp_path / "w.safetensors")  # (paths as Path objects too)
    assert copy.read_bytes() == onnx_file.read_bytes() and not (tmp_path / "i.swp").exists()
