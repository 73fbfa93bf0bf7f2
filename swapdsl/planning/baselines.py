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

from collections.abc import Iterable

import attrs

from swapdsl.common.errors import SwpError
from swapdsl.common.units import format_bytes
from swapdsl.devices.costs import op_times_ms
from swapdsl.graph.analysis import peak_bytes
from swapdsl.plan.figures import plan_figures
from swapdsl.plan.program import HOST, Plan, PlanOp, PlanTensor, Region
from swapdsl.plan.simulate import simulate
from swapdsl.planning.bound import bound_ms, recompute_bound_ms
from swapdsl.planning.capuchin import capuchin_set
from swapdsl.planning.checkpoint import checkpoint_program
from swapdsl.planning.clones import Extensions, to_base
from swapdsl.planning.compiled import Evaluator, Timing, no_swap_bytes
from swapdsl.planning.hostlane import Lane, with_host_runs
from swapdsl.planning.policy import METHODS, Policy
from swapdsl.planning.problem import Problem, Request
from swapdsl.planning.sizing import choose_pinned


@attrs.frozen
class Setup:
    """What a planner decides before the swap planner runs."""

    schedule: list[int]
    pinned: frozenset[int]
    policy: Policy
    recompute: tuple[int, ...] = ()  # forward ops recomputed for the backward pass (clones.py)


def baseline_setup(p: Problem, method: str, cap: int, no_swap: int | None = None) -> tuple[Setup, int]:
    """A baseline's schedule, pinning and policy, and the no-swap arena's bytes (given, or found)."""
    schedule = list(range(p.n_ops))
    no_swap = no_swap_bytes(p, schedule) if no_swap is None else no_swap
    pinned = choose_pinned(p, cap, no_swap)
    policy = METHODS[method]
    if no_swap <= cap:
        policy = attrs.evolve(policy, offload=False)  # like vDNN's dynamic mode: no offload when all fits
    return Setup(schedule, pinned, policy), no_swap


def plan_baseline(req: Request, method: str) -> Plan:
    """The plan of baseline ``method`` (a key of METHODS), with its figures."""
    p = Problem.of(req)
    plan, no_swap = baseline(req, p, method)
    return with_figures(plan, p, no_swap)


def baseline_timing(req: Request, method: str) -> Timing:
    """What ``plan_baseline``'s figures say of its plan's step time and host bytes, from the compiled
    simulator, with no plan built (its property tests hold it to ``simulate``): how a search among requests
    scores them, building only the plan it keeps."""
    evaluator, s, _ = _flattened_setup(req, Problem.of(req), method)
    return evaluator(s.schedule, req.tensor_cap, s.pinned, s.policy)


def baseline(req: Request, p: Problem, method: str) -> tuple[Plan, int]:
    """A baseline's plan (without figures) on the default schedule, and the no-swap arena's bytes."""
    evaluator, s, no_swap = _flattened_setup(req, p, method)
    return build_plan(req, p, method, s.schedule, s.pinned, s.policy, evaluator), no_swap


def _flattened_setup(req: Request, p: Problem, method: str) -> tuple[Evaluator, Setup, int]:
    """``p`` flattened once (it sizes the no-swap arena, then plans or times), the baseline's setup, and the
    no-swap arena's bytes."""
    evaluator = Evaluator(p)
    s, no_swap = baseline_setup(p, method, req.tensor_cap, evaluator.no_swap_bytes(list(range(p.n_ops))))
    return evaluator, s, no_swap


def build_plan(req: Request, p: Problem, method: str, schedule: list[int], pinned: frozenset[int],
               policy: Policy, evaluator: Evaluator | None = None, recompute: Iterable[int] = (),
               extensions: Extensions | None = None) -> Plan:
    """The plan the compiled swap planner makes (``evaluator``: ``p`` already flattened, if at hand), with
    the forward ops in ``recompute`` recomputed for the backward pass where the schedule allows
    (``clones.py``; ``extensions``: those of ``p``, if at hand)."""
    recompute = tuple(recompute)
    if not recompute:
        program, homes = (evaluator or Evaluator(p)).program(schedule, req.tensor_cap, pinned, policy)
        return assemble(req, p, method, homes, tuple(program))
    ext, ext_evaluator, merged = (extensions or Extensions(p)).prepare(schedule, recompute)
    program, homes = ext_evaluator.program(merged, req.tensor_cap, pinned, policy)
    return assemble(req, p, method, homes, tuple(to_base(ext, program)))


def assemble(req: Request, p: Problem, method: str, homes: dict[int, Region], program: tuple) -> Plan:
    tensors = []
    for t, name in enumerate(p.names):
        home: Region | str | None = homes.get(t)
        if home is None and t in p.persistent:
            home = HOST
        tensors.append(PlanTensor(name, p.nbytes[t], p.kinds[t], home))
    device_ms = p.op_ms
    if p.host.ops:
        program = tuple(with_host_runs(p, Lane.of(p), list(program)))
        device_ms = tuple(op_times_ms(req.device, req.graph))  # (a hollow op's time on the device, for the ideal)
    ops = tuple(PlanOp(i, op.op, device_ms[i], op.inputs, op.outputs, p.host_ms[i] if p.hollow(i) else None)
                for i, op in enumerate(req.graph.ops))
    return Plan(req.model_path, req.graph.source_sha256, req.model_args, method,
                attrs.evolve(req.device, op_times=()), req.cap, req.scratch, tuple(tensors), ops,
                req.graph.loss, req.graph.updates, program, precision=req.graph.precision, guard=req.graph.guard,
                microbatches=req.graph.microbatches, ranks=req.graph.ranks, link_gbps=req.graph.link_gbps,
                bucket_mib=req.graph.bucket_mib, bucket_members=req.graph.bucket_members)


def plan_capuchin(req: Request) -> Plan:
    """``belady`` with Capuchin's choice of what to recompute (``capuchin.py``)."""
    p = Problem.of(req)
    ext = Extensions(p)
    s, no_swap = capuchin_setup(req, p, ext)
    plan = build_plan(req, p, "capuchin", s.schedule, s.pinned, s.policy, recompute=s.recompute, extensions=ext)
    return with_figures(plan, p, no_swap, recomputes=True)


def capuchin_setup(req: Request, p: Problem, ext: Extensions, no_swap: int | None = None,
                   evaluations: int | None = None) -> tuple[Setup, int]:
    """``belady``'s setup with what Capuchin's rule recomputes (nothing where no swapping is needed; at most
    ``evaluations`` candidate sets scored, ``capuchin_set``)."""
    s, no_swap = baseline_setup(p, "belady", req.tensor_cap, no_swap)
    chosen = capuchin_set(req, ext, s.schedule, s.pinned, s.policy, evaluations) if no_swap > req.tensor_cap else ()
    return attrs.evolve(s, recompute=chosen), no_swap


def plan_checkpoint(req: Request) -> Plan:
    """Chen et al.'s checkpointing (``checkpoint.py``): recomputation, no swapping. Its ``bound_ms`` is
    ``recompute_bound_ms``, which bounds every plan (recomputation may beat ``swap_bound_ms``, which only
    bounds plans that never recompute)."""
    if req.host_updates or req.reduce_all:
        raise SwpError("checkpoint keeps the parameters, optimiser state and gradients on the device: it cannot "
                       "update any on the host or average their host copies",
                       hints=["use --host-updates none with checkpoint, or a method that swaps"])
    p = Problem.of(req)
    program, homes = checkpoint_program(p, req.tensor_cap)
    plan = assemble(req, p, "checkpoint", homes, tuple(program))
    return with_figures(plan, p, no_swap_bytes(p, list(range(p.n_ops))), recomputes=True)


def host_budget_error(req: Request, host_bytes: float, method: str) -> SwpError:
    """The error for a plan whose host copies exceed the host budget: the least this method found."""
    assert req.host_cap is not None
    inputs = sum(req.graph.tensors[n].type.nbytes for n in req.graph.inputs)
    return SwpError(f"no `{method}` plan found keeps its host copies within {format_bytes(req.host_cap)}: "
                    f"the least it found needs {format_bytes(int(host_bytes))} ({int(host_bytes)} bytes)",
                    hints=[f"use --host-memory {int(host_bytes)} or more, or a larger --memory (fewer swaps)",
                           "ga and capuchin trade swaps for recomputation to fit a host budget; "
                           "checkpoint keeps only the inputs on the host",
                           f"no plan needs less than {format_bytes(inputs)} ({inputs} bytes): the inputs' "
                           "host copies"])


def with_figures(plan: Plan, p: Problem, no_swap: int, extra: dict[str, float] | None = None,
                 recomputes: bool = False) -> Plan:
    """The simulated figures, stored in the plan (nothing that varies from run to run). ``no_swap``: the
    tensors' no-swap arena; the figure adds the kernels' scratch, which any plan needs too. A plan that
    may ``recompute`` is bounded by ``recompute_bound_ms``, and reports the swap bound beside it."""
    swap_bound = bound_ms(p, plan.tensor_cap)
    bound = recompute_bound_ms(p, plan.tensor_cap) if recomputes else swap_bound
    extra = {**(extra or {}), "swap_bound_ms": swap_bound} if recomputes else extra
    figures = plan_figures(plan, simulate(plan), bound, no_swap + plan.scratch, peak_bytes(p.graph), extra)
    return attrs.evolve(plan, figures=tuple(figures.items()))
