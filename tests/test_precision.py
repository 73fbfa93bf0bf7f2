"""The mixed-precision pass (graph/precision.py) and what carries it: plan files, checkpoints, exec."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import swapdsl
from conftest import MODELS, SMALL_MODELS, write
from swapdsl.graph.checker import check_graph
from swapdsl.graph.ir import DType
from swapdsl.graph.precision import autocast

MLP = {"batch": 4, "features": 6, "hidden": 5, "depth": 2, "classes": 3}


def test_the_policy_op_by_op() -> None:
    g = swapdsl.load(MODELS / "mlp.swp", precision="bf16", **MLP).graph
    kinds = {op.op: g.type_of(op.outputs[0]).dtype for op in g.ops if op.op != "cast"}
    assert kinds["matmul"] is DType.bf16 and kinds["add"] is DType.bf16 and kinds["relu"] is DType.bf16
    assert kinds["softmax_cross_entropy"] is DType.f32 and kinds["mean"] is DType.f32
    assert all(g.type_of(p).dtype is DType.f32 for p in g.params)  # the masters
    casts = [op for op in g.ops if op.op == "cast" and op.inputs[0] in g.params]
    assert sorted(op.inputs[0] for op in casts) == sorted(g.params)  # each parameter cast once
    assert all(op.outputs[0] == f"{op.inputs[0]}/bf16" for op in casts)
    t = swapdsl.load(MODELS / "mlp.swp", precision="bf16", **MLP).training
    assert all(t.type_of(grad).dtype is DType.f32 for _, grad in t.grads)  # the update runs in f32
    assert t.precision == "bf16"


@pytest.mark.parametrize("model", SMALL_MODELS + ["lstm_lm", "gpt", "bert", "resnet"])
@pytest.mark.parametrize("precision", ["bf16", "f16"])
def test_every_zoo_model_builds_under_each_precision(model: str, precision: str) -> None:
    m = swapdsl.load(MODELS / f"{model}.swp", precision=precision)
    check_graph(m.training)
    assert m.training.type_of(m.training.loss).dtype is DType.f32


def test_a_tensor_read_by_many_is_cast_once_and_shared_weights_too(tmp_path: Path) -> None:
    model = write(tmp_path / "m.swp", """model m(n = 4) {
    input x: f32[n, n]
    param w: f32[n, n] = xavier
    h = relu(x @ w) @ w
    loss = mean(h * h)
    minimize loss with sgd(lr = 0.1)
    report big = mean(cast(h > x, f32))
}
""")
    g = swapdsl.load(model, precision="f16").graph
    assert [op.inputs[0] for op in g.ops if op.op == "cast" and op.attr_dict["dtype"] == "f16"] == ["x", "w"]
    check_graph(g)  # the comparison of a half activation with the f32 input reads x's half copy


def test_declared_dtypes_are_kept(tmp_path: Path) -> None:
    model = write(tmp_path / "m.swp", """model m(n = 4) {
    input x: f64[n, n]
    param w: f64[n, n] = xavier
    loss = mean((x @ w) * (x @ w))
    minimize loss with sgd(lr = 0.1)
}
""")
    g = swapdsl.load(model, precision="bf16").graph
    assert not any(op.op == "cast" for op in g.ops) and g.type_of(g.loss).dtype is DType.f64


def test_f32_is_the_model_as_written() -> None:
    g = swapdsl.load(MODELS / "mlp.swp", **MLP).graph
    assert autocast(g, "f32") is g


def test_plans_record_the_precision_and_exec_follows_it(cli, in_tmp: Path) -> None:
    write(in_tmp / "m.swp", (MODELS / "mlp.swp").read_text())
    defines = [x for k, v in MLP.items() for x in ("-D", f"{k}={v}")]
    assert cli("optimize", "m.swp", *defines, "--precision", "bf16", "--memory", "1MiB", "--method", "belady",
               "-o", "m.plan")[0] == 0
    text = (in_tmp / "m.plan").read_text()
    assert "\nprecision bf16\n" in text
    code, out, _ = cli("exec", "m.plan", "--steps", "2", "--check", "--json")
    assert code == 0 and '"max_rel_diff": 0.0' in out
    code, _, err = cli("exec", "m.plan", "--precision", "f16", "--steps", "1")
    assert code == 2 and "--precision f16: the plan was made for bf16" in err
    for edited, expected in [("precision f16", "tensor line `x/bf16` (48 bytes, activation) differs"),
                             ("precision f32", "unknown precision `f32`"), ("precision fp8", "unknown precision")]:
        (in_tmp / "e.plan").write_text(text.replace("precision bf16", edited))
        code, _, err = cli("exec", "e.plan", "--steps", "1")
        assert code == 2 and expected in err and " --> e.plan:" in err, err
    (in_tmp / "e.plan").write_text(text.replace("precision bf16\n", ""))
    code, _, err = cli("exec", "e.plan", "--steps", "1")
    assert code == 2 and " --> e.plan:" in err


def test_resume_refuses_another_precision(cli, in_tmp: Path) -> None:
    write(in_tmp / "m.swp", (MODELS / "mlp.swp").read_text())
    defines = [x for k, v in MLP.items() for x in ("-D", f"{k}={v}")]
    assert cli("exec", "m.swp", *defines, "--precision", "bf16", "--steps", "2", "--save", "c.st")[0] == 0
    code, _, err = cli("exec", "m.swp", *defines, "--steps", "4", "--resume", "c.st")
    assert code == 2 and "its precision differs" in err and "the model with --precision bf16, or a plan made" in err
    code, out, _ = cli("exec", "m.swp", *defines, "--precision", "bf16", "--steps", "4", "--resume", "c.st", "--json")
    assert code == 0
    code, _, _ = cli("exec", "m.swp", *defines, "--steps", "4", "--init", "c.st")  # parameters alone: f32 masters
    assert code == 0


def test_a_causal_models_mask_is_not_blamed_for_a_nan(cli, tmp_path: Path) -> None:
    gpt = ["-D", "batch=2", "-D", "seq=8", "-D", "vocab=32", "-D", "hidden=16", "-D", "heads=2", "-D", "layers=1",
           "-D", "positions=8", "-D", "lr=1e30"]
    code, _, err = cli("exec", MODELS / "gpt.swp", *gpt, "--steps", "5")
    assert code == 2 and "causal_mask" not in err
    assert "made in step 2 by op 5, `matmul` (layer0.block.attn.q.matmul)" in err


def test_the_validator_refuses_a_graph_of_another_precision() -> None:
    from swapdsl.common.errors import SwpError
    from swapdsl.plan.validate import validate

    bf16 = swapdsl.load(MODELS / "mlp.swp", precision="bf16", **MLP)
    plan = swapdsl.optimize(bf16, memory="1MiB", method="belady")
    other = swapdsl.load(MODELS / "mlp.swp", precision="f16", **MLP).training
    with pytest.raises(SwpError, match="the plan's precision is bf16, its training graph's f16"):
        validate(plan, other)
    assert np.isfinite(dict(plan.figures)["fraction"])


# -- a guarded step: updates gated on finite gradients, dynamic loss scaling

TINY = """model tiny(n = 16, k = 8, scale = 1.0, lr = 0.5) {
    input x: f32[n, k]
    input y: i32[n]
    param w: f32[k, 4] = xavier
    loss = softmax_cross_entropy(x @ w, y) * scale
    minimize loss with sgd(lr = lr)
}
"""


def test_f16_gradients_that_underflow_survive_with_loss_scaling(tmp_path: Path) -> None:
    """A loss scaled by 1e-7 (and the learning rate by 1e7): its gradients are below f16's smallest
    subnormal. Without loss scaling they flush to zero and the weights never move; with it, f16 training
    follows f32's."""
    model = write(tmp_path / "tiny.swp", TINY)

    def losses(precision: str, guard: str | None) -> list[float]:
        m = swapdsl.load(model, precision=precision, guard=guard, scale=1e-7, lr=5e6)
        return swapdsl.execute(m, steps=3, backend="numpy").losses

    exact, flushed, scaled = losses("f32", None), losses("f16", "none"), losses("f16", "scale")
    assert flushed[0] == flushed[-1]  # nothing learned
    assert scaled[-1] < scaled[0] and scaled == pytest.approx(exact, rel=1e-2)


def test_a_step_with_a_nonfinite_gradient_leaves_the_state_as_it_was() -> None:
    from swapdsl.runtime.reference import Trainer

    t = swapdsl.load(MODELS / "mlp.swp", precision="f16", guard="scale", **MLP).training
    trainer = Trainer(t, 0, np)
    before = trainer.state()
    trainer.step(1)  # 2^16 times the gradient overflows f16: skipped, and the scale halves
    after = trainer.state()
    assert trainer.metrics()["finite"] == 0.0 and trainer.metrics()["loss_scale"] == 2.0**15
    assert all(np.array_equal(before[k], after[k]) for k in t.params)
    trainer.step(2)
    assert trainer.metrics()["finite"] == 1.0 and not np.array_equal(before[t.params[0]], trainer.state()[t.params[0]])


def test_a_guarded_plan_records_its_guard_and_trains_exactly(cli, in_tmp: Path) -> None:
    write(in_tmp / "m.swp", (MODELS / "mlp.swp").read_text())
    defines = [x for k, v in MLP.items() for x in ("-D", f"{k}={v}")]
    assert cli("optimize", "m.swp", *defines, "--precision", "f16", "--memory", "1MiB", "--method", "capuchin",
               "-o", "m.plan")[0] == 0
    assert "\nguard scale\n" in (in_tmp / "m.plan").read_text()  # f16's default
    code, out, err = cli("exec", "m.plan", "--steps", "4", "--check")
    assert code == 0, err
    assert "1 steps skipped for a non-finite gradient (their updates not applied); loss scale now 32768" in out
    assert "max rel diff against the reference 0.00e+00" in out
    code, _, err = cli("exec", "m.plan", "--guard", "none", "--steps", "1")
    assert code == 2 and "--guard none: the plan was made for scale" in err
    tiny = write(in_tmp / "tiny.swp", TINY)  # a loss 1e6 times larger: its f16 gradients overflow
    code, _, err = cli("exec", tiny, "-D", "scale=1e6", "--guard", "skip", "--precision", "f16", "--steps", "3")
    assert code == 2 and err.startswith("error: a gradient of step 1 is not finite, so its update was skipped; "
                                        "stopped"), err
    assert "made in step 1 by op 8, `matmul_tn_fold` (grad w as f16)" in err
    code, out, _ = cli("exec", tiny, "-D", "scale=1e6", "--guard", "skip", "--precision", "f16", "--steps", "3",
                       "--on-nonfinite", "skip")
    assert code == 0 and "3 steps skipped" in out
    code, _, err = cli("exec", tiny, "-D", "scale=1e6", "--precision", "f16", "--steps", "30")  # scaling gives up
    assert code == 2 and err.startswith("error: a gradient of step 17 is not finite, so its update was skipped, and "
                                        "the loss scale has fallen to 0.5; stopped"), err


def test_digits_in_half_precision_learn_as_in_f32(cli, tmp_path: Path) -> None:
    """Issue 37's accuracy check: 200 steps of the digits mlp in bf16 and in f16 (with the loss scaler)
    reach held-out accuracy within 1 point of f32 (the figures: docs/benchmarks.md, "Mixed precision")."""
    pytest.importorskip("sklearn")
    import json
    import subprocess
    import sys

    subprocess.run([sys.executable, str(Path(__file__).parents[1] / "examples" / "digits.py"), str(tmp_path)],
                   check=True, capture_output=True)
    defines = ["-D", "features=64", "-D", "hidden=128", "-D", "depth=4", "-D", "lr=0.002"]
    accuracy = {}
    for precision in ("f32", "bf16", "f16"):
        code, out, err = cli("exec", MODELS / "mlp.swp", *defines, "--precision", precision, "--data",
                             tmp_path / "train", "--shuffle", "--steps", "200", "--eval", tmp_path / "test", "--json")
        assert code == 0, err
        accuracy[precision] = json.loads(out)["eval"][-1]["metrics"]["accuracy"]
    assert accuracy["f32"] >= 0.7, accuracy  # (chance: 0.1; 0.806 when measured)
    assert abs(accuracy["bf16"] - accuracy["f32"]) <= 0.01 and abs(accuracy["f16"] - accuracy["f32"]) <= 0.01, accuracy


@pytest.mark.parametrize("dtype", ["bf16", "f16"])
@pytest.mark.parametrize("op,shapes", [("add", [(64, 300, 128), (128,)]), ("mul", [(2048, 1024), (2048, 1024)]),
                                       ("gelu", [(1024, 2048)]), ("relu_grad", [(512, 4096), (512, 4096)]),
                                       ("sub", [(3, 700, 256), (1, 700, 256)]), ("sigmoid", [(9, 100003)])])
def test_element_wise_half_ops_stage_a_block_at_a_time(op: str, shapes: list[tuple[int, ...]], dtype: str) -> None:
    """Staged a block of rows at a time, an element-wise op on half tensors gives the same bits as on whole
    f32 copies, in far less scratch (run_kernel gives it exactly what it declares)."""
    from swapdsl.graph.ir import TensorType
    from swapdsl.graph.ops import KernelContext
    from swapdsl.graph.ops.kernels import run_kernel, scratch_need, staged
    from swapdsl.graph.ops.registry import REGISTRY, buffers, infer, np_dtype

    half = DType[dtype]
    rng = np.random.default_rng(1)
    ins = [rng.standard_normal(s).astype(np_dtype(np, half)) for s in shapes]
    types = tuple(TensorType(s, half) for s in shapes)
    out_type = infer(op, types, {})
    assert staged(op, types, out_type) is not None
    wide = [x.astype(np.float32) for x in ins]
    expected = np.empty(out_type.shape, np.float32)
    REGISTRY[op].kernel(KernelContext.standalone(np, 1 << 28), wide, expected, {})
    got = run_kernel(np, op, ins, {})
    assert np.array_equal(got, expected.astype(got.dtype), equal_nan=True)
    whole = buffers(*(w.nbytes for w in wide), expected.nbytes)
    assert scratch_need(op, types, out_type, {}) < whole / 2


@pytest.mark.parametrize("op,shapes,attrs_", [("softmax", [(4, 96, 512)], {"axis": 2}),
                                              ("softmax_grad", [(4, 96, 512), (4, 96, 512)], {"axis": 2}),
                                              ("matmul", [(8, 128, 256), (256, 512)], {}),
                                              ("matmul", [(2048, 256), (256, 2048)], {}),
                                              ("matmul_nt", [(8, 128, 512), (256, 512)], {}),
                                              ("rms_norm", [(4, 96, 512), (512,)], {"eps": 1e-6}),
                                              ("rope", [(4, 8, 128, 64)], {"base": 10000.0}),
                                              ("rms_norm_grad", [(4, 96, 512), (512,), (4, 96, 512)],
                                               {"eps": 1e-6})])
def test_row_wise_half_ops_and_products_stage_rows_exactly_as_the_reference(op: str, shapes, attrs_) -> None:
    """Softmax over the last axis and products with a matrix stage a block of rows at a time too; the
    staged kernel takes no more scratch than it declares and stays within half precision of f32."""
    from swapdsl.graph.ir import TensorType
    from swapdsl.graph.ops import KernelContext
    from swapdsl.graph.ops.kernels import run_kernel, staged
    from swapdsl.graph.ops.registry import REGISTRY, infer, np_dtype

    rng = np.random.default_rng(2)
    ins = [rng.standard_normal(s).astype(np_dtype(np, DType.bf16)) for s in shapes]
    types = tuple(TensorType(s, DType.bf16) for s in shapes)
    out_type = infer(op, types, attrs_)
    assert staged(op, types, out_type, attrs_) is not None
    expected = np.empty(out_type.shape, np.float32)
    REGISTRY[op].kernel(KernelContext.standalone(np, 1 << 28), [x.astype(np.float32) for x in ins], expected, attrs_)
    got = run_kernel(np, op, ins, attrs_).astype(np.float32)
    assert np.abs(got - expected).max() <= 2**-7 * np.abs(expected).max()


def test_a_weight_gradient_in_half_sums_its_rows_block_by_block() -> None:
    """matmul_tn_fold (x^T g over every leading axis) on half tensors: blocks of rows summed in f32 by its
    accumulate op, rounded once; within half precision of the f32 product, in its declared scratch."""
    from swapdsl.graph.ir import TensorType
    from swapdsl.graph.ops.kernels import run_kernel, scratch_need, staged
    from swapdsl.graph.ops.registry import infer, np_dtype

    rng = np.random.default_rng(3)
    shapes = [(16, 512, 256), (16, 512, 1024)]
    ins = [rng.standard_normal(s).astype(np_dtype(np, DType.bf16)) for s in shapes]
    types = tuple(TensorType(s, DType.bf16) for s in shapes)
    out_type = infer("matmul_tn_fold", types, {})
    r = staged("matmul_tn_fold", types, out_type, {})
    assert r is not None and r.summed == "matmul_tn_fold_acc" and r.block < r.rows
    x, g = (a.astype(np.float64).reshape(-1, a.shape[-1]) for a in ins)
    expected = x.T @ g
    got = run_kernel(np, "matmul_tn_fold", ins, {}).astype(np.float64)
    assert np.abs(got - expected).max() <= 2**-7 * np.abs(expected).max()
    assert scratch_need("matmul_tn_fold", types, out_type, {}) < 4 * (16 * 512 * (256 + 1024))


_CUT_MODELS = {"tiny_resnet": {"batch": 16, "width": 32, "blocks": 1},
               "tiny_transformer": {"batch": 8, "seq": 128, "dim": 128, "depth": 1}}


@pytest.mark.parametrize("model", sorted(_CUT_MODELS))
def test_every_staged_op_of_a_half_model_stays_within_half_precision_of_f32(model: str) -> None:
    """Every op of a bf16 training graph that ``kernels.staged`` cuts into blocks (images, channels, rows,
    summed blocks) runs in exactly the scratch it declares (run_kernel gives no more), within half precision
    of the op's kernel on whole f32 copies, and in far less scratch than those copies."""
    from swapdsl.graph.ir import TensorType
    from swapdsl.graph.ops import KernelContext
    from swapdsl.graph.ops.kernels import CUTS, run_kernel, scratch_need, staged
    from swapdsl.graph.ops.registry import REGISTRY, buffers, np_dtype

    t = swapdsl.load(MODELS / f"{model}.swp", precision="bf16", **_CUT_MODELS[model]).training
    rng, seen = np.random.default_rng(4), set()
    for op in t.ops:
        types = tuple(t.type_of(n) for n in op.inputs)
        out = t.type_of(op.outputs[0])
        a = op.attr_dict
        if op.op in seen or staged(op.op, types, out, a) is None or not all(x.dtype.is_float for x in types):
            continue
        seen.add(op.op)
        ins = [rng.uniform(0.1, 2.0, x.shape).astype(np_dtype(np, x.dtype)) for x in types]
        wide = [x.astype(np.float32) for x in ins]
        expected = np.empty(out.shape, np.float32)
        REGISTRY[op.op].kernel(KernelContext.standalone(np, 1 << 28), wide, expected, a)
        got = run_kernel(np, op.op, ins, a).astype(np.float32)
        assert np.abs(got - expected).max() <= 2**-7 * np.abs(expected).max(), op.op
        whole = buffers(*(4 * x.numel for x in (*types, out)))
        assert scratch_need(op.op, types, out, a) < whole / 2, op.op
    must = {"tiny_resnet": {"conv2d", "conv2d_grad_input", "conv2d_grad_weight", "batch_norm", "batch_norm_grad",
                            "batch_norm_dscale", "sum", "relu_grad"},
            "tiny_transformer": {"layer_norm", "layer_norm_grad", "layer_norm_dscale", "matmul", "matmul_nt",
                                 "matmul_tn", "softmax", "gelu"}}[model]
    assert must <= seen <= set(CUTS), (must - seen, seen - set(CUTS))


def test_half_dropout_staged_by_blocks_draws_the_mask_of_the_whole_tensor() -> None:
    """Each staged block of a half dropout hashes its own element indices (the block's offset), so the
    mask, and every bit of the result, is the whole tensor's."""
    from swapdsl.graph.ir import TensorType
    from swapdsl.graph.ops import KernelContext
    from swapdsl.graph.ops.kernels import run_kernel, staged
    from swapdsl.graph.ops.registry import REGISTRY, np_dtype

    x = np.random.default_rng(5).standard_normal((64, 96, 512)).astype(np_dtype(np, DType.bf16))
    a = {"p": 0.3, "seed": 11}
    t = TensorType(x.shape, DType.bf16)
    cut = staged("dropout", (t,), t, a)
    assert cut is not None and cut.offset and cut.block < cut.rows
    expected = np.empty(x.shape, np.float32)
    REGISTRY["dropout"].kernel(KernelContext.standalone(np, 1 << 28), [x.astype(np.float32)], expected, a)
    got = run_kernel(np, "dropout", [x], a)
    assert np.array_equal(got, expected.astype(got.dtype))
    assert 0.25 < float(np.mean(got == 0)) < 0.35


@pytest.mark.parametrize("dtype", ["bf16", "f16"])
def test_cross_entropy_reads_half_logits_and_computes_as_on_an_f32_copy(dtype: str) -> None:
    """The loss on half logits is f32 and has the bits of the loss on their f32 copy; its gradient is the f32
    gradient rounded once; neither widens the logits whole (a language model's largest tensors)."""
    from swapdsl.graph.ir import TensorType
    from swapdsl.graph.ops.kernels import run_kernel, scratch_need
    from swapdsl.graph.ops.registry import infer, np_dtype

    rng = np.random.default_rng(6)
    z = (3 * rng.standard_normal((4, 96, 1000))).astype(np_dtype(np, DType[dtype]))
    y = rng.integers(0, 1000, (4, 96)).astype(np.int32)
    seed = np.array(1.5, np.float32)
    loss = run_kernel(np, "softmax_cross_entropy", [z, y], {})
    assert loss.dtype == np.float32
    assert loss == run_kernel(np, "softmax_cross_entropy", [z.astype(np.float32), y], {})
    grad = run_kernel(np, "softmax_cross_entropy_grad", [z, y, seed], {})
    wide = run_kernel(np, "softmax_cross_entropy_grad", [z.astype(np.float32), y, seed], {})
    assert grad.dtype == z.dtype and np.array_equal(grad, wide.astype(z.dtype))
    types = (TensorType(z.shape, DType[dtype]), TensorType(y.shape, DType.i32))
    for op, ins in (("softmax_cross_entropy", types), ("softmax_cross_entropy_grad", (*types, TensorType((), DType.f32)))):
        assert scratch_need(op, ins, infer(op, ins, {}), {}) < 4 * z.size / 2  # (whole: 4 * z.size, and more)
    t = swapdsl.load(MODELS / "tiny_transformer.swp", precision=dtype).training
    xent = next(op for op in t.ops if op.op == "softmax_cross_entropy")
    assert t.type_of(xent.inputs[0]).dtype is DType[dtype] and t.type_of(xent.outputs[0]).dtype is DType.f32


@pytest.mark.parametrize("op,attrs_", [("sum", {"axes": (), "keepdims": False}), ("sum_to", {"shape": ()}),
                                       ("relu", {})])
def test_a_0d_half_tensor_has_no_axis_to_cut(op: str, attrs_: dict) -> None:
    """A model that declares half scalars: the op runs on whole copies (no cut of a 0-d tensor)."""
    from swapdsl.graph.ops.kernels import run_kernel

    x = np.array(1.5, np.float16)
    assert float(run_kernel(np, op, [x], attrs_)) == 1.5


def test_a_model_tensor_named_loss_scale_is_refused_where_the_guard_keeps_one(cli, in_tmp: Path) -> None:
    """It was an assertion's traceback (exit 1) with f16's default guard."""
    text = "model m(batch = 4) {\n    input x: f32[batch, 8]\n    input y: i32[batch]\n    param loss_scale: " \
           "f32[8, 3] = xavier\n    minimize softmax_cross_entropy(x @ loss_scale, y) with sgd(0.1)\n}\n"
    write(in_tmp / "m.swp", text)
    code, _, err = cli("check", "m.swp", "--training", "--precision", "f16")
    assert code == 2 and err.startswith("error: the model's tensor `loss_scale` has the name of the loss scale "
                                        "that --guard scale keeps\n --> m.swp:4:5"), err
    assert cli("check", "m.swp", "--training", "--precision", "f16", "--guard", "skip")[0] == 0
