"""Micro-batches (gradient accumulation) as a graph pass: one step's graph at a micro-batch -> the step
that runs a batch k times its size as k forward and backward passes and one update.

The pass takes a training (or evaluation) graph built at the micro-batch's size and writes it out k
times, in order, so that each micro-batch's activations die before the next one's forward pass:

- the step's inputs keep their full batch (k times the micro-batch along axis 0); micro-batch i reads
  its rows through a ``slice``, made just before its first reader;
- what depends on nothing but the parameters and state (the half copies of the parameters, the loss's
  gradient) is made once, in micro-batch 0, and shared; the loss's gradient is multiplied by 1/k, so the
  k micro-batches' gradients add up to the gradient of the mean loss over the whole batch;
- each parameter's gradient is summed over the micro-batches as they finish (``add``, in place); the
  ops that read the sums (optimiser updates, the guard's unscaling and finiteness flag, the loss scale)
  run once, where they stood in the last micro-batch, so an update still follows its gradient's end;
- the loss and every report made from a micro-batch are the mean of the k micro-batches' values (exact
  for means, such as a loss or an accuracy; a report must be a scalar);
- state that a micro-batch updates itself (batch norm's running statistics, moving averages) takes the
  k updates PyTorch's k forward passes would: the micro-batches run the update from zero, one after
  another, and one ``running_merge`` adds that to the statistic times (1 - momentum)^k, in place over
  it (as planners expect of an update);
- dropout in micro-batch i is told where its rows start in the whole batch (``offset``), so its mask is
  the one the whole batch would draw when the batch is its first axis.

Batch normalisation computes its statistics over each micro-batch (as PyTorch does under gradient
accumulation): with batch norm, k > 1 changes the numbers; without it only the rounding differs.
Micro-batch 0 keeps the graph's tensor names; micro-batch i > 0 renames a tensor ``NAME/mbI`` (an
unnamed ``%N`` gets a fresh number).
"""

from __future__ import annotations

import math

from collections.abc import Iterable

import attrs

from swapdsl.common.errors import SwpError
from swapdsl.graph import ops
from swapdsl.graph.analysis import rowwise_dropout_seeds
from swapdsl.graph.ir import Graph, Kind, Op, Tensor, TensorType


# per-micro-batch updates the pass can fold (moving averages: r = (1 - momentum) * r + momentum * s)
MOVING_AVERAGES = frozenset({"batch_norm_running_mean", "batch_norm_running_var"})
MAX_MICROBATCHES = 4096  # a graph k times the size of one micro-batch's: past this, planning it is hopeless


def microbatched(g: Graph, k: int) -> Graph:
    """``g`` (built at the micro-batch) run as ``k`` micro-batches a step (k = 1: ``g`` itself)."""
    if k == 1:
        return g
    return _Pass(g, k).run()


def check_microbatches(batch: object, k: int) -> int:
    """The micro-batch size for a model argument ``batch`` split ``k`` ways, or a clear error."""
    if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= MAX_MICROBATCHES:
        raise SwpError(f"micro-batches: expected a whole number from 1 to {MAX_MICROBATCHES}, not {k!r}")
    if not isinstance(batch, int) or isinstance(batch, bool):
        raise SwpError("micro-batches split the model argument `batch`, and this model has none",
                       hints=["give the model a `batch` argument that sizes its inputs' first axis"])
    if batch < 1:
        raise SwpError(f"a batch of {batch} does not split into micro-batches: a batch is at least 1")
    if batch % k:
        raise SwpError(f"a batch of {batch} does not split into {k} equal micro-batches",
                       hints=[f"micro-batch counts that divide {batch}: {', '.join(map(str, divisors(batch)))}"])
    return batch // k


def divisors(n: int) -> list[int]:
    """``n``'s divisors, ascending (in sqrt(n) steps: a batch of 2**31 took minutes counting to it)."""
    small = [d for d in range(1, math.isqrt(max(n, 0)) + 1) if n % d == 0]  # (none below 1)
    return small + [n // d for d in reversed(small) if d * d != n]


def _once_ops(g: Graph) -> tuple[set[int], set[int]]:
    """(ops run once after the micro-batches: what reads a summed gradient, and the reports' updates;
    ops run once before them: the loss's gradient, and what reads nothing but parameters, state and
    other such ops; not what reads the loss's gradient, which each micro-batch reads scaled)."""
    after: set[int] = set()
    tainted = {grad for _, grad in g.grads}
    for i, op in enumerate(g.ops):
        writes_metric = any(g.tensors[n].kind is Kind.metric for n in op.outputs)
        if writes_metric or tainted.intersection(op.inputs):
            after.add(i)
            tainted.update(op.outputs)
    shared = set(g.persistent) - {g.seed}
    before: set[int] = set()
    for i, op in enumerate(g.ops):
        if i in after:
            continue
        if op.outputs[0] == g.seed:
            before.add(i)
        elif op.inputs and shared.issuperset(op.inputs):
            before.add(i)
            shared.update(op.outputs)
    return after, before


class _Pass:
    def __init__(self, g: Graph, k: int) -> None:
        self.g, self.k = g, k
        self.rowwise = rowwise_dropout_seeds(g)
        self.after, self.before = _once_ops(g)
        # tensors with one name in every micro-batch: made once, before or after them, or kept across steps
        self.once = set(g.persistent) | {n for j in self.before | self.after for n in g.ops[j].outputs}
        self.tensors: dict[str, Tensor] = {}
        self.ops: list[Op] = []
        self.counter = 1 + max((int(n[1:]) for n in g.tensors if n.startswith("%")), default=-1)
        self.summed = {grad: grad for _, grad in g.grads}  # a micro-batch's gradient -> the sum so far
        self.averaged = self._averaged()  # the loss and the reports made per micro-batch -> the sum so far
        self.shared: dict[str, str] = {}  # the loss's gradient -> its copy scaled by 1/k
        made_once = self.once - set(g.persistent)
        self.threaded = {new: old for old, new in g.updates if new not in made_once}  # updated per micro-batch
        for new, old in self.threaded.items():
            maker = next(op for op in g.ops if new in op.outputs)
            if maker.op not in MOVING_AVERAGES or maker.inputs[0] != old:
                raise SwpError(f"micro-batches cannot split `{maker.op}`, which updates `{old}` in every forward pass")
        self.latest: dict[str, str] = {}  # such state -> the updates from zero so far
        self.merged: dict[str, str] = {}  # such state -> its new value

    def _averaged(self) -> dict[str, str]:
        per_batch = {n for i, op in enumerate(self.g.ops) if i not in self.after | self.before for n in op.outputs}
        out = {}
        for name in [self.g.loss, *(t for _, t in self.g.reports)]:
            if name in per_batch:
                t = self.g.tensors[name]
                if t.type.shape != () or not t.type.dtype.is_float:
                    report = next((n for n, r in self.g.reports if r == name), name)
                    raise SwpError(f"micro-batches average each report over the batch; report `{report}` is "
                                   f"{t.type}, not a float scalar", t.span,
                                   hints=["report a mean (`mean(cast(..., f32))`), which averages exactly"])
                out[name] = name
        return out

    def run(self) -> Graph:
        g = self.g
        for name in g.persistent:
            self.tensors[name] = g.tensors[name]
        for name in g.inputs:
            t = g.tensors[name]
            full = TensorType((t.type.shape[0] * self.k, *t.type.shape[1:]), t.type.dtype)
            self.tensors[name] = attrs.evolve(t, type=full)
        for i in range(self.k):
            self._micro_batch(i)
        final = {**self.summed, **self.averaged}
        return attrs.evolve(
            g, tensors=self.tensors, ops=tuple(self.ops), loss=final.get(g.loss, g.loss),
            reports=tuple((n, final.get(t, t)) for n, t in g.reports),
            grads=tuple((p, self.summed[grad]) for p, grad in g.grads),
            updates=tuple((old, self.merged.get(old, new)) for old, new in g.updates),
            seed=self.shared.get(g.seed, g.seed), microbatches=self.k)

    def _micro_batch(self, i: int) -> None:
        names: dict[str, str] = {}  # this micro-batch's name of each tensor it makes or slices
        last = i == self.k - 1
        if i == 0 and self.g.seed in self.g.persistent:
            self._scale_seed()
        for j, op in enumerate(self.g.ops):
            if (j in self.after and not last) or (j in self.before and i > 0):
                continue
            for name in op.inputs:
                if name in self.g.inputs and name not in names:
                    names[name] = self._slice(name, i)
            if j in self.after:
                final = {**self.summed, **self.averaged}
                ins = tuple(final.get(n) or self._read(n, names, scaled=False) for n in op.inputs)
                self._emit(attrs.evolve(op, inputs=ins), op.outputs, 0)
                continue
            ins = tuple(self._read(n, names) for n in op.inputs)
            if i == 0 and op.outputs[0] in self.threaded:  # the first micro-batch's update starts from zero
                ins = (self._zeros(op.inputs[0]), *ins[1:])
            outs = op.outputs if i == 0 or j in self.before else tuple(self._rename(n, i) for n in op.outputs)
            names.update(zip(op.outputs, outs))
            self._emit(attrs.evolve(op, inputs=ins, outputs=outs, attrs=self._attrs(op, i)), op.outputs, i)
            if op.outputs[0] == self.g.seed:
                self._scale_seed()
            for old, new in zip(op.outputs, outs):
                self._accumulate(old, new, i)
                if old in self.threaded:
                    self._thread(self.threaded[old], new, op, i)

    def _zeros(self, like: str) -> str:
        t = self.g.tensors[like]
        return self._made("fill", (), like, Kind.optimizer_state, "from zero",
                          shape=t.type.shape, value=0.0, dtype=t.type.dtype.label)

    def _thread(self, state: str, value: str, op: Op, i: int) -> None:
        """Micro-batch ``i`` updated ``state`` (from zero, or from the micro-batch before): after the last,
        the statistic's new value, in place over it."""
        self.latest[state] = value
        if i == self.k - 1:
            decay = (1.0 - float(op.attr("momentum"))) ** self.k
            self.merged[state] = self._made("running_merge", (state, value), op.outputs[0], Kind.optimizer_state,
                                            "merged", decay=decay)

    def _read(self, name: str, names: dict[str, str], scaled: bool = True) -> str:
        """This micro-batch's name of ``name``; the loss's gradient scaled by 1/k, except for what runs after
        the micro-batches (when the seed is the loss scale itself, unscaling and stepping it read it as is)."""
        if name in self.shared and scaled:
            return self.shared[name]
        if name in self.latest:
            return self.latest[name]
        return name if name in self.once else names[name]

    def _emit(self, op: Op, originals: Iterable[str], i: int) -> None:
        for old, new in zip(originals, op.outputs):
            t = self.g.tensors[old]
            self.tensors[new] = t if new == old else attrs.evolve(t, name=new, label=f"{t.title} (micro-batch {i})")
        self.ops.append(op)

    def _rename(self, name: str, i: int) -> str:
        return self._fresh_name() if name.startswith("%") else f"{name}/mb{i}"

    def _fresh_name(self) -> str:
        self.counter += 1
        return f"%{self.counter - 1}"

    def _attrs(self, op: Op, i: int) -> tuple:
        """Dropout over the rows in micro-batch ``i`` hashes the element indices the whole batch's tensor
        gives them (``analysis.rowwise_dropout_seeds``; any other draws one mask for the whole batch)."""
        if op.op != "dropout" or i == 0 or op.attr_dict["seed"] not in self.rowwise:
            return op.attrs
        a = op.attr_dict
        a["offset"] = a.get("offset", 0) + i * self.g.tensors[op.outputs[0]].type.numel
        return tuple(sorted(a.items()))

    def _slice(self, name: str, i: int) -> str:
        t = self.g.tensors[name]
        rows, new = t.type.shape[0], f"{name}/mb{i}"
        self.tensors[new] = Tensor(new, t.type, Kind.activation, None, t.span, f"{t.title} (micro-batch {i})")
        where = (("axis", 0), ("start", i * rows), ("step", 1), ("stop", (i + 1) * rows))
        self.ops.append(Op("slice", (name,), (new,), where, t.span))
        return new

    def _scale_seed(self) -> None:
        self.shared[self.g.seed] = self._made("mul_scalar", (self.g.seed,), self.g.seed, Kind.gradient,
                                              f"/ {self.k}", value=1.0 / self.k)

    def _accumulate(self, old: str, new: str, i: int) -> None:
        """After micro-batch ``i`` made ``new`` (its ``old``): add it to the sum so far; after the last one,
        an averaged value's mean."""
        if old in self.summed and i > 0:
            self.summed[old] = self._made("add", (self.summed[old], new), old, Kind.gradient, "summed")
        if old in self.averaged:
            kind = self.g.tensors[old].kind
            if i > 0:
                self.averaged[old] = self._made("add", (self.averaged[old], new), old, kind, "summed")
            if i == self.k - 1:
                self.averaged[old] = self._made("mul_scalar", (self.averaged[old],), old, kind, "mean",
                                                value=1.0 / self.k)

    def _made(self, op: str, ins: tuple[str, ...], like: str, kind: Kind, what: str, **a: float) -> str:
        """A new op of the pass's own (a sum, a mean, the scaled seed), labelled after the tensor ``like``."""
        t = self.g.tensors[like]
        new = self._fresh_name()
        out_type = ops.infer(op, tuple(self.tensors[n].type for n in ins), a)
        self.tensors[new] = Tensor(new, out_type, kind, None, t.span, f"{t.title} {what}")
        self.ops.append(Op(op, ins, (new,), tuple(sorted(a.items())), t.span))
        return new
