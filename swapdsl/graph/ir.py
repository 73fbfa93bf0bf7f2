"""The graph IR: typed tensors and the ops between them."""

from __future__ import annotations

import enum
import math
from typing import Union

from attrs import evolve as attrs_evolve
from attrs import field, frozen

from swapdsl.common.errors import Span




class DType(enum.Enum):
    f64 = ("f64", 8, True)
    f32 = ("f32", 4, True)
    f16 = ("f16", 2, True)
    bf16 = ("bf16", 2, True)
    i32 = ("i32", 4, False)
    i64 = ("i64", 8, False)

    def __init__(self, label: str, itemsize: int, is_float: bool) -> None:
        self.label = label
        self.itemsize = itemsize
        self.is_float = is_float

    def __str__(self) -> str:
        return self.label

    @property
    def bounds(self) -> tuple[float, float]:
        """The least and the greatest finite value of this dtype."""
        top = _LARGEST[self.label]
        return (-top if self.is_float else -top - 1), top

    @classmethod
    def names(cls) -> list[str]:
        return [d.label for d in cls]


_LARGEST = {"f64": 1.7976931348623157e308, "f32": 3.4028234663852886e38, "f16": 65504.0,
            "bf16": 3.3895313892515355e38, "i32": 2**31 - 1, "i64": 2**63 - 1}


@frozen
class TensorType:
    shape: tuple[int, ...]
    dtype: DType

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * self.dtype.itemsize

    def __str__(self) -> str:
        return f"{self.dtype}[{','.join(map(str, self.shape))}]"


class Kind(enum.Enum):
    input = "input"
    param = "param"
    activation = "activation"
    gradient = "gradient"
    optimizer_state = "optimizer_state"
    temporary = "temporary"
    metric = "metric"  # a `report`'s value, kept across steps like the optimiser state (training graphs)


@frozen
class Init:
    """How a parameter starts: zeros, ones, constant, normal, uniform, xavier_*, he_*."""

    kind: str
    args: tuple[tuple[str, float], ...] = ()

    def __str__(self) -> str:
        if not self.args:
            return self.kind
        return f"{self.kind}({', '.join(f'{k}={_fmt(v)}' for k, v in self.args)})"


@frozen
class Tensor:
    name: str
    type: TensorType
    kind: Kind
    init: Init | None = None  # parameters only
    span: Span | None = field(default=None, eq=False)
    # what a person calls an unnamed tensor (%12): the layer path and op that made it ("layer1.dense.matmul"),
    # or "grad " and the label of the tensor it is the gradient of
    label: str = field(default="", eq=False)

    @property
    def title(self) -> str:
        return self.label or self.name


AttrValue = Union[int, float, bool, str, tuple]


@frozen
class Op:
    op: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    attrs: tuple[tuple[str, AttrValue], ...] = ()
    span: Span | None = field(default=None, eq=False)

    def attr(self, name: str) -> AttrValue:
        for key, value in self.attrs:
            if key == name:
                return value
        raise KeyError(f"op {self.op} has no attribute {name!r}")

    @property
    def attr_dict(self) -> dict[str, AttrValue]:
        return dict(self.attrs)


@frozen
class Optimizer:
    name: str  # sgd or adam
    hparams: tuple[tuple[str, float], ...]

    def __str__(self) -> str:
        return f"{self.name}({', '.join(f'{k}={_fmt(v)}' for k, v in self.hparams)})"


FORWARD_ONLY = Optimizer("none", ())  # a model without `minimize`: it predicts, it does not train
# what training reports besides a model's own reports, by name (so no `report` may take these names)
TRAINER_REPORTS = {"loss": "the loss, shown every step", "finite": "whether a guarded step's gradients were "
                   "all finite (--guard)", "grad_norm": "the gradients' global norm (`clip = C`)",
                   "loss_scale": "the loss scale of f16 training (--guard scale)"}


@frozen
class Graph:
    """A model's forward graph: ops in program order over named tensors."""

    name: str
    args: tuple[tuple[str, int | float | bool], ...]
    tensors: dict[str, Tensor]
    ops: tuple[Op, ...]
    inputs: tuple[str, ...]
    params: tuple[str, ...]
    loss: str
    optimizer: Optimizer
    source_sha256: str = ""
    precision: str = "f32"  # the mixed-precision policy applied (graph/precision.py): f32, bf16 or f16
    guard: str = "none"  # none, skip (updates gated on finite gradients) or scale (and dynamic loss scaling)
    reports: tuple[tuple[str, str], ...] = ()  # (name, the tensor holding it): figures beside the loss
    outputs: tuple[tuple[str, str], ...] = ()  # (name, the tensor holding it): what `predict` writes, per example
    frozen: tuple[str, ...] = ()  # params the model declares `frozen`: no gradient, no optimiser state, no update
    # training graphs only (see autodiff.py):
    state: tuple[str, ...] = ()  # optimiser state: persistent like the params
    updates: tuple[tuple[str, str], ...] = ()  # (persistent tensor, the value that replaces it after a step)
    grads: tuple[tuple[str, str], ...] = ()  # (param, its gradient as backprop makes it: times the loss scale if any)
    seed: str = ""  # the loss's gradient, where the backward pass starts (1, or the loss scale)
    microbatches: int = 1  # the step runs its batch as this many forward/backward passes (graph/microbatch.py)
    ranks: int = 1  # data-parallel ranks, each running this step on its shard (graph/dataparallel.py)
    link_gbps: float = 0.0  # their network link, Gb/s (ranks > 1)
    bucket_mib: float = 0.0  # the gradients' all-reduce buckets, MiB (ranks > 1; 0: one per gradient)
    bucket_members: tuple[int, ...] = ()  # or, chosen by a search: each gradient's bucket (dataparallel.py)

    @property
    def training(self) -> bool:
        return bool(self.updates) or bool(self.grads)

    @property
    def metrics(self) -> dict[str, str]:
        """Each report's tensor after a training step: (name -> its persistent metric tensor)."""
        return {name: f"report/{name}" for name, _ in self.reports} if self.training else dict(self.reports)

    @property
    def persistent(self) -> tuple[str, ...]:
        """Tensors that live across iterations: the params and the optimiser state."""
        return self.params + self.state

    def type_of(self, name: str) -> TensorType:
        return self.tensors[name].type

    def consumers(self) -> dict[str, list[int]]:
        """For each tensor, the indices of the ops that read it, in order."""
        uses: dict[str, list[int]] = {name: [] for name in self.tensors}
        for i, op in enumerate(self.ops):
            for name in op.inputs:
                uses[name].append(i)
        return uses


def retyped(g: Graph, old: DType, new: DType) -> Graph:
    """The same graph with every ``old``-typed tensor made ``new`` (e.g. f32 -> f64 for gradient checks)."""
    tensors = {n: attrs_evolve(t, type=TensorType(t.type.shape, new)) if t.type.dtype is old else t
               for n, t in g.tensors.items()}
    ops = tuple(attrs_evolve(op, attrs=tuple((k, new.label if k == "dtype" and v == old.label else v)
                                             for k, v in op.attrs)) for op in g.ops)
    return attrs_evolve(g, tensors=tensors, ops=ops)


def _fmt(v: object) -> str:
    if isinstance(v, float):
        return repr(v)
    return str(v)
