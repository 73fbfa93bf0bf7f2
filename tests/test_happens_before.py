"""In every plan a method makes, every two accesses to the same device bytes or host memory, one of them a
write, are ordered by happens-before (``swapdsl/fuzz/races.py``): data-parallel plans too, whose
all-reduces run on a lane of their own, where the compute stream's order no longer orders everything."""

from __future__ import annotations

import attrs
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from conftest import MODELS, build_graph
from strategies import training_graphs
from swapdsl.common.errors import SwpError
from swapdsl.devices.profiles import BUILTIN
from swapdsl.graph.autodiff import training_graph
from swapdsl.graph.dataparallel import data_parallel
from swapdsl.graph.ir import Graph
from swapdsl.graph.offload import offloadable
from swapdsl.fuzz.races import unordered
from swapdsl.plan.program import Free, Plan
from swapdsl.plan.validate import validate
from swapdsl.planning.compiled import no_swap_bytes
from swapdsl.planning.ga import SearchOptions
from swapdsl.planning.optimize import optimize
from swapdsl.planning.problem import Problem, Request
from swapdsl.planning.sizing import need_bytes

V100 = BUILTIN["v100-16gb"]
METHODS = ("belady", "capuchin", "checkpoint", "ga")


def _plans(t: Graph, ratio: float, seed: int = 0, host_updates: str = "none") -> list[Plan]:
    """Each method's plan; ``host_updates`` as ``optimize`` takes it, or ``reduce``: every update that can
    on the host, with its gradient's all-reduce where only host ops read the mean."""
    p = Problem.build(t, V100)
    need = need_bytes(p, frozenset())
    cap = max(int(no_swap_bytes(p) / ratio), need) + p.scratch
    req = Request(t, V100, cap, "g.swp", ())
    if host_updates == "reduce":
        req = attrs.evolve(req, host_updates=offloadable(t), host_reduce=True)
    plans = []
    for method in METHODS if host_updates != "reduce" else [m for m in METHODS if m != "checkpoint"]:
        try:
            plans.append(optimize(req, method, SearchOptions(budget_s=1.0, generations=3, workers=1, seed=seed),
                                  None if host_updates == "reduce" else host_updates))
        except SwpError:  # (checkpointing alone may not fit a cap that swapping fits)
            assert method == "checkpoint"
    return plans


@pytest.mark.parametrize("model", ["mlp", "tiny_resnet", "tiny_transformer"])
@pytest.mark.parametrize("ranks", [1, 2])
def test_every_conflicting_access_is_ordered_in_the_zoo_s_plans(model: str, ranks: int) -> None:
    t = training_graph(build_graph(str(MODELS / f"{model}.swp"), ["batch=4"])[1])
    t = data_parallel(t, ranks, 0.5, bucket_mib=0.0)
    for plan in _plans(t, 3.0):
        assert unordered(plan) == [], plan.method


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(training_graphs(), st.sampled_from([1, 2]), st.sampled_from([1.5, 4.0, 12.0]), st.integers(0, 99),
       st.sampled_from(["none", "none", "all", "reduce"]), st.sampled_from([0.0, 0.001]))
def test_every_conflicting_access_is_ordered_on_random_graphs(t: Graph, ranks: int, ratio: float, seed: int,
                                                              host_updates: str, mib: float) -> None:
    """(Updates on the host too: the host lane's reads and writes of host memory, and its all-reduces; in
    buckets too.)"""
    assume(host_updates != "reduce" or ranks > 1)
    for plan in _plans(data_parallel(t, ranks, 0.5, bucket_mib=mib), ratio, seed, host_updates):
        assert unordered(plan) == [], plan.method


def test_the_check_finds_a_free_that_no_longer_waits() -> None:
    """The check itself: a free's waits taken away, a conflict is found (so the tests above can fail)."""
    t = data_parallel(training_graph(build_graph(str(MODELS / "mlp.swp"), ["batch=4"])[1]), 2, 0.5, bucket_mib=0)
    plan = _plans(t, 3.0)[0]
    validate(plan)
    import swapdsl.plan.replay as replay

    original = replay.Replay.free

    def forgetful(self, k: int, instr: Free):  # noqa: ANN001, ANN202
        waits, regions = original(self, k, instr)
        self.freed.assign(regions[0].offset, regions[0].end, (self.ran[instr.after], ()))
        return (), regions

    replay.Replay.free = forgetful
    try:
        assert unordered(plan)
    finally:
        replay.Replay.free = original
