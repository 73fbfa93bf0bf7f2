"""The IR checker names the op that breaks single assignment, ordering or shapes."""

from __future__ import annotations

import attrs
import pytest

from conftest import MODELS, build_graph
from swapdsl.graph.checker import IRError, check_graph
from swapdsl.graph.ir import Op, TensorType


@pytest.fixture(scope="module")
def graph():
    return build_graph(str(MODELS / "mlp.swp"), ["depth=1"])[1]


def test_valid_graph_passes(graph) -> None:
    check_graph(graph)


def test_use_before_definition(graph) -> None:
    ops = list(graph.ops)
    ops[0], ops[1] = ops[1], ops[0]
    with pytest.raises(IRError, match=r"op `add` -> %1 at .*layers.swp:11:13: input %0 is used before it is defined"):
        check_graph(attrs.evolve(graph, ops=tuple(ops)))


def test_double_assignment(graph) -> None:
    ops = list(graph.ops)
    ops[2] = attrs.evolve(ops[2], outputs=("%1",))
    with pytest.raises(IRError, match="%1 is assigned twice"):
        check_graph(attrs.evolve(graph, ops=tuple(ops)))


def test_shape_inconsistency(graph) -> None:
    tensors = dict(graph.tensors)
    t = tensors["%2"]
    tensors["%2"] = attrs.evolve(t, type=TensorType((64, 255), t.type.dtype))
    with pytest.raises(IRError, match=r"op `relu` -> %2 .*output type is f32\[64,255\] but the shape rule gives f32\[64,256\]"):
        check_graph(attrs.evolve(graph, tensors=tensors))


def test_unknown_op(graph) -> None:
    bad = graph.ops + (Op("frobnicate", ("%0",), ("%99",)),)
    with pytest.raises(IRError, match="unknown op"):
        check_graph(attrs.evolve(graph, ops=bad))
