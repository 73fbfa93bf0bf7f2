"""The plan validator: a plan is checked completely before anything runs.

Three passes, each naming the plan line at fault:

1. ``check_structure``: the plan is well formed on its own (names declared once, ops numbered in order,
   every name known, sizes and device figures in range), so the later passes cannot trip on it;
2. ``check_describes``: the plan describes exactly the model's training graph (every tensor with its size
   and kind, every op with its inputs and outputs, the loss, every update) and reserves at least the
   scratch its kernels declare, when the graph is at hand;
3. the replay: each instruction is checked against the plan's replay (``replay.py``, the one the
   interpreter's waits come from) for invariants 1-8, so that no copy reads bytes before they are written
   or after they are overwritten.

It trusts nothing a planner says.
"""

from __future__ import annotations

import math
from collections import Counter

from swapdsl.common.errors import Span, SwpError
from swapdsl.common.units import MAX_BYTES
from swapdsl.devices.profiles import EFFICIENCIES, FLOPS_CLASSES
from swapdsl.graph.analysis import scratch_bytes
from swapdsl.graph.dataparallel import canonical, shown
from swapdsl.graph.ir import Graph, Kind
from swapdsl.graph.ops import REGISTRY
from swapdsl.plan.program import ALIGN, Free, HOST, HostRun, NET_OPS, Plan, PlanOp, Region, Run, SwapIn, SwapOut
from swapdsl.plan.replay import Replay, START

INVARIANTS = {
    1: "the schedule is a topological order",
    2: "memory stays within the cap, below the scratch region",
    3: "no two live tensors share bytes",
    4: "an op finds its inputs resident and their swap-ins complete",
    5: "memory is reused only after its tenant is gone",
    6: "a tensor still needed is on the device, fully on the host, or rebuilt by a later recompute",
    7: "an iteration ends in the residency it started in",
    8: "a copy starts once its source is complete, and nothing overwrites either end while it runs",
}
_REDO = ["the plan was edited, or made for a different model or swapdsl; run `swapdsl optimize` again"]
_KINDS = {k.value for k in Kind}
Where = tuple[str, int]  # (section of the plan, index in it): see plan.Origin


class PlanError(SwpError):
    """A plan that is malformed or does not describe its model; ``at`` says which statement."""

    def __init__(self, message: str, at: Where | None = None) -> None:
        super().__init__(message, hints=_REDO)
        self.at = at


class PlanInvalid(PlanError):
    def __init__(self, invariant: int, detail: str, at: Where | None = None) -> None:
        super().__init__(f"plan breaks invariant {invariant} ({INVARIANTS[invariant]}): {detail}", at)
        self.invariant = invariant


def validate(plan: Plan, graph: Graph | None = None) -> None:
    """Raise PlanError (PlanInvalid for a broken invariant) at the first fault, placed at its plan line.

    ``graph``: the training graph the plan must describe; without it only the plan itself is checked
    (enough to simulate it, not to run it)."""
    try:
        check_structure(plan)
        if graph is not None:
            check_describes(plan, graph)
        replay(plan)
    except PlanError as err:
        line = plan.origin.line(*err.at) if plan.origin is not None and err.at is not None else None
        if line is not None and plan.origin is not None:
            err.with_span(Span.point(plan.origin.file, line, 1))
        raise


# ---- 1. structure --------------------------------------------------------------------------------


def check_structure(plan: Plan) -> None:
    if not 0 < plan.cap <= MAX_BYTES:
        raise PlanError(f"the cap of {plan.cap} bytes is out of range (1 byte to {MAX_BYTES} bytes)", ("cap", 0))
    if plan.scratch < ALIGN or plan.scratch % ALIGN or plan.tensor_cap < 0:
        raise PlanError(f"a scratch region of {plan.scratch} bytes does not fit: it must be a multiple of {ALIGN} "
                        f"bytes, at least {ALIGN}, inside the cap of {plan.cap} bytes", ("scratch", 0))
    _check_device(plan)
    names: dict[str, int] = {}
    for i, t in enumerate(plan.tensors):
        if t.name in names:
            raise PlanError(f"tensor `{t.name}` is declared twice", ("tensor", i))
        names[t.name] = i
        if not 0 < t.bytes <= MAX_BYTES:
            raise PlanError(f"tensor `{t.name}` has {t.bytes} bytes (expected 1 to {MAX_BYTES})", ("tensor", i))
        if t.kind not in _KINDS:
            raise PlanError(f"tensor `{t.name}` has kind `{t.kind}` (expected one of {', '.join(sorted(_KINDS))})",
                            ("tensor", i))
    made: set[str] = set()
    for i, o in enumerate(plan.ops):
        _check_op(o, i, names, made)
    if plan.loss not in names:
        raise PlanError(f"the loss `{plan.loss}` is not a tensor of the plan", ("loss", 0))
    _check_updates(plan, names, made)
    _check_members(plan)


def _check_members(plan: Plan) -> None:
    """Bucket members on the ``ranks`` line cut the buckets the plan's own all-reduces average: each
    gradient (a pack's input, or a gradient an all-reduce reads alone), in the order the ops make them,
    numbered by the pack or all-reduce that takes it."""
    if not plan.bucket_members:
        return
    kind = {t.name: t.kind for t in plan.tensors}
    made = {n: i for i, o in enumerate(plan.ops) for n in o.outputs}
    packed = {n for o in plan.ops if o.op == "bucket_pack" for n in o.outputs}
    taker: dict[str, int] = {}
    for i, o in enumerate(plan.ops):
        if o.op == "bucket_pack":
            taker.update(dict.fromkeys(o.inputs, i))
        elif o.op == "allreduce_mean" and o.inputs and o.inputs[0] not in packed and kind[o.inputs[0]] == "gradient":
            taker[o.inputs[0]] = i
    order = sorted(taker, key=lambda n: made.get(n, -1))
    if canonical([taker[n] for n in order]) != plan.bucket_members:
        raise PlanError("the `members` of the ranks line do not cut the buckets the plan's ops average "
                        f"({len(order)} gradients in {len(set(taker.values()))} all-reduces)", ("ranks", 0))


def _check_device(plan: Plan) -> None:
    d = plan.device
    figures = {"memory_bytes": d.memory_bytes, "mem_bw": d.mem_bw, "h2d_bw": d.h2d_bw, "d2h_bw": d.d2h_bw,
               "compute_efficiency": d.compute_efficiency, "memory_efficiency": d.memory_efficiency,
               **{f"flops {k}": v for k, v in d.flops}}
    for key, value in figures.items():
        if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
            raise PlanError(f"device figure `{key}` is {value}; expected a positive finite number", ("device", 0))
    for key, value in (("launch_s", d.launch_s), ("copy_latency_s", d.copy_latency_s)):
        if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
            raise PlanError(f"device figure `{key}` is {value}; expected a finite number, 0 or more", ("device", 0))
    if "f32" not in dict(d.flops):
        raise PlanError("the device has no `flops f32` line", ("device", 0))
    for key in EFFICIENCIES:
        if getattr(d, key) > 1:
            raise PlanError(f"device figure `{key}` is {getattr(d, key)}; a share of the peak is at most 1",
                            ("device", 0))
    for k, (key, _) in enumerate(d.flops):
        if key not in FLOPS_CLASSES:
            raise PlanError(f"`flops {key}`: flops lines name {', '.join(FLOPS_CLASSES)}", ("flops", k))


def _check_op(o: PlanOp, i: int, names: dict[str, int], made: set[str]) -> None:
    at = ("op", i)
    if o.index != i:
        raise PlanError(f"op lines are numbered 0, 1, 2, ... in order; found op {o.index} where {i} belongs", at)
    if o.op not in REGISTRY:
        raise PlanError(f"op {i} is `{o.op}`, which is not an op of this swapdsl", at)
    if not (math.isfinite(o.ms) and o.ms >= 0):
        raise PlanError(f"op {i} takes {o.ms} ms; expected a finite time, 0 or more", at)
    if o.host_ms is not None and not (math.isfinite(o.host_ms) and o.host_ms >= 0):
        raise PlanError(f"op {i} takes {o.host_ms} ms on the host; expected a finite time, 0 or more", at)
    for name in (*o.inputs, *o.outputs):
        if name not in names:
            raise PlanError(f"op {i} names `{name}`, which no tensor line declares", at)
    if len(o.outputs) != 1:
        raise PlanError(f"op {i} has {len(o.outputs)} outputs; every op has one", at)
    if o.outputs[0] in made:
        raise PlanError(f"op {i} makes `{o.outputs[0]}`, which an earlier op already makes", at)
    made.add(o.outputs[0])


def _check_updates(plan: Plan, names: dict[str, int], made: set[str]) -> None:
    olds: set[str] = set()
    news: set[str] = set()
    for i, (old, new) in enumerate(plan.updates):
        at = ("update", i)
        for name in (old, new):
            if name not in names:
                raise PlanError(f"update names `{name}`, which no tensor line declares", at)
        home = plan.tensors[names[old]]
        if home.home is None or home.kind == Kind.input.value:
            raise PlanError(f"update replaces `{old}`, which is not a persistent tensor (a param or state)", at)
        if new not in made:
            raise PlanError(f"update replaces `{old}` with `{new}`, which no op makes", at)
        if old in olds or new in news:
            raise PlanError(f"update `{old}` -> `{new}` repeats a tensor of an earlier update", at)
        olds.add(old)
        news.add(new)


# ---- 2. the plan describes this training graph ---------------------------------------------------


def check_describes(plan: Plan, g: Graph) -> None:
    """The plan's tensors, ops, loss and updates are exactly those of training graph ``g``."""
    if plan.precision != g.precision:  # said plainly, rather than as the first cast tensor's name that differs
        raise PlanError(f"the plan's precision is {plan.precision}, its training graph's {g.precision}",
                        ("precision" if plan.precision != "f32" else "method", 0))
    if plan.guard != g.guard:
        raise PlanError(f"the plan's guard is {plan.guard}, its training graph's {g.guard}",
                        ("guard" if plan.guard != "none" else "method", 0))
    if plan.microbatches != g.microbatches:
        raise PlanError(f"the plan runs {plan.microbatches} micro-batches a step, its training graph "
                        f"{g.microbatches}", ("microbatches" if plan.microbatches != 1 else "method", 0))
    if (plan.ranks, plan.link_gbps, plan.bucket_mib) != (g.ranks, g.link_gbps, g.bucket_mib):
        raise PlanError(f"the plan runs on {plan.ranks} ranks (link {plan.link_gbps} Gb/s, buckets of "
                        f"{plan.bucket_mib} MiB), its training graph on {g.ranks} ({g.link_gbps} Gb/s, "
                        f"{g.bucket_mib} MiB)", ("ranks" if plan.ranks != 1 else "method", 0))
    if plan.bucket_members != g.bucket_members:
        mine, theirs = (f"members {shown(m)}" if m else "no members"
                        for m in (plan.bucket_members, g.bucket_members))
        raise PlanError(f"the plan's buckets have {mine}, its training graph's {theirs}", ("ranks", 0))
    homed = set(g.persistent) | set(g.inputs)
    want = [(n, t.type.nbytes, t.kind.value, n in homed) for n, t in g.tensors.items()]
    have = [(t.name, t.bytes, t.kind, t.home is not None) for t in plan.tensors]
    for i, (a, b) in enumerate(zip(have, want)):
        if a != b:
            raise PlanError(f"tensor line {_tensor_text(a)} differs from the model's training graph, which has "
                            f"{_tensor_text(b)} here", ("tensor", i))
    if len(have) != len(want):
        extra = "more" if len(have) > len(want) else "fewer"
        raise PlanError(f"the plan has {len(have)} tensors, {extra} than the {len(want)} of the model's training "
                        "graph", ("tensor", min(len(have), len(want))))
    for i, (mine, o) in enumerate(zip(plan.ops, g.ops)):
        if (mine.op, mine.inputs, mine.outputs) != (o.op, o.inputs, o.outputs):
            raise PlanError(f"op {i} is `{mine.op}` {list(mine.inputs)} -> {list(mine.outputs)} in the plan but `{o.op}` "
                            f"{list(o.inputs)} -> {list(o.outputs)} in the model's training graph", ("op", i))
    if len(plan.ops) != len(g.ops):
        raise PlanError(f"the plan has {len(plan.ops)} ops, the model's training graph {len(g.ops)}",
                        ("op", min(len(plan.ops), len(g.ops))))
    if plan.loss != g.loss:
        raise PlanError(f"the plan's loss is `{plan.loss}`, the model's is `{g.loss}`", ("loss", 0))

    if plan.scratch < (need := scratch_bytes(g)):
        raise PlanError(f"the plan reserves {plan.scratch} bytes of scratch; the model's kernels need {need}",
                        ("scratch", 0))
    for i, (a, b) in enumerate(zip(plan.updates, g.updates)):
        if a != b:
            raise PlanError(f"update `{a[0]}` -> `{a[1]}` differs from the training graph's `{b[0]}` -> `{b[1]}`",
                            ("update", i))
    if len(plan.updates) != len(g.updates):
        raise PlanError(f"the plan has {len(plan.updates)} updates, the model's training graph {len(g.updates)}",
                        ("update", min(len(plan.updates), len(g.updates))))


def _tensor_text(row: tuple[str, int, str, bool]) -> str:
    name, nbytes, kind, homed = row
    return f"`{name}` ({nbytes} bytes, {kind}{', with a home' if homed else ''})"


# ---- 3. the replay -------------------------------------------------------------------------------


def replay(plan: Plan) -> None:
    v = _Checks(plan)
    v.start()
    handlers = {Run: v.run, SwapIn: v.swapin, SwapOut: v.swapout, Free: v.free, HostRun: v.host_run}
    for k, instr in enumerate(plan.program):
        v.at = ("program", k)
        handlers[type(instr)](k, instr)  # type: ignore[operator]
        v.r.apply(k, instr)
    v.at = None
    v.end()


class _Checks:
    """Each instruction checked against the replay's state (``replay.Replay``: what is resident, in flight
    and on the host) before the replay applies it, plus what only the checks need.

    Order is by program index: a run's index stands for its op's place in the order ops run (START: the
    iteration's start). ``ready`` says after which run a tensor's device bytes are complete (a swap-in's:
    the run it is due for)."""

    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self.r = Replay(plan, overlaps=True)
        self.at: Where | None = None
        self.tensors = plan.tensor_map()
        self.slot = self.r.slot
        self.produced: set[str] = set()
        self.ready: dict[str, int] = {}
        self.last_touch: dict[str, int] = {}  # tensor -> the latest run that read or wrote it
        self.slot_read: dict[str, int] = {}  # host slot -> the run by which every swap-in from it is complete
        self.readers_left = Counter(n for o in plan.ops for n in set(o.inputs))
        new = dict(plan.updates)
        self.finals = {new.get(t.name, t.name) for t in plan.tensors if t.home is not None and t.kind != "input"}
        # the program indices of each op's recomputations, to see ahead whether a dropped tensor comes back
        self.recomputes: dict[int, list[int]] = {}
        for k, instr in enumerate(plan.program):
            if isinstance(instr, Run) and instr.recompute:
                self.recomputes.setdefault(instr.op, []).append(k)
        self.maker = {name: o.index for o in plan.ops for name in o.outputs}

    def invalid(self, invariant: int, detail: str) -> PlanInvalid:
        return PlanInvalid(invariant, detail, self.at)

    def error(self, detail: str) -> PlanError:
        return PlanError(detail, self.at)

    def what(self, op: PlanOp) -> str:
        return f"op {op.index} `{op.op}`"

    def tensor(self, name: str) -> str:
        if name not in self.tensors:
            raise self.error(f"the program names `{name}`, which no tensor line declares")
        return name

    def region(self, region: Region, name: str) -> Region:
        if region.offset % ALIGN:
            raise self.error(f"`{name}` is placed at offset {region.offset}, which is not a multiple of {ALIGN}")
        if region.end > self.plan.tensor_cap:
            raise self.invalid(2, f"`{name}` at {region} ends past {self.plan.tensor_cap}, where the scratch region "
                                  f"at the top of the cap of {self.plan.cap} bytes begins")
        if region.size < self.tensors[name].bytes:
            raise self.invalid(3, f"`{name}` ({self.tensors[name].bytes} bytes) does not fit region {region}; "
                                  "it would overlap its neighbour")
        return region

    def vacant(self, name: str, region: Region, context: str) -> None:
        """``name`` may move into ``region``: nothing resident overlaps it."""
        tenant = self.r.tenant(self.region(region, name))
        if tenant is not None:
            raise self.invalid(5, f"{context}: {tenant[0]} still holds `{tenant[1]}` when `{name}` moves into "
                                  f"{region}")

    def position(self, op: int, context: str) -> int:
        if op not in self.r.ran:
            raise self.invalid(1, f"{context} waits for op {op}, which has not run yet at that point")
        return self.r.ran[op]

    def copy_or_free(self, instr: SwapIn | SwapOut | Free, what: str) -> tuple[str, str, int]:
        """The tensor, how to name the instruction in a message, and where the op it waits for ran."""
        name = self.tensor(instr.tensor)
        context = f"the {what} of `{name}`"
        return name, context, self.position(instr.after, context)

    # -- instructions

    def start(self) -> None:
        for i, t in self.r.homes():
            self.at = ("tensor", i)
            self.produced.add(t.name)
            if isinstance(t.home, Region):
                self.vacant(t.name, t.home, "at the start")
                # an input's batch lands at the start on the copy stream; the first op waits for it
                self.ready[t.name] = 0 if t.kind == Kind.input.value else START
        self.at = None

    def run(self, k: int, instr: Run) -> None:
        if not 0 <= instr.op < len(self.plan.ops):
            raise self.error(f"the program runs op {instr.op}, which the plan does not define")
        op = self.plan.ops[instr.op]
        if instr.recompute:
            self.check_recompute(op, instr)
        elif instr.op in self.r.ran:
            raise self.invalid(1, f"{self.what(op)} runs twice; a second run is a `recompute`")
        for name in op.inputs:
            self.check_input(op, name)
        outs = dict(instr.outs)
        if len(outs) != len(instr.outs) or set(outs) != set(op.outputs):
            raise self.error(f"the program places {[n for n, _ in instr.outs]} for {self.what(op)}, whose outputs "
                             f"are {list(op.outputs)}")
        if instr.in_place:
            self.in_place(op, instr)
        for name in set(op.inputs):
            if name in self.r.due and self.r.due[name][0] == op.index:  # the op waits for the swap-in
                self.ready[name] = k
                self.slot_read[self.slot[name]] = max(self.slot_read.get(self.slot[name], START), k)
        for name, region in instr.outs:
            if not (instr.in_place and name == op.outputs[0]):
                self.vacant(name, region, self.what(op))
            self.produced.add(name)
            self.ready[name] = k
        for name in set(op.inputs) | set(op.outputs):
            self.last_touch[name] = k
        if not instr.recompute:  # a recomputation reads its inputs again without using up a read
            for name in set(op.inputs):
                self.readers_left[name] -= 1
        if instr.in_place:
            self.ready.pop(op.inputs[0], None)

    def host_run(self, k: int, instr: HostRun) -> None:
        """An op on the host lane: its inputs on the host, and host memory it writes over no longer needed."""
        if not 0 <= instr.op < len(self.plan.ops):
            raise self.error(f"the program runs op {instr.op} on the host, which the plan does not define")
        op = self.plan.ops[instr.op]
        if instr.op in self.r.ran:
            raise self.invalid(1, f"{self.what(op)} runs twice (a host run is never repeated)")
        if op.host_ms is None:
            raise self.error(f"{self.what(op)} runs on the host, but its op line gives no `host_ms`")
        for name in op.inputs:
            if name not in self.produced:
                raise self.invalid(1, f"{self.what(op)} reads `{name}` before the op that makes it has run")
            if self.r.host.get(self.slot[name]) != name:
                raise self.invalid(4, f"{self.what(op)} runs on the host and reads `{name}`, which the host holds "
                                      "no copy of at this point")
        for name in op.outputs:
            held = self.r.host.get(self.slot[name])
            needed = self.readers_left[held] > (held in op.inputs) and held not in self.r.loc  # (else read there)
            if held is not None and held != name and (needed or held == self.plan.loss):
                raise self.invalid(5, f"{self.what(op)} writes `{name}` over the host memory of `{held}`, which is "
                                      "still needed")
            self.produced.add(name)
        for name in set(op.inputs):
            self.readers_left[name] -= 1

    def check_recompute(self, op: PlanOp, instr: Run) -> None:
        if op.op in NET_OPS:
            raise self.error(f"{self.what(op)} is recomputed: an all-reduce runs once a step (every rank's "
                             "collectives must come in the same order, once each)")
        if instr.op not in self.r.ran:
            raise self.invalid(1, f"{self.what(op)} is recomputed before its first run")
        for name, _ in instr.outs:
            if name in self.r.loc:
                raise self.invalid(3, f"{self.what(op)} is recomputed while `{name}` is still on the device at "
                                      f"{self.r.loc[name]}")

    def rebuilt_later(self, name: str, k: int) -> bool:
        """A recomputation of the op that makes ``name`` comes after program index ``k``."""
        return any(j > k for j in self.recomputes.get(self.maker.get(name, -1), ()))

    def check_input(self, op: PlanOp, name: str) -> None:
        if name not in self.produced:
            raise self.invalid(1, f"{self.what(op)} reads `{name}` before the op that makes it has run")
        if name not in self.r.loc:
            raise self.invalid(4, f"{self.what(op)} reads `{name}`, which is not on the device")
        due = self.r.due.get(name, (op.index, START))[0]
        if due != op.index:
            raise self.invalid(4, f"{self.what(op)} reads `{name}`, whose swap-in is only due before op {due}")

    def in_place(self, op: PlanOp, instr: Run) -> None:
        first = op.inputs[0] if op.inputs else None
        out = op.outputs[0]
        if not REGISTRY[op.op].in_place:
            raise self.invalid(3, f"{self.what(op)} may not write its output over its input")
        if first is None or dict(instr.outs)[out] != self.r.loc.get(first):
            raise self.invalid(3, f"{self.what(op)} works in place but `{out}` is not in its first input's region")
        if self.readers_left[first] > 1 or first == self.plan.loss:
            raise self.invalid(3, f"{self.what(op)} overwrites `{first}`, which is still needed")
        if first in self.r.copied_out:
            raise self.invalid(8, f"{self.what(op)} overwrites `{first}` while its swap-out may still be reading it")

    def swapin(self, k: int, instr: SwapIn) -> None:
        name, context, after = self.copy_or_free(instr, "swap-in")
        again = any(j > k for j in self.recomputes.get(instr.before, ()))  # due before a later recompute
        if (instr.before in self.r.ran and not again) or not 0 <= instr.before < len(self.plan.ops):
            raise self.invalid(4, f"{context} is due before op {instr.before}, which has already run or does not "
                                  "exist")
        if self.r.host.get(self.slot[name]) != name:
            raise self.invalid(6, f"{context}: the host holds no copy of `{name}` at this point")
        if name in self.r.loc:
            raise self.invalid(3, f"{context}: `{name}` is already on the device at {self.r.loc[name]}")
        region = self.region(instr.region, name)
        if self.r.free_since(region) > after:
            raise self.invalid(5, f"{context} may start after op {instr.after}, before region {region} falls free")
        self.vacant(name, region, context)

    def swapout(self, k: int, instr: SwapOut) -> None:
        name, context, after = self.copy_or_free(instr, "swap-out")
        if name not in self.r.loc:
            raise self.invalid(6, f"{context}: `{name}` is not on the device")
        if name in self.r.due:
            raise self.invalid(6, f"{context} starts before its swap-in has been used")
        if after < self.ready[name]:
            raise self.invalid(8, f"{context} may start after op {instr.after}, before `{name}` is complete on the "
                                  "device")
        slot = self.slot[name]
        if any(self.slot[t] == slot for t in self.r.due) or after < self.slot_read.get(slot, START):
            raise self.invalid(8, f"{context} may write its host copy while a swap-in still reads that host memory")

    def free(self, k: int, instr: Free) -> None:
        name, context, after = self.copy_or_free(instr, "free")
        if name not in self.r.loc:
            raise self.invalid(5, f"{context}: `{name}` holds no region")
        if self.last_touch.get(name, START) > after:
            raise self.invalid(5, f"{context} after op {instr.after} comes before its last use so far")
        if name in self.r.due:
            raise self.invalid(5, f"{context} comes before the op its swap-in is due for; the copy may still be "
                                  "writing its region")
        if self.still_needed(name) and self.r.host.get(self.slot[name]) != name and not self.rebuilt_later(name, k):
            raise self.invalid(6, f"{context}: `{name}` is needed later but the host holds no copy of it and no "
                                  "later recompute rebuilds it")
        self.ready.pop(name, None)

    def still_needed(self, name: str) -> bool:
        return self.readers_left[name] > 0 or name == self.plan.loss or name in self.finals

    def end(self) -> None:
        missing = [o.index for o in self.plan.ops if o.index not in self.r.ran]
        if missing:
            self.at = ("op", missing[0])
            raise self.invalid(1, f"op{'s' if len(missing) > 1 else ''} {', '.join(map(str, missing[:5]))} never "
                                  f"run{' (and more)' if len(missing) > 5 else ''}")
        loss, loc, host = self.plan.loss, self.r.loc, self.r.host
        if loss not in loc and host.get(self.slot.get(loss, loss)) != loss:
            raise self.invalid(6, f"the loss `{loss}` is neither on the device nor on the host at the end")
        new = dict(self.plan.updates)
        for i, t in enumerate(self.plan.tensors):
            if t.home is None or t.kind == Kind.input.value:
                continue
            self.at = ("tensor", i)
            final = new.get(t.name, t.name)
            if isinstance(t.home, Region) and loc.get(final) != t.home:
                raise self.invalid(7, f"`{t.name}` starts at {t.home} but its final value `{final}` ends at "
                                      f"{loc.get(final, 'no region')}")
            if t.home == HOST and host.get(self.slot[final]) != final:
                raise self.invalid(7, f"`{t.name}` starts on the host but its final value `{final}` is not written "
                                      "back to its host memory")
