"""Figures about a graph: parameter counts, FLOPs, bytes, memory peaks."""

from __future__ import annotations

import functools
from collections import Counter
from typing import Any

from swapdsl.common.memo import by_identity
from swapdsl.common.units import ALIGN, arena_bytes
from swapdsl.graph import ops
from swapdsl.graph.ir import Graph, Kind, TensorType


def op_flops(g: Graph, index: int) -> int:
    op = g.ops[index]
    ins = tuple(g.type_of(n) for n in op.inputs)
    return ops.REGISTRY[op.op].flops(ins, g.type_of(op.outputs[0]), op.attr_dict)


def op_scratch(g: Graph, index: int) -> int:
    """The scratch bytes op ``index``'s kernel takes (its op's declaration, on its types)."""
    op = g.ops[index]
    ins = tuple(g.type_of(n) for n in op.inputs)
    try:  # (each value keyed with its type: 1, 1.0 and True hash alike)
        return _scratch(op.op, ins, g.type_of(op.outputs[0]), tuple((k, type(v), v) for k, v in op.attrs))
    except TypeError:  # (an attribute that cannot be hashed: asked afresh)
        return ops.scratch_need(op.op, ins, g.type_of(op.outputs[0]), op.attr_dict)


@functools.lru_cache(maxsize=1 << 16)
def _scratch(op: str, ins: tuple[TensorType, ...], out: TensorType, attrs: tuple[tuple[str, type, Any], ...]) -> int:
    """``scratch_need``, remembered: a large model repeats few signatures (GPT-2 XL's 48 layers), and every
    graph a search builds (bucket sizes, micro-batch counts) asks again for each op."""
    return ops.scratch_need(op, ins, out, {k: v for k, _, v in attrs})


STATE_BYTES = ALIGN  # the runtime's own state at the bottom of the scratch region: the step counter


@by_identity()
def scratch_bytes(g: Graph) -> int:
    """The scratch region a plan of ``g`` reserves at the top of its arena: the runtime's state, then room
    for the largest kernel's temporaries (every kernel reuses it; kernels run one at a time)."""
    return STATE_BYTES + max((arena_bytes(op_scratch(g, i)) for i in range(len(g.ops))), default=0)


@by_identity()
def in_place_ops(g: Graph) -> frozenset[int]:
    """The ops that write their output over their first input: an optimiser update over the value it
    replaces (ordered after that value's other readers), and any other op the registry allows to whose
    first input nothing else reads, of the output's type, and not kept past the step (a gradient sum)."""
    readers = Counter(n for op in g.ops for n in op.inputs)
    updated = {new for _, new in g.updates}
    kept = set(g.persistent) | set(g.inputs) | {g.loss}
    out = set()
    for i, op in enumerate(g.ops):
        if not ops.REGISTRY[op.op].in_place or not op.inputs:
            continue
        first = op.inputs[0]
        if op.outputs[0] in updated or (readers[first] == 1 and first not in kept
                                         and g.type_of(first) == g.type_of(op.outputs[0])):
            out.add(i)
    return frozenset(out)


def peak_bytes(g: Graph, *, persistent: bool = True, inputs: bool = True) -> int:
    """Peak device bytes when the ops run in graph order with nothing swapped.

    Persistent tensors (params, optimiser state) are resident throughout, and
    an update's result takes the place of the tensor it replaces. Inputs are
    resident from the start until their last reader. Every other tensor is
    allocated when its op starts, or takes its first input's bytes where the op
    works in place (``in_place_ops``), and freed when its last reader finishes;
    the loss lives to the end. ``persistent`` and ``inputs`` choose whether
    those are counted at all.
    """
    in_place = in_place_ops(g)
    updated = {new for _, new in g.updates}
    last = {name: len(g.ops) for name in g.inputs}
    for i, op in enumerate(g.ops):
        for name in op.inputs:
            last[name] = i
    last[g.loss] = len(g.ops)
    base = sum(g.type_of(n).nbytes for n in g.persistent) if persistent else 0
    live = sum(g.type_of(n).nbytes for n in g.inputs) if inputs else 0
    peak = live
    persistent = set(g.persistent)
    for i, op in enumerate(g.ops):
        handed = op.inputs[0] if i in in_place else None  # its bytes become the output's
        live += sum(g.type_of(o).nbytes for o in op.outputs[1 if handed else 0:])
        peak = max(peak, live)
        for name in set(op.inputs) | set(op.outputs):
            transient = name not in updated and name not in persistent and name != handed
            counted = inputs or g.tensors[name].kind is not Kind.input
            if transient and counted and last.get(name, i) == i:
                live -= g.type_of(name).nbytes
    return base + peak


def summary(g: Graph) -> dict[str, Any]:
    """The figures `swapdsl check` reports on the forward graph, as a JSON-ready dict."""
    params = [g.tensors[n].type for n in g.params]
    inputs = [g.tensors[n].type for n in g.inputs]
    return {
        "model": g.name,
        "args": dict(g.args),
        "forward_ops": len(g.ops),
        "tensors": len(g.tensors),
        "inputs": len(inputs),
        "input_bytes": sum(t.nbytes for t in inputs),
        "param_tensors": len(params),
        "params": sum(t.numel for t in params),
        "param_bytes": sum(t.nbytes for t in params),
        "forward_flops": sum(op_flops(g, i) for i in range(len(g.ops))),
        "activation_peak_bytes": peak_bytes(g, persistent=False, inputs=False),
        "loss": g.loss,
        "optimizer": str(g.optimizer),
        "precision": g.precision,
        "guard": g.guard,
        "source_sha256": g.source_sha256,
    }


def untrained(t: Graph) -> list[str]:
    """The training graph's parameters that are not frozen and get no gradient: the loss does not depend on
    them (or only through ops without one, such as argmax), so training never changes them."""
    graded = {p for p, _ in t.grads}
    return [p for p in t.params if p not in graded and p not in t.frozen]


def untrained_note(t: Graph) -> str | None:
    """What ``untrained`` finds, said to a user (None: every parameter trains)."""
    names = untrained(t)
    if not names:
        return None
    shown = ", ".join(f"`{n}`" for n in names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
    them = "them, so training leaves them as they start" if len(names) > 1 else "it, so training leaves it as it starts"
    return f"the loss does not depend on {shown}: no gradient reaches {them}"


def training_summary(t: Graph) -> dict[str, Any]:
    """The training graph's figures: `swapdsl check --training`."""
    forward = sum(1 for op in t.ops if t.tensors[op.outputs[0]].kind is Kind.activation)
    updated = {new for _, new in t.updates}
    updates = sum(1 for op in t.ops if op.outputs[0] in updated)
    by_kind: dict[str, int] = {k.value: 0 for k in Kind}
    for tensor in t.tensors.values():
        by_kind[tensor.kind.value] += tensor.type.nbytes
    return {
        "ops": len(t.ops),
        "backward_ops": len(t.ops) - forward - updates,
        "update_ops": updates,
        "training_tensors": len(t.tensors),
        "state_bytes": sum(t.type_of(n).nbytes for n in t.state),
        "bytes_by_kind": by_kind,
        "flops": sum(op_flops(t, i) for i in range(len(t.ops))),
        "peak_bytes": peak_bytes(t),
        "untrained": untrained(t),
    }


def rowwise_dropout_seeds(g: Graph) -> frozenset[int]:
    """The seeds of the dropouts whose mask is drawn over the batch's rows: the forward dropout (the first
    with its seed; its gradient reuses the seed) reads a tensor made from the inputs, and its output's first
    axis is the inputs' rows (or a micro-batch's, in a graph already cut into them). A part of the batch (a
    micro-batch, a rank's rows) starts such a mask where the whole batch has those rows; any other dropout
    (over a parameter, say) draws one mask for the whole batch."""
    firsts = {g.type_of(n).shape[0] for n in g.inputs if g.type_of(n).shape}
    rows = {r // k for r in firsts for k in (1, g.microbatches)} if len(firsts) == 1 else set()
    from_batch, seen, seeds = set(g.inputs), set(), set()
    for op in g.ops:
        if op.op == "dropout" and op.attr_dict["seed"] not in seen:
            seen.add(op.attr_dict["seed"])
            shape = g.type_of(op.outputs[0]).shape
            if op.inputs[0] in from_batch and shape and shape[0] in rows:
                seeds.add(op.attr_dict["seed"])
        if any(n in from_batch for n in op.inputs):
            from_batch.update(op.outputs)
    return frozenset(seeds)
