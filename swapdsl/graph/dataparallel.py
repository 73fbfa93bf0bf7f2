"""Data parallelism as a graph pass: a training step -> the same step on each of N ranks, every parameter's
gradient averaged over the ranks before anything reads it.

Each rank runs the step on its own shard of the batch (the model's ``batch`` rows of a global batch N
times larger). An ``allreduce_mean`` follows the op that finishes each parameter's gradient (after the
micro-batches' sum, when there are micro-batches; small gradients share one, packed into a bucket as in
PyTorch's DDP: ``_buckets``), and every reader of the gradient (the optimiser
update, the guard's unscaling and finiteness flag, clipping's norm) reads the average instead; so does
each float report (a mean over the rank's rows, such as an accuracy), which is then the whole batch's. Since
the loss is a mean over the batch, the average of the ranks' gradients is the gradient of the mean
loss over the global batch: N ranks train as one process would on the whole batch, to rounding.

What stays per rank: batch norm's statistics (each rank normalises over its shard, as PyTorch's DDP
does without SyncBatchNorm) and its running statistics (rank 0's are the ones saved). A dropout over the
batch's rows hashes element indices counted in the whole batch: each rank's start after the ranks before
it (``rank_stride``), so N ranks draw one process's masks; any other draws one mask on every rank. The
planner places, swaps and times the all-reduce as an op; a plan runs it on the network lane
(plan/replay.py), beside the compute stream, so it overlaps the ops after it.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

import attrs

from swapdsl.common.errors import SwpError
from swapdsl.graph.analysis import in_place_ops, rowwise_dropout_seeds
from swapdsl.graph.ir import Graph, Kind, Op, Tensor, TensorType
from swapdsl.graph.ops.collective import REDUCIBLE

MAX_RANKS = 4096
DEFAULT_LINK_GBPS = 100.0  # gigabits per second between ranks (a 100 Gb/s network), when none is given
DEFAULT_BUCKET_MIB = 25.0  # PyTorch DDP's bucket_cap_mb
MAX_BUCKET_MIB = 1 << 20
MIB = 1 << 20


def check_ranks(ranks: object, link_gbps: object) -> tuple[int, float]:
    """(ranks, link bytes/s), or a clear error (one rank has no link to check)."""
    if not isinstance(ranks, int) or isinstance(ranks, bool) or not 1 <= ranks <= MAX_RANKS:
        raise SwpError(f"ranks: expected a whole number from 1 to {MAX_RANKS}, not {ranks!r}")
    bad = isinstance(link_gbps, bool) or not isinstance(link_gbps, (int, float)) or not 0.001 <= link_gbps <= 1e6
    if ranks > 1 and bad:
        raise SwpError(f"network: expected a link speed from 0.001 to 1000000 Gb/s, not {link_gbps!r}")
    return ranks, 0.0 if bad else float(link_gbps) * 1e9 / 8


def data_parallel(t: Graph, ranks: int, link_gbps: float = DEFAULT_LINK_GBPS, overlap: bool = True,
                  bucket_mib: float = DEFAULT_BUCKET_MIB, members: Sequence[int] = ()) -> Graph:
    """``t`` (a training graph) as run by each of ``ranks`` ranks (1: ``t`` itself). ``overlap``: the order
    starts each all-reduce while the backward pass goes on (``_ordered``); else every all-reduce comes
    after the backward pass and every update after them (DDP without overlap, for comparison).
    ``bucket_mib``: small gradients share an all-reduce in buckets of about this many MiB (``_buckets``;
    DDP's 25 by default, as ``api.load`` and the command line); 0: one all-reduce per gradient.
    ``members``: instead, each gradient's bucket, as a search chose them (``check_members``)."""
    if ranks == 1:
        return t
    ranks, link_bw = check_ranks(ranks, link_gbps)
    bucket_mib = check_bucket(bucket_mib)
    if not t.grads:
        raise SwpError("data-parallel training needs a training graph with gradients")
    for _, grad in t.grads:
        if t.type_of(grad).dtype.label not in REDUCIBLE:
            raise SwpError(f"data-parallel gradients are averaged in f32 or f64; `{grad}` is "
                           f"{t.type_of(grad).dtype.label}", hints=["plan without --ranks, or in --precision f32"])
    grads = {grad: f"{grad}/allreduced" for _, grad in t.grads}
    reports = _rank_reports(t, set(grads))
    order = gradient_order(t)
    closing = _grouped(order, check_members(t, members)) if members else _buckets(t, order, int(bucket_mib * MIB))
    tensors = dict(t.tensors)
    ops: list[Op] = []
    rowwise = rowwise_dropout_seeds(t)
    reduce = (("link_bw", link_bw), ("ranks", ranks))
    for op in t.ops:
        rename = reports if op.op == "report" else grads  # (a report's other readers keep the rank's value)
        ops.append(attrs.evolve(op, inputs=tuple(rename.get(n, n) for n in op.inputs),
                                attrs=_rank_attrs(t, op, rowwise)))
        for out in op.outputs:
            if out in reports:
                ops.append(_averaged(tensors, out, reports[out], reduce, op))
            for bucket in closing.get(out, []):
                ops.extend(_reduced(t, tensors, bucket, grads, reduce, op))
    ops = _ordered(attrs.evolve(t, tensors=tensors, ops=tuple(ops)), overlap)
    return attrs.evolve(t, tensors=tensors, ops=tuple(ops), ranks=ranks, link_gbps=float(link_gbps),
                        bucket_mib=bucket_mib, bucket_members=tuple(members),
                        grads=tuple((p, grads[g]) for p, g in t.grads),
                        reports=tuple((n, reports.get(r, r)) for n, r in t.reports))


def check_bucket(mib: object) -> float:
    """A bucket size in MiB, or a clear error."""
    if isinstance(mib, bool) or not isinstance(mib, (int, float)) or not 0 <= mib <= MAX_BUCKET_MIB:
        raise SwpError(f"bucket: expected a size from 0 to {MAX_BUCKET_MIB} MiB, not {mib!r}")
    return float(mib)


def gradient_order(t: Graph) -> list[str]:
    """``t``'s gradients (a training graph's, before this pass) in the order its ops finish them: the order
    bucket members are given in."""
    grads = {grad for _, grad in t.grads}
    return [out for out in _finished(t) if out in grads]


def members_of(t: Graph, bucket_mib: float) -> tuple[int, ...]:
    """The members the size rule (``_buckets``) gives ``t``'s gradients at ``bucket_mib`` MiB."""
    order = gradient_order(t)
    bucket = {g: tuple(b) for bs in _buckets(t, order, int(check_bucket(bucket_mib) * MIB)).values() for b in bs
              for g in b}
    return canonical([bucket[g] for g in order])


def canonical(labels: Sequence[object]) -> tuple[int, ...]:
    """Bucket labels, one per gradient, as members: each bucket numbered by its first gradient's turn."""
    number: dict[object, int] = {}
    return tuple(number.setdefault(x, len(number)) for x in labels)


def check_members(t: Graph, members: Sequence[object]) -> tuple[int, ...]:
    """``members`` (one bucket number per gradient of ``t``, in ``gradient_order``; buckets numbered by
    their first gradient's turn, each holding gradients of one dtype) as a tuple, or a clear error."""
    order = gradient_order(t)
    if len(members) != len(order):
        raise SwpError(f"bucket members: expected one bucket number per gradient, {len(order)}, not "
                       f"{len(members)}")
    check_numbering(members)
    dtypes: dict[int, object] = {}
    for g, b in zip(order, members):
        if dtypes.setdefault(b, t.type_of(g).dtype) != t.type_of(g).dtype:
            raise SwpError(f"bucket members: bucket {b} holds gradients of {dtypes[b]} and "
                           f"{t.type_of(g).dtype}; a bucket holds one dtype")
    return tuple(members)  # type: ignore[arg-type]


def check_numbering(members: Sequence[object]) -> None:
    """A clear error unless ``members`` number their buckets from 0, each new bucket the next."""
    if any(not isinstance(x, int) or isinstance(x, bool) for x in members) or tuple(members) != canonical(members):
        raise SwpError(f"bucket members: numbered from 0, each new bucket the next (0 0 1 0 2 ...), not "
                       f"{shown(members)}")


def shown(members: Sequence[object]) -> str:
    """Members as a message shows them: the first eight."""
    return " ".join(map(str, members[:8])) + (" ..." if len(members) > 8 else "")


def _grouped(order: list[str], members: tuple[int, ...]) -> dict[str, list[list[str]]]:
    """``order``'s gradients in the buckets ``members`` gives, keyed by each bucket's last gradient."""
    buckets: dict[int, list[str]] = {}
    for g, b in zip(order, members):
        buckets.setdefault(b, []).append(g)
    return {b[-1]: [b] for b in buckets.values()}


def _finished(t: Graph) -> list[str]:
    """The tensors ``t`` makes, in the order its ops make them."""
    return [out for op in t.ops for out in op.outputs]


def _buckets(t: Graph, grads: list[str], cap: int) -> dict[str, list[list[str]]]:
    """``grads`` (in the order they are finished) in buckets, keyed by the gradient whose op closes each: a
    gradient of ``cap`` bytes or more goes alone (packing it would copy it twice and save no hop); the
    smaller ones of each dtype fill a bucket in turn, which closes once it holds ``cap`` bytes or with the
    last of them."""
    closing: dict[str, list[list[str]]] = {g: [[g]] for g in grads if t.type_of(g).nbytes >= cap}
    for dtype in dict.fromkeys(t.type_of(g).dtype for g in grads):
        small = [g for g in grads if t.type_of(g).nbytes < cap and t.type_of(g).dtype == dtype]
        bucket: list[str] = []
        held = 0
        for grad in small:
            bucket.append(grad)
            held += t.type_of(grad).nbytes
            if held >= cap or grad == small[-1]:
                closing.setdefault(grad, []).append(bucket)
                bucket, held = [], 0
    return closing


def _averaged(tensors: dict[str, Tensor], name: str, mean: str, reduce: tuple, op: Op) -> Op:
    """The all-reduce of one tensor ``name`` of ``tensors`` into ``mean`` (a new one)."""
    tensors[mean] = attrs.evolve(tensors[name], name=mean, label=f"{tensors[name].title}, averaged over the ranks")
    return Op("allreduce_mean", (name,), (mean,), reduce, op.span)


def _reduced(t: Graph, tensors: dict[str, Tensor], bucket: list[str], grads: dict[str, str], reduce: tuple,
             op: Op) -> list[Op]:
    """The ops that average ``bucket``'s gradients over the ranks (each into ``grads[g]``): one all-reduce
    for a gradient alone; else a pack into one flat tensor, its all-reduce, and an unpack per gradient."""
    if len(bucket) == 1:
        return [_averaged(tensors, bucket[0], grads[bucket[0]], reduce, op)]
    flat, kind = f"{bucket[0]}/bucket", t.tensors[bucket[0]].kind
    packed = Op("bucket_pack", tuple(bucket), (flat,), (), op.span)
    tensors[flat] = Tensor(flat, TensorType((sum(t.type_of(g).numel for g in bucket),), t.type_of(bucket[0]).dtype),
                           kind, label=f"a bucket of {len(bucket)} gradients, from {t.tensors[bucket[0]].title}")
    ops = [packed, _averaged(tensors, flat, f"{flat}/allreduced", reduce, op)]
    start = 0
    for g in bucket:
        typ = t.type_of(g)
        tensors[grads[g]] = Tensor(grads[g], typ, t.tensors[g].kind,
                                   label=f"{t.tensors[g].title}, averaged over the ranks")
        ops.append(Op("bucket_unpack", (f"{flat}/allreduced",), (grads[g],),
                      (("shape", typ.shape), ("start", start)), op.span))
        start += typ.numel
    return ops


def _rank_attrs(t: Graph, op: Op, rowwise: frozenset[int]) -> tuple:
    """Dropout over the batch's rows hashes element indices: each rank's start after the rows of the ranks
    before it (the rank's whole batch, every micro-batch of it), so that N ranks draw the masks of one
    process on the N-fold batch (``elementwise.element_offset``). Any other dropout (over a parameter)
    draws the same mask on every rank, as one process does."""
    if op.op != "dropout" or op.attr_dict["seed"] not in rowwise:
        return op.attrs
    stride = t.type_of(op.outputs[0]).numel * t.microbatches
    return tuple(sorted({**op.attr_dict, "rank_stride": stride}.items()))


def _ordered(g: Graph, overlap: bool) -> list[Op]:
    """``g``'s ops in the order a plan starts from: the graph's, except that what reads an all-reduce's mean
    (the update, and what it feeds) waits until the next all-reduce is issued, so that on the network lane
    each all-reduce overlaps the backward ops that make the next gradient rather than holding up the compute
    stream at once (DDP's overlap, one gradient at a time: one more gradient is held). Without ``overlap``:
    the all-reduces after every other op that does not read one, and what reads them after those. A
    topological sort by those keys: producers before consumers, and an op in place after its input's other
    readers."""
    ops, n = g.ops, len(g.ops)
    made = {out: i for i, op in enumerate(ops) for out in op.outputs}
    reduces = [i for i, op in enumerate(ops) if op.op == "allreduce_mean"]
    following = dict(zip(reduces, reduces[1:]))
    key, waits_for = [float(i) for i in range(n)], [-1] * n  # the latest all-reduce each op depends on
    preds: list[set[int]] = [set() for _ in range(n)]
    for i, op in enumerate(ops):
        preds[i] = {made[x] for x in op.inputs if x in made}
        waits_for[i] = max([p if ops[p].op == "allreduce_mean" else waits_for[p] for p in preds[i]], default=-1)
        if not overlap:
            key[i] = i + (n if op.op == "allreduce_mean" else 2 * n if waits_for[i] >= 0 else 0)
        elif waits_for[i] in following:
            key[i] = following[waits_for[i]] + 0.5 + i / (2 * n)  # right after the next one, in the graph's order
    readers = g.consumers()
    for i in in_place_ops(g):
        preds[i] |= {j for j in readers[ops[i].inputs[0]] if j != i}
    succs: list[list[int]] = [[] for _ in range(n)]
    for i, ps in enumerate(preds):
        for p in ps:
            succs[p].append(i)
    left = [len(ps) for ps in preds]
    ready = [(key[i], i) for i in range(n) if not left[i]]
    heapq.heapify(ready)
    order = []
    while ready:
        _, i = heapq.heappop(ready)
        order.append(ops[i])
        for s in succs[i]:
            left[s] -= 1
            if not left[s]:
                heapq.heappush(ready, (key[s], s))
    return order


def _rank_reports(t: Graph, grads: set[str]) -> dict[str, str]:
    """The float reports an op makes from a rank's own rows (an accuracy): each averaged for the ``report``
    op alone. Reports made from the averaged gradients (the guard's flag, the gradients' norm, the loss
    scale) are already the same on every rank, and a parameter reported is too."""
    made, from_grads = set(), set(grads)
    for op in t.ops:
        made.update(op.outputs)
        if any(n in from_grads for n in op.inputs):
            from_grads.update(op.outputs)
    return {r: f"{r}/allreduced" for _, r in t.reports
            if r in made and r not in from_grads and t.type_of(r).dtype.label in REDUCIBLE}
