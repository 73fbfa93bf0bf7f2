"""Figures about a graph: parameter counts, FLOPs, bytes, activation peak."""

from __future__ import annotations

from typing import Any

from swapdsl import ops
from swapdsl.ir import Graph, Kind


def op_flops(g: Graph, index: int) -> int:
    op = g.ops[index]
    ins = tuple(g.type_of(n) for n in op.inputs)
    return ops.REGISTRY[op.op].flops(ins, g.type_of(op.outputs[0]), op.attr_dict)


def activation_peak_bytes(g: Graph) -> int:
    """Peak bytes of activations alive at once when the ops run in program order.

    Each activation is allocated when its op starts and freed after its last
    reader finishes; the loss lives to the end. Inputs and parameters are
    always resident and are not counted here.
    """
    last_use = {name: i for i, op in enumerate(g.ops) for name in op.outputs}
    for i, op in enumerate(g.ops):
        for name in op.inputs:
            last_use[name] = i
    last_use[g.loss] = len(g.ops)
    live = peak = 0
    for i, op in enumerate(g.ops):
        live += sum(g.type_of(o).nbytes for o in op.outputs)
        peak = max(peak, live)
        for name in set(op.inputs) | set(op.outputs):
            if g.tensors[name].kind is Kind.activation and last_use[name] == i:
                live -= g.type_of(name).nbytes
    return peak


def summary(g: Graph) -> dict[str, Any]:
    """The figures `swapdsl check` reports, as a JSON-ready dict."""
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
        "activation_peak_bytes": activation_peak_bytes(g),
        "loss": g.loss,
        "optimizer": str(g.optimizer),
        "source_sha256": g.source_sha256,
    }
