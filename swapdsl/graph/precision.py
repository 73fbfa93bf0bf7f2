"""Mixed precision as a graph pass: a forward graph in f32 -> the same model under a half-precision policy.

The policy (``optimize --precision bf16|f16``), op by op, in the manner of ``torch.autocast`` (which
keeps the outputs of norms and softmax in f32 where this stores them half, computed in f32):

- ``HALF_OPS`` (matrix products, convolutions) take half inputs and give half outputs.
- ``WIDE_OPS`` (the squared-error loss, and the reductions ``sum`` and ``mean``) take f32 inputs and
  give f32.
- the cross-entropy loss reads half logits as they are and gives an f32 loss: its kernels compute in
  f32 a chunk of rows at a time (the same numbers a cast to f32 first would give, without an f32 copy
  of the logits and their gradient, a step's largest tensors in a language model).
- every other op follows its float inputs: in half if any is half (the others, parameters such as a
  bias or a norm's scale among them, are cast down), else as they are.

Every kernel on half tensors computes in f32 and rounds its result once to the half output
(``kernels.kernel_of``): products and sums accumulate in f32, and norms, softmax and GELU run in f32,
as tensor-core GEMMs, cuDNN and fused element-wise kernels do. So activations, and what the backward
pass saves of them, are half; the loss is f32.

Parameters keep their f32 master copy (the optimiser updates it, with f32 state); the forward reads a
half copy made by one ``cast`` per step (``NAME/bf16``), an activation the planner places, swaps or
recomputes like any other. A ``frozen`` parameter, never updated, is stored half itself. A tensor is
cast to a type at most once. Only f32 tensors take part: a model that declares other dtypes keeps them,
and explicit ``cast`` and ``fill`` ops keep the type they ask for. Autodiff then differentiates the casts as it does any op, so a parameter's gradient arrives in f32.
"""

from __future__ import annotations

import attrs

from swapdsl.graph import ops
from swapdsl.graph.ir import DType, Graph, Kind, Op, Tensor, TensorType

PRECISIONS = ("f32", "bf16", "f16")
# a guarded step (autodiff): none; skip (updates gated on every gradient being finite); scale (and dynamic
# loss scaling, which f16 needs: its gradients underflow below 6e-8 and overflow above 65504)
GUARDS = ("none", "skip", "scale")


def default_guard(precision: str) -> str:
    return "scale" if precision == "f16" else "none"

HALF_OPS = frozenset({"matmul", "conv2d"})
WIDE_OPS = frozenset({"mse_loss", "sum", "mean"})
KEEPS_ITS_TYPE = frozenset({"cast", "fill"})  # the dtype is an attribute the model asked for


def autocast(fwd: Graph, precision: str) -> Graph:
    """``fwd`` under ``precision`` ("f32": unchanged)."""
    if precision == "f32":
        return fwd
    return _Pass(fwd, DType[precision]).run()


class _Pass:
    def __init__(self, fwd: Graph, half: DType) -> None:
        self.fwd, self.half = fwd, half
        self.tensors: dict[str, Tensor] = dict(fwd.tensors)
        self.ops: list[Op] = []
        self.casts: dict[tuple[str, DType], str] = {}
        self.counter = 1 + max((int(n[1:]) for n in fwd.tensors if n.startswith("%")), default=-1)
        for name in fwd.frozen:  # never updated, so no f32 master: stored half, read without a cast
            if self.dtype(name) is DType.f32:
                t = self.tensors[name]
                self.tensors[name] = attrs.evolve(t, type=TensorType(t.type.shape, half))

    def run(self) -> Graph:
        for op in self.fwd.ops:
            self.ops.append(self.rewrite(op))
        return attrs.evolve(self.fwd, tensors=self.tensors, ops=tuple(self.ops), precision=self.half.label)

    def dtype(self, name: str) -> DType:
        return self.tensors[name].type.dtype

    def rewrite(self, op: Op) -> Op:
        out = op.outputs[0]
        f32_out = self.fwd.type_of(out).dtype is DType.f32
        if op.op in KEEPS_ITS_TYPE:
            want = None
        elif op.op in HALF_OPS and f32_out:
            want = self.half
        elif op.op in WIDE_OPS and f32_out:
            want = DType.f32
        else:  # follow the inputs, whatever the output (a comparison of a half and an f32 tensor, say)
            floats = {self.dtype(n) for n in op.inputs if self.dtype(n).is_float}
            want = self.half if self.half in floats else None
        inputs = tuple(self.cast(n, want, op) if want is not None and self._castable(n) else n for n in op.inputs)
        new_type = ops.infer(op.op, tuple(self.tensors[n].type for n in inputs), op.attr_dict)
        self.tensors[out] = attrs.evolve(self.tensors[out], type=new_type)
        return attrs.evolve(op, inputs=inputs)

    def _castable(self, name: str) -> bool:
        return self.dtype(name) in (DType.f32, self.half)

    def cast(self, name: str, to: DType, reader: Op) -> str:
        """``name`` as a ``to`` tensor: itself, or the one cast of it, made (before ``reader``) on first need."""
        if self.dtype(name) is to:
            return name
        key = (name, to)
        if key not in self.casts:
            source = self.tensors[name]
            made = f"{name}/{to.label}" if not name.startswith("%") else f"%{self._next()}"
            self.tensors[made] = Tensor(made, TensorType(source.type.shape, to), Kind.activation, None, reader.span,
                                        f"{source.title} as {to.label}")
            self.ops.append(Op("cast", (name,), (made,), (("dtype", to.label),), reader.span))
            self.casts[key] = made
        return self.casts[key]

    def _next(self) -> int:
        self.counter += 1
        return self.counter - 1
