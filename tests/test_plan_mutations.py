"""A plan the validator accepts trains exactly like the reference; every other plan is refused with
exit code 2 and the line at fault. The outside check's cases first, then single-line mutants."""

from __future__ import annotations

import os
import random
import shutil
from pathlib import Path

import attrs
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

import swapdsl
from conftest import MODELS, main, safety
from strategies import EVERY, training_graphs
from swapdsl.common.errors import SwpError
from swapdsl.fuzz.plans import KINDS, PROGRAM, campaign, judge, mutate, mutate_members
from swapdsl.graph.ir import Graph
from swapdsl.plan.file import format_plan, parse_plan
from swapdsl.plan.validate import validate
from swapdsl.graph.offload import offloadable
from swapdsl.planning.ga import SearchOptions
from swapdsl.planning.optimize import optimize
from swapdsl.planning.policy import METHODS
from swapdsl.planning.problem import Request
from test_planners import V100, caps
from test_runtime import run_against_reference

# (plan name, model, its arguments, the cap: about a third of the no-swap need, or near the smallest feasible cap where that is more, method)
PLANS = [
    ("resnet-belady", "tiny_resnet", ["-D", "batch=4", "-D", "width=4", "-D", "blocks=1"], "430KiB", "belady"),
    ("resnet-ga", "tiny_resnet", ["-D", "batch=4", "-D", "width=4", "-D", "blocks=1"], "430KiB", "ga"),
    ("resnet-capuchin", "tiny_resnet", ["-D", "batch=4", "-D", "width=4", "-D", "blocks=1"], "430KiB", "capuchin"),
    ("transformer-belady", "tiny_transformer", ["-D", "batch=2", "-D", "seq=8"], "2.2MiB", "belady"),
    ("transformer-ga", "tiny_transformer", ["-D", "batch=2", "-D", "seq=8"], "2.2MiB", "ga"),
    ("transformer-bf16", "tiny_transformer", ["-D", "batch=2", "-D", "seq=8", "--precision", "bf16"], "2.6MiB",
     "capuchin"),
    ("transformer-host", "tiny_transformer", ["-D", "batch=2", "-D", "seq=8", "--precision", "bf16",
                                              "--host-updates", "all"], "2.6MiB", "belady"),
    ("transformer-micro", "tiny_transformer", ["-D", "batch=2", "-D", "seq=8", "--microbatches", "2"], "1.6MiB",
     "capuchin"),
    ("resnet-ranks", "tiny_resnet", ["-D", "batch=4", "-D", "width=4", "-D", "blocks=1", "--ranks", "2",
                                     "--network", "1"], "430KiB", "capuchin"),
    ("mlp-exact", "mlp", ["--budget", "5"], "2.7MiB", "exact"),
]
# (plan name, model, its arguments): 2 ranks, bf16, every update and its gradient's all-reduce on the host
# lane, which the command line keeps only where it is faster
HOST_REDUCE = ("transformer-ranks-host", "tiny_transformer", {"batch": 2, "seq": 8})
# (plan name, model, its arguments): 2 ranks over 1 Gb/s, the buckets' members searched (``--bucket-mib auto``)
MEMBERS = ("transformer-ranks-members", "tiny_transformer", ["-D", "batch=2", "-D", "seq=8", "--ranks", "2",
                                                             "--network", "1", "--bucket-mib", "auto"], "2.2MiB")
NAMES = [name for name, *_ in PLANS] + [HOST_REDUCE[0], MEMBERS[0]]
CASES = int(os.environ.get("SWAPDSL_PLAN_MUTANTS", "210"))


@pytest.fixture(scope="module")
def plans(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("plans")
    for name, model, args, cap, method in PLANS:
        shutil.copy(MODELS / f"{model}.swp", folder / f"{model}.swp")
        search = ["--generations", "20", "--workers", "1", "--seed", "1"] if method == "ga" else []
        code = main(["optimize", str(folder / f"{model}.swp"), "--memory", cap, "--method", method, *args,
                     *search, "-o", str(folder / f"{name}.plan")])
        assert code == 0
    name, model, args = HOST_REDUCE
    m = swapdsl.load(folder / f"{model}.swp", precision="bf16", ranks=2, link_gbps=1.0, **args)
    t = m.training
    need, no_swap = caps(t)
    req = Request(t, V100, (need + no_swap) // 2, m.path, m.graph.args, host_updates=offloadable(t), host_reduce=True)
    (folder / f"{name}.plan").write_text(format_plan(optimize(req, "belady")))
    name, model, args, cap = MEMBERS
    assert main(["optimize", str(folder / f"{model}.swp"), "--memory", cap, "--method", "belady", *args,
                 "-o", str(folder / f"{name}.plan")]) == 0
    assert " members " in (folder / f"{name}.plan").read_text()
    return folder


def edited(folder: Path, name: str, edit) -> Path:  # noqa: ANN001
    lines = (folder / f"{name}.plan").read_text().splitlines()
    out = folder / "edited.plan"
    out.write_text("\n".join(edit(lines)) + "\n")
    return out


def refused_at(cli, path: Path, line_text: str, command: str = "exec") -> str:  # noqa: ANN001
    args = ["--steps", "1", "--check"] if command == "exec" else []
    code, out, err = cli(command, path, *args)
    assert code == 2 and out == "", err
    lines = path.read_text().splitlines()
    where = [k for k, text in enumerate(lines, 1) if text == line_text]
    assert err.splitlines()[1] in [f" --> {path}:{k}:1" for k in where], err
    return err.splitlines()[0]


def test_a_deleted_update_line_is_refused(cli, plans: Path) -> None:
    lines = (plans / "resnet-belady.plan").read_text().splitlines()
    victim = next(k for k, line in enumerate(lines) if line.startswith('update "stem.bn.shift/momentum" '))
    path = edited(plans, "resnet-belady", lambda ls: ls[:victim] + ls[victim + 1:])
    first = refused_at(cli, path, lines[victim + 1])
    assert "differs from the training graph's `stem.bn.shift/momentum`" in first


@pytest.mark.parametrize("same_size", [True, False])
def test_swapped_update_values_are_refused(cli, plans: Path, same_size: bool) -> None:
    """Swapping the new values of two updates trained wrong (same sizes) or crashed (different sizes)."""
    lines = (plans / "resnet-belady.plan").read_text().splitlines()
    sizes = {line.split('"')[1]: int(line.split()[3]) for line in lines if line.startswith("tensor ")}
    ups = [(k, line.split('"')[1], line.split('"')[3]) for k, line in enumerate(lines) if line.startswith("update ")]
    a, b = next((x, y) for x in ups for y in ups if x[0] < y[0] and (sizes[x[2]] == sizes[y[2]]) == same_size)

    def swap(ls: list[str]) -> list[str]:
        ls = list(ls)
        ls[a[0]], ls[b[0]] = f'update "{a[1]}" "{b[2]}"', f'update "{b[1]}" "{a[2]}"'
        return ls

    path = edited(plans, "resnet-belady", swap)
    assert "differs from the training graph's" in refused_at(cli, path, f'update "{a[1]}" "{b[2]}"')


def test_a_swap_out_before_its_tensor_exists_is_refused(cli, plans: Path) -> None:
    lines = (plans / "resnet-belady.plan").read_text().splitlines()
    k = next(k for k, line in enumerate(lines) if line.startswith("swapout ") and not line.endswith(" -1"))
    early = lines[k][: lines[k].rindex(" after ")] + " after -1"
    path = edited(plans, "resnet-belady", lambda ls: ls[:k] + [early] + ls[k + 1:])
    for command in ("exec", "simulate"):
        first = refused_at(cli, path, early, command)
        assert first.startswith("error: plan breaks invariant 8 (a copy starts once its source is complete")


def test_a_deleted_tensor_line_is_refused(cli, plans: Path) -> None:
    path = edited(plans, "resnet-belady", lambda ls: [line for line in ls if not line.startswith('tensor "%0" ')])
    op0 = next(line for line in path.read_text().splitlines() if line.startswith("op 0 "))
    for command in ("exec", "simulate", "show"):
        assert refused_at(cli, path, op0, command) == "error: op 0 names `%0`, which no tensor line declares"


@pytest.mark.parametrize("cap", ["1000000000000000000000000000000", "0", str(2**63)])
def test_a_cap_out_of_range_is_refused(cli, plans: Path, cap: str) -> None:
    path = edited(plans, "resnet-belady", lambda ls: [f"cap {cap}" if line.startswith("cap ") else line for line in ls])
    for command in ("exec", "simulate"):
        assert "is out of range" in refused_at(cli, path, f"cap {cap}", command)


def test_a_second_cap_line_is_refused(cli, plans: Path) -> None:
    path = edited(plans, "resnet-belady", lambda ls: [x for line in ls for x in ([line, line] if line.startswith("cap ")
                                                                                   else [line])])
    code, _, err = cli("simulate", path)
    assert code == 2 and "a second `cap` line in the plan (the first is line" in err


@pytest.mark.parametrize("kind", KINDS)
def test_mutants_are_refused_or_exact(plans: Path, kind: str) -> None:
    """Every single-line mutant of belady, capuchin and ga plans of two models: refused with its line named, or
    trains exactly (also on a slow bus). SWAPDSL_PLAN_MUTANTS sets how many (per kind: that / 7)."""
    texts = {name: (plans / f"{name}.plan").read_text() for name in NAMES}
    bad: list[str] = []

    def note(name: str, mutant, verdict) -> None:  # noqa: ANN001
        if verdict.verdict not in ("refused", "exact"):
            bad.append(f"{name} line {mutant.line} ({mutant.what[:120]}): {verdict.verdict} {verdict.detail}")

    seed = KINDS.index(kind) + 1000 * int(os.environ.get("SWAPDSL_PLAN_MUTANT_SEED", "0"))
    counts = campaign(texts, plans, CASES // len(KINDS), seed, note, kinds=(kind,))
    assert not bad, "\n".join(bad)
    assert sum(counts[kind].values()) == CASES // len(KINDS)


def test_members_mutants_are_refused_or_exact(plans: Path) -> None:
    """The bucket members of a data-parallel plan, mutated (a number dropped, added, changed, swapped, the
    list cut or made odd): each mutant refused with its line named, or trains exactly."""
    text = (plans / f"{MEMBERS[0]}.plan").read_text()
    rng = random.Random(int(os.environ.get("SWAPDSL_PLAN_MUTANT_SEED", "0")))
    verdicts = []
    while len(verdicts) < max(12, CASES // 15):
        mutant = mutate_members(text, rng)
        if mutant is not None:
            verdicts.append((mutant.what, judge(mutant, plans)))
    bad = [f"{what}: {v.verdict} {v.detail}" for what, v in verdicts if v.verdict not in ("refused", "exact")]
    assert not bad, "\n".join(bad)


@safety(40)
@given(training_graphs(max_depth=5, **EVERY), st.floats(0.0, 1.0),
       st.sampled_from(["ga", "capuchin", "checkpoint", *sorted(METHODS)]),
       st.sampled_from(KINDS), st.integers(0, 2**32 - 1), st.booleans())
def test_a_mutant_of_any_plan_is_refused_or_trains_exactly(t: Graph, where: float, method: str, kind: str,
                                                             seed: int, host: bool) -> None:
    """The memory-safety property on random graphs: a single-line mutant of a plan from any planner,
    at any cap, with updates on the device or on the host, is refused with its line named, or trains
    exactly like the reference (on a slow bus)."""
    need, no_swap = caps(t)
    cap = int(need + where * (no_swap - need))
    req = Request(t, V100, cap, "random.swp", ())
    if host and method != "checkpoint":
        req = attrs.evolve(req, host_updates=offloadable(t))
    try:
        # (ga's own plans: a polished one is an exact plan, whose mutants the campaign's seeds cover)
        plan = optimize(req, method, SearchOptions(budget_s=600, generations=2, population=6, workers=1, polish=0.0))
    except SwpError as err:  # checkpointing may not fit
        assume(method != "checkpoint" or "does not fit" not in err.message)
        raise
    rng = random.Random(seed)
    mutant = mutate(format_plan(plan), kind, rng, focus=PROGRAM if rng.random() < 0.7 else ())
    assume(mutant is not None)
    try:
        validate(parse_plan(mutant.text, "mutant.plan"), t)
    except SwpError as err:
        assert err.span is not None and err.span.file == "mutant.plan", err.render()
        return
    for delays in ({"copy_delay_s": 0.001}, {"kernel_delay_s": 0.001}):  # a missing wait, made visible
        assert run_against_reference(parse_plan(mutant.text), t, steps=2, **delays) <= 1e-6, (mutant.what, delays)
