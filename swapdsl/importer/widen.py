"""`import --f32`: a half-precision export read as the f32 model it rounds. Every bf16 or f16 weight,
input and constant is widened (exactly: each half value is an f32 value), and every cast to a half type
casts to f32 instead, so the imported model keeps f32 parameters; `optimize --precision bf16` then trains
it with bf16 products and f32 master weights, as torch.autocast would, where the half export would train
in half precision throughout."""

from __future__ import annotations

from typing import Any

import attrs
import numpy as np

from swapdsl.importer.onnx_read import Source

HALF = {"bfloat16": "bf16", "float16": "f16"}  # NumPy's half dtypes and swapdsl's names for them
HALF_TYPES = {10, 16}  # ONNX's FLOAT16 and BFLOAT16
FLOAT = 1


def widened(src: Source) -> Source:
    weights = {k: _wide(v) for k, v in src.weights.items()}
    inputs = tuple(attrs.evolve(i, dtype="f32") if i.dtype in HALF.values() else i for i in src.inputs)
    return attrs.evolve(src, weights=weights, inputs=inputs, nodes=tuple(_widened_node(n) for n in src.nodes))


def _wide(a: np.ndarray) -> np.ndarray:
    return a.astype(np.float32) if a.dtype.name in HALF else a


def _widened_node(node: Any) -> Any:
    """The node with its half-precision attributes made f32: a Cast's target type, a tensor's values
    (Constant, ConstantOfShape); the node itself where it has none."""
    from onnx import AttributeProto, NodeProto, numpy_helper

    def half(a: Any) -> bool:
        return (a.type == AttributeProto.INT and a.name == "to" and node.op_type == "Cast" and a.i in HALF_TYPES) \
            or (a.type == AttributeProto.TENSOR and a.t.data_type in HALF_TYPES)

    if not any(half(a) for a in node.attribute):
        return node
    wide = NodeProto()
    wide.CopyFrom(node)
    for a in wide.attribute:
        if a.type == AttributeProto.INT and half(a):
            a.i = FLOAT
        elif half(a):
            a.t.CopyFrom(numpy_helper.from_array(_wide(np.asarray(numpy_helper.to_array(a.t))), a.t.name))
    return wide
