"""Inference: a model's outputs for every example of a data set, by an executor of its prediction graph
(``autodiff.prediction_graph``), a batch at a time in order; the last partial batch by an executor of the
graph at its size. What it returns ``swapdsl predict`` writes to one ``.npz``."""

from __future__ import annotations

import io
from collections.abc import Callable

import numpy as np

from swapdsl.common.errors import SwpError
from swapdsl.graph.ir import Graph
from swapdsl.runtime.dataset import Dataset, gather
from swapdsl.runtime.training import Stepper


Scored = list[tuple[float, dict[str, float], int]]  # each batch's loss, reports and rows


class PartialBatch(SwpError):
    """The data's last partial batch does not plan under the cap at its size."""


def predict(g: Graph, forward: Stepper, tail: Callable[[int], Stepper | None], ds: Dataset,
            state: dict[str, np.ndarray], scored: Scored | None = None) -> dict[str, np.ndarray]:
    """Each output of ``g`` (by name) for every example of ``ds``, rows in the data's order, computed from
    the persistent values ``state`` (parameters and running statistics). ``scored`` (a graph that keeps its
    loss and reports too, ``evaluation_graph(..., outputs=True)``): each batch's loss, reports and rows are
    added to it, as ``training.Evaluator`` weighs them."""
    parts: dict[str, list[np.ndarray]] = {name: [] for name, _ in g.outputs}
    forward.load_state(state, 0)
    for k in range(ds.batches_per_epoch):
        _run(forward, gather(ds, slice(k * ds.batch, (k + 1) * ds.batch)), parts, scored, ds.batch)
    if ds.dropped:
        extra = tail(ds.dropped)
        if extra is None:
            raise PartialBatch(f"the last {ds.dropped} examples of `{ds.path}` make a partial batch that does not "
                           "plan under the cap", hints=[f"give a multiple of {ds.batch} examples"])
        extra.load_state(state, 0)
        whole = ds.batches_per_epoch * ds.batch
        _run(extra, gather(ds, slice(whole, whole + ds.dropped)), parts, scored, ds.dropped)
    return {name: np.concatenate(p) for name, p in parts.items()}


def _run(stepper: Stepper, batch: dict[str, np.ndarray], parts: dict[str, list[np.ndarray]],
         scored: Scored | None, rows: int) -> None:
    stepper.set_batch(batch)
    loss = stepper.run_step(stepper.steps_run + 1)[0]
    values = stepper.state({f"output/{name}" for name in parts})  # (not every parameter, every batch)
    for name, p in parts.items():
        p.append(np.array(values[f"output/{name}"]))
    if scored is not None:
        scored.append((loss, stepper.metrics(), rows))


def npz_bytes(arrays: dict[str, np.ndarray]) -> bytes:
    """``arrays`` as an uncompressed ``.npz`` file's bytes (written atomically by the caller), bf16 widened to
    f32 (exactly): NumPy's format has no bf16, and without ml_dtypes a reader gets raw two-byte records."""
    buffer = io.BytesIO()
    np.savez(buffer, **readable(arrays))
    return buffer.getvalue()


def readable(arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """``arrays`` as ``npz_bytes`` writes them: bf16 as f32."""
    return {k: v.astype(np.float32) if v.dtype.name == "bfloat16" else v for k, v in arrays.items()}
