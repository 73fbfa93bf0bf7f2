"""Walking an ONNX graph at given sizes: every node either folds to a constant (shape arithmetic) or
becomes one `.swp` line through its rule (``rules.RULES``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from swapdsl.common.errors import SwpError
from swapdsl.importer.blocks import parse, refs
from swapdsl.importer.context import Lowering, Tensor, attributes, torch_scopes, unsupported, utf8
from swapdsl.importer.onnx_read import Source
from swapdsl.importer.fold import FOLD
from swapdsl.importer.rules import RULES, table_rows


# what NumPy and the rules raise on a node whose inputs or attributes an adversary chose
MALFORMED = (ValueError, IndexError, TypeError, KeyError, OverflowError, ZeroDivisionError)


def lower(src: Source, sizes: Mapping[str, int], freeze: str | None = None) -> Lowering:
    """Every node of ``src`` at these sizes (``batch`` and the other symbolic sizes)."""
    lw = Lowering(src, sizes, freeze)
    for node in src.nodes:
        if node.domain not in ("", "ai.onnx"):
            raise unsupported(node, f"operator domain `{node.domain}` is not the standard one")
        ins = [lw.get(node, i) for i in range(len(node.input))]
        if node.op_type in FOLD and all(v is None or isinstance(v, np.ndarray) for v in ins) and (
                ins or node.op_type == "Constant") and not _trained_layout(lw, node):
            try:
                outs = FOLD[node.op_type](node, ins, attributes(node))
            except MALFORMED as exc:
                raise unsupported(node, f"its constant inputs do not fold: {str(exc)[:200]}") from None
            lw.env.update(zip(node.output, (np.asarray(o) for o in outs)))
            if node.op_type == "Identity" and node.input[0] in lw.weights:
                lw.weights.update(node.output)  # one of several equal weights the exporter stored once
            elif node.op_type != "Gather" and (source := next(  # (Gather says so itself: _trained_layout)
                    (lw.folded_from.get(n) or ((n, node.op_type) if n in lw.weights else None)
                     for n in node.input if n in lw.weights or n in lw.folded_from), None)):
                lw.folded_from.update((o, source) for o in node.output)  # (a note if it becomes a parameter)
        elif node.op_type in RULES:
            try:
                RULES[node.op_type](lw, node, attributes(node))
            except MALFORMED as exc:
                raise unsupported(node, f"its inputs or attributes are not of a form swapdsl imports "
                                  f"({type(exc).__name__}: {str(exc)[:160]})") from None
        else:
            raise unsupported(node, "this op is not in swapdsl's import table")
        lw.producer.update((o, node) for o in node.output)
        scope = _scope(node, lw.classes)
        lw.scopes.extend([scope] * (len(lw.lines) - len(lw.scopes)))
    for name in src.outputs:
        if name not in lw.env:
            raise SwpError(f"the graph's output `{name}` is made by no node")
    _prune(lw, {v.name for n in src.outputs if isinstance(v := lw.env[n], Tensor)})
    return lw


def _prune(lw: Lowering, needed: set[str]) -> None:
    """Lines nothing needed reads any more (what a rule replaced: a rotary pattern become `rope`), and
    the parameters only they read, left out."""
    stmts = [parse(line) for line in lw.lines]
    names = {n for s in stmts for n in s.defines} | {t.name for _, t in lw.inputs}
    live, keep = set(needed), [False] * len(stmts)
    for i in range(len(stmts) - 1, -1, -1):
        if any(d in live for d in stmts[i].defines):
            keep[i] = True
            live.update(refs(stmts[i], names))
    if all(keep):
        return
    dead = {d for s, k in zip(stmts, keep) if not k for d in s.defines}
    lw.lines = [line for line, k in zip(lw.lines, keep) if k]
    lw.scopes = [scope for scope, k in zip(lw.scopes, keep) if k]
    for name in dead & set(lw.params):
        del lw.params[name]
        lw.running.pop(name, None)
    lw.frozen = [f for f in lw.frozen if f not in dead]


# a weight laid out anew (transposed for a MatMul, cast) or read at constant rows (position embeddings) stays
# the weight training changes: a line of the model, not a folded copy, so that it keeps its name, learns, and a
# weight used twice (tied embeddings) stays one
_KEEPS_WEIGHT = frozenset({"Transpose", "Reshape", "Squeeze", "Unsqueeze", "Cast", "CastLike", "Gather"})


def _trained_layout(lw: Lowering, node: Any) -> bool:
    if node.op_type not in _KEEPS_WEIGHT or not node.input or node.input[0] not in lw.weights:
        return False
    v = lw.env[node.input[0]]
    if not (isinstance(v, np.ndarray) and (np.issubdtype(v.dtype, np.floating) or v.dtype.name == "bfloat16")):
        return False
    if node.op_type == "Gather" and (attributes(node).get("axis", 0) != 0 or table_rows(
            v, lw.get(node, 1) if len(node.input) > 1 else None) is None):
        note = (f"`{node.input[0]}` read at constant rows other than consecutive positions or one row for all "
                "is imported as a frozen copy (not trained)")
        if note not in lw.notes:
            lw.notes.append(note)
        return False  # rows the rule cannot write as a slice: folded, as before
    return True


def _scope(node: Any, classes: dict[tuple[str, ...], str]) -> tuple[str, ...]:
    """The module a node belongs to, outermost first: from the dynamo exporter's name scopes (and the
    modules' classes, into ``classes``), or the TorchScript exporter's node name `/layer1/layer1.0/conv1/Conv`."""
    found = torch_scopes(node)
    if found is not None:
        scopes, kinds = found[0][1:-1], found[1][1:len(found[0]) - 1]
        for k, kind in enumerate(kinds):
            classes.setdefault(tuple(scopes[:k + 1]), kind)
        return tuple(scopes)
    name = utf8(node.name)
    return tuple(name.split("/")[1:-1]) if name.startswith("/") else ()
