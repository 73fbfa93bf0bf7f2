"""Every user mistake: one clear message at file:line:col, exit code 2, no traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import MODELS, write
from swapdsl.common import errors
from swapdsl.common.errors import SHOWN_COLUMNS

# A well-formed model body to build bad programs from.
OK_TAIL = """    minimize loss with sgd(lr = 0.1)
}
"""


def model(body: str, args: str = "batch = 4") -> str:
    return f"model m({args}) {{\n{body}{OK_TAIL}"


MLP = """    input x: f32[batch, 8]
    input y: i32[batch]
    param w: [8, 3] = xavier
    loss = softmax_cross_entropy(x @ w, y)
"""

X = "    input x: f32[batch, 8]\n"

# (id, source, -D overrides, exact first line of the message, "line:col")
CASES: list[tuple[str, str, list[str], str, str]] = [
    ("syntax-missing-operand", model("    input x: f32[batch, 8]\n    h = x +\n"), [],
     "error: unexpected end of line", "3:12"),
    ("syntax-bad-character", model("    input x: f32[batch, 8] $\n"), [],
     "error: unexpected character `$`", "2:28"),
    ("syntax-unclosed-block", "model m(batch = 4) {\n    input x: f32[batch, 8]\n", [],
     "error: unexpected end of file", "2:27"),
    ("syntax-keyword-as-name", model("    input = 3\n"), [],
     "error: unexpected `=`", "2:11"),
    ("unknown-name", model(MLP.replace("x @ w", "x @ ww")), [],
     "error: unknown name `ww`", "5:38"),
    ("unknown-op", model(MLP.replace("softmax_cross_entropy", "softmax_crossentropy")), [],
     "error: unknown function `softmax_crossentropy`", "5:12"),
    ("wrong-arity-builtin", model(MLP.replace("(x @ w, y)", "(x @ w, y, y)")), [],
     "error: `softmax_cross_entropy` takes 2 arguments but 3 were given", "5:44"),
    ("unknown-keyword", model(MLP.replace("x @ w, y)", "x @ w, labls = y)")), [],
     "error: `softmax_cross_entropy` has no parameter `labls`", "5:41"),
    ("missing-argument", model("    input x: f32[batch, 8]\n    h = relu()\n"), [],
     "error: `relu` is missing argument `x`", "3:9"),
    ("matmul-inner-dims", model(MLP.replace("[8, 3]", "[5, 3]")), [],
     "error: matmul inner dimensions differ: 8 vs 5", "5:34"),
    ("broadcast-mismatch", model("    input x: f32[batch, 8]\n    input z: f32[batch, 5]\n    h = x + z\n"), [],
     "error: shapes do not broadcast in `add`: 8 vs 5 in dimension -1", "4:9"),
    ("conv-channels",
     model("    input x: f32[batch, 3, 8, 8]\n    param w: [16, 4, 3, 3] = he\n    h = conv2d(x, w)\n"), [],
     "error: conv2d input has 3 channels but the weight expects 4 (groups=1)", "4:9"),
    ("conv-groups",
     model("    input x: f32[batch, 6, 8, 8]\n    param w: [16, 1, 3, 3] = he\n    h = conv2d(x, w, groups = 4)\n"),
     [], "error: `conv2d` groups=4 must divide both the input channels (6) and the output channels (16)", "4:9"),
    ("dtype-mismatch", model("    input x: f32[batch, 8]\n    input z: f16[batch, 8]\n    h = x * z\n"), [],
     "error: dtype mismatch in `mul`: f16 vs f32", "4:9"),
    ("float-op-on-int", model("    input y: i32[batch]\n    h = relu(y)\n"), [],
     "error: `relu` needs floating-point tensors, got i32[4]", "3:9"),
    ("non-integer-dim", model("    input x: f32[batch / 2, 8]\n"), [],
     "error: a dimension must be an integer, got float `2.0`", "2:18"),
    ("negative-dim", model("    input x: f32[batch - 10, 8]\n"), [],
     "error: a dimension must be positive, got -6", "2:18"),
    ("unknown-dtype", model("    input x: f33[batch, 8]\n"), [],
     "error: unknown dtype `f33`", "2:14"),
    ("input-without-dtype", model("    input x: [batch, 8]\n"), [],
     "error: input `x` needs a dtype", "2:14"),
    ("import-missing", "import nosuchfile\n" + model(MLP), [],
     "error: cannot find imported file `nosuchfile.swp`", "1:1"),
    ("loop-bound-tensor", model("    input x: f32[batch, 8]\n    for i in range(x) {\n        h = x\n    }\n"), [],
     "error: a loop bound must be a static integer, got tensor f32[4,8]", "3:20"),
    ("loop-bound-float", model("    for i in range(2.5) {\n        h = 1\n    }\n"), [],
     "error: a loop bound must be a static integer, got float `2.5`", "2:20"),
    ("loop-over-tensor", model("    input x: f32[batch, 8]\n    for i in x {\n        h = x\n    }\n"), [],
     "error: a loop needs a static range or list, got tensor f32[4,8]", "3:14"),
    ("no-loss", "model m(batch = 4) {\n    input x: f32[batch, 8]\n}\n", [],
     "error: model `m` has no loss and no output", "1:1"),
    ("loss-not-scalar", model("    input x: f32[batch, 8]\n    loss = relu(x)\n"), [],
     "error: the loss must be a floating-point scalar, got tensor f32[4,8]", "4:14"),
    ("two-minimize", model(MLP + "    minimize loss with adam()\n"), [],
     "error: a model has one `minimize` statement; this is the second", "7:5"),
    ("unknown-optimizer", model(MLP).replace("sgd(", "sdg("), [],
     "error: unknown optimizer `sdg`", "6:24"),
    ("optimizer-missing-lr", model(MLP).replace("sgd(lr = 0.1)", "sgd(momentum = 0.9)"), [],
     "error: optimizer `sgd` is missing argument `lr`", "6:5"),
    ("unknown-initializer", model(MLP.replace("= xavier", "= xavierr")), [],
     "error: unknown initialiser `xavierr`", "4:23"),
    ("initializer-negative-std", model(MLP.replace("= xavier", "= normal(std = -1)")), [],
     "error: `std` of initialiser `normal` must be at least 0, got -1", "4:30"),
    ("initializer-empty-range", model(MLP.replace("= xavier", "= uniform(1, 0)")), [],
     "error: initialiser `uniform` needs low <= high, got low 1 and high 0", "4:23"),
    ("define-unknown-arg", model(MLP), ["bath=8"],
     "error: -D bath: model `m` has no argument `bath`", "1:1"),
    ("define-wrong-type", model(MLP), ["batch=eight"],
     "error: -D batch=eight: expected an integer", "1:9"),
    ("define-malformed", model(MLP), ["batch"],
     "error: -D batch: expected NAME=VALUE", ""),
    ("duplicate-param", model(MLP.replace("    loss", "    param w: [8] = zeros\n    loss")), [],
     "error: `w` is declared twice", "5:5"),
    ("tuple-unpack", model("    input x: f32[batch, 8]\n    a, b = x\n"), [],
     "error: cannot unpack 1 value into 2 names", "3:5"),
    ("reshape-size", model("    input x: f32[batch, 8]\n    h = reshape(x, [3, 3])\n"), [],
     "error: cannot reshape f32[4,8] (32 elements) to [3,3] (9 elements)", "3:9"),
    ("axis-out-of-range", model("    input x: f32[batch, 8]\n    h = softmax(x, axis = 2)\n"), [],
     "error: axis 2 is out of range for f32[4,8] (rank 2)", "3:9"),
    ("labels-not-int", model(MLP.replace("i32[batch]", "f32[batch]")), [],
     "error: `softmax_cross_entropy` labels must be integer class indices, got f32[4]", "5:12"),
    ("shape-index-range", model("    input x: f32[batch, 8]\n    n = x.shape[2]\n"), [],
     "error: index 2 is out of range for a tuple of length 2", "3:17"),
    ("unknown-tensor-attr", model("    input x: f32[batch, 8]\n    n = x.shap\n"), [],
     "error: a tensor has no attribute `shap`", "3:9"),
    ("condition-not-bool", model("    input x: f32[batch, 8]\n    if batch {\n        h = x\n    }\n"), [],
     "error: a condition must be a static bool, got integer `4`", "3:8"),
    ("no-model", "def f(x) {\n    return x\n}\n", [],
     "error: `bad.swp` defines no model", "1:1"),
    ("shadow-builtin", "def relu(x) {\n    return x\n}\n" + model(MLP), [],
     "error: `def relu` would hide the built-in `relu`", "1:1"),
    ("recursion", "def f(x) {\n    return f(x)\n}\n" + model("    h = f(1)\n" + MLP), [],
     "error: `f` is called again while it runs (f -> f): recursion is refused", "2:12"),
    ("bounded-recursion", "def f(x, n) {\n    if n > 0 {\n        return f(x, n - 1)\n    }\n    return x\n}\n"
     + model("    h = f(1, 3)\n" + MLP), [], "error: `f` is called again while it runs (f -> f): recursion is refused",
     "3:16"),
    ("mutual-recursion", "def f(x) {\n    return g(x)\n}\ndef g(x) {\n    return f(x)\n}\n" + model("    h = f(1)\n" + MLP),
     [], "error: `f` is called again while it runs (f -> g -> f): recursion is refused", "5:12"),
    ("missing-return", "def f(x) {\n    y = x\n}\n" + model("    h = f(1)\n" + MLP), [],
     "error: function `f` ended without `return`", "1:1"),
    ("function-too-many-args", "def f(x) {\n    return x\n}\n" + model("    h = f(1, 2)\n" + MLP), [],
     "error: `f` takes 1 argument but 2 were given", "5:14"),
    ("input-in-function", "def f(x) {\n    input z: f32[2]\n    return x\n}\n" + model("    h = f(1)\n" + MLP), [],
     "error: `input` is only allowed in a model, not in a function", "2:5"),
    ("model-arg-without-default", model(MLP, args="batch"), [],
     "error: model argument `batch` has no default", "1:9"),
    ("split-uneven", model("    input x: f32[batch, 9]\n    a, b = split(x, 2)\n"), [],
     "error: cannot split dimension 1 of size 9 into 2 equal parts", "3:12"),
    ("argument-kind", model("    input x: f32[batch, 8]\n    h = softmax(x, axis = 1.5)\n"), [],
     "error: argument `axis` of `softmax` must be an integer axis, got float `1.5`", "3:20"),
    # the outside check's depth, size and arithmetic cases: each a clear error, none a traceback
    ("nested-unary", model(X + "    h = " + "-" * 1000 + "x\n"), [],
     "error: more than 100 unary operators in a row", "3:109"),
    ("nested-not", model(X + "    a = " + "not " * 1000 + "true\n"), [],
     "error: more than 100 unary operators in a row", "3:409"),
    ("nested-calls", model(X + "    h = " + "relu(" * 200 + "x" + ")" * 200 + "\n"), [],
     "error: brackets and blocks nest more than 100 deep here", "3:508"),
    ("nested-lists", model("    a = " + "[" * 500 + "1" + "]" * 500 + "\n"), [],
     "error: brackets and blocks nest more than 100 deep here", "2:108"),
    ("nested-ifs", model("    if true {\n" * 250 + "    a = 1\n" + "    }\n" * 250), [],
     "error: brackets and blocks nest more than 100 deep here", "101:13"),
    ("power-tower", model(X + "    h = x * " + " ** ".join(["1"] * 500) + "\n"), [],
     "error: more than 100 `**` in one statement", "3:515"),
    ("huge-literal", model(X + "    h = x * " + "9" * 5000 + "\n"), [],
     "error: integer literal of 5000 digits is too large (static integers are 64-bit)", "3:13"),
    ("huge-dimension", model("    input x: f32[batch, 10000000000000000]\n"), [],
     "error: a tensor of 40,000,000,000,000,000 elements (160,000,000,000,000,000 bytes) is larger than the "
     "limit of 1,125,899,906,842,624 bytes (1 PiB)", "2:14"),
    ("static-overflow", model(X + "    h = x * exp(1000)\n"), [],
     "error: `exp` of these numbers is out of range (math range error)", "3:13"),
    ("fill-out-of-range", model(X + "    h = x * full([8], 1e5, f16)\n"), [],
     "error: 100000 is out of the range of f16 (at most 65504 in magnitude)", "3:13"),
    ("scalar-out-of-range", model(X + "    h = x * 1e39\n"), [],
     "error: 1e+39 is out of the range of f32 (at most 3.40282e+38 in magnitude)", "3:9"),
    ("reciprocal-out-of-range", model(X + "    h = x / 1e-39\n"), [],
     "error: dividing by 1e-39 multiplies by 1e+39, which is out of the range of f32 (at most 3.40282e+38 in "
     "magnitude)", "3:9"),
    ("float-dimension", model("    input x: f32[batch, 4.0]\n"), [],
     "error: a dimension must be an integer, got float `4.0`", "2:25"),
    ("integer-loss", model(X + "    minimize sum(cast(x, i32)) with sgd(0.1)\n"), [],
     "error: the loss must be a floating-point scalar, got tensor i32[]", "3:14"),
    ("range-index", model(X + "    h = x * range(3)[5]\n"), [],
     "error: index 5 is out of range for a range of length 3", "3:22"),
    ("reciprocal-overflows-f64", model("    input x: f64[batch, 8]\n    h = x / 1e-320\n"), [],
     "error: dividing by 9.99989e-321 multiplies by inf, which is out of the range of f64 (at most 1.79769e+308 "
     "in magnitude)", "3:9"),
    ("below-i32", model("    input x: i32[batch]\n    h = x + full([batch], -2147483649, i32)\n"), [],
     "error: -2,147,483,649 is out of the range of i32 (from -2,147,483,648 to 2,147,483,647)", "3:13"),
    ("zero-to-negative-power", model(X + "    h = x * 0 ** -1\n"), [],
     "error: zero to a negative power", "3:13"),
    ("int-of-infinity", model(X + "    h = x * int(1e308 * 10)\n"), [],
     "error: the number is inf, not a finite value", "3:17"),
    ("power-too-large", model(X + "    h = x * 10 ** 10 ** 10\n"), [],
     "error: `10 ** 10000000000` is too large for a static integer (limit 2**63)", "3:13"),
    ("rank-1-matmul", model("    param v: f32[8] = zeros\n    q = v @ v\n"), [],
     "error: `matmul` needs operands of rank 2 or more", "3:9"),
    ("slice-step-zero", model(X + "    h = x[::0]\n"), [],
     "error: a slice step must not be zero", "3:11"),
    ("loop-too-long", model("    for i in range(100000000) {\n        a = 1\n    }\n"), [],
     "error: range of 100,000,000 values: more than the 2,000,000 loop iterations a model may run", "2:14"),
    ("too-many-ops", model(X + "    for i in range(200000) {\n        x = relu(x)\n    }\n"), [],
     "error: the model has more than 25,000 ops", "4:13"),
    ("too-many-tokens", model(X + "    h = " + " + ".join(["x"] * 60_000) + "\n"), [],
     "error: the file has more than 100,000 tokens", "3:199967"),
    ("report-not-scalar", model(MLP + "    report hits = argmax(x @ w) == y\n"), [],
     "error: a report must be a scalar tensor, got tensor i32[4]", "6:19"),
    ("report-twice", model(MLP + "    report a = loss\n    report a = loss\n"), [],
     "error: `a` is reported twice", "7:5"),
    ("report-loss", model(MLP + "    report loss = loss\n"), [],
     "error: `loss` is reported by training itself: the loss, shown every step", "6:5"),
    ("report-grad-norm", model(MLP + "    report grad_norm = loss\n"), [],
     "error: `grad_norm` is reported by training itself: the gradients' global norm (`clip = C`)", "6:5"),
    ("report-in-function", "def f(x) {\n    report a = mean(x)\n    return x\n}\n" + model(MLP + "    h = f(x)\n"),
     [], "error: `report` is only allowed in a model", "2:5"),
    ("compare-dtypes", model(MLP + "    report a = mean(cast(argmax(x @ w) == x, f32))\n"), [],
     "error: dtype mismatch in `equal`: f32 vs i32", "6:26"),
    ("argmax-scalar", model(MLP + "    report a = argmax(loss)\n"), [],
     "error: axis -1 is out of range for f32[] (rank 0)", "6:16"),
    ("define-huge", model(MLP), ["batch=99999999999999999999999999"],
     "error: -D batch=99999999999999999999999999: expected an integer below 2**63", "1:9"),
    ("define-underscore", model(MLP), ["batch=8_0"], "error: -D batch=8_0: expected an integer", "1:9"),
    ("define-other-digits", model(MLP), ["batch=\u0668"], "error: -D batch=\u0668: expected an integer", "1:9"),
    ("define-float-underscore", model(MLP + "    h = x * lr\n", args="batch = 4, lr = 0.1"), ["lr=1_0.5"],
     "error: -D lr=1_0.5: expected a number", "1:20"),
    ("define-nan", model(MLP + "    h = x * lr\n", args="batch = 4, lr = 0.1"), ["lr=nan"],
     "error: -D lr=nan: expected a finite number", "1:20"),
    ("define-infinite", model(MLP + "    h = x * lr\n", args="batch = 4, lr = 0.1"), ["lr=1e999"],
     "error: -D lr=1e999: expected a finite number", "1:20"),
]


@pytest.mark.parametrize("source,defines,first,where", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_program(cli, in_tmp: Path, source: str, defines: list[str], first: str, where: str) -> None:
    write(in_tmp / "bad.swp", source)
    args = ["check", "bad.swp"] + [a for d in defines for a in ("-D", d)]
    code, out, err = cli(*args)
    assert code == 2
    assert out == ""
    assert "Traceback" not in err
    assert err.splitlines()[0] == first
    if where:
        assert err.splitlines()[1] == f" --> bad.swp:{where}"
        # the source line and a caret under the span follow
        assert "^" in err.splitlines()[4]


def test_the_table_is_large() -> None:
    assert len(CASES) >= 50


def test_a_sum_of_ten_thousand_terms_builds_and_trains(cli, in_tmp: Path) -> None:
    """Generated models are long: a chain of binary operators is not nesting, whatever its length."""
    write(in_tmp / "long.swp", model("    input x: f32[batch, 8]\n    loss = mean(" + " + ".join(["x"] * 10_000) + ")\n"))
    code, out, err = cli("check", "long.swp", "--training", "--json")
    assert code == 0, err
    assert '"forward_ops": 10000' in out
    code, _, err = cli("exec", "long.swp", "--steps", "1", "--backend", "numpy")
    assert code == 0, err


def test_a_chain_of_indices_is_not_nesting(cli, in_tmp: Path) -> None:
    write(in_tmp / "idx.swp", model("    input x: f32[batch, 8]\n    loss = mean(x" + "[0:4]" * 2000 + ")\n"))
    code, _, err = cli("check", "idx.swp")
    assert code == 0, err


def test_caret_sits_under_the_span(cli, in_tmp: Path) -> None:
    write(in_tmp / "bad.swp", model(MLP.replace("[8, 3]", "[5, 3]")))
    _, _, err = cli("check", "bad.swp")
    lines = err.splitlines()
    assert lines[3] == "5 |     loss = softmax_cross_entropy(x @ w, y)"
    assert lines[4] == "  |                                  ^^^^^"
    assert "  = hint: left is f32[4,8], right is f32[5,3]" in lines


def test_did_you_mean(cli, in_tmp: Path) -> None:
    write(in_tmp / "bad.swp", model(MLP.replace("softmax_cross_entropy", "softmax_crossentropy")))
    _, _, err = cli("check", "bad.swp")
    assert "  = hint: did you mean `softmax_cross_entropy`?" in err.splitlines()


def test_syntax_error_lists_what_was_expected(cli, in_tmp: Path) -> None:
    write(in_tmp / "bad.swp", model("    input x f32[batch]\n"))
    _, _, err = cli("check", "bad.swp")
    assert err.splitlines()[0] == "error: unexpected `f32`"
    assert "  = hint: expected one of: `:`" in err.splitlines()


def test_error_inside_a_function_names_the_call_site(cli, in_tmp: Path) -> None:
    write(in_tmp / "lib.swp", "def proj(x) {\n    param w: [5, 2] = xavier\n    return x @ w\n}\n")
    write(in_tmp / "bad.swp", "import lib\n" + model("    input x: f32[batch, 8]\n    h = proj(x)\n" + MLP[27:]))
    code, _, err = cli("check", "bad.swp")
    assert code == 2
    assert err.splitlines()[:2] == ["error: matmul inner dimensions differ: 8 vs 5", " --> lib.swp:3:12"]
    assert "  = note: in `proj`, called from bad.swp:4:9" in err.splitlines()


def test_import_cycle(cli, in_tmp: Path) -> None:
    write(in_tmp / "a.swp", "import b\n" + model(MLP))
    write(in_tmp / "b.swp", "import c\n")
    write(in_tmp / "c.swp", "import a\n")
    code, _, err = cli("check", "a.swp")
    assert code == 2
    assert err.splitlines()[:2] == ["error: import cycle: a.swp -> b.swp -> c.swp -> a.swp", " --> c.swp:1:1"]


def test_empty_file(cli, in_tmp: Path) -> None:
    write(in_tmp / "empty.swp", "\n  \n")
    code, _, err = cli("check", "empty.swp")
    assert (code, err.splitlines()[0]) == (2, "error: `empty.swp` is empty")


def test_not_utf8(cli, in_tmp: Path) -> None:
    (in_tmp / "latin.swp").write_bytes(b"# caf\xe9\nmodel m() {\n}\n")
    code, _, err = cli("check", "latin.swp")
    assert code == 2
    assert err.splitlines()[:2] == ["error: `latin.swp` is not valid UTF-8 (byte 0xe9)", " --> latin.swp:1:6"]


def test_directory_given(cli, in_tmp: Path) -> None:
    (in_tmp / "models").mkdir()
    code, _, err = cli("check", "models")
    assert (code, err.splitlines()[0]) == (2, "error: `models` is a directory, not a .swp file")


def test_a_binary_file_given_for_a_text_one_is_named_with_where_it_belongs(cli, in_tmp: Path) -> None:
    import numpy as np
    from safetensors.numpy import save_file

    np.save(in_tmp / "x.npy", np.arange(3))
    np.savez(in_tmp / "d.npz", x=np.arange(3))
    save_file({"w": np.ones(2, np.float32)}, str(in_tmp / "c.safetensors"))
    (in_tmp / "dir.plan").mkdir()
    (in_tmp / "run.jsonl").write_text('{"event": "step", "step": 1}\n')
    (in_tmp / "gpu.json").write_text('\n  {"name": "mine"}\n')
    (in_tmp / "net.onnx").write_text("model t() {}\n")  # (ONNX is told by its name: a small one may decode)
    for argv, said in [(["exec", "run.jsonl"], "`run.jsonl` is a training log (`exec --log` wrote it), not a .swp file"),
                       (["simulate", "run.jsonl"], "`run.jsonl` is a training log (`exec --log` wrote it), not a plan "
                                                   "file"),
                       (["optimize", "gpu.json", "--memory", "1GiB", "-o", "n.plan"],
                        "`gpu.json` is a JSON file, not a .swp file"),
                       (["check", "net.onnx"], "`net.onnx` is an ONNX model, not a .swp file"),
                       (["check", "x.npy"], "`x.npy` is a NumPy array, not a .swp file"),
                       (["exec", "d.npz"], "`d.npz` is a zip archive (an .npz?), not a .swp file"),
                       (["exec", "c.safetensors"], "`c.safetensors` is a safetensors checkpoint, not a .swp file"),
                       (["simulate", "c.safetensors"], "`c.safetensors` is a safetensors checkpoint, not a plan file"),
                       (["simulate", "dir.plan"], "`dir.plan` is a directory, not a plan file")]:
        code, out, err = cli(*argv)
        assert (code, out, err.splitlines()[0]) == (2, "", f"error: {said}"), err
        assert "= hint: " in err or "directory" in said


def test_an_import_that_names_a_folder_says_so(cli, in_tmp: Path) -> None:
    (in_tmp / "lib.swp").mkdir()
    (in_tmp / "m.swp").write_text("import lib\nmodel t(batch = 4) {\n    input x: f32[batch, 3]\n    output y = x\n}\n")
    code, _, err = cli("check", "m.swp")
    assert (code, err.splitlines()[0]) == (2, "error: cannot find imported file `lib.swp`: `lib.swp` is not a "
                                              "regular file")


def test_missing_file(cli, in_tmp: Path) -> None:
    code, _, err = cli("check", "nope.swp")
    assert (code, err.splitlines()[0]) == (2, "error: no such file: `nope.swp`")


def test_ambiguous_import(cli, in_tmp: Path) -> None:
    write(in_tmp / "a.swp", "def f(x) {\n    return x\n}\n")
    write(in_tmp / "b.swp", "def f(x) {\n    return x\n}\n")
    write(in_tmp / "bad.swp", "import a\nimport b\n" + model("    h = f(1)\n" + MLP))
    code, _, err = cli("check", "bad.swp")
    assert code == 2
    assert err.splitlines()[0] == "error: `f` is ambiguous: it is defined in a.swp and b.swp"
    # qualifying the call resolves it
    write(in_tmp / "ok.swp", "import a\nimport b\n" + model("    h = a.f(1)\n" + MLP))
    assert cli("check", "ok.swp")[0] == 0


def test_real_process_exit_code_and_no_traceback(in_tmp: Path) -> None:
    write(in_tmp / "bad.swp", model(MLP.replace("[8, 3]", "[5, 3]")))
    proc = subprocess.run([sys.executable, "-m", "swapdsl", "check", "bad.swp"], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(Path(__file__).parent.parent)})
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert proc.stderr.startswith("error: matmul inner dimensions differ: 8 vs 5\n --> bad.swp:5:34\n")
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("line, word", [("input = 3", "input"), ("h = model + 1", "model"), ("report = 2", "report")])
def test_a_reserved_word_where_a_name_belongs_is_named_as_one(cli, in_tmp: Path, line: str, word: str) -> None:
    write(in_tmp / "m.swp", f"model m() {{\n    {line}\n}}\n")
    code, _, err = cli("check", "m.swp")
    assert code == 2 and f"  = hint: `{word}` is a reserved word: it cannot name a value" in err.splitlines()


def test_a_keyword_out_of_place_elsewhere_gets_no_reserved_word_hint(cli, in_tmp: Path) -> None:
    write(in_tmp / "m.swp", "model m() {\n    h = 3 true\n}\n")
    code, _, err = cli("check", "m.swp")
    assert code == 2 and "reserved word" not in err


def test_a_byte_order_mark_is_read_past(cli, in_tmp: Path) -> None:
    (in_tmp / "m.swp").write_bytes(b"\xef\xbb\xbf" + (MODELS / "mlp.swp").read_bytes())
    code, out, err = cli("check", "m.swp")
    assert code == 0 and "model mlp (m.swp): ok" in out, err


def test_an_error_on_a_long_line_shows_a_window_around_its_place(cli, in_tmp: Path) -> None:
    write(in_tmp / "m.swp", model(X + "    h = " + " + ".join(["x"] * 5000) + " ? x\n"))
    code, _, err = cli("check", "m.swp")
    shown = err.splitlines()
    assert code == 2 and shown[0] == "error: unexpected character `?`" and max(map(len, shown)) < 140
    source, caret = shown[3], shown[4]
    assert source.startswith("3 | ...") and source[caret.index("^")] == "?"


@pytest.mark.parametrize("wide", ["隠", "e\u0301", "a"])
def test_a_long_lines_window_is_counted_in_cells(cli, in_tmp: Path, wide: str) -> None:
    """The window around an error's place on a long line was 120 characters: 240 cells of CJK."""
    write(in_tmp / "m.swp", model(X + f'    h = f("{wide * 3000}") ? x + f("{wide * 3000}")\n'))
    code, _, err = cli("check", "m.swp")
    source, caret = err.splitlines()[3], err.splitlines()[4]
    source = source.removeprefix("3 | ")
    assert code == 2 and source.startswith("...") and source.endswith("...") and caret.endswith(" ^"), err
    assert SHOWN_COLUMNS + 5 <= errors._cells(source) <= SHOWN_COLUMNS + 6  # (and the two "...")
    assert len(caret) == len("  | ") + errors._cells(source[:source.index("?")]) + 1


@pytest.mark.parametrize("text, more", [("隠れ層 e\u0301", 3 - 1), ("\u0e01\u0e34\u0e01\u0e34", -2),
                                        ("a\u200db\ufe0f", -2)])
def test_the_caret_stands_under_its_place_past_wide_characters(cli, in_tmp: Path, text: str, more: int) -> None:
    """The caret counted characters, not terminal cells: after a string in CJK (two cells each), with a
    combining accent, Thai vowel signs or a zero-width joiner (none), it stood off the mistake."""
    write(in_tmp / "m.swp", model(X + f'    h = f("{text}") ? x\n'))
    code, _, err = cli("check", "m.swp")
    source, caret = err.splitlines()[3], err.splitlines()[4]
    cells = source.index("?") + more  # (the characters before it, less or more the cells they take)
    assert code == 2 and "unexpected character `?`" in err and caret.endswith(" ^") and len(caret) - 1 == cells, err


@pytest.mark.parametrize("line, hint", [
    ("    input x: f32[batch, 4.0]\n", "write it as an integer, or int(...) it"),
    ("    input x: f32[batch, 9 / 2]\n", "use // for integer division"),
    ("    input x: F32[batch, 4]\n", "did you mean `f32`?"),
    (X + "    minimize sum(cast(x, i32)) with sgd(0.1)\n", "cast it: cast(..., f32)"),
])
def test_a_hint_fits_the_mistake(cli, in_tmp: Path, line: str, hint: str) -> None:
    """A float literal for a dimension was told to use `//`; `F32`, that it meant `i32`; an integer scalar loss,
    to reduce it."""
    write(in_tmp / "m.swp", model(line))
    code, _, err = cli("check", "m.swp")
    assert code == 2 and f"  = hint: {hint}" in err.splitlines(), err


def test_ranges_have_a_length_index_and_slice_and_nesterov_takes_true(cli, in_tmp: Path) -> None:
    write(in_tmp / "m.swp", model(MLP + "    r = range(2, 10, 2)\n    report a = mean(x) * r[1] * len(r[1:])\n")
          .replace("loss = softmax", "loss = softmax") + "")
    code, out, err = cli("check", "m.swp")
    assert code == 0, err
    text = "model m(batch = 4, on = true) {\n" + MLP + "    minimize loss with sgd(0.1, momentum = 0.9, nesterov = on)\n}\n"
    write(in_tmp / "n.swp", text)
    code, out, err = cli("check", "n.swp")
    assert code == 0 and "arguments        batch=4 on=true" in out, err


def test_constants_a_dtype_holds_are_taken_to_its_ends(cli, in_tmp: Path) -> None:
    """The least i32 was refused (its magnitude is one more than the greatest); a half tensor's product takes
    any f32 constant, since half kernels compute in f32 (only the result is rounded to half)."""
    write(in_tmp / "m.swp", model("    input x: i32[batch]\n    input z: f16[batch]\n"
                                  "    h = x + full([batch], -2147483648, i32)\n    g = z * 100000.0\n"
                                  "    output y = h\n    output w = g\n    loss = mean(cast(g, f32))\n"))
    code, _, err = cli("check", "m.swp")
    assert code == 0, err


def test_the_line_shown_is_the_parsers_line_past_a_line_separator_and_crlf(cli, in_tmp: Path) -> None:
    (in_tmp / "m.swp").write_bytes("model m(batch = 2) {\r\n    input x: f32[batch]\r\n    # a \u2028 b\r\n"
                                   "    h = x +* 2\r\n}\r\n".encode())
    code, _, err = cli("check", "m.swp")
    assert code == 2 and "4 |     h = x +* 2\n" in err, err


def test_one_hint_or_note_given_as_text_is_one() -> None:
    from swapdsl.common.errors import SwpError

    rendered = SwpError("bad", hints="do this", notes="because").render().splitlines()
    assert rendered == ["error: bad", "  = note: because", "  = hint: do this"]
