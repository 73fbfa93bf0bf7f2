"""AST + model arguments -> forward IR graph with concrete shapes and dtypes.

Elaboration runs the program eagerly: dimensions, loop bounds and conditions
are ordinary static values, and every tensor expression appends an op.
"""

from __future__ import annotations

import math
import operator
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import attrs

from swapdsl.lang import ast

from swapdsl.common.errors import Span, SwpError, did_you_mean
from swapdsl.common.units import MAX_BYTES
from swapdsl.graph import ops
from swapdsl.graph.ir import FORWARD_ONLY, TRAINER_REPORTS, DType, Graph, Init, Kind, Op, Optimizer, Tensor, TensorType
from swapdsl.lang.builtins import BUILTINS, call_builtin, representable, slice_axis
from swapdsl.lang.loader import Program
from swapdsl.lang.values import REQUIRED, TensorVal, Value, bind, describe

# Limits on what a model may ask of the elaborator (docs/language.md#limits states them). Past them a model is
# refused with a clear error rather than recursing until Python gives up or running for hours.
MAX_CALL_DEPTH = 64  # user functions calling user functions
MAX_OPS = 25_000  # forward ops (the largest zoo model, lstm_lm, has 15,216; its check takes 3 s)
MAX_STEPS = 2_000_000  # statements run and loop iterations, all together
MAX_INT = 2**63  # static integers lie in (-MAX_INT, MAX_INT)

# name -> (parameters with defaults) for initialisers and optimisers
INITIALIZERS: dict[str, tuple[tuple[str, Any], ...]] = {
    "zeros": (),
    "ones": (),
    "constant": (("value", REQUIRED),),
    "normal": (("std", 1.0), ("mean", 0.0)),
    "uniform": (("low", -1.0), ("high", 1.0)),
    "xavier": (),
    "xavier_uniform": (),
    "xavier_normal": (),
    "he": (),
    "he_normal": (),
    "he_uniform": (),
}
_INIT_ALIASES = {"xavier": "xavier_uniform", "he": "he_normal"}

# every optimiser takes a schedule and clipping: warmup steps, then cosine, linear or step decay (0: off;
# graph/ops/optim.learning_rate), min_lr, and clip (the gradients' global norm, 0: off); a hyper-parameter
# of these or `nesterov` left at its default is not recorded, so models without them keep their graphs
EXTRAS: tuple[tuple[str, Any], ...] = (("warmup", 0), ("cosine", 0), ("linear", 0), ("step_every", 0),
                                       ("gamma", 0.1), ("min_lr", 0.0), ("clip", 0.0))
OPTIMIZERS: dict[str, tuple[tuple[str, Any], ...]] = {
    "sgd": (("lr", REQUIRED), ("momentum", 0.0), ("weight_decay", 0.0), ("nesterov", 0), *EXTRAS),
    "adam": (("lr", 1e-3), ("beta1", 0.9), ("beta2", 0.999), ("eps", 1e-8), ("weight_decay", 0.0), *EXTRAS),
    "adamw": (("lr", 1e-3), ("beta1", 0.9), ("beta2", 0.999), ("eps", 1e-8), ("weight_decay", 1e-2), *EXTRAS),
    "lion": (("lr", 1e-4), ("beta1", 0.9), ("beta2", 0.99), ("weight_decay", 0.0), *EXTRAS),
}
_OMITTED_AT_DEFAULT = {*(k for k, _ in EXTRAS), "nesterov"}

_DTYPES: dict[str, DType] = {d.label: d for d in DType}


class _Return(Exception):
    def __init__(self, value: Value) -> None:
        self.value = value


@attrs.define
class _Frame:
    env: dict[str, Value]
    module: str  # the module whose functions are visible
    in_model: bool


Override = str | int | float | bool  # text as given to -D, or a typed value (the library API, a plan's args)


def elaborate(program: Program, overrides: Mapping[str, Override] | None = None) -> Graph:
    """The forward graph of the program's model, with overrides of its arguments applied."""
    el = _Elaborator(program)
    try:
        return el.run(overrides or {})
    except RecursionError:
        raise SwpError("the model nests too deeply to elaborate", el.at,
                       hints=["brackets, calls, unary operators and blocks nest; keep nesting under about 100 "
                              "levels (long chains like `a + b + c + ...` are not nesting)"]) from None


def model_of(program: Program) -> ast.ModelDef:
    module = program.modules[program.entry]
    if not module.models:
        raise SwpError(f"`{program.entry}` defines no model", module.span,
                       hints=["add `model NAME(batch = 32) { ... }`"])
    if len(module.models) > 1:
        raise SwpError(f"`{program.entry}` defines {len(module.models)} models; a file holds one",
                       module.models[1].span)
    return module.models[0]


def check_hparams(optimizer: str, v: dict[str, float], span: Span | None) -> None:
    """The hyper-parameters an update can run with: rates and decays in range, a schedule that makes sense."""
    def need(ok: bool, message: str) -> None:
        if not ok:
            raise SwpError(f"optimizer `{optimizer}`: {message}", span)

    need(v["lr"] > 0 and math.isfinite(v["lr"]), f"`lr` must be positive, got {v['lr']}")
    for key in ("beta1", "beta2"):
        if key in v:
            need(0 <= v[key] < 1, f"`{key}` must be in [0, 1), got {v[key]}")
    need(0 <= v["weight_decay"] < 1e3, f"`weight_decay` must be in [0, 1000), got {v['weight_decay']}")
    need(v.get("momentum", 0.0) >= 0, f"`momentum` must not be negative, got {v.get('momentum')}")
    need(v.get("nesterov", 0) in (0, 1), "`nesterov` is 0 or 1")
    need(not v.get("nesterov") or v["momentum"] > 0, "Nesterov momentum needs `momentum` > 0")
    for key in ("warmup", "cosine", "linear", "step_every"):
        need(v[key] >= 0 and v[key] == int(v[key]) and v[key] < 2**53, f"`{key}` is a whole number of steps, "
             f"got {v[key]}")
    decays = [k for k in ("cosine", "linear", "step_every") if v[k]]
    need(len(decays) <= 1, f"one decay at a time, got {' and '.join(decays)}")
    for key in ("cosine", "linear"):
        need(not v[key] or v[key] > v["warmup"], f"`{key} = {v[key]:g}` is the step the decay ends; it must come "
             f"after the warmup ({v['warmup']:g} steps)")
    need(v["gamma"] > 0, f"`gamma` must be positive, got {v['gamma']}")
    need(0 <= v["min_lr"] <= v["lr"], f"`min_lr` must be in [0, lr], got {v['min_lr']}")
    need(v["clip"] >= 0 and math.isfinite(v["clip"]), f"`clip` (a global gradient norm) must not be negative, "
         f"got {v['clip']}")


# ---- model arguments ---------------------------------------------------------


def model_arguments(model: ast.ModelDef, overrides: Mapping[str, Override]) -> dict[str, int | float | bool]:
    """The model's arguments: each default, replaced by its ``-D`` override."""
    declared = {p.name: p for p in model.params}
    for key in overrides:
        if key not in declared:
            raise SwpError(f"-D {key}: model `{model.name}` has no argument `{key}`", model.span,
                           hints=did_you_mean(key, list(declared)) or [f"arguments: {', '.join(declared) or '(none)'}"])
    values: dict[str, int | float | bool] = {}
    for p in model.params:
        default = None if p.default is None else _static_default(p)
        kind = p.type or (_kind_of(default) if default is not None else None)
        if kind not in (None, "int", "float", "bool"):
            raise SwpError(f"model argument `{p.name}` has unknown type `{kind}`", p.span,
                           hints=["model arguments are int, float or bool"])
        given = overrides.get(p.name)
        if isinstance(given, str):
            values[p.name] = _parse_override(p, kind or _guess_kind(given), given)
        elif given is not None:
            values[p.name] = _typed_override(p, kind or _kind_of(given), given)
        elif default is None:
            raise SwpError(f"model argument `{p.name}` has no default", p.span,
                           hints=[f"give it one, or pass -D {p.name}=VALUE"])
        else:
            if p.type and _kind_of(default) != p.type and not (p.type == "float" and _kind_of(default) == "int"):
                raise SwpError(f"default of `{p.name}` is {describe(default)}, not {p.type}", p.span)
            values[p.name] = float(default) if kind == "float" else default
    return values


def _static_default(p: ast.ParamDecl) -> int | float | bool:
    assert p.default is not None
    e = p.default
    if isinstance(e, ast.UnaryOp) and e.op == "-" and isinstance(e.operand, ast.Const):
        e = ast.Const(-e.operand.value, e.span)  # type: ignore[operator]
    if not isinstance(e, ast.Const) or isinstance(e.value, str):
        raise SwpError(f"default of model argument `{p.name}` must be a number or a bool", e.span)
    return e.value


def _kind_of(v: Value) -> str:
    return "bool" if isinstance(v, bool) else "int" if isinstance(v, int) else "float"


_INT_TEXT = re.compile(r"[+-]?[0-9]+")  # (as the language writes numbers: not Python's `1_0` or other digits)
_FLOAT_TEXT = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")


def _guess_kind(text: str) -> str:
    if text in ("true", "false"):
        return "bool"
    return "int" if _INT_TEXT.fullmatch(text) else "float"


def _typed_override(p: ast.ParamDecl, kind: str, value: int | float | bool) -> int | float | bool:
    ok = {"bool": isinstance(value, bool),
          "int": isinstance(value, int) and not isinstance(value, bool) and -MAX_INT < value < MAX_INT,
          "float": isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)}
    if not ok[kind]:
        expected = {"int": "an integer below 2**63", "float": "a finite number", "bool": "True or False"}[kind]
        raise SwpError(f"model argument `{p.name}` = {value!r}: expected {expected}", p.span,
                       hints=[f"`{p.name}` is declared here as {kind}"])
    return float(value) if kind == "float" else value


def _parse_override(p: ast.ParamDecl, kind: str, text: str) -> int | float | bool:
    expected = {"int": "an integer", "float": "a number", "bool": "`true` or `false`"}[kind]
    try:
        if kind == "bool":
            if text not in ("true", "false"):
                raise ValueError
            return text == "true"
        if kind == "int":
            if not _INT_TEXT.fullmatch(text):
                raise ValueError
            if len(text) > 20 or not -MAX_INT < int(text) < MAX_INT:
                expected = "an integer below 2**63"
                raise ValueError
            return int(text)
        value = float(text)
        if not math.isfinite(value):
            expected = "a finite number"
            raise ValueError
        if not _FLOAT_TEXT.fullmatch(text):
            raise ValueError
        return value
    except ValueError:
        raise SwpError(f"-D {p.name}={text}: expected {expected}", p.span,
                       hints=[f"`{p.name}` is declared here as {kind}"]) from None


# ---- the elaborator ----------------------------------------------------------


class _Elaborator:
    def __init__(self, program: Program) -> None:
        self.program = program
        self.tensors: dict[str, Tensor] = {}
        self.ops: list[Op] = []
        self.inputs: list[str] = []
        self.params: list[str] = []
        self.frozen: list[str] = []
        self.scope: list[str] = []
        self.scope_names: list[dict[str, int]] = [{}]
        self.calls: list[Span] = []  # the calls of user functions being elaborated, outermost first
        self.callees: list[tuple[str, str]] = []  # and the (module, function) each call entered
        self.made_by: dict[str, Span] = {}  # each tensor's outermost call (its own line outside any)
        self.steps = 0
        self.at: Span | None = None  # the statement being elaborated
        self.loss: tuple[TensorVal, Optimizer] | None = None
        self.reports: dict[str, TensorVal] = {}
        self.outputs: dict[str, TensorVal] = {}
        self.visible = {path: self._visible_functions(path) for path in program.modules}

    def run(self, overrides: Mapping[str, Override]) -> Graph:
        model = model_of(self.program)
        args = model_arguments(model, overrides)
        frame = _Frame(dict(args), self.program.entry, in_model=True)
        self.block(model.body, frame)
        if self.loss is None and not self.outputs:
            raise SwpError(f"model `{model.name}` has no loss and no output", model.span,
                           hints=["add `minimize LOSS with sgd(lr = 0.1)` to train it, or `output NAME = EXPR` "
                                  "for a model that only predicts"])
        loss, opt = self.loss if self.loss is not None else (None, FORWARD_ONLY)
        return Graph(model.name, tuple(args.items()), self.tensors, tuple(self.ops), tuple(self.inputs),
                     tuple(self.params), loss.name if loss else "", opt, self.program.sha256,
                     reports=tuple((k, v.name) for k, v in self.reports.items()),
                     outputs=tuple((k, v.name) for k, v in self.outputs.items()), frozen=tuple(self.frozen))

    # -- functions visible from a module

    def _visible_functions(self, path: str) -> dict[str, list[tuple[str, ast.FuncDef]]]:
        seen: dict[str, list[tuple[str, ast.FuncDef]]] = {}
        for f in self.program.modules[path].funcs:
            if f.name in BUILTINS:
                raise SwpError(f"`def {f.name}` would hide the built-in `{f.name}`", f.span,
                               hints=["choose another name"])
            if f.name in seen:
                raise SwpError(f"`{f.name}` is defined twice in this file", f.span)
            seen[f.name] = [(path, f)]
        local = set(seen)
        for dep in self.program.imports.get(path, ()):
            for f in self.program.modules[dep].funcs:
                if f.name not in local:
                    seen.setdefault(f.name, []).append((dep, f))
        return seen

    # -- statements

    def block(self, body: tuple[ast.Stmt, ...], frame: _Frame) -> None:
        for stmt in body:
            self.step(stmt.span)
            self.at = stmt.span
            getattr(self, "stmt_" + type(stmt).__name__)(stmt, frame)

    def step(self, span: Span) -> None:
        self.steps += 1
        if self.steps > MAX_STEPS:
            raise SwpError(f"building the model runs more than {MAX_STEPS:,} statements and loop iterations", span,
                           hints=["is a loop bound or a model argument far larger than meant?"])

    def stmt_InputStmt(self, s: ast.InputStmt, frame: _Frame) -> None:
        if not frame.in_model:
            raise SwpError("`input` is only allowed in a model, not in a function", s.span)
        if s.type.dtype is None:
            raise SwpError(f"input `{s.name}` needs a dtype", s.type.span,
                           hints=[f"write e.g. `input {s.name}: f32[...]`"])
        t = self.new_tensor(s.name, self.tensor_type(s.type, frame), Kind.input, s.span)
        self.inputs.append(t.name)
        frame.env[s.name] = t

    def stmt_ParamStmt(self, s: ast.ParamStmt, frame: _Frame) -> None:
        typ = self.tensor_type(s.type, frame)
        init = self.initializer(s.init, frame)
        t = self.new_tensor(".".join(self.scope + [s.name]), typ, Kind.param, s.span, init)
        self.params.append(t.name)
        if s.frozen:
            self.frozen.append(t.name)
        frame.env[s.name] = t

    def stmt_AssignStmt(self, s: ast.AssignStmt, frame: _Frame) -> None:
        value = self.expr(s.value, frame)
        if len(s.targets) == 1:
            frame.env[s.targets[0]] = value
            return
        if not isinstance(value, tuple) or len(value) != len(s.targets):
            n = len(value) if isinstance(value, tuple) else 1
            raise SwpError(f"cannot unpack {n} value{'s' * (n != 1)} into {len(s.targets)} names", s.span,
                           hints=[f"the right-hand side is {describe(value)}"])
        for name, v in zip(s.targets, value):
            frame.env[name] = v

    def stmt_ReturnStmt(self, s: ast.ReturnStmt, frame: _Frame) -> None:
        if frame.in_model:
            raise SwpError("`return` is only allowed in a function", s.span)
        values = tuple(self.expr(e, frame) for e in s.values)
        raise _Return(values[0] if len(values) == 1 else values)

    def stmt_ForStmt(self, s: ast.ForStmt, frame: _Frame) -> None:
        it = self.expr(s.iter, frame)
        if not isinstance(it, (range, tuple)):
            raise SwpError(f"a loop needs a static range or list, got {describe(it)}", s.iter.span,
                           hints=["loop bounds are fixed when the model is built: use range(N) with integer N"])
        for i, v in enumerate(it):
            self.step(s.span)
            frame.env[s.var] = v
            with self.scoped(f"{s.var}{i}"):
                self.block(s.body, frame)

    def stmt_IfStmt(self, s: ast.IfStmt, frame: _Frame) -> None:
        for cond, body in s.branches:
            c = self.expr(cond, frame)
            if not isinstance(c, bool):
                raise SwpError(f"a condition must be a static bool, got {describe(c)}", cond.span)
            if c:
                self.block(body, frame)
                return
        self.block(s.orelse, frame)

    def stmt_AssertStmt(self, s: ast.AssertStmt, frame: _Frame) -> None:
        ok = self.expr(s.test, frame)
        if not isinstance(ok, bool):
            raise SwpError(f"an assertion must be a static bool, got {describe(ok)}", s.test.span)
        if not ok:
            message = self.expr(s.message, frame) if s.message is not None else "assertion failed"
            raise SwpError(str(message) if isinstance(message, str) else describe(message), s.span)

    def stmt_MinimizeStmt(self, s: ast.MinimizeStmt, frame: _Frame) -> None:
        if not frame.in_model:
            raise SwpError("`minimize` is only allowed in a model", s.span)
        if self.loss is not None:
            raise SwpError("a model has one `minimize` statement; this is the second", s.span)
        loss = self.expr(s.loss, frame)
        if not isinstance(loss, TensorVal) or loss.type.shape != () or not loss.type.dtype.is_float:
            scalar = isinstance(loss, TensorVal) and loss.type.shape == ()
            raise SwpError(f"the loss must be a floating-point scalar, got {describe(loss)}", s.loss.span,
                           hints=["cast it: cast(..., f32)"] if scalar else ["reduce it with mean(...) or sum(...)"])
        if s.optimizer not in OPTIMIZERS:
            raise SwpError(f"unknown optimizer `{s.optimizer}`", s.optimizer_span,
                           hints=did_you_mean(s.optimizer, list(OPTIMIZERS)) or [f"optimizers: {', '.join(OPTIMIZERS)}"])
        bound = bind(f"optimizer `{s.optimizer}`", OPTIMIZERS[s.optimizer], self.args(s.args, frame), s.span)
        values = {k: float(b.value) if k == "nesterov" and isinstance(b.value, bool)  # (`nesterov = true`)
                  else self.number(b.value, f"`{k}`", b.span) for k, b in bound.items()}
        check_hparams(s.optimizer, values, s.span)
        default = dict(OPTIMIZERS[s.optimizer])
        hparams = tuple((k, v) for k, v in values.items() if k not in _OMITTED_AT_DEFAULT or v != default[k])
        self.loss = (loss, Optimizer(s.optimizer, hparams))

    def stmt_ReportStmt(self, s: ast.ReportStmt, frame: _Frame) -> None:
        if not frame.in_model:
            raise SwpError("`report` is only allowed in a model", s.span)
        if s.name in self.reports:
            raise SwpError(f"`{s.name}` is reported twice", s.span, hints=["give each report its own name"])
        if s.name in TRAINER_REPORTS:
            raise SwpError(f"`{s.name}` is reported by training itself: {TRAINER_REPORTS[s.name]}", s.span,
                           hints=["give the report another name"])
        value = self.expr(s.value, frame)
        if not isinstance(value, TensorVal) or value.type.shape != ():
            raise SwpError(f"a report must be a scalar tensor, got {describe(value)}", s.value.span,
                           hints=["reduce it with mean(...) or sum(...)"])
        self.reports[s.name] = value
        frame.env[s.name] = value

    def stmt_OutputStmt(self, s: ast.OutputStmt, frame: _Frame) -> None:
        if not frame.in_model:
            raise SwpError("`output` is only allowed in a model", s.span)
        if s.name in self.outputs or s.name in self.reports:
            raise SwpError(f"`{s.name}` is an output or report already", s.span, hints=["give each its own name"])
        value = self.expr(s.value, frame)
        if not isinstance(value, TensorVal) or value.type.rank == 0:
            raise SwpError(f"an output has a row per example (its first axis), got {describe(value)}", s.value.span,
                           hints=["`predict` writes each output's rows for every example; a scalar is a `report`"])
        batch = frame.env.get("batch")
        if isinstance(batch, int) and not isinstance(batch, bool) and value.type.shape[0] != batch:
            raise SwpError(f"an output has a row per example: its first axis is {value.type.shape[0]}, the batch "
                           f"{batch}", s.value.span, hints=["`predict` concatenates each output's rows over batches"])
        self.outputs[s.name] = value
        frame.env[s.name] = value

    # -- types and initialisers

    def tensor_type(self, t: ast.TensorTypeExpr, frame: _Frame) -> TensorType:
        dtype = DType.f32
        if t.dtype is not None:
            if t.dtype not in _DTYPES:
                raise SwpError(f"unknown dtype `{t.dtype}`", t.dtype_span,
                               hints=did_you_mean(t.dtype, list(_DTYPES)) or [f"dtypes: {', '.join(_DTYPES)}"])
            dtype = _DTYPES[t.dtype]
        typ = TensorType(tuple(self.dimension(d, frame) for d in t.dims), dtype)
        try:
            check_size(typ)
        except SwpError as exc:
            raise exc.with_span(t.span) from None
        return typ

    def dimension(self, e: ast.Expr, frame: _Frame) -> int:
        v = self.expr(e, frame)
        if isinstance(v, bool) or not isinstance(v, int):
            division = isinstance(v, float) and isinstance(e, ast.BinOp) and e.op == "/"
            raise SwpError(f"a dimension must be an integer, got {describe(v)}", e.span,
                           hints=["use // for integer division"] if division else
                           ["write it as an integer, or int(...) it"] if isinstance(v, float) else [])
        if v < 1:
            raise SwpError(f"a dimension must be positive, got {v}", e.span)
        return v

    def initializer(self, e: ast.Expr, frame: _Frame) -> Init:
        if isinstance(e, ast.Name):
            name, args, span = e.id, [], e.span
        elif isinstance(e, ast.Call) and isinstance(e.func, ast.Name):
            name, args, span = e.func.id, self.args(e.args, frame), e.func.span
        else:
            raise SwpError("a parameter's initialiser must be a name such as `zeros` or a call such as `normal(0.02)`",
                           e.span)
        if name not in INITIALIZERS:
            raise SwpError(f"unknown initialiser `{name}`", span,
                           hints=did_you_mean(name, list(INITIALIZERS)) or [f"initialisers: {', '.join(INITIALIZERS)}"])
        bound = bind(f"initialiser `{name}`", INITIALIZERS[name], args, e.span)
        values = tuple((k, self.number(b.value, f"`{k}`", b.span)) for k, b in bound.items())
        for k, v in values:
            if not math.isfinite(v):
                raise SwpError(f"`{k}` of initialiser `{name}` must be finite, got {v}", bound[k].span)
        given = dict(values)
        if name == "normal" and given["std"] < 0:
            raise SwpError(f"`std` of initialiser `normal` must be at least 0, got {given['std']:g}", bound["std"].span)
        if name == "uniform" and given["low"] > given["high"]:
            raise SwpError(f"initialiser `uniform` needs low <= high, got low {given['low']:g} and high "
                           f"{given['high']:g}", e.span)
        return Init(_INIT_ALIASES.get(name, name), values)

    def number(self, v: Value, what: str, span: Span) -> float:
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise SwpError(f"{what} must be a number, got {describe(v)}", span)
        return float(v)

    # -- graph building

    def new_tensor(self, name: str, typ: TensorType, kind: Kind, span: Span, init: Init | None = None) -> TensorVal:
        mine = self.calls[0] if self.calls else span
        if name in self.tensors:
            prev, theirs = self.tensors[name].span, self.made_by.get(name)
            if self.calls and theirs is not None and theirs != prev:  # (both inside calls: name the calls)
                raise SwpError(f"`{name}` is declared twice: by this call and by the one at {theirs}", mine,
                               hints=["give one of the calls its own scope: `... as NAME`"])
            raise SwpError(f"`{name}` is declared twice", span, notes=[f"first declared at {prev}"] if prev else [])
        self.tensors[name] = Tensor(name, typ, kind, init, span)
        self.made_by[name] = mine
        return TensorVal(name, typ)

    def emit(self, op: str, inputs: list[TensorVal], attrs_: dict[str, Any], span: Span) -> TensorVal:
        if len(self.ops) >= MAX_OPS:
            raise SwpError(f"the model has more than {MAX_OPS:,} ops", span,
                           hints=["is a loop bound or a model argument far larger than meant?"])
        try:
            out = ops.infer(op, tuple(t.type for t in inputs), attrs_)
            check_size(out)
        except SwpError as exc:
            raise exc.with_span(span) from None
        name = f"%{len(self.ops)}"
        self.tensors[name] = Tensor(name, out, Kind.activation, None, span, ".".join(self.scope + [op]))
        self.ops.append(Op(op, tuple(t.name for t in inputs), (name,), tuple(sorted(attrs_.items())), span))
        return TensorVal(name, out)

    def next_seed(self) -> int:
        return len(self.ops)

    def scoped(self, name: str) -> _Scope:
        return _Scope(self, name)

    # -- expressions

    def expr(self, e: ast.Expr, frame: _Frame) -> Value:
        return getattr(self, "expr_" + type(e).__name__)(e, frame)

    def expr_Const(self, e: ast.Const, frame: _Frame) -> Value:
        return static_number(e.value, e.span)

    def expr_Name(self, e: ast.Name, frame: _Frame) -> Value:
        if e.id in frame.env:
            return frame.env[e.id]
        if e.id in _DTYPES:
            return _DTYPES[e.id]
        hint = did_you_mean(e.id, list(frame.env) + list(_DTYPES))
        if e.id in BUILTINS or e.id in self.visible[frame.module]:
            hint = [f"`{e.id}` is a function: call it as `{e.id}(...)`"]
        raise SwpError(f"unknown name `{e.id}`", e.span, hints=hint)

    def expr_TupleExpr(self, e: ast.TupleExpr, frame: _Frame) -> Value:
        return tuple(self.expr(x, frame) for x in e.items)

    expr_ListExpr = expr_TupleExpr

    def expr_Attr(self, e: ast.Attr | ast.Index, frame: _Frame) -> Value:
        """``x[0].shape[1][2:]``: a chain of indices and attributes, walked without recursion."""
        chain: list[ast.Attr | ast.Index] = [e]
        while isinstance(chain[-1].value, (ast.Attr, ast.Index)):
            chain.append(chain[-1].value)  # type: ignore[arg-type]
        v = self.expr(chain[-1].value, frame)
        for link in reversed(chain):
            v = self.index(link, v, frame) if isinstance(link, ast.Index) else self.attr(link, v)
        return v

    expr_Index = expr_Attr

    def attr(self, e: ast.Attr, v: Value) -> Value:
        if isinstance(v, TensorVal):
            attrs_ = {"shape": v.type.shape, "dtype": v.type.dtype, "rank": v.type.rank, "numel": v.type.numel}
            if e.attr in attrs_:
                return attrs_[e.attr]
            raise SwpError(f"a tensor has no attribute `{e.attr}`", e.span,
                           hints=did_you_mean(e.attr, list(attrs_)) or ["tensor attributes: shape, dtype, rank, numel"])
        raise SwpError(f"{describe(v)} has no attribute `{e.attr}`", e.span)

    def index(self, e: ast.Index, v: Value, frame: _Frame) -> Value:
        if isinstance(v, (tuple, range)):
            if len(e.items) != 1 or isinstance(e.items[0], ast.Slice):
                return self.index_tuple_slice(v, e, frame)
            i = self.expr(e.items[0], frame)
            if isinstance(i, bool) or not isinstance(i, int):
                raise SwpError(f"an index must be an integer, got {describe(i)}", e.items[0].span)
            if not -len(v) <= i < len(v):
                raise SwpError(f"index {i} is out of range for a {type(v).__name__} of length {len(v)}",
                               e.items[0].span)
            return v[i]
        if isinstance(v, TensorVal):
            return self.index_tensor(v, e, frame)
        raise SwpError(f"cannot index {describe(v)}", e.span)

    def index_tuple_slice(self, v: tuple | range, e: ast.Index, frame: _Frame) -> Value:
        item = e.items[0]
        if len(e.items) != 1 or not isinstance(item, ast.Slice):
            raise SwpError("a tuple takes one index or slice", e.span)
        start, stop, step = self.slice_bounds(item, frame)
        return v[start:stop:step]

    def slice_bounds(self, s: ast.Slice, frame: _Frame) -> tuple[int | None, int | None, int | None]:
        start, stop, step = (self.opt_int(x, frame) for x in (s.start, s.stop, s.step))
        if step == 0:
            raise SwpError("a slice step must not be zero", s.span)
        return start, stop, step

    def opt_int(self, e: ast.Expr | None, frame: _Frame) -> int | None:
        if e is None:
            return None
        v = self.expr(e, frame)
        if isinstance(v, bool) or not isinstance(v, int):
            raise SwpError(f"a slice bound must be an integer, got {describe(v)}", e.span)
        return v

    def index_tensor(self, x: TensorVal, e: ast.Index, frame: _Frame) -> Value:
        if len(e.items) > x.type.rank:
            raise SwpError(f"too many indices ({len(e.items)}) for {x.type}", e.span)
        dropped = []
        for axis, item in enumerate(e.items):
            size = x.type.shape[axis]
            if isinstance(item, ast.Slice):
                start, stop, step = self.slice_bounds(item, frame)
                if (start, stop, step) in ((None, None, None), (0, None, None)):
                    continue
                x = slice_axis(self, x, axis, start or 0, size if stop is None else stop, step or 1, item.span)
            else:
                i = self.opt_int(item, frame)
                assert i is not None
                if not -size <= i < size:
                    raise SwpError(f"index {i} is out of range for dimension {axis} of size {size}", item.span)
                x = slice_axis(self, x, axis, i % size, i % size + 1, 1, item.span)
                dropped.append(axis)
        if dropped:
            shape = tuple(d for a, d in enumerate(x.type.shape) if a not in dropped)
            x = self.emit("reshape", [x], {"shape": shape}, e.span)
        return x

    def expr_UnaryOp(self, e: ast.UnaryOp, frame: _Frame) -> Value:
        v = self.expr(e.operand, frame)
        if e.op == "not":
            if not isinstance(v, bool):
                raise SwpError(f"`not` needs a bool, got {describe(v)}", e.span)
            return not v
        if isinstance(v, TensorVal):
            return self.emit("neg", [v], {}, e.span)
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise SwpError(f"cannot negate {describe(v)}", e.span)
        return static_number(-v, e.span)

    def expr_BinOp(self, e: ast.BinOp, frame: _Frame) -> Value:
        """A chain ``a + b - c ...`` is a tree as deep as it is long: walk its left spine without recursion."""
        chain = [e]
        while isinstance(chain[-1].left, ast.BinOp):
            chain.append(chain[-1].left)
        value = self.expr(chain[-1].left, frame)
        for link in reversed(chain):
            value = self.binop(link, value, frame)
        return value

    def binop(self, e: ast.BinOp, left: Value, frame: _Frame) -> Value:
        if e.op in ("and", "or"):
            if not isinstance(left, bool):
                raise SwpError(f"`{e.op}` needs bools, got {describe(left)}", e.left.span)
            if (e.op == "and" and not left) or (e.op == "or" and left):
                return left
            right = self.expr(e.right, frame)
            if not isinstance(right, bool):
                raise SwpError(f"`{e.op}` needs bools, got {describe(right)}", e.right.span)
            return right
        right = self.expr(e.right, frame)
        if isinstance(left, TensorVal) or isinstance(right, TensorVal):
            return self.tensor_binop(e, left, right)
        return _static_binop(e, left, right)

    def tensor_binop(self, e: ast.BinOp, left: Value, right: Value) -> Value:
        if isinstance(left, TensorVal) and isinstance(right, TensorVal):
            if e.op in _TENSOR_BINOPS:
                return self.emit(_TENSOR_BINOPS[e.op], [left, right], {}, e.span)
            raise SwpError(f"operator `{e.op}` is not defined on tensors", e.span,
                           hints=["tensor operators: + - * / @ == != < <= > >="])
        tensor, scalar = (left, right) if isinstance(left, TensorVal) else (right, left)
        assert isinstance(tensor, TensorVal)
        if isinstance(scalar, bool) or not isinstance(scalar, (int, float)) or e.op not in _SCALAR_OPS:
            raise SwpError(f"cannot apply `{e.op}` to {describe(left)} and {describe(right)}", e.span)
        if isinstance(scalar, float) and not tensor.type.dtype.is_float:
            raise SwpError(f"cannot combine {describe(tensor)} with a float", e.span,
                           hints=["cast the tensor to a float dtype first"])
        c, dtype = float(scalar), tensor.type.dtype
        computed = DType.f32 if dtype in (DType.f16, DType.bf16) else dtype  # (half kernels compute in f32)
        if e.op == "/" and tensor is left and c:  # (a division is a product by the reciprocal)
            representable(_reciprocal(c), computed, e.span, f"dividing by {c:g} multiplies by ")
        elif e.op != "**":
            representable(scalar if isinstance(scalar, int) else c, computed, e.span)
        return _SCALAR_OPS[e.op](self, tensor, c, tensor is left, e.span)

    def expr_Call(self, e: ast.Call, frame: _Frame) -> Value:
        name, span, funcs = self.callee(e, frame)
        args = self.args(e.args, frame)
        if funcs is None:
            if e.scope is not None:
                raise SwpError(f"`as {e.scope}` names the parameters of a user function; `{name}` is built in",
                               e.span)
            return self.call_static_or_builtin(name, args, e, span)
        if len(funcs) > 1:
            where = " and ".join(m for m, _ in funcs)
            raise SwpError(f"`{name}` is ambiguous: it is defined in {where}", span,
                           hints=[f"qualify it, e.g. `{Path(funcs[0][0]).stem}.{name}(...)`"])
        module, fdef = funcs[0]
        return self.call_user(module, fdef, args, e)

    def callee(self, e: ast.Call, frame: _Frame) -> tuple[str, Span, list[tuple[str, ast.FuncDef]] | None]:
        f = e.func
        visible = self.visible[frame.module]
        if isinstance(f, ast.Name):
            if f.id in visible:
                return f.id, f.span, visible[f.id]
            if f.id in BUILTINS or f.id in _STATIC_FUNCS:
                return f.id, f.span, None
            candidates = list(visible) + list(BUILTINS) + list(_STATIC_FUNCS)
            raise SwpError(f"unknown function `{f.id}`", f.span, hints=did_you_mean(f.id, candidates))
        if isinstance(f, ast.Attr) and isinstance(f.value, ast.Name):
            deps = {Path(p).stem: p for p in self.program.imports.get(frame.module, ())}
            if f.value.id in deps:
                module = self.program.modules[deps[f.value.id]]
                for fdef in module.funcs:
                    if fdef.name == f.attr:
                        return f.attr, f.span, [(deps[f.value.id], fdef)]
                raise SwpError(f"`{f.value.id}` has no function `{f.attr}`", f.span,
                               hints=did_you_mean(f.attr, [d.name for d in module.funcs]))
        raise SwpError("only named functions can be called", f.span)

    def args(self, args: tuple[ast.Arg, ...], frame: _Frame) -> list[tuple[str | None, Value, Span]]:
        return [(a.name, self.expr(a.value, frame), a.span) for a in args]

    def call_static_or_builtin(self, name: str, args: list, e: ast.Call, span: Span) -> Value:
        try:
            if name in _STATIC_FUNCS:
                return static_number(_STATIC_FUNCS[name](args, e.span), e.span)
            return static_number(call_builtin(self, BUILTINS[name], args, e.span), e.span)
        except SwpError as exc:
            raise exc.with_span(e.span) from None
        except (OverflowError, ZeroDivisionError, ValueError) as exc:  # math on static numbers
            raise SwpError(f"`{name}` of these numbers is out of range ({exc})", e.span) from None

    def call_user(self, module: str, fdef: ast.FuncDef, args: list, e: ast.Call) -> Value:
        if (module, fdef.name) in self.callees:  # (the language has no recursion: no call may re-enter)
            cycle = [name for _, name in self.callees[self.callees.index((module, fdef.name)):]] + [fdef.name]
            raise SwpError(f"`{fdef.name}` is called again while it runs ({' -> '.join(cycle)}): recursion is refused",
                           e.span, hints=["write the repetition as a `for` loop over a range"])
        if len(self.calls) >= MAX_CALL_DEPTH:
            raise SwpError(f"calls nest deeper than {MAX_CALL_DEPTH}", e.span)
        params = [(p.name, p.default if p.default is not None else REQUIRED) for p in fdef.params]
        bound = bind(f"`{fdef.name}`", params, args, e.span)
        env: dict[str, Value] = {}
        callee_frame = _Frame(env, module, in_model=False)
        for p in fdef.params:
            b = bound[p.name]
            env[p.name] = self.expr(b.value, callee_frame) if isinstance(b.value, _EXPR_TYPES) else b.value
        self.calls.append(e.span)
        self.callees.append((module, fdef.name))
        try:
            with self.scoped(self.scope_name(e.scope or fdef.name, explicit=e.scope is not None, span=e.span)):
                self.block(fdef.body, callee_frame)
        except _Return as r:
            return r.value
        except SwpError as exc:
            if exc.span != e.span:  # (an error at the call itself says where it is)
                exc.notes = exc.notes + (f"in `{fdef.name}`, called from {e.span}",)
            raise
        finally:
            self.calls.pop()
            self.callees.pop()
        raise SwpError(f"function `{fdef.name}` ended without `return`", fdef.span,
                       notes=[f"called from {e.span}"])

    def scope_name(self, base: str, explicit: bool, span: Span) -> str:
        used = self.scope_names[-1]
        if base not in used:
            used[base] = 1
            return base
        if explicit:
            raise SwpError(f"scope `{base}` is used twice here; parameter names would clash", span)
        n = used[base]
        used[base] = n + 1
        return f"{base}_{n}"


@attrs.define
class _Scope:
    el: _Elaborator
    name: str

    def __enter__(self) -> None:
        self.el.scope.append(self.name)
        self.el.scope_names.append({})

    def __exit__(self, *exc: object) -> None:
        self.el.scope.pop()
        self.el.scope_names.pop()


_EXPR_TYPES = (ast.Name, ast.Const, ast.BinOp, ast.UnaryOp, ast.Attr, ast.Index, ast.Call, ast.TupleExpr,
               ast.ListExpr)

_TENSOR_BINOPS = {"+": "add", "-": "sub", "*": "mul", "/": "div", "@": "matmul", **ops.elementwise.COMPARISONS}


def _reciprocal(c: float) -> float:
    try:
        return 1.0 / c
    except OverflowError:
        return math.inf


def _scalar_add(el: _Elaborator, t: TensorVal, c: float, tensor_left: bool, span: Span) -> TensorVal:
    return el.emit("add_scalar", [t], {"value": c}, span)


def _scalar_sub(el: _Elaborator, t: TensorVal, c: float, tensor_left: bool, span: Span) -> TensorVal:
    if tensor_left:
        return el.emit("add_scalar", [t], {"value": -c}, span)
    return el.emit("add_scalar", [el.emit("neg", [t], {}, span)], {"value": c}, span)


def _scalar_mul(el: _Elaborator, t: TensorVal, c: float, tensor_left: bool, span: Span) -> TensorVal:
    return el.emit("mul_scalar", [t], {"value": c}, span)


def _scalar_div(el: _Elaborator, t: TensorVal, c: float, tensor_left: bool, span: Span) -> TensorVal:
    if tensor_left:
        if c == 0:
            raise SwpError("division by zero", span)
        return el.emit("mul_scalar", [t], {"value": 1.0 / c}, span)
    return el.emit("mul_scalar", [el.emit("pow_scalar", [t], {"exponent": -1.0}, span)], {"value": c}, span)


def _scalar_pow(el: _Elaborator, t: TensorVal, c: float, tensor_left: bool, span: Span) -> TensorVal:
    if not tensor_left:
        raise SwpError("a number raised to a tensor power is not supported", span, hints=["use exp(x * log(c))"])
    return el.emit("pow_scalar", [t], {"exponent": c}, span)


_SCALAR_OPS: dict[str, Callable[[_Elaborator, TensorVal, float, bool, Span], TensorVal]] = {
    "+": _scalar_add, "-": _scalar_sub, "*": _scalar_mul, "/": _scalar_div, "**": _scalar_pow,
}

_ARITH: dict[str, Callable[[Any, Any], Any]] = {
    "+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv,
    "//": operator.floordiv, "%": operator.mod, "**": operator.pow,
    "==": operator.eq, "!=": operator.ne, "<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge,
}


def _static_binop(e: ast.BinOp, left: Value, right: Value) -> Value:
    numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (left, right))
    if e.op in ("==", "!="):
        return _ARITH[e.op](left, right)
    if e.op == "in":
        if not isinstance(right, tuple):
            raise SwpError(f"`in` needs a tuple or list on the right, got {describe(right)}", e.right.span)
        return left in right
    if e.op == "+" and isinstance(left, tuple) and isinstance(right, tuple):
        return left + right
    if not numbers or e.op not in _ARITH:
        raise SwpError(f"cannot apply `{e.op}` to {describe(left)} and {describe(right)}", e.span)
    if e.op in ("/", "//", "%") and right == 0:
        raise SwpError("division by zero", e.span)
    if e.op == "**":
        return _static_pow(left, right, e.span)
    try:
        return static_number(_ARITH[e.op](left, right), e.span)
    except OverflowError:
        raise SwpError(f"`{e.op}` overflows", e.span) from None


def _static_pow(base: int | float, exp: int | float, span: Span) -> Value:
    if base == 0 and exp < 0:
        raise SwpError("zero to a negative power", span)
    if isinstance(base, int) and isinstance(exp, int) and exp > 0 and abs(base) > 1 \
            and (abs(base).bit_length() - 1) * exp >= 64:  # known too big before computing it
        raise SwpError(f"`{base} ** {exp}` is too large for a static integer (limit 2**63)", span)
    try:
        return static_number(base ** exp, span)
    except (OverflowError, ZeroDivisionError):
        raise SwpError(f"`{base} ** {exp}` is out of range", span) from None


def static_number(v: Value, span: Span) -> Value:
    """A static number the elaborator may keep: integers within 2**63, finite floats, nothing complex."""
    if isinstance(v, bool) or not isinstance(v, (int, float, complex)):
        return v
    if isinstance(v, complex):
        raise SwpError("the result is not a real number", span)
    if isinstance(v, int) and not -MAX_INT < v < MAX_INT:
        raise SwpError("a static integer past 2**63", span, hints=["static integers are 64-bit"])
    if isinstance(v, float) and not math.isfinite(v):
        raise SwpError(f"the number is {v}, not a finite value", span)
    return v


def check_size(t: TensorType) -> None:
    """No tensor larger than the largest plan swapdsl makes."""
    if t.nbytes > MAX_BYTES:
        raise SwpError(f"a tensor of {t.numel:,} elements ({t.nbytes:,} bytes) is larger than the limit of "
                       f"{MAX_BYTES:,} bytes (1 PiB)", hints=["is a dimension or a model argument far larger than meant?"])


# ---- static helper functions (evaluate to numbers or ranges, emit nothing) ---


def _range(args: list, span: Span) -> Value:
    if any(k is not None for k, _, _ in args) or not 1 <= len(args) <= 3:
        raise SwpError("range takes 1 to 3 positional integers: range(stop), range(start, stop[, step])", span)
    for _, v, s in args:
        if isinstance(v, bool) or not isinstance(v, int):
            raise SwpError(f"a loop bound must be a static integer, got {describe(v)}", s,
                           hints=["loop bounds are fixed when the model is built"])
    if len(args) == 3 and args[2][1] == 0:
        raise SwpError("range step must not be zero", args[2][2])
    r = range(*(v for _, v, _ in args))
    if len(r) > MAX_STEPS:
        raise SwpError(f"range of {len(r):,} values: more than the {MAX_STEPS:,} loop iterations a model may run", span)
    return r


def _numbers(name: str) -> Callable[[list, Span], Value]:
    fn = {"min": min, "max": max}[name]

    def call(args: list, span: Span) -> Value:
        vals = [v for _, v, _ in args]
        if len(vals) == 1 and isinstance(vals[0], tuple):
            vals = list(vals[0])
        if not vals or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in vals):
            raise SwpError(f"{name} takes numbers", span)
        return fn(vals)

    return call


def _len(args: list, span: Span) -> Value:
    if len(args) != 1 or not isinstance(args[0][1], (tuple, range)):
        raise SwpError("len takes one tuple or range, e.g. len(x.shape)", span)
    return len(args[0][1])


def _int_of(args: list, span: Span) -> Value:
    if len(args) != 1 or isinstance(args[0][1], bool) or not isinstance(args[0][1], (int, float)):
        raise SwpError("int takes one number", span)
    return int(args[0][1])


def _prod(args: list, span: Span) -> Value:
    if len(args) != 1 or not isinstance(args[0][1], tuple):
        raise SwpError("prod takes one tuple of integers, e.g. prod(x.shape)", span)
    return math.prod(args[0][1])


def _pair(args: list, span: Span) -> Value:
    """pair(3) = (3, 3); pair((1, 7)) = (1, 7): kernel sizes written either way."""
    if len(args) == 1:
        v = args[0][1]
        if isinstance(v, int) and not isinstance(v, bool):
            return (v, v)
        if isinstance(v, tuple) and len(v) == 2:
            return v
    raise SwpError("pair takes one integer or one pair of integers", span)


_STATIC_FUNCS: dict[str, Callable[[list, Span], Value]] = {
    "range": _range, "pair": _pair, "min": _numbers("min"), "max": _numbers("max"), "len": _len, "int": _int_of, "prod": _prod,
}
