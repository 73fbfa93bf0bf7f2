"""The compiled inner loop against the Python reference: same program, same iteration time, exactly."""

from __future__ import annotations

import heapq

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import MODELS
from graphs import training_graphs
from swapdsl.autodiff import training_graph
from swapdsl.cli import build_graph
from swapdsl.devices import BUILTIN
from swapdsl.fastplan import Evaluator, priority_order
from swapdsl.ga import Decoder, Genome
from swapdsl.ir import Graph
from swapdsl.planners import METHODS, Request, build_plan, size_pool
from swapdsl.pool import class_sizes, need_counts, no_swap_bytes
from swapdsl.problem import Problem
from swapdsl.simulate import simulate
from swapdsl.swapplan import Policy

V100 = BUILTIN["v100-16gb"]
POLICIES = [Policy(v, f) for v in ("lru", "belady") for f in ("none", "earliest", "ahead")]


def _need_and_no_swap(p: Problem) -> tuple[int, int]:
    schedule = list(range(p.n_ops))
    need = sum(s * n for s, n in zip(class_sizes(p), need_counts(p, schedule, frozenset())))
    return need, no_swap_bytes(p, schedule)


def _agree(req: Request, p: Problem, schedule: list[int], policy: Policy, pool, pinned) -> None:  # type: ignore[no-untyped-def]
    reference = simulate(build_plan(req, p, "x", schedule, pool, pinned, policy))
    fast = Evaluator(p, class_sizes(p))(schedule, pool, pinned, policy)
    assert (fast.iteration_ms, fast.h2d_bytes, fast.d2h_bytes) == \
        (reference.iteration_ms, reference.h2d_bytes, reference.d2h_bytes)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(training_graphs(), st.floats(0.0, 1.0), st.sampled_from(POLICIES), st.integers(0, 2**31 - 1))
def test_compiled_planner_and_simulator_agree_with_the_reference(t: Graph, where: float, policy: Policy,
                                                                  seed: int) -> None:
    """Any schedule, pool and pinning the search can produce: bit-identical time and bus bytes."""
    p = Problem.build(t, V100)
    need, no_swap = _need_and_no_swap(p)
    req = Request(t, V100, int(need + where * (no_swap - need)), "random.swp", ())
    d = Decoder(req)
    rng = np.random.default_rng(seed)
    genome = Genome(rng.normal(0, 5, p.n_ops), tuple(int(x) for x in rng.integers(0, 5, len(d.sizes))),
                    float(rng.choice([0, 0.3, 1.0])))
    decoded = d.decode(genome)
    assert decoded is not None
    schedule, pool, pinned = decoded
    _agree(req, d.p, schedule.tolist(), policy, pool, pinned)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(training_graphs(), st.floats(0.0, 1.0), st.sampled_from(sorted(METHODS)))
def test_the_baselines_agree_too(t: Graph, where: float, method: str) -> None:
    """The baselines' own pools and policies, vDNN's offloading included."""
    p = Problem.build(t, V100)
    need, no_swap = _need_and_no_swap(p)
    req = Request(t, V100, int(need + where * (no_swap - need)), "random.swp", ())
    schedule = list(range(p.n_ops))
    pool, pinned, _ = size_pool(p, schedule, req.cap)
    _agree(req, p, schedule, METHODS[method], pool, pinned)


@pytest.mark.parametrize("model", ["tiny_resnet", "tiny_transformer"])
@pytest.mark.parametrize("ratio", [1.5, 3.0])
def test_agreement_on_stdlib_models(model: str, ratio: float) -> None:
    t = training_graph(build_graph(str(MODELS / f"{model}.swp"), [])[1])
    p = Problem.build(t, V100)
    req = Request(t, V100, int(no_swap_bytes(p) / ratio), f"{model}.swp", ())
    schedule = list(range(p.n_ops))
    pool, pinned, _ = size_pool(p, schedule, req.cap)
    for policy in METHODS.values():
        _agree(req, p, schedule, policy, pool, pinned)


def _reference_order(priority: np.ndarray, preds: list[set[int]], succs: list[set[int]]) -> list[int]:
    waiting = [len(ps) for ps in preds]
    ready = [(-priority[op], op) for op in range(len(preds)) if not waiting[op]]
    heapq.heapify(ready)
    order = []
    while ready:
        _, op = heapq.heappop(ready)
        order.append(op)
        for nxt in succs[op]:
            waiting[nxt] -= 1
            if not waiting[nxt]:
                heapq.heappush(ready, (-priority[nxt], nxt))
    return order


@settings(max_examples=40, deadline=None)
@given(training_graphs(), st.integers(0, 2**31 - 1), st.sampled_from([0.0, 0.5, 5.0]))
def test_priority_order_is_the_highest_priority_ready_op_each_time(t: Graph, seed: int, scale: float) -> None:
    d = Decoder(Request(t, V100, 1 << 40, "random.swp", ()))
    priority = np.round(np.random.default_rng(seed).normal(0, 3, d.p.n_ops), 1) * scale  # ties included
    order = priority_order(priority, d.n_preds, d.succ_ptr, d.succ_idx).tolist()
    assert order == _reference_order(priority, d.preds, d.succs)
    position = {op: i for i, op in enumerate(order)}
    assert sorted(order) == list(range(d.p.n_ops))
    assert all(position[q] < position[op] for op, ps in enumerate(d.preds) for q in ps)
