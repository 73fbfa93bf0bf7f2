"""Small random training graphs shaped like the zoo's families, for the exact planner's study
(bench/exact_gap.py): a convolution net, a transformer block, an unrolled LSTM. Each is a few forward
ops (14-30 with the backward pass and the updates), seeded, with random sizes; ``seeded_training_graph``
gives the MLP-shaped ones."""

from __future__ import annotations

import random

from swapdsl.fuzz.graphs import Builder
from swapdsl.graph.autodiff import training_graph
from swapdsl.graph.ir import DType, Graph, Kind, Optimizer

SGD = Optimizer("sgd", (("lr", 0.1), ("momentum", 0.0), ("weight_decay", 0.0)))


def conv_graph(seed: int) -> Graph:
    """conv -> relu (-> conv -> relu, with a residual add) -> global pool -> dense -> cross-entropy."""
    rng = random.Random(seed)
    b = Builder()
    n, c, hw = rng.choice([2, 4]), rng.choice([4, 8]), rng.choice([4, 8])
    x = b.declare("x", (n, c, hw, hw), Kind.input)
    y = b.declare("y", (n,), Kind.input, DType.i32)
    h = x
    for layer in range(rng.randint(1, 3)):
        w = b.declare(f"w{layer}", (c, c, 3, 3), Kind.param)
        out = b.op("relu", [b.op("conv2d", [h, w], stride=(1, 1), padding=(1, 1), dilation=(1, 1), groups=1)])
        h = b.op("add", [out, h]) if layer and rng.random() < 0.5 else out
    head = b.declare("head", (c, 3), Kind.param)
    loss = b.op("softmax_cross_entropy", [b.op("matmul", [b.op("global_avg_pool", [h]), head]), y])
    return _training(b, loss)


def attention_graph(seed: int) -> Graph:
    """One attention block over a sequence: q, k, v, softmax(q k^T) v, an output projection with a
    residual (or, in half the seeds, a gelu), -> dense -> cross-entropy."""
    rng = random.Random(seed)
    b = Builder()
    t, d = rng.choice([4, 8]), rng.choice([8, 16])
    x = b.declare("x", (t, d), Kind.input)
    y = b.declare("y", (t,), Kind.input, DType.i32)
    q, k, v = (b.op("matmul", [x, b.declare(f"w{name}", (d, d), Kind.param)]) for name in "qkv")
    attention = b.op("matmul", [b.op("softmax", [b.op("matmul_nt", [q, k])], axis=1), v])
    projected = b.op("matmul", [attention, b.declare("wo", (d, d), Kind.param)])
    h = b.op("gelu", [projected]) if rng.random() < 0.5 else b.op("add", [projected, x])
    loss = b.op("softmax_cross_entropy", [b.op("matmul", [h, b.declare("head", (d, 3), Kind.param)]), y])
    return _training(b, loss)


def lstm_graph(seed: int) -> Graph:
    """A recurrent cell unrolled over 2 steps with shared weights (h_0 = x_0 W, then tanh(x_t W + h U),
    gated by a sigmoid in half the seeds), the last state -> dense -> cross-entropy."""
    rng = random.Random(seed)
    b = Builder()
    n, d, steps = rng.choice([2, 4]), rng.choice([8, 16]), 2
    gated = rng.random() < 0.5
    xs = [b.declare(f"x{s}", (n, d), Kind.input) for s in range(steps)]
    y = b.declare("y", (n,), Kind.input, DType.i32)
    w, u = (b.declare(name, (d, d), Kind.param) for name in ("w", "u"))
    gate = b.declare("gate", (d, d), Kind.param) if gated else None
    h = b.op("matmul", [xs[0], w])
    for x in xs[1:]:
        cand = b.op("tanh", [b.op("add", [b.op("matmul", [x, w]), b.op("matmul", [h, u])])])
        h = b.op("mul", [b.op("sigmoid", [b.op("matmul", [h, gate])]), cand]) if gate else cand
    loss = b.op("softmax_cross_entropy", [b.op("matmul", [h, b.declare("head", (d, 3), Kind.param)]), y])
    return _training(b, loss)


SHAPES = {"conv": conv_graph, "attention": attention_graph, "lstm": lstm_graph}


def _training(b: Builder, loss: str) -> Graph:
    return training_graph(b.forward(loss, SGD))
