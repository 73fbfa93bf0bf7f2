"""Mutated ONNX files for `swapdsl import`, and the verdict on each.

Two small models built with ``onnx.helper`` (a convolutional net with batch norm and the exporter's
shape arithmetic; an attention block over token ids with symbolic batch and sequence) are the seeds.
Each case changes one: its bytes (a flipped bit, a cut, an insertion, an overwritten run) or its graph
as an adversary would (an attribute set to an odd value, an op type swapped, an input rewired, a node
removed, an input's size or the opset changed). The import must end with exit 2, one ``error:`` line and
nothing written, or with exit 0 and a model whose forward pass equals onnxruntime's on the same file
wherever onnxruntime runs it.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import attrs
import numpy as np

from swapdsl.fuzz import run_cli

KINDS = ("flip", "cut", "insert", "overwrite", "attribute", "op_type", "input", "remove", "dims", "opset")
VERDICTS = ("ok", "refused", "crash", "hang", "wrong", "litter")
TIME_LIMIT_S = 30.0
_ODD_INTS = [-1, 0, 1, 2, 3, 7, 2**31, 2**62, -(2**62)]
_ODD_FLOATS = [float("nan"), float("inf"), -1.0, 0.0, 1e30]
_ODD_STRINGS = ["SAME_UPPER", "VALID", "none", "tanh", "bogus", ""]
_OPS = ["Relu", "Conv", "Gemm", "MatMul", "Reshape", "Softmax", "Erf", "If", "Bogus", "Add", "Slice", "Gather",
        "BatchNormalization", "LayerNormalization", "Transpose", "Concat", "Split", "MaxPool", "Shape", "Cast",
        "CastLike", "SplitToSequence", "SequenceAt", "CumSum", "GatherND", "Not", "Cos", "Trilu", "Where"]


@attrs.frozen
class Case:
    seed: str
    kind: str
    what: str


@attrs.frozen
class Verdict:
    verdict: str
    detail: str = ""


# ---- the seeds ----------------------------------------------------------------------------------


def _weight(rng: np.random.Generator, name: str, *shape: int, low: float | None = None) -> Any:
    from onnx import numpy_helper

    a = rng.uniform(low, 1.5, shape) if low is not None else rng.standard_normal(shape) * 0.3
    return numpy_helper.from_array(a.astype(np.float32), name)


def _ints(name: str, *values: int, scalar: bool = False) -> Any:
    from onnx import numpy_helper

    return numpy_helper.from_array(np.array(values[0] if scalar else values, np.int64), name)


def cnn_graph(rng: np.random.Generator) -> tuple[list, list, list, list]:
    """Conv with bias, batch norm, ReLU, max pooling, the exporter's flatten arithmetic, a Gemm."""
    from onnx import TensorProto as T
    from onnx import helper as h

    nodes = [h.make_node("Conv", ["x", "conv1.weight", "conv1.bias"], ["/conv1/Conv_output_0"], name="/conv1/Conv",
                         pads=[1, 1, 1, 1]),
             h.make_node("BatchNormalization", ["/conv1/Conv_output_0", "bn1.weight", "bn1.bias", "bn1.running_mean",
                                                "bn1.running_var"], ["bn"], epsilon=1e-3),
             h.make_node("Relu", ["bn"], ["r"]),
             h.make_node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
             h.make_node("Shape", ["p"], ["s"]), h.make_node("Gather", ["s", "zero"], ["n"], axis=0),
             h.make_node("Unsqueeze", ["n", "axes0"], ["n1"]),
             h.make_node("Concat", ["n1", "minus1"], ["target_shape"], axis=0),
             h.make_node("Reshape", ["p", "target_shape"], ["flat"]),
             h.make_node("Gemm", ["flat", "fc.weight", "fc.bias"], ["logits"], transB=1)]
    inits = [_weight(rng, "conv1.weight", 4, 3, 3, 3), _weight(rng, "conv1.bias", 4),
             _weight(rng, "bn1.weight", 4, low=0.5), _weight(rng, "bn1.bias", 4), _weight(rng, "bn1.running_mean", 4),
             _weight(rng, "bn1.running_var", 4, low=0.5), _ints("zero", 0, scalar=True), _ints("axes0", 0),
             _ints("minus1", -1), _weight(rng, "fc.weight", 5, 64), _weight(rng, "fc.bias", 5)]
    return (nodes, [h.make_tensor_value_info("x", T.FLOAT, ["N", 3, 8, 8])],
            [h.make_tensor_value_info("logits", T.FLOAT, ["N", 5])], inits)


def attention_graph(rng: np.random.Generator) -> tuple[list, list, list, list]:
    """Embedding, layer norm, two-head attention with the exporter's shape arithmetic, an RMS-norm
    pattern, GELU (tanh), split, concat, slice, casts, a last-token index and the heads' sum."""
    from onnx import TensorProto as T
    from onnx import helper as h

    n, d = h.make_node, 8
    nodes = [n("Gather", ["wte", "ids"], ["e"], axis=0),
             n("LayerNormalization", ["e", "ln.weight", "ln.bias"], ["ln"], axis=-1, epsilon=1e-5),
             n("MatMul", ["ln", "qkv.weight"], ["qkv0"]), n("Add", ["qkv0", "qkv.bias"], ["qkv"]),
             n("Split", ["qkv", "thirds"], ["q", "k", "v"], axis=2),
             n("Shape", ["q"], ["qs"]), n("Slice", ["qs", "s0", "s2"], ["bt"]),
             n("Concat", ["bt", "hd"], ["split_heads"], axis=0)]
    for t in "qkv":
        nodes += [n("Reshape", [t, "split_heads"], [f"{t}r"]), n("Transpose", [f"{t}r"], [f"{t}h"], perm=[0, 2, 1, 3])]
    nodes += [n("Transpose", ["kh"], ["kt"], perm=[0, 1, 3, 2]), n("MatMul", ["qh", "kt"], ["att0"]),
              n("Div", ["att0", "sqrt_d"], ["att1"]), n("Softmax", ["att1"], ["att"], axis=-1),
              n("MatMul", ["att", "vh"], ["o"]), n("Transpose", ["o"], ["ot"], perm=[0, 2, 1, 3]),
              n("Reshape", ["ot", "merge"], ["m"]), n("Gelu", ["m"], ["gl"], approximate="tanh"),
              n("Pow", ["gl", "two"], ["sq"]), n("ReduceMean", ["sq", "last"], ["ms"], keepdims=1),
              n("Add", ["ms", "eps"], ["mse"]), n("Sqrt", ["mse"], ["rms"]), n("Div", ["gl", "rms"], ["normed"]),
              n("Mul", ["normed", "rms.weight"], ["rn"]), n("Sub", ["rn", "e"], ["res"]),
              n("Slice", ["res", "s0", "s4", "last", "s2"], ["sl"]),
              n("Concat", ["sl", "sl"], ["cat"], axis=-1), n("Exp", ["cat"], ["ex"]), n("Log", ["ex"], ["lg"]),
              n("Neg", ["lg"], ["ng"]), n("Identity", ["ng"], ["idt"]), n("Dropout", ["idt"], ["dr"]),
              n("Cast", ["dr"], ["c64"], to=T.DOUBLE), n("Cast", ["c64"], ["c32"], to=T.FLOAT),
              n("Unsqueeze", ["c32", "one"], ["u"]), n("Squeeze", ["u", "one"], ["sqz"]),
              n("Gather", ["sqz", "minus1"], ["lastok"], axis=1), n("LogSoftmax", ["lastok"], ["out1"], axis=-1),
              n("ReduceSum", ["att", "one"], ["heads_sum"], keepdims=0)]
    scalar = [_ints("minus1", -1, scalar=True)]
    inits = [_weight(rng, "wte", 11, d), _weight(rng, "ln.weight", d, low=0.5), _weight(rng, "ln.bias", d),
             _weight(rng, "qkv.weight", d, 3 * d), _weight(rng, "qkv.bias", 3 * d), _ints("thirds", d, d, d),
             _ints("s0", 0), _ints("s2", 2), _ints("s4", 4), _ints("hd", 2, d // 2), _ints("merge", 0, 0, d),
             _float("sqrt_d", 2.0), _float("two", 2.0), _ints("last", -1), _float("eps", 1e-6),
             _weight(rng, "rms.weight", d, low=0.5), _ints("one", 1), *scalar]
    return (nodes, [h.make_tensor_value_info("ids", T.INT64, ["batch_size", "sequence"])],
            [h.make_tensor_value_info("out1", T.FLOAT, ["batch_size", 4]),
             h.make_tensor_value_info("heads_sum", T.FLOAT, ["batch_size", 5, 5])], inits)


def decoder_graph(rng: np.random.Generator) -> tuple[list, list, list, list, dict[str, str]]:
    """What `torch.onnx.export(dynamo=True, optimize=False)` writes for a decoder: a token table used again,
    transposed, by the head (tied); a position table read at Range's rows; a token-type table read at one
    row for all (BERT's); a weight transposed for its MatMul; rotary tables and a mask folded from a
    buffer (so named by the graph signature) through CastLike, Cos, Sin, Pow, Reciprocal, CumSum,
    comparisons, And, Or, Not, IsNaN, GatherElements and GatherND; torch.split as SplitToSequence and
    SequenceAt."""
    from onnx import TensorProto as T
    from onnx import helper as h
    from onnx import numpy_helper as nh

    n, f = h.make_node, np.float32
    nodes = [n("Gather", ["emb", "ids"], ["e"]), n("Range", ["z0", "z5", "z1"], ["pos"]),
             n("Unsqueeze", ["pos", "ax0"], ["pos2"]), n("Gather", ["table", "pos2"], ["p"]), n("Add", ["e", "p"], ["x0"]),
             n("Gather", ["types", "zeros25"], ["tt"]), n("Add", ["x0", "tt"], ["x"]),
             n("Transpose", ["q.weight"], ["qt"], perm=[1, 0]), n("MatMul", ["x", "qt"], ["hq"]),
             n("CastLike", ["pos", "inv_freq"], ["posf"]), n("Unsqueeze", ["posf", "ax1"], ["col"]),
             n("Unsqueeze", ["inv_freq", "ax0"], ["row"]), n("MatMul", ["col", "row"], ["ang"]),
             n("Cos", ["ang"], ["cos"]), n("Sin", ["ang"], ["sin"]), n("Concat", ["cos", "sin"], ["rot"], axis=-1),
             n("Pow", ["rot", "two"], ["rot2"]), n("Add", ["rot2", "one"], ["rot3"]),
             n("Reciprocal", ["rot3"], ["rot4"]), n("Mul", ["hq", "rot4"], ["hr"]),
             n("SplitToSequence", ["hr", "two_i"], ["seq"], axis=-1), n("SequenceAt", ["seq", "z0"], ["a"]),
             n("SequenceAt", ["seq", "z1"], ["b"]), n("Concat", ["b", "a"], ["swapped"], axis=-1),
             n("CumSum", ["ones55", "z1"], ["cols"]), n("CumSum", ["ones55", "z0"], ["rows"]),
             n("LessOrEqual", ["cols", "rows"], ["le"]), n("Less", ["cols", "rows"], ["lt"]),
             n("GreaterOrEqual", ["cols", "rows"], ["ge"]), n("Greater", ["cols", "rows"], ["gt"]),
             n("And", ["le", "ge"], ["diag"]), n("Or", ["lt", "diag"], ["low"]), n("Not", ["gt"], ["low2"]),
             n("IsNaN", ["ones55"], ["nan"]), n("Not", ["nan"], ["fine"]), n("And", ["low", "low2"], ["m1"]),
             n("And", ["m1", "fine"], ["m2"]), n("Cast", ["m2"], ["maskf"], to=T.FLOAT),
             n("GatherElements", ["maskf", "cols_rev"], ["maskg"], axis=1), n("GatherND", ["maskg", "rev"], ["maskr"]), n("MatMul", ["maskr", "swapped"], ["y0"]),
             n("Constant", [], ["half"], value=nh.from_array(np.array(0.5, np.float64))),
             n("CastLike", ["half", "y0"], ["halff"]), n("Mul", ["y0", "halff"], ["y1"]),
             n("Transpose", ["emb"], ["embt"], perm=[1, 0]), n("MatMul", ["y1", "embt"], ["logits"])]
    inits = [_weight(rng, "emb", 10, 4), _weight(rng, "table", 8, 4), _weight(rng, "q.weight", 4, 4),
             nh.from_array(np.array([1.0, 0.1], f), "inv_freq"), nh.from_array(np.ones((5, 5), f), "ones55"),
             *[_ints(f"z{v}", v, scalar=True) for v in (0, 1, 5)], _ints("ax0", 0), _ints("ax1", 1),
             _float("two", 2.0), _float("one", 1.0), _ints("two_i", 2, scalar=True),
             nh.from_array(np.arange(4, -1, -1, dtype=np.int64).reshape(5, 1), "rev"), _weight(rng, "types", 2, 4),
             nh.from_array(np.zeros((2, 5), np.int64), "zeros25"),
             nh.from_array(np.tile(np.arange(4, -1, -1, dtype=np.int64), (5, 1)), "cols_rev")]
    signature = "b_inv_freq: BUFFER target='inv_freq' persistent=False\nids: USER_INPUT"
    return (nodes, [h.make_tensor_value_info("ids", T.INT64, [2, 5])],
            [h.make_tensor_value_info("logits", T.FLOAT, [2, 5, 10])], inits,
            {"pkg.torch.export.ExportedProgram.graph_signature": signature})


def blocks_graph(rng: np.random.Generator, dynamo: bool = False) -> tuple[list, list, list, list]:
    """Three residual MLP blocks (hidden widths 16, 16, 32) and a head, each node named by its module as the
    TorchScript exporter names them (`/layers/layers.1/fc1/MatMul`), or, ``dynamo``, with the dynamo
    exporter's name scopes and module classes: what `swapdsl import` folds into a `def`."""
    from onnx import TensorProto as T
    from onnx import helper as h

    nodes, inits, x = [], [], "x"
    for i, width in enumerate((16, 16, 32)):
        where = ["layers", f"layers.{i}"]
        for op, ins, module in (("MatMul", [x, f"layers.{i}.fc1.weight"], "fc1"), ("Relu", ["a"], "act"),
                                ("MatMul", ["b"], "fc2"), ("Add", ["c", x], None)):
            ins = ins if op != "MatMul" or module == "fc1" else [*ins, f"layers.{i}.fc2.weight"]
            ins = [f"/{'/'.join(where)}/{t}" if t in "abc" else t for t in ins]
            out = f"/{'/'.join(where)}/{ {'fc1': 'a', 'act': 'b', 'fc2': 'c'}.get(module, 'y')}"
            nodes.append(_scoped(h.make_node(op, ins, [out]), where + ([module] if module else []), op, dynamo))
        x = out
        inits += [_weight(rng, f"layers.{i}.fc1.weight", 8, width), _weight(rng, f"layers.{i}.fc2.weight", width, 8)]
    nodes.append(_scoped(h.make_node("MatMul", [x, "head.weight"], ["logits"]), ["head"], "MatMul", dynamo))
    inits.append(_weight(rng, "head.weight", 8, 3))
    return (nodes, [h.make_tensor_value_info("x", T.FLOAT, ["N", 8])],
            [h.make_tensor_value_info("logits", T.FLOAT, ["N", 3])], inits)


def _scoped(node: Any, where: list[str], op: str, dynamo: bool) -> Any:
    """``node`` named as the TorchScript exporter names it, or given the dynamo exporter's scopes."""
    if not dynamo:
        node.name = "/" + "/".join(where + [op])
        return node
    dotted = [".".join(where[1:k + 1]) if where[0] == "layers" and k else where[k] for k in range(len(where))]
    kinds = {"layers": "torch.nn.modules.container.ModuleList", "fc1": "torch.nn.modules.linear.Linear",
             "fc2": "torch.nn.modules.linear.Linear", "act": "torch.nn.modules.activation.ReLU",
             "head": "torch.nn.modules.linear.Linear"}
    classes = ["net.Net"] + [kinds.get(w.rsplit(".", 1)[-1], "net.Residual") for w in where] + [f"aten.{op.lower()}"]
    node.name = f"node_{op}_{'_'.join(where)}"
    for key, value in (("pkg.torch.onnx.name_scopes", repr([""] + dotted + [op.lower()])),
                       ("pkg.torch.onnx.class_hierarchy", repr(classes))):
        entry = node.metadata_props.add()
        entry.key, entry.value = key, value
    return node


def _float(name: str, v: float) -> Any:
    from onnx import numpy_helper

    return numpy_helper.from_array(np.array(v, np.float32), name)


def model_bytes(parts: tuple, name: str, opset: int = 20) -> bytes:
    """A seed's (nodes, inputs, outputs, initialisers[, graph metadata]) as an ONNX file's bytes."""
    from onnx import helper as h

    nodes, inputs, outputs, inits, *meta = parts
    g = h.make_graph(nodes, name, inputs, outputs, inits)
    for key, value in (meta[0] if meta else {}).items():
        entry = g.metadata_props.add()
        entry.key, entry.value = key, value
    return h.make_model(g, opset_imports=[h.make_opsetid("", opset)], producer_name="swapdsl fuzz",
                        ir_version=9).SerializeToString()


# (the attention seed predicts one whole batch: a mutated softmax or sum over axis 0 mixes the examples of a
# batch, and so depends on how they are batched)
SEEDS = {"cnn": (cnn_graph, {"x": (10, 3, 8, 8)}, ["--batch", "4"]),
         "attention": (attention_graph, {"ids": (2, 5)}, ["--batch", "2", "--dim", "sequence=5"]),
         "decoder": (decoder_graph, {"ids": (2, 5)}, []),
         "blocks": (blocks_graph, {"x": (6, 8)}, ["--batch", "6"])}


def make_seeds(folder: Path) -> dict[str, Path]:
    folder.mkdir(parents=True, exist_ok=True)
    out = {}
    for name, (build, _, _) in SEEDS.items():
        out[name] = folder / f"{name}.onnx"
        out[name].write_bytes(model_bytes(build(np.random.default_rng(0)), name))
    return out


# ---- the mutations --------------------------------------------------------------------------------


def mutate_graph(data: bytes, kind: str, rng: random.Random) -> tuple[bytes, str]:
    import onnx

    m = onnx.load_model_from_string(data)
    g = m.graph
    node = g.node[rng.randrange(len(g.node))]
    if kind == "attribute" and node.attribute:
        a = node.attribute[rng.randrange(len(node.attribute))]
        what = _odd_attribute(a, rng)
    elif kind == "op_type":
        old, node.op_type = node.op_type, rng.choice(_OPS)
        what = f"node {node.name or node.output[0]}: {old} -> {node.op_type}"
    elif kind == "input" and node.input:
        i = rng.randrange(len(node.input))
        names = [v for n in g.node for v in n.output] + [t.name for t in g.initializer] + ["missing", ""]
        node.input[i] = rng.choice(names)
        what = f"node {node.name or node.output[0]} input {i} -> {node.input[i]!r}"
    elif kind == "remove":
        g.node.remove(node)
        what = f"node {node.name or node.output[0]} ({node.op_type}) removed"
    elif kind == "dims":
        dim = rng.choice([d for v in g.input for d in v.type.tensor_type.shape.dim])
        new = rng.choice([0, 1, 2, 7, 10**9, "sym"])
        if isinstance(new, str):
            dim.dim_param = new
        else:
            dim.dim_value = new
        what = f"an input dimension -> {new}"
    else:
        m.opset_import[0].version = rng.choice([1, 11, 12, 13, 17, 30, 10**6])
        what = f"opset -> {m.opset_import[0].version}"
    return m.SerializeToString(), what


def _odd_attribute(a: Any, rng: random.Random) -> str:
    from onnx import AttributeProto as A

    if a.type == A.INT:
        a.i = rng.choice(_ODD_INTS)
        return f"attribute {a.name} -> {a.i}"
    if a.type == A.INTS:
        values = [rng.choice(_ODD_INTS) for _ in range(rng.choice([0, 1, len(a.ints), len(a.ints) + 1]))]
        del a.ints[:]
        a.ints.extend(values)
        return f"attribute {a.name} -> {values}"
    if a.type == A.FLOAT:
        a.f = rng.choice(_ODD_FLOATS)
        return f"attribute {a.name} -> {a.f}"
    if a.type == A.STRING:
        a.s = rng.choice(_ODD_STRINGS).encode()
        return f"attribute {a.name} -> {a.s!r}"
    a.name = rng.choice(["bogus", "axis", "perm"])
    return f"attribute renamed {a.name}"


def mutate_bytes(data: bytes, kind: str, rng: random.Random) -> tuple[bytes, str]:
    n = len(data)
    i = rng.randrange(n)
    if kind == "flip":
        return data[:i] + bytes([data[i] ^ (1 << rng.randrange(8))]) + data[i + 1:], f"bit flipped at {i}"
    if kind == "cut":
        return data[:i], f"cut to {i} bytes"
    if kind == "insert":
        chunk = bytes(rng.randrange(256) for _ in range(rng.choice([1, 3, 64])))
        return data[:i] + chunk + data[i:], f"{len(chunk)} bytes inserted at {i}"
    width = rng.choice([1, 4, 8, 32])
    fill = rng.choice([b"\xff", b"\x00", b"\x7f"]) * width
    return data[:i] + fill[: n - i] + data[i + width:], f"{width} bytes overwritten at {i}"


def case_of(seed: int, index: int, seeds: dict[str, Path], work: Path) -> tuple[Case, Path, list[str]]:
    rng = random.Random(f"onnx:{seed}:{index}")
    name = sorted(seeds)[index % len(seeds)]
    kind = KINDS[(index // len(seeds)) % len(KINDS)]
    data = seeds[name].read_bytes()
    changed, what = mutate_bytes(data, kind, rng) if kind in KINDS[:4] else mutate_graph(data, kind, rng)
    target = work / f"{name}.onnx"
    target.write_bytes(changed)
    return Case(name, kind, what), target, ["import", str(target), "-o", str(work / "m.swp"), *SEEDS[name][2]]


# ---- the verdict ------------------------------------------------------------------------------------


def judge(case: Case, target: Path, argv: list[str], limit_s: float = TIME_LIMIT_S) -> Verdict:
    run = run_cli(argv, limit_s)
    out = Path(argv[argv.index("-o") + 1])
    if run.crash == "hang":
        return Verdict("hang", f"over {limit_s:.0f} s")
    if run.code is None:
        return Verdict("crash", run.crash)
    if run.code == 2 and run.err.startswith("error: ") and "Traceback" not in run.err:
        written = [p.name for p in (out, out.with_suffix(".safetensors")) if p.exists()]
        return Verdict("litter", f"refused but wrote {written}") if written else Verdict("refused",
                                                                                          run.err.splitlines()[0])
    if run.code != 0:
        return Verdict("crash", f"exit {run.code}: {run.err[-500:]}")
    return _same_as_onnxruntime(case, target, out)


def _overflowing(target: Path) -> bool:
    import onnx
    from onnx import numpy_helper

    for t in onnx.load(str(target)).graph.initializer:
        a = numpy_helper.to_array(t)
        if a.dtype.kind == "f" and a.size and not float(np.abs(a.astype(np.float64)).max()) < 1e15:
            return True
    return False


def _same_as_onnxruntime(case: Case, target: Path, out: Path) -> Verdict:
    """An accepted mutant computes what onnxruntime computes from the same file (where it runs it)."""
    import onnxruntime as ort

    import swapdsl

    rng = np.random.default_rng(1)
    shapes = SEEDS[case.seed][1]
    feeds = {k: (rng.integers(0, 11, s).astype(np.int64) if k == "ids" else rng.standard_normal(s).astype(np.float32))
             for k, s in shapes.items()}
    try:
        session = ort.InferenceSession(str(target), providers=["CPUExecutionProvider"])
        theirs = session.run(None, feeds)
    except Exception:  # noqa: BLE001 (onnxruntime refuses the mutant: nothing to compare)
        return Verdict("ok", "onnxruntime does not run it")
    if _overflowing(target):
        return Verdict("ok", "weights at the edge of float32: two executors' rounding to inf and NaN may differ")
    np.savez(out.parent / "feeds.npz", **feeds)
    ours = swapdsl.predict(str(out), str(out.parent / "feeds.npz"), init=str(out.with_suffix(".safetensors")))
    for (name, a), b in zip(ours.items(), theirs):
        finite = np.abs(b[np.isfinite(b)])
        atol = 1e-5 * max(1.0, float(finite.max(initial=0.0)))
        if a.shape != b.shape or not np.allclose(a, b, rtol=1e-4, atol=atol, equal_nan=True):
            return Verdict("wrong", f"output {name}: ours {a.shape} vs onnxruntime {b.shape}, max diff "
                           f"{float(np.abs(a - b).max()) if a.shape == b.shape else 'n/a'}")
    return Verdict("ok")
