"""Exact memory: kernels write into the arena, their temporaries live in the planned scratch region, and a
training step allocates nothing else of any size.

The bound, ALLOWED_BYTES = 256 KiB for a whole step: what NumPy itself may allocate inside a kernel call
while it iterates (its iterator buffers for strided, broadcast or casting operands: at most 8,192 elements
of 8 bytes for each of three operands, 192 KiB) plus the Python objects a step makes and drops (array
views, closures). Nothing in it grows with a tensor: a kernel that computed into a fresh array instead of
its output would allocate the whole tensor (the teeth test below).
"""

from __future__ import annotations

import functools
import traceback
import tracemalloc

import attrs
import numpy as np
import pytest

from conftest import MODELS, build_graph
from swapdsl import api
from swapdsl.cli import parse_defines
from swapdsl.graph.analysis import scratch_bytes
from swapdsl.graph.autodiff import training_graph
from swapdsl.graph.ir import Graph
from swapdsl.graph.ops import REGISTRY
from swapdsl.graph.ops.registry import KernelContext, ScratchOverflow
from swapdsl.plan.file import format_plan, parse_plan
from swapdsl.plan.program import Plan, Run
from swapdsl.plan.validate import PlanError, validate
from swapdsl.runtime.interpreter import PlanRunner
from test_planners import caps, plan_for
from swapdsl.runtime.reference import Trainer
from test_runtime import SMALL, run_against_reference, small_training_graph

ALLOWED_BYTES = 256 * 2**10


def tiled_resnet() -> Graph:
    """tiny_resnet at a batch where its convolutions tile by sample and its norms by channel, and where
    each activation (512 KiB) is over ALLOWED_BYTES."""
    return training_graph(build_graph(str(MODELS / "tiny_resnet.swp"), ["batch=16", "width=8", "blocks=1"])[1])


def step_allocation(runner: PlanRunner, step: int) -> int:
    """The most a step holds at once beyond what was allocated before it (all threads, every allocator)."""
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        runner.step(step)
        return tracemalloc.get_traced_memory()[1] - before
    finally:
        tracemalloc.stop()


# Small configurations a plan at 1/3 of the no-swap memory fits (deeper than test_runtime's, where 1/3
# is below the smallest feasible cap); VGG's first convolutions' gradients alone need more than half of
# its no-swap memory at any size, so it runs at its smallest feasible cap.
DEEPER = {"mlp": ["batch=8", "features=32", "hidden=16", "depth=8"],
          "tiny_resnet": ["batch=8", "width=4", "blocks=2"],
          "resnet": ["depth=34", "base=4", "image=32", "batch=2", "classes=5"]}


@functools.cache
def third_of_no_swap(name: str) -> tuple[Graph, Plan]:
    """The model's plan at 1/3 of its no-swap memory (VGG: at its smallest feasible cap)."""
    t = training_graph(build_graph(str(MODELS / f"{name}.swp"), DEEPER[name])[1]) if name in DEEPER \
        else small_training_graph(name)
    need, no_swap = caps(t)
    assert need <= no_swap // 3 or name == "vgg", (name, need / no_swap)
    return t, plan_for(t, max(no_swap // 3, need), "belady")


@pytest.mark.parametrize("name", list(SMALL))
def test_a_step_allocates_nothing_outside_the_arena(name: str) -> None:
    t, plan = third_of_no_swap(name)
    runner = PlanRunner(plan, t, "numpy", np, seed=3)
    try:
        runner.step(1)  # the first step builds the lanes
        held = [step_allocation(runner, step) for step in (2, 3)]
    finally:
        runner.close()
    assert max(held) <= ALLOWED_BYTES, (name, held)
    assert runner.arena.nbytes == plan.cap


def test_the_allocation_bound_has_teeth(monkeypatch: pytest.MonkeyPatch) -> None:
    """A ReLU that computes into a fresh array and copies it (as every kernel did before) is caught."""
    t = tiled_resnet()
    need, no_swap = caps(t)
    plan = plan_for(t, max(no_swap // 3, need), "belady")
    relu = REGISTRY["relu"]

    def copying_relu(c: KernelContext, ins: list, out: np.ndarray, a: dict) -> None:
        out[...] = np.maximum(ins[0], 0)

    monkeypatch.setitem(REGISTRY, "relu", attrs.evolve(relu, kernel=copying_relu))
    runner = PlanRunner(plan, t, "numpy", np, seed=3)
    try:
        runner.step(1)
        assert step_allocation(runner, 2) > ALLOWED_BYTES
    finally:
        runner.close()


def test_a_kernel_taking_more_scratch_than_its_op_declares_fails() -> None:
    ctx = KernelContext.standalone(np, 1024)
    ctx.scratch.take((64,), np.float32)
    with pytest.raises(ScratchOverflow):
        ctx.scratch.take((256,), np.float32)


def test_the_plan_reserves_the_scratch_and_tensors_stay_below_it() -> None:
    t, plan = third_of_no_swap("tiny_transformer")
    assert plan.scratch == scratch_bytes(t) and plan.tensor_cap + plan.scratch <= plan.cap
    text = format_plan(plan)
    assert f"\nscratch {plan.scratch}\n" in text
    short = text.replace(f"\nscratch {plan.scratch}\n", "\nscratch 256\n")
    with pytest.raises(PlanError, match="reserves 256 bytes of scratch; the model's kernels need"):
        validate(parse_plan(short), t)
    huge = text.replace(f"\nscratch {plan.scratch}\n", f"\nscratch {plan.cap + 256}\n")
    with pytest.raises(PlanError, match="does not fit"):
        validate(parse_plan(huge), t)


def test_a_plan_trains_exactly_like_the_reference_when_kernels_tile() -> None:
    """Tiles are a function of the shapes alone, so a plan and the reference agree exactly, step after
    step, for a model whose convolutions and norms tile."""
    t = tiled_resnet()
    need, no_swap = caps(t)
    assert run_against_reference(plan_for(t, max(no_swap // 3, need), "belady"), t, steps=3) == 0.0


@pytest.mark.gpu
@pytest.mark.parametrize("graph", [True, False])
@pytest.mark.parametrize("name", ["tiny_resnet", "tiny_transformer", "lstm_lm"])
def test_a_cupy_step_allocates_no_device_memory(name: str, graph: bool) -> None:
    """After the arenas, a step on CuPy asks the device for nothing: it runs under an allocator that
    raises, and the GPU's free memory (which sees what cuBLAS, cuDNN or a CUDA graph take beside CuPy's
    pool) is the same after the next step; capturing the graph takes less than cuBLAS's smallest default
    workspace (4 MiB: our handle works in the runner's own). With the graph on, the step is captured (or the
    runner says why not) and still matches."""
    import cupy

    t, plan = third_of_no_swap(name)
    runner = PlanRunner(plan, t, "cupy", cupy, seed=3, graph=graph)
    ref = Trainer(t, 3, np)

    def refuse(nbytes: int) -> None:
        raise AssertionError(f"a step allocated {nbytes} bytes of device memory")

    def free() -> int:
        cupy.cuda.runtime.deviceSynchronize()
        return int(cupy.cuda.runtime.memGetInfo()[0])

    try:
        assert runner.step(1)[0] == pytest.approx(ref.step(1), rel=1e-4)
        before = free()
        cupy.cuda.set_allocator(refuse)
        try:
            loss, _ = runner.step(2)
            captured = free()
            later = runner.step(3)[0]
        finally:
            cupy.cuda.set_allocator(cupy.get_default_memory_pool().malloc)
        assert loss == pytest.approx(ref.step(2), rel=1e-4) and later == pytest.approx(ref.step(3), rel=1e-4)
        assert runner.graph_note
        taken = (before - captured, captured - free())
        assert taken[1] == 0 and taken[0] < 4 << 20 and (graph or taken[0] == 0), taken
    finally:
        runner.close()


def overlapping_inputs(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every NumPy ufunc and ``copyto`` made to record a call whose input overlaps its output without being
    that same array object: CuPy copies such an input into memory it allocates (``_copy_in_args_if_needed``
    in CuPy 14), which a step on the device must never do. This finds them without a GPU."""
    found: list[str] = []

    class Watched:
        def __init__(self, name: str, fn) -> None:  # noqa: ANN001
            self.name, self.fn = name, fn

        def __getattr__(self, attr: str):  # noqa: ANN204
            return getattr(self.fn, attr)  # a ufunc's reduce, nin, ...

        def __call__(self, *args, **kwargs):  # noqa: ANN002, ANN003, ANN204
            out = kwargs.get("out")
            outs = out if isinstance(out, tuple) else (out,) if out is not None else ()
            copy = self.name == "copyto"
            targets = [o for o in (*outs, args[0] if copy else None) if isinstance(o, np.ndarray)]
            for o in targets:
                for x in args[1:] if copy else args:
                    if isinstance(x, np.ndarray) and x is not o and np.may_share_memory(x, o):
                        where = traceback.extract_stack()[-2]
                        found.append(f"{self.name}: input {x.shape} overlaps output {o.shape} at "
                                     f"{where.filename.rsplit('/', 1)[-1]}:{where.lineno}")
            return self.fn(*args, **kwargs)

    for name in dir(np):
        fn = getattr(np, name)
        if isinstance(fn, np.ufunc) or name == "copyto":
            monkeypatch.setattr(np, name, Watched(name, fn))
    return found


def bf16_tiled_resnet() -> tuple[Graph, Plan]:
    """tiny_resnet in bf16 where its norms tile by channel: the half kernels' staged blocks (kernels.py)."""
    model = api.load(str(MODELS / "tiny_resnet.swp"), parse_defines(["batch=16", "width=8", "blocks=1"]), "bf16")
    t = model.training
    need, no_swap = caps(t)
    return t, plan_for(t, max(no_swap // 3, need), "belady")


@pytest.mark.parametrize("name", ["tiny_resnet", "tiny_transformer", "lstm_lm", "mlp", "bf16 tiny_resnet"])
def test_no_step_hands_a_kernel_an_input_overlapping_its_output(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """In-place ops (optimiser updates, gradient sums, running statistics) pass their output as the very
    object of their first input, down to each chunk, tile and staged block, so CuPy has nothing to copy."""
    t, plan = bf16_tiled_resnet() if name.startswith("bf16") else third_of_no_swap(name)
    assert any(i.in_place for i in plan.program if isinstance(i, Run))
    runner = PlanRunner(plan, t, "numpy", np, seed=3)
    try:
        runner.step(1)
        found = overlapping_inputs(monkeypatch)
        runner.step(2)
        monkeypatch.undo()
    finally:
        runner.close()
    assert found == []
