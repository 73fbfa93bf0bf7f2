"""The library API: everything the command line does, callable from Python. The CLI only wraps it.

    import swapdsl
    model = swapdsl.load("stdlib/models/tiny_resnet.swp", batch=8)
    plan = swapdsl.optimize(model, memory="3MiB", method="ga", budget_s=10)
    swapdsl.save(plan, "tiny.plan")
    run = swapdsl.execute(plan, steps=5, check=True)
    print(run.losses, run.max_rel_diff)

Mistakes raise ``SwpError`` (the message the command line prints).
"""

from __future__ import annotations

import functools
import math
import os
import statistics
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from types import ModuleType
from typing import Any, TypeVar

import attrs
import numpy as np

from swapdsl.common.atomic import check_outputs, check_writable, write_text_atomically
from swapdsl.common.checks import (as_number, as_whole, choice_arg, flag_arg, instance_arg, path_arg, plain_number,
                                   whole_arg)
from swapdsl.common.errors import Span, SwpError
from swapdsl.common.units import MAX_BYTES, format_bytes, parse_share, parse_size
from swapdsl.devices.profiles import BUILTIN, DEFAULT_DEVICE, Device, load_device
from swapdsl.graph.analysis import peak_bytes, summary, training_summary
from swapdsl.graph.autodiff import evaluation_graph, prediction_graph, running_names, training_graph
from swapdsl.graph.checker import check_graph
from swapdsl.graph.ir import Graph, Kind
from swapdsl.graph.ops.registry import np_dtype
from swapdsl.graph.precision import GUARDS, PRECISIONS, autocast, default_guard
from swapdsl.graph.dataparallel import (DEFAULT_BUCKET_MIB, DEFAULT_LINK_GBPS, check_bucket, check_ranks,
                                        data_parallel, gradient_order, members_of)
from swapdsl.graph.microbatch import check_microbatches, divisors, microbatched
from swapdsl.importer import Imported, convert
from swapdsl.importer.text import OPTIMIZER, TARGET
from swapdsl.lang.elaborate import Override, elaborate, model_arguments, model_of
from swapdsl.lang.loader import Program
from swapdsl.lang.loader import load as load_program
from swapdsl.plan import file as planfile
from swapdsl.plan.figures import ONE_PASS_IDEAL, plan_figures
from swapdsl.plan.program import NET_OPS, HostRun, Plan
from swapdsl.plan.program import ideal_ms as plan_ideal_ms
from swapdsl.plan.simulate import simulate as simulate_plan
from swapdsl.plan.validate import validate
from swapdsl.planning.bound import ideal_ms as bound_ideal_ms
from swapdsl.planning.compiled import no_swap_bytes
from swapdsl.planning.ga import SearchOptions, SearchProgress
from swapdsl.planning.optimize import optimize as plan_with
from swapdsl.planning.members import search_members
from swapdsl.planning.optimize import (AUTO_MAX_OPS, HOST_UPDATES, METHOD_NAMES, best_buckets, bucket_requests,
                                      least_cap_with, optimize_microbatches, race_buckets, scout_for)
from swapdsl.planning.problem import Problem, Request
from swapdsl.planning.sizing import BelowSmallestCap
from swapdsl.runtime import checkpoint, reference, training
from swapdsl.runtime.data import init_persistent
from swapdsl.runtime.dist import EveryRank, join
from swapdsl.runtime.dataset import Dataset, array_names, open_dataset
from swapdsl.runtime.predict import PartialBatch, predict as run_predict
from swapdsl.runtime.backend import BACKENDS, array_module, device_bytes_held, require_memory, separate_pool
from swapdsl.runtime.interpreter import PlanRunner
from swapdsl.runtime.training import Hooks, Options, Outcome

OnStep = Callable[[int, float, float, "float | None"], None]  # (step, loss, ms, max rel diff or None)


@attrs.frozen(slots=False)
class Model:
    """A checked model: its file, its program and its forward graph; the training graph on first use."""

    path: str
    program: Program = attrs.field(repr=False)
    graph: Graph = attrs.field(repr=False)

    microbatches: int = 1  # ``graph`` is one micro-batch's forward pass; the step runs this many
    ranks: int = 1  # data-parallel ranks, each running the step on its shard of a batch this many times larger
    link_gbps: float = DEFAULT_LINK_GBPS  # their network link
    bucket_mib: float = DEFAULT_BUCKET_MIB  # the gradients' all-reduce buckets (0: one all-reduce per gradient)
    bucket_members: tuple[int, ...] = ()  # or each gradient's bucket (``data_parallel``'s ``members``)

    @functools.cached_property
    def training(self) -> Graph:
        """Forward, backward and optimiser update: the graph a plan schedules."""
        t = data_parallel(self.one_rank, self.ranks, self.link_gbps, bucket_mib=self.bucket_mib,
                          members=self.bucket_members)
        check_graph(t)
        return t

    @functools.cached_property
    def one_rank(self) -> Graph:
        """The training graph of one rank alone (``training`` before the data-parallel pass)."""
        return microbatched(training_graph(self.graph), self.microbatches)

    @functools.cached_property
    def evaluation(self) -> Graph:
        """The forward pass of the loss and the reports that evaluation runs (dropout off)."""
        e = microbatched(evaluation_graph(self.graph), self.microbatches)
        check_graph(e)
        return e

    @property
    def args(self) -> dict[str, int | float | bool]:
        return dict(self.graph.args)

    def summary(self, training: bool = False) -> dict:
        """The figures `swapdsl check [--training] --json` prints."""
        if not training:
            return summary(self.graph)
        whole = _one_pass(self)
        info = summary(self.graph) | training_summary(self.training) | {"no_swap_bytes": no_swap_arena(whole.training)}
        if self.microbatches > 1:  # (what a plan's memory ratio divides: its own passes' arena)
            info["microbatched_no_swap_bytes"] = no_swap_arena(self.training)
        return info


def with_microbatches(m: Model, microbatches: int) -> Model:
    """``m`` loaded again, run as ``microbatches`` passes a step (its ranks as they were)."""
    return load(m.path, dict(m.graph.args), m.graph.precision, m.graph.guard, microbatches, m.ranks, m.link_gbps,
                m.bucket_mib, m.bucket_members)


def _one_pass(m: Model) -> Model:
    """``m`` run as one pass over its whole batch."""
    return m if m.microbatches == 1 else with_microbatches(m, 1)


def one_pass_ideal_ms(m: Model, device: Device) -> float:
    """The step with infinite memory of one pass over ``m``'s whole batch on ``device``: what a micro-batched
    plan's speed is a fraction of (its own graph's ideal step is longer: more, smaller kernels)."""
    return bound_ideal_ms(Problem.build(_one_pass(m).training, device))


def no_swap_arena(t: Graph) -> int:
    """The arena a plan of ``t`` needs with nothing swapped (default order, the kernels' scratch included):
    what `optimize` and `bench` divide by a memory ratio, and what `--memory 1/3` takes a share of."""
    p = Problem.build(t, BUILTIN[DEFAULT_DEVICE])
    return no_swap_bytes(p) + p.scratch


def load(path: str | Path, overrides: Mapping[str, Override] | None = None, precision: str = "f32",
         guard: str | None = None, microbatches: int = 1, ranks: int = 1, link_gbps: float = DEFAULT_LINK_GBPS,
         bucket_mib: float = DEFAULT_BUCKET_MIB, bucket_members: tuple[int, ...] = (),
         **args: int | float | bool) -> Model:
    """Parse, resolve imports, elaborate and check a `.swp` model. Model arguments come as keywords
    (``batch=8``) or, as text the way ``-D`` gives them, in ``overrides``. ``precision``: "f32" (as
    written), or "bf16" / "f16": the mixed-precision policy of ``graph/precision.py``. ``guard``: "none",
    "skip" (a step with a non-finite gradient leaves the state as it was) or "scale" (and dynamic loss
    scaling); default "scale" for f16, else "none". ``microbatches``: the step runs its batch (the model
    argument ``batch``) as this many forward and backward passes and one update (``graph/microbatch.py``).
    ``ranks``: the step runs data-parallel on this many processes (``mpiexec -n``) over a network of
    ``link_gbps`` Gb/s, each on ``batch`` rows of a batch ``ranks`` times larger, the gradients averaged in
    buckets of ``bucket_mib`` MiB (0: one all-reduce each; ``graph/dataparallel.py``), or as
    ``bucket_members`` gives them (one bucket number per gradient)."""
    path, microbatches, ranks, args = _load_args(path, overrides, microbatches, ranks, bucket_members, args)
    check_ranks(ranks, link_gbps)
    check_bucket(bucket_mib)
    if precision not in PRECISIONS:
        raise SwpError(f"unknown precision `{precision}`", hints=[f"precisions: {', '.join(PRECISIONS)}"])
    guard = default_guard(precision) if guard is None else guard
    if guard not in GUARDS:
        raise SwpError(f"unknown guard `{guard}`", hints=[f"guards: {', '.join(GUARDS)}"])
    if is_plan_file(path):
        raise SwpError(f"`{path}` is a plan file, not a model",
                       hints=["give the model's .swp file; `swapdsl show`, `simulate` and `exec` read a plan"])
    program = load_program(str(path))
    given = {**(overrides or {}), **args}
    full = model_arguments(model_of(program), given)
    if microbatches != 1:
        given = {**given, "batch": check_microbatches(full.get("batch"), microbatches)}
    graph = attrs.evolve(elaborate(program, given), args=tuple(full.items()))
    check_graph(graph)
    if microbatches != 1:
        _check_batched_inputs(graph, int(given["batch"]))
    if ranks > 1:
        batch = given["batch"] if microbatches != 1 else full.get("batch")  # (the micro-batch's, when split)
        if not isinstance(batch, int) or isinstance(batch, bool):
            raise SwpError("data-parallel ranks each take the model argument `batch` rows of every batch, and "
                           "this model has no `batch`", hints=["give the model a `batch` argument that sizes its "
                                                              "inputs' first axis"])
        _check_batched_inputs(graph, batch, "data-parallel ranks", "--ranks")
    if precision != "f32":
        graph = autocast(graph, precision)
        check_graph(graph)
    return Model(str(path), program, attrs.evolve(graph, guard=guard), microbatches, ranks,
                 float(link_gbps) if ranks > 1 else 0.0, float(bucket_mib) if ranks > 1 else 0.0,
                 tuple(bucket_members) if ranks > 1 else ())


def _load_args(path: object, overrides: object, microbatches: object, ranks: object, bucket_members: object,
               args: dict[str, object]) -> tuple[str, int, Any, dict[str, object]]:
    """``load``'s arguments checked, or taken as what they stand for (a Path, NumPy numbers)."""
    if overrides is not None and not (isinstance(overrides, Mapping) and all(isinstance(k, str) for k in overrides)):
        raise SwpError("`overrides` must map model arguments to values as text, as -D gives them: {\"batch\": \"8\"}")
    if not isinstance(bucket_members, (tuple, list)) or not all(
            isinstance(as_whole(b), int) and not isinstance(b, bool) for b in bucket_members):
        raise SwpError(f"`bucket_members` must be a sequence of bucket numbers, one per gradient, not "
                       f"{bucket_members!r:.60}")
    return (path_arg(path, "path"), whole_arg(microbatches, "microbatches", 1), as_whole(ranks),
            {k: plain_number(v) for k, v in args.items()})


def _check_batched_inputs(g: Graph, rows: int, who: str = "micro-batches", flag: str = "--microbatches") -> None:
    """Micro-batches (or data-parallel ranks) slice every input along its first axis: each must be the batch's."""
    for name in g.inputs:
        shape = g.type_of(name).shape
        if not shape or shape[0] != rows:
            raise SwpError(f"{who} split every input along its first axis, but input `{name}` is "
                           f"{g.type_of(name)} at a batch of {rows}", g.tensors[name].span,
                           hints=[f"inputs that are not per example cannot be split; run without {flag}"])


def optimize(model: Model | str | Path, memory: int | str, method: str = "ga", device: str | Device | None = None,
             search: SearchOptions | None = None, host_memory: int | str | None = None,
             host_updates: str = "none", microbatches: int | str | None = None, bucket_mib: float | str | None = None,
             **knobs: float | int | bool) -> Plan:
    """Plan ``model``'s training step under ``memory`` (bytes, text such as "8GiB", or a share of the
    no-swap arena of one pass over the batch, ``no_swap_arena``: "1/3", "33%"), validated.
    ``device``: a built-in profile name, a profile file or a Device (default: the GPU found, else the
    default profile). ``ga`` reads ``search`` or its fields as keywords (``budget_s=10, seed=1``).
    ``host_memory``: the most the plan's host copies may take (default: any). ``host_updates``: where the
    optimiser's updates run: ``none`` on the device, ``all`` on the host where they can, ``auto`` the
    largest parameters' on the host where that is faster. ``microbatches``: how many forward and backward
    passes the step runs its batch as (default: the model's), or ``auto``: the count among the batch's
    divisors whose plan is fastest (``planning.optimize.optimize_microbatches``). ``bucket_mib``: the
    data-parallel gradients' bucket size (default: the model's), or ``auto``: the size among
    ``planning.optimize.BUCKET_CHOICES`` whose plan is fastest (``ga`` races a search per size,
    ``race_buckets``; with ``microbatches="auto"`` too, or another method, ``best_buckets``)."""
    m = model if isinstance(model, Model) else load(path_arg(model, "model"))
    method = choice_arg(method, "method", METHOD_NAMES)
    host_updates = choice_arg(host_updates, "host_updates", HOST_UPDATES)
    dev = _device(device)
    if search is not None:
        instance_arg(search, "search", SearchOptions, "a SearchOptions or None")
    if unknown := sorted(set(knobs) - {f.name for f in attrs.fields(SearchOptions)}):
        raise SwpError(f"unknown search option `{unknown[0]}`",
                       hints=[f"options: {', '.join(f.name for f in attrs.fields(SearchOptions))}"])
    options = attrs.evolve(search or SearchOptions(), **knobs)
    if microbatches not in (None, "auto"):
        microbatches = whole_arg(microbatches, "microbatches", 1)
    share = parse_share(memory) if isinstance(memory, str) else None
    if share is not None:
        cap = int(share * no_swap_arena(_one_pass(m).training))
    else:
        cap = parse_size(memory) if isinstance(memory, str) else _bytes(memory, "memory")
    host = parse_size(host_memory) if isinstance(host_memory, str) else (
        None if host_memory is None else _bytes(host_memory, "host_memory"))
    if bucket_mib not in (None, "auto"):
        size = check_bucket(bucket_mib)
        m = attrs.evolve(m, bucket_mib=size) if m.ranks > 1 else m
    auto_size = bucket_mib == "auto" and m.ranks > 1 and method != "exact"  # (exact plans one rank: it refuses)

    made: dict[tuple[int, float | None], Request] = {}

    @functools.cache
    def model_at(k: int) -> Model:
        return m if k == m.microbatches else with_microbatches(m, k)

    def request_at(k: int, mib: float | None = None) -> Request:
        if (k, mib) not in made:
            mk = model_at(k)
            mk = mk if mib is None else attrs.evolve(mk, bucket_mib=mib, bucket_members=())
            made[k, mib] = Request(mk.training, dev, cap, m.path, m.graph.args, host)
        return made[k, mib]

    def searched(k: int, req: Request, scout: str) -> Request:
        """``req`` with the bucket members ``planning.members`` finds from its size's."""
        one = model_at(k).one_rank
        grads = [(one.type_of(x).nbytes, one.type_of(x).dtype.label) for x in gradient_order(one)]
        mib = req.graph.bucket_mib

        def request_with(members: tuple[int, ...]) -> Request:
            t = data_parallel(one, m.ranks, m.link_gbps, bucket_mib=mib, members=members)
            check_graph(t)
            return attrs.evolve(req, graph=t)

        return search_members(req, req.graph.bucket_members or members_of(one, mib), grads, request_with, scout,
                              host_updates, options.seed)

    def chosen_at(k: int, climbing: bool = True) -> Request:
        """The request with the size ``auto`` chooses for count ``k``."""
        base = request_at(k)
        if not auto_size or (k > 1 and len(base.graph.ops) > AUTO_MAX_OPS):  # (a count the climb does not try)
            return base
        try:
            return best_buckets(lambda mib: base if mib == m.bucket_mib else request_at(k, mib), method, host_updates)
        except SwpError:  # no size fits this count: the climb's planning refuses it, as any count that does not fit
            if not climbing:
                raise
            return base

    if microbatches == "auto":
        counts = divisors(int(check_microbatches(m.args.get("batch"), 1)))
        plan = optimize_microbatches(chosen_at, counts, method, options, host_updates)
        if auto_size and scout_for(method) == method:  # (a baseline: the members of the count it chose)
            found = searched(plan.microbatches, request_at(plan.microbatches, plan.bucket_mib), method)
            plan = plan_with(found, method, options, host_updates) if found.graph.bucket_members else plan
    else:
        k = m.microbatches if microbatches is None else microbatches
        try:
            if auto_size and method == "ga":  # (a search per size, then one for the members belady finds)
                def entrants() -> Iterator[Request]:  # (the members searched only if the race gets that far)
                    yield from bucket_requests(lambda mib: request_at(k, mib))  # type: ignore[arg-type]
                    try:
                        best = best_buckets(lambda mib: request_at(k, mib), "belady", host_updates)
                    except SwpError:  # (no size fits: the race says which needs the least)
                        return
                    found = searched(k, best, "belady")
                    if found.graph.bucket_members:
                        yield found

                plan = race_buckets(entrants(), options, host_updates)
            else:
                req = chosen_at(k, climbing=False)
                if auto_size:
                    req = searched(k, req, scout_for(method))
                plan = plan_with(req, method, options, host_updates)
        except BelowSmallestCap as err:
            size = getattr(err, "bucket_mib", None)  # (auto's size that needs the least: the counts tried at it)
            at = request_at if size is None else (lambda j: request_at(j, size))
            least = lambda j: least_cap_with(at(j), method, host_updates)  # noqa: E731
            raise _with_host_hint(_with_microbatch_hint(err, m, k, cap, least), at(k), method, host_updates,
                                  cap) from None
    validate(plan)
    if plan.microbatches > 1:  # what its speed is a fraction of (``simulate`` reads it back from the file)
        planned = attrs.evolve(m, bucket_mib=plan.bucket_mib, bucket_members=plan.bucket_members) \
            if m.ranks > 1 else m  # (the size auto chose)
        plan = attrs.evolve(plan, figures=(*plan.figures, (ONE_PASS_IDEAL, one_pass_ideal_ms(planned, dev))))
    return plan


def _with_host_hint(err: BelowSmallestCap, req: Request, method: str, host_updates: str | None,
                    cap: int) -> BelowSmallestCap:
    """``err`` with ``--host-updates auto`` where, updates on the device, data-parallel gradients averaged
    over their host copies (or updates on the host) fit ``cap``."""
    if host_updates not in (None, "none") or req.graph.ranks == 1 or method in ("checkpoint", "exact"):
        return err
    least = least_cap_with(req, method, "all")
    if least <= cap:
        err.hints = [f"--host-updates auto fits it (gradients averaged over their host copies, updates on the "
                     f"host or not): its smallest feasible cap is {format_bytes(least)}", *err.hints]
    return err


def _with_microbatch_hint(err: BelowSmallestCap, m: Model, k: int, cap: int,
                          least_at: Callable[[int], int], tries: int = 6) -> BelowSmallestCap:
    """``err`` with the least micro-batch count (of the next ``tries`` dividing the batch) that fits ``cap``
    (``least_at(count)``: the least cap that count plans under)."""
    batch = m.args.get("batch")
    if not isinstance(batch, int) or isinstance(batch, bool):
        return err
    least, more, per_pass = err.least, k, len(m.training.ops) / m.microbatches
    for more in [d for d in divisors(batch) if d > k and d * per_pass <= AUTO_MAX_OPS][:tries]:
        least = least_at(more)
        if least <= cap:
            err.hints = [f"--microbatches {more} (or auto) fits it: its smallest feasible cap is "
                         f"{format_bytes(least)}", *err.hints]
            return err
    if more > k:
        err.notes = [*err.notes, f"micro-batches do not bring it under the cap: {format_bytes(least)} at the "
                                 f"least with {more} micro-batches"]
    return err


def save(plan: Plan, path: str | Path) -> None:
    """Write the plan file atomically (a reader sees the old file or the whole new one); never over its
    model."""
    instance_arg(plan, "plan", Plan, "a Plan (as optimize or read give one)")
    path = path_arg(path, "path")
    check_outputs([(path, "plan")], [(plan.model_path, "model")])
    planfile.write_plan(plan, path)


def read(path: str | Path) -> Plan:
    """A plan file, checked completely: against its model's training graph when the model is found (as
    `exec` needs it), and replayed."""
    return read_checked(path_arg(path, "path"))[0]


def read_checked(path: str, need_model: bool = False) -> tuple[Plan, Graph | None]:
    """The plan and its model's training graph (None when the model is not found and not needed)."""
    plan = planfile.read_plan(path)
    model = planfile.find_model(plan, path) if need_model else planfile.locate_model(plan, path)
    try:
        train = None if model is None else _training_graph(str(model), plan.model_sha256, plan.args, plan.precision,
                                                           plan.guard, plan.microbatches, plan.ranks, plan.link_gbps,
                                                           plan.bucket_mib, plan.bucket_members)
    except SwpError as err:  # the model built before, so the plan's arguments are at fault
        raise _at_plan_arg(err, plan) from None
    validate(plan, train)
    return plan, train


def _bytes(value: object, name: str) -> int:
    """A size given as a number: a positive whole number of bytes (3e6 is 3,000,000)."""
    value = as_number(value)
    if not isinstance(value, float) or not (math.isfinite(value) and value >= 1 and value == int(value)):
        raise SwpError(f"`{name}` must be a positive whole number of bytes or a size such as \"8GiB\", not {value!r}")
    if value > MAX_BYTES:
        raise SwpError(f"`{name}` of {value:g} bytes is larger than the limit of 1 PiB ({MAX_BYTES} bytes)")
    return int(value)


def _device(device: object) -> Device:
    """A Device, a built-in profile's name, a profile file (text or a Path), or None: the GPU found."""
    if isinstance(device, Device):
        return device
    if device is not None and not isinstance(device, (str, os.PathLike)):
        raise SwpError(f"`device` must be a profile name, a profile file or a Device, not {type(device).__name__}")
    return load_device(None if device is None else os.fspath(device))


def simulate(plan: Plan) -> dict[str, float]:
    """The plan's figures recomputed from the plan alone; the planner's bound and sizes, and a micro-batched
    plan's one-pass ideal step, are as its file records them (``figure_notes`` says where they disagree)."""
    if not isinstance(plan, Plan):
        raise SwpError(f"simulate takes a Plan (as optimize or read give one), not {type(plan).__name__}")
    validate(plan, None)  # (a Plan made or changed by hand is checked as a file is)
    stored = dict(plan.figures)
    kept = {ONE_PASS_IDEAL: stored[ONE_PASS_IDEAL]} if ONE_PASS_IDEAL in stored else None
    return plan_figures(plan, simulate_plan(plan),
                        *(stored.get(k) for k in ("bound_ms", "no_swap_bytes", "graph_peak_bytes")), kept)


def figure_notes(plan: Plan, figures: dict[str, Any]) -> list[str]:
    """What disagrees among a plan's figures: the planner's, as its file records them, against those
    ``simulate`` recomputes (a recorded lower bound below the ideal step of the ops the device runs, or
    above the plan's own step). With updates on the host the ideal step, which sums every op's device time,
    may be above the bound, as the plan may."""
    bound, notes = figures.get("bound_ms"), []
    on_host = {i.op for i in plan.program if isinstance(i, HostRun)}
    floor = plan_ideal_ms((0.0 if i in on_host else o.ms for i, o in enumerate(plan.ops)),
                          (o.op in NET_OPS for o in plan.ops))
    if bound is not None and not floor * (1 - 1e-9) <= bound <= figures["iteration_ms"] * (1 + 1e-9):
        below = "the ideal step" if not on_host else f"the device's ops' ideal step ({floor:.6g} ms)"
        notes.append(f"the recorded bound {bound:.6g} ms is not between {below} and this plan's step, as a lower "
                     "bound is: the file's figures were edited, or the planner's bound is wrong")
    missing = [k for k in ("bound_ms", "no_swap_bytes") if k not in figures]
    if missing:
        notes.append(f"the plan records no {' or '.join(missing)}: those figures are left out")
    return notes


@attrs.frozen
class Execution:
    """What training gave: each step's loss, time and reports; evaluations and checkpoints. For a plan, also
    the bytes it moves, its arenas and its simulated step time; with ``check``, the largest relative
    difference from the reference."""

    model: str
    backend: str
    steps: int
    seed: int
    losses: list[float]
    step_ms: list[float]
    figures: dict[str, object] = attrs.field(factory=dict)  # a plan's: bytes moved, arenas, simulated step
    max_rel_diff: float | None = None
    outcome: Outcome | None = attrs.field(default=None, repr=False)
    max_rel_diff_at: str | None = None  # "loss" or the persistent tensor where max_rel_diff is

    @property
    def metrics(self) -> list[dict[str, float]]:
        return [r.metrics for r in self.outcome.steps] if self.outcome else []

    @property
    def warmup_steps(self) -> int:
        """The leading steps that did one-off work: the first (kernels compiled, lanes prepared) and, on CuPy
        with the CUDA graph on, the one that captured the graph (it issued every item from Python too)."""
        return int(self.figures.get("warmup_steps", 1))  # type: ignore[call-overload]

    def steady_ms(self, times: list[float] | None = None) -> float:
        """The median of ``times`` (default: the step times) after the warm-up steps, or of all of them where
        the run was no longer than its warm-up."""
        times = self.step_ms if times is None else times
        return statistics.median(times[self.warmup_steps:] or times)

    def to_json(self) -> dict:
        out = {"model": self.model, "backend": self.backend, "steps": self.steps, "seed": self.seed,
               "loss": self.losses, "step_ms": self.step_ms, **self.figures}
        if self.outcome is not None:
            o = self.outcome
            out |= {"first_step": o.first_step, "metrics": self.metrics,
                    "eval": [attrs.asdict(e) for e in o.evals], "checkpoints": [attrs.asdict(c) for c in o.saves]}
            if o.dataset is not None:
                out |= {"data": o.dataset.path, "examples": o.dataset.examples,
                        "dropped_per_epoch": o.dataset.dropped}
        return out | ({"max_rel_diff": self.max_rel_diff, "max_rel_diff_at": self.max_rel_diff_at}
                      if self.max_rel_diff is not None else {})


def execute(target: Plan | Model | str | Path, steps: int | None = None, seed: int | None = None, backend: str = "auto",
            check: bool = False, on_step: OnStep | None = None, graph: bool = True, tf32: bool = False,
            options: Options = Options(), hooks: Hooks = Hooks(), vendor_kernels: bool = True) -> Execution:
    """Train: a plan under its cap (a Plan, or a plan file), or a model with the reference executor and
    no cap (a Model, or a `.swp` file). ``options``: data, evaluation, checkpoints, log (``steps`` and
    ``seed`` override its own). ``check`` (plans) runs the reference beside it and compares every loss and
    parameter; ``on_step`` hears of every step as it ends (``hooks``: of steps, evaluations and saves);
    ``graph`` (plans on CuPy) replays each step as one captured CUDA graph; ``tf32`` (plans on CuPy) lets
    FP32 products use TF32 tensor cores; ``vendor_kernels`` False (plans on CuPy): swapdsl's own kernels
    only, the reference's, so that ``check`` measures what the plan changes and nothing else."""
    target = _target(target)
    check, graph, tf32, vendor_kernels = (flag_arg(v, k) for k, v in (
        ("check", check), ("graph", graph), ("tf32", tf32), ("vendor_kernels", vendor_kernels)))
    instance_arg(options, "options", Options, "an Options")
    instance_arg(hooks, "hooks", Hooks, "a Hooks")
    if on_step is not None and (not callable(on_step) or hooks.on_step is not None):
        raise SwpError("`on_step` must be a function, given once: here or as `hooks.on_step`")
    if isinstance(target, str):
        if is_plan_file(target):
            plan, train = read_checked(target, need_model=True)
            return execute_plan(plan, train, steps, seed, backend, check, on_step, graph=graph, tf32=tf32,
                                options=options, hooks=hooks, vendor_kernels=vendor_kernels)
        target = load(target)
    if isinstance(target, Model):
        if check:
            raise SwpError("check compares a plan's execution with the reference executor; give a plan")
        return _train_reference(target, _options(options, steps, seed), backend, _hooks(hooks, on_step))
    return execute_plan(target, _graph_of(target), steps, seed, backend, check, on_step, graph=graph, tf32=tf32,
                        options=options, hooks=hooks, vendor_kernels=vendor_kernels)


def _target(target: object) -> Plan | Model | str:
    """What a run or a prediction is of: a Plan, a Model, or a file naming one (as text)."""
    if isinstance(target, (Plan, Model)):
        return target
    if isinstance(target, (str, os.PathLike)):
        return path_arg(target, "target")
    raise SwpError(f"the target must be a Plan, a Model or a file naming one, not {type(target).__name__}")


def is_plan_file(path: str | Path) -> bool:
    """A plan by its first bytes, or by its name (so a damaged plan is read, and refused, as one)."""
    if not Path(path).is_file():
        return False
    if Path(path).suffix.lower() == ".plan":
        return True
    try:
        with open(path, "rb") as f:
            return f.read(12) == b"swapdsl-plan"
    except OSError:
        return False


def _options(options: Options, steps: int | None, seed: int | None) -> Options:
    return training.resolve(attrs.evolve(options, steps=steps if steps is not None else options.steps,
                                         seed=seed if seed is not None else options.seed))


def _hooks(hooks: Hooks, on_step: OnStep | None) -> Hooks:
    """``hooks`` with ``on_step`` (step, loss, ms, diff) as its step hook, where one is given."""
    if on_step is None:
        return hooks
    return attrs.evolve(hooks, on_step=lambda r: on_step(r.step, r.loss, r.step_ms, r.diff))


def _train_reference(m: Model, opts: Options, backend: str, hooks: Hooks) -> Execution:
    name, xp = array_module(backend)
    join(m.training, "", name)
    if m.training.ranks > 1 and name == "cupy":  # (the plan's runner places each rank on its own GPU)
        raise EveryRank("data-parallel runs on CuPy run a plan", hints=[
            "swapdsl optimize MODEL --ranks N --memory SIZE -o net.plan, then exec net.plan", "or --backend numpy"])
    require_memory(xp, peak_bytes(m.training), 0, f"training `{m.graph.name}` with no cap")
    seed = opts.seed or 0
    trainer = reference.Trainer(m.training, seed, xp)
    evaluate = None
    if opts.eval:
        def tail(rows: int) -> reference.Trainer | None:
            try:
                at = _at_batch(m, rows)
            except SwpError:  # the model refuses a batch of that size
                return None
            return None if at is None else reference.Trainer(at.evaluation, seed, xp)

        evaluate = training.Evaluator(trainer, reference.Trainer(m.evaluation, seed, xp), functools.cache(tail))
    outcome = training.train(m.training, trainer, opts, hooks, evaluate)
    return _execution(m.graph.name, name, opts, outcome)


def predict(target: Plan | Model | str | Path, data: str, init: str | None = None, backend: str = "auto",
            seed: int = 0) -> dict[str, np.ndarray]:
    """The model's outputs (its `output` statements) for every example in ``data`` (a folder of ``.npy`` or
    an ``.npz`` with the inputs the outputs need), from the parameters and running statistics in the
    checkpoint ``init`` (else the seed's initialisation). A plan runs the prediction graph planned under its
    cap (``belady``) at its micro-batch size; a model, the reference executor."""
    data, init, backend, seed = _inference_args(data, init, backend, seed)
    return _inference(_inference_model(target), data, init, backend, seed, prediction_graph, run_predict)


def _inference_args(data: object, init: object, backend: object, seed: object) -> tuple[str, str | None, str, int]:
    """``predict``'s, ``evaluate``'s and ``predict_scored``'s arguments, checked."""
    return (path_arg(data, "data", flag="--data"), path_arg(init, "init", optional=True, flag="--init"),
            choice_arg(backend, "backend", BACKENDS),
            whole_arg(seed, "seed", 0, training.MAX_SEED - 1))


def predict_scored(target: Plan | Model | str | Path, data: str, init: str | None = None, backend: str = "auto",
                   seed: int = 0) -> tuple[dict[str, np.ndarray], training.EvalRecord | None]:
    """``predict``'s outputs and, where ``data`` has what the loss reads, ``evaluate``'s figures, from one
    pass over the data (``evaluation_graph(..., outputs=True)``); where that graph does not plan under a
    plan's cap, two passes as ``predict`` and ``evaluate`` make them."""
    data, init, backend, seed = _inference_args(data, init, backend, seed)
    plan, m = resolved = _inference_model(target)
    if not _scorable(m, data):
        return _inference(resolved, data, init, backend, seed, prediction_graph, run_predict), None
    scored: list[tuple[float, dict[str, float], int]] = []
    started = time.perf_counter()

    def run(g: Graph, first: training.Stepper, tail: Callable[[int], training.Stepper | None], ds: Dataset,
            state: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], training.EvalRecord]:
        outputs = run_predict(g, first, tail, ds, state, scored)
        return outputs, training.held_out(ds, 0, scored, 0, started)

    try:
        return _inference(resolved, data, init, backend, seed, lambda g: evaluation_graph(g, outputs=True), run)
    except (BelowSmallestCap, PartialBatch):  # (the graph of both, or its partial batch, does not plan under
        pass                                   # the cap: each alone may; any other error is the data's)
    return (_inference(resolved, data, init, backend, seed, prediction_graph, run_predict),
            _evaluate(resolved, data, init, backend, seed))


def _scorable(m: Model, data: str) -> bool:
    """Whether ``data`` holds every input the model's loss and reports read (its targets); an error where
    it is no data set."""
    names = array_names(data)
    if not names:  # (no such file, not a folder of arrays or an .npz: the data's own error says which)
        open_dataset(data, evaluation_graph(m.graph) if m.graph.loss else prediction_graph(m.graph), partial=True)
    return bool(m.graph.loss) and set(evaluation_graph(m.graph).inputs) <= names


def evaluate(target: Plan | Model | str | Path, data: str, init: str | None = None, backend: str = "auto",
             seed: int = 0) -> training.EvalRecord | None:
    """The loss and reports over every example in ``data``, as ``exec --eval`` takes them (each batch
    weighed by its examples, the last partial batch at its size), from ``init`` as ``predict`` reads it;
    None where ``data`` lacks an input the loss needs (its targets) or the model has no loss."""
    data, init, backend, seed = _inference_args(data, init, backend, seed)
    return _evaluate(_inference_model(target), data, init, backend, seed)


def _evaluate(resolved: tuple[Plan | None, Model], data: str, init: str | None, backend: str,
              seed: int) -> training.EvalRecord | None:
    if not _scorable(resolved[1], data):
        return None

    def run(g: Graph, first: training.Stepper, tail: Callable[[int], training.Stepper | None], ds: Dataset,
            state: dict[str, np.ndarray]) -> training.EvalRecord:
        return training.Evaluator(training.Held(state), first, tail)(ds, 0)

    return _inference(resolved, data, init, backend, seed, evaluation_graph, run)


def _inference_model(target: Plan | Model | str | Path) -> tuple[Plan | None, Model]:
    """The plan (if ``target`` is one, or names one) and its model."""
    target = _target(target)
    plan = read(target) if isinstance(target, (str, Path)) and is_plan_file(target) else (
        target if isinstance(target, Plan) else None)
    return plan, _model_of(plan) if plan is not None else target if isinstance(target, Model) else load(target)


_Result = TypeVar("_Result")


def _inference(resolved: tuple[Plan | None, Model], data: str, init: str | None,
               backend: str, seed: int, graph_of: Callable[[Graph], Graph],
               run: Callable[[Graph, training.Stepper, Callable[[int], training.Stepper | None], Dataset,
                              dict[str, np.ndarray]], _Result]) -> _Result:
    """``run`` over ``data`` by executors of ``graph_of`` the model's forward graph, from ``init``'s state: a
    plan's graph planned under its cap (``belady``) at its micro-batch size, a model's by the reference
    executor; the last partial batch by one at its size (None where that does not plan). ``resolved``: the
    plan and model ``_inference_model`` gives."""
    plan, m = resolved
    rows = int(m.args["batch"]) // m.microbatches if m.microbatches > 1 else None
    base = _at_batch(m, rows) if rows else m
    assert base is not None
    g = graph_of(base.graph)
    check_graph(g)
    name, xp = array_module(backend)
    made: list[PlanRunner] = []

    def stepper(graph: Graph, args: tuple[tuple[str, int | float | bool], ...]) -> training.Stepper:
        if plan is None:
            return reference.Trainer(graph, seed, xp)
        forward = plan_with(Request(graph, plan.device, plan.cap, plan.model_path, args), "belady")
        # (one arena of the cap for them all: each loads its state before it runs)
        made.append(PlanRunner(forward, graph, name, xp, seed, graph=False, memory=made[0].memory if made else None))
        return made[-1]

    def tail(r: int) -> training.Stepper | None:
        at = _at_batch(base, r)
        if at is None:
            fixed = g.type_of(g.inputs[0]).shape[0] if g.inputs and g.type_of(g.inputs[0]).shape else None
            raise PartialBatch(f"the data's last {r} examples make a partial batch, and the model has no `batch` "
                               f"argument to run them at: its batch is fixed{f' at {fixed}' if fixed else ''}",
                               hints=[f"give a multiple of {fixed} examples" if fixed else "give whole batches"])
        try:
            return stepper(graph_of(at.graph), at.graph.args)
        except SwpError:
            return None

    ds = open_dataset(data, g, partial=True)
    state = _init_values(init, g, seed)
    try:
        return run(g, stepper(g, base.graph.args), functools.cache(tail), ds, state)
    finally:
        for r in made:
            r.close()


def import_onnx(path: str, out: str, weights: str | None = None, batch: int | None = None,
                dims: Mapping[str, int] | None = None, loss: str | None = None, target: str | None = None,
                optimizer: str | None = None, freeze: str | None = None,
                flat: bool = False, f32: bool = False) -> tuple[Model, Imported]:
    """Write the ONNX model at ``path`` as the `.swp` file ``out`` (repeated modules as `def`s unless
    ``flat``) and its weights as the checkpoint ``weights`` (default: ``out`` with suffix ``.safetensors``)
    that `--init` reads: parameters and batch norm's running statistics. Both are checked (the text loads,
    every weight fits its parameter) before either is written; each is written whole or not at all.
    ``loss`` (``importer.text.LOSSES``) adds a target input named ``target`` ("target") and a `minimize`
    line with ``optimizer`` ("sgd(lr = 0.01)"); without it the model predicts only. ``f32``: a bf16 or f16
    export imported as f32 (weights widened exactly), to train with f32 master weights."""
    import tempfile

    path, out = path_arg(path, "path"), path_arg(out, "out", flag="-o")
    weights = path_arg(weights, "weights", optional=True, flag="--weights") or str(Path(out).with_suffix(
        ".safetensors"))
    batch, dims, flat = whole_arg(batch, "batch", 1, optional=True), _sizes_arg(dims), flag_arg(flat, "flat")
    f32 = flag_arg(f32, "f32")
    for name, value in (("loss", loss), ("target", target), ("optimizer", optimizer), ("freeze", freeze)):
        if value is not None and not isinstance(value, str):
            raise SwpError(f"`{name}` must be a string or None, not {value!r:.60}")
    if loss is None and (target is not None or optimizer is not None):
        raise SwpError("`target` and `optimizer` shape the loss and its `minimize` line: give `loss` too")
    target, optimizer = target or TARGET, optimizer or OPTIMIZER
    check_outputs([(out, "model"), (weights, "weights")], [(path, "ONNX model")])
    for target_path, what in ((out, "model"), (weights, "weights")):
        check_writable(target_path, what)
    r = convert(path, batch, dims, loss, target, optimizer, freeze, flat, f32)
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "imported.swp").write_text(r.text)
        try:
            m = load(Path(tmp) / "imported.swp")
        except SwpError as exc:
            ours = exc.span is not None and Path(exc.span.file).name == "imported.swp"
            line = r.text.split("\n")[exc.span.line - 1] if ours else ""
            if loss is not None and line.lstrip().startswith("minimize ") and optimizer in line:
                raise SwpError(f"--optimizer `{optimizer[:80]}`: {exc.message}", notes=list(exc.notes)) from None
            raise SwpError(f"the import of `{path}` does not load as a model: {exc.message}",
                           notes=list(exc.notes), hints=["the file's shapes may disagree with its ops; if "
                                                         "onnxruntime runs it, please report this with the file"]) from None
    pred = prediction_graph(m.graph)  # every parameter, read by the outputs or not, and the running statistics
    g = attrs.evolve(pred, params=m.graph.params, tensors={**m.graph.tensors, **pred.tensors},
                     state=tuple(s for s in pred.state if not s.startswith("output/")))
    values = {k: np.asarray(v) for k, v in init_persistent(g, 0, np).items() if k in g.persistent}
    values.update({k: np.array(v, order="C").astype(np_dtype(np, g.type_of(k).dtype))  # 0-d stays 0-d
                   for k, v in r.params.items()})
    running = running_names(m.graph)
    for op in m.graph.ops:
        if op.op == "batch_norm" and op.inputs[1] in r.running:
            mean, var = r.running[op.inputs[1]]
            values[f"{running[op.outputs[0]]}.running_mean"], values[f"{running[op.outputs[0]]}.running_var"] = \
                mean, var
    checkpoint.save(weights, g, values, 0, 0, 0, "", False)
    write_text_atomically(out, r.text, "model")
    return load(out), r


def _sizes_arg(dims: object) -> dict[str, int]:
    """``import_onnx``'s ``dims``: the file's symbolic sizes, each a positive integer."""
    if dims is not None and not (isinstance(dims, Mapping) and all(isinstance(k, str) for k in dims)):
        raise SwpError("`dims` must map the file's symbolic sizes to integers: {\"sequence\": 128}")
    return {k: whole_arg(v, f"dims[{k!r}]", 1) for k, v in (dims or {}).items()}


def _init_values(init: str | None, g: Graph, seed: int) -> dict[str, np.ndarray]:
    """The persistent values a prediction starts from: a checkpoint's (parameters and running statistics,
    checked), else the seed's."""
    values = {k: np.asarray(v) for k, v in init_persistent(g, seed, np).items() if not k.startswith("output/")}
    if init is not None:
        ck = checkpoint.read(init, "--init", wanted=checkpoint.for_init(g, state=True))
        values.update(checkpoint.parameters(ck, g))
        for k in (s for s in g.state if g.tensors[s].kind != Kind.metric):  # batch norm's running statistics
            if k not in ck.values or ck.values[k].shape != g.type_of(k).shape:
                raise SwpError(f"--init `{init}` has no running statistic `{k}` of shape {list(g.type_of(k).shape)}",
                               hints=["give a checkpoint that `exec --save` wrote for this model"])
            values[k] = ck.values[k]
    return values


def _at_batch(m: Model, rows: int) -> Model | None:
    """``m`` at a batch of ``rows`` in one pass (a held-out set's last partial batch); None if ``m`` has no
    ``batch`` argument."""
    batch = m.args.get("batch")
    if not isinstance(batch, int) or isinstance(batch, bool):
        return None
    return load(m.path, {**m.args, "batch": rows}, m.graph.precision, m.graph.guard)


def _execution(model: str, backend: str, opts: Options, outcome: Outcome, figures: dict | None = None,
               check: bool = False) -> Execution:
    steps = outcome.steps
    worst = max((r for r in steps if r.diff is not None), key=lambda r: r.diff, default=None) if check else None
    return Execution(model, backend, len(steps), opts.seed or 0, [r.loss for r in steps], [r.step_ms for r in steps],
                     figures or {}, (worst.diff if worst else 0.0) if check else None, outcome,
                     worst.diff_at if worst else None)


def execute_plan(plan: Plan, train: Graph | None, steps: int | None = None, seed: int | None = None, backend: str = "auto",
                 check: bool = False, on_step: OnStep | None = None, *, copy_delay_s: float = 0.0,
                 kernel_delay_s: float = 0.0, graph: bool = True, tf32: bool = False,
                 options: Options = Options(), hooks: Hooks = Hooks(), vendor_kernels: bool = True) -> Execution:
    """``execute`` for a plan already validated against its training graph ``train`` (``read_checked``).
    ``copy_delay_s``, ``kernel_delay_s`` (NumPy, for fuzzers): every copy or kernel starts that much later."""
    assert train is not None
    opts = _options(options, steps, seed)
    name, xp = array_module(backend)
    seed = opts.seed or 0
    join(train, planfile.format_plan(plan) if train.ranks > 1 else "", name)
    runner = PlanRunner(plan, train, name, xp, seed, check_plan=False, copy_delay_s=copy_delay_s,
                        kernel_delay_s=kernel_delay_s, graph=graph, tf32=tf32, vendor_kernels=vendor_kernels)
    f = simulate(plan)
    moved = (int(f["h2d_bytes"]), int(f["d2h_bytes"]))
    forward: list[PlanRunner] = []
    try:
        evaluate = None
        if opts.eval:
            evaluate = _plan_evaluator(plan, runner, name, xp, seed, forward)
        beside = _beside(train, seed, xp) if check else None
        held, host = [0], []
        step_hook = _hooks(hooks, on_step).on_step

        def observe(r: training.StepRecord) -> None:
            held[0] = max(held[0], device_bytes_held(xp, runner.arena))
            host.append(runner.host_ms)
            if step_hook is not None:
                step_hook(r)

        outcome = training.train(train, runner, opts, attrs.evolve(hooks, on_step=observe), evaluate, beside, moved)
    finally:
        runner.close()
        for f_ in forward:
            f_.close()
    figures = {"h2d_bytes": moved[0], "d2h_bytes": moved[1],
               "cap_bytes": plan.cap, "scratch_bytes": plan.scratch, "device_arena_bytes": int(runner.arena.nbytes),
               "blas_workspace_bytes": runner.memory.nbytes - int(runner.arena.nbytes),
               "device_bytes_allocated": held[0], "host_arena_bytes": int(runner.host.nbytes),
               "simulated_ms": f["iteration_ms"], "simulated_device": plan.device.name, "host_ms_per_step": host, "graph": runner.graph_note,
               "warmup_steps": runner.warmup_steps,
               "collectives": runner.comm_note,
               "vendor_kernels": len(runner.vendor.kernels), "fused_kernels": len(runner.fused.kernels),
               "vendor_notes": runner.vendor.notes + runner.fused.notes}
    return _execution(train.name, name, opts, outcome, figures, check)


def _plan_evaluator(plan: Plan, runner: PlanRunner, backend: str, xp: ModuleType, seed: int,
                    made: list[PlanRunner]) -> training.Evaluator:
    """Evaluation inside the training plan's arena: the forward graph planned (belady: quick, and never worse
    placed than the training step's forward part needs) under the same cap; the held-out data's last
    partial batch by the forward graph at its size, where that plans under the cap (else it is left out).
    The runners it makes go into ``made`` (the caller closes them)."""
    model = _model_of(plan)

    def forward_at(g: Graph, args: tuple[tuple[str, int | float | bool], ...]) -> PlanRunner:
        forward_plan = plan_with(Request(g, plan.device, plan.cap, plan.model_path, args), "belady")
        state = runner.state()
        made.append(PlanRunner(forward_plan, g, backend, xp, seed, graph=False, memory=runner.memory,
                               vendor_kernels=runner.vendor_kernels))
        runner.load_state(state, runner.steps_run)  # the forward runner's start wrote over the shared arena
        return made[-1]

    def tail(rows: int) -> PlanRunner | None:
        try:
            at = _at_batch(model, rows)
            return None if at is None else forward_at(at.evaluation, at.graph.args)
        except SwpError:  # the model refuses that batch, or its forward graph does not plan under the cap
            return None

    micro = int(model.args["batch"]) // model.microbatches if model.microbatches > 1 else None
    return training.Evaluator(runner, forward_at(model.evaluation, plan.args), functools.cache(tail), micro)


def _beside(train: Graph, seed: int, xp: ModuleType) -> training.Beside:
    """The reference executor beside a plan (``exec --check``), in a memory pool of its own: what it holds is
    not the plan's."""
    require_memory(xp, peak_bytes(train), 0, "`--check`'s reference executor (no cap, beside the plan's arena)")
    separate = separate_pool(xp)
    with separate():
        ref = reference.Trainer(train, seed, xp)
    return training.Beside(ref, separate, train)


def _model_of(plan: Plan) -> Model:
    where = plan.origin.file if plan.origin is not None else "."
    return _model(str(planfile.find_model(plan, where)), plan.model_sha256, plan.args, plan.precision, plan.guard,
                  plan.microbatches, plan.ranks, plan.link_gbps, plan.bucket_mib, plan.bucket_members)


def _graph_of(plan: Plan) -> Graph:
    """The training graph a plan object describes, from its model file (validated against it)."""
    where = plan.origin.file if plan.origin is not None else "."
    model = planfile.find_model(plan, where)
    train = _training_graph(str(model), plan.model_sha256, plan.args, plan.precision, plan.guard, plan.microbatches,
                            plan.ranks, plan.link_gbps, plan.bucket_mib, plan.bucket_members)
    validate(plan, train)
    return train


@functools.lru_cache(maxsize=4)
def _model(model: str, sha256: str, args: tuple[tuple[str, int | float | bool], ...], precision: str,
           guard: str, microbatches: int, ranks: int = 1, link_gbps: float = 0.0, bucket_mib: float = 0.0,
           bucket_members: tuple[int, ...] = ()) -> Model:
    """A model file with these arguments, precision, guard, micro-batches and ranks (its hash in the key: a
    file may change)."""
    return load(model, dict(args), precision, guard, microbatches, ranks, link_gbps, bucket_mib, bucket_members)


def _training_graph(model: str, sha256: str, args: tuple[tuple[str, int | float | bool], ...],
                    precision: str, guard: str, microbatches: int, ranks: int = 1, link_gbps: float = 0.0,
                    bucket_mib: float = 0.0, bucket_members: tuple[int, ...] = ()) -> Graph:
    return _model(model, sha256, args, precision, guard, microbatches, ranks, link_gbps, bucket_mib,
                  bucket_members).training


def _at_plan_arg(err: SwpError, plan: Plan) -> SwpError:
    """The error, placed at the plan's `arg` line it is about (the first such line if none is named)."""
    names = [k for k, _ in plan.args]
    i = next((i for i, k in enumerate(names) if f"`{k}`" in err.message or f"-D {k}" in err.message), 0)
    line = plan.origin.line("arg", i) if plan.origin is not None else None
    what = "model arguments do not build its model"
    if err.message.startswith("bucket members"):  # (the list on the `ranks` line)
        line, what = plan.origin.line("ranks", 0) if plan.origin is not None else None, "bucket members do not fit"
    where = [f"at {err.span}"] if err.span is not None else []
    out = SwpError(f"the plan's {what}: {err.message}", None,
                   hints=["the plan was edited; run `swapdsl optimize` again"], notes=where + list(err.notes))
    if line is not None and plan.origin is not None:
        out.span = Span.point(plan.origin.file, line, 1)
    return out
