"""The reference executor: a training graph in its default order, no cap, no swapping.

Every later executor is compared against this one. Like JAX's eval_jaxpr it is
one loop over the ops: look up the inputs, run the kernel, bind the output,
and drop each tensor after its last reader.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Iterable, Mapping
from types import ModuleType
from typing import Any

import attrs
import numpy as np

from swapdsl.graph.analysis import op_scratch
from swapdsl.graph.ir import Graph
from swapdsl.graph.ops import KernelContext
from swapdsl.graph.ops.kernels import kernel_of
from swapdsl.graph.ops.halfbits import to_module
from swapdsl.graph.ops.registry import np_dtype
from swapdsl.runtime.backend import synchronize, to_host
from swapdsl.runtime.data import init_persistent, synthetic_inputs
from swapdsl.runtime.dist import comm_for


def last_uses(g: Graph) -> dict[str, int]:
    """Index of the last op that reads each tensor."""
    last: dict[str, int] = {}
    for i, op in enumerate(g.ops):
        for name in op.inputs:
            last[name] = i
    return last


def run_ops(g: Graph, env: dict[str, Any], xp: ModuleType, step: int, keep: Iterable[str] = (),
            watch: Callable[[int, Any, list[Any]], None] | None = None) -> dict[str, Any]:
    """Run every op of ``g`` on ``env`` (which it extends); frees tensors after their last use. Each kernel
    gets a fresh output and exactly the scratch its op declares, so a kernel that takes more fails here.
    ``watch`` sees each op's index, output and inputs as it is made."""
    last = last_uses(g)
    keep = set(keep) | {g.loss}
    for i, op in enumerate(g.ops):
        t = g.type_of(op.outputs[0])
        out = xp.empty(t.shape, dtype=np_dtype(xp, t.dtype))
        kernel = kernel_of(op.op, tuple(map(g.type_of, op.inputs)), t, op.attr_dict)
        ins = [env[n] for n in op.inputs]
        kernel(KernelContext.standalone(xp, op_scratch(g, i), step, comm_for(g)), ins, out, op.attr_dict)
        env[op.outputs[0]] = out
        if watch is not None:
            watch(i, out, ins)
        for name in dict.fromkeys(op.inputs):  # once each: an op may read a tensor twice (x * x)
            if last[name] == i and name not in keep:
                del env[name]
    return env


@attrs.frozen
class TrainResult:
    losses: list[float]
    step_ms: list[float]
    persistent: dict[str, Any]  # params and optimiser state after the last step


class Trainer:
    """The reference executor, one step at a time (``exec --check`` runs it beside a plan)."""

    def __init__(self, g: Graph, seed: int, xp: ModuleType) -> None:
        self.g, self.xp = g, xp
        self.persistent = init_persistent(g, seed, xp)
        self.inputs = synthetic_inputs(g, seed, xp)
        self.keep = {new for _, new in g.updates}
        self.steps_run = 0

    def step(self, step: int, watch: Callable[[int, Any, list[Any]], None] | None = None) -> float:
        env = run_ops(self.g, {**self.persistent, **self.inputs}, self.xp, step, self.keep, watch)
        self.persistent.update({old: env[new] for old, new in self.g.updates})
        self.steps_run = step
        return float(to_host(env[self.g.loss]))

    # -- a training run's view (runtime/training.py), as the plan interpreter gives it

    def run_step(self, step: int) -> tuple[float, float]:
        """``step``, timed: (loss, milliseconds)."""
        synchronize(self.xp)
        started = time.perf_counter()
        loss = self.step(step)
        synchronize(self.xp)
        return loss, 1e3 * (time.perf_counter() - started)

    def set_batch(self, batch: Mapping[str, np.ndarray]) -> None:
        self.inputs = {name: to_module(self.xp, batch[name]) for name in self.g.inputs}

    def metrics(self) -> dict[str, float]:
        return {name: float(to_host(self.persistent[t])) for name, t in self.g.metrics.items()}

    def state(self, names: Collection[str] | None = None) -> dict[str, np.ndarray]:
        return {name: np.array(to_host(v)) for name, v in self.persistent.items() if names is None or name in names}

    def load_state(self, values: Mapping[str, np.ndarray], step: int) -> None:
        self.persistent.update({name: to_module(self.xp, values[name]) for name in self.g.persistent if name in values})
        self.steps_run = step


def train(g: Graph, steps: int, seed: int, xp: ModuleType,
          on_step: Callable[[int, float, float], None] | None = None) -> TrainResult:
    """Train ``steps`` steps on one fixed synthetic batch; report each step's loss and time."""
    trainer = Trainer(g, seed, xp)
    losses, times = [], []
    for step in range(1, steps + 1):
        loss, ms = trainer.run_step(step)
        losses.append(loss)
        times.append(ms)
        if on_step is not None:
            on_step(step, loss, ms)
    return TrainResult(losses, times, trainer.persistent)
