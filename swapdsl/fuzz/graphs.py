"""Random training graphs built directly as IR, for property tests of planners and the validator and
for bench/bound_gap.py. Choices come from a seeded Random here; the tests draw them with Hypothesis
(tests/strategies.py) so that a failing graph shrinks."""

from __future__ import annotations

import random
from typing import Protocol

import attrs

from swapdsl.graph.autodiff import training_graph
from swapdsl.graph.ir import DType, Graph, Init, Kind, Op, Optimizer, Tensor
from swapdsl.graph.ops import infer
from swapdsl.graph.precision import autocast

F32 = DType.f32


class Builder:
    def __init__(self) -> None:
        self.tensors: dict[str, Tensor] = {}
        self.ops: list[Op] = []
        self.params: list[str] = []
        self.inputs: list[str] = []

    def declare(self, name: str, shape: tuple[int, ...], kind: Kind, dtype: DType = F32) -> str:
        from swapdsl.graph.ir import TensorType

        init = Init("normal", (("std", 0.1), ("mean", 0.0))) if kind is Kind.param else None
        self.tensors[name] = Tensor(name, TensorType(shape, dtype), kind, init)
        (self.params if kind is Kind.param else self.inputs).append(name)
        return name

    def op(self, name: str, inputs: list[str], **attrs: object) -> str:
        out_type = infer(name, tuple(self.tensors[n].type for n in inputs), attrs)
        out = f"%{len(self.ops)}"
        self.tensors[out] = Tensor(out, out_type, Kind.activation)
        self.ops.append(Op(name, tuple(inputs), (out,), tuple(sorted(attrs.items()))))
        return out

    def forward(self, loss: str, optimizer: Optimizer) -> Graph:
        """The forward graph built so far, minimising ``loss`` with ``optimizer``."""
        return Graph("random", (), self.tensors, tuple(self.ops), tuple(self.inputs), tuple(self.params), loss,
                     optimizer, "0" * 64)


class Choices(Protocol):
    """Where a random graph's choices come from."""

    def pick(self, options: list) -> object: ...  # type: ignore[type-arg]

    def integer(self, lo: int, hi: int) -> int: ...

    def flip(self) -> bool: ...


class SeededChoices:
    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)

    def pick(self, options: list) -> object:  # type: ignore[type-arg]
        return self.rng.choice(options)

    def integer(self, lo: int, hi: int) -> int:
        return self.rng.randint(lo, hi)

    def flip(self) -> bool:
        return self.rng.random() < 0.5


def seeded_training_graph(seed: int, max_depth: int = 7, extras: bool = True) -> Graph:
    return random_training_graph(SeededChoices(seed), max_depth, extras)


def random_training_graph(c: Choices, max_depth: int, extras: bool = True,
                          precisions: tuple[str, ...] = ("f32",), guards: tuple[str, ...] = ("none",)) -> Graph:
    """An MLP-like net of random depth with fan-out, long skips and shared weights, and what the zoo
    has besides: ops that read one tensor twice at its last use (``h * h``, ``concat([a, a])``), a
    tensor split into slices that are joined again (several slices of one tensor: their gradients
    are joined in the backward pass), dropout, and the input read again at the end (``extras``; without
    them, the graphs of the releases before, which bench/bound_gap.py's published figures use); under one
    of ``precisions`` (graph/precision.py) and ``guards`` (a guarded step, autodiff)."""
    draw_pick, draw_int, flip = c.pick, c.integer, c.flip
    batch = draw_pick([2, 4, 8])
    width = draw_pick([4, 8, 16, 32])
    depth = draw_int(2, max_depth)
    b = Builder()
    x = b.declare("x", (batch, width), Kind.input)
    y = b.declare("y", (batch,), Kind.input, DType.i32)
    weights: list[str] = []
    hidden = [x]
    for layer in range(depth):
        if weights and flip():
            w = draw_pick(weights)  # shared weight
        else:
            w = b.declare(f"w{layer}", (width, width), Kind.param)
            weights.append(w)
        src = draw_pick(hidden[-3:])  # fan-out: an earlier activation read again
        h = b.op("matmul", [src, w])
        if flip():
            h = b.op("add", [h, b.declare(f"b{layer}", (width,), Kind.param)])
        h = b.op(draw_pick(["relu", "tanh", "gelu"]), [h])
        extra = draw_pick(["none", "none", "square", "split", "dropout"]) if extras else "none"
        if extra == "square":
            h = b.op("mul", [h, h])  # one tensor, read twice by its last reader
        elif extra == "split":
            half = width // 2
            lo = b.op("slice", [h], axis=1, start=0, stop=half, step=1)
            hi = b.op("slice", [h], axis=1, start=half, stop=width, step=1)
            h = b.op("concat", [hi, b.op("tanh", [lo])] if flip() else [lo, lo], axis=1)
        elif extra == "dropout":
            h = b.op("dropout", [h], p=0.25, seed=layer)
        if len(hidden) > 2 and flip():
            h = b.op("add", [h, draw_pick(hidden[:-1])])  # long skip
        hidden.append(h)
    if extras and flip():
        hidden.append(b.op("add", [hidden[-1], x]))  # the input, read again at the very end
    classes = b.declare("head", (width, 3), Kind.param)
    loss = b.op("softmax_cross_entropy", [b.op("matmul", [hidden[-1], classes]), y])
    optimizer = draw_pick([
        Optimizer("sgd", (("lr", 0.1), ("momentum", 0.0), ("weight_decay", 0.0))),
        Optimizer("sgd", (("lr", 0.1), ("momentum", 0.9), ("weight_decay", 0.0))),
        Optimizer("adam", (("lr", 1e-3), ("beta1", 0.9), ("beta2", 0.999), ("eps", 1e-8), ("weight_decay", 0.0))),
    ])
    fwd = b.forward(loss, optimizer)
    precision = draw_pick(list(precisions)) if len(precisions) > 1 else precisions[0]
    guard = draw_pick(list(guards)) if len(guards) > 1 else guards[0]
    return training_graph(attrs.evolve(autocast(fwd, str(precision)), guard=guard))
