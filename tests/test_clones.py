"""Recomputation planned by the swap planner (clones.py), capuchin, the ga's recompute genes, host budgets."""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from conftest import MODELS, build_graph, safety
import swapdsl
from swapdsl.graph.autodiff import training_graph
from swapdsl.graph.offload import offloadable
from swapdsl.planning.compiled import Evaluator, no_swap_bytes
from swapdsl.common.paths import STDLIB_DIR
from strategies import EVERY, training_graphs
from swapdsl.common.errors import SwpError
from swapdsl.graph.ir import Graph
from swapdsl.plan.program import Run
from swapdsl.plan.simulate import simulate
from swapdsl.plan.validate import validate
from swapdsl.planning.baselines import build_plan
from swapdsl.planning.bound import bound_ms, recompute_bound_ms
from swapdsl.planning.checkpoint import SPACINGS, _Checkpointing, checkpoint_program, rebuilt_makers
from swapdsl.planning.clones import Candidates, Extensions, Placer, merged_schedule, place_clones
from swapdsl.planning.ga import CHEN_MASKS, Decoder, Genome, Search, SearchOptions, genetic_search
from swapdsl.planning.optimize import METHOD_NAMES, optimize
from swapdsl.planning.problem import Problem, Request
from swapdsl.planning.reference import plan_swaps_reference
from test_compiled_planner import POLICIES, V100, _need_and_no_swap
from test_planners import caps
from test_runtime import run_against_reference, small_training_graph


def _request(t: Graph, where: float, host_cap: int | None = None) -> tuple[Request, Problem]:
    p = Problem.build(t, V100)
    need, no_swap = _need_and_no_swap(p)
    return Request(t, V100, int(need + where * (no_swap - need)), "random.swp", (), host_cap), p


@safety(30)
@given(training_graphs(), st.floats(0.0, 1.0), st.sampled_from(POLICIES), st.integers(0, 2**31 - 1))
def test_any_recompute_set_on_any_schedule_is_exact(t: Graph, where: float, policy, seed: int) -> None:  # noqa: ANN001
    """Any set of candidates, any schedule the search can make, any policy and cap: the compiled planner
    makes the reference planner's program for the extended problem and times the mapped plan exactly as
    the simulator does (host bytes too); the plan is valid and trains exactly like the reference (dropout
    included: a rerun hashes the same seed, step and element)."""
    req, _ = _request(t, where)
    d = Decoder(req)
    rng = np.random.default_rng(seed)
    genome = Genome(rng.normal(0, 5, d.p.n_ops), float(rng.choice([0, 0.3, 1.0])), 0, 0,
                    rng.random(len(d.candidates)) < rng.random())
    decoded = d.decode(genome)
    assert decoded is not None
    schedule, pinned = decoded
    chosen = d.recomputed(genome)
    ext, evaluator, merged = d.extensions.prepare(schedule.tolist(), chosen)
    assert evaluator.program(merged, req.tensor_cap, pinned, policy) == \
        plan_swaps_reference(ext.problem, merged, req.tensor_cap, pinned, policy)
    plan = build_plan(req, d.p, "x", schedule.tolist(), pinned, policy, recompute=chosen, extensions=d.extensions)
    timing, r = evaluator(merged, req.tensor_cap, pinned, policy), simulate(plan)
    assert (timing.iteration_ms, timing.h2d_bytes, timing.d2h_bytes, timing.host_bytes) == \
        (r.iteration_ms, r.h2d_bytes, r.d2h_bytes, r.host_bytes)
    assert sum(isinstance(i, Run) and i.recompute for i in plan.program) == len(ext.ops)
    event(f"recomputes: {min(len(ext.ops), 3)}, swaps: {r.h2d_bytes > 0}")
    assert r.iteration_ms >= recompute_bound_ms(d.p, req.tensor_cap) * (1 - 1e-9)
    validate(plan, t)
    assert run_against_reference(plan, t, steps=2) <= 1e-5


_ARRAYS = ("size", "nbytes", "in_ptr", "in_idx", "out_ptr", "out_idx", "in_place", "op_ms", "net", "is_input",
           "persistent", "fwd_act", "upd_old", "upd_new", "by_name", "after_ptr", "after_idx", "host_start", "origin",
           "copy", "room")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(training_graphs(**EVERY), st.booleans(), st.booleans(), st.integers(0, 2**31 - 1))
def test_an_extended_evaluator_is_made_from_its_base_s_arrays_as_from_its_problem(
        t: Graph, chains: bool, host: bool, seed: int) -> None:
    """``Evaluator.extended`` (what a search's clone sets are scored by) holds the arrays, the width and the
    host lane that flattening the extended problem gives, for any candidate set, updates on the host or not;
    the problem itself is made only when asked for."""
    p = Problem.build(t, V100, offloadable(t) if host else ())
    ext_all = Extensions(p, chains=chains)
    rng = np.random.default_rng(seed)
    ops = tuple(m for m in ext_all.candidates.ops if rng.random() < rng.random())
    ext, fast = ext_all.get(ops)
    assert not isinstance(fast._problem, Problem)  # (not made yet)
    slow = Evaluator(ext.problem, origin=ext.origin)
    for name in _ARRAYS:
        a, b = getattr(fast, name), getattr(slow, name)
        assert a.dtype == b.dtype and np.array_equal(a, b), name
    assert (fast.width, fast.n_base, fast.rank_gaps, fast.persistent_ids, fast.loss, fast.host_only_bytes) == \
        (slow.width, slow.n_base, slow.rank_gaps, slow.persistent_ids, slow.loss, slow.host_only_bytes)
    assert fast.p is ext.problem and (fast.lane is None) == (slow.lane is None)
    event(f"clones: {min(len(ops), 3)}, host lane: {slow.lane is not None}")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(training_graphs(), st.floats(0.0, 1.3), st.sampled_from(["capuchin", "checkpoint", "ga"]))
def test_no_recomputing_plan_beats_the_recompute_bound(t: Graph, where: float, method: str) -> None:
    """Plans that recompute report the recompute bound as ``bound_ms`` and never beat it; the swap bound
    is beside it, and never below it."""
    need, no_swap = caps(t)
    try:
        plan = optimize(Request(t, V100, int(need + where * (no_swap - need)), "random.swp", ()), method,
                        SearchOptions(budget_s=0.2, generations=2, population=8, workers=1))
    except SwpError as err:
        assert method == "checkpoint" and "does not fit" in err.message or "below the smallest" in err.message
        return
    f = dict(plan.figures)
    assert f["iteration_ms"] >= f["bound_ms"] * (1 - 1e-9) >= f["ideal_ms"] * (1 - 1e-9)
    assert f["swap_bound_ms"] >= f["bound_ms"] * (1 - 1e-12)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(training_graphs(), st.floats(0.0, 1.3))
def test_capuchin_is_never_slower_than_belady(t: Graph, where: float) -> None:
    """capuchin is belady's plan plus only the recomputes that measure faster (its growth from no
    recompute is always among those tried), so recomputing never costs a user speed against belady."""
    need, no_swap = caps(t)
    req = Request(t, V100, int(need + where * (no_swap - need)), "random.swp", ())
    try:
        belady = optimize(req, "belady")
    except SwpError as err:
        assert "below the smallest" in err.message
        return
    capuchin = optimize(req, "capuchin")
    assert simulate(capuchin).iteration_ms <= simulate(belady).iteration_ms * (1 + 1e-12)


def test_where_the_bus_limits_recomputation_passes_the_swap_bound() -> None:
    """ResNet-50 at a quarter of its no-swap arena: the bus holds every swap plan to the swap bound, the
    recompute bound is lower, and capuchin's plan is faster than the swap bound allows any swap plan."""
    _, g = build_graph(str(MODELS / "resnet.swp"), ["depth=50", "batch=32"])
    t = training_graph(g)
    p = Problem.build(t, V100)
    cap = no_swap_bytes(p) // 4
    assert recompute_bound_ms(p, cap) < bound_ms(p, cap) / 1.5
    plan = optimize(Request(t, V100, cap + p.scratch, "resnet.swp", ()), "capuchin")
    assert dict(plan.figures)["iteration_ms"] < bound_ms(p, cap)


def test_recompute_genes_make_the_plan_that_scores_them() -> None:
    """A genome's plan has one recompute per kept clone, its figures are its score."""
    t = small_training_graph("tiny_resnet")
    need, no_swap = caps(t)
    d = Decoder(Request(t, V100, (need + no_swap) // 3, "tiny_resnet.swp", ()))
    genes = np.ones(len(d.candidates), np.bool_)
    g = Genome(np.arange(d.p.n_ops, 0, -1.0), 0.0, 0, 0, genes)
    plan = d.plan(g)
    assert plan is not None
    again = [i for i in plan.program if isinstance(i, Run) and i.recompute]
    assert again and {i.op for i in again} <= set(d.candidates.tolist())
    assert simulate(plan).iteration_ms == d.score(g)
    validate(plan, t)


@settings(max_examples=200, deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(training_graphs(), st.booleans(), st.integers(0, 2**31 - 1))
def test_the_placer_places_clones_as_place_clones_does(t: Graph, chains: bool, seed: int) -> None:
    """``Placer`` (arrays, the search's) keeps the clones ``place_clones`` (readable) keeps, at the same
    positions, for any schedule the decoder can make and any set of candidates, chains or not; the merged
    schedule puts clone k just before position need[k], ties in clone order."""
    req, p = _request(t, 0.5)
    d = Decoder(req)
    rng = np.random.default_rng(seed)
    schedule, _ = d.decode(Genome(rng.normal(0, 5, p.n_ops), 0.0, 0, 0, np.zeros(len(d.candidates), np.bool_)))
    c = Candidates.of(p, chains)
    chosen = [m for m in c.ops if rng.random() < rng.random()]
    kept, need = Placer(p, c).place(schedule, chosen)
    assert (kept, need) == place_clones(p, c, schedule.tolist(), chosen)
    anything = [m for m in range(p.n_ops) if rng.random() < 0.1]  # (backward ops too: no search chooses them)
    assert Placer(p, c).place(schedule, anything) == place_clones(p, c, schedule.tolist(), anything)
    ext = Extensions(p, chains=chains).get(tuple(kept))[0]
    merged = merged_schedule(schedule, ext, need).tolist()
    want: list[int] = []
    for i, op in enumerate([*schedule.tolist(), None]):
        want += [p.n_ops + k for k, at in enumerate(need) if at == i] + ([op] if op is not None else [])
    assert merged == want
    event(f"kept {min(len(kept), 5)}+ of {min(len(chosen), 5)}+")


def test_candidates_are_forward_ops_the_backward_pass_reads() -> None:
    t = small_training_graph("tiny_transformer")
    p = Problem.build(t, V100)
    c = Extensions(p).candidates
    assert c.ops
    for m in c.ops:
        assert c.forward[m] and not p.in_place[m]
        assert any(not c.forward[r] for u in p.op_outputs[m] for r in c.readers.get(u, ()))


def _tiny_transformer(precision: str = "f32") -> Graph:
    args = {"batch": 2, "seq": 8, "vocab": 32, "dim": 16, "heads": 2, "ffn": 32}
    return swapdsl.load(MODELS / "tiny_transformer.swp", args, precision=precision).training


@pytest.mark.parametrize("precision", ["f32", "bf16"])
def test_a_chain_reruns_an_op_that_worked_in_place_over_its_input_rebuilt(precision: str) -> None:
    """A bias added in place over a product, and a residual add, may run again in a chain: the clone reads
    the product rebuilt (the original was overwritten) and writes a fresh region; the plan trains exactly
    like the reference. Without chains such an op is never a candidate."""
    t = _tiny_transformer(precision)
    p = Problem.build(t, V100)
    c = Candidates.of(p, chains=True)
    in_place = [m for m in c.ops if p.in_place[m]]
    assert in_place and not any(p.in_place[m] for m in Candidates.of(p).ops)
    assert not set(in_place) & set(c.direct)
    maker = {u: op for op in range(p.n_ops) for u in p.op_outputs[op]}
    assert all(maker[p.op_inputs[m][0]] in c.ops for m in in_place)
    need, no_swap = caps(t)
    d = Decoder(Request(t, V100, (need + no_swap) // 3, "tiny_transformer.swp", ()))
    plan = d.plan(Genome(np.arange(d.p.n_ops, 0, -1.0), 0.0, 0, 0, np.ones(len(d.candidates), np.bool_)))
    assert plan is not None
    again = [i for i in plan.program if isinstance(i, Run) and i.recompute]
    assert {i.op for i in again} & set(in_place) and not any(i.in_place for i in again)
    validate(plan, t)
    assert run_against_reference(plan, t, steps=2) <= 1e-5


def test_an_op_that_worked_in_place_reruns_only_over_its_input_rebuilt() -> None:
    """With every candidate chosen, each op that worked in place runs again after the maker of the input
    it wrote over; chosen without that maker, its clone is dropped (it would read the overwritten original)."""
    p = Problem.build(_tiny_transformer(), V100)
    c = Candidates.of(p, chains=True)
    maker = {u: op for op in range(p.n_ops) for u in p.op_outputs[op]}
    schedule = list(range(p.n_ops))
    kept, need = place_clones(p, c, schedule, c.ops)
    at = dict(zip(kept, need))
    rerun = [m for m in kept if p.in_place[m]]
    assert rerun and all(at[maker[p.op_inputs[m][0]]] <= at[m] for m in rerun)
    for m in rerun:
        assert m not in place_clones(p, c, schedule, set(c.ops) - {maker[p.op_inputs[m][0]]})[0]


def test_chens_rule_rebuilds_whole_chains_for_the_seeds() -> None:
    """``rebuilt_makers``: the makers of what Chen's rule drops and of every value rebuilding it walks
    through, so each one's inputs are kept, fixed or rebuilt too (a seed's chain never stops short)."""
    t = small_training_graph("tiny_transformer")
    p = Problem.build(t, V100)
    need, _ = caps(t)
    for spacing, at_cuts in CHEN_MASKS:
        c = _Checkpointing(p, need, spacing, at_cuts)
        rebuilt = rebuilt_makers(p, need, spacing, at_cuts)
        assert {c.maker[u] for u in c.droppable} <= rebuilt
        for m in rebuilt:
            assert all(u in c.kept or u in c.fixed or c.maker[u] in rebuilt for u in p.op_inputs[m])


def _every_spacing_placed(p: Problem, cap: int) -> tuple[list, dict] | str:
    """What ``checkpoint_program`` chooses, the long way: every segment length built in the arena, the least
    recomputation kept (the first on a tie), or the square-root spacing's refusal."""
    best, refusals = None, {}
    for spacing, at_cuts in itertools.product(SPACINGS, (True, False)):
        try:
            program, homes = _Checkpointing(p, cap, spacing, at_cuts).build()
        except SwpError as err:
            refusals.setdefault(spacing, str(err))
            continue
        cost = sum(p.op_ms[i.op] for i in program if isinstance(i, Run) and i.recompute)
        if best is None or cost < best[0]:
            best = (cost, program, homes)
    return refusals[1.0] if best is None else (best[1], best[2])


@safety(30)
@given(training_graphs(), st.floats(0.5, 1.05))
def test_checkpointing_builds_only_what_it_keeps(t: Graph, share: float) -> None:
    """Each segment length's cost and peak bytes are learnt without placing anything (``_Tally``), and only
    the cheapest that fits is placed: the same program, homes or refusal as placing every one."""
    p = Problem.build(t, V100)
    cap = int(share * (no_swap_bytes(p) + p.scratch))
    try:
        got: tuple[list, dict] | str = checkpoint_program(p, cap)
    except SwpError as err:
        got = str(err)
    event("refused" if isinstance(got, str) else "fits")
    assert got == _every_spacing_placed(p, cap)


def test_ga_seeds_its_recompute_sets_right_after_the_default_schedule() -> None:
    """Under a cap that needs recomputation the population starts with the default schedule, then each
    distinct recompute set (early and windowed swap-ins); the set of all candidates leaves out the ops that
    work in place and the makers of what they write over."""
    t = _tiny_transformer()
    need, no_swap = caps(t)
    search = Search(Request(t, V100, (need + no_swap) // 3, "tiny_transformer.swp", ()),
                    SearchOptions(generations=0, workers=1))
    try:
        pop, d = search.pop, search.d
        assert not pop[0].recompute.any() and not pop[1].recompute.any() and (pop[0].early, pop[1].early) == (0, 1)
        sets = [g.recompute.tobytes() for g in pop[2:] if g.recompute.any()]
        first = sets[::2][:len(set(sets))]
        assert len(first) == len(set(first)) >= 3 and [g.early for g in pop[2:6]] == [1, 5, 1, 5]
        alone = [g for g in pop if g.recompute.tobytes() == first[-1]][0].recompute
        c = d.extensions.candidates
        chosen = [m for m, on in zip(d.candidates.tolist(), alone) if on]
        assert chosen and not any(d.p.in_place[m] for m in chosen)
        assert not any(t in c.consumer for m in chosen for t in d.p.op_outputs[m])
    finally:
        search.close()


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(training_graphs(**EVERY), st.floats(0.0, 1.0), st.floats(0.3, 1.5), st.sampled_from(METHOD_NAMES))
def test_host_budgets_hold_or_are_refused(t: Graph, where: float, share: float, method: str) -> None:
    """Every planner under a host budget a share of what `belady` keeps on the host: the plan keeps within
    it, is valid and trains exactly (recomputation chains and dropout included), or the planner refuses
    with the least host memory it found (which is over it), or the cap is too small for checkpointing."""
    free, p = _request(t, where)
    roomy = dict(optimize(free, "belady").figures)["host_bytes"]
    budget = int(share * roomy)
    req = Request(t, V100, free.cap, "random.swp", (), budget)
    try:
        plan = optimize(req, method, SearchOptions(budget_s=0.3, generations=3, population=12, workers=1))
    except SwpError as err:
        if method == "checkpoint" and "does not fit" in err.message:
            return
        if method == "exact" and "HiGHS found no plan in" in err.message:
            return  # a time limit, not a host budget: the cases with a plan still check it
        assert "host copies within" in err.message, err.message
        least = int(err.message.split("(")[-1].split(" bytes")[0])
        assert least > budget
        event("refused")
        return
    assert dict(plan.figures)["host_bytes"] <= budget
    event(f"within, {'recomputing' if any(isinstance(i, Run) and i.recompute for i in plan.program) else 'swapping'}")
    validate(plan, t)
    assert run_against_reference(plan, t, steps=2) <= 1e-5


def test_ga_is_never_worse_than_capuchin_or_checkpoint() -> None:
    t = small_training_graph("tiny_resnet")
    need, no_swap = caps(t)
    for cap in (need + (no_swap - need) // 8, (need + no_swap) // 2):
        req = Request(t, V100, cap, "tiny_resnet.swp", ())
        ga = dict(genetic_search(req, SearchOptions(budget_s=1, generations=2, population=8, workers=1)).plan.figures)
        for method in ("capuchin", "checkpoint", "belady"):
            try:
                other = dict(optimize(req, method).figures)
            except SwpError:
                continue
            assert ga["iteration_ms"] <= other["iteration_ms"] * (1 + 1e-12), method


@pytest.mark.parametrize("method", ["capuchin", "ga", "lru"])
def test_a_host_budget_below_the_inputs_is_refused_with_the_least_found(cli, in_tmp: Path, method: str) -> None:  # noqa: ANN001
    code, _, err = cli("optimize", STDLIB_DIR / "models" / "mlp.swp", "--memory", "3MiB", "--host-memory", "1KiB",
                       "--method", method, "--budget", "0.5", "--workers", "1", "-o", "x.plan")
    assert code == 2 and "host copies within 1.00 KiB" in err and "--host-memory" in err, err
    assert "no plan needs less than 196.25 KiB (200960 bytes): the inputs' host copies" in err, err
    assert not (in_tmp / "x.plan").exists()


@pytest.mark.parametrize("method", ["capuchin", "ga"])
def test_recomputation_lifts_a_bus_limited_plan(method: str) -> None:
    """Where belady's step is bound by the bus, recomputation makes it faster."""
    t = small_training_graph("tiny_resnet")
    need, no_swap = caps(t)
    req = Request(t, V100, need + (no_swap - need) // 10, "tiny_resnet.swp", ())
    belady = dict(optimize(req, "belady").figures)["iteration_ms"]
    plan = optimize(req, method, SearchOptions(budget_s=2, generations=4, population=16, workers=1))
    assert dict(plan.figures)["iteration_ms"] < belady
    assert any(isinstance(i, Run) and i.recompute for i in plan.program)


def test_exec_refuses_a_plan_whose_host_copies_the_machine_cannot_hold(cli, in_tmp: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    """Before allocating anything: the arena and host copies against the memory available."""
    from swapdsl.runtime import backend

    model = STDLIB_DIR / "models" / "mlp.swp"
    assert cli("optimize", model, "--memory", "3MiB", "--method", "belady", "-o", "m.plan")[0] == 0
    monkeypatch.setattr(backend, "host_memory_available", lambda: 1 << 20)
    code, out, err = cli("exec", "m.plan", "--steps", "1")
    assert code == 2 and "host copies needs" in err and "only 1.00 MiB of memory available" in err, err
    assert "--host-memory" in err and "Traceback" not in err


def test_check_refuses_a_reference_the_machine_cannot_hold_beside_the_plan(cli, in_tmp: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    """`--check` runs the reference executor, uncapped, beside the plan: where its peak does not fit what is
    left, the run is refused with both figures, not stopped by an allocation error mid-step."""
    from swapdsl.runtime import backend

    model = STDLIB_DIR / "models" / "mlp.swp"
    assert cli("optimize", model, "--memory", "3MiB", "--method", "belady", "-o", "m.plan")[0] == 0
    real = backend.host_memory_available
    calls = []

    def shrinking() -> int | None:  # (the plan's own check passes; the reference's then finds 1 MiB)
        calls.append(1)
        return real() if len(calls) == 1 else 1 << 20

    monkeypatch.setattr(backend, "host_memory_available", shrinking)
    code, out, err = cli("exec", "m.plan", "--steps", "1", "--check")
    assert code == 2 and "`--check`'s reference executor (no cap, beside the plan's arena) needs" in err, err
    assert "Traceback" not in err


def test_the_compiled_placer_refuses_arrays_that_disagree() -> None:
    """The C placer reads its rows, schedule and ops by index: rows that do not end where they say, an op
    out of range, or a schedule that repeats an op are refused, not read out of bounds."""
    from swapdsl.planning import _fastplan

    ptr, idx = np.array([0, 1, 2], np.int64), np.array([2, 2], np.int64)  # two ops, each row the sentinel
    rows = (ptr, idx, ptr, idx, ptr, idx, idx)
    at = np.empty(2, np.int64)
    assert _fastplan.place_clones(np.array([1, 0], np.int64), np.array([0, 1], np.int64), at, *rows) == 0
    for schedule, kept, bad in (([0, 0], [0], "repeats an op"), ([0, 1], [2], "disagree"),
                                ([0, 5], [0], "disagree")):
        with pytest.raises(ValueError, match=bad):
            _fastplan.place_clones(np.array(schedule, np.int64), np.array(kept, np.int64), at, *rows)
    with pytest.raises(ValueError, match="disagree"):
        _fastplan.place_clones(np.array([0, 1], np.int64), np.array([0], np.int64), at,
                               np.array([0, 1, 3], np.int64), idx, *rows[2:])


@pytest.mark.parametrize("model, share", [("tiny_resnet", "40%"), ("tiny_transformer", "50%"), ("mlp", "30%")])
def test_checkpointings_refusal_adds_up(cli, model: str, share: str) -> None:
    """The refusal said `9.90 GiB ... on the device and `%421` needs 96.00 MiB more (the cap leaves 10.04
    GiB)`, which adds up to less than the cap: where the bytes are there but not together, it says so."""
    code, _, err = cli("optimize", MODELS / f"{model}.swp", "--memory", share, "--method", "checkpoint")
    sizes = [float(v) * 2 ** (10 * " KMG".index(u[0])) for v, u in re.findall(r"([0-9.]+) ([KMG]iB|B)\b", err)]
    used, more, cap = sizes[:3]
    apart = re.search(r", and the largest free region of the ([0-9.]+ \w+) left is ([0-9.]+ \w+)$", err.splitlines()[0])
    assert code == 2 and "checkpointing does not fit under this cap" in err and bool(apart) == (used + more <= cap), err
