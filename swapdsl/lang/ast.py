"""The .swp abstract syntax tree: frozen attrs nodes, each with its source span."""

from __future__ import annotations

from typing import Union

import attrs

from swapdsl.common.errors import Span

# ---- expressions -------------------------------------------------------------


@attrs.frozen
class Name:
    id: str
    span: Span


@attrs.frozen
class Const:
    """An int, float, bool or string literal."""

    value: int | float | bool | str
    span: Span


@attrs.frozen
class BinOp:
    op: str  # one of + - * / // % @ ** == != < <= > >= and or
    left: Expr
    right: Expr
    span: Span


@attrs.frozen
class UnaryOp:
    op: str  # - or not
    operand: Expr
    span: Span


@attrs.frozen
class Attr:
    value: Expr
    attr: str
    span: Span


@attrs.frozen
class Slice:
    start: Expr | None
    stop: Expr | None
    step: Expr | None
    span: Span


@attrs.frozen
class Index:
    value: Expr
    items: tuple[Expr | Slice, ...]
    span: Span


@attrs.frozen
class Arg:
    """A call argument; ``name`` is None for a positional one."""

    name: str | None
    value: Expr
    span: Span


@attrs.frozen
class Call:
    func: Expr  # a Name, or an Attr chain for a qualified name
    args: tuple[Arg, ...]
    scope: str | None  # `f(x) as NAME` names the parameter scope of a user function
    span: Span


@attrs.frozen
class TupleExpr:
    items: tuple[Expr, ...]
    span: Span


@attrs.frozen
class ListExpr:
    items: tuple[Expr, ...]
    span: Span


Expr = Union[Name, Const, BinOp, UnaryOp, Attr, Index, Call, TupleExpr, ListExpr]

# ---- statements --------------------------------------------------------------


@attrs.frozen
class TensorTypeExpr:
    dtype: str | None  # None: the default (f32)
    dtype_span: Span | None
    dims: tuple[Expr, ...]
    span: Span


@attrs.frozen
class InputStmt:
    name: str
    type: TensorTypeExpr
    span: Span


@attrs.frozen
class ParamStmt:
    name: str
    type: TensorTypeExpr
    init: Expr
    span: Span
    frozen: bool = False  # loaded and saved like any parameter, never trained


@attrs.frozen
class AssignStmt:
    targets: tuple[str, ...]
    value: Expr
    span: Span


@attrs.frozen
class ReturnStmt:
    values: tuple[Expr, ...]
    span: Span


@attrs.frozen
class ForStmt:
    var: str
    iter: Expr
    body: tuple[Stmt, ...]
    span: Span


@attrs.frozen
class IfStmt:
    branches: tuple[tuple[Expr, tuple[Stmt, ...]], ...]  # (condition, body) in order
    orelse: tuple[Stmt, ...]
    span: Span


@attrs.frozen
class MinimizeStmt:
    loss: Expr
    optimizer: str
    optimizer_span: Span
    args: tuple[Arg, ...]
    span: Span


@attrs.frozen
class ReportStmt:
    name: str
    value: Expr
    span: Span


@attrs.frozen
class OutputStmt:
    name: str
    value: Expr
    span: Span


@attrs.frozen
class AssertStmt:
    test: Expr
    message: Expr | None
    span: Span


Stmt = Union[InputStmt, ParamStmt, AssignStmt, ReturnStmt, ForStmt, IfStmt, MinimizeStmt, ReportStmt, OutputStmt,
             AssertStmt]

# ---- top level ---------------------------------------------------------------


@attrs.frozen
class ParamDecl:
    """A parameter of a `def` or an argument of a `model`."""

    name: str
    type: str | None  # optional annotation: int, float, bool
    default: Expr | None
    span: Span


@attrs.frozen
class FuncDef:
    name: str
    params: tuple[ParamDecl, ...]
    body: tuple[Stmt, ...]
    span: Span


@attrs.frozen
class ModelDef:
    name: str
    params: tuple[ParamDecl, ...]
    body: tuple[Stmt, ...]
    span: Span


@attrs.frozen
class Import:
    path: str  # as written: `a.b` becomes "a/b.swp"; a string stays as it is
    span: Span


@attrs.frozen
class Module:
    file: str
    imports: tuple[Import, ...]
    funcs: tuple[FuncDef, ...]
    models: tuple[ModelDef, ...]
    span: Span
