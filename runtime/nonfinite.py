"""When a step's loss is not finite: which op made the first NaN or infinity, found by replaying the run.

Every plan trains exactly like the reference executor, and a run's randomness is (seed, step), so the
reference replaying the same steps from the same start on the same batches meets the same values. The
replay checks every op's output and stops at the first that is not finite: often a step or more before
the loss shows it (an update that overflowed a weight, say). It runs on NumPy, so it is tried only where
the reference fits in a bounded share of host memory and within a bounded number of steps.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import attrs
import numpy as np

from swapdsl.common.errors import SwpError
from swapdsl.graph.analysis import peak_bytes
from swapdsl.graph.ir import Graph, Op
from swapdsl.graph.ops.halfbits import is_bf16
from swapdsl.runtime import reference

REPLAY_MAX_BYTES = 2**30  # the reference's peak a replay may take on the host
REPLAY_MAX_STEPS = 1000

Batches = Callable[[int], Mapping[str, np.ndarray] | None]  # step -> its batch (None: the synthetic one)


@attrs.frozen
class Culprit:
    step: int
    index: int  # the op's index in the training graph
    op: Op
    label: str  # what the model calls its output (Tensor.title)


class _Found(Exception):
    def __init__(self, index: int) -> None:
        self.index = index


def is_float(a: Any) -> bool:
    """A float array (bf16 included: ml_dtypes' dtypes are of kind "V")."""
    return np.dtype(a.dtype).kind == "f" or is_bf16(a.dtype)


def all_finite(arrays: Iterable[Any]) -> bool:
    return all(np.isfinite(np.asarray(a)).all() for a in arrays if is_float(a))  # (bf16 too: ml_dtypes)


INFINITE_BY_DESIGN = frozenset({"causal_mask"})  # writes -inf where attention may not look


def _made(op: str, out: Any, ins: list[Any]) -> bool:
    """Did the op make a non-finite value: a NaN from inputs without one, or an infinity from inputs without
    one (but for an op whose infinities are meant, and read on by ops such as softmax that make them finite)."""
    if not is_float(out):
        return False
    values = np.asarray(out, np.float64)
    floats = [np.asarray(x, np.float64) for x in ins if is_float(x)]
    if np.isnan(values).any() and not any(np.isnan(x).any() for x in floats):
        return True
    return bool(op not in INFINITE_BY_DESIGN and np.isinf(values).any() and not any(np.isinf(x).any() for x in floats))


def first_nonfinite(g: Graph, seed: int, start: Mapping[str, np.ndarray] | None, first: int, last: int,
                    batches: Batches) -> Culprit | None:
    """The first op whose output is not finite over steps ``first``..``last`` of the run that began from
    ``start`` (persistent values; None: the seed's initial ones), or None if every value stays finite."""
    trainer = reference.Trainer(g, seed, np)
    if start is not None:
        trainer.load_state(start, first - 1)

    def watch(i: int, out: Any, ins: list[Any]) -> None:
        if _made(g.ops[i].op, out, ins):
            raise _Found(i)

    for step in range(first, last + 1):
        batch = batches(step)
        if batch is not None:
            trainer.set_batch(batch)
        try:
            trainer.step(step, watch)
        except _Found as found:
            op = g.ops[found.index]
            return Culprit(step, found.index, op, g.tensors[op.outputs[0]].title)
    return None


def replayable(g: Graph, first: int, last: int) -> bool:
    return last - first < REPLAY_MAX_STEPS and peak_bytes(g) <= REPLAY_MAX_BYTES


def nonfinite_error(what: str, culprit: Culprit | None, replayed: bool, half: bool = True) -> SwpError:
    """The error `exec` stops with: ``what`` went wrong in which step, and the op that made the first
    non-finite value (``half``: whether the run computes in half precision, which the hint then names)."""
    notes, hints = [], ["--on-nonfinite continue trains on regardless"]
    if culprit is not None:
        named = f" ({culprit.label})" if culprit.label != culprit.op.op else ""
        notes.append(f"the first non-finite value was made in step {culprit.step} by op {culprit.index}, "
                     f"`{culprit.op.op}`{named}" + (f" at {culprit.op.span}" if culprit.op.span else ""))
    elif not replayed:
        notes.append(f"no replay to find the op: it would take over {REPLAY_MAX_STEPS} steps or more than "
                     f"{REPLAY_MAX_BYTES >> 30} GiB on the host; replay a smaller configuration with `exec MODEL.swp`")
    else:
        notes.append("replayed on the reference executor (NumPy), every value stayed finite: the run's kernels "
                     "round differently from the reference's (cuDNN, fused kernels or TF32 on a GPU)")
    hints.append("a lower learning rate, --precision f32, or f32 parameters and optimiser state often help"
                 if half else "a lower learning rate often helps")
    return SwpError(f"{what}; stopped, and saved nothing over the last good checkpoint", notes=notes, hints=hints)
