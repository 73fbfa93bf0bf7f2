"""Text -> AST: the cached Lark LALR parser, its post-lexer, and syntax errors."""

from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import Any

import attrs
import lark
from lark import Token, Transformer_NonRecursive, v_args
from lark.lexer import PatternStr
from lark.exceptions import UnexpectedCharacters, UnexpectedEOF, UnexpectedInput, UnexpectedToken, VisitError

from swapdsl.common.errors import Span, SwpError
from swapdsl.common.paths import GRAMMAR_DIR
from swapdsl.lang import ast

_OPEN = {"LPAR", "LSQB"}
_CLOSE = {"RPAR", "RSQB"}
_PREFIX = {"MINUS", "PLUS", "NOT"}
MAX_NESTING = 100  # brackets and blocks inside one another, or unary operators in a row (docs/language.md#limits says so)
MAX_TOKENS = 100_000  # in one file: a sum of 50,000 terms (800 dense layers written out are 44,868)


class _Newlines:
    """Makes newlines mean "end of statement" only where a statement can end."""

    always_accept = ("_NL",)

    def process(self, stream: Iterator[Token]) -> Iterator[Token]:
        return self._newlines(_limits_checked(stream))

    def _newlines(self, stream: Iterator[Token]) -> Iterator[Token]:
        depth = 0
        pending = False  # a newline waiting to see the next token
        prev: Token | None = None  # the last token emitted
        for tok in stream:
            if tok.type == "_NL":
                pending = depth == 0 and prev is not None and prev.type not in ("LBRACE", "_NL")
                continue
            if pending and tok.type not in ("ELSE", "LBRACE", "RBRACE"):
                prev = _end_of(prev)
                yield prev
            pending = False
            if tok.type == "RBRACE" and prev is not None and prev.type not in ("_NL", "LBRACE"):
                yield Token.new_borrow_pos("_NL", "}", tok)  # the `}` ends the block's last statement
            depth = max(depth + (tok.type in _OPEN) - (tok.type in _CLOSE), 0)
            yield tok
            prev = tok
        if prev is not None and prev.type != "_NL":
            yield _end_of(prev)


def _limits_checked(stream: Iterator[Token]) -> Iterator[Token]:
    """The tokens, refused past MAX_NESTING levels of nesting (every stage after this one recurses) or
    past MAX_TOKENS in all."""
    depth = run = powers = 0
    for count, tok in enumerate(stream, 1):
        if count > MAX_TOKENS:
            raise SwpError(f"the file has more than {MAX_TOKENS:,} tokens", Span.point("", tok.line, tok.column),
                           hints=["split the model over files with `import`, or build repeated parts in a loop"])
        depth += (tok.type in _OPEN or tok.type == "LBRACE") - (tok.type in _CLOSE or tok.type == "RBRACE")
        run = run + 1 if tok.type in _PREFIX else 0
        powers = 0 if tok.type == "_NL" else powers + (tok.value == "**")  # `**` nests to the right
        if max(depth, run, powers) > MAX_NESTING:
            what = (f"more than {MAX_NESTING} unary operators in a row" if run > MAX_NESTING
                    else f"more than {MAX_NESTING} `**` in one statement" if powers > MAX_NESTING
                    else f"brackets and blocks nest more than {MAX_NESTING} deep here")
            raise SwpError(what, Span.point("", tok.line, tok.column),
                           hints=["split the expression with intermediate names, or the nesting into functions"])
        yield tok


def _end_of(tok: Token | None) -> Token:
    """A zero-width newline at the end of ``tok``, so statement spans stop at their text."""
    assert tok is not None
    return Token("_NL", "", tok.end_pos, tok.end_line, tok.end_column, tok.end_line, tok.end_column, tok.end_pos)


@functools.cache
def _lark() -> lark.Lark:
    return lark.Lark(
        (GRAMMAR_DIR / "swp.lark").read_text(encoding="utf-8"),
        start="module",
        parser="lalr",
        lexer="basic",  # the post-lexer looks one token ahead, so no parser-state lexing
        postlex=_Newlines(),
        propagate_positions=True,
        maybe_placeholders=True,
        cache=False,
    )


def parse(text: str, file: str) -> ast.Module:
    """Parse one .swp source into a Module; syntax errors become SwpError."""
    if not text.strip():
        raise SwpError(f"`{file}` is empty", hints=["a model file needs at least `model NAME() { ... }`"])
    try:
        if len(text) > MAX_TOKENS:  # could be too long: lexing alone finds out 6x sooner than parsing
            for _ in _lark().lex(text):
                pass
        tree = _lark().parse(text)
    except UnexpectedInput as exc:
        raise _syntax_error(exc, text, file) from None
    except SwpError as exc:  # from the post-lexer, which does not know the file's name
        if exc.span is not None and not exc.span.file:
            exc.span = attrs.evolve(exc.span, file=file)
        raise
    try:
        return _ToAst(file).transform(tree)
    except VisitError as exc:  # a literal refused while the tree became the AST
        if isinstance(exc.orig_exc, SwpError):
            raise exc.orig_exc from None
        raise


# ---- syntax errors -----------------------------------------------------------

_READABLE = {
    "_NL": "end of line",
    "$END": "end of file",
    "NAME": "a name",
    "INT": "an integer",
    "FLOAT": "a number",
    "STRING": "a string",
    "COMP_OP": "a comparison",
}


def _describe(terminal: str) -> str:
    if terminal in _READABLE:
        return _READABLE[terminal]
    try:
        pattern = _lark().get_terminal(terminal).pattern
    except KeyError:
        return terminal.lower()
    return f"`{pattern.value}`" if pattern.type == "str" else terminal.lower()


def _expected(names: set[str]) -> list[str]:
    described = sorted({_describe(n) for n in names if not n.startswith("__ANON")})
    if not described:
        return []
    if len(described) > 12:
        described = described[:12] + ["..."]
    return ["expected one of: " + ", ".join(described)]


def _syntax_error(exc: UnexpectedInput, text: str, file: str) -> SwpError:
    if isinstance(exc, UnexpectedCharacters):
        char = text[exc.pos_in_stream] if exc.pos_in_stream < len(text) else ""
        return SwpError(f"unexpected character `{char}`", Span.point(file, exc.line, exc.column))
    if isinstance(exc, UnexpectedEOF) or (isinstance(exc, UnexpectedToken) and exc.token.type == "$END"):
        lines = text.splitlines() or [""]
        span = Span.point(file, len(lines), len(lines[-1]) + 1)
        return SwpError("unexpected end of file", span, _expected(set(exc.expected)))
    assert isinstance(exc, UnexpectedToken)
    tok = exc.token
    if tok.type == "_NL" and tok.value == "":
        what, span = "end of line", Span.point(file, tok.line, tok.column)
    else:
        what = f"`{tok.value}`"
        span = Span(file, tok.line, tok.column, tok.end_line or tok.line, tok.end_column or tok.column + 1)
    lines = text.split("\n")  # (as the lexer counts lines)
    before = lines[tok.line - 1][:tok.column - 1].split() if tok.line <= len(lines) else []
    word = tok.value if tok.value in keywords() else before[-1] if before and tok.value == "=" else ""
    expected = set(exc.accepts or exc.expected)
    named = word in keywords() and (tok.value == "=" or "NAME" in expected)  # (a word where a name could be)
    reserved = [f"`{word}` is a reserved word: it cannot name a value"] if named else []
    return SwpError(f"unexpected {what}", span, reserved + _expected(expected))


@functools.cache
def keywords() -> frozenset[str]:
    """The language's reserved words: the grammar's literal words."""
    return frozenset(t.pattern.value for t in _lark().terminals
                     if isinstance(t.pattern, PatternStr) and t.pattern.value.isidentifier())


# ---- tree -> AST -------------------------------------------------------------


def _dotted_path(parts: list[str]) -> str:
    return "/".join(parts) + ".swp"


@v_args(meta=True)
class _ToAst(Transformer_NonRecursive):  # without recursion: a sum of 10,000 terms is a tree 10,000 deep
    def __init__(self, file: str) -> None:
        super().__init__()
        self.file = file

    def _span(self, meta: Any) -> Span:
        return Span(self.file, meta.line, meta.column, meta.end_line, meta.end_column)

    def _tok_span(self, tok: Token) -> Span:
        return Span(self.file, tok.line, tok.column, tok.end_line, tok.end_column)

    # top level
    def module(self, meta: Any, items: list[Any]) -> ast.Module:
        span = self._span(meta) if not meta.empty else Span.point(self.file, 1, 1)
        pick = lambda cls: tuple(i for i in items if isinstance(i, cls))  # noqa: E731
        return ast.Module(self.file, pick(ast.Import), pick(ast.FuncDef), pick(ast.ModelDef), span)

    def import_stmt(self, meta: Any, c: list[Any]) -> ast.Import:
        target = c[0]
        path = target[1:-1] if isinstance(target, Token) else target
        return ast.Import(path, self._span(meta))

    def dotted_name(self, meta: Any, c: list[Token]) -> str:
        return _dotted_path([str(t) for t in c])

    def def_stmt(self, meta: Any, c: list[Any]) -> ast.FuncDef:
        return ast.FuncDef(str(c[0]), tuple(c[1] or ()), c[2], self._span(meta))

    def model_stmt(self, meta: Any, c: list[Any]) -> ast.ModelDef:
        return ast.ModelDef(str(c[0]), tuple(c[1] or ()), c[2], self._span(meta))

    def param_list(self, meta: Any, c: list[ast.ParamDecl]) -> list[ast.ParamDecl]:
        return c

    def param_decl(self, meta: Any, c: list[Any]) -> ast.ParamDecl:
        name, typ, default = c
        return ast.ParamDecl(str(name), str(typ) if typ is not None else None, default, self._span(meta))

    def block(self, meta: Any, c: list[Any]) -> tuple[ast.Stmt, ...]:
        return tuple(c)

    # statements
    def input_stmt(self, meta: Any, c: list[Any]) -> ast.InputStmt:
        return ast.InputStmt(str(c[0]), c[1], self._span(meta))

    def param_stmt(self, meta: Any, c: list[Any]) -> ast.ParamStmt:
        return ast.ParamStmt(str(c[0]), c[1], c[2], self._span(meta), frozen=c[3] is not None)

    def tensor_type(self, meta: Any, c: list[Any]) -> ast.TensorTypeExpr:
        dtype, dims = c[0], tuple(d for d in c[1:] if d is not None)
        dspan = self._tok_span(dtype) if dtype is not None else None
        return ast.TensorTypeExpr(str(dtype) if dtype is not None else None, dspan, dims, self._span(meta))

    def assign_stmt(self, meta: Any, c: list[Any]) -> ast.AssignStmt:
        return ast.AssignStmt(tuple(str(t) for t in c[:-1]), c[-1], self._span(meta))

    def return_stmt(self, meta: Any, c: list[Any]) -> ast.ReturnStmt:
        return ast.ReturnStmt(tuple(c), self._span(meta))

    def for_stmt(self, meta: Any, c: list[Any]) -> ast.ForStmt:
        return ast.ForStmt(str(c[0]), c[1], c[2], self._span(meta))

    def elif_clause(self, meta: Any, c: list[Any]) -> tuple[Any, Any]:
        return (c[0], c[1])

    def if_stmt(self, meta: Any, c: list[Any]) -> ast.IfStmt:
        branches = [(c[0], c[1])] + [b for b in c[2:-1]]
        return ast.IfStmt(tuple(branches), c[-1] or (), self._span(meta))

    def minimize_stmt(self, meta: Any, c: list[Any]) -> ast.MinimizeStmt:
        loss, opt, args = c
        return ast.MinimizeStmt(loss, str(opt), self._tok_span(opt), tuple(args or ()), self._span(meta))

    def report_stmt(self, meta: Any, c: list[Any]) -> ast.ReportStmt:
        return ast.ReportStmt(str(c[0]), c[1], self._span(meta))

    def output_stmt(self, meta: Any, c: list[Any]) -> ast.OutputStmt:
        return ast.OutputStmt(str(c[0]), c[1], self._span(meta))

    def assert_stmt(self, meta: Any, c: list[Any]) -> ast.AssertStmt:
        return ast.AssertStmt(c[0], c[1], self._span(meta))

    # expressions
    def name(self, meta: Any, c: list[Token]) -> ast.Name:
        return ast.Name(str(c[0]), self._span(meta))

    def int(self, meta: Any, c: list[Token]) -> ast.Const:
        if len(c[0]) > 19:  # past 2**63, and Python refuses to read integers of over 4,300 digits
            raise SwpError(f"integer literal of {len(c[0])} digits is too large (static integers are 64-bit)",
                           self._span(meta))
        return ast.Const(int(c[0]), self._span(meta))

    def float(self, meta: Any, c: list[Token]) -> ast.Const:
        return ast.Const(float(c[0]), self._span(meta))

    def true(self, meta: Any, c: list[Any]) -> ast.Const:
        return ast.Const(True, self._span(meta))

    def false(self, meta: Any, c: list[Any]) -> ast.Const:
        return ast.Const(False, self._span(meta))

    def string(self, meta: Any, c: list[Token]) -> ast.Const:
        return ast.Const(str(c[0])[1:-1], self._span(meta))

    def tuple(self, meta: Any, c: list[Any]) -> ast.TupleExpr:
        return ast.TupleExpr(tuple(x for x in c if x is not None), self._span(meta))

    def list(self, meta: Any, c: list[Any]) -> ast.ListExpr:
        return ast.ListExpr(tuple(x for x in c if x is not None), self._span(meta))

    def _bin(op: str):  # type: ignore[misc]
        def rule(self: _ToAst, meta: Any, c: list[Any]) -> ast.BinOp:
            return ast.BinOp(op, c[0], c[-1], self._span(meta))

        return rule

    add, sub, mul, div = _bin("+"), _bin("-"), _bin("*"), _bin("/")
    floordiv, mod, matmul, pow = _bin("//"), _bin("%"), _bin("@"), _bin("**")
    and_op, or_op = _bin("and"), _bin("or")

    def in_op(self, meta: Any, c: list[Any]) -> ast.BinOp:
        return ast.BinOp("in", c[0], c[1], self._span(meta))

    def compare(self, meta: Any, c: list[Any]) -> ast.BinOp:
        return ast.BinOp(str(c[1]), c[0], c[2], self._span(meta))

    def neg(self, meta: Any, c: list[Any]) -> ast.UnaryOp:
        return ast.UnaryOp("-", c[0], self._span(meta))

    def not_op(self, meta: Any, c: list[Any]) -> ast.UnaryOp:
        return ast.UnaryOp("not", c[0], self._span(meta))

    def factor(self, meta: Any, c: list[Any]) -> Any:  # unary plus
        return c[0]

    def attr(self, meta: Any, c: list[Any]) -> ast.Attr:
        return ast.Attr(c[0], str(c[1]), self._span(meta))

    def index(self, meta: Any, c: list[Any]) -> ast.Index:
        return ast.Index(c[0], tuple(c[1:]), self._span(meta))

    def sub_index(self, meta: Any, c: list[Any]) -> Any:
        return c[0]

    def sub_slice(self, meta: Any, c: list[Any]) -> ast.Slice:
        return ast.Slice(c[0], c[1], c[2], self._span(meta))

    def call(self, meta: Any, c: list[Any]) -> ast.Call:
        func, args, scope = c
        return ast.Call(func, tuple(args or ()), str(scope) if scope is not None else None, self._span(meta))

    def arg_list(self, meta: Any, c: list[ast.Arg]) -> list[ast.Arg]:
        return c

    def pos_arg(self, meta: Any, c: list[Any]) -> ast.Arg:
        return ast.Arg(None, c[0], self._span(meta))

    def kw_arg(self, meta: Any, c: list[Any]) -> ast.Arg:
        return ast.Arg(str(c[0]), c[1], self._span(meta))
