"""Data-parallel training (issue 40, first part): the graph pass, the plan's `ranks` line, the all-reduce's
simulated time, and `mpiexec -n 2` runs held to one process on the doubled batch (f64, 1e-12)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import select
import signal
import shutil
import subprocess
import sys
import time
from pathlib import Path

import attrs
import numpy as np
import pytest
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st

from swapdsl import api, cli
from swapdsl.common.errors import SwpError
from swapdsl.devices.costs import op_seconds
from swapdsl.devices.profiles import BUILTIN
from swapdsl.fuzz.graphs import seeded_training_graph
from swapdsl.graph.ir import Graph
from swapdsl.graph.checker import check_graph
from swapdsl.graph.dataparallel import canonical, data_parallel, gradient_order, members_of
from swapdsl.graph.offload import host_split, offloadable, reduces_on_host
from swapdsl.graph.ops.collective import LINK_LATENCY_S
from swapdsl.plan.figures import ONE_PASS_IDEAL
from swapdsl.plan.file import format_plan, parse_plan
from swapdsl.plan.program import Free, HostRun, Plan, Run, SwapIn, SwapOut
from swapdsl.plan.replay import walk
from swapdsl.plan.simulate import simulate
from swapdsl.runtime import dist
from swapdsl.fuzz.loopback import loopback_world
from test_runtime import run_against_reference
from swapdsl.plan.validate import validate
from swapdsl.planning import bound
from swapdsl.graph.dataparallel import DEFAULT_BUCKET_MIB
from swapdsl.planning.ga import SearchOptions, SearchProgress
from swapdsl.planning.compiled import Evaluator
from swapdsl.planning.optimize import (BUCKET_CHOICES, PLANNERS, host_requests, optimize, race_buckets, score,
                                      with_host_updates)
from swapdsl.planning.policy import METHODS
from swapdsl.planning.problem import Problem, Request
from swapdsl.planning.sizing import least_cap
from conftest import MODELS
from strategies import EVERY, training_graphs
from test_planners import V100, caps, ga_plan, plan_for

MODEL = """model net(batch = 4, features = 6, hidden = 16, classes = 3, lr = 0.1) {
    input x: f64[batch, features]
    input y: i32[batch]
    param w1: f64[features, hidden] = normal(0.5)
    param b1: f64[hidden] = zeros
    param w2: f64[hidden, hidden] = normal(0.3)
    param w3: f64[hidden, classes] = normal(0.5)
    h = relu(x @ w1 + b1)
    h = tanh(h @ w2)
    logits = h @ w3
    loss = softmax_cross_entropy(logits, y)
    minimize loss with OPTIMIZER
    report accuracy = mean(cast(argmax(logits) == y, f64))
}
"""
SGD, ADAM = "sgd(lr = lr, momentum = 0.9)", "adam(lr = 0.01)"


def _model(folder: Path, optimizer: str = SGD) -> Path:
    path = folder / "net.swp"
    path.write_text(MODEL.replace("OPTIMIZER", optimizer))
    return path


def test_every_gradient_is_averaged_before_anything_reads_it(tmp_path: Path) -> None:
    m = api.load(_model(tmp_path, ADAM), ranks=2, bucket_mib=0)
    one = api.load(_model(tmp_path, ADAM)).training
    t = m.training
    check_graph(t)
    reduced = [op for op in t.ops if op.op == "allreduce_mean"]
    assert len(one.grads) == 4 and len(reduced) == 5 and t.ranks == 2  # and the accuracy report
    assert dict(t.reports)["accuracy"] == f"{dict(one.reports)['accuracy']}/allreduced"
    assert {p: g for p, g in t.grads} == {p: f"{g}/allreduced" for p, g in one.grads}
    for (_, raw), (_, mean) in zip(one.grads, t.grads):
        made = next(i for i, op in enumerate(t.ops) if raw in op.outputs)
        assert t.ops[made + 1].outputs == (mean,)  # right after backprop finishes it
        assert not any(raw in op.inputs for op in t.ops[made + 2:])  # nothing reads the rank's own
    assert data_parallel(one, 1) is one


def test_the_simulator_charges_a_ring_all_reduce(tmp_path: Path) -> None:
    for ranks, gbps in ((2, 100.0), (8, 25.0)):
        t = api.load(_model(tmp_path), ranks=ranks, link_gbps=gbps).training
        op = next(op for op in t.ops if op.op == "allreduce_mean")
        nbytes = t.type_of(op.inputs[0]).nbytes
        dev = BUILTIN["h100-80gb"]
        want = 2 * (ranks - 1) / ranks * nbytes / (gbps * 1e9 / 8) + 2 * (ranks - 1) * LINK_LATENCY_S
        assert op_seconds(dev, t, op) == pytest.approx(dev.launch_s + want, rel=1e-12)


def test_the_bounds_count_the_network_lane_after_the_forward_pass(tmp_path: Path) -> None:
    """Over a slow link the lane's sum is most of the step, and every all-reduce reads a gradient of the
    backward pass: both bounds add the forward pass to the lane's time, and a plan still meets them."""
    t = api.load(_model(tmp_path), ranks=2, link_gbps=0.01, bucket_mib=0).training
    p = Problem.build(t, V100)
    c = bound._cut(p)
    assert bound.ideal_ms(p) == pytest.approx(sum(p.op_ms[i] for i in p.net))  # (the lane's sum)
    _, no_swap = caps(t)
    for f in (bound.bound_ms, bound.recompute_bound_ms):
        assert f(p, no_swap) >= c.f + c.net > bound.ideal_ms(p)
    plan = plan_for(t, no_swap, "belady")
    assert simulate(plan).iteration_ms >= bound.bound_ms(p, no_swap) * (1 - 1e-9)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(training_graphs(), st.floats(0.0, 1.0), st.sampled_from([0.01, 1.0, 100.0]), st.sampled_from([0.0, 0.001]),
       st.sampled_from(["ga", *sorted(METHODS), *sorted(PLANNERS)]))
def test_no_data_parallel_plan_beats_its_bound(t: Graph, where: float, gbps: float, mib: float, method: str) -> None:
    """On random graphs run by 2 ranks over a slow to a fast link, in buckets or not, every method's plan
    simulates at or above its bound (``recompute_bound_ms`` where it recomputes: capuchin's and
    checkpoint's), network lane included."""
    t = data_parallel(t, 2, gbps, bucket_mib=mib)
    need, no_swap = caps(t)
    cap = int(need + where * (no_swap - need))
    try:
        plan = ga_plan(t, cap) if method == "ga" else plan_for(t, cap, method)
    except SwpError:  # (checkpointing swaps nothing: not every cap fits it)
        assume(method != "checkpoint")
        raise
    validate(plan)
    f = dict(plan.figures)
    assert f["iteration_ms"] >= f["bound_ms"] * (1 - 1e-9)
    assert f["iteration_ms"] >= bound.recompute_bound_ms(Problem.build(t, V100), plan.tensor_cap) * (1 - 1e-9)



@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(training_graphs(), st.floats(0.0, 1.0), st.sampled_from([0.01, 1.0, 100.0]), st.sampled_from([0.0, 0.001]),
       st.sampled_from(["ga", "belady", "capuchin"]), st.booleans())
def test_no_plan_updating_on_the_host_beats_its_bound(t: Graph, where: float, gbps: float, mib: float, method: str,
                                                      reduce: bool) -> None:
    """The same with every update that can on the host, their all-reduces on the device or the host lane."""
    t = data_parallel(t, 2, gbps, bucket_mib=mib)
    assume(offloadable(t))
    need, no_swap = caps(t)
    req = Request(t, V100, int(need + where * (no_swap - need)), "random.swp", (), host_updates=offloadable(t),
                  host_reduce=reduce)
    try:
        plan = optimize(req, method, SearchOptions(generations=2, population=6, workers=1))
    except SwpError:  # (a host split may need more than the device-only schedule's smallest cap)
        assume(False)
        raise
    validate(plan)
    f = dict(plan.figures)
    assert f["iteration_ms"] >= f["bound_ms"] * (1 - 1e-9)
    assert f["iteration_ms"] >= bound.recompute_bound_ms(Problem.of(req), plan.tensor_cap) * (1 - 1e-9)

@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(training_graphs(), st.floats(0.0, 1.0), st.sampled_from([0.01, 1.0]), st.sampled_from(sorted(METHODS)),
       st.randoms(use_true_random=False))
def test_the_two_lanes_all_reduce_over_one_link(t: Graph, where: float, gbps: float, method: str, rnd) -> None:
    """With some updates on the host and their all-reduces there, the host lane's all-reduces and the
    network lane's share one link: no two of them overlap in the simulated step, and the compiled scorer
    times the plan's schedule as the simulator does."""
    t = data_parallel(t, 2, gbps, bucket_mib=0)
    host = tuple(p for p in offloadable(t) if rnd.random() < 0.5)
    assume(host)
    need, no_swap = caps(t)
    req = Request(t, V100, int(need + where * (no_swap - need)), "random.swp", (), host_updates=host,
                  host_reduce=True)
    try:
        plan = optimize(req, method)
    except SwpError:  # (a host split may need more than the device-only schedule's smallest cap)
        assume(False)
        raise
    validate(plan)
    result = simulate(plan, timeline=True)
    spans = sorted((start, end) for stream, what, start, end in result.timeline if what == "allreduce_mean")
    assert all(b[0] >= a[1] - 1e-9 for a, b in zip(spans, spans[1:]))
    changes = {when for when, _ in result.memory}  # (a network-lane all-reduce's output takes its bytes as it starts)
    assert all(start in changes for stream, what, start, _ in result.timeline if stream == "net")
    p = Problem.of(req)
    pinned = frozenset(i for i, x in enumerate(plan.tensors) if x.home is not None and x.home != "host"
                       and x.kind != "input")
    if method != "vdnn":  # (vdnn's offload is off when everything fits: the baseline decides, not the policy)
        timing = Evaluator(p)(list(range(p.n_ops)), plan.tensor_cap, pinned, METHODS[method])
        assert timing.iteration_ms == pytest.approx(result.iteration_ms, rel=1e-9)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(training_graphs(**EVERY), st.floats(0.0, 1.0), st.sampled_from([0.01, 1.0]),
       st.sampled_from([0.0, 0.001]), st.sampled_from(["ga", "capuchin", *sorted(METHODS)]),
       st.randoms(use_true_random=False))
def test_every_gradient_averaged_over_its_host_copy_trains_exactly(t: Graph, where: float, gbps: float, mib: float,
                                                                  method: str, rnd) -> None:
    """``reduce_all``: every gradient's all-reduce on the host lane, updates on the device or the host. The
    mean a device update reads comes up after the host has made it: every method's plan validates, is timed
    by the compiled scorer as simulated (its own schedule), and trains like the reference (a loopback world of
    2 ranks, on a slow bus and with slow kernels too)."""
    t = data_parallel(t, 2, gbps, bucket_mib=mib)
    host = tuple(p for p in offloadable(t) if rnd.random() < 0.5)
    need, no_swap = caps(t)
    req = Request(t, V100, int(need + where * (no_swap - need)), "random.swp", (), host_updates=host,
                  host_reduce=bool(host) and rnd.random() < 0.5, reduce_all=True)
    try:
        plan = optimize(req, method, SearchOptions(generations=2, population=6, workers=1, polish=0.0))
    except SwpError:  # (the host copies may need more than the device-only schedule's smallest cap)
        assume(False)
        raise
    validate(plan, t)
    averaged = {i.op for i in plan.program if isinstance(i, HostRun) and t.ops[i.op].op == "allreduce_mean"}
    assert averaged == {i for i, op in enumerate(t.ops) if op.op == "allreduce_mean"
                        and t.tensors[op.inputs[0]].kind.value == "gradient"}
    p = Problem.of(req)
    if method not in ("vdnn", "capuchin", "ga"):  # (their plans are not one policy's of one schedule)
        pinned = frozenset(i for i, x in enumerate(plan.tensors) if x.home is not None and x.home != "host"
                           and x.kind != "input")
        timing = Evaluator(p)(list(range(p.n_ops)), plan.tensor_cap, pinned, METHODS[method])
        assert timing.iteration_ms == pytest.approx(simulate(plan).iteration_ms, rel=1e-9)
    with loopback_world(format_plan(plan)):
        for delays in ({}, {"copy_delay_s": 0.001}, {"kernel_delay_s": 0.001}):
            assert run_against_reference(plan, t, steps=2, **delays) <= 1e-6, delays


def test_a_host_all_reduce_waits_for_the_link(tmp_path: Path) -> None:
    """Over a slow link, a plan whose host lane and network lane both all-reduce takes at least every
    all-reduce back to back, and so does its bound: the one link carries them all."""
    t = api.load(_model(tmp_path, ADAM), ranks=2, link_gbps=0.01, bucket_mib=0).training
    host = offloadable(t)[:2]
    req = Request(t, V100, caps(t)[1], "random.swp", (), host_updates=host, host_reduce=True)
    plan = optimize(req, "belady")
    runs = [o for o in plan.ops if o.op == "allreduce_mean"]
    on_host = {i.op for i in plan.program if isinstance(i, HostRun)}
    assert {o.index in on_host for o in runs} == {True, False}
    link = sum((o.host_ms if o.index in on_host else o.ms) for o in runs)
    assert simulate(plan).iteration_ms >= link
    assert bound.bound_ms(Problem.of(req), plan.tensor_cap) >= link * (1 - 1e-9)  # (the bound knows it too)


@pytest.mark.parametrize("mib", [25.0, 0.002, 0.0008, 0.0003])
def test_gradients_travel_in_buckets_of_the_size_given(tmp_path: Path, mib: float) -> None:
    """Each gradient in one bucket: one of the size given or more alone, the smaller ones in the order the
    backward pass finishes them, a bucket closing once it holds that size or with the last of them; a
    bucket of several is packed, averaged by one all-reduce and unpacked, and nothing but the pack reads a
    rank's own gradient. (The gradients: 384, 2048, 128 and 768 bytes, in that order.)"""
    one = api.load(_model(tmp_path, ADAM)).training
    t = api.load(_model(tmp_path, ADAM), ranks=2, bucket_mib=mib).training
    check_graph(t)
    made = {out: i for i, op in enumerate(one.ops) for out in op.outputs}
    raw = sorted((g for _, g in one.grads), key=made.__getitem__)
    cap, size = mib * 2**20, {g: t.type_of(g).nbytes for g in raw}
    packs = {op.outputs[0]: op.inputs for op in t.ops if op.op == "bucket_pack"}
    alone = [op.inputs[0] for op in t.ops if op.op == "allreduce_mean" and op.inputs[0] in raw]
    assert sorted([g for b in packs.values() for g in b] + alone) == sorted(raw)
    small = [g for g in raw if size[g] < cap]
    assert [g for g in raw if size[g] >= cap] == [g for g in alone if size[g] >= cap]
    buckets = sorted([*packs.values(), *[(g,) for g in alone if size[g] < cap]], key=lambda b: made[b[0]])
    assert [g for b in buckets for g in b] == small  # (the small ones, in turn)
    for k, b in enumerate(buckets):
        assert sum(size[g] for g in b) >= cap or k == len(buckets) - 1
        assert sum(size[g] for g in b[:-1]) < cap
    assert {p: g for p, g in t.grads} == {p: f"{g}/allreduced" for p, g in one.grads}
    for flat, grads in packs.items():
        unpacked = [op for op in t.ops if op.op == "bucket_unpack" and op.inputs == (f"{flat}/allreduced",)]
        assert [op.outputs[0] for op in unpacked] == [f"{g}/allreduced" for g in grads]
        assert t.type_of(flat).numel == sum(t.type_of(g).numel for g in grads)
    readers = [op.op for op in t.ops for g in raw if g in op.inputs]
    assert sorted(readers) == sorted(["bucket_pack"] * sum(map(len, packs.values())) + ["allreduce_mean"] * len(alone))
    assert (len(packs), len(alone)) == {25.0: (1, 0), 0.002: (2, 0), 0.0008: (1, 1), 0.0003: (0, 4)}[mib]


def test_a_bucket_holds_gradients_of_one_dtype(tmp_path: Path) -> None:
    """f32 and f64 gradients of one model go in buckets of their own dtype (a pack copies one dtype)."""
    path = tmp_path / "mixed.swp"
    path.write_text(MODEL.replace("OPTIMIZER", SGD).replace("param w1: f64", "param w1: f32")
                    .replace("input x: f64", "input x: f32").replace("h = relu(x @ w1 + b1)", "h = relu(cast(x @ w1, f64) + b1)"))
    t = api.load(path, ranks=2).training
    check_graph(t)
    packs = [op for op in t.ops if op.op == "bucket_pack"]
    assert all(len({t.type_of(g).dtype for g in op.inputs}) == 1 for op in packs)
    averaged = [op.inputs[0] for op in t.ops if op.op == "allreduce_mean"]
    assert {t.type_of(g).dtype.label for g in averaged} >= {"f32", "f64"}


def test_a_bucket_is_one_ring_all_reduce(tmp_path: Path) -> None:
    """One bucket pays the ring's hops once for all its gradients: its time is the ring's over their bytes."""
    dev = BUILTIN["h100-80gb"]
    t = api.load(_model(tmp_path), ranks=8, link_gbps=25.0).training
    flat = next(op.outputs[0] for op in t.ops if op.op == "bucket_pack")
    op = next(op for op in t.ops if op.op == "allreduce_mean" and op.inputs == (flat,))
    raw = {g for _, g in api.load(_model(tmp_path)).training.grads}
    nbytes = sum(t.type_of(g).nbytes for g in raw)
    want = 2 * 7 / 8 * nbytes / (25e9 / 8) + 2 * 7 * LINK_LATENCY_S
    assert op_seconds(dev, t, op) == pytest.approx(dev.launch_s + want, rel=1e-12)
    apart = api.load(_model(tmp_path), ranks=8, link_gbps=25.0, bucket_mib=0).training
    each = [op_seconds(dev, apart, o) for o in apart.ops if o.op == "allreduce_mean" and o.inputs[0] in raw]
    assert len(each) == 4  # (four gradients: three launches and rings' hops saved)
    assert sum(each) - op_seconds(dev, t, op) == pytest.approx(3 * (dev.launch_s + 2 * 7 * LINK_LATENCY_S), rel=1e-9)


def test_all_reduces_run_on_the_network_lane_beside_compute(tmp_path: Path) -> None:
    """Over a slow link the all-reduces take longer than the ops after them: on a lane of their own they
    overlap compute, the step is shorter than every op back to back, and the ideal is the longer lane.
    (Each update waits for the next all-reduce to be issued: `dataparallel._ordered`.)"""
    plan = api.optimize(api.load(_model(tmp_path), ranks=2, link_gbps=0.5, bucket_mib=0), "100%", "belady")
    sim = simulate(plan, timeline=True)
    net = [s for s in sim.timeline if s[0] == "net"]
    compute = [s for s in sim.timeline if s[0] == "compute"]
    reduces = [o for o in plan.ops if o.op == "allreduce_mean"]
    assert len(net) == len(reduces) == 5 and all(s[1] == "allreduce_mean" for s in net)
    assert not any(s[1] == "allreduce_mean" for s in compute)
    assert any(a[2] < b[3] and b[2] < a[3] for a in net for b in compute)  # at once
    on_net = sum(o.ms for o in reduces)
    on_compute = sum(o.ms for o in plan.ops) - on_net
    assert sim.compute_ms == pytest.approx(max(on_net, on_compute), rel=1e-12)
    assert sim.iteration_ms < on_net + on_compute


def test_a_late_free_of_a_gradient_waits_for_its_all_reduce(tmp_path: Path) -> None:
    """The compute stream's order says nothing of the network lane's: a gradient freed after a later compute
    op still waits for the all-reduce that reads it (and so does the next tenant of its bytes)."""
    plan = api.optimize(api.load(_model(tmp_path), ranks=2, link_gbps=0.5), "80%", "belady")
    reduce_at = {plan.ops[i.op].inputs[0]: k for k, i in enumerate(plan.program)
                 if isinstance(i, Run) and plan.ops[i.op].op == "allreduce_mean"}
    valid = []
    for k, free in enumerate(plan.program):  # each gradient's free, moved past the next compute op
        if not (isinstance(free, Free) and free.tensor in reduce_at):
            continue
        program = list(plan.program)
        later = next(j for j in range(k + 1, len(program)) if isinstance(program[j], Run)
                     and plan.ops[program[j].op].op != "allreduce_mean")
        program[k:later + 1] = [*program[k + 1:later + 1], attrs.evolve(free, after=program[later].op)]
        try:
            validate(late := attrs.evolve(plan, program=tuple(program)))
        except SwpError:
            continue  # (another tenant moves into its bytes before then)
        valid.append((free, later, late))
    assert valid
    free, later, late = valid[0]
    program, steps = late.program, list(walk(late))
    moved = next(s for s in steps if isinstance(s.instr, Free) and s.instr.tensor == free.tensor)
    assert moved.index == later and steps[reduce_at[free.tensor]].stream == "net"
    assert reduce_at[free.tensor] in moved.waits and program[later].after != program[reduce_at[free.tensor]].op


def test_after_an_all_reduce_means_after_the_compute_before_it_too(tmp_path: Path) -> None:
    """A free (or copy) "after" an all-reduce comes, in the program, after every run before it: it waits for
    the compute stream's latest run too, which the network lane's order does not imply (a swap-in into those
    bytes overwrote a tensor a compute op was still reading: found by a review, with a plan the validator
    accepted)."""
    base = api.optimize(api.load(_model(tmp_path), ranks=2, link_gbps=0.5), "100%", "belady")
    checked = 0
    for plan in [base, *_compute_moved_before_an_all_reduce(base)]:  # (so that nothing else orders it)
        steps = list(walk(plan))
        for s in steps:
            if isinstance(s.instr, (Free, SwapIn, SwapOut)) and plan.ops[s.instr.after].op == "allreduce_mean":
                net = next(x.index for x in steps if isinstance(x.instr, Run) and x.instr.op == s.instr.after)
                compute = max(x.index for x in steps[:net] if x.stream == "compute")
                assert net in s.waits and compute in s.waits, s
                checked += 1
    assert checked > 1


def _compute_moved_before_an_all_reduce(plan: Plan) -> list[Plan]:
    """Valid plans with a later compute run moved in front of an all-reduce."""
    out, program = [], list(plan.program)
    for k, run in enumerate(program):
        if not (isinstance(run, Run) and plan.ops[run.op].op == "allreduce_mean"):
            continue
        for j in range(k + 1, len(program)):
            if isinstance(program[j], Run) and plan.ops[program[j].op].op != "allreduce_mean":
                moved = program[:k] + [program[j]] + program[k:j] + program[j + 1:]
                try:
                    validate(candidate := attrs.evolve(plan, program=tuple(moved)))
                except SwpError:
                    continue
                out.append(candidate)
                break
    return out


def test_the_network_lane_keeps_its_own_scratch(tmp_path: Path) -> None:
    """An all-reduce starts while a compute kernel runs: resetting compute's scratch then made that kernel's
    temporaries overlap (wrong numbers in 2 of 4 runs of a convnet, found by a review); in a loopback world
    the lanes' runs of a swapping convnet plan stay exact, step after step."""

    from swapdsl.fuzz import run_cli
    from swapdsl.fuzz.loopback import loopback_world
    from swapdsl.runtime.interpreter import PlanRunner

    (tmp_path / "convnet.swp").write_text(CONVNET.replace("batch = 4", "batch = 16").replace("width = 4", "width = 16"))
    plan = api.optimize(api.load(tmp_path / "convnet.swp", ranks=2, link_gbps=0.5), "70%", "belady")
    api.save(plan, tmp_path / "dp.plan")
    with loopback_world((tmp_path / "dp.plan").read_text()):
        train = api.read_checked(str(tmp_path / "dp.plan"), need_model=True)[1]
        runner = PlanRunner(plan, train, "numpy", np, 0)
        assert runner.net_ctx.scratch is not runner.ctx.scratch and runner.net_ctx.step is runner.ctx.step
        run = run_cli(["exec", str(tmp_path / "dp.plan"), "--steps", "12", "--backend", "numpy", "--check", "--json"])
    assert run.code == 0, run.err
    assert json.loads(run.out)["max_rel_diff"] == 0.0


def test_an_all_reduce_is_never_recomputed(tmp_path: Path) -> None:
    """Another collective every step: recompute candidates leave all-reduces out, and the validator refuses a
    plan that reruns one."""
    from swapdsl.planning.clones import Candidates
    from swapdsl.planning.problem import Problem

    t = api.load(_model(tmp_path), ranks=2).training
    p = Problem.build(t, BUILTIN["v100-16gb"])
    assert not set(Candidates.of(p).ops) & p.net and p.net
    plan = api.optimize(api.load(_model(tmp_path), ranks=2), "100%", "belady")
    k, run = next((k, i) for k, i in enumerate(plan.program) if isinstance(i, Run) and i.op in p.net)
    again = attrs.evolve(run, recompute=True)
    with pytest.raises(SwpError, match="an all-reduce runs once a step"):
        validate(attrs.evolve(plan, program=(*plan.program[:k + 1], again, *plan.program[k + 1:])))


def test_a_plan_records_its_ranks_and_refuses_another_graph(tmp_path: Path) -> None:
    plan = api.optimize(api.load(_model(tmp_path), ranks=2, link_gbps=25), "80%", "belady")
    api.save(plan, tmp_path / "dp.plan")
    text = (tmp_path / "dp.plan").read_text()
    assert "ranks 2 link 25.0 bucket 25.0\n" in text
    back, train = api.read_checked(str(tmp_path / "dp.plan"), need_model=True)
    assert (back.ranks, back.link_gbps, back.bucket_mib, train.ranks, train.bucket_mib) == (2, 25.0, 25.0, 2, 25.0)
    # the schedule does not depend on the count: edited to 3 ranks, the plan runs on 3 (its timings were 2's)
    (tmp_path / "three.plan").write_text(text.replace("ranks 2 link", "ranks 3 link"))
    assert api.read_checked(str(tmp_path / "three.plan"), need_model=True)[1].ranks == 3
    for bad, says in (("ranks 2 link 25.0", "ranks 1 link 25.0"), ("ranks 2 link 25.0", "ranks 2 link 0"),
                      ("ranks 2 link 25.0", "ranks 5000 link 25.0"), ("ranks 2 link 25.0 bucket 25.0\n", ""),
                      (" bucket 25.0", ""), (" bucket 25.0", " bucket 0")):  # (0: one all-reduce per gradient)
        (tmp_path / "bad.plan").write_text(text.replace(bad, says))
        with pytest.raises(SwpError):
            api.read_checked(str(tmp_path / "bad.plan"), need_model=True)


@pytest.mark.parametrize("argv", [["--ranks", "0"], ["--ranks", "two"], ["--network", "-1", "--ranks", "2"],
                                  ["--network", "nan", "--ranks", "2"], ["--network", "0", "--ranks", "2"],
                                  ["--bucket-mib", "-1", "--ranks", "2"], ["--bucket-mib", "nan", "--ranks", "2"],
                                  ["--bucket-mib", "x", "--ranks", "2"], ["--bucket-mib", "inf", "--ranks", "2"]])
def test_bad_ranks_and_links_are_refused(cli, in_tmp: Path, argv: list[str]) -> None:
    _model(in_tmp)
    code, _, err = cli("optimize", "net.swp", "--memory", "80%", "--method", "belady", *argv)
    assert code == 2 and "Traceback" not in err and err.strip()


def test_a_plan_runs_with_the_buckets_it_was_planned_for(cli, in_tmp: Path) -> None:
    _model(in_tmp)
    code, _, err = cli("optimize", "net.swp", "--memory", "80%", "--method", "belady", "--ranks", "2",
                       "--bucket-mib", "0.0005", "-o", "dp.plan")
    assert code == 0, err
    assert "ranks 2 link 100.0 bucket 0.0005\n" in (in_tmp / "dp.plan").read_text()
    code, _, err = cli("exec", "dp.plan", "--bucket-mib", "25", "--steps", "1")
    assert code == 2 and "--bucket-mib 25.0: the plan was made for 0.0005" in err and "Traceback" not in err


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(training_graphs(**EVERY), st.floats(0.0, 1.0), st.sampled_from([0.01, 1.0]), st.sampled_from([0.0, 0.001]),
       st.sampled_from(sorted(METHODS)), st.sampled_from([None, "none", "all", "auto"]), st.integers(1, 2),
       st.booleans())
def test_a_search_s_score_is_the_plan_s_without_the_plan(t: Graph, where: float, gbps: float, mib: float, method: str,
                                                         host_updates: str | None, ranks: int, budget: bool) -> None:
    """What ``--bucket-mib auto``, its members and ``--host-updates auto`` score a request by (``score``: the
    compiled simulator, no plan built) is the score of the plan ``optimize`` makes, refused where it is
    refused; a host budget included."""
    t = data_parallel(t, ranks, gbps, bucket_mib=mib) if ranks > 1 else t
    need, no_swap = caps(t)
    req = Request(t, V100, int(need + where * (no_swap - need)), "random.swp", ())
    if budget:  # (some plans past it, some not)
        req = attrs.evolve(req, host_cap=int(no_swap * 2 * where))
    try:
        want = req.plan_score(optimize(req, method, None, host_updates))
    except SwpError as err:
        with pytest.raises(SwpError) as refused:
            score(req, method, host_updates)
        assert str(refused.value) == str(err)
        event("refused")
        return
    event("scored")  # (a plan past the host budget is refused: those are among the refusals)
    assert score(req, method, host_updates) == want


@pytest.mark.parametrize("method", ["belady", "capuchin"])
def test_auto_chooses_the_bucket_size_whose_plan_is_fastest(method: str) -> None:
    """``bucket_mib="auto"``: of ``BUCKET_CHOICES``, the size whose plan is fastest. On a small
    transformer, one all-reduce per gradient at 2 ranks over 1 Gb/s (each bucket waits for its last
    gradient), 1 MiB buckets at 8 ranks over 100 Gb/s (each all-reduce pays 14 hops)."""
    chosen = []
    for ranks, gbps in ((2, 1.0), (8, 100.0)):
        m = api.load(MODELS / "tiny_transformer.swp", ranks=ranks, link_gbps=gbps)
        fixed = {mib: dict(api.optimize(m, "1/2", method, bucket_mib=mib).figures)["iteration_ms"]
                 for mib in BUCKET_CHOICES}
        plan = api.optimize(m, "1/2", method, bucket_mib="auto")
        assert plan.bucket_mib == min(fixed, key=lambda mib: (fixed[mib], mib != DEFAULT_BUCKET_MIB, mib))
        ms = dict(plan.figures)["iteration_ms"]  # (the members searched from that size's: faster, or none)
        assert ms < min(fixed.values()) if plan.bucket_members else ms == min(fixed.values())
        chosen.append(plan.bucket_mib)
    assert chosen == [0.0, 1.0]


def test_members_cut_the_size_rule_s_buckets_or_any_other_and_are_checked(tmp_path: Path) -> None:
    """``members``: one bucket number per gradient, in the order the backward pass finishes them. The
    size rule's members cut its buckets again, at every size; any numbering from 0 cuts those buckets, a
    bucket of several packed and averaged once, after its last gradient; bad numberings are refused."""
    one = api.load(_model(tmp_path, ADAM)).training
    order = gradient_order(one)
    for mib in (*BUCKET_CHOICES, 0.002, 0.0008, 0.0003):
        members = members_of(one, mib)
        assert data_parallel(one, 2, bucket_mib=mib, members=members).ops == data_parallel(one, 2, bucket_mib=mib).ops
    t = data_parallel(one, 2, members=(0, 1, 0, 1))  # (two buckets, each of two gradients apart)
    check_graph(t)
    packs = [op.inputs for op in t.ops if op.op == "bucket_pack"]
    assert sorted(packs) == sorted([(order[0], order[2]), (order[1], order[3])])
    made = {out: i for i, op in enumerate(t.ops) for out in op.outputs}
    for pack in packs:
        assert all(made[g] < made[f"{pack[0]}/bucket"] for g in pack)
    assert t.bucket_members == (0, 1, 0, 1)
    for bad, says in (((0, 1, 0), "one bucket number per gradient, 4, not 3"), ((1, 0, 0, 0), "numbered"),
                      ((0, 2, 1, 1), "numbered"), ((0, True, 0, 0), "numbered"), ((0, -1, 0, 0), "numbered")):
        with pytest.raises(SwpError, match=says):
            data_parallel(one, 2, members=bad)
    path = tmp_path / "mixed.swp"  # (w1's gradient in f32, the others in f64)
    path.write_text(MODEL.replace("OPTIMIZER", SGD).replace("param w1: f64", "param w1: f32")
                    .replace("input x: f64", "input x: f32").replace("h = relu(x @ w1 + b1)", "h = relu(cast(x @ w1, f64) + b1)"))
    with pytest.raises(SwpError, match="a bucket holds one dtype"):
        data_parallel(api.load(path).training, 2, members=(0, 0, 0, 0))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(training_graphs(), st.floats(0.0, 1.0), st.sampled_from(["belady", "capuchin", "ga"]),
       st.randoms(use_true_random=False))
def test_any_members_plan_validate_and_an_edit_is_refused_at_the_ranks_line(t: Graph, where: float, method: str,
                                                                            rnd) -> None:
    """Random members (of each dtype apart) on random graphs: every method's plan validates against its
    graph and alone (the members cut the buckets its ops average), and with the members edited to
    another cut it is refused at the ``ranks`` line, with or without its graph."""
    grads = gradient_order(t)
    assume(len(grads) >= 2)
    members = canonical([(t.type_of(g).dtype.label, rnd.randrange(len(grads))) for g in grads])
    dp = data_parallel(t, 2, 1.0, members=members)
    check_graph(dp)
    need, no_swap = caps(dp)
    cap = int(need + where * (no_swap - need))
    plan = ga_plan(dp, cap) if method == "ga" else plan_for(dp, cap, method)
    validate(plan, dp)
    validate(plan)
    other = next((m for m in (canonical([(t.type_of(g).dtype.label, rnd.randrange(len(grads))) for g in grads])
                              for _ in range(20)) if m != members), None)
    assume(other is not None)
    text = format_plan(plan)
    line = next(x for x in text.splitlines() if x.startswith("ranks "))
    edited = text.replace(line, line[: line.index(" members ")] + " members " + " ".join(map(str, other)))
    for graph in (None, dp):
        with pytest.raises(SwpError) as refused:
            validate(parse_plan(edited, "edited.plan"), graph)
        assert refused.value.span is not None and refused.value.span.line == text.splitlines().index(line) + 1


def test_auto_searches_the_members_and_the_plan_keeps_them(cli, in_tmp: Path) -> None:
    """On the small transformer at 2 ranks over 1 Gb/s, ``auto`` finds members that plan faster than the
    best size (``planning.members``), the same on every call (a seeded search); the plan records them on its
    ``ranks`` line, and a plan whose members do not fit its model, or are not numbered from 0, is refused
    at that line."""
    m = api.load(MODELS / "tiny_transformer.swp", ranks=2, link_gbps=1.0)
    best = min(dict(api.optimize(m, "1/2", "belady", bucket_mib=mib).figures)["iteration_ms"] for mib in BUCKET_CHOICES)
    plan = api.optimize(m, "1/2", "belady", bucket_mib="auto")
    assert plan.bucket_members and dict(plan.figures)["iteration_ms"] < best
    assert format_plan(api.optimize(m, "1/2", "belady", bucket_mib="auto")) == format_plan(plan)
    both = api.optimize(m, "1/2", "belady", microbatches="auto", bucket_mib="auto")  # (the chosen count's members)
    assert both.bucket_members and both.microbatches == 1 and format_plan(both) == format_plan(plan)
    assert parse_plan(format_plan(plan)) == plan
    train = api.load(MODELS / "tiny_transformer.swp", ranks=2, link_gbps=1.0, bucket_mib=plan.bucket_mib,
                     bucket_members=plan.bucket_members).training
    validate(plan, train)
    shutil.copy(MODELS / "tiny_transformer.swp", in_tmp)
    code, out, err = cli("optimize", "tiny_transformer.swp", "--memory", "1/2", "--method", "belady", "--ranks", "2",
                         "--network", "1", "--bucket-mib", "auto", "-o", "dp.plan")
    assert code == 0, err
    n = max(plan.bucket_members) + 1
    assert f"on 2 ranks over 1 Gb/s ({n} buckets of members searched from one all-reduce per gradient)" in out
    text = (in_tmp / "dp.plan").read_text()
    line = f"ranks 2 link 1.0 bucket 0.0 members {' '.join(map(str, plan.bucket_members))}\n"
    assert line in text
    at = text[:text.index(line)].count("\n") + 1
    for edit, bad, says in ((" members 0 ", " members 0 0 ", "the plan's bucket members do not fit"),
                       (" members 0 ", " members 1 ", "numbered from 0, each new bucket the next"),
                       (" members 0 ", " members 0 x ", "")):
        (in_tmp / "bad.plan").write_text(text.replace(edit, bad, 1))
        code, _, err = cli("exec", "bad.plan", "--steps", "1")
        assert code == 2 and "Traceback" not in err and f"bad.plan:{at}:" in err and says in err, err


def test_ga_races_a_search_per_bucket_size() -> None:
    """``ga`` under ``auto`` probes a search per request and finishes the best (``race_buckets``): given the
    same graph under a tight and a loose cap, in either order, it ends under the loose one. Under
    ``auto`` its plan has one of the sizes and is valid."""
    t = api.load(MODELS / "tiny_transformer.swp", ranks=8, link_gbps=100.0).training
    need, no_swap = caps(t)
    options = SearchOptions(budget_s=600.0, generations=3, workers=1, polish=0.0)
    requests = [Request(t, V100, cap, "t.swp", ()) for cap in (need, no_swap)]
    for order in (requests, requests[::-1]):
        assert race_buckets(order, options).cap == no_swap
    m = api.load(MODELS / "tiny_transformer.swp", ranks=8, link_gbps=100.0)
    reports: list[SearchProgress] = []
    plan = api.optimize(m, "1/2", "ga", bucket_mib="auto", budget_s=600.0, generations=3, workers=1,
                        progress=reports.append)
    validate(plan)
    assert plan.bucket_mib in BUCKET_CHOICES
    assert len({r.bucket_mib for r in reports}) >= 2 and reports[-1].bucket_mib == plan.bucket_mib
    out = io.StringIO()
    cli._search_progress(out)(SearchProgress(2, 0.5, 300, 3.0, 6.0, bucket_mib=5.0))
    assert "ga:   3.0 s of 6 s, buckets of 5 MiB, generation 2, best fraction 0.5000" in out.getvalue()
    cli._search_progress(out)(SearchProgress(2, 0.5, 300, 3.0, 6.0, bucket_mib=0.0, buckets_searched=True))
    assert "6 s, members searched from one all-reduce per gradient, generation 2" in out.getvalue()


@pytest.mark.parametrize("method", ["belady", "ga"])
def test_auto_buckets_refused_at_a_count_leave_the_micro_batches_to_try_more(method: str) -> None:
    """At 1/6 no bucket size fits one pass of the small transformer on 2 ranks: ``auto`` for both moves
    on to 2 micro-batches (it stopped at the first count). With one pass, the error is that of the size
    needing the least cap (0 MiB: 3.51 MiB, where 25 MiB needs 4.60), names it, and hints the micro-batches
    that fit at that size."""
    m = api.load(MODELS / "tiny_transformer.swp", ranks=2)
    knobs = {"budget_s": 600.0, "generations": 2, "workers": 1}
    plan = api.optimize(m, "1/6", method, microbatches="auto", bucket_mib="auto", **knobs)
    validate(plan)
    assert plan.microbatches == 2 and plan.bucket_mib != DEFAULT_BUCKET_MIB
    chosen = attrs.evolve(m, bucket_mib=plan.bucket_mib, bucket_members=plan.bucket_members)  # (the one-pass
    # ideal is the chosen buckets')
    assert dict(plan.figures)[ONE_PASS_IDEAL] == api.one_pass_ideal_ms(chosen, api.load_device(None))
    with pytest.raises(SwpError) as refused:
        api.optimize(m, "1/6", method, bucket_mib="auto", **knobs)
    text = refused.value.render()
    assert "smallest feasible cap for this model, 3.51 MiB" in text
    assert "with the gradients in buckets of 0 MiB, the size of --bucket-mib auto that needs the least" in text
    assert "--microbatches 2 (or auto) fits it" in text


def test_bucket_auto_is_for_optimize_and_says_what_it_chose(cli, in_tmp: Path) -> None:
    shutil.copy(MODELS / "tiny_transformer.swp", in_tmp)
    code, out, err = cli("optimize", "tiny_transformer.swp", "--memory", "1/2", "--method", "belady", "--ranks", "8",
                         "--bucket-mib", "auto", "-o", "dp.plan")
    assert code == 0 and re.search(r"on 8 ranks over 100 Gb/s \(\d+ buckets of members searched from buckets of "
                                   r"1 MiB\)", out), err
    assert "ranks 8 link 100.0 bucket 1.0 members 0 " in (in_tmp / "dp.plan").read_text()
    code, out, err = cli("check", "tiny_transformer.swp", "--ranks", "2", "--bucket-mib", "auto")
    assert code == 2 and out == "" and "got `auto` (auto is for `optimize` alone)" in err


# ---- real ranks: mpiexec -n 2 -------------------------------------------------------------------------


def _mpiexec() -> str:
    found = shutil.which("mpiexec", path=str(Path(sys.executable).parent)) or shutil.which("mpiexec")
    if found is None:
        pytest.skip("no mpiexec (pip install 'swapdsl[dist]')")
    pytest.importorskip("mpi4py")
    return found


def _swapdsl(folder: Path, *argv: str, ranks: int = 1) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
    env = {k: v for k, v in env.items() if not k.startswith(("PMI_", "PMIX_", "OMPI_"))}
    prefix = [_mpiexec(), "-n", str(ranks)] if ranks > 1 else []
    return subprocess.run([*prefix, sys.executable, "-m", "swapdsl", *argv], cwd=folder, env=env,
                          capture_output=True, text=True, timeout=240)


def _state(path: Path) -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file

    return load_file(str(path))


def _two_ranks_as_one(folder: Path, plan: str, model: str) -> tuple[dict, dict]:
    """Runs ``plan`` on 2 ranks (``--check``) and ``model`` in one process on the doubled batch, 5 steps
    each; holds their final states equal to 1e-12 and returns both runs' JSON."""
    two = _swapdsl(folder, "exec", plan, "--steps", "5", "--backend", "numpy", "--check", "--save",
                   "two.safetensors", "--json", ranks=2)
    assert two.returncode == 0, two.stderr
    one = _swapdsl(folder, "exec", model, "-D", "batch=8", "--steps", "5", "--backend", "numpy",
                   "--save", "one.safetensors", "--json")
    assert one.returncode == 0, one.stderr
    a, b = _state(folder / "two.safetensors"), _state(folder / "one.safetensors")
    assert sorted(a) == sorted(b)
    for name in b:
        if b[name].dtype.kind == "f":
            np.testing.assert_allclose(a[name], b[name], rtol=1e-12, atol=1e-15)
    return json.loads(two.stdout), json.loads(one.stdout)  # (rank 0 alone printed)


DROPOUTS = {"rows": "h = dropout(tanh(h @ w2), 0.4)", "weights": "h = tanh(h @ dropout(w2, 0.4))"}


@pytest.mark.parametrize("method,memory,dropout,micro,bucket", [
    ("belady", "75%", "", 1, "0"), ("belady", "75%", "", 1, "0.002"), ("capuchin", "70%", "", 1, "0"),
    ("capuchin", "60%", "", 1, "25"),
    ("capuchin", "60%", "rows", 1, "25"), ("belady", "90%", "rows", 2, "0.002"), ("belady", "90%", "weights", 2, "25")])
def test_two_ranks_train_as_one_process_on_the_doubled_batch(tmp_path: Path, method: str, memory: str,
                                                             dropout: str, micro: int, bucket: str) -> None:
    """(With dropout too: each rank hashes its rows' element indices where the doubled batch has them, in
    micro-batches too; a dropout over a weight draws the one mask one process draws. Gradients averaged
    one by one, in two buckets of two, and all in one bucket.)"""
    _mpiexec()
    _model(tmp_path, ADAM)
    if dropout:
        text = (tmp_path / "net.swp").read_text()
        (tmp_path / "net.swp").write_text(text.replace("h = tanh(h @ w2)", DROPOUTS[dropout]))
    done = _swapdsl(tmp_path, "optimize", "net.swp", "--ranks", "2", "--memory", memory, "--method", method,
                    "--microbatches", str(micro), "--bucket-mib", bucket, "-o", "dp.plan", "--json")
    assert done.returncode == 0, done.stderr
    plan, _ = api.read_checked(str(tmp_path / "dp.plan"), need_model=True)
    packs = [o for o in plan.ops if o.op == "bucket_pack"]
    assert len(packs) == {"0": 0, "0.002": 2, "25": 1}[bucket], [o.inputs for o in packs]
    kinds = [type(i).__name__ for i in plan.program]
    assert "SwapIn" in kinds and "SwapOut" in kinds  # a plan that swaps ...
    assert method != "capuchin" or kinds.count("Run") > len(plan.ops)  # ... and recomputes
    ran, alone = _two_ranks_as_one(tmp_path, "dp.plan", "net.swp")
    np.testing.assert_allclose(ran["loss"], alone["loss"], rtol=1e-12)
    assert [m["accuracy"] for m in ran["metrics"]] == pytest.approx([m["accuracy"] for m in alone["metrics"]])
    assert ran["max_rel_diff"] == 0.0  # the plan beside the reference, both averaged over the ranks


CONVNET = """model convnet(batch = 4, classes = 3, width = 4, lr = 0.05) {
    input images: f64[batch, 3, 8, 8]
    input labels: i32[batch]
    param w0: f64[width, 3, 3, 3] = normal(0.3)
    param w1: f64[width, width, 3, 3] = normal(0.2)
    param w2: f64[width, width, 3, 3] = normal(0.2)
    param w3: f64[2 * width, width, 1, 1] = normal(0.3)
    param fc: f64[2 * width, classes] = normal(0.5)
    param fb: f64[classes] = zeros
    h = relu(conv2d(images, w0, padding = (1, 1)))
    r = relu(conv2d(h, w1, padding = (1, 1)))
    h = relu(h + conv2d(r, w2, padding = (1, 1)))
    h = relu(conv2d(h, w3, stride = 2))
    logits = global_avg_pool(h) @ fc + fb
    loss = softmax_cross_entropy(logits, labels)
    minimize loss with sgd(lr = lr, momentum = 0.9, weight_decay = 5e-4)
}
"""


def test_two_ranks_with_searched_members_train_as_one_process(tmp_path: Path) -> None:
    """Buckets as members give them (two buckets, each of two gradients apart), under a plan that swaps:
    two ranks end 5 steps where one process on the doubled batch does."""
    _mpiexec()
    path = _model(tmp_path, ADAM)
    m = api.load(path, ranks=2, bucket_mib=25, bucket_members=(0, 1, 0, 1))
    plan = api.optimize(m, "75%", "belady")
    assert plan.bucket_members == (0, 1, 0, 1) and "SwapIn" in {type(i).__name__ for i in plan.program}
    api.save(plan, tmp_path / "dp.plan")
    assert "ranks 2 link 100.0 bucket 25.0 members 0 1 0 1\n" in (tmp_path / "dp.plan").read_text()
    _two_ranks_as_one(tmp_path, "dp.plan", "net.swp")


def test_a_residual_convnet_on_two_ranks_trains_as_one_process(tmp_path: Path) -> None:
    """tiny_resnet's shape without batch norm (whose statistics are each rank's own), f64, under a plan that
    swaps and recomputes: two ranks end 5 steps where one process on the doubled batch does."""
    _mpiexec()
    (tmp_path / "convnet.swp").write_text(CONVNET)
    done = _swapdsl(tmp_path, "optimize", "convnet.swp", "--ranks", "2", "--memory", "75%", "--method", "capuchin",
                    "--bucket-mib", "0.001", "-o", "dp.plan")
    assert done.returncode == 0, done.stderr
    plan, _ = api.read_checked(str(tmp_path / "dp.plan"), need_model=True)
    kinds = [type(i).__name__ for i in plan.program]
    assert "SwapIn" in kinds and kinds.count("Run") > len(plan.ops)
    assert any(o.op == "bucket_pack" for o in plan.ops) and any(o.op == "bucket_unpack" for o in plan.ops)
    _two_ranks_as_one(tmp_path, "dp.plan", "convnet.swp")


def test_a_run_with_other_ranks_than_its_plan_stops_with_one_error(tmp_path: Path) -> None:
    _mpiexec()
    _model(tmp_path)
    assert _swapdsl(tmp_path, "optimize", "net.swp", "--ranks", "2", "--memory", "80%", "--method", "belady",
                    "-o", "dp.plan").returncode == 0
    for ranks in (1, 3):
        done = _swapdsl(tmp_path, "exec", "dp.plan", "--steps", "1", "--backend", "numpy", ranks=ranks)
        assert done.returncode == 2 and "Traceback" not in done.stderr
        assert done.stderr.count("error: the plan runs on 2 ranks") == 1, done.stderr
    done = _swapdsl(tmp_path, "exec", "dp.plan", "--ranks", "3", "--steps", "1", "--backend", "numpy", ranks=2)
    assert done.returncode == 2 and "--ranks 3: the plan was made for 2" in done.stderr, done.stderr
    one = _swapdsl(tmp_path, "exec", "net.swp", "--ranks", "2", "--steps", "1", "--backend", "numpy", ranks=2)
    assert one.returncode == 0, one.stderr  # a model trained data-parallel with the reference executor
    one = _swapdsl(tmp_path, "exec", "net.swp", "--steps", "1", "--backend", "numpy", ranks=2)
    assert one.returncode == 2  # (it said "--ranks 1 runs the model", where no --ranks was given)
    assert one.stderr.count("error: --ranks 1 (the default) runs the model on 1 rank and this run has 2") == 1


def test_two_ranks_read_their_own_rows_of_each_shuffled_batch(tmp_path: Path) -> None:
    """--data: each step's batch is the ranks' together, and each rank trains on its own rows of it; two
    shuffled epochs, a checkpoint half-way and a resumed run end where one process on the doubled batch does."""
    _mpiexec()
    _model(tmp_path, ADAM)
    rng = np.random.default_rng(3)
    (tmp_path / "data").mkdir()
    np.save(tmp_path / "data" / "x.npy", rng.standard_normal((44, 6)))
    np.save(tmp_path / "data" / "y.npy", rng.integers(0, 3, 44).astype(np.int32))
    assert _swapdsl(tmp_path, "optimize", "net.swp", "--ranks", "2", "--memory", "75%", "--method", "belady",
                    "-o", "dp.plan").returncode == 0
    common = ["--data", "data", "--shuffle", "--backend", "numpy", "--seed", "4"]
    half = _swapdsl(tmp_path, "exec", "dp.plan", *common, "--steps", "5", "--save", "half.safetensors", ranks=2)
    assert half.returncode == 0, half.stderr
    two = _swapdsl(tmp_path, "exec", "dp.plan", *common, "--epochs", "2", "--resume", "half.safetensors",
                   "--save", "two.safetensors", ranks=2)
    assert two.returncode == 0, two.stderr
    one = _swapdsl(tmp_path, "exec", "net.swp", "-D", "batch=8", *common, "--epochs", "2", "--save",
                   "one.safetensors")
    assert one.returncode == 0, one.stderr
    a, b = _state(tmp_path / "two.safetensors"), _state(tmp_path / "one.safetensors")
    for name in b:
        if b[name].dtype.kind == "f":
            np.testing.assert_allclose(a[name], b[name], rtol=1e-12, atol=1e-15)
    assert "step 10/10" in two.stdout and "step 10/10" in one.stdout  # 44 examples: 5 batches of 8 an epoch


def test_ranks_running_different_plans_are_refused_at_start(tmp_path: Path) -> None:
    """An MPI peer that runs another plan would call its collectives in another order: refused, by name."""
    launcher = _mpiexec()
    _model(tmp_path)
    for method, out in (("belady", "a.plan"), ("capuchin", "b.plan")):
        assert _swapdsl(tmp_path, "optimize", "net.swp", "--ranks", "2", "--memory", "70%", "--method", method,
                        "-o", out).returncode == 0
    run = [sys.executable, "-m", "swapdsl", "exec"]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "PMIX_", "OMPI_"))}
    done = subprocess.run([launcher, "-n", "1", *run, "a.plan", "--steps", "1", ":", "-n", "1", *run, "b.plan",
                           "--steps", "1"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.count("error: rank 1 runs a different training step from rank 0") == 1, done.stderr


def test_ranks_on_different_backends_are_refused_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rank 1 runs the same plan on CuPy, rank 0 on NumPy: their all-reduces would be NCCL's and MPI's, each
    waiting for the other until the watchdog. Refused at the start, naming both (a stand-in world of two
    ranks: this machine has no CuPy); the same backend on both passes."""

    class OtherBackend:
        def Get_size(self) -> int:  # noqa: N802 (mpi4py's names)
            return 2

        def allgather(self, mine: tuple[str, str]) -> list[tuple[str, str]]:
            return [mine, (mine[0], mine[1].replace(" on numpy", " on cupy"))]

    monkeypatch.setattr(dist, "world", lambda: OtherBackend())
    monkeypatch.setattr(dist, "watchdog", lambda: None)
    g = data_parallel(seeded_training_graph(1), 2, 0.5, bucket_mib=0.0)
    with pytest.raises(dist.EveryRank, match=r"^rank 1 runs on cupy, rank 0 on numpy$"):
        dist.join(g, "the plan", "numpy")
    monkeypatch.setattr(OtherBackend, "allgather", lambda self, mine: [mine, mine])
    dist.join(g, "the plan", "numpy")


def test_a_checkpoint_resumes_only_with_its_ranks(tmp_path: Path) -> None:
    _mpiexec()
    _model(tmp_path)
    assert _swapdsl(tmp_path, "exec", "net.swp", "--ranks", "2", "--steps", "2", "--backend", "numpy", "--save",
                    "two.safetensors", ranks=2).returncode == 0
    done = _swapdsl(tmp_path, "exec", "net.swp", "--steps", "4", "--backend", "numpy", "--resume", "two.safetensors")
    assert done.returncode == 2 and "its data-parallel ranks differ" in done.stderr, done.stderr


@pytest.mark.parametrize("line", ["ranks -1 link 25.0", "ranks 2.5 link 25.0", "ranks 2 link -3", "ranks 2 link nan",
                                  "ranks 2 link 1e999", "ranks 2", "ranks link 25.0", "ranks 99999999999999999999 link 1",
                                  "ranks 2 link 25.0\nranks 2 link 25.0", "ranks 2 link 25.0 extra", "ranks 0 link 1",
                                  "ranks 2 link 25.0 bucket -1", "ranks 2 link 25.0 bucket nan",
                                  "ranks 2 link 25.0 bucket", "ranks 2 link 25.0 bucket 1e999",
                                  "ranks 2 link 25.0 bucket 25 bucket 25", "ranks 2 bucket 25 link 25.0",
                                  "ranks 2 link 25.0 bucket 1" + "0" * 400])
def test_a_damaged_ranks_line_is_refused_at_its_line(tmp_path: Path, line: str) -> None:
    plan = api.optimize(api.load(_model(tmp_path), ranks=2, link_gbps=25), "80%", "belady")
    api.save(plan, tmp_path / "dp.plan")
    text = (tmp_path / "dp.plan").read_text()
    (tmp_path / "bad.plan").write_text(text.replace("ranks 2 link 25.0 bucket 25.0", line))
    at = text.splitlines().index("ranks 2 link 25.0 bucket 25.0") + 1
    with pytest.raises(SwpError) as caught:
        api.read_checked(str(tmp_path / "bad.plan"), need_model=True)
    assert caught.value.span is not None and caught.value.span.line in (at, at + 1), caught.value.render()


def test_a_model_whose_inputs_are_not_per_example_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "m.swp"  # a mask over the hidden units: one for the whole batch, not per example
    path.write_text(MODEL.replace("OPTIMIZER", SGD).replace("    input y: i32[batch]\n",
                                                            "    input y: i32[batch]\n    input mask: f64[hidden]\n")
                    .replace("h = relu(x @ w1 + b1)", "h = relu(x @ w1 + b1) * mask"))
    api.load(path)
    with pytest.raises(SwpError, match="data-parallel ranks split every input"):
        api.load(path, ranks=2)
    (tmp_path / "n.swp").write_text(MODEL.replace("OPTIMIZER", SGD).replace("batch = 4, ", "")
                                    .replace("[batch", "[4"))
    with pytest.raises(SwpError, match="no `batch`"):
        api.load(tmp_path / "n.swp", ranks=2)
    m = api.load(_model(tmp_path), microbatches=2, ranks=2)  # micro-batches and ranks together
    assert m.training.ranks == 2 and m.training.microbatches == 2


def test_ranks_given_different_runs_or_failing_alone_end_together(tmp_path: Path) -> None:
    """A rank that stopped early or failed alone would leave the others in an all-reduce for ever: other
    steps are refused on every rank, a rank's own error ends them all (exit 2, its error printed)."""
    launcher = _mpiexec()
    _model(tmp_path)
    assert _swapdsl(tmp_path, "optimize", "net.swp", "--ranks", "2", "--memory", "80%", "--method", "belady",
                    "-o", "dp.plan").returncode == 0
    run = [sys.executable, "-m", "swapdsl", "exec", "dp.plan", "--backend", "numpy"]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "PMIX_", "OMPI_"))}
    for steps in (1, 2):
        assert _swapdsl(tmp_path, "exec", "dp.plan", "--steps", str(steps), "--backend", "numpy", "--save",
                        f"ck{steps}.safetensors", ranks=2).returncode == 0
    for mine, theirs, says in ((["--steps", "3"], ["--steps", "4"], "error: rank 1 runs steps 1 to 4, rank 0 1 to 3"),
                               (["--steps", "3"], ["--steps", "3", "--data", "nowhere"], "error: --data `nowhere`"),
                               (["--steps", "3", "--init", "ck1.safetensors"], ["--steps", "3", "--init",
                                "ck2.safetensors"], "error: rank 1 runs a start from"),
                               (["--steps", "3", "--check"], ["--steps", "3"], "error: rank 1 runs a start from"),
                               (["--steps", "3"], ["--steps", "3", "--on-nonfinite", "continue"],
                                "error: rank 1 runs --on-nonfinite continue, rank 0 stop"),
                               (["--steps", "3", "--save", "c.safetensors"], ["--steps", "3"],
                                "error: rank 1 takes checkpoints never (no --save), rank 0 after the last step"),
                               (["--steps", "3", "--save", "c.safetensors", "--save-every", "2"],
                                ["--steps", "3", "--save", "d.safetensors", "--save-every", "1"],
                                "error: rank 1 takes checkpoints after every step, rank 0 every 2 steps and after "
                                "the last")):
        done = subprocess.run([launcher, "-n", "1", *run, *mine, ":", "-n", "1", *run, *theirs], cwd=tmp_path,
                              env=env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 2 and "Traceback" not in done.stderr
        assert done.stderr.count(says) == 1, done.stderr
        assert "Abort(" not in done.stderr  # stopped at a start check together: no rank aborted
    for argv, says in ((["--data", "nowhere"], "error: --data `nowhere`"),
                       (["--resume", "missing.safetensors"], "error: --resume `missing.safetensors`"),
                       (["--save", "missing/ck.safetensors"], "error: cannot write `missing/ck.safetensors`")):
        done = _swapdsl(tmp_path, "exec", "dp.plan", "--backend", "numpy", *argv, ranks=2)
        assert done.returncode == 2 and "Traceback" not in done.stderr and "Abort(" not in done.stderr
        assert done.stderr.count(says) == 1, done.stderr  # every rank's error, printed once
    # a one-rank plan on two ranks, one of them also failing on its own: both stop at once (one waited for
    # ever in the watchdog's set-up before)
    assert _swapdsl(tmp_path, "optimize", "net.swp", "--memory", "80%", "--method", "belady",
                    "-o", "one.plan").returncode == 0
    one = [sys.executable, "-m", "swapdsl", "exec", "one.plan", "--backend", "numpy", "--steps", "2"]
    done = subprocess.run([launcher, "-n", "1", *one, ":", "-n", "1", *one, "--save", "missing/x.safetensors"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and done.stderr.count("error: ") == 1, done.stderr


def test_only_the_report_reads_a_report_s_average(tmp_path: Path) -> None:
    """A report that also feeds the loss keeps the rank's own value there (each rank's gradient is its own
    loss's); a reported parameter and the guard's reports (from the averaged gradients) need no average."""
    path = tmp_path / "r.swp"
    path.write_text(MODEL.replace("OPTIMIZER", SGD)
                    .replace("    param w3", "    param s: f64[] = zeros\n    param w3")
                    .replace("    loss = softmax_cross_entropy(logits, y)",
                             "    aux = mean(h * h)\n    loss = softmax_cross_entropy(logits, y) + aux * aux * s")
                    .replace("    report accuracy", "    report aux = aux\n    report accuracy"))
    t = api.load(path, ranks=2, guard="skip").training
    check_graph(t)
    reports = dict(t.reports)
    assert reports["aux"].endswith("/allreduced") and reports["accuracy"].endswith("/allreduced")
    assert not reports["finite"].endswith("/allreduced")  # made from the averaged gradients
    readers = [op.op for op in t.ops if reports["aux"] in op.inputs]
    assert readers == ["report"]


def test_a_command_line_every_rank_refuses_is_reported_once_without_an_abort(tmp_path: Path) -> None:
    done = _swapdsl(tmp_path, "exec", "--no-such-flag", "net.plan", ranks=2)
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("error: unrecognized arguments: --no-such-flag") == 1, done.stderr
    assert "Abort" not in done.stderr and "Traceback" not in done.stderr, done.stderr


@pytest.mark.parametrize("bad", [0, 1])
def test_one_rank_whose_command_line_is_refused_stops_every_rank(tmp_path: Path, bad: int) -> None:
    """Launched by MPMD (a command line per rank), one refused line used to leave the other rank waiting
    for ever in its first collective."""
    _model(tmp_path)
    assert _swapdsl(tmp_path, "optimize", "net.swp", "--memory", "80%", "--method", "belady", "--ranks", "2",
                    "-o", "dp.plan").returncode == 0
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "PMIX_", "OMPI_"))}
    lines = [[sys.executable, "-m", "swapdsl", "exec", "dp.plan", "--steps", "1", *(["--bogus"] if r == bad else [])]
             for r in (0, 1)]
    done = subprocess.run([_mpiexec(), "-n", "1", *lines[0], ":", "-n", "1", *lines[1]], cwd=tmp_path,
                          env=env | {"OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("error: unrecognized arguments: --bogus") == 1, done.stderr
    assert "Abort" not in done.stderr and "Traceback" not in done.stderr, done.stderr


def test_one_rank_that_prints_its_help_stops_every_rank(tmp_path: Path) -> None:
    """``--help`` on one rank of an MPMD launch: it prints the usage and exits 0; the other rank, which
    waited for ever before, exits 2 without a word."""
    _model(tmp_path)
    assert _swapdsl(tmp_path, "optimize", "net.swp", "--memory", "80%", "--method", "belady", "--ranks", "2",
                    "-o", "dp.plan").returncode == 0
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "PMIX_", "OMPI_"))}
    done = subprocess.run([_mpiexec(), "-n", "1", sys.executable, "-m", "swapdsl", "exec", "dp.plan", ":", "-n", "1",
                           sys.executable, "-m", "swapdsl", "--help"], cwd=tmp_path, env=env | {"OMP_NUM_THREADS": "1"},
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stdout.startswith("usage: swapdsl"), done.stderr
    assert "Traceback" not in done.stderr and "Abort" not in done.stderr, done.stderr


def test_ranks_take_one_blas_thread_each_unless_told(tmp_path: Path) -> None:
    launcher = _mpiexec()
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PMI_", "PMIX_", "OMPI_")) and k not in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS",
                                                                        "MKL_NUM_THREADS")}
    # (one write a rank: two ranks' lines never interleave)
    show = "import os, swapdsl; os.write(1, (str(os.environ.get('OPENBLAS_NUM_THREADS')) + '\\n').encode())"
    for given, want in (({}, "1"), ({"OMP_NUM_THREADS": "2"}, "None")):
        done = subprocess.run([launcher, "-n", "2", sys.executable, "-c", show], env={**env, **given},
                              capture_output=True, text=True, timeout=60)
        assert done.stdout.split() == [want, want], done.stderr
    alone = subprocess.run([sys.executable, "-c", show], env=env, capture_output=True, text=True, timeout=60)
    assert alone.stdout.split() == ["None"]


# ---- faults: a rank that hangs or is killed ----------------------------------------------------------


def _start_ranks(folder: Path, *argv: str, mark: str) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "PMIX_", "OMPI_"))}
    env |= {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "SWAPDSL_TEST_MARK": mark}
    return subprocess.Popen([_mpiexec(), "-n", "2", sys.executable, "-m", "swapdsl", *argv], cwd=folder, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _rank_pid(mark: str, rank: int) -> int:
    """The process of one rank, found by the mark in its environment (Linux's /proc)."""
    want = {f"SWAPDSL_TEST_MARK={mark}".encode(), f"PMI_RANK={rank}".encode()}
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and want <= set((entry / "environ").read_bytes().split(b"\0")):
                return int(entry.name)
        except OSError:
            continue
    raise AssertionError(f"no rank {rank} running")


def _when_saved(run: subprocess.Popen, path: Path) -> None:
    """Wait for the run's first checkpoint, so that the fault comes mid-run."""
    deadline = time.monotonic() + 120
    while not path.exists():
        assert run.poll() is None, run.communicate()
        assert time.monotonic() < deadline
        time.sleep(0.05)


def _first_error(run: subprocess.Popen, limit_s: float = 60) -> str:
    """The run's standard error up to its first `error:` line (read as it comes; at most ``limit_s``)."""
    assert run.stderr is not None
    fd, seen, deadline = run.stderr.fileno(), b"", time.monotonic() + limit_s
    while not re.search(rb"error:[^\n]*\n", seen):  # (read from the descriptor: nothing left in a buffer)
        ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        assert ready, ("no error within the limit", seen)
        chunk = os.read(fd, 1 << 16)
        assert chunk, ("the run ended without an error", seen)
        seen += chunk
    return seen.decode()


@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="finds ranks through /proc")
@pytest.mark.parametrize("fault", ["hang", "kill"])
def test_a_rank_that_hangs_or_dies_ends_the_run_and_keeps_the_last_checkpoint(tmp_path: Path, fault: str) -> None:
    """A hung rank (SIGSTOP): the other stops after --rank-timeout with one error naming it and the step, exit
    2. A killed one: the launcher ends the other at once. Either way the last checkpoint resumes, and no
    temporary file is left once it has saved again."""
    _mpiexec()
    _model(tmp_path)
    assert _swapdsl(tmp_path, "optimize", "net.swp", "--ranks", "2", "--memory", "80%", "--method", "belady",
                    "-o", "dp.plan").returncode == 0
    mark = f"{fault}-{os.getpid()}"
    run = _start_ranks(tmp_path, "exec", "dp.plan", "--steps", "100000000", "--backend", "numpy", "--save",
                       "ck.safetensors", "--save-every", "50", "--rank-timeout", "2", mark=mark)
    try:
        _when_saved(run, tmp_path / "ck.safetensors")
        victim = _rank_pid(mark, 1)
        faulted = time.monotonic()
        os.kill(victim, signal.SIGSTOP if fault == "hang" else signal.SIGKILL)
        said = _first_error(run) if fault == "hang" else ""
        took = time.monotonic() - faulted
        if fault == "hang":  # (a stopped process takes the launcher's SIGTERM only once it runs again: under
            with contextlib.suppress(ProcessLookupError):  # load MPICH's launcher then outwaited the test; a
                os.kill(victim, signal.SIGCONT)  # hung one takes it; one the launcher already ended needs none)
        _, err = run.communicate(timeout=60)
        err = said + err
    finally:
        if run.poll() is None:
            run.kill()
            run.communicate()
    took = took if fault == "hang" else time.monotonic() - faulted
    assert "Traceback" not in err
    if fault == "hang":
        # MPICH's mpiexec exits with the OR of its ranks' wait statuses: 2 from rank 0's abort, and at times
        # SIGKILL's 9 as well, when it counts the hung rank it killed after the abort (seen in CI under load)
        assert run.returncode in (2, signal.SIGKILL) and 2 <= took < 2 + 1 + 15, (took, err)  # timeout, news, grace
        assert err.count("error: rank 1 did not reach the ") == 1 and "within 2 s, where rank 0 waited" in err, err
        assert re.search(r"of step \d+ within", err), err
    else:
        assert run.returncode != 0 and took < 30, (took, err)
    def temporaries() -> list[Path]:
        return [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]

    # (the launcher SIGKILLs rank 0 too, at times mid-write: its temporary, never renamed over the checkpoint,
    # stays until the next write of that file clears it)
    assert fault == "kill" or not temporaries()
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    (tmp_path / f".ck.safetensors.{int(gone.stdout)}.planted.tmp").write_bytes(b"half")  # (as a kill leaves)
    from safetensors import safe_open

    with safe_open(str(tmp_path / "ck.safetensors"), "numpy") as f:
        step = int(f.metadata()["step"])
    assert step % 50 == 0
    again = _swapdsl(tmp_path, "exec", "dp.plan", "--resume", "ck.safetensors", "--steps", str(step + 2), "--backend",
                     "numpy", "--save", "ck.safetensors", ranks=2)
    assert again.returncode == 0, again.stderr
    assert not temporaries()


SLOW_RANK = """
import sys, time
import swapdsl.runtime.streams as streams
streams.WAIT_TIMEOUT_S = 0.3  # a lane's patience, made short
from swapdsl import cli
from swapdsl.runtime import dist

at_step = dist.at_step


def slow(step):
    if dist.rank() == 1 and step == 2:
        time.sleep(2.0)  # rank 0's step 2 waits in its first all-reduce
    at_step(step)


dist.at_step = slow
sys.exit(cli.main(sys.argv[1:]))
"""


def _two_ranks_of(folder: Path, script: str, *argv: str) -> subprocess.CompletedProcess:
    """``script`` (a wrapper around the command line) run by 2 ranks with ``argv``, beside a 2-rank
    ``belady`` plan ``dp.plan`` of the test's model."""
    launcher = _mpiexec()
    _model(folder)
    assert _swapdsl(folder, "optimize", "net.swp", "--ranks", "2", "--memory", "80%", "--method", "belady",
                    "-o", "dp.plan").returncode == 0
    (folder / "rank.py").write_text(script)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "PMIX_", "OMPI_"))}
    return subprocess.run([launcher, "-n", "2", sys.executable, "rank.py", *argv], cwd=folder, env=env,
                          capture_output=True, text=True, timeout=120)

def test_a_lane_waits_behind_a_slow_rank_without_calling_the_plan_deadlocked(tmp_path: Path) -> None:
    """Rank 0's copy lanes wait for its compute lane, which waits in an all-reduce for a slower rank 1:
    past the lanes' own timeout, within the ranks' (the watchdog's business, not theirs)."""
    done = _two_ranks_of(tmp_path, SLOW_RANK, "exec", "dp.plan", "--steps", "3", "--backend", "numpy")
    assert done.returncode == 0 and "deadlocked" not in done.stderr, done.stderr


def _host_reduced(t: Graph, reduce: bool = True):
    return host_split(t, offloadable(t), reduce=reduce)


@pytest.mark.parametrize("mib", [0, 25])
def test_a_host_updated_gradient_may_be_averaged_over_its_host_copy(mib: float) -> None:
    """``reduce`` moves each all-reduce only host updates read to the host lane, with the gradient's cast
    to f32 before it (the half gradient goes down) and a bucket's pack and unpacks; the network lane keeps
    the rest (the accuracy report's)."""
    t = api.load(MODELS / "mlp.swp", {"depth": 2, "batch": 8, "features": 32, "hidden": 16}, precision="bf16",
                 ranks=2, bucket_mib=mib).training
    device_reduce, host_reduce = _host_reduced(t, reduce=False), _host_reduced(t)
    moved = host_reduce.ops - device_reduce.ops
    names = sorted({t.ops[i].op for i in moved})
    assert names == (["allreduce_mean", "cast"] if mib == 0 else ["allreduce_mean", "bucket_pack", "bucket_unpack",
                                                                   "cast"])
    assert all(t.type_of(n).dtype.label == "bf16" for n in host_reduce.read - device_reduce.read)
    assert {t.type_of(n).dtype.label for n in device_reduce.read} == {"f32"}  # (averaged and cast on the device)
    with_reduce, without = Problem.build(t, V100, offloadable(t), True), Problem.build(t, V100, offloadable(t))
    assert without.net - with_reduce.net == {i for i in moved if t.ops[i].op == "allreduce_mean"}
    assert with_reduce.net  # (the accuracy's mean)
    if mib:  # a bucket shared with a gradient updated on the device is averaged there, and unpacked there
        one = offloadable(t)[:1]
        assert host_split(t, one, reduce=True).ops == host_split(t, one).ops and not reduces_on_host(t, one)


def test_a_mean_the_device_reads_stays_on_the_network_lane(tmp_path: Path) -> None:
    """Clipping reads every averaged gradient on the device (their norm): nothing more moves."""
    t = api.load(_model(tmp_path, "adam(lr = 0.01, clip = 1.0)"), ranks=2, bucket_mib=0).training
    assert offloadable(t) and not reduces_on_host(t, offloadable(t))
    assert _host_reduced(t).ops == _host_reduced(t, reduce=False).ops


def test_host_updates_choose_where_the_gradients_are_averaged(tmp_path: Path) -> None:
    """With ranks, ``all`` and ``auto`` try each choice of updates with its all-reduces on the device and on
    the host, and keep the faster plan."""
    m = api.load(_model(tmp_path, ADAM), ranks=2, bucket_mib=0)
    need, no_swap = caps(m.training)
    req = Request(m.training, V100, no_swap, m.path, m.graph.args)
    trials = host_requests(req, "all")
    assert [(bool(r.host_updates), r.host_reduce) for r in trials] == [(True, False), (True, True)]
    assert [(bool(r.host_updates), r.host_reduce) for r in host_requests(req, "auto")][-2:] == [(True, False),
                                                                                                (True, True)]
    assert host_requests(attrs.evolve(req, graph=api.load(_model(tmp_path, ADAM)).training), "all")[-1].host_reduce \
        is False
    times = {r.host_reduce: dict(optimize(r, "belady").figures)["iteration_ms"] for r in trials}
    chosen = with_host_updates(req, "belady", "all")
    assert times[chosen.host_reduce] == min(times.values())
    assert with_host_updates(req, "belady", "none").host_reduce is False


@pytest.mark.parametrize("method", ["belady", "capuchin", "ga"])
def test_plans_averaging_host_copies_are_valid_and_timed_as_the_compiled_scorer(tmp_path: Path, method: str) -> None:
    m = api.load(MODELS / "mlp.swp", {"depth": 2, "batch": 8, "features": 32, "hidden": 16}, precision="bf16",
                 ranks=2, link_gbps=1.0, bucket_mib=0)
    t = m.training
    need, no_swap = caps(t)
    req = Request(t, V100, (need + no_swap) // 2, m.path, m.graph.args, host_updates=offloadable(t), host_reduce=True)
    plan = optimize(req, method, SearchOptions(generations=2, population=8, workers=1))
    validate(plan, t)
    on_host = {t.ops[i.op].op for i in plan.program if isinstance(i, HostRun)}
    assert "allreduce_mean" in on_host
    back = parse_plan(format_plan(plan))
    assert format_plan(back) == format_plan(plan)
    f = dict(plan.figures)
    assert simulate(back).iteration_ms == pytest.approx(f["iteration_ms"], rel=1e-12)
    assert f["iteration_ms"] >= f["bound_ms"] * (1 - 1e-9)
    if method == "belady":  # the compiled scorer's time of the same schedule is the plan's
        pinned = frozenset(i for i, x in enumerate(plan.tensors) if x.home is not None and x.home != "host"
                           and x.kind != "input")
        order = [i.op for i in plan.program if isinstance(i, (Run, HostRun))]
        timing = Evaluator(Problem.of(req))(order, plan.tensor_cap, pinned, METHODS[method])
        assert timing.iteration_ms == pytest.approx(f["iteration_ms"], rel=1e-9)


@pytest.mark.parametrize("bucket", [0.0, 25.0])
def test_two_ranks_averaging_host_copies_train_as_one_process(tmp_path: Path, bucket: float) -> None:
    """A plan whose Adam updates and their gradients' all-reduces run on the host lane (over a communicator
    of its own, beside the network lane's accuracy mean): 2 ranks end 5 steps where one process on the
    doubled batch does, to 1e-12."""
    _mpiexec()
    m = api.load(_model(tmp_path, ADAM), ranks=2, bucket_mib=bucket)
    t = m.training
    need, no_swap = caps(t)
    req = Request(t, V100, (need + no_swap) // 2, m.path, m.graph.args, host_updates=offloadable(t), host_reduce=True)
    plan = optimize(req, "belady")
    assert sum(isinstance(i, HostRun) and t.ops[i.op].op == "allreduce_mean" for i in plan.program) == \
        (4 if bucket == 0 else 1)
    (tmp_path / "dp.plan").write_text(format_plan(plan))
    assert _two_ranks_as_one(tmp_path, "dp.plan", "net.swp")[0]["max_rel_diff"] == 0.0


def test_gradients_updated_on_the_device_may_be_averaged_over_their_host_copies(tmp_path: Path) -> None:
    """``auto`` also tries every gradient's all-reduce over its host copy, updates on the device: on the small
    transformer in one 4 MiB bucket that takes the smallest cap from 4.16 MiB to 0.88 MiB (the pack never
    takes device memory). The test's model so planned trains on 2 ranks as one process on the doubled
    batch, its means coming up from the host for the device's Adam."""
    m = api.load(MODELS / "tiny_transformer.swp", {"batch": 2, "seq": 8}, ranks=2)
    req = Request(m.training, V100, 10**9, m.path, m.graph.args)
    trials = host_requests(req, "auto")
    assert [(r.host_updates, r.host_reduce, r.reduce_all) for r in trials][:2] == [((), False, False), ((), False, True)]
    device, host = (least_cap(Problem.of(r)) for r in trials[:2])
    assert (device, host) == (4364032, 919296)
    with pytest.raises(SwpError) as refused:  # (the refusal of the default, --host-updates none, says so)
        api.optimize(m, "1MiB", "belady")
    assert "hint: --host-updates auto fits it (gradients averaged over their host copies" in refused.value.render()
    _mpiexec()
    t = api.load(_model(tmp_path, ADAM), ranks=2).training
    need, no_swap = caps(t)
    req = Request(t, V100, (need + no_swap) // 2, "net.swp", (), reduce_all=True)
    plan = optimize(req, "belady")
    validate(plan, t)
    means = {o.outputs[0] for o in plan.ops if o.op in ("allreduce_mean", "bucket_unpack") and
             any(isinstance(i, HostRun) and i.op == o.index for i in plan.program)}
    assert any(isinstance(i, SwapIn) and i.tensor in means for i in plan.program)  # (up for the device's update)
    (tmp_path / "dp.plan").write_text(format_plan(plan))
    assert _two_ranks_as_one(tmp_path, "dp.plan", "net.swp")[0]["max_rel_diff"] == 0.0


def test_a_cap_only_the_host_copy_all_reduce_fits_is_planned_and_trains_exactly(tmp_path: Path) -> None:
    """tiny_transformer's gradients fill one 4 MiB bucket, whose pack sets the device's smallest cap
    (4.16 MiB with every update on the host): averaged over the host copies, 1 MiB fits, the command line
    chooses it, and 2 ranks run it beside the reference."""
    _mpiexec()
    shutil.copy(MODELS / "tiny_transformer.swp", tmp_path / "t.swp")
    args = ["optimize", "t.swp", "-D", "batch=2", "-D", "seq=8", "--ranks", "2", "--memory", "1MiB",
            "--method", "belady", "-o", "dp.plan"]
    refused = _swapdsl(tmp_path, *args, "--host-updates", "none")
    assert refused.returncode == 2 and "below the smallest feasible cap" in refused.stderr, refused.stderr
    assert "--host-updates auto fits it" in refused.stderr
    done = _swapdsl(tmp_path, *args, "--host-updates", "all")
    assert done.returncode == 0, done.stderr
    below = _swapdsl(tmp_path, *[a if a != "1MiB" else "300KiB" for a in args], "--host-updates", "all")
    least = int(re.search(r"use --memory (\d+) or more", below.stderr).group(1))  # (the host copies' cap, not 4.16 MiB)
    assert below.returncode == 2 and 300 * 1024 < least <= 1 << 20, below.stderr
    plan, t = api.read_checked(str(tmp_path / "dp.plan"), need_model=True)
    assert any(isinstance(i, HostRun) and t.ops[i.op].op == "allreduce_mean" for i in plan.program)
    two = _swapdsl(tmp_path, "exec", "dp.plan", "--steps", "3", "--backend", "numpy", "--check", "--json", ranks=2)
    assert two.returncode == 0, two.stderr
    out = json.loads(two.stdout)
    assert out["max_rel_diff"] <= 1e-5 and out["collectives"] == "MPI over 2 ranks"


AWOL_BEFORE_THE_COMMAND_LINE = """
import os, sys, time
from swapdsl import cli

if os.environ.get("PMI_RANK") == "1":  # a rank that never reaches the command-line check (nor MPI's start)
    time.sleep(60) if sys.argv[1] == "hang" else sys.exit(0)
sys.exit(cli.main(sys.argv[2:]))
"""


@pytest.mark.parametrize("fault", ["hang", "exit"])
def test_a_rank_that_never_reaches_the_command_line_check_ends_the_run(tmp_path: Path, fault: str) -> None:
    """MPI starts at the command-line check and its start waits for every rank: a rank that hangs or ends
    before it used to leave the others there for ever (spinning, deaf to SIGTERM). Now the run ends after
    their --rank-timeout, with one error."""
    began = time.monotonic()
    done = _two_ranks_of(tmp_path, AWOL_BEFORE_THE_COMMAND_LINE, fault, "exec", "dp.plan", "--steps", "1",
                         "--rank-timeout", "2")
    assert time.monotonic() - began < 45, done.stderr
    assert done.returncode != 0, done.stderr  # (the launcher's status for the rank it saw killed)
    says = "error: not every rank reached the command-line check within 2 s (rank 0 waited)"
    assert done.stderr.count(says) == 1 and "Traceback" not in done.stderr, done.stderr


@pytest.mark.gpu
@pytest.mark.parametrize("graph", ["on", "off"])
def test_two_ranks_train_on_cupy_like_the_reference(tmp_path: Path, graph: str) -> None:
    """On CuPy (runtime/nccl.py): NCCL where each rank has a GPU, else MPI through host memory (one GPU), the
    CUDA graph on or off; 2 ranks of a plan that swaps train like the reference, and say which collective
    ran."""
    _mpiexec()
    _model(tmp_path, ADAM)
    assert _swapdsl(tmp_path, "optimize", "net.swp", "--ranks", "2", "--memory", "70%", "--method", "belady",
                    "-o", "dp.plan").returncode == 0
    two = _swapdsl(tmp_path, "exec", "dp.plan", "--steps", "3", "--backend", "cupy", "--graph", graph, "--check",
                   "--json", ranks=2)
    assert two.returncode == 0, two.stderr
    out = json.loads(two.stdout)
    assert out["max_rel_diff"] <= 1e-5 and out["collectives"].startswith(("NCCL on GPU", "MPI through")), out


@pytest.mark.gpu
def test_two_ranks_average_host_copies_on_cupy_like_the_reference(tmp_path: Path) -> None:
    """On CuPy, an all-reduce of host copies runs on the host lane (a host function hands it to a worker
    thread, which averages over MPI on a communicator of its own) beside the device's all-reduces: the plan
    only the host copies fit trains on 2 ranks like the reference."""
    _mpiexec()
    shutil.copy(MODELS / "tiny_transformer.swp", tmp_path / "t.swp")
    done = _swapdsl(tmp_path, "optimize", "t.swp", "-D", "batch=2", "-D", "seq=8", "--ranks", "2", "--memory", "1MiB",
                    "--method", "belady", "--host-updates", "all", "-o", "dp.plan")
    assert done.returncode == 0, done.stderr
    plan, t = api.read_checked(str(tmp_path / "dp.plan"), need_model=True)
    assert any(isinstance(i, HostRun) and t.ops[i.op].op == "allreduce_mean" for i in plan.program)
    two = _swapdsl(tmp_path, "exec", "dp.plan", "--steps", "3", "--backend", "cupy", "--check", "--json", ranks=2)
    assert two.returncode == 0, two.stderr
    assert json.loads(two.stdout)["max_rel_diff"] <= 1e-5
