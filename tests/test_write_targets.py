"""Where a command writes (-o, --save, --log's plot, show --plot, profile -o): regular files are replaced
atomically, symbolic links are followed, and anything else (a device, a FIFO, a socket) is refused before
any work and left as it was."""

from __future__ import annotations

import os
import socket
import stat
from pathlib import Path

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
