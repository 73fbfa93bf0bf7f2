"""Planners, the validator, the simulator and the bound, on random graphs and on the zoo."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import MODELS, build_graph, safety
from strategies import training_graphs
from swapdsl.common.errors import SwpError
from swapdsl.devices.profiles import BUILTIN
from swapdsl.fuzz.bound_gap import bound_gap
from swapdsl.graph.autodiff import training_graph
from swapdsl.graph.ir import Graph
from swapdsl.plan.program import Free, Plan, Region, Run, SwapIn, SwapOut
from swapdsl.plan.simulate import simulate
from swapdsl.plan.validate import PlanInvalid, validate
from swapdsl.planning.bound import bound_ms
from swapdsl.planning.compiled import no_swap_bytes
from swapdsl.planning.optimize import optimize
from swapdsl.planning.policy import METHODS
from swapdsl.planning.problem import Problem, Request
from swapdsl.planning.sizing import smallest_cap

V100 = BUILTIN["v100-16gb"]


def caps(t: Graph) -> tuple[int, int]:
    """(smallest feasible cap, no-swap arena bytes) for the default schedule, both with the kernels' scratch."""
    p = Problem.build(t, V100)
    no_swap = no_swap_bytes(p)
    return smallest_cap(p, no_swap) + p.scratch, no_swap + p.scratch


def plan_for(t: Graph, cap: int, method: str) -> Plan:
    return optimize(Request(t, V100, cap, "random.swp", ()), method)


@safety(60)
@given(training_graphs(), st.floats(0.0, 1.3), st.sampled_from(sorted(METHODS)))
def test_every_plan_is_valid_and_never_beats_the_bound(t: Graph, where: float, method: str) -> None:
    need, no_swap = caps(t)
    cap = int(need + where * (no_swap - need))
    plan = plan_for(t, cap, method)
    validate(plan)
    f = dict(plan.figures)
    assert f["iteration_ms"] >= f["bound_ms"] * (1 - 1e-9) >= f["ideal_ms"] * (1 - 1e-9)
    assert simulate(plan).peak_device_bytes <= cap


@settings(max_examples=25, deadline=None)
@given(training_graphs(), st.sampled_from(sorted(METHODS)))
def test_no_swapping_when_everything_fits(t: Graph, method: str) -> None:
    _, no_swap = caps(t)
    plan = plan_for(t, no_swap, method)
    f = dict(plan.figures)
    assert f["swap_bytes"] == 0
    assert f["fraction"] == pytest.approx(1.0, abs=1e-9)
    assert f["ideal_ms"] == pytest.approx(sum(o.ms for o in plan.ops))


@settings(max_examples=25, deadline=None)
@given(training_graphs())
def test_below_the_smallest_feasible_cap_is_a_clear_error(t: Graph) -> None:
    need, _ = caps(t)
    with pytest.raises(SwpError, match=f"below the smallest feasible cap for this model, .* \\({need} bytes, of which"):
        plan_for(t, need - 1, "lru")
    for method in sorted(METHODS):  # and the smallest feasible cap suffices, whatever the method
        validate(plan_for(t, need, method))


# ---- mutations: each breaks one invariant, and the validator says which -----------


def swapping_plan(method: str = "belady") -> Plan:
    _, g = build_graph(str(MODELS / "tiny_resnet.swp"), ["batch=4"])
    t = training_graph(g)
    need, no_swap = caps(t)
    plan = plan_for(t, (need + no_swap) // 2, method)
    assert any(isinstance(i, SwapIn) for i in plan.program)
    return plan


@pytest.fixture(scope="module")
def plan() -> Plan:
    return swapping_plan()


def mutated(plan: Plan, program: list) -> Plan:
    return attrs.evolve(plan, program=tuple(program))


def test_valid_plan_passes(plan: Plan) -> None:
    validate(plan)


def test_dropping_a_swap_in_breaks_invariant_4(plan: Plan) -> None:
    prog = list(plan.program)
    i = next(k for k, ins in enumerate(prog) if isinstance(ins, SwapIn))
    del prog[i]
    with pytest.raises(PlanInvalid, match="invariant 4") as e:
        validate(mutated(plan, prog))
    assert prog[0] is not None and e.value.invariant == 4


def test_moving_a_swap_in_after_its_use_breaks_invariant_4(plan: Plan) -> None:
    prog = list(plan.program)
    i = next(k for k, ins in enumerate(prog) if isinstance(ins, SwapIn))
    swapin = prog.pop(i)
    use = next(k for k, ins in enumerate(prog) if isinstance(ins, Run) and ins.op == swapin.before)
    prog.insert(use + 1, swapin)
    with pytest.raises(PlanInvalid, match="invariant 4"):
        validate(mutated(plan, prog))


def test_shrinking_a_region_breaks_invariant_3(plan: Plan) -> None:
    prog = list(plan.program)
    k, run = max(((k, i) for k, i in enumerate(prog) if isinstance(i, Run)), key=lambda e: e[1].outs[0][1].size)
    name, region = run.outs[0]
    prog[k] = attrs.evolve(run, outs=((name, Region(region.offset, region.size // 2)),) + run.outs[1:])
    with pytest.raises(PlanInvalid, match="invariant 3"):
        validate(mutated(plan, prog))


def test_overlapping_a_live_tensor_breaks_invariant_5(plan: Plan) -> None:
    prog = list(plan.program)
    homes = [t.home for t in plan.tensors if isinstance(t.home, Region)]
    k = next(k for k, i in enumerate(prog) if isinstance(i, SwapIn) and i.region.size >= 512)
    prog[k] = attrs.evolve(prog[k], region=Region(homes[0].offset + 256, prog[k].region.size))
    with pytest.raises(PlanInvalid, match="invariant 5"):
        validate(mutated(plan, prog))


def test_reordering_two_dependent_ops_breaks_invariant_1(plan: Plan) -> None:
    prog = list(plan.program)
    runs = [k for k, ins in enumerate(prog) if isinstance(ins, Run)]
    a, b = runs[0], runs[1]  # the stem conv and the batch norm that reads it
    prog[a], prog[b] = prog[b], prog[a]
    with pytest.raises(PlanInvalid, match="invariant 1"):
        validate(mutated(plan, prog))


def test_skipping_a_needed_swap_out_breaks_invariant_6(plan: Plan) -> None:
    prog = list(plan.program)
    needed_later = {i.tensor for i in prog if isinstance(i, SwapIn)}
    k = next(k for k, ins in enumerate(prog) if isinstance(ins, SwapOut) and ins.tensor in needed_later)
    del prog[k]
    with pytest.raises(PlanInvalid, match="invariant 6"):
        validate(mutated(plan, prog))


def test_freeing_in_use_memory_breaks_invariant_5(plan: Plan) -> None:
    prog = list(plan.program)
    k = next(k for k, ins in enumerate(prog) if isinstance(ins, Free) and ins.after > 0)
    prog[k] = attrs.evolve(prog[k], after=prog[k].after - 1)
    with pytest.raises(PlanInvalid, match="invariant [15]"):
        validate(mutated(plan, prog))


def test_exceeding_the_cap_breaks_invariant_2(plan: Plan) -> None:
    with pytest.raises(PlanInvalid, match="invariant 2"):
        top = max(r.end for i in plan.program if isinstance(i, Run) for _, r in i.outs)
        validate(attrs.evolve(plan, cap=top + plan.scratch - 1))  # the scratch region then overlaps a tensor


def test_simulated_figures_are_consistent(plan: Plan) -> None:
    r = simulate(plan)
    f = dict(plan.figures)
    assert r.iteration_ms == pytest.approx(f["iteration_ms"])
    assert r.peak_device_bytes <= plan.cap
    assert r.swap_bytes == f["swap_bytes"] > 0
    assert f["ideal_ms"] <= f["bound_ms"] <= f["iteration_ms"]


@pytest.mark.parametrize("method", sorted(METHODS))
def test_methods_differ_where_they_should(method: str) -> None:
    plan = swapping_plan(method)
    validate(plan)
    has_early_swapouts = any(isinstance(i, SwapOut) for i in plan.program)
    assert has_early_swapouts


@pytest.mark.parametrize("method", sorted(METHODS))
def test_inputs_stay_where_they_start_until_their_last_use(method: str) -> None:
    # vDNN offloads what the backward pass reads again, but an input brought back elsewhere could
    # never move again: the smallest feasible cap would no longer be enough
    plan = swapping_plan(method)
    inputs = {t.name for t in plan.tensors if t.kind == "input"}
    last_read = {name: max(k for k, i in enumerate(plan.program)
                           if isinstance(i, Run) and name in plan.ops[i.op].inputs) for name in inputs}
    for k, instr in enumerate(plan.program):
        assert not (isinstance(instr, SwapIn) and instr.tensor in inputs)
        if isinstance(instr, Free) and instr.tensor in inputs:
            assert k > last_read[instr.tensor]


ZOO_QUICK = ["resnet", "wide_resnet", "inception_v4", "nasnet", "bert", "gpt"]


@pytest.fixture(scope="module", params=ZOO_QUICK)
def zoo_problem(request: pytest.FixtureRequest) -> tuple[str, Graph, int]:
    _, g = build_graph(str(MODELS / f"{request.param}.swp"), [])
    t = training_graph(g)
    return request.param, t, caps(t)[1]


@pytest.mark.parametrize("ratio", [2, 8])
def test_zoo_baselines_make_valid_plans(zoo_problem: tuple[str, Graph, int], ratio: int) -> None:
    name, t, no_swap = zoo_problem
    for method in sorted(METHODS):
        plan = plan_for(t, no_swap // ratio, method)
        validate(plan)
        f = dict(plan.figures)
        assert 0 < f["fraction"] <= 1
        assert f["iteration_ms"] >= f["bound_ms"]
        assert f["ratio"] == pytest.approx(ratio, rel=1e-3)


def test_vgg_at_ratio_2_is_below_its_smallest_feasible_cap() -> None:
    # VGG-16's first conv layers make 6.6 GB tensors at batch 512: one ReLU gradient needs three of them
    _, g = build_graph(str(MODELS / "vgg.swp"), [])
    t = training_graph(g)
    need, no_swap = caps(t)
    assert no_swap // 2 < need < no_swap
    with pytest.raises(SwpError, match="below the smallest feasible cap"):
        plan_for(t, no_swap // 2, "belady")
    validate(plan_for(t, need, "belady"))


@safety(40)
@given(training_graphs(), st.sampled_from(sorted(METHODS)), st.data())
def test_single_mutations_of_random_plans_are_rejected(t: Graph, method: str, data: st.DataObject) -> None:
    need, no_swap = caps(t)
    plan = plan_for(t, need, method)  # the tightest cap: the most swapping
    prog = list(plan.program)
    runs = [k for k, i in enumerate(prog) if isinstance(i, Run)]
    swapins = [k for k, i in enumerate(prog) if isinstance(i, SwapIn)]
    mutations = ["reorder"] + (["drop-swapin"] if swapins else [])
    kind = data.draw(st.sampled_from(mutations))
    if kind == "drop-swapin":
        del prog[data.draw(st.sampled_from(swapins))]
        expected = "invariant 4"
    else:
        # the first op's output is read by a later op: run that reader first
        first = prog[runs[0]]
        reader = next(k for k in runs[1:] if plan.ops[prog[k].op].inputs
                      and first.outs[0][0] in plan.ops[prog[k].op].inputs)
        prog.insert(runs[0], prog.pop(reader))
        expected = "invariant [145]"
    with pytest.raises(PlanInvalid, match=expected):
        validate(attrs.evolve(plan, program=tuple(prog)))


# ---- the genetic search -----------------------------------------------------------

from swapdsl.planning.ga import genetic_search  # noqa: E402
from swapdsl.planning.ga import SearchOptions


def ga_plan(t: Graph, cap: int, generations: int = 3, workers: int = 1, seed: int = 0,
            polish: float = 0.0) -> Plan:
    opts = SearchOptions(budget_s=600, generations=generations, population=6, seed=seed, workers=workers,
                         polish=polish)
    return genetic_search(Request(t, V100, cap, "random.swp", ()), opts).plan


@safety(12)
@given(training_graphs(), st.floats(0.0, 1.0))
def test_ga_plans_are_valid_and_no_worse_than_the_baselines(t: Graph, where: float) -> None:
    need, no_swap = caps(t)
    cap = int(need + where * (no_swap - need))
    plan = ga_plan(t, cap)
    validate(plan)
    best_baseline = min(plan_for(t, cap, m).figure("iteration_ms") for m in METHODS)
    assert plan.figure("iteration_ms") <= best_baseline * (1 + 1e-12)
    assert plan.figure("iteration_ms") >= plan.figure("bound_ms") * (1 - 1e-9)


def test_ga_is_deterministic_whatever_the_workers() -> None:
    from swapdsl.plan.file import format_plan

    _, g = build_graph(str(MODELS / "tiny_resnet.swp"), ["batch=4", "width=4", "blocks=1"])
    t = training_graph(g)
    need, no_swap = caps(t)
    one = format_plan(ga_plan(t, (need + no_swap) // 2, generations=4, workers=1, seed=7))
    two = format_plan(ga_plan(t, (need + no_swap) // 2, generations=4, workers=2, seed=7))
    assert one == two


def poorly_ordered_graph() -> Graph:
    """Ten independent branches, each a big activation that only the loss at the very end reads.

    The default order runs every branch's first op before any second op, so all ten big
    tensors are alive at once; running each branch to completion keeps one alive at a time.
    """
    from swapdsl.fuzz.graphs import Builder

    from swapdsl.graph.ir import Kind, Optimizer

    b = Builder()
    x = b.declare("x", (64, 64), Kind.input)
    heads = []
    for i in range(10):
        w = b.declare(f"w{i}", (64, 256), Kind.param)
        heads.append(b.op("matmul", [x, w]))
    outs = []
    for i, h in enumerate(heads):
        v = b.declare(f"v{i}", (256, 8), Kind.param)
        outs.append(b.op("sum", [b.op("relu", [b.op("matmul", [h, v])])], axes=(0, 1), keepdims=False))
    total = outs[0]
    for o in outs[1:]:
        total = b.op("add", [total, o])
    sgd = Optimizer("sgd", (("lr", 0.1), ("momentum", 0.0), ("weight_decay", 0.0)))
    fwd = Graph("branches", (), b.tensors, tuple(b.ops), tuple(b.inputs), tuple(b.params), total, sgd, "0" * 64)
    return training_graph(fwd)


def test_ga_improves_on_its_seeds_where_the_default_schedule_is_poor() -> None:
    t = poorly_ordered_graph()
    need, no_swap = caps(t)
    cap = need + (no_swap - need) // 4
    seen: list[float] = []
    opts = SearchOptions(budget_s=600, generations=150, population=10, seed=1, workers=1)
    outcome = genetic_search(Request(t, V100, cap, "branches.swp", ()), opts,
                             on_generation=lambda gen, best: seen.append(best))
    validate(outcome.plan)
    default = min(plan_for(t, cap, m).figure("iteration_ms") for m in METHODS)
    print(f"baselines {default:.4f} ms, seeds {seen[0]:.4f} ms, after the search {seen[-1]:.4f} ms")
    assert seen[-1] < 0.9 * seen[0]  # the search, not the seeding, found it
    assert outcome.plan.figure("iteration_ms") == pytest.approx(seen[-1])
    assert outcome.plan.figure("iteration_ms") < 0.9 * default


@safety(40)
@given(training_graphs(), st.floats(0.0, 1.0), st.integers(0, 2**31 - 1))
def test_any_genome_decodes_to_a_valid_plan(t: Graph, where: float, seed: int) -> None:
    """The search may try any schedule, pinning, output placement and early swap-ins: every one must
    plan validly, and no plan beats the bound."""
    import numpy as np

    from swapdsl.planning.ga import Decoder, EARLY, Genome

    need, no_swap = caps(t)
    cap = int(need + where * (no_swap - need))
    d = Decoder(Request(t, V100, cap, "random.swp", ()))
    rng = np.random.default_rng(seed)
    genome = Genome(rng.normal(0, 10, d.p.n_ops), float(rng.choice([0, 0.3, 1.0])), int(rng.integers(3)),
                    int(rng.integers(len(EARLY))))
    plan = d.plan(genome)
    assert plan is not None
    validate(plan)
    assert simulate(plan).iteration_ms >= bound_ms(d.p, d.req.tensor_cap) * (1 - 1e-9)


def test_a_tensor_goes_where_its_bytes_have_been_free_longest() -> None:
    """A short-lived tensor freed at the bottom of a long-free gap does not make the whole gap new:
    a swap-in takes the gap's top end, free since long ago; outputs asked to take the bytes freed
    last take its bottom."""
    from swapdsl.planning.reference import Arena

    arena = Arena(2048)
    arena.insert(0, 0, 256, 7)  # a short-lived tensor, a long-lived one above it, and one that stays
    arena.insert(1, 256, 768, 8)
    arena.insert(2, 1024, 1024, 9)
    arena.remove(1, 3)  # the long-lived one's bytes fall free at position 3
    arena.remove(0, 10)  # the short-lived one's at position 10: one gap, [0, 1024)
    assert arena.fit(512) == (0, 512)  # [512, 1024): free since 3
    assert arena.since(512, 512) == 3 and arena.since(0, 512) == 10
    assert arena.fit(512, newest=True) == (0, 0)
    assert arena.fit(1025) is None


def test_the_locality_schedule_runs_the_ops_of_one_weight_together() -> None:
    """For an unrolled LSTM: the input projections of every step, then the recurrence (its own
    weight), layer by layer, and back in the reverse order; the default order alternates the two
    weights at every step."""
    from swapdsl.planning.compiled import priority_order
    from swapdsl.planning.ga import Decoder, locality_priority

    _, g = build_graph(str(MODELS / "lstm_lm.swp"), ["layers=2", "hidden=8", "vocab=16", "seq=5", "batch=2"])
    t = training_graph(g)
    d = Decoder(Request(t, V100, 1 << 40, "lstm_lm.swp", ()))
    p = d.p
    order = priority_order(locality_priority(p), d.n_preds, d.succ_ptr, d.succ_idx).tolist()
    assert sorted(order) == list(range(p.n_ops))
    local = {op: i for i, op in enumerate(order)}
    assert all(local[q] < local[op] for op, ps in enumerate(d.preds) for q in ps)

    def readers(weight: str, forward: bool, position: dict[int, int]) -> list[int]:
        w = p.names.index(weight)
        return [position[op] for op in range(p.n_ops)
                if w in p.op_inputs[op] and p.is_forward_activation(p.op_outputs[op][0]) == forward]

    wx, wh, wx1 = "layer0.lstm.wx", "layer0.lstm.wh", "layer1.lstm.wx"
    assert len(readers(wx, True, local)) == 5  # one input projection per step
    assert max(readers(wx, True, local)) < min(readers(wh, True, local))
    assert max(readers(wh, True, local)) < min(readers(wx1, True, local))  # layer 0 first
    assert max(readers(wx1, False, local)) < min(readers(wx, False, local))  # back: layer 1 first
    default = {op: op for op in range(p.n_ops)}
    assert max(readers(wx, True, default)) > min(readers(wh, True, default))


def test_early_swap_ins_use_room_as_soon_as_it_falls_free() -> None:
    """At the turn of a ResNet the cap is full of the last forward activations; what the first
    backward ops free is soon taken by their outputs. Placed when their readers come, the swap-ins
    of the early activations find only bytes freed lately; placed as soon as a gap holds them, they
    start while the backward pass is still in its first ops, and the step is faster."""
    from swapdsl.planning.baselines import assemble, baseline_setup
    from swapdsl.planning.reference import plan_swaps_reference

    t = training_graph(build_graph(str(MODELS / "tiny_resnet.swp"), [])[1])
    p = Problem.build(t, V100)
    req = Request(t, V100, no_swap_bytes(p) * 2 // 5 + p.scratch, "tiny_resnet.swp", ())  # ratio 2.5 for the tensors
    s, _ = baseline_setup(p, "belady", req.tensor_cap)
    turn = next(i for i, op in enumerate(s.schedule) if not p.is_forward_activation(p.op_outputs[op][0]))
    position = {op: i for i, op in enumerate(s.schedule)}
    runs: dict[str, tuple[float, int]] = {}
    for early in (None, 0.0):
        program, homes = plan_swaps_reference(p, s.schedule, req.tensor_cap, s.pinned,
                                              attrs.evolve(s.policy, early=early))
        plan = assemble(req, p, "belady", homes, tuple(program))
        validate(plan)
        first_in = min(position[ins.after] for ins in program  # the first swap-in of the backward pass
                       if isinstance(ins, SwapIn) and ins.after >= 0 and position[ins.after] >= turn)
        runs[str(early)] = (simulate(plan).iteration_ms, first_in)
    (lazy_ms, lazy_first), (early_ms, early_first) = runs["None"], runs["0.0"]
    assert early_first < lazy_first
    assert early_ms < 0.95 * lazy_ms


def test_early_swap_ins_look_no_further_ahead_than_the_horizon() -> None:
    """A horizon of 0 ops brings nothing in early (the plan without early swap-ins), one as long as the
    schedule changes nothing, and a short one brings in none as far ahead of its use as the furthest
    early swap-in without a horizon."""
    from swapdsl.planning.baselines import baseline_setup
    from swapdsl.planning.reference import plan_swaps_reference

    t = training_graph(build_graph(str(MODELS / "tiny_resnet.swp"), [])[1])
    p = Problem.build(t, V100)
    s, _ = baseline_setup(p, "belady", no_swap_bytes(p) // 2)

    def program(early: float | None, horizon: int | None) -> list[object]:
        policy = attrs.evolve(s.policy, early=early, horizon=horizon)
        return plan_swaps_reference(p, s.schedule, no_swap_bytes(p) // 2, s.pinned, policy)[0]

    lazy, eager = program(None, None), program(0.0, None)
    assert program(0.0, 0) == lazy != eager
    assert program(0.0, p.n_ops) == eager
    position = {op: i for i, op in enumerate(s.schedule)}

    def early_reach(prog: list[object]) -> list[int]:  # how far ahead of its start each swap-in serves
        return sorted(position[i.before] - (position[i.after] if i.after >= 0 else -1)
                      for i in prog if isinstance(i, SwapIn))

    bounded = program(0.0, 10)
    assert early_reach(bounded) != early_reach(eager)
    assert max(early_reach(bounded)) < max(early_reach(eager))


def test_no_schedule_of_a_small_graph_beats_the_bound() -> None:
    """What bench/bound_gap.py reports (docs/benchmarks.md's figures on the bound's tightness), for two graphs: the
    best over every schedule, pinning and policy of the search is never below the bound."""
    for seed in (0, 1):
        gap = bound_gap(seed, max_orders=30)
        assert gap.orders >= 1
        assert gap.best_ms >= gap.bound_ms
