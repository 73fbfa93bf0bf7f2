"""`swapdsl import`: ONNX graphs built with onnx.helper (every op of the import table), imported, and their
forward pass checked against onnxruntime, an independent executor of the same file."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto as T  # noqa: E402
from onnx import helper as h  # noqa: E402
from onnx import numpy_helper as nh  # noqa: E402

import swapdsl  # noqa: E402
from swapdsl.common.errors import SwpError  # noqa: E402
from swapdsl.fuzz.onnx_files import attention_graph, blocks_graph, cnn_graph, decoder_graph, model_bytes  # noqa: E402
from swapdsl.importer.fold import FOLD  # noqa: E402
from swapdsl.importer.rules import RULES  # noqa: E402

RNG = np.random.default_rng(0)
N = h.make_node


def weight(name: str, *shape: int, low: float | None = None) -> onnx.TensorProto:
    a = RNG.uniform(low, 1.5, shape) if low is not None else RNG.standard_normal(shape) * 0.3
    return nh.from_array(a.astype(np.float32), name)


def ints(name: str, *values: int) -> onnx.TensorProto:
    return nh.from_array(np.array(values, np.int64), name)


def save(tmp: Path, nodes: list, inputs: list, outputs: list, inits: list, opset: int = 20,
         name: str = "net") -> str:
    g = h.make_graph(nodes, name, inputs, outputs, inits)
    m = h.make_model(g, opset_imports=[h.make_opsetid("", opset)], producer_name="test", ir_version=9)
    onnx.checker.check_model(m)
    path = tmp / f"{name}.onnx"
    onnx.save(m, str(path))
    return str(path)


def imported_matches_onnxruntime(tmp: Path, path: str, feeds: dict[str, np.ndarray], rtol: float = 1e-5,
                                 **kwargs) -> str:
    """Import ``path``, predict on ``feeds`` from the imported weights, compare every output with
    onnxruntime's; returns the `.swp` text."""
    out = tmp / "model.swp"
    swapdsl.import_onnx(path, str(out), **kwargs)
    np.savez(tmp / "feeds.npz", **feeds)
    ours = swapdsl.predict(str(out), str(tmp / "feeds.npz"), init=str(out.with_suffix(".safetensors")))
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    theirs = dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))
    assert len(ours) == len(theirs)
    for (name, a), b in zip(ours.items(), theirs.values()):
        assert a.shape == b.shape, name
        scale = max(float(np.abs(b).max()), 1e-30)
        assert float(np.abs(a.astype(np.float64) - b).max()) <= rtol * scale, name
    return out.read_text()


def seed_file(tmp: Path, build, name: str) -> str:  # noqa: ANN001
    """One of the ONNX fuzzer's seed models (``swapdsl.fuzz.onnx_files``), written to ``tmp``."""
    path = tmp / f"{name}.onnx"
    path.write_bytes(model_bytes(build(np.random.default_rng(0)), name))
    return str(path)


def test_a_convolutional_net_with_batch_norm_and_shape_arithmetic(tmp_path: Path) -> None:
    path = seed_file(tmp_path, cnn_graph, "net")
    x = RNG.standard_normal((10, 3, 8, 8)).astype(np.float32)  # 10 examples at batch 4: a partial batch too
    text = imported_matches_onnxruntime(tmp_path, path, {"x": x}, batch=4, loss="cross_entropy")
    assert "reshape(p, [batch, 64])" in text and "model net(batch = 4)" in text and "report accuracy" in text
    assert "minimize loss with sgd(lr = 0.01)" in text


def test_grouped_strided_convolutions_and_pooling(tmp_path: Path) -> None:
    nodes = [N("Conv", ["x", "w1"], ["c1"], strides=[2, 2], pads=[1, 1, 1, 1], group=2),
             N("LeakyRelu", ["c1"], ["a1"], alpha=0.2),
             N("Conv", ["a1", "w2", "b2"], ["c2"], dilations=[2, 2], pads=[2, 2, 2, 2]),
             N("Sigmoid", ["c2"], ["a2"]),
             N("AveragePool", ["a2"], ["p1"], kernel_shape=[3, 3], strides=[1, 1], pads=[1, 1, 1, 1]),
             N("AveragePool", ["p1"], ["p2"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1],
               count_include_pad=1),
             N("Tanh", ["p2"], ["t3"]), N("HardSwish", ["t3"], ["h3"]), N("HardSigmoid", ["h3"], ["a3"], alpha=0.3),
             N("GlobalAveragePool", ["a3"], ["g"]), N("Flatten", ["g"], ["f"]),
             N("Gemm", ["f", "w3", "b3"], ["y"])]
    inits = [weight("w1", 6, 2, 3, 3), weight("w2", 6, 6, 3, 3), weight("b2", 6), weight("w3", 6, 3),
             weight("b3", 3)]
    path = save(tmp_path, nodes, [h.make_tensor_value_info("x", T.FLOAT, [2, 4, 9, 9])],
                [h.make_tensor_value_info("y", T.FLOAT, [2, 3])], inits)
    x = RNG.standard_normal((2, 4, 9, 9)).astype(np.float32)
    text = imported_matches_onnxruntime(tmp_path, path, {"x": x})
    assert "groups = 2" in text and "count_include_pad = false" in text


def test_a_depthwise_convolution_of_sixteen_groups(tmp_path: Path) -> None:
    nodes = [N("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1], group=16)]
    path = save(tmp_path, nodes, [h.make_tensor_value_info("x", T.FLOAT, [2, 16, 5, 5])],
                [h.make_tensor_value_info("y", T.FLOAT, [2, 16, 5, 5])], [weight("w", 16, 1, 3, 3)])
    text = imported_matches_onnxruntime(tmp_path, path, {"x": RNG.standard_normal((2, 16, 5, 5)).astype(np.float32)})
    assert "groups = 16)" in text


def test_the_exporters_softmax_guard_reciprocals_and_broadcasts(tmp_path: Path) -> None:
    """torch.onnx.export(dynamo=True)'s forms: Where(IsNaN(p), 0, p) after a softmax (imported as p, with
    a note), Reciprocal (RMS norm's rsqrt), and Expand of a tensor (grouped-query attention's keys)."""
    nodes = [N("Softmax", ["x"], ["p"], axis=-1), N("IsNaN", ["p"], ["nan"]), N("Where", ["nan", "zero", "p"], ["q"]),
             N("Add", ["q", "one"], ["q1"]), N("Reciprocal", ["q1"], ["r"]), N("Unsqueeze", ["r", "ax"], ["u"]),
             N("Expand", ["u", "to"], ["e"]), N("Reshape", ["e", "flat"], ["y"])]
    inits = [nh.from_array(np.array(0.0, np.float32), "zero"), nh.from_array(np.array(1.0, np.float32), "one"),
             ints("ax", 1), ints("to", 1, 3, 1, 1), ints("flat", 0, -1)]
    path = save(tmp_path, nodes, [h.make_tensor_value_info("x", T.FLOAT, ["N", 2, 5])],
                [h.make_tensor_value_info("y", T.FLOAT, ["N", 30])], inits)
    imported_matches_onnxruntime(tmp_path, path, {"x": RNG.standard_normal((3, 2, 5)).astype(np.float32)}, batch=3)
    bad = save(tmp_path, [N("Where", ["c", "x", "x"], ["y"])],
               [h.make_tensor_value_info("c", T.BOOL, [2, 3]), h.make_tensor_value_info("x", T.FLOAT, [2, 3])],
               [h.make_tensor_value_info("y", T.FLOAT, [2, 3])], [], name="where")
    with pytest.raises(SwpError):
        swapdsl.import_onnx(bad, str(tmp_path / "w.swp"))


def test_an_attention_block_with_symbolic_batch_and_sequence(tmp_path: Path) -> None:
    path = seed_file(tmp_path, attention_graph, "net")
    ids = RNG.integers(0, 11, (3, 5)).astype(np.int64)
    text = imported_matches_onnxruntime(tmp_path, path, {"ids": ids}, batch=2, dims={"sequence": 5})
    assert "model net(batch = 2, sequence = 5)" in text
    assert "reshape(q, [batch, sequence, 2, 4])" in text  # the shape arithmetic, in the model's terms
    # and the text follows another sequence length
    m = swapdsl.load(tmp_path / "model.swp", batch=2, sequence=7)
    assert m.graph.type_of(m.graph.inputs[0]).shape == (2, 7)
    with pytest.raises(SwpError, match="--dim seq: the file has no symbolic size of that name"):
        swapdsl.import_onnx(path, str(tmp_path / "seq.swp"), dims={"seq": 5})  # (not: give `sequence` a value)


def test_a_sequence_past_a_constant_tables_rows_is_said_so(tmp_path: Path) -> None:
    """A position table of 4 rows added at a symbolic sequence: at 4 or fewer it imports (at 4 with the
    sequence fixed, since 5 does not import); at 5 the error adds that a constant may hold fewer rows."""
    nodes = [N("Shape", ["x"], ["s"]), N("Gather", ["s", "one"], ["n"]), N("Unsqueeze", ["n", "zero"], ["end"]),
             N("Slice", ["pos", "start", "end", "zero"], ["p"]), N("Add", ["x", "p"], ["y"])]
    path = save(tmp_path, nodes, [h.make_tensor_value_info("x", T.FLOAT, ["batch", "sequence", 3])],
                [h.make_tensor_value_info("y", T.FLOAT, ["batch", "sequence", 3])],
                [weight("pos", 4, 3), nh.from_array(np.array(1, np.int64), "one"), ints("zero", 0), ints("start", 0)])
    _, r = swapdsl.import_onnx(path, str(tmp_path / "four.swp"), dims={"sequence": 4})
    assert any(n.startswith("`sequence` is fixed at 4: the graph does not import at 5 (a static export, or a "
                            "constant with rows for no more") for n in r.notes), r.notes
    with pytest.raises(SwpError) as err:
        swapdsl.import_onnx(path, str(tmp_path / "five.swp"), dims={"sequence": 5})
    assert "at --dim sequence=5: if a smaller size imports, a constant of the file" in err.value.hints[-1]


def test_folded_constants_of_every_folding_rule(tmp_path: Path) -> None:
    """Shape arithmetic through Constant, ConstantOfShape, Range, Expand, Where, Equal, Cast, ReduceProd,
    Min, Max, Transpose, Slice, Squeeze, Sub, Mul, Div, Neg, Sqrt and Identity, folded to a reshape and an
    embedding's weight-less index arithmetic."""
    nodes = [N("Constant", [], ["c4"], value=nh.from_array(np.array([4], np.int64))),
             N("Constant", [], ["cf"], value_float=2.0),
             N("ConstantOfShape", ["c4"], ["ones4"], value=nh.from_array(np.array([1], np.int64))),
             N("Range", ["z0", "z4", "z1"], ["rng"]), N("Expand", ["r1", "c4"], ["ex"]),
             N("Equal", ["rng", "rng"], ["eq"]), N("Where", ["eq", "ones4", "ex"], ["wh"]),
             N("Cast", ["wh"], ["wf"], to=T.FLOAT), N("ReduceProd", ["c4"], ["prod"], keepdims=1),
             N("Min", ["prod", "c4"], ["mn"]), N("Max", ["mn", "r1v"], ["mx"]),
             N("Transpose", ["mx"], ["tr"]), N("Slice", ["tr", "s0", "s1"], ["sl"]),
             N("Squeeze", ["sl"], ["sq"]), N("Sub", ["sq", "z1"], ["sb"]), N("Mul", ["sb", "z1"], ["ml"]),
             N("Div", ["ml", "z1"], ["dv"]), N("Neg", ["dv"], ["ng"]), N("Neg", ["ng"], ["pos"]),
             N("Identity", ["pos"], ["three"]), N("Sqrt", ["cf"], ["sqrt2"]),
             N("Unsqueeze", ["three", "axes0"], ["three1"]), N("Concat", ["minus1", "three1"], ["shape"], axis=0),
             N("Reshape", ["x", "shape"], ["xr"]), N("Mul", ["xr", "sqrt2"], ["y0"]),
             N("Reshape", ["y0", "back"], ["y"])]
    scalars = [nh.from_array(np.array(v, np.int64), f"z{v}") for v in (0, 1, 4)]
    inits = [*scalars, ints("r1", 1), ints("r1v", 1), ints("s0", 0), ints("s1", 1),
             ints("axes0", 0), ints("minus1", -1), ints("back", -1, 6)]
    path = save(tmp_path, nodes, [h.make_tensor_value_info("x", T.FLOAT, ["N", 2, 3])],
                [h.make_tensor_value_info("y", T.FLOAT, ["N", 6])], inits)
    x = RNG.standard_normal((4, 2, 3)).astype(np.float32)
    text = imported_matches_onnxruntime(tmp_path, path, {"x": x}, batch=4)
    assert "reshape(x, [2 * batch, 3])" in text


def test_computed_constants_and_chosen_weights_import_frozen(tmp_path: Path) -> None:
    """A constant the graph computes (here a Constant node) is no weight: `frozen`; so is a weight that
    `freeze` names; the others train."""
    table = nh.from_array(np.arange(6, dtype=np.float32).reshape(2, 3) / 10, "table")
    nodes = [N("Constant", [], ["offset"], value=table), N("Add", ["x", "offset"], ["h"]),
             N("MatMul", ["h", "fc.weight"], ["m"]), N("MatMul", ["m", "head.weight"], ["y"])]
    path = save(tmp_path, nodes, [h.make_tensor_value_info("x", T.FLOAT, [2, 3])],
                [h.make_tensor_value_info("y", T.FLOAT, [2, 2])], [weight("fc.weight", 3, 4), weight("head.weight", 4, 2)])
    m, r = swapdsl.import_onnx(path, str(tmp_path / "m.swp"), loss="mse", freeze=r"fc\..*")
    assert r.frozen == ("offset", "fc_weight") and m.graph.frozen == ("offset", "fc_weight")
    assert [p for p, _ in m.training.grads] == ["head_weight"]
    with pytest.raises(SwpError, match="not a regular expression"):
        swapdsl.import_onnx(path, str(tmp_path / "n.swp"), freeze="(")


def test_a_weight_that_is_not_finite_imports_with_a_note_and_an_initialiser_of_its_finite_values(
        tmp_path: Path) -> None:
    w = np.full((3, 2), 0.5, np.float32)
    w[0, 0] = np.nan
    path = save(tmp_path, [N("MatMul", ["x", "w"], ["y"])], [h.make_tensor_value_info("x", T.FLOAT, [4, 3])],
                [h.make_tensor_value_info("y", T.FLOAT, [4, 2])], [nh.from_array(w, "w")])
    m, r = swapdsl.import_onnx(path, str(tmp_path / "m.swp"))
    assert "param w: [3, 2] = constant(0.5)" in r.text
    assert r.notes[-1] == ("weight `w` holds 1 NaN or infinite value: --init refuses the weights file, so predict "
                           "and training from it stop; a mask of -inf works exported with "
                           "torch.finfo(torch.float32).min in its place")
    np.savez(tmp_path / "x.npz", x=np.ones((4, 3), np.float32))  # (what the note says)
    with pytest.raises(SwpError, match="not finite"):
        swapdsl.predict(str(tmp_path / "m.swp"), str(tmp_path / "x.npz"), init=str(tmp_path / "m.safetensors"))
    window = np.where(np.abs(np.subtract.outer(np.arange(3), np.arange(3))) < 2, 0, -np.inf).astype(np.float32)
    path = save(tmp_path, [N("Constant", [], ["m"], value=nh.from_array(window)), N("Add", ["x", "m"], ["y"])],
                [h.make_tensor_value_info("x", T.FLOAT, [3, 3])], [h.make_tensor_value_info("y", T.FLOAT, [3, 3])],
                [])  # (a computed constant, a window mask of -inf: it said nothing)
    _, r = swapdsl.import_onnx(path, str(tmp_path / "w.swp"))
    assert any(n.startswith("constant `m` holds 2 NaN or infinite values: --init refuses") for n in r.notes), r.notes


@pytest.mark.parametrize("kind", ["min", "inf", "zeros", "other"])
def test_an_added_mask_constant_becomes_causal_mask_or_nothing(tmp_path: Path, kind: str) -> None:
    """Hugging Face's additive masks: finfo.min (or -inf) above the diagonal is `causal_mask`, all zeros is
    nothing, bit for bit before the softmax; any other constant stays a frozen parameter."""
    above = np.triu(np.ones((5, 5), bool), 1)
    fill = {"min": np.finfo(np.float32).min, "inf": -np.inf, "zeros": 0.0, "other": -1.0}[kind]
    mask = np.where(above, fill, 0.0).astype(np.float32)[None, None]
    if kind == "other":
        mask[0, 0, 0, 0] = 0.5
    nodes = [N("Constant", [], ["mask"], value=nh.from_array(mask)), N("Add", ["x", "mask"], ["s"]),
             N("Softmax", ["s"], ["y"], axis=-1)]
    path = save(tmp_path, nodes, [h.make_tensor_value_info("x", T.FLOAT, ["N", 2, 5, 5])],
                [h.make_tensor_value_info("y", T.FLOAT, ["N", 2, 5, 5])], [])
    x = RNG.standard_normal((3, 2, 5, 5)).astype(np.float32)
    text = imported_matches_onnxruntime(tmp_path, path, {"x": x}, batch=3)
    expected = {"min": "causal_mask(x, fill = (-3.4028235e+38))", "inf": "causal_mask(x)", "zeros": "softmax(x)",
                "other": "param mask"}[kind]
    assert expected in text


@pytest.mark.parametrize("upper, k", [(0, 0), (1, 1), (0, -1), (1, -2)])
def test_trilu_of_a_constant_folds(tmp_path: Path, upper: int, k: int) -> None:
    """Trilu over a constant (the TorchScript exporter's causal mask for scaled_dot_product_attention) folds:
    with a row offset or without, upper or lower."""
    nodes = [N("Trilu", ["c", "k"], ["t"], upper=upper), N("Add", ["x", "t"], ["y"])]
    inits = [weight("c", 4, 4), ints("k", k)]
    path = save(tmp_path, [N("Constant", [], ["c"], value=inits[0])] + nodes,
                [h.make_tensor_value_info("x", T.FLOAT, ["N", 4, 4])],
                [h.make_tensor_value_info("y", T.FLOAT, ["N", 4, 4])], inits[1:])
    imported_matches_onnxruntime(tmp_path, path, {"x": RNG.standard_normal((3, 4, 4)).astype(np.float32)}, batch=3)


def test_a_weight_folded_with_constants_is_said_to_be_frozen(tmp_path: Path) -> None:
    """`x @ torch.tril(W)`: Trilu folds over the weight, so what the model reads is a frozen copy and W never
    trains; the import said nothing. A buffer folded into a mask that no parameter keeps says nothing."""
    nodes = [N("Trilu", ["w"], ["t"]), N("MatMul", ["x", "t"], ["y"])]
    path = save(tmp_path, nodes, [h.make_tensor_value_info("x", T.FLOAT, ["N", 4])],
                [h.make_tensor_value_info("y", T.FLOAT, ["N", 4])], [weight("w", 4, 4)])
    x = RNG.standard_normal((3, 4)).astype(np.float32)
    text = imported_matches_onnxruntime(tmp_path, path, {"x": x}, batch=3)
    _, r = swapdsl.import_onnx(path, str(tmp_path / "m.swp"))
    assert "param t: [4, 4] = " in text and "frozen" in text
    assert r.notes == ("`w` is read through Trilu with constants alone: `t` is a frozen copy of it, which training "
                       "does not change",), r.notes


def _sdpa_causal_mask(n: int) -> list:
    """The nodes PyTorch's TorchScript exporter writes for scaled_dot_product_attention(is_causal=True)'s
    mask over scores `s` [N, H, n, n]: ones of the scores' last two sizes, Trilu, 0 below and -inf above."""
    return [N("Shape", ["s"], ["shape"]), N("Slice", ["shape", "m2", "m1"], ["rows"]),
            N("Slice", ["shape", "m1", "big"], ["cols"]), N("Concat", ["rows", "cols"], ["size"], axis=0),
            N("Expand", ["one", "size"], ["ones"]),
            N("Trilu", ["ones"], ["tri"], upper=0), N("Equal", ["tri", "zero"], ["above"]),
            N("Where", ["above", "ninf", "zero"], ["mask"]), N("Add", ["s", "mask"], ["masked"]),
            N("Softmax", ["masked"], ["y"], axis=-1)]


@pytest.mark.parametrize("form", ["sdpa", "masked_fill", "masked_fill_kept", "not_causal", "fill_of_higher_rank"])
def test_causal_masks_as_pytorch_writes_them_become_causal_mask(tmp_path: Path, form: str) -> None:
    """scaled_dot_product_attention(is_causal=True) (Trilu, then an additive mask) and
    `s.masked_fill(tril == 0, fill)` (Where over a constant condition, the fill chosen where it holds or
    where it does not) import as `causal_mask`, as onnxruntime computes them; a condition that is not the
    upper triangle, or a fill of higher rank than the scores (the output would be of its rank), is refused."""
    n = 5
    tril = np.tril(np.ones((n, n), np.float32))[None, None]
    refused = form in ("not_causal", "fill_of_higher_rank")
    if form == "not_causal":
        tril[0, 0, 0, 1] = 1.0
    consts = [nh.from_array(a, name) for name, a in (
        ("one", np.array([1.0], np.float32)), ("zero", np.array([0.0], np.float32)),
        ("ninf", np.array([-np.inf], np.float32)), ("tril", tril),
        ("fill", np.array(-1e4, np.float32).reshape((1,) * (5 if form == "fill_of_higher_rank" else 0))))]
    if form == "sdpa":
        nodes = _sdpa_causal_mask(n)
    elif form == "masked_fill":
        nodes = [N("Equal", ["tril", "zero"], ["above"]), N("Where", ["above", "ninf", "s"], ["m"]),
                 N("Softmax", ["m"], ["y"], axis=-1)]
    else:
        nodes = [N("Equal", ["tril", "one"], ["kept"]), N("Where", ["kept", "s", "fill"], ["m"]),
                 N("Softmax", ["m"], ["y"], axis=-1)]
    nodes = [N("Constant", [], [c.name], value=c) for c in consts] + nodes
    path = save(tmp_path, nodes, [h.make_tensor_value_info("s", T.FLOAT, ["N", 2, n, n])],
                [h.make_tensor_value_info("y", T.FLOAT, ["N", 2, n, n])],
                [ints("m2", -2), ints("m1", -1), ints("big", 2**62)])
    feeds = {"s": RNG.standard_normal((3, 2, n, n)).astype(np.float32)}
    if refused:  # (a fill of rank 5 makes the output rank 5: not the scores' shape)
        with pytest.raises(SwpError, match="Where on tensors other than .* or a causal mask"):
            swapdsl.import_onnx(path, str(tmp_path / "m.swp"))
        return
    text = imported_matches_onnxruntime(tmp_path, path, feeds, batch=3)
    fill = ", fill = (-10000.0)" if form == "masked_fill_kept" else ""
    assert f"causal_mask(s{fill})" in text and "param" not in text, text


@pytest.mark.parametrize("stored", ["mask", "zeros"])
def test_a_causal_mask_stored_as_a_weight_is_causal_mask(tmp_path: Path, stored: str) -> None:
    """The TorchScript exporter stores `register_buffer("mask", triu(full(-1e30), 1))` as an initialiser: it
    was a trained parameter (initialised as noise of spread 1e30). A stored weight of zeros still trains."""
    n = 5
    value = np.where(np.triu(np.ones((n, n), bool), 1), -1e30, 0.0) if stored == "mask" else np.zeros((n, n))
    nodes = [N("Add", ["x", "m"], ["s"]), N("Softmax", ["s"], ["y"], axis=-1)]
    path = save(tmp_path, nodes, [h.make_tensor_value_info("x", T.FLOAT, ["N", 2, n, n])],
                [h.make_tensor_value_info("y", T.FLOAT, ["N", 2, n, n])], [nh.from_array(value.astype(np.float32), "m")])
    text = imported_matches_onnxruntime(tmp_path, path, {"x": RNG.standard_normal((3, 2, n, n)).astype(np.float32)},
                                        batch=3)
    if stored == "mask":
        assert "causal_mask(x, fill = (-1e+30))" in text and "param" not in text, text
    else:
        assert "param m: [5, 5] = zeros" in text and "s = x + m" in text, text


def test_an_added_mask_that_no_softmax_alone_reads_stays_an_addition(tmp_path: Path) -> None:
    """`causal_mask` sets the entries above the diagonal, so no gradient passes there; adding the mask passes
    it on. They train alike only where a softmax over the last axis is the sum's one reader."""
    mask = np.where(np.triu(np.ones((5, 5), bool), 1), -1e30, 0.0).astype(np.float32)[None, None]
    nodes = [N("Constant", [], ["mask"], value=nh.from_array(mask)), N("Add", ["x", "mask"], ["s"]),
             N("Softmax", ["s"], ["p"], axis=-1), N("Tanh", ["s"], ["q"]), N("Add", ["p", "q"], ["y"])]
    path = save(tmp_path, nodes, [h.make_tensor_value_info("x", T.FLOAT, ["N", 2, 5, 5])],
                [h.make_tensor_value_info("y", T.FLOAT, ["N", 2, 5, 5])], [])
    text = imported_matches_onnxruntime(tmp_path, path, {"x": RNG.standard_normal((3, 2, 5, 5)).astype(np.float32)},
                                        batch=3)
    assert "causal_mask" not in text and "s = x + mask" in text, text


@pytest.mark.parametrize("scale", [1.0, 2.0])
def test_hugging_faces_rotary_pattern_becomes_rope(tmp_path: Path, scale: float) -> None:
    """q * cos + rotate_half(q) * sin with the constant tables of base 10000 is `rope(x, base = 10000.0)`,
    its tables and slices left out; tables that are not rope's (scaled) keep the pattern as it is."""
    t, d = 5, 8
    angle = np.arange(t)[:, None] * 10000.0 ** (-2.0 * np.arange(d // 2) / d)
    cos, sin = (np.concatenate([f(angle)] * 2, axis=1).astype(np.float32)[None, None] * scale for f in (np.cos, np.sin))
    nodes = [N("Mul", ["x", "cos"], ["a"]), N("Slice", ["x", "h", "end", "last"], ["hi"]),
             N("Slice", ["x", "zero", "h", "last"], ["lo"]), N("Neg", ["hi"], ["nhi"]),
             N("Concat", ["nhi", "lo"], ["r"], axis=-1), N("Mul", ["r", "sin"], ["b"]), N("Add", ["a", "b"], ["y"])]
    inits = [nh.from_array(cos, "cos"), nh.from_array(sin, "sin"), ints("h", d // 2), ints("end", 2**62),
             ints("zero", 0), ints("last", -1)]
    nodes = [N("Constant", [], [i.name], value=i) for i in inits[:2]] + nodes
    path = save(tmp_path, nodes, [h.make_tensor_value_info("x", T.FLOAT, ["N", 2, t, d])],
                [h.make_tensor_value_info("y", T.FLOAT, ["N", 2, t, d])], inits[2:])
    x = RNG.standard_normal((3, 2, t, d)).astype(np.float32)
    text = imported_matches_onnxruntime(tmp_path, path, {"x": x}, batch=3)
    assert ("y = rope(x, base = 10000.0)" in text and "param" not in text) == (scale == 1.0)


def test_clip_as_relu6_and_with_either_bound(tmp_path: Path) -> None:
    """MobileNetV2's ReLU6 (Clip to [0, 6]), and Clip with only a lower or only an upper bound."""
    nodes = [N("Clip", ["x", "zero", "six"], ["a"]), N("Clip", ["x", "lo"], ["b"]), N("Clip", ["x", "", "hi"], ["c"]),
             N("Add", ["a", "b"], ["ab"]), N("Add", ["ab", "c"], ["y"])]
    inits = [nh.from_array(np.array(v, np.float32), n) for n, v in (("zero", 0), ("six", 6), ("lo", -1.5), ("hi", 2))]
    path = save(tmp_path, nodes, [h.make_tensor_value_info("x", T.FLOAT, ["N", 9])],
                [h.make_tensor_value_info("y", T.FLOAT, ["N", 9])], inits)
    x = (RNG.standard_normal((4, 9)) * 5).astype(np.float32)
    imported_matches_onnxruntime(tmp_path, path, {"x": x}, batch=4)


def test_exact_gelu_as_an_op_and_as_the_erf_formula(tmp_path: Path) -> None:
    """PyTorch's default GELU, exported as one Gelu node (opset 20) and as the Erf formula BERT's older
    exports write: both through `erf`, against onnxruntime."""
    nodes = [N("Gelu", ["x"], ["g"]), N("Div", ["g", "sqrt2"], ["s"]), N("Erf", ["s"], ["e"]),
             N("Add", ["e", "one"], ["e1"]), N("Mul", ["g", "e1"], ["m"]), N("Mul", ["m", "half"], ["y"])]
    inits = [nh.from_array(np.array(2 ** 0.5, np.float32), "sqrt2"), nh.from_array(np.array(1.0, np.float32), "one"),
             nh.from_array(np.array(0.5, np.float32), "half")]
    path = save(tmp_path, nodes, [h.make_tensor_value_info("x", T.FLOAT, ["N", 7])],
                [h.make_tensor_value_info("y", T.FLOAT, ["N", 7])], inits)
    x = (RNG.standard_normal((5, 7)) * 3).astype(np.float32)
    text = imported_matches_onnxruntime(tmp_path, path, {"x": x}, batch=5)
    assert "erf(x * 0.70710677)" in text and "erf(s)" in text


def test_the_dynamo_exporters_unoptimised_forms(tmp_path: Path) -> None:
    """The fuzzer's decoder seed (what `torch.onnx.export(dynamo=True, optimize=False)` writes): the tied
    token table is one parameter, the position table and the transposed weight train under their own
    names, and what the graph folds from the buffer (rotary factor, mask) is frozen."""
    path = seed_file(tmp_path, decoder_graph, "net")
    ids = RNG.integers(0, 10, (2, 5)).astype(np.int64)
    text = imported_matches_onnxruntime(tmp_path, path, {"ids": ids})
    m, r = swapdsl.import_onnx(path, str(tmp_path / "t.swp"), loss="cross_entropy")
    trained = [p for p, _ in m.training.grads]
    assert sorted(trained) == ["emb", "q_weight", "table", "types"], trained  # one token table; inv_freq folded
    assert "permute(q_weight, [1, 0])" in text and "reshape(table[:5], [1, 5, 4])" in text
    assert len(r.frozen) == 2, r.frozen  # the rotary factor and the mask: constants the graph computes


def test_equal_weights_an_exporter_shares_stay_apart_and_equal_constants_become_one(tmp_path: Path) -> None:
    """The TorchScript exporter stores equal initialisers once and names the others through Identity (every
    fresh batch norm's ones): each is still its own trained parameter. Equal constants the graph computes
    (each layer's causal mask) are one frozen parameter."""
    mask = nh.from_array(np.full((2, 3), 0.25, np.float32))
    nodes = [N("Identity", ["a.weight"], ["b.weight"]), N("MatMul", ["x", "a.weight"], ["h"]),
             N("MatMul", ["h", "b.weight"], ["k"]), N("Constant", [], ["m1"], value=mask),
             N("Constant", [], ["m2"], value=mask), N("Add", ["k", "m1"], ["k1"]), N("Add", ["k1", "m2"], ["y"])]
    path = save(tmp_path, nodes, [h.make_tensor_value_info("x", T.FLOAT, [2, 3])],
                [h.make_tensor_value_info("y", T.FLOAT, [2, 3])], [weight("a.weight", 3, 3)])
    imported_matches_onnxruntime(tmp_path, path, {"x": RNG.standard_normal((2, 3)).astype(np.float32)})
    m, r = swapdsl.import_onnx(path, str(tmp_path / "t.swp"), loss="mse")
    assert sorted(p for p, _ in m.training.grads) == ["a_weight", "b_weight"]
    assert r.frozen == ("m1",) and "k1 + m1" in r.text


@pytest.mark.parametrize("dynamo", [False, True])
def test_repeated_modules_fold_into_a_def_named_by_their_class(tmp_path: Path, dynamo: bool) -> None:
    """Three residual blocks of hidden widths 16, 16, 32, as either exporter names them: one def with the
    width as an argument, a call per block whose parameters are named by its module; it predicts as
    onnxruntime does, trains exactly as the flat import, and `flat` keeps one line per op."""
    path = tmp_path / "net.onnx"
    path.write_bytes(model_bytes(blocks_graph(np.random.default_rng(0), dynamo), "net"))
    x = RNG.standard_normal((6, 8)).astype(np.float32)
    text = imported_matches_onnxruntime(tmp_path, str(path), {"x": x}, batch=6)
    name = "residual" if dynamo else "block"
    assert f"def {name}(x, n1) {{" in text and f"layers_2 = {name}(layers_1, 32) as layers_2" in text
    flat = imported_matches_onnxruntime(tmp_path, str(path), {"x": x}, batch=6, flat=True)
    assert "def " not in flat
    np.savez(tmp_path / "train.npz", x=x, target=np.zeros((6, 3), np.float32))
    losses = []
    for kind in ("folded", "flat"):
        out = tmp_path / f"{kind}.swp"
        m, r = swapdsl.import_onnx(str(path), str(out), batch=6, loss="mse", flat=kind == "flat")
        if kind == "folded":
            assert "layers_1.fc2_weight" in r.params and "layers_1_fc2_weight" not in r.params
        run = swapdsl.execute(m, options=swapdsl.Options(steps=3, data=str(tmp_path / "train.npz"),
                                                         init=str(out.with_suffix(".safetensors"))))
        losses.append(list(run.losses))
    assert losses[0] == losses[1]


@pytest.mark.parametrize("ids, trained", [
    ([[0, 1, 2], [0, 1, 2]], True),  # positions, for a batch of 2
    ([[-1, -1, -1]], True),  # one row for all, counted from the end
    ([[2, 0, 1]], False),  # any other rows: a frozen copy, with a note
])
def test_a_weight_table_read_at_constant_rows(tmp_path: Path, ids: list, trained: bool) -> None:
    nodes = [N("Gather", ["table", "ids"], ["rows"]), N("Add", ["x", "rows"], ["y"])]
    ids_a = np.array(ids, np.int64)
    path = save(tmp_path, nodes, [h.make_tensor_value_info("x", T.FLOAT, list(ids_a.shape) + [4])],
                [h.make_tensor_value_info("y", T.FLOAT, list(ids_a.shape) + [4])],
                [weight("table", 3, 4), nh.from_array(ids_a, "ids")])
    x = RNG.standard_normal(ids_a.shape + (4,)).astype(np.float32)
    imported_matches_onnxruntime(tmp_path, path, {"x": x})
    m, r = swapdsl.import_onnx(path, str(tmp_path / "t.swp"), loss="mse")
    assert ([p for p, _ in m.training.grads] == ["table"]) == trained
    assert any("frozen copy" in n for n in r.notes) == (not trained)


def test_a_size_whose_name_starts_with_v_folds(tmp_path: Path) -> None:
    """A token of the text such as a size `vlen` is no local name of a def (it crashed the folding)."""
    nodes = []
    for i in range(2):
        where = f"/layers/layers.{i}"
        x = "x" if i == 0 else "/layers/layers.0/y"
        nodes += [N("MatMul", [x, f"w{i}"], [f"{where}/a"], name=f"{where}/fc/MatMul"),
                  N("Relu", [f"{where}/a"], [f"{where}/b"], name=f"{where}/act/Relu"),
                  N("Shape", [x], [f"{where}/s"], name=f"{where}/Shape"),
                  N("Gather", [f"{where}/s", "zero"], [f"{where}/n"], name=f"{where}/Gather"),
                  N("Unsqueeze", [f"{where}/n", "axes0"], [f"{where}/n1"], name=f"{where}/Unsqueeze"),
                  N("Concat", [f"{where}/n1", "minus1"], [f"{where}/t"], name=f"{where}/Concat", axis=0),
                  N("Reshape", [f"{where}/b", f"{where}/t"], [f"{where}/f"], name=f"{where}/Reshape"),
                  N("Reshape", [f"{where}/f", f"{where}/s"], [f"{where}/y"], name=f"{where}/Reshape_1")]
    path = save(tmp_path, nodes, [h.make_tensor_value_info("x", T.FLOAT, ["N", "vlen", 8])],
                [h.make_tensor_value_info("/layers/layers.1/y", T.FLOAT, ["N", "vlen", 8])],
                [weight("w0", 8, 8), weight("w1", 8, 8), nh.from_array(np.array(0, np.int64), "zero"),
                 ints("axes0", 0), ints("minus1", -1)])
    x = RNG.standard_normal((2, 3, 8)).astype(np.float32)
    text = imported_matches_onnxruntime(tmp_path, path, {"x": x}, batch=2, dims={"vlen": 3})
    assert "def block(x, batch, vlen)" in text


def test_a_static_exports_batch_stays_a_number_with_no_argument_and_another_batch_is_refused(
        tmp_path: Path) -> None:
    """A static export reshapes to [2, 8]: the model kept a `batch = 2` argument that changed nothing, and
    --batch 4 failed at the reshape with no word of why."""
    nodes = [N("MatMul", ["x", "w"], ["a"], name="/fc/MatMul"), N("Reshape", ["a", "to"], ["y"], name="/Reshape")]
    path = save(tmp_path, nodes, [h.make_tensor_value_info("x", T.FLOAT, [2, 4, 2])],
                [h.make_tensor_value_info("y", T.FLOAT, [2, 8])], [weight("w", 2, 2), ints("to", 2, 8)])
    x = RNG.standard_normal((2, 4, 2)).astype(np.float32)
    text = imported_matches_onnxruntime(tmp_path, path, {"x": x})
    assert "model net() {" in text and "input x: f32[2, 4, 2]" in text
    np.savez(tmp_path / "five.npz", x=RNG.standard_normal((5, 4, 2)).astype(np.float32))
    with pytest.raises(SwpError, match=r"the data's last 1 examples make a partial batch, and the model has no "
                                       r"`batch` argument to run them at: its batch is fixed at 2"):
        swapdsl.predict(str(tmp_path / "model.swp"), str(tmp_path / "five.npz"),
                        init=str(tmp_path / "model.safetensors"))
    with pytest.raises(SwpError, match=r"--batch 4: the file fixes the batch at 2 \(its shape arithmetic"):
        swapdsl.import_onnx(path, str(tmp_path / "four.swp"), batch=4)
    assert not (tmp_path / "four.swp").exists()


def test_the_tests_cover_the_whole_table() -> None:
    seeds = [build(np.random.default_rng(0))[0] for build in (cnn_graph, attention_graph, decoder_graph)]
    covered = {n.op_type for nodes in seeds for n in nodes} | {
        "Conv", "BatchNormalization", "Relu", "MaxPool", "Shape", "Gather", "Unsqueeze", "Concat", "Reshape",
        "Gemm", "LeakyRelu", "Sigmoid", "AveragePool", "Tanh", "HardSwish", "HardSigmoid", "Reciprocal", "IsNaN", "GlobalAveragePool", "Flatten", "Constant",
        "ConstantOfShape", "Range", "Expand", "Where", "Equal", "Cast", "ReduceProd", "Min", "Max", "Transpose",
        "Slice", "Squeeze", "Sub", "Mul", "Div", "Neg", "Sqrt", "Identity", "Erf", "Gelu", "Clip",
        "Trilu"}  # (and the seeds')
    assert set(RULES) | set(FOLD) <= covered


def test_an_imported_model_trains_from_its_weights(tmp_path: Path) -> None:
    """Targets 0.1 above the ONNX model's own outputs: the first step's loss is exactly 0.01 (the weights
    came across), and training with a loss and an optimiser from the command line brings it down."""
    nodes = [N("Gemm", ["x", "w1", "b1"], ["h"], transB=1), N("Relu", ["h"], ["r"]),
             N("MatMul", ["r", "w2"], ["y"])]
    inits = [weight("w1", 16, 6), weight("b1", 16), weight("w2", 16, 3)]
    path = save(tmp_path, nodes, [h.make_tensor_value_info("x", T.FLOAT, ["N", 6])],
                [h.make_tensor_value_info("y", T.FLOAT, ["N", 3])], inits)
    x = RNG.standard_normal((32, 6)).astype(np.float32)
    y = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.savez(tmp_path / "data.npz", x=x, target=y + np.float32(0.1))
    m, _ = swapdsl.import_onnx(path, str(tmp_path / "mlp.swp"), batch=8, loss="mse", optimizer="adam(lr = 1e-2)")
    run = swapdsl.execute(m, options=swapdsl.Options(steps=40, data=str(tmp_path / "data.npz"),
                                                     init=str(tmp_path / "mlp.safetensors")))
    assert run.losses[0] == pytest.approx(0.01, rel=1e-4)
    assert run.losses[-1] < 0.5 * run.losses[0]


@pytest.mark.parametrize("case, message", [
    ("einsum", "not in swapdsl's import table"),
    ("gelu_other", "GELU is exact (none) or tanh"),
    ("asymmetric", "same padding on both sides"),
    ("symbol", "give it a value"),
    ("opset", "opset 11"),
])
def test_what_cannot_be_imported_is_named(tmp_path: Path, case: str, message: str) -> None:
    x = h.make_tensor_value_info("x", T.FLOAT, [2, 3, 4, 4] if case == "asymmetric" else [2, 3])
    y = h.make_tensor_value_info("y", T.FLOAT, ["a", "b", "c", "d"][:4 if case == "asymmetric" else 2])
    node = {"einsum": N("Einsum", ["x"], ["y"], equation="ij->ij", name="/mlp/act/Einsum"),
            "gelu_other": N("Gelu", ["x"], ["y"], approximate="fast"),
            "asymmetric": N("MaxPool", ["x"], ["y"], kernel_shape=[2, 2], pads=[0, 0, 1, 1]),
            "symbol": N("Relu", ["x"], ["y"]),
            "opset": N("Relu", ["x"], ["y"])}[case]
    if case == "symbol":
        x = h.make_tensor_value_info("x", T.FLOAT, ["N", "features"])
    path = save(tmp_path, [node], [x], [y], [], opset=11 if case == "opset" else 20)
    with pytest.raises(SwpError, match=message.replace("(", r"\(").replace(")", r"\)")) as info:
        swapdsl.import_onnx(path, str(tmp_path / "out.swp"))
    if case == "einsum":
        assert "/mlp/act/Einsum" in info.value.message
    assert not (tmp_path / "out.swp").exists() and not (tmp_path / "out.safetensors").exists()


@pytest.mark.parametrize("extra, message", [
    (["--loss", "mse", "--optimizer", "bogus(lr = 1)"], "no optimiser `bogus`"),
    (["--optimizer", "adam(lr = 1e-3)"], "give --loss too"),
    (["--dim", "batch=4"], "give it with --batch"),
    (["--dim", "sequence=4"], "no symbolic size of that name"),
    (["--loss", "mse", "--optimizer", "sgd(lr = 1)\nreport x = 1"], "not one optimiser call"),
    (["--freeze", "("], "not a regular expression"),
    (["--loss", "cross_entropy", "--optimizer", "adam(lr = -1)"], "error: --optimizer `adam(lr = -1)`: optimizer "
                                                                  "`adam`: `lr` must be positive, got -1.0\n"),
    (["--loss", "cross_entropy", "--optimizer", "sgd(lr = 1, beta = 2)"], "--optimizer `sgd(lr = 1, beta = 2)`: "),
])
def test_a_bad_import_command_line_is_refused_with_nothing_written(tmp_path: Path, extra: list[str],
                                                                  message: str) -> None:
    from swapdsl.fuzz import run_cli

    out = tmp_path / "m.swp"
    run = run_cli(["import", str(Path(__file__).parents[1] / "examples" / "digits_cnn.onnx"), "-o", str(out), *extra])
    assert run.code == 2 and run.err.startswith("error: ") and message in run.err, run.err or run.crash
    assert not out.exists() and not out.with_suffix(".safetensors").exists()


@pytest.mark.parametrize("where, message", [("/dev/null", "is not a regular file"),
                                             (".", "is a directory, not an ONNX file"),
                                             ("missing.onnx", ": no such ONNX file")])
def test_an_onnx_path_that_is_no_file_says_what_it_is(tmp_path: Path, where: str, message: str) -> None:
    """`/dev/null` was "no such ONNX file"."""
    from swapdsl.fuzz import run_cli

    source = where if where.startswith("/") else str(tmp_path / where)
    run = run_cli(["import", source, "-o", str(tmp_path / "m.swp")])
    assert run.code == 2 and run.err.startswith("error: `") and message in run.err, run.err or run.crash
    assert not (tmp_path / "m.swp").exists()


def test_a_freeze_pattern_that_matches_nothing_is_said(tmp_path: Path) -> None:
    _, r = swapdsl.import_onnx(str(Path(__file__).parents[1] / "examples" / "digits_cnn.onnx"),
                               str(tmp_path / "m.swp"), freeze="nomatch")
    assert "--freeze `nomatch` matched no parameter" in r.notes and not r.frozen


@pytest.mark.parametrize("form", ["sdpa", "masked_fill"])
def test_nanogpts_causal_attention_imports_from_pytorch(tmp_path: Path, form: str) -> None:
    """nanoGPT's attention as `torch.onnx.export(dynamo=False)` writes it, through
    F.scaled_dot_product_attention(is_causal=True) and through masked_fill with a lower-triangular buffer
    (both were refused: Trilu, Where): `causal_mask`, the buffer left out, and the logits PyTorch's."""
    torch = pytest.importorskip("torch")

    class Attention(torch.nn.Module):
        def __init__(self, d: int = 16, heads: int = 2, t: int = 8) -> None:
            super().__init__()
            self.qkv, self.heads = torch.nn.Linear(d, 3 * d), heads
            self.register_buffer("bias", torch.tril(torch.ones(t, t)).view(1, 1, t, t))

        def forward(self, x):  # noqa: ANN001, ANN202
            b, t, c = x.shape
            q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in self.qkv(x).split(c, 2))
            if form == "sdpa":
                y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            else:
                a = (q @ k.transpose(-2, -1)) * (1.0 / (k.size(-1) ** 0.5))
                y = torch.softmax(a.masked_fill(self.bias[:, :, :t, :t] == 0, float("-inf")), dim=-1) @ v
            return y.transpose(1, 2).reshape(b, t, c)

    torch.manual_seed(0)
    net, x = Attention().eval(), torch.randn(3, 8, 16)
    path = str(tmp_path / "attn.onnx")
    torch.onnx.export(net, (x,), path, input_names=["x"], output_names=["y"], dynamo=False, opset_version=17,
                      dynamic_axes={"x": {0: "batch"}})
    text = imported_matches_onnxruntime(tmp_path, path, {"x": x.numpy()}, batch=3)
    assert "causal_mask(" in text and "frozen" not in text, text
    _, r = swapdsl.import_onnx(path, str(tmp_path / "again.swp"))  # (qkv's weight, transposed by the exporter)
    assert any(n.startswith("1 weight (`onnx::MatMul_") and "do_constant_folding=False" in n for n in r.notes), r.notes
    ours = swapdsl.predict(str(tmp_path / "model.swp"), str(tmp_path / "feeds.npz"),
                           init=str(tmp_path / "model.safetensors"))["y"]
    np.testing.assert_allclose(ours, net(x).detach().numpy(), rtol=1e-5, atol=1e-6)


def test_a_bf16_export_keeps_its_causal_mask_and_says_it_trains_in_bf16(tmp_path: Path) -> None:
    """A bf16 export's additive mask (-1e30 above the diagonal, in bf16) became a frozen parameter with a
    meaningless initialiser, and nothing said that bf16 weights train without f32 master copies."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    n = 5
    mask = np.where(np.triu(np.ones((n, n), bool), 1), -1e30, 0.0).astype(ml_dtypes.bfloat16)[None, None]
    w = (RNG.standard_normal((n, n)) * 0.3).astype(ml_dtypes.bfloat16)
    nodes = [N("Constant", [], ["mask"], value=nh.from_array(mask)), N("MatMul", ["x", "w"], ["s"]),
             N("Add", ["s", "mask"], ["m"]), N("Softmax", ["m"], ["y"], axis=-1)]
    path = save(tmp_path, nodes, [h.make_tensor_value_info("x", T.BFLOAT16, ["N", 2, n, n])],
                [h.make_tensor_value_info("y", T.BFLOAT16, ["N", 2, n, n])], [nh.from_array(w, "w")])
    _, r = swapdsl.import_onnx(path, str(tmp_path / "m.swp"))
    assert "m = causal_mask(s, fill = (-1.00025555e+30))" in r.text and "frozen" not in r.text, r.text
    assert r.notes == ("the weights are bf16: the model trains in bf16 throughout (its parameters and optimiser "
                       "state too); for f32 master weights, import with --f32 (the weights widened exactly) and plan "
                       "with --precision bf16",)


def _half_and_wide(tmp_path: Path, half: int) -> tuple[str, str]:
    """One network written twice: in f32 with weights that ``half`` (ONNX's FLOAT16 or BFLOAT16) holds
    exactly, and in that half type (its input, weights, a Constant and a Cast to it)."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    np_half = {T.FLOAT16: np.float16, T.BFLOAT16: ml_dtypes.bfloat16}[half]
    w = (RNG.standard_normal((6, 4)) * 0.3).astype(np_half)
    paths = []
    for elem, dtype in ((T.FLOAT, np.float32), (half, np_half)):
        scale = nh.from_array(np.array(0.5, dtype), "scale")
        nodes = [N("Constant", [], ["scale"], value=scale), N("MatMul", ["x", "w"], ["h"]),
                 N("Mul", ["h", "scale"], ["s"]), N("Cast", ["s"], ["c"], to=elem), N("Relu", ["c"], ["y"])]
        paths.append(save(tmp_path, nodes, [h.make_tensor_value_info("x", elem, ["N", 6])],
                          [h.make_tensor_value_info("y", elem, ["N", 4])], [nh.from_array(w.astype(dtype), "w")],
                          name=f"net{elem}"))
    return paths[0], paths[1]


@pytest.mark.parametrize("half", [T.BFLOAT16, T.FLOAT16])
def test_a_half_export_imports_with_f32_as_the_f32_export_does(tmp_path: Path, half: int) -> None:
    """`import --f32`: weights, inputs, constants and casts of a bf16 (f16) export widened exactly, so the
    model is the f32 export's, line for line and value for value; without it, the half model and its note."""
    wide, narrow = _half_and_wide(tmp_path, half)
    _, ref = swapdsl.import_onnx(wide, str(tmp_path / "a.swp"))
    _, got = swapdsl.import_onnx(narrow, str(tmp_path / "b.swp"), f32=True)
    body = [line.replace(f"net{half}", "net1") for line in got.text.splitlines()[1:]]
    assert body == ref.text.splitlines()[1:] and got.notes == () and "f32[batch, 6]" in got.text, got.text
    assert all(np.array_equal(ref.params[k], got.params[k]) and got.params[k].dtype == np.float32 for k in ref.params)
    _, kept = swapdsl.import_onnx(narrow, str(tmp_path / "c.swp"))
    label = "bf16" if half == T.BFLOAT16 else "f16"
    assert f"param w: {label}[6, 4]" in kept.text and kept.notes[0].startswith(f"the weights are {label}")


def test_repeated_modules_of_one_name_in_two_layers_are_named_by_their_paths(tmp_path: Path) -> None:
    """Linear layers `wq` and `wo` in `layers.0` and `layers.1` (the layers themselves unalike, so only the
    linears fold): each call and its weights named by the module's whole path, as PyTorch names them; the
    weights were named `wq.layers_0_wq_weight`, `wq_2.layers_0_wq_weight` (layers.1.wq), `wo.layers_0_wq_weight`."""
    torch = pytest.importorskip("torch")

    class Layer(torch.nn.Module):
        def __init__(self, first: bool) -> None:
            super().__init__()
            self.first, self.wq, self.wo = first, torch.nn.Linear(16, 16), torch.nn.Linear(16, 16)

        def forward(self, x):  # noqa: ANN001, ANN202
            h = self.wo(torch.relu(self.wq(x)))
            return x + (torch.tanh(h) if self.first else h)

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers, self.head = torch.nn.ModuleList([Layer(True), Layer(False)]), torch.nn.Linear(16, 10)

        def forward(self, x):  # noqa: ANN001, ANN202
            for layer in self.layers:
                x = layer(x)
            return self.head(x)

    torch.manual_seed(0)
    net, x = Net().eval(), torch.randn(4, 8, 16)
    path = str(tmp_path / "net.onnx")
    torch.onnx.export(net, (x,), path, input_names=["x"], output_names=["logits"], dynamo=False,
                      do_constant_folding=False)
    imported_matches_onnxruntime(tmp_path, path, {"x": x.numpy()}, batch=4)
    from safetensors.numpy import load_file

    weights = load_file(tmp_path / "model.safetensors")
    theirs = {k.replace(".", "_").rsplit("_", 1)[0] + "." + k.rsplit(".", 1)[1]: v.detach().numpy()
              for k, v in net.state_dict().items()}  # (layers.1.wq.weight -> layers_1_wq.weight)
    assert sorted(weights) == sorted(theirs)
    for k, v in theirs.items():
        np.testing.assert_array_equal(weights[k], v)


@pytest.mark.parametrize("optimised", [True, False])
def test_an_export_whose_optimiser_rewrote_its_weights_is_said_to_train_unlike_pytorch(tmp_path: Path,
                                                                                       optimised: bool) -> None:
    """torch.onnx.export(dynamo=True)'s default optimiser merges equal weights (two norms' ones into one) and
    folds a transposed weight into an unnamed copy (`val_6`): it predicts right and trains wrong, and the
    import said nothing. A tied weight alone (its second name missing, no unnamed copy) is no such export."""
    signature = "\n".join(f"p_{k.replace('.', '_')}: PARAMETER target='{k}'"
                          for k in ("emb.weight", "n1.weight", "n2.weight", "fc.weight")) + "\nx: USER_INPUT"
    fc = weight("val_6" if optimised else "fc.weight", 4, 4)
    nodes = [N("Mul", ["x", "n1.weight"], ["a"]), N("MatMul", ["a", fc.name], ["b"]),
             N("Mul", ["b", "n1.weight" if optimised else "n2.weight"], ["y"])]
    inits = [weight("n1.weight", 4), fc] + ([] if optimised else [weight("n2.weight", 4)])
    g = h.make_graph(nodes, "net", [h.make_tensor_value_info("x", T.FLOAT, [2, 4])],
                     [h.make_tensor_value_info("y", T.FLOAT, [2, 4])], inits)
    h.set_metadata_props(g, {"pkg.torch.export.ExportedProgram.graph_signature": signature})
    path = tmp_path / "net.onnx"
    onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 20)], ir_version=9), str(path))
    _, r = swapdsl.import_onnx(str(path), str(tmp_path / "t.swp"))
    said = [n for n in r.notes if n.startswith("the exporter's optimiser rewrote this file's weights (1 its "
                                                 "signature does not name, `val_6`; equal ones merged)")]
    assert len(said) == (1 if optimised else 0) and all("optimize=False" in n for n in said), r.notes


@pytest.mark.parametrize("training", [True, False])
def test_dropout_exported_in_train_mode_is_dropout(tmp_path: Path, training: bool) -> None:
    """A model exported in `train()` writes Dropout(ratio, training_mode=True) (TorchScript's with a mask
    output nothing reads): the dynamo form imported as the input itself, in silence, and trained without
    dropout; TorchScript's was refused. Now `dropout(p = ratio)` (off in prediction, as in eval()); in
    inference form, still the input."""
    nodes = [N("MatMul", ["x", "w"], ["a"]), N("Dropout", ["a", "ratio", "mode"], ["y", "unread"])]
    inits = [weight("w", 3, 3), nh.from_array(np.array(0.25, np.float32), "ratio"),
             nh.from_array(np.array(training), "mode")]
    path = save(tmp_path, nodes, [h.make_tensor_value_info("x", T.FLOAT, [4, 3])],
                [h.make_tensor_value_info("y", T.FLOAT, [4, 3])], inits)
    m, r = swapdsl.import_onnx(path, str(tmp_path / "m.swp"), loss="mse")
    assert ("dropout(" in r.text and "p = 0.25)" in r.text) == training, r.text
    x = RNG.standard_normal((4, 3)).astype(np.float32)
    np.savez(tmp_path / "x.npz", x=x)
    out = swapdsl.predict(str(tmp_path / "m.swp"), str(tmp_path / "x.npz"), init=str(tmp_path / "m.safetensors"))
    w = nh.to_array(inits[0])
    np.testing.assert_allclose(out["y"], x @ w, rtol=1e-6)  # (prediction: no dropout, either way)


@pytest.mark.parametrize("fill", [np.finfo(np.float32).min, -1e9, -65504.0, -1e4, -0.5])
def test_a_mask_buffer_stored_as_a_weight_imports_frozen(tmp_path: Path, fill: float) -> None:
    """The TorchScript exporter stores a window mask buffer (finfo.min, -1e9 or f16's lowest outside the
    window) as a weight: it trained, its zeros moving with the gradients. A weight of ordinary values added
    there (a learned bias, -1e4 at the most) still trains."""
    keep = np.abs(np.subtract.outer(np.arange(4), np.arange(4))) < 2
    mask = nh.from_array(np.where(keep, 0, fill).astype(np.float32), "mask")
    nodes = [N("Add", ["x", "mask"], ["s"]), N("Softmax", ["s"], ["y"], axis=-1)]
    path = save(tmp_path, nodes, [h.make_tensor_value_info("x", T.FLOAT, [2, 4, 4])],
                [h.make_tensor_value_info("y", T.FLOAT, [2, 4, 4])], [mask])
    imported_matches_onnxruntime(tmp_path, path, {"x": RNG.standard_normal((2, 4, 4)).astype(np.float32)})
    m, r = swapdsl.import_onnx(path, str(tmp_path / "t.swp"), loss="mse")
    frozen = fill <= -6e4
    assert (r.frozen == ("mask",)) == frozen and bool(m.training.grads) != frozen, (r.frozen, r.text)
    assert any(n.startswith("weight `mask` (values of ") for n in r.notes) == frozen, r.notes


def test_a_mask_weight_another_op_reads_first_is_not_said_frozen(tmp_path: Path) -> None:
    """A weight read first by an op that is no softmax's score: it trains, and no note says it is frozen
    (one said so while the parameter, made at the first reader, trained)."""
    mask = nh.from_array(np.where(np.eye(4, dtype=bool), 0, np.finfo(np.float32).min).astype(np.float32), "mask")
    nodes = [N("Add", ["x", "mask"], ["a"]), N("Relu", ["a"], ["r"]), N("Mul", ["x", "x"], ["xx"]),
             N("Add", ["xx", "mask"], ["s"]), N("Softmax", ["s"], ["p"], axis=-1), N("Add", ["r", "p"], ["y"])]
    path = save(tmp_path, nodes, [h.make_tensor_value_info("x", T.FLOAT, [2, 4, 4])],
                [h.make_tensor_value_info("y", T.FLOAT, [2, 4, 4])], [mask])
    _, r = swapdsl.import_onnx(path, str(tmp_path / "t.swp"), loss="mse")
    assert r.frozen == () and not any("imported frozen" in n for n in r.notes), r.notes


def test_a_batch_symbol_after_the_first_axis_needs_no_dim(tmp_path: Path) -> None:
    """An input of [sequence, batch, 4] imported with no --dim (as before --dim's names were checked
    first: it then asked for `--dim batch`, which --dim refuses)."""
    path = save(tmp_path, [N("Relu", ["x"], ["y"])], [h.make_tensor_value_info("x", T.FLOAT, ["sequence", "batch", 4])],
                [h.make_tensor_value_info("y", T.FLOAT, ["sequence", "batch", 4])], [])
    m, _ = swapdsl.import_onnx(path, str(tmp_path / "t.swp"))
    assert m.graph.type_of(m.graph.inputs[0]).shape[2] == 4
