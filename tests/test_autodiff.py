"""Gradient rules against finite differences (float64), and the training graph's shape."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from conftest import MODELS, build_graph, write
from swapdsl.graph.analysis import in_place_ops
from swapdsl.graph.autodiff import training_graph
from swapdsl.graph.checker import check_graph
from swapdsl.graph.ir import DType, Graph, Kind, Op, Optimizer, Tensor, TensorType, retyped
from swapdsl.graph.ops import REGISTRY, infer
from swapdsl.runtime.data import init_persistent, synthetic_inputs
from swapdsl.runtime.reference import run_ops

F64 = DType.f64
SGD0 = Optimizer("sgd", (("lr", 0.0), ("momentum", 0.0), ("weight_decay", 0.0)))


def one_op_graph(op: str, inputs: list[np.ndarray], attrs: dict[str, Any]) -> Graph:
    """loss = sum(op(inputs) * r): float inputs are params, integer inputs are data."""
    tensors: dict[str, Tensor] = {}
    names, params, data = [], [], []
    for i, arr in enumerate(inputs):
        name = f"in{i}"
        is_float = arr.dtype.kind == "f"
        tensors[name] = Tensor(name, TensorType(arr.shape, F64 if is_float else DType.i64),
                               Kind.param if is_float else Kind.input)
        (params if is_float else data).append(name)
        names.append(name)
    out = infer(op, tuple(tensors[n].type for n in names), attrs)
    tensors["y"] = Tensor("y", out, Kind.activation)
    tensors["r"] = Tensor("r", out, Kind.input)
    tensors["yr"] = Tensor("yr", out, Kind.activation)
    tensors["loss"] = Tensor("loss", TensorType((), F64), Kind.activation)
    ops = (Op(op, tuple(names), ("y",), tuple(sorted(attrs.items()))),
           Op("mul", ("y", "r"), ("yr",)),
           Op("sum", ("yr",), ("loss",), (("axes", tuple(range(out.rank))), ("keepdims", False))))
    return Graph("g", (), tensors, ops, tuple(data) + ("r",), tuple(params), "loss", SGD0)


def loss_of(g: Graph, env: dict[str, np.ndarray]) -> float:
    return float(run_ops(g, dict(env), np, 1)[g.loss])


def analytic_grads(t: Graph, env: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    grads = dict(t.grads)
    state = {name: v for name, v in init_persistent(t, 0, np).items() if name in t.state}  # running statistics
    out = run_ops(t, {**state, **env}, np, 1, keep=grads.values())
    return {p: out[g] for p, g in grads.items()}


def numeric_grad(g: Graph, env: dict[str, np.ndarray], name: str, h: float = 1e-6) -> np.ndarray:
    x = env[name]
    grad = np.zeros_like(x)
    for idx in np.ndindex(x.shape):
        old = x[idx]
        x[idx] = old + h
        up = loss_of(g, env)
        x[idx] = old - h
        down = loss_of(g, env)
        x[idx] = old
        grad[idx] = (up - down) / (2 * h)
    return grad


def rnd(*shape: int, low: float = -1.0, high: float = 1.0, seed: int = 0) -> np.ndarray:
    return np.random.default_rng([seed, len(shape), *shape]).uniform(low, high, shape)


def away_from_zero(*shape: int, seed: int = 0) -> np.ndarray:
    x = rnd(*shape, seed=seed)
    return np.where(x < 0, x - 0.1, x + 0.1)


def ints(high: int, *shape: int) -> np.ndarray:
    return np.random.default_rng(len(shape)).integers(0, high, shape)


def conv(stride: int | tuple = 1, padding: int | tuple = 0, dilation: int = 1, groups: int = 1) -> dict[str, Any]:
    p = lambda v: v if isinstance(v, tuple) else (v, v)  # noqa: E731
    return {"stride": p(stride), "padding": p(padding), "dilation": p(dilation), "groups": groups}


def pool(kernel: int, stride: int, padding: int = 0) -> dict[str, Any]:
    return {"kernel": (kernel, kernel), "stride": (stride, stride), "padding": (padding, padding)}


# (id, op, inputs, attrs)
CASES: list[tuple[str, str, list[np.ndarray], dict[str, Any]]] = [
    ("matmul", "matmul", [rnd(3, 4), rnd(4, 5)], {}),
    ("matmul-dense-3d", "matmul", [rnd(2, 3, 4), rnd(4, 5)], {}),
    ("matmul-batched", "matmul", [rnd(2, 3, 4), rnd(2, 4, 2)], {}),
    ("matmul-broadcast-batch", "matmul", [rnd(2, 1, 3, 4), rnd(3, 4, 2)], {}),
    ("add-broadcast", "add", [rnd(3, 4), rnd(4)], {}),
    ("sub-broadcast", "sub", [rnd(2, 1, 3), rnd(4, 1)], {}),
    ("mul-broadcast", "mul", [rnd(2, 3), rnd(2, 1)], {}),
    ("div-broadcast", "div", [rnd(2, 3), rnd(3, low=0.5, high=1.5)], {}),
    ("add_scalar", "add_scalar", [rnd(3)], {"value": 2.0}),
    ("mul_scalar", "mul_scalar", [rnd(3)], {"value": -3.0}),
    ("pow_scalar", "pow_scalar", [rnd(4, low=0.5, high=2.0)], {"exponent": 2.5}),
    ("pow_scalar-reciprocal", "pow_scalar", [rnd(4, low=0.5, high=2.0)], {"exponent": -1.0}),
    ("neg", "neg", [rnd(3)], {}),
    ("relu", "relu", [away_from_zero(3, 4)], {}),
    ("gelu", "gelu", [rnd(3, 4, low=-3, high=3)], {}),
    ("tanh", "tanh", [rnd(5)], {}),
    ("sigmoid", "sigmoid", [rnd(5, low=-4, high=4)], {}),
    ("silu", "silu", [rnd(3, 5, low=-6, high=6)], {}),
    ("erf", "erf", [rnd(3, 5, low=-3, high=3)], {}),
    ("leaky_relu", "leaky_relu", [away_from_zero(3, 4)], {"slope": 0.2}),
    ("exp", "exp", [rnd(5)], {}),
    ("log", "log", [rnd(5, low=0.5, high=2.0)], {}),
    ("sqrt", "sqrt", [rnd(5, low=0.5, high=2.0)], {}),
    ("softmax", "softmax", [rnd(3, 4)], {"axis": 1}),
    ("softmax-axis0", "softmax", [rnd(3, 4)], {"axis": 0}),
    ("log_softmax", "log_softmax", [rnd(2, 5)], {"axis": 1}),
    ("layer_norm", "layer_norm", [rnd(2, 3, 4), rnd(4), rnd(4)], {"eps": 1e-5}),
    ("layer_norm-2d", "layer_norm", [rnd(2, 3, 4), rnd(3, 4), rnd(3, 4)], {"eps": 1e-5}),
    ("rope", "rope", [rnd(2, 3, 5, 8)], {"base": 10000.0}),
    ("rope-small-base", "rope", [rnd(7, 6)], {"base": 3.0}),
    ("rms_norm", "rms_norm", [rnd(2, 3, 4), rnd(4)], {"eps": 1e-6}),
    ("rms_norm-2d", "rms_norm", [rnd(2, 3, 4), rnd(3, 4)], {"eps": 1e-6}),
    ("batch_norm", "batch_norm", [rnd(3, 2, 2, 2), rnd(2), rnd(2)], {"eps": 1e-5}),
    ("batch_norm-2d", "batch_norm", [rnd(4, 3), rnd(3), rnd(3)], {"eps": 1e-5}),
    ("dropout", "dropout", [rnd(4, 4)], {"p": 0.3, "seed": 1}),
    ("conv2d", "conv2d", [rnd(2, 3, 5, 5), rnd(4, 3, 3, 3)], conv(padding=1)),
    ("conv2d-stride-dilation", "conv2d", [rnd(1, 2, 7, 6), rnd(3, 2, 2, 2)], conv(stride=2, dilation=2)),
    ("conv2d-groups", "conv2d", [rnd(1, 4, 4, 4), rnd(6, 2, 3, 3)], conv(padding=1, groups=2)),
    ("conv2d-depthwise", "conv2d", [rnd(2, 3, 4, 4), rnd(3, 1, 3, 3)], conv(stride=2, padding=1, groups=3)),
    ("conv2d-asymmetric", "conv2d", [rnd(1, 2, 4, 5), rnd(2, 2, 1, 3)], conv(stride=(1, 2), padding=(0, 1))),
    ("max_pool2d", "max_pool2d", [rnd(2, 2, 4, 4)], pool(2, 2)),
    ("max_pool2d-overlap-pad", "max_pool2d", [rnd(1, 2, 5, 5)], pool(3, 2, 1)),
    ("avg_pool2d", "avg_pool2d", [rnd(1, 2, 5, 5)], pool(3, 2, 1)),
    ("avg_pool2d-exclude-pad", "avg_pool2d", [rnd(1, 2, 5, 5)], {**pool(3, 1, 1), "count_include_pad": False}),
    ("pad2d", "pad2d", [rnd(1, 2, 3, 3)], {"padding": (0, 1, 2, 0)}),
    ("causal_mask", "causal_mask", [rnd(2, 4, 4)], {"fill": -5.0}),
    ("matmul_nt-tied", "matmul_nt", [rnd(2, 3, 4), rnd(5, 4)], {}),
    ("matmul_nt-batched", "matmul_nt", [rnd(2, 3, 4), rnd(2, 5, 4)], {}),
    ("global_avg_pool", "global_avg_pool", [rnd(2, 3, 2, 3)], {}),
    ("reshape", "reshape", [rnd(2, 6)], {"shape": (3, 4)}),
    ("permute", "permute", [rnd(2, 3, 4)], {"perm": (2, 0, 1)}),
    ("concat", "concat", [rnd(2, 1), rnd(2, 3), rnd(2, 2)], {"axis": 1}),
    ("slice", "slice", [rnd(3, 7)], {"axis": 1, "start": 1, "stop": 6, "step": 2}),
    ("embedding", "embedding", [ints(5, 2, 3), rnd(5, 4)], {}),
    ("sum", "sum", [rnd(2, 3, 4)], {"axes": (1,), "keepdims": True}),
    ("sum-drop", "sum", [rnd(2, 3, 4)], {"axes": (0, 2), "keepdims": False}),
    ("mean", "mean", [rnd(2, 3)], {"axes": (0, 1), "keepdims": False}),
    ("softmax_cross_entropy", "softmax_cross_entropy", [rnd(4, 5), ints(5, 4)], {}),
    ("softmax_cross_entropy-3d", "softmax_cross_entropy", [rnd(2, 3, 5), ints(5, 2, 3)], {}),
    ("mse_loss", "mse_loss", [rnd(2, 3), rnd(2, 3)], {}),
]


@pytest.mark.parametrize("op,inputs,attrs", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_gradient_matches_finite_differences(op: str, inputs: list[np.ndarray], attrs: dict[str, Any]) -> None:
    g = one_op_graph(op, inputs, attrs)
    t = training_graph(g)
    check_graph(t)
    env = {f"in{i}": np.array(x) for i, x in enumerate(inputs)}
    env["r"] = rnd(*g.type_of("y").shape, seed=7) if g.type_of("y").shape else np.array(1.3)
    analytic = analytic_grads(t, env)
    assert set(analytic) == set(g.params)
    for name in g.params:
        np.testing.assert_allclose(analytic[name], numeric_grad(g, env, name), rtol=1e-6, atol=1e-8,
                                   err_msg=f"d loss / d {name}")


def test_every_differentiable_op_is_checked() -> None:
    differentiable = {name for name, d in REGISTRY.items() if d.grad is not None}
    checked = {c[1] for c in CASES} | {"cast"}  # cast's gradient is a cast back: exact, no check needed
    assert differentiable <= checked, differentiable - checked


def directional_check(t: Graph, g: Graph, env: dict[str, np.ndarray], directions: int = 3, h: float = 1e-6) -> None:
    analytic = analytic_grads(t, env)
    for k in range(directions):
        rng = np.random.default_rng(k)
        d = {p: rng.standard_normal(env[p].shape) for p in g.params}
        plus = {**env, **{p: env[p] + h * d[p] for p in g.params}}
        minus = {**env, **{p: env[p] - h * d[p] for p in g.params}}
        numeric = (loss_of(g, plus) - loss_of(g, minus)) / (2 * h)
        exact = sum(float((analytic[p] * d[p]).sum()) for p in analytic)
        assert numeric == pytest.approx(exact, rel=1e-5, abs=1e-7)


SMALL = {
    "mlp": ["batch=4", "features=6", "hidden=5", "classes=3"],
    "tiny_transformer": ["batch=2", "seq=4", "vocab=7", "dim=8", "heads=2", "ffn=6"],
    "tiny_resnet": ["batch=3", "image=6", "width=2", "blocks=1", "classes=3"],
    "lstm_lm": ["layers=2", "hidden=3", "vocab=5", "seq=3", "batch=2"],
}


@pytest.mark.parametrize("name", list(SMALL))
def test_whole_model_gradient(name: str) -> None:
    _, fwd = build_graph(str(MODELS / f"{name}.swp"), SMALL[name])
    g = retyped(fwd, DType.f32, F64)
    t = training_graph(g)
    env = {**init_persistent(t, 0, np), **synthetic_inputs(g, 0, np)}
    # random (not initial) values, so no parameter sits at a symmetric point such as zeros
    env.update({p: np.random.default_rng(i).normal(0, 0.5, env[p].shape) for i, p in enumerate(g.params)})
    directional_check(t, g, env)


def test_multiple_uses_sum_their_gradients(in_tmp) -> None:
    write(in_tmp / "m.swp", """model m() {
    param w: [3] = ones
    loss = sum(w * w + w)
    minimize loss with sgd(lr = 0.1)
}
""")
    _, g = build_graph("m.swp", [])
    t = training_graph(g)
    env = {"w": np.array([1.0, 2.0, 3.0], dtype=np.float32)}
    np.testing.assert_allclose(analytic_grads(t, env)["w"], 2 * env["w"] + 1)


def test_reporting_a_parameter_the_step_updates_is_refused_at_it(in_tmp) -> None:  # noqa: ANN001
    from swapdsl.common.errors import SwpError

    write(in_tmp / "m.swp", """model m() {
    param w: [] = ones
    loss = w * w
    minimize loss with sgd(lr = 0.1)
    report norm = w
}
""")
    _, g = build_graph("m.swp", [])
    with pytest.raises(SwpError, match="reports the parameter `w` itself") as caught:
        training_graph(g)
    assert caught.value.span is not None and caught.value.span.line == 2
    write(in_tmp / "n.swp", (in_tmp / "m.swp").read_text().replace("report norm = w", "report norm = w * 1"))
    check_graph(training_graph(build_graph("n.swp", [])[1]))


SLICES = """model m() {{
    param w: [2, 6] = xavier
    loss = {expr}
    minimize loss with sgd(lr = 0.1)
}}
"""


@pytest.mark.parametrize("expr,joined", [
    ("sum(w[:, 0:2] * w[:, 2:4] + w[:, 4:6])", True),  # a partition: one concat
    ("sum(w[:, 1:2] * w[:, 4:6])", True),  # gaps: zeros fill them
    ("sum(w[:, 0:4] * w[:, 2:6])", False),  # overlapping: a padded tensor each, summed
    ("sum(w[:, 0:6:2] * w[:, 1:6:2])", False),  # strided
    ("sum(w[0:1, :] * w[:, 0:6][1:2, :])", False),  # along two axes
])
def test_slice_gradients_are_joined(in_tmp, expr: str, joined: bool) -> None:
    write(in_tmp / "m.swp", SLICES.format(expr=expr))
    _, g = build_graph("m.swp", [])
    t = retyped(training_graph(g), DType.f32, F64)
    check_graph(t)
    producer = {op.outputs[0]: op for op in t.ops}
    (grad,) = [dw for _, dw in t.grads]
    assert (producer[grad].op == "concat") == joined
    assert any(op.op == "slice_grad" for op in t.ops) != joined
    env = {"w": np.random.default_rng(0).normal(0, 1, (2, 6))}
    directional_check(t, retyped(g, DType.f32, F64), env)


def test_unrolled_lstm_input_gradient_is_one_concat() -> None:
    _, g = build_graph(str(MODELS / "lstm_lm.swp"), SMALL["lstm_lm"])
    t = training_graph(g)
    assert not any(op.op == "slice_grad" for op in t.ops)
    joins = [len(op.inputs) for op in t.ops if op.op == "concat" and t.tensors[op.outputs[0]].kind is Kind.gradient]
    # per layer (2): the gradient of its input is one concat of its 3 time steps', that of each step's gates
    # one of the 4 gates'
    assert sorted(joins) == [3] * 2 + [4] * 2 * 3


def test_a_shared_weight_gradient_is_summed_in_place(in_tmp) -> None:
    """A weight read by three matmuls (an RNN's over three time steps) gets one weight-gradient matmul
    and two that add into the sum so far, each writing over it; no add and no second full-size
    gradient is made, and the sum is right."""
    write(in_tmp / "m.swp", """model m(batch = 2) {
    input x: f32[batch, 3]
    param w: [3, 3] = xavier
    h = tanh(tanh(x @ w) @ w)
    loss = mean(h @ w)
    minimize loss with sgd(lr = 0.1)
}
""")
    _, g = build_graph("m.swp", [])
    t = retyped(training_graph(g), DType.f32, F64)
    check_graph(t)
    producer = {op.outputs[0]: i for i, op in enumerate(t.ops)}
    (dw,) = [grad for _, grad in t.grads]
    chain = [producer[dw]]
    while t.ops[chain[-1]].op == "matmul_tn_fold_acc":
        chain.append(producer[t.ops[chain[-1]].inputs[0]])
    assert [t.ops[i].op for i in chain] == ["matmul_tn_fold_acc"] * 2 + ["matmul_tn_fold"]
    assert in_place_ops(t) >= set(chain[:2])
    assert not any(op.op == "add" and dw in op.outputs for op in t.ops)
    env = {"x": rnd(2, 3, seed=1), "w": rnd(3, 3, seed=2)}
    directional_check(t, retyped(g, DType.f32, F64), env)


def test_which_ops_write_over_their_first_input(in_tmp) -> None:
    """An add writes over its first operand when it alone reads it, at the output's type, and it is
    not kept past the step; never over a parameter, an input or a broadcast operand."""
    write(in_tmp / "m.swp", """model m(batch = 2) {
    input x: f32[batch, 3]
    param w: [3, 3] = xavier
    param b: [3] = zeros
    y = x @ w + b
    z = b + tanh(x)
    u = x + y
    loss = mean(u * z)
    minimize loss with sgd(lr = 0.1)
}
""")
    _, g = build_graph("m.swp", [])
    adds = [i for i, op in enumerate(g.ops) if op.op == "add"]  # x @ w + b, b + tanh(x), x + y
    assert in_place_ops(g) == {adds[0]}
    t = training_graph(g)
    assert all(t.ops[i].op in ("add", "sgd") for i in in_place_ops(t))
    assert sum(t.ops[i].op == "sgd" for i in in_place_ops(t)) == 2


def test_unused_branches_get_no_backward_ops(in_tmp) -> None:
    write(in_tmp / "m.swp", """model m(batch = 2) {
    input x: f32[batch, 3]
    param used: [3, 2] = xavier
    param unused: [3, 5] = xavier
    side = relu(x @ unused)
    loss = mean(x @ used)
    minimize loss with adam()
}
""")
    _, g = build_graph("m.swp", [])
    t = training_graph(g)
    check_graph(t)
    assert [p for p, _ in t.grads] == ["used"]
    assert all("unused" not in op.inputs for op in t.ops)  # neither its forward branch nor a gradient
    assert {op.op for op in t.ops} >= {"adam_m", "adam_v", "adam_apply"}
    assert t.state == ("used/m", "used/v")


def test_partial_results_are_temporaries(in_tmp) -> None:
    write(in_tmp / "m.swp", """model m(batch = 2) {
    input x: f32[batch, 3]
    param w: [3] = ones
    loss = mean(x * w)
    minimize loss with sgd(lr = 0.1)
}
""")
    t = training_graph(build_graph("m.swp", [])[1])
    (grad,) = [g for p, g in t.grads]
    producer = {op.outputs[0]: op for op in t.ops}
    assert producer[grad].op == "sum_to"
    assert t.tensors[producer[grad].inputs[0]].kind is Kind.temporary  # g * x before it is summed down


def test_no_gradient_flows_into_data(in_tmp) -> None:
    _, g = build_graph(str(MODELS / "mlp.swp"), ["depth=1"])
    t = training_graph(g)
    # x is an input: the matmul's dx = g @ w^T is never computed
    assert not any(op.op == "matmul_nt" and t.tensors[op.outputs[0]].type.shape == (64, 784) for op in t.ops)


def test_tensor_kinds_and_persistence() -> None:
    _, g = build_graph(str(MODELS / "tiny_resnet.swp"), ["batch=2"])
    t = training_graph(g)
    kinds = {tensor.kind for tensor in t.tensors.values()}
    assert kinds >= {Kind.input, Kind.param, Kind.activation, Kind.gradient, Kind.optimizer_state}
    assert {old for old, _ in t.updates} == set(t.params) | set(t.state)
    for p, grad in t.grads:
        assert t.tensors[grad].kind is Kind.gradient
        assert t.type_of(grad) == t.type_of(p)
    # a param's update comes after its last reader: updates can run in place
    check_graph(t)
