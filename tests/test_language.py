"""The .swp language: syntax forms, positions on AST nodes, and their meaning."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import build_graph, write
from swapdsl.common.errors import Span, SwpError
from swapdsl.lang import ast
from swapdsl.lang.parser import parse

HEAD = "model m(batch = 4, flag = true, scale = 0.5) {\n"
TAIL = "    minimize loss with sgd(lr = 0.1)\n}\n"


def graph_of(tmp: Path, body: str, *defines: str, name: str = "m.swp", prefix: str = ""):
    path = write(tmp / name, prefix + HEAD + body + TAIL)
    return build_graph(str(path), list(defines))[1]


def test_every_node_has_a_position() -> None:
    src = "import layers\n\nmodel m(b = 2) {\n    input x: f32[b, 3]\n    y = relu(x) * 2.0\n}\n"
    mod = parse(src, "f.swp")
    assert mod.imports[0].span == Span("f.swp", 1, 1, 1, 14)
    stmt = mod.models[0].body[1]
    assert isinstance(stmt, ast.AssignStmt)
    assert stmt.value.span == Span("f.swp", 5, 9, 5, 22)
    assert isinstance(stmt.value, ast.BinOp) and stmt.value.left.span == Span("f.swp", 5, 9, 5, 16)


def test_newlines_inside_brackets_and_else_on_its_own_line(in_tmp: Path) -> None:
    body = """    input x: f32[batch,
                 8]   # a comment inside brackets
    input y: i32[batch]
    if flag
    {
        param w: [8, 3] = xavier
    }
    else {
        param w: [8, 5] = xavier
    }
    if not flag { param v: [1] = zeros } else if batch > 2 { param v: [2] = zeros } else { param v: [3] = zeros }
    loss = softmax_cross_entropy(
        x @ w,
        y,
    )
"""
    g = graph_of(in_tmp, body)
    assert g.tensors["w"].type.shape == (8, 3)
    assert g.tensors["v"].type.shape == (2,)
    g = graph_of(in_tmp, body, "flag=false")
    assert g.tensors["w"].type.shape == (8, 5)
    assert g.tensors["v"].type.shape == (1,)


def test_dimension_arithmetic_and_shape_reads(in_tmp: Path) -> None:
    body = """    input x: f32[batch * 2, batch + 6]
    input y: i32[batch * 2]
    param w: [x.shape[-1], x.shape[0] // 4 + 1 - 1 + 7 % 4] = normal(0.02)
    h = x @ w
    n = len(h.shape) + h.rank + max(1, 2) + prod(h.shape)
    param z: [n] = zeros
    loss = mean(h) + sum(z)
"""
    g = graph_of(in_tmp, body)
    assert g.tensors["w"].type.shape == (10, 5)
    assert g.tensors["z"].type.shape == (2 + 2 + 2 + 8 * 5,)


def test_functions_tuples_loops_and_scopes(in_tmp: Path) -> None:
    prefix = """def twin(x, out) {
    param w: [x.shape[-1], out] = uniform(-0.1, 0.1)
    a, b = split(x @ w, 2)
    return a, b
}
def chain(x, n, out = 4) {
    for step in range(n) {
        x, unused = twin(x, 2 * out)
    }
    return x
}
"""
    body = """    input x: f32[batch, 6]
    h = chain(x, 3) as body
    h = chain(h, 1)
    h = chain(h, 1)
    loss = mean(h * h)
"""
    g = graph_of(in_tmp, body, prefix=prefix)
    assert list(g.params) == ["body.step0.twin.w", "body.step1.twin.w", "body.step2.twin.w",
                              "chain.step0.twin.w", "chain_1.step0.twin.w"]
    assert g.tensors["body.step0.twin.w"].type.shape == (6, 8)
    assert g.tensors["body.step1.twin.w"].type.shape == (4, 8)
    assert str(g.tensors["body.step0.twin.w"].init) == "uniform(low=-0.1, high=0.1)"
    for clash in (body.replace("as body", "as chain_1"),  # (the second plain call is chain_1 too)
                  body.replace("h = chain(h, 1)\n    h = chain(h, 1)", "h = chain(h, 1)\n    h = chain(h, 1) as "
                               "chain").replace("as body", "")):
        with pytest.raises(SwpError, match=r"`chain_1\.step0\.twin\.w` is declared twice: by this call and by "
                                           r"the one at m\.swp:|`chain` is used twice") as err:
            graph_of(in_tmp, clash, prefix=prefix)
        sp = err.value.span  # (the user's call, not the library's line)
        assert sp is not None and sp.file == "m.swp" and "chain(" in (in_tmp / sp.file).read_text().splitlines()[sp.line - 1]


def test_scalar_operators_lower_to_scalar_ops(in_tmp: Path) -> None:
    body = """    input x: f32[batch, 3]
    h = 1.0 - x / 4 + 2 * x ** 2 - -x
    loss = mean(1 / h)
"""
    g = graph_of(in_tmp, body)
    ops = [(op.op, op.attr_dict) for op in g.ops]
    assert ops[:4] == [("mul_scalar", {"value": 0.25}), ("neg", {}), ("add_scalar", {"value": 1.0}),
                       ("pow_scalar", {"exponent": 2.0})]
    assert ("pow_scalar", {"exponent": -1.0}) in ops


def test_tensor_indexing_and_slicing(in_tmp: Path) -> None:
    body = """    input x: f32[batch, 10, 6]
    a = x[:, 0]
    b = x[1:3, 2:8:2, -1]
    loss = mean(a) + mean(b)
"""
    g = graph_of(in_tmp, body)
    shapes = {op.op: [] for op in g.ops}
    for op in g.ops:
        shapes[op.op].append(g.type_of(op.outputs[0]).shape)
    assert shapes["reshape"][0] == (4, 6)
    assert shapes["reshape"][1] == (2, 3)
    assert g.ops[0].attr_dict == {"axis": 1, "start": 0, "stop": 1, "step": 1}


def test_imports_next_to_file_then_stdlib_and_by_string(in_tmp: Path) -> None:
    write(in_tmp / "lib" / "mine.swp", "def double(x) {\n    return x * 2\n}\n")
    body = """    input x: f32[batch, 8]
    input y: i32[batch]
    h = double(dense(x, 3))
    loss = softmax_cross_entropy(h, y)
"""
    g = graph_of(in_tmp, body, prefix='import "lib/mine.swp"\nimport layers\n')
    assert g.params == ("dense.w", "dense.b")


def test_one_file_imported_by_two_names_is_one_module(in_tmp: Path) -> None:
    """`import lib.mine` and `import "lib/mine.swp"` made `double` "ambiguous" between two equal paths."""
    write(in_tmp / "lib" / "mine.swp", "def double(x) {\n    return x * 2\n}\n")
    body = "    input x: f32[batch, 8]\n    loss = mean(double(x))\n"
    g = graph_of(in_tmp, body, prefix='import lib.mine\nimport "lib/mine.swp"\n')
    assert [op.op for op in g.ops][:1] == ["mul_scalar"], g.ops


def test_local_file_shadows_stdlib(in_tmp: Path) -> None:
    write(in_tmp / "layers.swp", "def dense(x, out) {\n    param mine: [x.shape[-1], out] = zeros\n    return x @ mine\n}\n")
    body = "    input x: f32[batch, 8]\n    loss = mean(dense(x, 3))\n"
    g = graph_of(in_tmp, body, prefix="import layers\n")
    assert g.params == ("dense.mine",)


@pytest.mark.parametrize("value,expected", [("3", 3), ("true", True), ("0.25", 0.25)])
def test_defines_by_type(in_tmp: Path, value: str, expected: object) -> None:
    name = {int: "batch", bool: "flag", float: "scale"}[type(expected)]
    g = graph_of(in_tmp, "    input x: f32[batch, 2]\n    loss = mean(x)\n", f"{name}={value}")
    assert dict(g.args)[name] == expected


def test_float_argument_accepts_an_integer(in_tmp: Path) -> None:
    g = graph_of(in_tmp, "    input x: f32[batch, 2]\n    loss = mean(x)\n", "scale=2")
    assert dict(g.args)["scale"] == 2.0 and isinstance(dict(g.args)["scale"], float)


def test_dropout_seeds_are_deterministic(in_tmp: Path) -> None:
    body = "    input x: f32[batch, 2]\n    loss = mean(dropout(dropout(x, 0.5), 0.5, seed = 7))\n"
    g = graph_of(in_tmp, body)
    assert [op.attr("seed") for op in g.ops if op.op == "dropout"] == [0, 7]


def test_cast_and_dtypes(in_tmp: Path) -> None:
    body = "    input x: f16[batch, 2]\n    h = cast(x, f32)\n    loss = mean(h)\n"
    g = graph_of(in_tmp, body)
    assert str(g.type_of(g.ops[0].outputs[0])) == "f32[4,2]"


def test_assert_and_in(cli, in_tmp: Path) -> None:
    body = '''    assert batch in [2, 4, 8], "batch must be a small power of two"
    input x: f32[batch, 2]
    loss = mean(x)
'''
    assert graph_of(in_tmp, body).tensors["x"].type.shape == (4, 2)
    code, _, err = cli("check", "m.swp", "-D", "batch=3")
    assert code == 2
    assert err.splitlines()[:2] == ["error: batch must be a small power of two", " --> m.swp:2:5"]


def test_reports_and_comparisons(in_tmp: Path) -> None:
    body = """    input x: f32[batch, 3]
    input y: i32[batch]
    param w: [3, 3] = xavier
    logits = x @ w
    loss = softmax_cross_entropy(logits, y)
    report accuracy = mean(cast(argmax(logits) == y, f32))
    report big = sum(cast(x > 0.5 * x, f32))
"""
    g = graph_of(in_tmp, body.replace("0.5 * x", "x * 0.5"))
    assert [name for name, _ in g.reports] == ["accuracy", "big"]
    ops_ = [op.op for op in g.ops]
    assert "argmax" in ops_ and "equal" in ops_ and "greater" in ops_
    assert str(g.type_of(next(op for op in g.ops if op.op == "equal").outputs[0])) == "i32[4]"
    from swapdsl.graph.autodiff import training_graph

    t = training_graph(g)
    assert t.metrics == {"accuracy": "report/accuracy", "big": "report/big"}
    assert {old for old, _ in t.updates} >= {"report/accuracy", "report/big"}
    assert not any(op.op.endswith("_grad") and "argmax" in op.op for op in t.ops)
    spans = [op.span for op in t.ops if op.op == "report"]  # (they named the last op's line, in a library)
    lines = (in_tmp / "m.swp").read_text().splitlines()
    assert [lines[sp.line - 1].split("=")[0].strip() for sp in spans] == ["report accuracy", "report big"]
