"""The planning problem: a training graph reduced to what planners need.

Tensors are numbered, ops carry their modelled times, and each tensor knows
its aligned size in the arena, its uses in the default schedule, and whether it persists.
"""

from __future__ import annotations

import attrs

from swapdsl.devices.costs import op_times_ms
from swapdsl.devices.profiles import Device
from swapdsl.devices.costs import host_op_ms
from swapdsl.graph.analysis import in_place_ops, scratch_bytes
from swapdsl.graph.ir import Graph, Kind
from swapdsl.graph.offload import HostSplit, host_split, touched
from swapdsl.plan.program import NET_OPS, Plan, arena_bytes, scratch_offset

PAST_BUDGET = 1e15  # a score past the host budget: more than any step's milliseconds


@attrs.frozen
class Request:
    """What a user asks a planner for: a plan of this training graph on this device under this cap."""

    graph: Graph  # the training graph
    device: Device
    cap: int
    model_path: str
    model_args: tuple[tuple[str, int | float | bool], ...]
    host_cap: int | None = None  # the most host memory the plan's host copies may take (None: any)
    host_updates: tuple[str, ...] = ()  # parameters whose update runs on the host (graph.offload)
    host_reduce: bool = False  # ... and their gradients' all-reduces too, over the host copies (data-parallel)
    reduce_all: bool = False  # every gradient's all-reduce over its host copy, its mean brought back up
    # the scratch region at the top of the arena (kernels' temporaries), and what is left below it for tensors
    scratch: int = attrs.field(init=False, default=attrs.Factory(lambda r: scratch_bytes(r.graph), takes_self=True))

    @property
    def tensor_cap(self) -> int:
        return scratch_offset(self.cap, self.scratch)

    def host_excess(self, host_bytes: int) -> int:
        """How far a plan's host copies go past the host budget (0: within it, or no budget)."""
        return 0 if self.host_cap is None else max(0, host_bytes - self.host_cap)

    def score(self, iteration_ms: float, host_bytes: int) -> float:
        """What planners minimise: the step time within the host budget; past it, worse than any step
        (``PAST_BUDGET``) by the excess in MB, so that less excess still scores better."""
        excess = self.host_excess(host_bytes)
        return iteration_ms if not excess else PAST_BUDGET + excess / 1e6

    def plan_score(self, plan: Plan) -> float:
        """``score`` by a plan's figures."""
        f = dict(plan.figures)
        return self.score(f["iteration_ms"], int(f["host_bytes"]))


@attrs.frozen
class Problem:
    graph: Graph
    device: Device
    names: tuple[str, ...]  # tensor id -> name
    nbytes: tuple[int, ...]
    size: tuple[int, ...]  # the bytes each tensor takes in the arena (aligned)
    kinds: tuple[str, ...]
    op_ms: tuple[float, ...]
    op_inputs: tuple[tuple[int, ...], ...]
    op_outputs: tuple[tuple[int, ...], ...]
    in_place: tuple[bool, ...]  # op writes its output over its first input (analysis.in_place_ops)
    persistent: frozenset[int]
    inputs: frozenset[int]
    updates: tuple[tuple[int, int], ...]  # (persistent id, id of its new value)
    loss: int
    scratch: int  # the plan's scratch region (analysis.scratch_bytes): caps a user gives include it
    # With updates on the host (graph.offload), the problem is the device's part: host ops are *hollow*
    # (no tensors, no time), the tensors they make for the device are on the host like unpinned persistent
    # ones (``host_made``; from the step's start, or once ``host_after`` ran), the device tensors they read
    # are copied out once made (``to_host``). Persistent tensors only host ops touch are never pinned
    # (``pinnable``).
    host: HostSplit = HostSplit(frozenset(), frozenset(), frozenset())
    host_made: frozenset[int] = frozenset()
    to_host: frozenset[int] = frozenset()
    pinnable: frozenset[int] = frozenset()
    host_ms: tuple[float, ...] = ()  # each host op's time on the host lane (0 for device ops)
    host_only_bytes: int = 0  # bytes of the tensors only host ops make (as the plan's host_bytes figure counts)
    # per tensor host ops make for the device within the step (an all-reduce's mean, over host copies): the
    # device ops whose outputs those host ops read; it exists on the host once they have gone down
    host_after: tuple[tuple[int, ...], ...] = ()

    @staticmethod
    def build(g: Graph, device: Device, host_updates: tuple[str, ...] = (), host_reduce: bool = False,
              reduce_all: bool = False) -> Problem:
        names = tuple(g.tensors)
        index = {n: i for i, n in enumerate(names)}
        types = [g.tensors[n].type for n in names]
        nbytes = tuple(t.nbytes for t in types)
        in_place_set = in_place_ops(g)
        split = host_split(g, host_updates, host_reduce, reduce_all)
        hollow = split.ops
        in_place = tuple(i in in_place_set and i not in hollow for i in range(len(g.ops)))
        only = touched(g, split)
        made_on_host = {t for i in hollow for t in g.ops[i].outputs}
        written = {old for old, new in g.updates if new in made_on_host}
        persistent = frozenset(index[n] for n in g.persistent)
        made = frozenset(index[n] for n in split.made)
        # (counted as plan.host_copies lists them: a new value apart from its old value's memory)
        host_only = sum(nbytes[index[t]] for i in hollow for t in g.ops[i].outputs if t in only)
        op_ms = [0.0 if i in hollow else ms for i, ms in enumerate(op_times_ms(device, g))]
        return Problem(
            g, device, names, nbytes, tuple(arena_bytes(b) for b in nbytes),
            tuple(g.tensors[n].kind.value for n in names), tuple(op_ms),
            tuple(() if i in hollow else tuple(index[n] for n in op.inputs) for i, op in enumerate(g.ops)),
            tuple(() if i in hollow else tuple(index[n] for n in op.outputs) for i, op in enumerate(g.ops)),
            in_place, persistent, frozenset(index[n] for n in g.inputs),
            tuple((index[o], index[n]) for o, n in g.updates), index[g.loss], scratch_bytes(g),
            split, made, frozenset(index[n] for n in split.read),
            frozenset(t for t in persistent if names[t] not in only and names[t] not in written),
            tuple(host_op_ms(device, g, op) if i in hollow else 0.0 for i, op in enumerate(g.ops)), host_only,
            _host_after(g, split, names))

    @staticmethod
    def of(req: Request) -> Problem:
        return Problem.build(req.graph, req.device, req.host_updates, req.host_reduce, req.reduce_all)

    @property
    def net(self) -> frozenset[int]:
        """The ops the network lane runs (data-parallel all-reduces; one of a host copy is the host lane's),
        not the compute stream."""
        return frozenset(i for i, op in enumerate(self.graph.ops) if op.op in NET_OPS and i not in self.host.ops)

    def hollow(self, op: int) -> bool:
        """An op that runs on the host: the device planners see no tensors and no time in it."""
        return op in self.host.ops

    @property
    def starts_on_host(self) -> frozenset[int]:
        """What the swap planner may bring in from the host at any point: unpinned persistent tensors and
        what host ops make for the device (inputs are never anywhere but their home)."""
        return self.persistent | self.host_made

    @property
    def n_ops(self) -> int:
        return len(self.op_ms)

    def makers(self) -> dict[int, int]:
        """Each tensor an op makes -> that op (inputs and what starts on the host have none)."""
        return {t: op for op in range(self.n_ops) for t in self.op_outputs[op]}

    def uses(self, schedule: list[int]) -> list[list[int]]:
        """For each tensor, the schedule positions of the ops that read it, in order."""
        out: list[list[int]] = [[] for _ in self.names]
        for pos, op in enumerate(schedule):
            for t in self.op_inputs[op]:
                out[t].append(pos)
        return out

    def is_forward_activation(self, t: int) -> bool:
        return self.kinds[t] == Kind.activation.value

    def forward_op(self, op: int) -> bool:
        """An op of the forward pass: it makes forward activations (a hollow op makes nothing)."""
        return bool(self.op_outputs[op]) and all(self.is_forward_activation(t) for t in self.op_outputs[op])


def _host_after(g: Graph, split: HostSplit, names: tuple[str, ...]) -> tuple[tuple[int, ...], ...]:
    """``Problem.host_after``: for each tensor host ops make for the device, the device ops whose outputs
    the host ops making it read (through other host ops); () for the rest."""
    makers = {t: i for i, op in enumerate(g.ops) for t in op.outputs}
    memo: dict[int, frozenset[int]] = {}

    def sources(i: int) -> frozenset[int]:  # (a host op's device sources)
        if i not in memo:
            found: set[int] = set()
            for t in g.ops[i].inputs:
                m = makers.get(t)
                if m is not None:
                    found |= sources(m) if m in split.ops else {m}
            memo[i] = frozenset(found)
        return memo[i]

    return tuple(tuple(sorted(sources(makers[n]))) if n in split.made else () for n in names)


@attrs.frozen
class Edges:
    """A problem's data dependencies (each list in op order; an op reading a tensor twice is listed twice)."""

    producer: dict[int, int]  # tensor -> the op that makes it
    readers: dict[int, list[int]]  # tensor -> the ops that read it
    preds: list[list[int]]  # op -> the ops that make its inputs, in input order (for an input host ops make
    # within the step, the device ops they read from: ``Problem.host_after``)
    succs: list[list[int]]  # op -> the ops that read its outputs


def edges(p: Problem) -> Edges:
    producer = p.makers()
    readers: dict[int, list[int]] = {}
    preds: list[list[int]] = [[] for _ in range(p.n_ops)]
    for op in range(p.n_ops):
        for t in p.op_inputs[op]:
            readers.setdefault(t, []).append(op)
            if t in producer:
                preds[op].append(producer[t])
            elif p.host_after and p.host_after[t]:  # (made on the host from what these device ops made)
                preds[op].extend(p.host_after[t])
    succs: list[list[int]] = [[] for _ in range(p.n_ops)]
    for op, ps in enumerate(preds):
        for q in ps:
            succs[q].append(op)
    return Edges(producer, readers, preds, succs)
