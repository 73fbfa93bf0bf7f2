"""Recomputation planned by the swap planner: a recomputed op is a clone in the schedule.

To recompute a forward op ``m`` is to run a copy of it (a *clone*) later in the step, whose outputs
stand in for ``m``'s outputs wherever an op of the backward pass (any op that is not a forward op)
reads them. The originals then die after their last forward read, with no swap-out; the clone reads
``m``'s inputs (or, if their makers are recomputed too, their clones), so those live until it runs,
and its outputs live from it to their last backward read. This is an ordinary planning problem with
a few more ops and tensors: the swap planner (compiled, and its reference) places, evicts and
prefetches clones and their inputs like anything else, and the simulator charges a clone the op's
time on the compute stream. A plan maps each clone back to a ``recompute`` of its op, and each clone
tensor back to the original's name, so the validator checks it as any other plan.

A clone runs just before the first op that reads one of its outputs (clones of one op's inputs first);
a clone is dropped from the set when, in the schedule at hand, a forward op still reads an original
after that point or an in-place update overwrites one of its inputs before it. So an op that works in
place (a bias added over a product) runs again only in a chain, over its first input rebuilt.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable

import attrs
import numpy as np

from swapdsl.graph.ir import Kind
from swapdsl.plan.program import Free, Instr, Run, SwapIn, SwapOut
from swapdsl.planning import _fastplan
from swapdsl.planning.compiled import Evaluator, csr
from swapdsl.planning.problem import Problem, edges


@attrs.frozen
class Candidates:
    """What in a problem may be recomputed, found once."""

    ops: tuple[int, ...]  # forward ops that may run again: ``direct`` ones and, with chains, the chains' ops
    forward: tuple[bool, ...]  # per op: does it make forward activations
    consumer: dict[int, int]  # tensor -> the op that overwrites it in place
    readers: dict[int, list[int]]  # tensor -> ops that read it
    direct: tuple[int, ...] = ()  # those a backward op reads that may run again alone (``capuchin``'s)

    @staticmethod
    def of(p: Problem, chains: bool = False) -> Candidates:
        """The forward ops whose outputs a backward op reads and that may run again alone; with ``chains``,
        also those that may run again only in a chain (over an input rebuilt) and every op that makes an
        input of one (so a recomputation may reach back past one op)."""
        forward = tuple(p.forward_op(op) for op in range(p.n_ops))
        consumer = {p.op_inputs[op][0]: op for op in range(p.n_ops) if p.in_place[op] and p.op_inputs[op]}
        readers = edges(p).readers
        finals = {new for _, new in p.updates} | {p.loss}

        net = p.net  # (an all-reduce runs once a step: a rerun would be another collective)
        maker = p.makers()

        def may_rerun(m: int) -> bool:
            return forward[m] and m not in net and not any(t in finals for t in p.op_outputs[m])

        def alone(m: int) -> bool:  # (a clone alone reads originals: m wrote over none, no op over m's outputs)
            return not p.in_place[m] and not any(t in consumer for t in p.op_outputs[m])

        def in_chain(m: int) -> bool:  # only a forward op writes over m's outputs (see ``_chains`` for m's inputs)
            return all(forward[consumer[t]] for t in p.op_outputs[m] if t in consumer)

        read_back = sorted(m for m in range(p.n_ops) if may_rerun(m)
                           and any(not forward[r] for t in p.op_outputs[m] for r in readers.get(t, ())))
        direct = tuple(m for m in read_back if alone(m))
        ops = set(direct)
        if chains:
            roots = [m for m in read_back if in_chain(m)]
            ops |= _chains(p, maker, roots, lambda m: may_rerun(m) and in_chain(m))
        return Candidates(tuple(sorted(ops)), forward, consumer, readers, direct)

    def cheapest(self, p: Problem) -> list[int]:
        """The direct candidates by recompute time per byte of output a backward op reads, cheapest first."""
        def per_byte(m: int) -> float:
            needed = sum(p.nbytes[t] for t in p.op_outputs[m]
                         if any(not self.forward[r] for r in self.readers.get(t, ())))
            return p.op_ms[m] / max(needed, 1)
        return sorted(self.direct, key=lambda m: (per_byte(m), m))


def _chains(p: Problem, maker: dict[int, int], roots: list[int], may_join: Callable[[int], bool]) -> set[int]:
    """``roots`` and every op that makes an input of one of them, transitively, that ``may_join``; less the
    ops that work in place over an input whose maker is not among them (their clones could never run:
    ``place_clones`` would drop them, as it drops one whose input's maker is not chosen)."""
    ops, frontier = set(roots), list(roots)
    while frontier:
        for t in p.op_inputs[frontier.pop()]:
            m = maker.get(t)
            if m is not None and m not in ops and may_join(m):
                ops.add(m)
                frontier.append(m)
    kept: set[int] = set()
    for m in sorted(ops):  # (op order is topological: an input's maker is decided first)
        if not p.in_place[m] or maker.get(p.op_inputs[m][0]) in kept:
            kept.add(m)
    return kept


@attrs.frozen
class Extended:
    """A problem with clones of ``ops`` appended: op ``p.n_ops + k`` is a clone of ``ops[k]``, and
    tensor ``len(p.names) + j`` a clone of ``origin[j]``. Its ``problem`` is made when first asked for (a
    search scores most clone sets with ``Evaluator.extended`` alone, and makes plans of few)."""

    base: Problem
    ops: tuple[int, ...]
    origin: tuple[int, ...]
    candidates: Candidates

    @functools.cached_property
    def problem(self) -> Problem:
        p, c, ops, origin = self.base, self.candidates, self.ops, self.origin
        clone = {t: len(p.names) + j for j, t in enumerate(origin)}
        inputs = list(p.op_inputs)
        for r in {r for t in clone for r in c.readers.get(t, ()) if not c.forward[r]}:  # (the backward readers)
            inputs[r] = tuple(clone.get(t, t) for t in inputs[r])
        inputs += [tuple(clone.get(t, t) for t in p.op_inputs[m]) for m in ops]
        return attrs.evolve(
            p, names=p.names + tuple(f"{p.names[t]}'" for t in origin),
            nbytes=p.nbytes + tuple(p.nbytes[t] for t in origin), size=p.size + tuple(p.size[t] for t in origin),
            kinds=p.kinds + tuple(p.kinds[t] for t in origin), op_ms=p.op_ms + tuple(p.op_ms[m] for m in ops),
            op_inputs=tuple(inputs),
            op_outputs=p.op_outputs + tuple(tuple(clone[t] for t in p.op_outputs[m]) for m in ops),
            in_place=p.in_place + (False,) * len(ops), host_ms=p.host_ms + (0.0,) * len(ops))

    def op_of(self, op: int) -> int:
        return op if op < self.base.n_ops else self.ops[op - self.base.n_ops]

    def tensor_of(self, t: int) -> int:
        n = len(self.base.names)
        return t if t < n else self.origin[t - n]


def extend(p: Problem, ops: Iterable[int], c: Candidates) -> Extended:
    """``p`` with a clone of each op in ``ops`` (ascending), read by the backward pass instead."""
    ops = tuple(sorted(ops))
    return Extended(p, ops, tuple(t for m in ops for t in p.op_outputs[m]), c)


def place_clones(p: Problem, c: Candidates, schedule: list[int], chosen: Iterable[int]) -> tuple[list[int], list[int]]:
    """Of the ``chosen`` candidates, those that can be recomputed in ``schedule`` (ascending), and each one's
    position in it: the clone runs just before the op it is first needed by (that op's schedule
    position; clones needed at one position run in op order, so a clone's recomputed inputs come first)."""
    pos = np.empty(p.n_ops, np.int64)
    pos[np.asarray(schedule, np.int64)] = np.arange(len(schedule))
    kept = sorted(set(chosen))
    while True:
        need = _needs(p, c, pos, kept)
        made = {t for k in kept for t in p.op_outputs[k]}
        bad = [m for m in kept if need[m] >= len(pos) or not _valid(p, c, pos, m, need[m], made)]
        if not bad:
            return kept, [need[m] for m in kept]
        dropped = set(bad)
        kept = [m for m in kept if m not in dropped]


def _needs(p: Problem, c: Candidates, pos: np.ndarray, kept: list[int]) -> dict[int, int]:
    need: dict[int, int] = {}
    chosen = set(kept)
    for m in reversed(kept):  # op order is topological: a clone's readers among clones come later
        at = len(pos)
        for t in p.op_outputs[m]:
            for r in c.readers.get(t, ()):
                if r in chosen:
                    at = min(at, need[r])
                elif not c.forward[r]:
                    at = min(at, int(pos[r]))
        need[m] = at
    return need


def _valid(p: Problem, c: Candidates, pos: np.ndarray, m: int, at: int, made: set[int]) -> bool:
    """No forward op reads an original of ``m`` at or after the clone (a recomputed reader's original
    runs where it stands, reading the original), and no original input of the clone is overwritten in
    place before it."""
    for t in p.op_outputs[m]:
        if any(c.forward[r] and pos[r] >= at for r in c.readers.get(t, ())):
            return False
    return all(u in made or c.consumer.get(u) is None or pos[c.consumer[u]] >= at
               for u in p.op_inputs[m])


class Placer:
    """``place_clones`` in C (``_fastplan.c``), for the search's inner loop: each op's outputs' forward and
    backward readers and its in-place-overwritten inputs' consumers and makers, flattened once (each row ends
    in the sentinel n, so no row is empty)."""

    def __init__(self, p: Problem, c: Candidates) -> None:
        n = p.n_ops
        self.p, self.c = p, c
        self.n, self.forward = n, np.array(c.forward, np.bool_)
        maker = np.full(len(p.names), n, np.int64)  # (n: no maker, an input)
        for op in range(n):
            maker[list(p.op_outputs[op])] = op
        fw, bw, consumers, makers = [], [], [], []
        for op in range(n):
            readers = sorted({r for t in p.op_outputs[op] for r in c.readers.get(t, ())})
            if readers and readers[0] <= op:  # (the C pass relies on op order being topological)
                raise ValueError(f"op {op} is read by op {readers[0]}, which comes before it")
            fw.append((*(r for r in readers if c.forward[r]), n))
            bw.append((*(r for r in readers if not c.forward[r]), n))
            overwritten = [u for u in p.op_inputs[op] if u in c.consumer]
            consumers.append((*(c.consumer[u] for u in overwritten), n))
            makers.append((*(int(maker[u]) for u in overwritten), n))
        self.rows = (*csr(tuple(fw)), *csr(tuple(bw)), *csr(tuple(consumers)), csr(tuple(makers))[1])

    def place(self, schedule: list[int] | np.ndarray, chosen: Iterable[int]) -> tuple[list[int], list[int]]:
        """What ``place_clones`` gives (which it computes itself where ``chosen`` holds an op that is not a
        forward op: no search chooses one, and a chosen backward reader would need its clone's position)."""
        kept = np.fromiter(chosen, np.int64)
        if not (kept[1:] > kept[:-1]).all():  # (the search's sets come sorted: no sort needed)
            kept = np.unique(kept)
        if not self.forward[kept].all():
            return place_clones(self.p, self.c, list(schedule), kept.tolist())
        at = np.empty(len(kept), np.int64)
        count = _fastplan.place_clones(np.asarray(schedule, np.int64), kept, at, *self.rows)
        return kept[:count].tolist(), at[:count].tolist()


def merged_schedule(base: list[int] | np.ndarray, ext: Extended, need: list[int]) -> np.ndarray:
    """``base`` with clone ``k`` just before position ``need[k]`` (ties in clone order: ``np.insert`` keeps the
    order of equal positions)."""
    clones = ext.base.n_ops + np.arange(len(need), dtype=np.int64)
    return np.insert(np.asarray(base, np.int64), np.asarray(need, np.int64), clones)


def to_base(ext: Extended, program: list[Instr]) -> list[Instr]:
    """A program of the extended problem in terms of the original one: a clone's run is a recompute."""
    names, base = ext.problem.names, ext.base.names
    name = {names[t]: base[ext.tensor_of(t)] for t in range(len(base), len(names))}
    out: list[Instr] = []
    for i in program:
        if isinstance(i, Run):
            outs = tuple((name.get(n, n), r) for n, r in i.outs)
            i = attrs.evolve(i, op=ext.op_of(i.op), outs=outs, recompute=i.op >= ext.base.n_ops)
        elif isinstance(i, SwapIn):
            i = attrs.evolve(i, tensor=name.get(i.tensor, i.tensor), after=_op(ext, i.after),
                             before=_op(ext, i.before))
        elif isinstance(i, (SwapOut, Free)):
            i = attrs.evolve(i, tensor=name.get(i.tensor, i.tensor), after=_op(ext, i.after))
        out.append(i)
    return out


def _op(ext: Extended, op: int) -> int:
    return op if op < 0 else ext.op_of(op)


class Extensions:
    """Extended problems and their evaluators by set of clones, the last few kept (each evaluator made from
    the problem's own, ``Evaluator.extended``)."""

    def __init__(self, p: Problem, size: int = 16, chains: bool = False) -> None:
        self.p = p
        self.candidates = Candidates.of(p, chains)
        self.placer = Placer(p, self.candidates)
        self.get = functools.lru_cache(maxsize=size)(self._build)

    @functools.cached_property
    def evaluator(self) -> Evaluator:
        """The problem's own, flattened once: each extended one is made from its arrays."""
        return Evaluator(self.p)

    def _build(self, ops: tuple[int, ...]) -> tuple[Extended, Evaluator]:
        ext = extend(self.p, ops, self.candidates)
        backward = ~np.array(self.candidates.forward, np.bool_)
        return ext, self.evaluator.extended(ext.ops, ext.origin, backward, lambda: ext.problem)

    def prepare(self, schedule: list[int] | np.ndarray, chosen: Iterable[int]) -> tuple[Extended, Evaluator, np.ndarray]:
        """The extended problem for what of ``chosen`` can be recomputed in ``schedule``, its evaluator,
        and the schedule with the clones in it."""
        kept, need = self.placer.place(schedule, chosen)
        ext, evaluator = self.get(tuple(kept))
        return ext, evaluator, merged_schedule(schedule, ext, need)
