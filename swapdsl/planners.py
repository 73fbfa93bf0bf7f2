"""Planners: training graph + device + cap -> Plan. One table keyed by method name.

The baselines share the default schedule (the training graph's order), the
pinning choice of sizing.py and the swap planner; they differ in their policy:

- ``lru``: on-demand swap-ins, least-recently-used victims, no prefetch;
- ``vdnn``: vDNN's offload of forward activations during the forward pass,
  prefetch one op ahead in the backward pass, LRU victims when memory runs out;
- ``belady``: furthest-next-use victims, every swap-in as early as its region and
  its host copy allow.

Persistent tensors (params and optimiser state) are pinned on the device when
the arena has room for them (all of them, when the cap allows a plan with no
swapping at all, or when they take at most half the cap); otherwise they live
on the host, come in when needed, and their new values are written back.
"""

from __future__ import annotations

import attrs

from swapdsl.analysis import peak_bytes
from swapdsl.bound import bound_ms, ideal_ms
from swapdsl.devices import Device
from swapdsl.errors import SwpError
from swapdsl.fastplan import Evaluator
from swapdsl.ir import Graph
from swapdsl.plan import HOST, Plan, PlanOp, PlanTensor, Region
from swapdsl.problem import Problem
from swapdsl.simulate import simulate
from swapdsl.sizing import choose_pinned, no_swap_bytes
from swapdsl.swapplan import Policy

METHODS: dict[str, Policy] = {
    "lru": Policy("lru", "none"),
    "vdnn": Policy("lru", "ahead", offload=True),
    "belady": Policy("belady", "earliest"),
}


@attrs.frozen
class Request:
    graph: Graph  # the training graph
    device: Device
    cap: int
    model_path: str
    model_args: tuple[tuple[str, int | float | bool], ...]


def optimize(req: Request, method: str, search: SearchOptions | None = None) -> Plan:
    if method == "ga":
        from swapdsl.ga import genetic_search

        return genetic_search(req, search or SearchOptions()).plan
    if method not in METHODS:
        raise SwpError(f"unknown method `{method}`", hints=[f"methods: ga, {', '.join(METHODS)}"])
    p = Problem.build(req.graph, req.device)
    plan, no_swap = baseline(req, p, method)
    return with_figures(plan, p, no_swap)


@attrs.frozen
class Setup:
    """What a planner decides before the swap planner runs."""

    schedule: list[int]
    pinned: frozenset[int]
    policy: Policy


def baseline_setup(p: Problem, method: str, cap: int, no_swap: int | None = None) -> tuple[Setup, int]:
    """A baseline's schedule, pinning and policy, and the no-swap arena's bytes (given, or found)."""
    schedule = list(range(p.n_ops))
    no_swap = no_swap_bytes(p, schedule) if no_swap is None else no_swap
    pinned = choose_pinned(p, cap, no_swap)
    policy = METHODS[method]
    if no_swap <= cap:
        policy = attrs.evolve(policy, offload=False)  # like vDNN's dynamic mode: no offload when all fits
    return Setup(schedule, pinned, policy), no_swap


def baseline(req: Request, p: Problem, method: str) -> tuple[Plan, int]:
    """A baseline's plan (without figures) on the default schedule, and the no-swap arena's bytes."""
    evaluator = Evaluator(p)  # flattened once: it sizes the no-swap arena and makes the plan
    s, no_swap = baseline_setup(p, method, req.cap, evaluator.no_swap_bytes(list(range(p.n_ops))))
    return build_plan(req, p, method, s.schedule, s.pinned, s.policy, evaluator), no_swap


@attrs.frozen
class SearchOptions:
    """The genetic search's knobs (see ga.py)."""

    budget_s: float = 60.0
    generations: int = 100_000
    population: int = 64
    seed: int = 0
    workers: int = 0  # 0: every core
    progress: bool = False


def build_plan(req: Request, p: Problem, method: str, schedule: list[int], pinned: frozenset[int],
               policy: Policy, evaluator: Evaluator | None = None) -> Plan:
    """The plan the compiled swap planner makes (``evaluator``: ``p`` already flattened, if at hand)."""
    program, homes = (evaluator or Evaluator(p)).program(schedule, req.cap, pinned, policy)
    return assemble(req, p, method, homes, tuple(program))


def assemble(req: Request, p: Problem, method: str, homes: dict[int, Region], program: tuple) -> Plan:
    tensors = []
    for t, name in enumerate(p.names):
        home: Region | str | None = homes.get(t)
        if home is None and t in p.persistent:
            home = HOST
        tensors.append(PlanTensor(name, p.nbytes[t], p.kinds[t], home))
    ops = tuple(PlanOp(i, op.op, p.op_ms[i], op.inputs, op.outputs) for i, op in enumerate(req.graph.ops))
    return Plan(req.model_path, req.graph.source_sha256, req.model_args, method,
                attrs.evolve(req.device, op_times=()), req.cap, tuple(tensors), ops,
                req.graph.loss, req.graph.updates, program)


def with_figures(plan: Plan, p: Problem, no_swap: int, extra: dict[str, float] | None = None) -> Plan:
    """The simulated figures, stored in the plan (nothing that varies from run to run)."""
    r = simulate(plan)
    ideal = ideal_ms(p)
    figures = {
        "ideal_ms": ideal,
        "bound_ms": bound_ms(p, plan.cap),
        "iteration_ms": r.iteration_ms,
        "fraction": ideal / r.iteration_ms if r.iteration_ms > 0 else 1.0,
        "swap_bytes": float(r.swap_bytes),
        "h2d_bytes": float(r.h2d_bytes),
        "d2h_bytes": float(r.d2h_bytes),
        "peak_device_bytes": float(r.peak_device_bytes),
        "host_bytes": float(r.host_bytes),
        "ratio": no_swap / plan.cap,
        "no_swap_bytes": float(no_swap),
        "graph_peak_bytes": float(peak_bytes(p.graph)),
        **(extra or {}),
    }
    return attrs.evolve(plan, figures=tuple(figures.items()))
