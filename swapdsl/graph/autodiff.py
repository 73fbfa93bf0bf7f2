"""Forward graph + loss -> training graph: forward, backward and update ops.

Reverse-mode differentiation over the op list. Each op's gradient rule (in
the registry) appends ordinary IR ops, so the planner can schedule and swap
backward ops like any other. A tensor read several times gets the sum of its
gradients. The gradients of slices of one tensor are joined as a framework's
split backward does: slices along one axis that do not overlap get one concat
(zeros filling what no slice read), not a zero-padded full-size tensor per
slice and a chain of adds (which gave an unrolled LSTM's input a full-size
tensor per time step). Forward ops that do not reach the loss are dropped,
backward ops whose result nothing needs are dropped, and each parameter's
update is placed right after its gradient is complete, so gradients die early.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from swapdsl.common.errors import Span, SwpError
from swapdsl.graph import ops
from swapdsl.graph.ir import FORWARD_ONLY, DType, Graph, Init, Kind, Op, Tensor, TensorType
from swapdsl.graph.ops.optim import SCHEDULE


@attrs.frozen
class _Piece:
    """The gradient of one slice of a tensor, waiting to be joined with the others'."""

    op: Op  # the slice
    grad: str

    def attr(self, key: str) -> int:
        return int(self.op.attr_dict[key])


class _Builder:
    """Appends typed ops to the training graph; the GradBuilder of the registry."""

    def __init__(self, fwd: Graph) -> None:
        self.tensors: dict[str, Tensor] = dict(fwd.tensors)
        self.ops: list[Op] = []
        self.counter = 1 + max((int(n[1:]) for n in fwd.tensors if n.startswith("%")), default=-1)
        self.span: Span | None = None
        self.kind = Kind.temporary
        self.label = ""  # of the tensors emitted next (Tensor.label)
        self.made: dict[str, int] = {}  # output name -> its op's index in ``ops``

    def type(self, name: str) -> TensorType:
        return self.tensors[name].type

    def emit(self, op: str, inputs: Sequence[str], attrs_: Mapping[str, Any] | None = None) -> str:
        a = dict(attrs_ or {})
        out_type = ops.infer(op, tuple(self.type(n) for n in inputs), a)
        name = f"%{self.counter}"
        self.counter += 1
        self.tensors[name] = Tensor(name, out_type, self.kind, None, self.span, self.label)
        self.made[name] = len(self.ops)
        self.ops.append(Op(op, tuple(inputs), (name,), tuple(sorted(a.items())), self.span))
        return name

    def fold_into(self, acc: str, dx: str) -> bool:
        """Rewrite the op that made ``dx`` to add its result to ``acc`` as it goes (the registry's
        ``accumulate`` form), where it has one, ``acc`` was made before it and nothing has read ``dx``
        yet; says whether it did."""
        k = self.made.get(dx)
        op = self.ops[k] if k is not None else None
        if (op is None or ops.REGISTRY[op.op].accumulate is None or self.type(acc) != self.type(dx)
                or self.made.get(acc, k) >= k):
            return False
        if any(dx in later.inputs for later in self.ops[k + 1:]):
            return False
        self.ops[k] = attrs.evolve(op, op=ops.REGISTRY[op.op].accumulate, inputs=(acc, *op.inputs))
        return True

    def add_tensor(self, name: str, typ: TensorType, kind: Kind, init: Init | None = None) -> str:
        assert name not in self.tensors, f"state tensor {name} collides with a model tensor"
        self.tensors[name] = Tensor(name, typ, kind, init, None)
        return name


def live_forward_ops(fwd: Graph, targets: set[str] | None = None) -> list[Op]:
    """The forward ops the loss and the reports (or ``targets``) depend on, in program order."""
    needed = {fwd.loss} | {tensor for _, tensor in fwd.reports} if targets is None else set(targets)
    keep: list[Op] = []
    for op in reversed(fwd.ops):
        if needed.intersection(op.outputs):
            keep.append(op)
            needed.update(op.inputs)
    return keep[::-1]


def _depends_on_params(fwd: Graph, forward: list[Op]) -> set[str]:
    reached = set(fwd.params) - set(fwd.frozen)
    for op in forward:
        if reached.intersection(op.inputs):
            reached.update(op.outputs)
    return reached


def _trainable(g: Graph) -> None:
    if g.optimizer == FORWARD_ONLY:
        raise SwpError(f"model `{g.name}` has no `minimize` line: it can be checked and can predict, not be "
                       "trained, evaluated or planned for training",
                       hints=["add `minimize LOSS with sgd(lr = 0.01)` (`swapdsl import --loss` writes one)"])


def training_graph(fwd: Graph) -> Graph:
    """The full training step of ``fwd``: forward, backward and optimiser ops, in a valid order."""
    _trainable(fwd)
    forward = live_forward_ops(fwd)
    needs_grad = _depends_on_params(fwd, forward)
    params = set(fwd.params) - set(fwd.frozen)
    b = _Builder(fwd)
    first_use = {}
    for i, op in enumerate(forward):
        for name in op.inputs:
            first_use.setdefault(name, i)
    b.kind, b.label = Kind.gradient, f"grad {b.tensors[fwd.loss].title}"
    state: list[str] = []
    scale = _loss_scale(b, fwd, state) if fwd.guard == "scale" else None
    seed = _seed(b, fwd, scale)
    grads: dict[str, str] = {fwd.loss: seed}
    pieces: dict[str, list[_Piece]] = {name: [] for name in _joinable(forward)}
    updates: list[tuple[str, str]] = []
    param_grads: list[tuple[str, str]] = []
    deferred = fwd.guard != "none" or bool(dict(fwd.optimizer.hparams).get("clip"))  # updates after the backward
    running = running_names(fwd)
    for i in range(len(forward) - 1, -1, -1):
        op = forward[i]
        if op.op == "batch_norm":
            kind, label = b.kind, b.label
            updates += _labelled_updates(b, _running_updates(b, running, op, state))
            b.kind, b.label = kind, label
        g = _gradient(b, op.outputs[0], grads, pieces)
        if g is not None:
            _backprop(b, op, g, grads, pieces, needs_grad)
        for name in dict.fromkeys(op.inputs):
            if name in params and first_use[name] == i and _gradient(b, name, grads, pieces) is not None:
                param_grads.append((name, grads[name]))
                if not deferred:
                    updates += _labelled_updates(b, _update(b, fwd, name, grads[name], state))
    reports = list(fwd.reports)
    for name, tensor in reports:
        if tensor in fwd.params and tensor not in fwd.frozen:  # its update replaces it before reports are kept
            raise SwpError(f"`report {name}` reports the parameter `{tensor}` itself, which the step updates",
                           fwd.tensors[tensor].span, hints=[f"report a value made from it, such as `{tensor} * 1`"])
    if deferred:  # (on a copy: the graph's ``grads`` are the gradients backprop made, which micro-batches sum)
        reports += _deferred_updates(b, fwd, list(param_grads), scale, updates, state)
    _report_state(b, fwd, updates, state, reports)
    return attrs.evolve(_assemble(fwd, forward, b, updates, param_grads, state), reports=tuple(reports), seed=seed)


LOSS_SCALE = {"initial": 2.0**16, "growth": 2.0, "backoff": 0.5, "interval": 2000}  # torch.amp.GradScaler's


def _loss_scale(b: _Builder, fwd: Graph, state: list[str]) -> str:
    """The loss scale and its count of finite steps in a row: f32 scalars kept across steps."""
    if (mine := fwd.tensors.get("loss_scale")) is not None:
        raise SwpError("the model's tensor `loss_scale` has the name of the loss scale that --guard scale keeps",
                       mine.span, hints=["rename the model's tensor, or train with --guard skip"])
    scalar = TensorType((), DType.f32)
    scale = b.add_tensor("loss_scale", scalar, Kind.optimizer_state,
                         Init("constant", (("value", LOSS_SCALE["initial"]),)))
    state += [scale, b.add_tensor("loss_scale/good_steps", scalar, Kind.optimizer_state, Init("zeros"))]
    return scale


def _seed(b: _Builder, fwd: Graph, scale: str | None) -> str:
    """The loss's gradient: 1, or the loss scale (so every gradient is scaled by it)."""
    dtype = b.type(fwd.loss).dtype
    if scale is None:
        return b.emit("fill", [], {"shape": (), "value": 1.0, "dtype": dtype.label})
    return scale if dtype is DType.f32 else b.emit("cast", [scale], {"dtype": dtype.label})


def _deferred_updates(b: _Builder, fwd: Graph, param_grads: list[tuple[str, str]], scale: str | None,
                      updates: list[tuple[str, str]], state: list[str]) -> list[tuple[str, str]]:
    """After the whole backward pass: each gradient unscaled, one flag saying all are finite (a guarded
    step), the gradients clipped to a global norm (``clip``), every update (gated on the flag), the loss
    scale stepped; returns the reports it adds (the flag, the scale, the gradients' norm)."""
    b.kind, b.label = Kind.gradient, "unscaled gradient"
    if scale is not None:
        param_grads[:] = [(p, _unscaled(b, g, scale)) for p, g in param_grads]
    reports, flag = [], None
    if fwd.guard != "none":
        b.label = "all gradients finite"
        flag = b.emit("all_finite", [g for _, g in param_grads])
        reports.append(("finite", flag))
    clip = dict(fwd.optimizer.hparams).get("clip")
    if clip:
        reports.append(("grad_norm", _clipped(b, param_grads, clip)))
    for name, grad in param_grads:
        pairs = _update(b, fwd, name, grad, state, gate=flag)
        updates += _labelled_updates(b, pairs)
    if scale is not None:
        good = "loss_scale/good_steps"
        b.kind = Kind.optimizer_state
        a = {k: v for k, v in LOSS_SCALE.items() if k != "initial"}
        new_scale = b.emit("loss_scale_next", [scale, good, flag], a)
        updates += _labelled_updates(b, [(scale, new_scale), (good, b.emit("good_steps_next", [good, flag], a))])
        reports.append(("loss_scale", new_scale))  # the scale the next step uses
    return reports


def _clipped(b: _Builder, param_grads: list[tuple[str, str]], max_norm: float) -> str:
    """Every gradient times min(1, max_norm / (norm + 1e-6)), norm the L2 norm of all of them at once (as
    torch.nn.utils.clip_grad_norm_); returns the norm."""
    b.kind, b.label = Kind.gradient, "a gradient's sum of squares"
    squares = [b.emit("sum_squares", [g]) for _, g in param_grads]
    b.label = "gradients' global norm"
    norm = b.emit("global_norm", squares)
    b.label = "clipping factor"
    factor = b.emit("clip_factor", [norm], {"max_norm": max_norm})
    b.label = "clipped gradient"
    for k, (p, g) in enumerate(param_grads):
        dtype = b.type(g).dtype
        by = factor if dtype is DType.f32 else b.emit("cast", [factor], {"dtype": dtype.label})
        param_grads[k] = (p, b.emit("mul", [g, by]))
    return norm


def _unscaled(b: _Builder, grad: str, scale: str) -> str:
    dtype = b.type(grad).dtype
    by = scale if dtype is DType.f32 else b.emit("cast", [scale], {"dtype": dtype.label})
    return b.emit("div", [grad, by])


def _report_state(b: _Builder, fwd: Graph, updates: list[tuple[str, str]], state: list[str],
                  reports: tuple[tuple[str, str], ...] | list[tuple[str, str]] | None = None,
                  kind: str = "report") -> None:
    """Each report (or output: ``kind``) lives on as state that every step overwrites in place, as optimiser
    state is, so that planners keep its value to the end of the step without knowing about reports."""
    b.kind, span = Kind.metric, b.span
    for name, tensor in (fwd.reports if reports is None else reports):
        made = b.tensors.get(tensor)  # (the line that reports it; the trainer's own reports keep the last)
        b.label, b.span = f"{kind} {name}", made.span if made is not None and made.span is not None else span
        old = b.add_tensor(f"{kind}/{name}", b.type(tensor), Kind.metric, Init("zeros"))
        updates.append((old, b.emit("report", [old, tensor], {"name": name})))
        state.append(old)
    b.span = span


def evaluation_graph(fwd: Graph, outputs: bool = False) -> Graph:
    """What evaluation runs: the forward ops of the loss and the reports, dropout off (an identity), the
    parameters read and never written; each report as metric state like ``training_graph``'s. ``outputs``:
    and each of the model's outputs, as ``prediction_graph`` keeps them (one pass predicts and scores)."""
    _trainable(fwd)
    if outputs:
        _predicts(fwd)
    return _inference(fwd, True, outputs)


def prediction_graph(fwd: Graph) -> Graph:
    """What `predict` runs: the forward ops the model's outputs depend on, as evaluation runs them, reading
    only the inputs those need (no labels); each output kept as state that every step overwrites (as a
    report is, so planners keep it to the end of the step), and a constant 0 for the loss."""
    _predicts(fwd)
    return _inference(fwd, False, True)


def _predicts(fwd: Graph) -> None:
    if not fwd.outputs:
        raise SwpError(f"model `{fwd.name}` has no `output`, so there is nothing to predict",
                       hints=["name what to predict in the model: `output logits = ...` (docs/language.md)"])


def _inference(fwd: Graph, scored: bool, outputs: bool) -> Graph:
    """The forward pass as evaluation runs it, of the loss and reports (``scored``: else a constant 0 loss,
    and only the inputs read) and of the outputs, each kept as state."""
    b = _Builder(fwd)
    updates: list[tuple[str, str]] = []
    state: list[str] = []
    names = running_names(fwd)
    targets = ({fwd.loss, *(t for _, t in fwd.reports)} if scored else set()) | (
        {t for _, t in fwd.outputs} if outputs else set())
    forward = [_evaluated(b, names, op, state) for op in live_forward_ops(fwd, targets)]
    if scored:
        _report_state(b, fwd, updates, state)
    if outputs:
        _report_state(b, fwd, updates, state, fwd.outputs, "output")
    loss = fwd.loss
    if not scored:
        b.kind, b.label = Kind.activation, "no loss"
        loss = b.emit("fill", [], {"shape": (), "value": 0.0, "dtype": "f32"})
    ops_ = tuple(forward) + tuple(b.ops)
    read = {n for op in ops_ for n in op.inputs}
    used = read | {n for op in ops_ for n in op.outputs} | (set(fwd.inputs) if scored else set())
    return attrs.evolve(fwd, tensors={n: t for n, t in b.tensors.items() if n in used}, ops=ops_,
                        inputs=fwd.inputs if scored else tuple(i for i in fwd.inputs if i in read), loss=loss,
                        reports=fwd.reports if scored else (), params=tuple(p for p in fwd.params if p in read),
                        state=tuple(state), updates=tuple(updates), grads=())


def _evaluated(b: _Builder, names: dict[str, str], op: Op, state: list[str]) -> Op:
    """The op as evaluation runs it: dropout an identity; batch norm with its running statistics."""
    if op.op == "dropout":
        return Op("mul_scalar", op.inputs, op.outputs, (("value", 1.0),), op.span)
    if op.op == "batch_norm":
        stats = _running_state(b, names, op, state)
        return Op("batch_norm_eval", (*op.inputs, *stats), op.outputs, op.attrs, op.span)
    return op


BN_MOMENTUM = 0.1  # torch.nn.BatchNorm2d's


def running_names(fwd: Graph) -> dict[str, str]:
    """Each batch norm's (by its output) name for its running statistics: ``PREFIX`` of its scale parameter
    ``PREFIX.scale`` (through a precision cast), else the layer path of its output; a name taken already
    gets ``.2``, ``.3``, ... in forward order, so training and evaluation name them alike."""
    cast_of = {o.outputs[0]: o.inputs[0] for o in fwd.ops if o.op == "cast"}
    names: dict[str, str] = {}
    for op in fwd.ops:
        if op.op != "batch_norm":
            continue
        scale = cast_of.get(op.inputs[1], op.inputs[1])
        if scale in fwd.params:
            prefix = scale[:-len(".scale")] if scale.endswith(".scale") else scale
        else:
            prefix = fwd.tensors[op.outputs[0]].label or "batch_norm"
        taken, n = set(names.values()), 1
        while (name := prefix if n == 1 else f"{prefix}.{n}") in taken or f"{name}.running_mean" in fwd.tensors:
            n += 1
        names[op.outputs[0]] = name
    return names


def _running_state(b: _Builder, names_: dict[str, str], op: Op, state: list[str]) -> tuple[str, str]:
    """A batch norm's running mean and variance (state kept across steps and saved in checkpoints), f32
    vectors over its channels: ``NAME.running_mean`` and ``.running_var`` (``running_names``)."""
    prefix = names_[op.outputs[0]]
    typ = TensorType((b.type(op.inputs[0]).shape[1],), DType.f64 if b.type(op.inputs[0]).dtype is DType.f64
                     else DType.f32)
    names = []
    for suffix, init in (("running_mean", "zeros"), ("running_var", "ones")):
        name = f"{prefix}.{suffix}"
        b.add_tensor(name, typ, Kind.optimizer_state, Init(init))
        state.append(name)
        names.append(name)
    return names[0], names[1]


def _running_updates(b: _Builder, names: dict[str, str], op: Op, state: list[str]) -> list[tuple[str, str]]:
    """The running statistics' updates from this batch norm's input (each in place, as torch's)."""
    mean, var = _running_state(b, names, op, state)
    b.span, b.kind = op.span, Kind.optimizer_state
    return [(mean, b.emit("batch_norm_running_mean", [mean, op.inputs[0]], {"momentum": BN_MOMENTUM})),
            (var, b.emit("batch_norm_running_var", [var, op.inputs[0]], {"momentum": BN_MOMENTUM}))]


def _backprop(b: _Builder, op: Op, g: str, grads: dict[str, str], pieces: dict[str, list[_Piece]],
              needs_grad: set[str]) -> None:
    rule = ops.REGISTRY[op.op].grad
    if rule is None or not needs_grad.intersection(op.inputs):
        return
    if op.op == "slice" and op.inputs[0] in pieces:  # joined when the whole gradient is asked for
        pieces[op.inputs[0]].append(_Piece(op, g))
        return
    for name, dx in zip(op.inputs, _rule_grads(b, op, g)):
        if dx is not None and name in needs_grad:
            _accumulate(b, name, dx, grads)


def _rule_grads(b: _Builder, op: Op, g: str) -> tuple[str | None, ...]:
    """The gradients of ``op``'s inputs by its registry rule, given its output's ``g``."""
    b.span, b.kind, b.label = op.span, Kind.temporary, f"{b.tensors[op.outputs[0]].title} backward"
    first = len(b.ops)
    in_grads = ops.REGISTRY[op.op].grad(b, op.inputs, op.outputs[0], g, op.attr_dict)
    for name, dx in zip(op.inputs, in_grads):
        if dx is not None and b.made.get(dx, -1) >= first:
            _label_gradient(b, dx, name)
    b.kind = Kind.gradient
    return in_grads


def _label_gradient(b: _Builder, dx: str, of: str) -> None:
    b.tensors[dx] = attrs.evolve(b.tensors[dx], label=f"grad {b.tensors[of].title}")


def _accumulate(b: _Builder, name: str, dx: str, grads: dict[str, str]) -> None:
    """Add ``dx`` to the gradient of ``name`` so far: by the op that made it where the registry fuses
    the addition into it (a weight gradient's matmul), else by an add. Either writes over the sum so far
    (see analysis.in_place_ops), as frameworks accumulate gradients in place."""
    _mark_gradient(b, dx)
    if name not in grads or b.fold_into(grads[name], dx):
        grads[name] = dx
    else:
        grads[name] = b.emit("add", [grads[name], dx])
        _label_gradient(b, grads[name], name)


def _joinable(forward: list[Op]) -> list[str]:
    """The tensors read by several slices along one axis, with step 1, that do not overlap."""
    slices: dict[str, list[dict[str, Any]]] = {}
    for op in forward:
        if op.op == "slice":
            slices.setdefault(op.inputs[0], []).append(op.attr_dict)
    out = []
    for name, a in slices.items():
        ranges = sorted((x["start"], x["stop"]) for x in a)
        if (len(a) > 1 and len({x["axis"] for x in a}) == 1 and all(x["step"] == 1 for x in a)
                and all(hi <= lo for (_, hi), (lo, _) in zip(ranges, ranges[1:]))):
            out.append(name)
    return out


def _gradient(b: _Builder, name: str, grads: dict[str, str], pieces: dict[str, list[_Piece]]) -> str | None:
    """The whole gradient of ``name`` (None: none flows into it), its slices' gradients joined first (all
    its readers are done with by now)."""
    parts = pieces.pop(name, [])
    if not parts:
        return grads.get(name)
    for dx in _join(b, name, parts):
        _accumulate(b, name, dx, grads)
    return grads[name]


def _join(b: _Builder, name: str, parts: list[_Piece]) -> list[str]:
    """The gradient of ``name`` from its slices' (of a ``_joinable`` tensor): one concat, with zeros
    where no slice read (the slice's own rule, a zero-padded tensor, if only one slice's came)."""
    if len(parts) == 1:
        (dx,) = _rule_grads(b, parts[0].op, parts[0].grad)
        assert dx is not None
        return [dx]
    shape = b.type(name).shape
    axis = parts[0].attr("axis")
    b.span, b.kind = parts[0].op.span, Kind.gradient
    pieces, at = [], 0
    ranges = sorted((p.attr("start"), p.attr("stop"), p.grad) for p in parts)
    for lo, hi, grad in [*ranges, (shape[axis], shape[axis], None)]:
        if lo > at:
            zeros = {"shape": shape[:axis] + (lo - at,) + shape[axis + 1:], "value": 0.0,
                     "dtype": b.type(name).dtype.label}
            pieces.append(b.emit("fill", [], zeros))
        if grad is not None:
            pieces.append(grad)
        at = hi
    joined = b.emit("concat", pieces, {"axis": axis})
    _label_gradient(b, joined, name)
    return [joined]


def _mark_gradient(b: _Builder, name: str) -> None:
    t = b.tensors[name]
    if t.kind is Kind.temporary:
        b.tensors[name] = attrs.evolve(t, kind=Kind.gradient)


def _update(b: _Builder, fwd: Graph, param: str, grad: str, state: list[str],
            gate: str | None = None) -> list[tuple[str, str]]:
    """Emit the optimiser ops for one parameter; return (persistent, new value) pairs. ``gate``: the flag
    each update reads (a guarded step's), keeping its old value when the flag is not 1."""
    opt = dict(fwd.optimizer.hparams)
    name = fwd.optimizer.name
    typ = b.type(param)
    b.span, b.kind = fwd.tensors[param].span, Kind.param
    decoupled = name in ("adamw", "lion")
    wd = {"weight_decay": 0.0 if decoupled else opt["weight_decay"]}
    # the learning rate and its schedule, on every op that reads the rate; AdamW's and Lion's decay with it
    lr = {"lr": opt["lr"], **{k: opt[k] for k in SCHEDULE if k in opt},
          **({"decoupled_wd": opt["weight_decay"]} if decoupled and opt["weight_decay"] else {})}

    def emit(op: str, ins: list[str], a: dict[str, Any]) -> str:
        return b.emit(op, ins, a) if gate is None else b.emit(op, [*ins, gate], {**a, "gated": True})

    if name == "sgd" and opt["momentum"] == 0.0:
        return [(param, emit("sgd", [param, grad], {**lr, **wd}))]

    def new_state(suffix: str) -> str:
        name = b.add_tensor(f"{param}/{suffix}", typ, Kind.optimizer_state, Init("zeros"))
        state.append(name)
        return name

    if name == "sgd":
        m = new_state("momentum")
        b.kind = Kind.optimizer_state
        m_new = emit("momentum", [m, grad, param], {"momentum": opt["momentum"], **wd})
        b.kind = Kind.param
        if opt.get("nesterov"):
            w_new = emit("nesterov_apply", [param, m_new, grad], {**lr, **wd, "momentum": opt["momentum"]})
        else:
            w_new = emit("sgd_apply", [param, m_new], lr)
        return [(m, m_new), (param, w_new)]
    if name == "lion":  # the weight reads the old momentum, so it is updated first
        m = new_state("m")
        w_new = emit("lion_apply", [param, m, grad], {**lr, "beta1": opt["beta1"]})
        b.kind = Kind.optimizer_state
        m_new = emit("lion_m", [m, grad], {"beta2": opt["beta2"]})
        return [(param, w_new), (m, m_new)]
    m, v = new_state("m"), new_state("v")
    b.kind = Kind.optimizer_state
    m_new = emit("adam_m", [m, grad, param], {"beta1": opt["beta1"], **wd})
    v_new = emit("adam_v", [v, grad, param], {"beta2": opt["beta2"], **wd})
    b.kind = Kind.param
    w_new = emit("adam_apply", [param, m_new, v_new], {**lr, **{k: opt[k] for k in ("beta1", "beta2", "eps")}})
    return [(m, m_new), (v, v_new), (param, w_new)]


def _labelled_updates(b: _Builder, pairs: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """Each new value labelled as what it replaces: "layer0.dense.w/momentum updated"."""
    for old, new in pairs:
        b.tensors[new] = attrs.evolve(b.tensors[new], label=f"{old} updated")
    return pairs


def _assemble(fwd: Graph, forward: list[Op], b: _Builder, updates: list[tuple[str, str]],
              param_grads: list[tuple[str, str]], state: list[str]) -> Graph:
    needed = {fwd.loss} | {new for _, new in updates}
    backward: list[Op] = []
    for op in reversed(b.ops):  # drop backward ops whose results nothing reads
        if needed.intersection(op.outputs):
            backward.append(op)
            needed.update(op.inputs)
    backward.reverse()
    all_ops = tuple(forward) + tuple(backward)
    used = {n for op in all_ops for n in op.inputs + op.outputs} | set(fwd.inputs) | set(fwd.params) | set(state)
    tensors = {n: t for n, t in b.tensors.items() if n in used}
    return attrs.evolve(fwd, tensors=tensors, ops=all_ops, state=tuple(state), updates=tuple(updates),
                        grads=tuple(param_grads))
