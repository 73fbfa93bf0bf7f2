"""The IR's stable text form, in the style of JAX's jaxpr printer."""

from __future__ import annotations

from pathlib import Path

from swapdsl.common.errors import Span
from swapdsl.common.paths import STDLIB_DIR
from swapdsl.graph.ir import AttrValue, Graph, Op, Tensor

_COMMENT_COLUMN = 60


def format_attr(v: AttrValue) -> str:
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, tuple):
        return "(" + ",".join(format_attr(x) for x in v) + ("," if len(v) == 1 else "") + ")"
    if isinstance(v, float):
        return repr(v)
    return str(v)


def format_span(span: Span | None) -> str:
    """Where a node came from; stdlib files print as stdlib/..., wherever installed."""
    if span is None:
        return ""
    path = Path(span.file)
    try:
        shown = "stdlib/" + path.resolve().relative_to(STDLIB_DIR.resolve()).as_posix()
    except ValueError:
        shown = path.as_posix()
    return f"{shown}:{span.line}:{span.col}"


def format_op(op: Op, g: Graph) -> str:
    outs = ", ".join(f"{o}: {g.type_of(o)}" for o in op.outputs)
    attrs = "[" + ", ".join(f"{k}={format_attr(v)}" for k, v in op.attrs) + "]" if op.attrs else ""
    return f"{outs} = {op.op}{attrs} {' '.join(op.inputs)}".rstrip()


def _with_comment(text: str, span: Span | None) -> str:
    where = format_span(span)
    if not where:
        return text
    return f"{text.ljust(_COMMENT_COLUMN - 1)} # {where}"


def _decl(t: Tensor) -> str:
    init = f" = {t.init}" if t.init is not None else ""
    return f"{t.name}: {t.type}{init}"


def print_graph(g: Graph) -> str:
    args = ", ".join(f"{k}={format_attr(v)}" for k, v in g.args)
    lines = [f"model {g.name}({args}) {{"]
    lines.append("  inputs:")
    lines += ["    " + _with_comment(_decl(g.tensors[n]), g.tensors[n].span) for n in g.inputs]
    lines.append("  params:")
    lines += ["    " + _with_comment(_decl(g.tensors[n]) + (" frozen" if n in g.frozen else ""), g.tensors[n].span)
              for n in g.params]
    if g.state:
        lines.append("  state:")
        lines += ["    " + _decl(g.tensors[n]) for n in g.state]
    lines.append("  ops:")
    lines += ["    " + _with_comment(format_op(op, g), op.span) for op in g.ops]
    lines.append(f"  minimize {g.loss} with {g.optimizer}")
    lines += [f"  report {name} = {tensor}" for name, tensor in g.reports]
    if g.updates:
        lines.append("  updates:")
        lines += [f"    {old} <- {new}" for old, new in g.updates]
    lines.append("}")
    return "\n".join(lines) + "\n"
