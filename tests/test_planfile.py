"""Plan files: exact round trips, atomic writes, and clear refusals of tampered plans."""

from __future__ import annotations

import json
import re
import struct
import sys
from pathlib import Path

import pytest

from conftest import MODELS, write
from swapdsl.common.units import parse_size
from swapdsl.plan.file import format_plan, parse_plan, read_plan

SMALL_RESNET = ["-D", "batch=4"]


@pytest.fixture
def plan_file(cli, in_tmp: Path) -> Path:
    model = write(in_tmp / "net.swp", (MODELS / "tiny_resnet.swp").read_text().replace("import layers", "import layers"))
    code, out, err = cli("optimize", model.name, "--memory", "3MiB", "--method", "lru", "-o", "net.plan",
                         "--json", *SMALL_RESNET)
    assert code == 0, err
    return in_tmp / "net.plan"


def test_round_trip_is_exact(plan_file: Path) -> None:
    text = plan_file.read_text()
    plan = parse_plan(text)
    assert format_plan(plan) == text
    assert parse_plan(format_plan(plan)) == plan


def test_optimize_json_has_the_figures(cli, plan_file: Path) -> None:
    code, out, _ = cli("optimize", "net.swp", "--memory", "3MiB", "--method", "belady", "--json", *SMALL_RESNET)
    assert code == 0
    info = json.loads(out)
    for key in ("method", "device", "memory_bytes", "ratio", "ideal_ms", "bound_ms", "iteration_ms", "fraction",
                "swap_bytes", "peak_device_bytes", "host_bytes", "search_seconds", "plan"):
        assert key in info
    assert info["memory_bytes"] == 3 * 2**20
    assert info["device"] == "v100-16gb"
    assert 0 < info["fraction"] <= 1
    assert info["plan"] is None


def test_simulate_recomputes_the_same_figures(cli, plan_file: Path) -> None:
    made = {k: v for k, v in read_plan(plan_file).figures}
    code, out, _ = cli("simulate", plan_file, "--json")
    assert code == 0
    again = json.loads(out)
    for key in ("iteration_ms", "ideal_ms", "fraction", "swap_bytes", "peak_device_bytes"):
        assert again[key] == pytest.approx(made[key])


def test_same_request_same_plan_byte_for_byte(cli, plan_file: Path) -> None:
    cli("optimize", "net.swp", "--memory", "3MiB", "--method", "lru", "-o", "again.plan", *SMALL_RESNET)
    assert (plan_file.parent / "again.plan").read_bytes() == plan_file.read_bytes()


def test_simulate_says_which_figures_are_recorded_and_where_they_disagree(cli, plan_file: Path) -> None:
    text = plan_file.read_text()
    plan_file.write_text("".join(x for x in text.splitlines(True) if not x.startswith(("figure ratio",
                                                                                      "figure no_swap_bytes",
                                                                                      "figure bound_ms"))))
    code, out, err = cli("simulate", plan_file)
    assert code == 0 and "Traceback" not in err, err
    assert "no bound recorded" in out and "memory ratio" not in out
    assert "note: the plan records no bound_ms or no_swap_bytes: those figures are left out" in out
    plan_file.write_text(re.sub(r"(?m)^figure bound_ms .*$", "figure bound_ms 1e-06", text))
    code, out, _ = cli("simulate", plan_file, "--json")
    assert code == 0 and json.loads(out)["bound_ms"] == 1e-06 and json.loads(out)["model_checked"]
    code, out, _ = cli("simulate", plan_file)
    assert "note: the recorded bound 1e-06 ms is not between the ideal step and this plan's step" in out


def test_a_plan_finds_its_model_beside_it_from_anywhere(cli, plan_file: Path, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    moved = tmp_path / "elsewhere" / "deeper"
    moved.mkdir(parents=True)
    (moved / "p.plan").write_text(plan_file.read_text().replace('model "net.swp"', 'model "models/net.swp"'))
    (moved / "net.swp").write_text((plan_file.parent / "net.swp").read_text())
    monkeypatch.chdir(tmp_path / "elsewhere")
    code, out, err = cli("simulate", "deeper/p.plan")
    assert code == 0 and out.startswith("deeper/p.plan: valid; simulated"), err
    (moved / "net.swp").write_text("model other(batch = 1) {}\n")
    code, out, err = cli("simulate", "deeper/p.plan")
    assert code == 2 and err.startswith("error: "), err
    (moved / "net.swp").unlink()
    code, out, err = cli("simulate", "deeper/p.plan")
    assert code == 0 and "valid (the plan alone: its model `models/net.swp` was not found" in out
    code, out, err = cli("exec", "deeper/p.plan", "--steps", "1")
    assert code == 2 and "cannot find the plan's model `models/net.swp`" in err and "beside the plan" in err


def tamper(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new, 1))


def test_changed_model_is_refused(cli, plan_file: Path) -> None:
    model = plan_file.parent / "net.swp"
    model.write_text(model.read_text() + "\n# an edit\n")
    code, out, err = cli("simulate", plan_file)
    assert code == 2 and out == ""
    assert err.splitlines()[0] == "error: the model `net.swp` has changed since this plan was made"


def test_unknown_tensor_is_refused(cli, plan_file: Path) -> None:
    text = plan_file.read_text()
    victim = next(line for line in text.splitlines() if line.startswith("swapin ")).split('"')[1]
    tamper(plan_file, f'swapin "{victim}"', 'swapin "nonexistent"')
    code, _, err = cli("simulate", plan_file)
    assert code == 2
    line = next(k for k, text in enumerate(plan_file.read_text().splitlines(), 1) if '"nonexistent"' in text)
    assert err.splitlines()[:2] == ["error: the program names `nonexistent`, which no tensor line declares",
                                    f" --> {plan_file}:{line}:1"]


@pytest.mark.parametrize("edit, said, at", [
    ((r"compute_efficiency 0\.6", "compute_efficiency 5"), "device figure `compute_efficiency` is 5.0; a share of "
                                                            "the peak is at most 1", "device"),
    ((r" mem_bw (\S+)", r" mem_bw \1 mem_bw 1.0"), "the device field `mem_bw` is given twice", "device"),
    ((r"(?m)^flops f16", "flops f8"), "`flops f8`: flops lines name f64, f32, f16, bf16, i32, i64", "flops f8"),
])
def test_device_lines_out_of_range_are_refused_at_their_line(cli, plan_file: Path, edit: tuple[str, str],
                                                             said: str, at: str) -> None:
    text = re.sub(*edit, plan_file.read_text(), count=1)
    plan_file.write_text(text)
    code, out, err = cli("simulate", plan_file)
    line = next(k for k, x in enumerate(text.splitlines(), 1) if x.startswith(at))
    assert (code, out) == (2, "") and err.splitlines()[:2] == [f"error: {said}", f" --> {plan_file}:{line}:1"], err


def test_bad_region_is_refused(cli, plan_file: Path) -> None:
    line = next(line for line in plan_file.read_text().splitlines() if line.startswith("swapin "))
    region = line.split()[2]
    tamper(plan_file, line, line.replace(f" {region} ", " @100+256 ", 1))
    code, _, err = cli("show", plan_file)
    assert code == 2
    assert "at offset 100, which is not a multiple of 256" in err.splitlines()[0]


def test_broken_invariant_is_refused(cli, plan_file: Path) -> None:
    lines = plan_file.read_text().splitlines()
    plan_file.write_text("\n".join(line for line in lines if not line.startswith("swapin ")) + "\n")
    code, _, err = cli("simulate", plan_file)
    assert code == 2
    assert err.startswith("error: plan breaks invariant 4 (an op finds its inputs resident")


def test_garbage_is_refused(cli, in_tmp: Path) -> None:
    write(in_tmp / "junk.plan", "swapdsl-plan 1\nmodel nonsense\n")
    code, _, err = cli("simulate", "junk.plan")
    assert code == 2
    assert err.splitlines()[:2] == ["error: `junk.plan` is not a valid plan: unexpected input at line 2",
                                    " --> junk.plan:2:7"]


def test_a_model_file_is_not_a_plan(cli) -> None:
    code, _, err = cli("simulate", MODELS / "mlp.swp")
    assert code == 2
    assert err.splitlines()[0] == f"error: `{MODELS / 'mlp.swp'}` is not a plan file (plans start with `swapdsl-plan`)"


def test_failed_write_leaves_nothing_behind(cli, plan_file: Path) -> None:
    before = plan_file.read_text()
    code, _, err = cli("optimize", "net.swp", "--memory", "1KiB", "-o", "net.plan", *SMALL_RESNET)
    assert code == 2 and "smallest feasible cap" in err
    assert plan_file.read_text() == before
    assert sorted(p.name for p in plan_file.parent.iterdir()) == ["net.plan", "net.swp"]


def test_below_feasible_cap_names_it(cli, plan_file: Path) -> None:
    code, _, err = cli("optimize", "net.swp", "--memory", "100KiB", *SMALL_RESNET)
    assert code == 2
    assert err.splitlines()[0].startswith("error: 100.00 KiB is below the smallest feasible cap for this model, ")
    assert any(line.startswith("  = hint: use --memory ") for line in err.splitlines())


def test_show_plot_writes_a_png(cli, plan_file: Path) -> None:
    code, out, err = cli("show", plan_file, "--plot", "timeline.png")
    assert code == 0, err
    png = (plan_file.parent / "timeline.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", png[16:24])
    assert (width, height) == (1320, 660)
    assert len(png) > 10_000
    assert "method          lru" in out


@pytest.mark.parametrize("suffix, magic", [(".pdf", b"%PDF-"), (".svg", b"<?xml"), ("", b"\x89PNG")])
def test_a_plot_is_written_in_the_format_its_name_asks_for_and_is_the_same_bytes_each_time(
        cli, plan_file: Path, suffix: str, magic: bytes) -> None:
    """`-o x.pdf` wrote PNG bytes under a PDF's name; PDF and SVG carry a date and random ids unless told not
    to, so the same plan drew different bytes."""
    drawn = []
    for name in ("a", "b"):
        code, _, err = cli("show", plan_file, "--plot", name + suffix)
        assert code == 0, err
        drawn.append((plan_file.parent / (name + suffix)).read_bytes())
    assert drawn[0].startswith(magic)
    assert drawn[0] == drawn[1]


def test_a_plot_named_for_a_format_it_cannot_be_is_refused_before_any_work(cli, plan_file: Path) -> None:
    code, _, err = cli("show", plan_file, "--plot", "timeline.jpg")
    assert code == 2
    assert "plot files take `.png`, `.pdf` or `.svg`" in err and "name it `timeline.png`" in err
    assert not (plan_file.parent / "timeline.jpg").exists()


@pytest.mark.parametrize("command", [("show", "PLAN", "--plot", "t.png"), ("plot-log", "LOG", "-o", "t.png")])
def test_drawing_without_matplotlib_is_an_error_naming_what_to_install(
        cli, plan_file: Path, monkeypatch: pytest.MonkeyPatch, command: tuple[str, ...]) -> None:
    log = plan_file.parent / "run.jsonl"
    log.write_text('{"event": "step", "step": 1, "loss": 1.0, "metrics": {}}\n')
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    code, _, err = cli(*[{"PLAN": plan_file, "LOG": log}.get(a, a) for a in command])
    assert code == 2
    assert "needs matplotlib" in err and "pip install 'swapdsl[plot]'" in err
    assert not (plan_file.parent / "t.png").exists()


def test_a_refused_figure_is_closed_and_a_dollar_in_a_title_is_drawn_as_written(cli, plan_file: Path) -> None:
    """The library left each refused figure open; a `$` in a log's name started matplotlib's mathematical
    notation, a traceback where unpaired."""
    import matplotlib.pyplot as plt

    from swapdsl.common.errors import SwpError
    from swapdsl.plan import show
    from swapdsl.plan.file import read_plan

    plan = read_plan(plan_file)
    for _ in range(3):
        with pytest.raises(SwpError, match="plot files take"):
            show.plot(plan, plan_file.parent / "t.jpg")
    assert plt.get_fignums() == []
    log = plan_file.parent / "r$\\q$.jsonl"
    log.write_text('{"event": "step", "step": 1, "loss": 1.0, "metrics": {}}\n')
    code, _, err = cli("plot-log", log, "-o", plan_file.parent / "log.png")
    assert code == 0, err


def test_the_timeline_names_copies_only_where_their_labels_fit() -> None:
    """Labels drawn over one another were unreadable (the ResNet tour's plot): a label is placed only where
    it overlaps none already placed and stays in the figure, the largest copies first."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from swapdsl.plan.show import _mark

    fig, lanes = plt.subplots(figsize=(12, 3))
    lanes.set_xlim(0, 100)
    lanes.set_ylim(-1, 3)
    copies = [("h2d", f"tensor_with_a_long_name_{k}", 40.0 + k, 41.0 + k) for k in range(5)]  # all side by side
    copies += [("d2h", "far", 80.0, 81.0), ("d2h", "past_the_left_edge_" * 6, 0.0, 0.1)]
    _mark(lanes, copies, None, named=6)
    texts = [t.get_text() for t in lanes.texts]
    plt.close(fig)
    assert texts == ["tensor_with_a_long_name_0", "far"]


def test_show_names_tensors_by_their_layer_path(cli, in_tmp: Path) -> None:
    """The most moved tensors are named as the model names them: a layer path and op (`as` names
    included), or the gradient of one, with the graph's %N beside it."""
    write(in_tmp / "m.swp", (MODELS / "mlp.swp").read_text())
    defines = ["-D", "features=64", "-D", "hidden=128", "-D", "depth=4"]
    assert cli("optimize", "m.swp", *defines, "--memory", "266KiB", "--method", "belady", "-o", "m.plan")[0] == 0
    code, out, _ = cli("show", "m.plan")
    moved = next(line for line in out.splitlines() if line.startswith("  most moved"))
    assert "grad layer3.dense.w (%33) (2x 64.00 KiB)" in moved and "layer0.relu (%2) (3x 32.00 KiB)" in moved
    assert not re.search(r"(^|, )%\d+ \(", moved.split("  most moved", 1)[1].strip())


def test_the_plots_memory_unit_follows_the_cap() -> None:
    from swapdsl.plan.show import memory_unit

    assert memory_unit(266 * 2**10) == ("KiB", 2**10)
    assert memory_unit(3 * 2**20) == ("MiB", 2**20)
    assert memory_unit(8 * 2**30) == ("GiB", 2**30)
    assert memory_unit(512) == ("B", 1)


def test_devices_and_profiles(cli, in_tmp: Path) -> None:
    code, out, _ = cli("devices")
    assert code == 0
    for name in ("v100-16gb", "v100-32gb", "a100-40gb", "h100-80gb", "h200", "gh200"):
        assert name in out
    code, out, _ = cli("devices", "--json")
    profiles = json.loads(out)
    custom = dict(profiles["a100-40gb"], name="mine", h2d_bw=1e9)
    write(in_tmp / "mine.json", json.dumps(custom))
    write(in_tmp / "m.swp", (MODELS / "mlp.swp").read_text())
    code, out, err = cli("optimize", "m.swp", "--memory", "64MiB", "--device", "mine.json", "--method", "belady",
                         "--json")
    assert code == 0, err
    assert json.loads(out)["device"] == "mine"
    code, _, err = cli("optimize", "m.swp", "--memory", "64MiB", "--device", "v100-61gb", "--method", "belady")
    assert code == 2 and "did you mean `v100-16gb`?" in err


@pytest.mark.parametrize("text,expected", [("8GiB", 8 * 2**30), ("512MiB", 512 * 2**20), ("1.5GB", 1_500_000_000),
                                           ("4096", 4096), ("2 kib", 2048)])
def test_parse_size(text: str, expected: int) -> None:
    assert parse_size(text) == expected


def test_bad_size(cli) -> None:
    code, _, err = cli("optimize", MODELS / "mlp.swp", "--memory", "lots")
    assert (code, err.splitlines()[0]) == (2, "error: cannot read the memory size `lots`")


def test_a_plan_with_updates_on_the_host_may_have_its_bound_below_the_ideal_step(cli, in_tmp: Path) -> None:
    """The ideal step sums every op's device time; with updates on the host a plan (and so its bound) may be
    below it: `simulate` printed its edited-figures note for every such plan."""
    code, _, err = cli("optimize", str(MODELS / "tiny_transformer.swp"), "--precision", "bf16", "--host-updates",
                       "all", "--memory", "4MiB", "--method", "belady", "-o", "host.plan")
    assert code == 0, err
    code, out, _ = cli("simulate", "host.plan", "--json")
    figures = json.loads(out)
    assert code == 0 and figures["bound_ms"] < figures["ideal_ms"]
    code, out, _ = cli("simulate", "host.plan")
    assert code == 0 and "note:" not in out, out
    text = (in_tmp / "host.plan").read_text()
    (in_tmp / "host.plan").write_text(re.sub(r"(?m)^figure bound_ms .*$", "figure bound_ms 1e6", text))
    code, out, _ = cli("simulate", "host.plan")
    assert "note: the recorded bound 1e+06 ms is not between the device's ops' ideal step (" in out
    (in_tmp / "host.plan").write_text(re.sub(r"(?m)^figure bound_ms .*$", "figure bound_ms 1e-9", text))
    code, out, _ = cli("simulate", "host.plan")
    assert "note: the recorded bound 1e-09 ms is not between the device's ops' ideal step (" in out
    code, out, _ = cli("simulate", "host.plan", "--json")  # (the notes in --json too)
    assert [n[:45] for n in json.loads(out)["notes"]] == ["the recorded bound 1e-09 ms is not between th"]
