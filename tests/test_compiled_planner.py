"""The compiled inner loop against the Python references: the same program as the readable swap
planner, and the same iteration time and bus bytes as the Python simulator, exactly."""

from __future__ import annotations

import heapq

import attrs
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import MODELS, build_graph
from strategies import training_graphs
from swapdsl.devices.profiles import BUILTIN
from swapdsl.graph.autodiff import training_graph
from swapdsl.graph.dataparallel import data_parallel
from swapdsl.graph.ir import Graph
from swapdsl.graph.offload import offloadable
from swapdsl.plan.simulate import simulate
from swapdsl.planning.baselines import baseline_setup, build_plan
from swapdsl.planning.compiled import Evaluator, no_swap_bytes, priority_order
from swapdsl.planning.ga import Decoder, Genome
from swapdsl.planning.policy import METHODS, OUTPUTS, Policy
from swapdsl.planning.problem import Problem, Request
from swapdsl.planning.reference import plan_swaps_reference
from swapdsl.planning.sizing import need_bytes

V100 = BUILTIN["v100-16gb"]
POLICIES = [Policy(v, f) for v in ("lru", "belady") for f in ("none", "earliest", "ahead")] + \
    [Policy("belady", "earliest", outputs=o) for o in OUTPUTS[1:]] + \
    [Policy(v, "earliest", outputs=o, early=e) for v in ("lru", "belady") for o in OUTPUTS for e in (0.0, 0.1)] + \
    [Policy(v, "earliest", early=0.0, horizon=h) for v in ("lru", "belady") for h in (1, 4)]


def _need_and_no_swap(p: Problem) -> tuple[int, int]:
    """Caps from the least any unpinned plan needs to the no-swap arena (or that least, if larger)."""
    need = need_bytes(p, frozenset())
    return need + p.scratch, max(need, no_swap_bytes(p)) + p.scratch  # caps as a user gives them


def _agree(req: Request, p: Problem, schedule: list[int], policy: Policy, pinned: frozenset[int]) -> None:
    """The compiled program and timing equal the references', with places chosen by looking at every gap
    (the default for few gaps) and with every fit read off a ranking (rank_gaps 0)."""
    program = plan_swaps_reference(p, schedule, req.tensor_cap, pinned, policy)
    reference = simulate(build_plan(req, p, "x", schedule, pinned, policy))
    for fast in (Evaluator(p), Evaluator(p, rank_gaps=0)):
        assert fast.program(schedule, req.tensor_cap, pinned, policy) == program
        timing = fast(schedule, req.tensor_cap, pinned, policy)
        assert (timing.iteration_ms, timing.h2d_bytes, timing.d2h_bytes) == \
            (reference.iteration_ms, reference.h2d_bytes, reference.d2h_bytes)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(training_graphs(), st.floats(0.0, 1.0), st.sampled_from(POLICIES), st.integers(0, 2**31 - 1), st.booleans(),
       st.sampled_from([1, 1, 2]), st.booleans())
def test_compiled_planner_and_simulator_agree_with_the_reference(t: Graph, where: float, policy: Policy,
                                                                  seed: int, on_host: bool, ranks: int,
                                                                  reduce_all: bool) -> None:
    """Any schedule, cap and pinning the search can produce, with updates on the device or on the host, on
    one rank or two (all-reduces on the network lane, over a slow link, or every gradient's over its host
    copy, its mean brought up for the device): the same program, bit-identical time (the host lane's and
    the network lane's included)."""
    t = data_parallel(t, ranks, 0.5, bucket_mib=0.0)
    host = offloadable(t) if on_host else ()
    reduce_all = reduce_all and ranks > 1
    p = Problem.build(t, V100, host, reduce_all=reduce_all)
    need, no_swap = _need_and_no_swap(p)
    req = attrs.evolve(Request(t, V100, int(need + where * (no_swap - need)), "random.swp", ()), host_updates=host,
                       reduce_all=reduce_all)
    d = Decoder(req)
    rng = np.random.default_rng(seed)
    genome = Genome(rng.normal(0, 5, p.n_ops), float(rng.choice([0, 0.3, 1.0])))
    decoded = d.decode(genome)
    assert decoded is not None
    schedule, pinned = decoded
    _agree(req, d.p, schedule.tolist(), policy, pinned)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(training_graphs(), st.floats(0.0, 1.0), st.sampled_from(sorted(METHODS)))
def test_the_baselines_agree_too(t: Graph, where: float, method: str) -> None:
    """The baselines' own pinning and policies, vDNN's offloading included."""
    p = Problem.build(t, V100)
    need, no_swap = _need_and_no_swap(p)
    req = Request(t, V100, int(need + where * (no_swap - need)), "random.swp", ())
    s, _ = baseline_setup(p, method, req.tensor_cap)
    _agree(req, p, s.schedule, s.policy, s.pinned)


@pytest.mark.parametrize("model", ["tiny_resnet", "tiny_transformer"])
@pytest.mark.parametrize("ratio", [1.5, 3.0])
def test_agreement_on_stdlib_models(model: str, ratio: float) -> None:
    t = training_graph(build_graph(str(MODELS / f"{model}.swp"), [])[1])
    p = Problem.build(t, V100)
    req = Request(t, V100, int(no_swap_bytes(p) / ratio), f"{model}.swp", ())
    for method in METHODS:
        s, _ = baseline_setup(p, method, req.tensor_cap)
        _agree(req, p, s.schedule, s.policy, s.pinned)


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


def test_tight_caps_take_the_last_resort_paths_and_still_agree(monkeypatch: pytest.MonkeyPatch) -> None:
    """At the smallest feasible cap the planner must bounce inputs and clear the arena; the compiled
    planner makes the same program there too (seeded graphs, so the paths are surely taken)."""
    import random

    from swapdsl.fuzz.graphs import seeded_training_graph
    from swapdsl.planning import reference

    taken = {"clear": 0, "bounce": 0}
    clear, acquire = reference._Planner.clear_all, reference._Planner.acquire

    def counting_clear(self: reference._Planner, *args: object) -> None:
        taken["clear"] += 1
        clear(self, *args)  # type: ignore[arg-type]

    def counting_acquire(self: reference._Planner, *args: object) -> object:
        got = acquire(self, *args)  # type: ignore[arg-type]
        taken["bounce"] += bool(got and got[1])
        return got

    monkeypatch.setattr(reference._Planner, "clear_all", counting_clear)
    monkeypatch.setattr(reference._Planner, "acquire", counting_acquire)
    for seed in range(60):
        t = seeded_training_graph(seed)
        p = Problem.build(t, V100)
        need, no_swap = _need_and_no_swap(p)
        cap = need + int(random.Random(seed).choice([0.0, 0.05]) * (no_swap - need))
        for policy in (Policy("belady", "earliest"), Policy("lru", "none"),
                       Policy("belady", "earliest", outputs="newest"), Policy("belady", "earliest", early=0.0),
                       Policy("lru", "none", outputs="newest", early=0.02), Policy("belady", "earliest", early=0.0,
                                                                                       horizon=3)):
            _agree(Request(t, V100, cap, "random.swp", ()), p, list(range(p.n_ops)), policy, frozenset())
    assert taken["clear"] > 0 and taken["bounce"] > 0


def test_the_program_does_not_depend_on_the_room_the_planner_starts_with() -> None:
    """Records, heap entries or free-position segments that run out restart the pass with more room:
    an evaluator that starts with room for one of each makes the same programs as one with the default."""
    t = training_graph(build_graph(str(MODELS / "tiny_resnet.swp"), [])[1])
    p = Problem.build(t, V100)
    need, no_swap = _need_and_no_swap(p)
    schedule = list(range(p.n_ops))
    roomy, cramped = Evaluator(p), Evaluator(p)
    cramped.room[:] = 1
    for policy in (Policy("belady", "earliest", early=0.0), Policy("lru", "none")):
        for cap in (need, (need + no_swap) // 2):
            assert cramped.program(schedule, cap, frozenset(), policy) == \
                roomy.program(schedule, cap, frozenset(), policy)
    assert (cramped.room > 1).all()  # each of the three ran out at least once


_SPANS = st.tuples(st.integers(0, 10**6), st.integers(1, 3 * 10**5), st.floats(0, 1e3, allow_nan=False))


@settings(max_examples=150, deadline=None)
@given(st.sampled_from([1000, 10**6]), st.lists(_SPANS, max_size=60), st.lists(st.tuples(st.integers(0, 10**6),
                                                                                      st.integers(1, 10**5))))
def test_compiled_free_time_segments_match_the_readable_ones(top: int, frees: list[tuple[int, int, float]],
                                                             queries: list[tuple[int, int]]) -> None:
    """The simulator's linked, bucket-indexed segments answer every look-up as arena.Segments does,
    whether a free cuts one segment in three, trims two, or swallows many (``top`` 10**6 puts several
    segments in one bucket)."""
    from swapdsl.plan.segments import Segments
    from swapdsl.planning._fastplan import segments_replay

    lo = np.array([f[0] % top for f in frees], np.int64)
    hi = np.minimum(top, lo + np.array([f[1] for f in frees], np.int64))
    when = np.array([f[2] for f in frees], np.float64)
    asks = [(i, q % top, min(top, q % top + n)) for i, (first, length, _) in enumerate(frees)
            for q, n in queries[:5] + [(first, length)]]
    after, qlo, qhi = (np.array([a[k] for a in asks], np.int64) for k in range(3))
    got = np.zeros(len(asks))
    segments_replay(top, lo, hi, when, qlo, qhi, after, got)
    reference, expected = Segments[float](), []
    for i in range(len(frees)):
        reference.assign(int(lo[i]), int(hi[i]), float(when[i]))
        expected += [max(reference.over(a, b), default=0.0) for j, a, b in asks if j == i]
    assert got.tolist() == expected


@settings(max_examples=60, deadline=None)
@given(st.sampled_from([40, 5_000, 70_000]), st.lists(st.tuples(st.integers(0, 199), st.integers(0, 10**9)),
                                                      max_size=300), st.lists(st.integers(-1, 10**9), max_size=20))
def test_the_victim_index_finds_the_best_key_at_or_below_any_other(n_keys: int, moves: list[tuple[int, int]],
                                                                   asks: list[int]) -> None:
    """The planner's ranked tenants, kept as key lists under three levels of bitmaps, give the largest
    key at or below any asked as a scan of the keys held does, as tenants come and go (70,000 keys span
    several words of every bitmap level)."""
    from swapdsl.planning._fastplan import victims_replay

    held: dict[int, int] = {}
    tensors, keys, asked, after, expected = [], [], [], [], []

    def ask(x: int, i: int) -> None:
        asked.append(x)
        after.append(i)
        expected.append(max((k for k in held.values() if k <= x), default=-1))

    for i, (t, k) in enumerate(moves):
        if t in held:
            del held[t]
            key = -1  # (it leaves)
        else:
            key = held[t] = k % (n_keys + 1) if k % 3 else k % 7  # a third of them share a few small keys
        tensors.append(t)
        keys.append(key)
        for x in asks[:4] + [n_keys, held.get(t, 0)]:
            ask(min(x % (n_keys + 2) - 1, n_keys), i)
    for k in held.values():
        ask(k, len(moves) - 1)
    got = np.zeros(len(asked), np.int64)
    victims_replay(n_keys, 200, *(np.array(v, np.int64) for v in (tensors, keys, asked, after)), got)
    assert got.tolist() == expected
