"""Structural checks of an IR graph: single assignment, defined before use, shapes."""

from __future__ import annotations

from swapdsl.common.errors import SwpError
from swapdsl.graph import ops
from swapdsl.graph.ir import FORWARD_ONLY, Graph, Kind, Op


class IRError(Exception):
    """The IR is malformed: a bug in whatever produced it, not the user's mistake."""


def _where(op: Op) -> str:
    return f"op `{op.op}` -> {', '.join(op.outputs)}" + (f" at {op.span}" if op.span else "")


def check_graph(g: Graph) -> None:
    """Raise IRError naming the first op (and its source position) that breaks a rule."""
    defined = set(g.inputs) | set(g.persistent)
    for name in defined:
        if name not in g.tensors:
            raise IRError(f"declared tensor {name} has no type")
    replaced_at = _replacements(g)
    for i, op in enumerate(g.ops):
        where = _where(op)
        if op.op not in ops.REGISTRY:
            raise IRError(f"{where}: unknown op")
        for name in op.inputs:
            if name not in defined:
                raise IRError(f"{where}: input {name} is used before it is defined")
            if replaced_at.get(name, len(g.ops)) < i:
                raise IRError(f"{where}: reads {name} after the op that replaces it")
        for name in op.outputs:
            if name in defined:
                raise IRError(f"{where}: {name} is assigned twice")
            if name not in g.tensors:
                raise IRError(f"{where}: output {name} has no type")
            defined.add(name)
        _check_types(g, op, where)
    if g.loss not in defined and (g.loss or g.optimizer != FORWARD_ONLY):
        raise IRError(f"loss {g.loss} is never computed")
    for name, tensor in g.reports:
        if tensor not in defined or g.type_of(tensor).shape != ():
            raise IRError(f"report {name}: {tensor} is not a computed scalar")
    _check_kinds(g, defined)


def _replacements(g: Graph) -> dict[str, int]:
    """For each persistent tensor with an update, the index of the op producing its new value."""
    producer = {out: i for i, op in enumerate(g.ops) for out in op.outputs}
    persistent = set(g.persistent)
    out: dict[str, int] = {}
    for old, new in g.updates:
        if old not in persistent or new not in producer:
            raise IRError(f"update {old} <- {new} names an unknown tensor")
        if g.type_of(old) != g.type_of(new):
            raise IRError(f"update {old} <- {new} changes type {g.type_of(old)} -> {g.type_of(new)}")
        out[old] = producer[new]
    return out


def _check_kinds(g: Graph, defined: set[str]) -> None:
    params = set(g.params)
    params |= {new for old, new in g.updates if old in params}
    for name, t in g.tensors.items():
        if name not in defined:
            raise IRError(f"tensor {name} has a type but nothing defines it")
        if (t.kind is Kind.param) != (name in params):
            raise IRError(f"tensor {name} is of kind {t.kind.value} but listed otherwise")


def _check_types(g: Graph, op: Op, where: str) -> None:
    ins = tuple(g.type_of(n) for n in op.inputs)
    try:
        expected = ops.infer(op.op, ins, op.attr_dict)
    except SwpError as exc:
        raise IRError(f"{where}: {exc.message}") from None
    actual = g.type_of(op.outputs[0])
    if expected != actual:
        raise IRError(f"{where}: output type is {actual} but the shape rule gives {expected}")
