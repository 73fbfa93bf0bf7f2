"""Where each parameter's update runs: on the device, or on the host (ZeRO-Offload's lever).

A parameter updated on the host never crosses the bus with its optimiser state: its gradient goes down
once it is made, the optimiser's ops run on the host over the master weights and the state in host
memory, and the forward pass's half copy (``NAME/bf16``) is made on the host and comes up. In f32, with
no cast, the weights themselves come up from the host memory the update wrote.

This module says which ops of a training graph that moves to the host (``host_split``): a parameter's
*update group* is the optimiser op that makes its new value and the optimiser ops of its state that op
reads (``momentum`` for ``sgd_apply`` and ``nesterov_apply``; ``adam_m`` and ``adam_v`` for
``adam_apply``; ``lion_m``, which updates the momentum ``lion_apply`` read), together with a
``cast`` whose output only the group reads (the gradient cast back to f32 under mixed precision) and the
forward ``cast`` of the parameter itself. Everything else stays on the device. (With micro-batches the update
reads the f32 sum of the micro-batches' gradients, each cast on the device: the sum goes down, fewer bytes
than K half gradients from K > 2 and as many at 2.)

With data-parallel ranks, ``reduce=True`` moves the all-reduce of such a gradient to the host as well (its
host copy is averaged over MPI), with what only it reads: the gradient's cast to f32 under mixed precision
(so the half gradient goes down, half the bytes), and a bucket whose every gradient is updated on the host
(its pack and unpacks). An all-reduce whose mean a device op reads (the guard's flag, clipping's norm)
stays on the device. ``every=True`` moves every gradient's all-reduce there, wherever its update runs:
a gradient updated on the device goes down once made, is averaged over its host copy, and its mean comes
back up for the update (what the planner may choose where the gradient would leave the device anyway).
"""

from __future__ import annotations

from collections.abc import Iterable

import attrs

from swapdsl.common.memo import by_identity
from swapdsl.graph.ir import Graph, Kind

UPDATE_OPS = frozenset({"sgd", "momentum", "sgd_apply", "nesterov_apply", "adam_m", "adam_v", "adam_apply",
                        "lion_apply", "lion_m"})
REDUCTION_OPS = frozenset({"allreduce_mean", "bucket_pack", "bucket_unpack", "cast"})  # what ``reduce`` may move


@attrs.frozen
class HostSplit:
    """The ops that run on the host, and the tensors that cross between host and device because of them."""

    ops: frozenset[int]  # op indices, each run on the host
    made: frozenset[str]  # made on the host, read on the device: each comes up from the host every step
    read: frozenset[str]  # made on the device, read on the host: each goes down once made


@attrs.frozen
class _Index:
    """What the rules below look up, built once per graph (per parameter, on a graph of thousands of
    parameters, it made ``auto`` quadratic: GPT-2 XL's 1,544 took 45 s)."""

    makers: dict[str, int]  # tensor -> the op that makes it
    readers: dict[str, list[int]]  # tensor -> the ops that read it
    new_of: dict[str, str]  # persistent tensor -> its new value
    state_new: dict[str, str]  # a state tensor's new value -> the state tensor
    state_old: dict[str, str]  # a state tensor -> its new value
    persistent: frozenset[str]

    @staticmethod
    def of(g: Graph) -> _Index:
        state = set(g.state)
        return _Index({t: i for i, op in enumerate(g.ops) for t in op.outputs}, g.consumers(), dict(g.updates),
                      {n: old for old, n in g.updates if old in state},
                      {old: n for old, n in g.updates if old in state}, frozenset(g.persistent))


def offloadable(g: Graph) -> tuple[str, ...]:
    """The parameters whose update may run on the host: those an optimiser op updates."""
    ix = _Index.of(g)
    return tuple(p for p in g.params if _update_group(g, p, ix))


def host_split(g: Graph, params: Iterable[str], reduce: bool = False, every: bool = False) -> HostSplit:
    """The split of ``g`` with the updates of ``params`` on the host (each must be ``offloadable``);
    ``reduce``: their gradients' all-reduces too, where only host ops read the mean; ``every``: every
    gradient's all-reduce, its mean brought up where the device reads it."""
    return _host_split(g, tuple(params), reduce, every)


@by_identity()
def _host_split(g: Graph, params: tuple[str, ...], reduce: bool, every: bool) -> HostSplit:
    asked = set(params)
    chosen = tuple(p for p in g.params if p in asked)
    unknown = asked - set(g.params)
    if unknown:
        raise ValueError(f"not parameters of the graph: {sorted(unknown)}")
    ix = _Index.of(g)
    makers, readers = ix.makers, ix.readers
    host: set[int] = set()
    for p in chosen:
        group = _update_group(g, p, ix)
        if not group:
            raise ValueError(f"`{p}` has no optimiser update to move to the host")
        host |= group
    if reduce:
        host |= _reduction(g, host, makers, readers)
    if every:
        host |= _every_reduction(g, makers, readers)
    made, read = set(), set()
    for i, op in enumerate(g.ops):
        if i in host:
            read.update(t for t in op.inputs if makers.get(t) not in host and t not in ix.persistent)
        else:
            made.update(t for t in op.inputs if makers.get(t) in host)
    return HostSplit(frozenset(host), frozenset(made), frozenset(read))


def touched(g: Graph, split: HostSplit) -> frozenset[str]:
    """Tensors that host ops read or write and device ops never touch (a parameter read on the device,
    in f32, is touched by both: not here)."""
    on_host = {t for i in split.ops for t in (*g.ops[i].inputs, *g.ops[i].outputs)}
    on_device = {t for i, op in enumerate(g.ops) if i not in split.ops for t in (*op.inputs, *op.outputs)}
    return frozenset(on_host - on_device)


def reduces_on_host(g: Graph, params: Iterable[str]) -> bool:
    """Whether ``reduce`` moves any all-reduce of ``params``' gradients to the host."""
    split = host_split(g, params, reduce=True)
    return any(g.ops[i].op == "allreduce_mean" for i in split.ops)


def _reduction(g: Graph, host: set[int], makers: dict[str, int], readers: dict[str, list[int]]) -> set[int]:
    """The all-reduces (and the bucket packs, unpacks and gradient casts around them) that only ``host``
    ops read, grown back from the updates until nothing more moves."""
    moved: set[int] = set()
    frontier = set(host)
    while frontier:
        inputs = {t for i in frontier for t in g.ops[i].inputs}
        frontier = set()
        for t in inputs:
            m = makers.get(t)
            if m is None or m in host or m in moved or g.ops[m].op not in REDUCTION_OPS:
                continue
            op = g.ops[m]
            if op.op == "cast" and not any(g.ops[i].op in ("allreduce_mean", "bucket_pack") for i in readers[t]):
                continue  # (a cast moves only as the gradient's way into a moved all-reduce)
            if all(set(readers[o]) <= host | moved | {m} for o in op.outputs):
                moved.add(m)
                frontier.add(m)
    # an unpack of a bucket averaged on the device stays there: on the host it would read the whole bucket
    return {i for i in moved if g.ops[i].op != "bucket_unpack" or makers[g.ops[i].inputs[0]] in moved}


def _every_reduction(g: Graph, makers: dict[str, int], readers: dict[str, list[int]]) -> set[int]:
    """Every all-reduce of a gradient (not a report's), with the bucket packs that feed them, the unpacks
    that read them, and the casts whose outputs only those read."""
    gradient = {n for n, t in g.tensors.items() if t.kind is Kind.gradient}
    moved = {i for i, op in enumerate(g.ops) if op.op == "allreduce_mean" and op.inputs[0] in gradient}
    moved |= {makers[g.ops[i].inputs[0]] for i in moved if g.ops[makers[g.ops[i].inputs[0]]].op == "bucket_pack"}
    moved |= {r for i in moved if g.ops[i].op == "allreduce_mean" for r in readers.get(g.ops[i].outputs[0], [])
              if g.ops[r].op == "bucket_unpack"}
    for i in sorted(moved):
        for t in g.ops[i].inputs:
            m = makers.get(t)
            if m is not None and g.ops[m].op == "cast" and set(readers[t]) <= moved:
                moved.add(m)
    return moved


def _update_group(g: Graph, param: str, ix: _Index) -> frozenset[int]:
    """The ops that move to the host with ``param``'s update; empty when its update is no optimiser op, or
    reads persistent tensors other than the parameter and its own state (those stay where they are)."""
    makers, readers = ix.makers, ix.readers
    new = ix.new_of.get(param)
    apply = makers.get(new) if new is not None else None
    if apply is None or g.ops[apply].op not in UPDATE_OPS:
        return frozenset()
    state_new, state_old = ix.state_new, ix.state_old
    # the state it reads: new values (adam's m and v), or old ones updated after it (lion's momentum)
    updates = {apply} | {makers[t] for t in g.ops[apply].inputs if t in state_new} | {
        makers[state_old[t]] for t in g.ops[apply].inputs if t in state_old and state_old[t] in makers}
    own = {param} | {state_new[g.ops[i].outputs[0]] for i in updates if g.ops[i].outputs[0] in state_new}
    if any(t in ix.persistent and t not in own for i in updates for t in g.ops[i].inputs):
        return frozenset()
    group = set(updates)
    for i in sorted(updates):
        for t in g.ops[i].inputs:
            m = makers.get(t)
            if m is not None and g.ops[m].op == "cast" and set(readers[t]) <= group:
                group.add(m)
    group |= {i for i in readers[param] if g.ops[i].op == "cast" and g.ops[i].inputs == (param,)}
    return frozenset(group)
