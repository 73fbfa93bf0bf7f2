"""The library API: everything the command line does, callable from Python. The CLI only wraps it.

    import swapdsl
    model = swapdsl.load("stdlib/models/tiny_resnet.swp", batch=8)
    plan = swapdsl.optimize(model, memory="2MiB", method="ga", budget_s=10)
    swapdsl.save(plan, "tiny.plan")
    run = swapdsl.execute(plan, steps=5, check=True)
    print(run.losses, run.max_rel_diff)

Mistakes raise ``SwpError`` (the message the command line prints).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from pathlib import Path

import attrs
import numpy as np

from swapdsl.common.errors import Span, SwpError
from swapdsl.common.units import parse_size
from swapdsl.devices.profiles import Device, load_device
from swapdsl.graph.analysis import peak_bytes, summary, training_summary
from swapdsl.graph.autodiff import training_graph
from swapdsl.graph.checker import check_graph
from swapdsl.graph.ir import Graph
from swapdsl.lang.elaborate import Override, elaborate
from swapdsl.lang.loader import Program
from swapdsl.lang.loader import load as load_program
from swapdsl.plan import file as planfile
from swapdsl.plan.figures import plan_figures
from swapdsl.plan.program import Plan
from swapdsl.plan.simulate import simulate as simulate_plan
from swapdsl.plan.validate import validate
from swapdsl.planning.ga import SearchOptions
from swapdsl.planning.optimize import optimize as plan_with
from swapdsl.planning.problem import Request
from swapdsl.runtime import reference
from swapdsl.runtime.backend import array_module, device_bytes_held, require_memory, separate_pool, to_host
from swapdsl.runtime.interpreter import PlanRunner

OnStep = Callable[[int, float, float, "float | None"], None]  # (step, loss, ms, max rel diff or None)


@attrs.frozen(slots=False)
class Model:
    """A checked model: its file, its program and its forward graph; the training graph on first use."""

    path: str
    program: Program = attrs.field(repr=False)
    graph: Graph = attrs.field(repr=False)

    @functools.cached_property
    def training(self) -> Graph:
        """Forward, backward and optimiser update: the graph a plan schedules."""
        t = training_graph(self.graph)
        check_graph(t)
        return t

    @property
    def args(self) -> dict[str, int | float | bool]:
        return dict(self.graph.args)

    def summary(self, training: bool = False) -> dict:
        """The figures `swapdsl check [--training] --json` prints."""
        return summary(self.graph) | (training_summary(self.training) if training else {})


def load(path: str | Path, overrides: Mapping[str, Override] | None = None, **args: int | float | bool) -> Model:
    """Parse, resolve imports, elaborate and check a `.swp` model. Model arguments come as keywords
    (``batch=8``) or, as text the way ``-D`` gives them, in ``overrides``."""
    program = load_program(str(path))
    graph = elaborate(program, {**(overrides or {}), **args})
    check_graph(graph)
    return Model(str(path), program, graph)


def optimize(model: Model | str | Path, memory: int | str, method: str = "ga", device: str | Device | None = None,
             search: SearchOptions | None = None, **knobs: float | int | bool) -> Plan:
    """Plan ``model``'s training step under ``memory`` (bytes, or text such as "8GiB"), validated.
    ``device``: a built-in profile name, a profile file or a Device (default: the GPU found, else the
    default profile). ``ga`` reads ``search`` or its fields as keywords (``budget_s=10, seed=1``)."""
    m = model if isinstance(model, Model) else load(model)
    cap = parse_size(memory) if isinstance(memory, str) else memory
    dev = device if isinstance(device, Device) else load_device(device)
    try:
        options = attrs.evolve(search or SearchOptions(), **knobs)
    except TypeError:
        raise SwpError(f"unknown search option among {', '.join(knobs)}",
                       hints=[f"options: {', '.join(f.name for f in attrs.fields(SearchOptions))}"]) from None
    plan = plan_with(Request(m.training, dev, cap, m.path, m.graph.args), method, options)
    validate(plan)
    return plan


def save(plan: Plan, path: str | Path) -> None:
    """Write the plan file atomically (a reader sees the old file or the whole new one)."""
    planfile.write_plan(plan, str(path))


def read(path: str | Path) -> Plan:
    """A plan file, checked completely: against its model's training graph when the model is found (as
    `exec` needs it), and replayed."""
    return read_checked(str(path))[0]


def read_checked(path: str, need_model: bool = False) -> tuple[Plan, Graph | None]:
    """The plan and its model's training graph (None when the model is not found and not needed)."""
    plan = planfile.read_plan(path)
    model = planfile.find_model(plan, path) if need_model else planfile.locate_model(plan, path)
    try:
        train = None if model is None else _training_graph(str(model), plan.model_sha256, plan.args)
    except SwpError as err:  # the model built before, so the plan's arguments are at fault
        raise _at_plan_arg(err, plan) from None
    validate(plan, train)
    return plan, train


def simulate(plan: Plan) -> dict[str, float]:
    """The plan's figures recomputed from the plan alone (the planner's bound and sizes as stored)."""
    stored = dict(plan.figures)
    return plan_figures(plan, simulate_plan(plan),
                        *(stored.get(k) for k in ("bound_ms", "no_swap_bytes", "graph_peak_bytes")))


@attrs.frozen
class Execution:
    """What training for some steps gave. For a plan, also the bytes it moves, its arenas and its
    simulated step time; with ``check``, the largest relative difference from the reference."""

    model: str
    backend: str
    steps: int
    seed: int
    losses: list[float]
    step_ms: list[float]
    figures: dict[str, object] = attrs.field(factory=dict)  # a plan's: bytes moved, arenas, simulated step
    max_rel_diff: float | None = None

    def to_json(self) -> dict:
        out = {"model": self.model, "backend": self.backend, "steps": self.steps, "seed": self.seed,
               "loss": self.losses, "step_ms": self.step_ms, **self.figures}
        return out | ({"max_rel_diff": self.max_rel_diff} if self.max_rel_diff is not None else {})


def execute(target: Plan | Model | str | Path, steps: int = 10, seed: int = 0, backend: str = "auto",
            check: bool = False, on_step: OnStep | None = None, graph: bool = True, tf32: bool = False) -> Execution:
    """Train: a plan under its cap (a Plan, or a plan file), or a model with the reference executor and
    no cap (a Model, or a `.swp` file). ``check`` (plans) runs the reference beside it and compares every
    loss and parameter; ``on_step`` hears of every step as it ends; ``graph`` (plans on CuPy) replays each
    step as one captured CUDA graph; ``tf32`` (plans on CuPy) lets FP32 products use TF32 tensor cores."""
    if isinstance(target, (str, Path)):
        if is_plan_file(target):
            return execute_plan(*read_checked(str(target), need_model=True), steps, seed, backend, check, on_step,
                                graph=graph, tf32=tf32)
        target = load(target)
    if isinstance(target, Model):
        if check:
            raise SwpError("check compares a plan's execution with the reference executor; give a plan")
        return _train_reference(target, steps, seed, backend, on_step)
    return execute_plan(target, _graph_of(target), steps, seed, backend, check, on_step, graph=graph, tf32=tf32)


def is_plan_file(path: str | Path) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(12) == b"swapdsl-plan"
    except OSError:
        return False


def _train_reference(m: Model, steps: int, seed: int, backend: str, on_step: OnStep | None) -> Execution:
    name, xp = array_module(backend)
    require_memory(xp, peak_bytes(m.training), 0, f"training `{m.graph.name}` with no cap")
    hear = None if on_step is None else (lambda step, loss, ms: on_step(step, loss, ms, None))
    result = reference.train(m.training, steps, seed, xp, on_step=hear)
    return Execution(m.graph.name, name, steps, seed, result.losses, result.step_ms)


def execute_plan(plan: Plan, train: Graph | None, steps: int = 10, seed: int = 0, backend: str = "auto",
                 check: bool = False, on_step: OnStep | None = None, *, copy_delay_s: float = 0.0,
                 kernel_delay_s: float = 0.0, graph: bool = True, tf32: bool = False) -> Execution:
    """``execute`` for a plan already validated against its training graph ``train`` (``read_checked``).
    ``copy_delay_s``, ``kernel_delay_s`` (NumPy, for fuzzers): every copy or kernel starts that much later."""
    assert train is not None
    name, xp = array_module(backend)
    runner = PlanRunner(plan, train, name, xp, seed, check_plan=False, copy_delay_s=copy_delay_s,
                        kernel_delay_s=kernel_delay_s, graph=graph, tf32=tf32)
    separate = separate_pool(xp)  # the reference's memory is not the plan's: keep it out of the pool we measure
    with separate():
        ref = reference.Trainer(train, seed, xp) if check else None
    losses, times, host, worst, held = [], [], [], 0.0, 0
    try:
        for step in range(1, steps + 1):
            loss, ms = runner.step(step)
            losses.append(loss)
            times.append(ms)
            host.append(runner.host_ms)
            held = max(held, device_bytes_held(xp, runner.arena))
            diff = None
            if ref is not None:
                with separate():
                    ref_loss = ref.step(step)
                state = runner.persistent_values().items()
                diff = max(relative_diff(loss, ref_loss),
                           *(relative_diff(v, to_host(ref.persistent[k])) for k, v in state))
                worst = max(worst, diff)
            if on_step is not None:
                on_step(step, loss, ms, diff)
    finally:
        runner.close()
    f = simulate(plan)
    figures = {"h2d_bytes": int(f["h2d_bytes"]), "d2h_bytes": int(f["d2h_bytes"]),
               "cap_bytes": plan.cap, "scratch_bytes": plan.scratch, "device_arena_bytes": int(runner.arena.nbytes),
               "device_bytes_allocated": held, "host_arena_bytes": int(runner.host.nbytes),
               "simulated_ms": f["iteration_ms"], "host_ms_per_step": host, "graph": runner.graph_note,
               "vendor_kernels": len(runner.vendor.kernels), "fused_kernels": len(runner.fused.kernels),
               "vendor_notes": runner.vendor.notes + runner.fused.notes}
    return Execution(train.name, name, steps, seed, losses, times, figures, worst if check else None)


def relative_diff(a: object, b: object) -> float:
    x, y = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    scale = max(float(np.max(np.abs(y))) if y.size else 0.0, 1e-12)
    return float(np.max(np.abs(x - y))) / scale if x.size else 0.0


def _graph_of(plan: Plan) -> Graph:
    """The training graph a plan object describes, from its model file (validated against it)."""
    where = plan.origin.file if plan.origin is not None else "."
    model = planfile.find_model(plan, where)
    train = _training_graph(str(model), plan.model_sha256, plan.args)
    validate(plan, train)
    return train


@functools.lru_cache(maxsize=4)
def _training_graph(model: str, sha256: str, args: tuple[tuple[str, int | float | bool], ...]) -> Graph:
    """The training graph of a model file with these arguments (its hash in the key: a file may change)."""
    return load(model, dict(args)).training


def _at_plan_arg(err: SwpError, plan: Plan) -> SwpError:
    """The error, placed at the plan's `arg` line it is about (the first such line if none is named)."""
    names = [k for k, _ in plan.args]
    i = next((i for i, k in enumerate(names) if f"`{k}`" in err.message or f"-D {k}" in err.message), 0)
    line = plan.origin.line("arg", i) if plan.origin is not None else None
    where = [f"at {err.span}"] if err.span is not None else []
    out = SwpError(f"the plan's model arguments do not build its model: {err.message}", None,
                   hints=["the plan was edited; run `swapdsl optimize` again"], notes=where + list(err.notes))
    if line is not None and plan.origin is not None:
        out.span = Span.point(plan.origin.file, line, 1)
    return out
