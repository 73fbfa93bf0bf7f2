"""The optimiser: SwapAdvisor's genetic search over schedules, plus what to pin.

A genome is a priority per op, a recompute gene per forward op that may be
recomputed (``clones.py``: the backward pass then reads a clone of it, run
just before it is needed), the share of the cap given to pinned persistent
tensors, where op outputs go in the arena (``Policy.outputs``: the bytes free
longest, or those freed last, always or in the backward pass only; which is
best depends on the model and the cap), and whether tensors on the host come
back as soon as a gap holds them, how much of the cap such early swap-ins leave
free and how far ahead they look (``Policy.early`` and ``horizon``). Decoding:
the schedule is the topological order that always runs the ready op of highest
priority (so every genome is a valid schedule and crossover needs no repair);
the pinned set is the persistent tensors read most per byte that fit in that
share (less if the ops would not fit beside them). The swap planner (arena
placement, Belady victims, earliest prefetch, the genome's output placement and
early swap-ins) then makes the plan and the simulator scores it. SwapAdvisor
also searched over the carving of memory into size classes; here the arena has
no carving to search (any tensor may take any free bytes), which is what lets a
plan use the whole cap. Seeds: the default schedule at every pinning level and
with each output placement, a schedule that keeps the ops reading one weight
together (``locality_priority``) at every pinning level and output placement,
each with and without early swap-ins, and the default schedule with windowed
ones. Where the cap is below the no-swap arena, right after the default
schedule come the recompute genes of ``capuchin``, of what Chen's rule rebuilds
at four segment lengths, of the cheapest half and all of the candidates that
may run alone, and of every candidate that neither works in place nor is
written over in place, each with early and with windowed swap-ins (the
population keeps the first seeds: at 64, the last of the others fall off).
Jittered variants fill what is left. Selection is by tournament with elitism;
children mix their parents' priorities op by op (or at one cut) and their
genes, then mutate. The
result is never worse than the best baseline: ``lru``, ``vdnn``, ``belady`` and
``capuchin`` are scored too, ``checkpoint`` is planned at the end, and the
best is kept if nothing beats it (on graphs past ``SEED_OP_EVALUATIONS`` /
777 ops, about 1,300, ``capuchin``'s choice comes from a shorter search than
the method's own). With a host budget, plans past it score
behind every plan within it (``Request.score``). On graphs of up to 40 ops the
search breeds for part of its budget and the exact planner then reworks its best
plan in that plan's order, the model's, and those of the next bred plans with
others, up to five (``polish.py``).

Random choices come from one seeded generator in the calling process, and
candidates are scored in worker processes whose results do not depend on which
worker ran them, so a seed and a generation limit fix the plan (but for a
polish that HiGHS ends at its time limit).
"""

from __future__ import annotations

import collections
import contextlib
import functools
import itertools
import math
import multiprocessing
import os
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor

import attrs
import numpy as np

from swapdsl.common.checks import as_number, as_whole, callable_or_none, positive, whole
from swapdsl.common.children import die_with
from swapdsl.common.errors import SwpError
from swapdsl.graph.ir import Graph
from swapdsl.plan.program import Plan
from swapdsl.planning.baselines import (Setup, baseline_setup, build_plan, capuchin_setup, host_budget_error,
                                        plan_checkpoint, with_figures)
from swapdsl.planning.checkpoint import rebuilt_makers
from swapdsl.planning.clones import Extensions
from swapdsl.planning.bound import ideal_ms
from swapdsl.planning.compiled import Evaluator, priority_order
from swapdsl.planning.policy import METHODS, OUTPUTS, Policy
from swapdsl.planning.polish import POLISH_SHARE, check_share, polish, polish_limit, polish_orders, polishable
from swapdsl.planning.problem import PAST_BUDGET, Problem, Request, edges
from swapdsl.planning.sizing import choose_pinned, need_bytes

MAX_WORKERS = 1024  # scoring processes: more than any machine's cores


@attrs.frozen
class SearchOptions:
    """The genetic search's knobs; ``progress`` is called after every generation (and once before the
    first) with where the search stands."""

    budget_s: float = attrs.field(default=60.0, converter=as_number, validator=positive)
    generations: int = attrs.field(default=100_000, converter=as_whole, validator=whole(0))  # 0: the seeds only
    population: int = attrs.field(default=64, converter=as_whole, validator=whole(2, 100_000))
    seed: int = attrs.field(default=0, converter=as_whole, validator=whole(0, 2**63 - 1))
    workers: int = attrs.field(default=0, converter=as_whole, validator=whole(0, MAX_WORKERS))  # 0: every core
    progress: Callable[[SearchProgress], None] | None = attrs.field(default=None, validator=callable_or_none)
    # the share of the budget for the exact polish, on graphs it polishes (0: none)
    polish: float = attrs.field(default=POLISH_SHARE, validator=lambda _, __, share: check_share(share))


@attrs.frozen
class SearchProgress:
    """Where a genetic search stands, as ``SearchOptions.progress`` receives it."""

    generation: int  # 0: the seeds scored
    best_fraction: float  # ideal / the best simulated step so far (0 while no candidate fits)
    evaluations: int  # distinct candidates simulated
    seconds: float  # since the search started
    budget_s: float
    interrupted: bool = False  # Ctrl-C or SIGTERM: the search stops and keeps its best plan
    microbatches: int = 1  # the passes a step of the graph searched runs (``--microbatches auto`` tries several)
    polishing: float = 0.0  # the seconds the exact polish may take, from now (0: the search is breeding)
    bucket_mib: float | None = None  # its ranks' bucket size (``--bucket-mib auto`` tries several); None: one rank
    buckets_searched: bool = False  # its buckets' members were searched from that size's (``planning/members.py``)


POLICY = Policy("belady", "earliest")  # the genome picks ``outputs``, ``early`` and ``horizon``
PIN_LEVELS = (0.0, 0.1, 0.25, 0.5, 0.75, 1.0)
# Policy.early and horizon: none, or the share of the cap early swap-ins leave free and how many ops ahead they look
EARLY = (None, (0.0, None), (0.02, None), (0.05, None), (0.1, None), (0.0, 200), (0.0, 1000), (0.05, 200),
         (0.05, 1000))


# Chen's rule's segment lengths (``checkpoint.SPACINGS``' units) and whether it keeps values only at separators,
# for the recompute genes of seeds: a short segment at separators keeps about one value a layer (the residual
# stream of a transformer), a long one a few in the whole graph
CHEN_MASKS = ((1 / 16, True), (1 / 4, True), (1.0, True), (1.0, False))

# the capuchin seed scores at most this many ops' worth of candidate sets (sets x ops): capuchin's own search
# on graphs of up to about 1,300 ops; on larger ones, where every set scored rebuilds the graph, a shorter one,
# so that setting up a count stays a few seconds and the micro-batch climb reaches the larger counts (at 3M,
# Inception-v4 in bf16 at 1/12 and 1/8 never got past 4 micro-batches in 60 s, 0.49-0.51 of the ideal)
SEED_OP_EVALUATIONS = 1_000_000


def _frozen(values: object) -> np.ndarray:
    a = np.array(values, np.float64)
    a.flags.writeable = False
    return a


def _frozen_mask(values: object) -> np.ndarray:
    a = np.array(values, np.bool_)
    a.flags.writeable = False
    return a


@attrs.frozen(eq=False)
class Genome:
    priority: np.ndarray = attrs.field(converter=_frozen)  # one per op, read-only
    pin: float = attrs.field(converter=float)  # share of the cap for pinned persistent tensors
    outputs: int = 0  # index into policy.OUTPUTS
    early: int = 0  # index into EARLY
    # per recomputation candidate (Decoder.candidates): recompute it for the backward pass (empty: none)
    recompute: np.ndarray = attrs.field(converter=_frozen_mask, default=())

    @property
    def key(self) -> tuple[bytes, float, int, int, bytes]:
        """What identifies a genome (arrays do not hash)."""
        return self.priority.tobytes(), self.pin, self.outputs, self.early, np.packbits(self.recompute).tobytes()

    @property
    def policy(self) -> Policy:
        return policy_of(self.outputs, self.early)


def policy_of(outputs: int, early: int) -> Policy:
    """The swap planner's policy for a genome's ``outputs`` and ``early`` genes (indices into
    ``policy.OUTPUTS`` and ``EARLY``)."""
    share, horizon = EARLY[early] or (None, None)
    return attrs.evolve(POLICY, outputs=OUTPUTS[outputs], early=share, horizon=horizon)


@attrs.frozen
class Outcome:
    plan: Plan
    generations: int
    evaluations: int
    seconds: float


class Decoder:
    """Turns genomes into (schedule, pinned) and scores them; one per worker process."""

    def __init__(self, req: Request) -> None:
        self.req = req
        self.p = Problem.of(req)
        self.preds, self.succs = self._edges()
        self.n_preds = np.array([len(ps) for ps in self.preds], np.int64)
        self.succ_ptr = np.zeros(self.p.n_ops + 1, np.int64)
        self.succ_ptr[1:] = np.cumsum([len(s) for s in self.succs])
        self.succ_idx = np.array([q for s in self.succs for q in sorted(s)], np.int64)
        self.evaluator = Evaluator(self.p)
        self.extensions = Extensions(self.p, chains=True)
        self.candidates = np.array(self.extensions.candidates.ops, np.int64)
        reads = {t: 0 for t in self.p.pinnable}
        for op in range(self.p.n_ops):
            for t in self.p.op_inputs[op]:
                if t in reads:
                    reads[t] += 1
        self.pin_order = sorted(self.p.pinnable, key=lambda t: (-reads[t] / max(self.p.nbytes[t], 1), t))
        self._need: dict[frozenset[int], int] = {}
        self._pinned: dict[float, frozenset[int]] = {}

    def _edges(self) -> tuple[list[set[int]], list[set[int]]]:
        """Data dependencies, and write-after-read ones: an in-place update runs after every
        other reader of the value it overwrites."""
        p = self.p
        data = edges(p)
        readers = data.readers
        preds = [set(ps) for ps in data.preds]
        for op in range(p.n_ops):
            if p.in_place[op]:
                preds[op].update(r for r in readers.get(p.op_inputs[op][0], []) if r != op)
        succs: list[set[int]] = [set() for _ in range(p.n_ops)]
        for op, ps in enumerate(preds):
            for q in ps:
                succs[q].add(op)
        return preds, succs

    @functools.cached_property
    def no_swap(self) -> int:
        """The arena the default schedule needs with no swapping."""
        return self.evaluator.no_swap_bytes(list(range(self.p.n_ops)))

    def schedule(self, priority: np.ndarray) -> np.ndarray:
        return priority_order(priority, self.n_preds, self.succ_ptr, self.succ_idx)

    def pinned(self, share: float) -> frozenset[int]:
        if share not in self._pinned:
            self._pinned[share] = self._pin(share)
        return self._pinned[share]

    def _pin(self, share: float) -> frozenset[int]:
        budget, chosen, used = share * self.req.tensor_cap, [], 0
        for t in self.pin_order:
            if used + self.p.size[t] <= budget:
                chosen.append(t)
                used += self.p.size[t]
        return frozenset(chosen)

    def need(self, pinned: frozenset[int]) -> int:
        if pinned not in self._need:
            self._need[pinned] = need_bytes(self.p, pinned)
        return self._need[pinned]

    def decode(self, g: Genome) -> tuple[np.ndarray, frozenset[int]] | None:
        share = g.pin
        while True:
            pinned = self.pinned(share)
            if self.need(pinned) <= self.req.tensor_cap:
                return self.schedule(g.priority), pinned
            if not pinned:
                return None
            share /= 2  # pinned tensors crowd out what some op needs: pin less
            if share < 1e-3:
                share = 0.0

    def recomputed(self, g: Genome) -> tuple[int, ...]:
        """The forward ops the genome recomputes."""
        return tuple(self.candidates[g.recompute].tolist()) if len(g.recompute) == len(self.candidates) else ()

    def plan(self, g: Genome) -> Plan | None:
        decoded = self.decode(g)
        if decoded is None:
            return None
        schedule, pinned = decoded
        return build_plan(self.req, self.p, "ga", schedule.tolist(), pinned, g.policy, self.evaluator,
                          self.recomputed(g), self.extensions)

    def score(self, g: Genome) -> float:
        """The genome's plan's iteration time (``Request.score``: past any with the host budget broken),
        from the compiled planner and simulator."""
        decoded = self.decode(g)
        if decoded is None:
            return math.inf
        schedule, pinned = decoded
        recompute = self.recomputed(g)
        if recompute:
            _, evaluator, merged = self.extensions.prepare(schedule, recompute)
            t = evaluator(merged, self.req.tensor_cap, pinned, g.policy)
        else:
            t = self.evaluator(schedule, self.req.tensor_cap, pinned, g.policy)
        return self.req.score(t.iteration_ms, t.host_bytes)

    def setup_score(self, s: Setup) -> float:
        """A baseline's score, as ``score`` scores a genome."""
        recompute = self.extensions.prepare(s.schedule, s.recompute) if s.recompute else None
        evaluator, schedule = (recompute[1], recompute[2]) if recompute else (self.evaluator, s.schedule)
        t = evaluator(schedule, self.req.tensor_cap, s.pinned, s.policy)
        return self.req.score(t.iteration_ms, t.host_bytes)

    def mask(self, ops: object) -> np.ndarray:
        """The recompute genes for a set of ops (those not candidates are left out)."""
        return np.isin(self.candidates, np.fromiter(ops, np.int64))  # type: ignore[call-overload]


_DECODER: Decoder | None = None


def _init_worker(req: Request, parent: int) -> None:
    global _DECODER
    die_with(parent)
    _DECODER = Decoder(req)


def _score(g: Genome) -> float:
    assert _DECODER is not None
    return _DECODER.score(g)


class _Scorer:
    """Scores genomes, in worker processes when there are several cores, remembering every result."""

    def __init__(self, req: Request, decoder: Decoder, workers: int) -> None:
        self.decoder = decoder
        self.cache: dict[tuple[bytes, float, int, int, bytes], float] = {}
        self.pool: ProcessPoolExecutor | None = None
        if workers > 1:
            method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
            self.pool = ProcessPoolExecutor(workers, multiprocessing.get_context(method),
                                            initializer=_init_worker, initargs=(req, os.getpid()))

    def __call__(self, genomes: list[Genome]) -> list[float]:
        todo = list({g.key: g for g in genomes if g.key not in self.cache}.values())
        if self.pool is not None and len(todo) > 1:
            results = list(self.pool.map(_score, todo, chunksize=max(1, len(todo) // 8)))
        else:
            results = [self.decoder.score(g) for g in todo]
        self.cache.update(zip((g.key for g in todo), results))
        return [self.cache[g.key] for g in genomes]

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=False, cancel_futures=True)


def locality_priority(p: Problem) -> np.ndarray:
    """Priorities for a schedule that keeps together the ops that read one persistent tensor.

    Each op belongs to the group of the first-used persistent tensor it reads or, if it reads none,
    to its nearest such neighbour's along data edges. Forward ops come first, earliest group first;
    then the rest, latest group first; the default order breaks ties. An unrolled LSTM then runs a
    layer's input projections for every step before its recurrence (which reads the other weight),
    and back in reverse, instead of alternating the two weights at every step: one weight and its
    gradient at a time need the device rather than a layer's two, which at a small cap is the
    difference between keeping them there and moving them over the bus at every step.
    """
    n = p.n_ops
    rank: dict[int, int] = {}
    for op in range(n):
        for t in p.op_inputs[op]:
            if t in p.starts_on_host:
                rank.setdefault(t, len(rank))
    group = [min((rank[t] for t in p.op_inputs[op] if t in rank), default=-1) for op in range(n)]
    neighbours: list[list[int]] = [[] for _ in range(n)]
    producer = p.makers()
    for op in range(n):
        for t in p.op_inputs[op]:
            if t in producer:
                neighbours[op].append(producer[t])
                neighbours[producer[t]].append(op)
    queue = collections.deque(op for op in range(n) if group[op] >= 0)
    while queue:
        op = queue.popleft()
        for other in neighbours[op]:
            if group[other] < 0:
                group[other] = group[op]
                queue.append(other)
    width = len(rank) + 2
    forward = [bool(p.op_outputs[op]) and p.is_forward_activation(p.op_outputs[op][0]) for op in range(n)]
    return np.array([((2 * width - group[op]) if forward[op] else (group[op] + 1)) * n + (n - op)
                     for op in range(n)], np.float64)


def _seeds(d: Decoder, rng: np.random.Generator, size: int, masks: list[np.ndarray]) -> list[Genome]:
    """The first population; ``masks``: recompute genes to start from (the last one with the locality
    schedule too)."""
    n = d.p.n_ops
    default = np.arange(n, 0, -1, dtype=np.float64)
    local = locality_priority(d.p)
    none = np.zeros(len(d.candidates), np.bool_)
    try:
        base_pin = 1.0 if choose_pinned(d.p, d.req.tensor_cap, d.no_swap) else 0.0
    except SwpError:
        base_pin = 0.0
    base = [Genome(default, base_pin)] + [Genome(default, pin) for pin in PIN_LEVELS if pin != base_pin]
    base += [Genome(default, base_pin, o) for o in range(1, len(OUTPUTS))]
    base += [Genome(local, pin, o) for pin in PIN_LEVELS for o in range(len(OUTPUTS))]
    plain = [s for g in base for s in (attrs.evolve(g, recompute=none), attrs.evolve(g, early=1, recompute=none))]
    # the population keeps the first ``size`` seeds: the default schedule, then, where the cap needs
    # recomputation, its seeds, with early swap-ins (1) and windowed ones (5) that a recomputing plan's
    # prefetches want (at 64 with eight masks, the last locality seeds and the windowed ones fall off)
    seeds = plain[:2] + [Genome(default, base_pin, 0, e, m) for m in masks for e in (1, 5)]
    seeds += [Genome(local, base_pin, 0, e, m) for m in masks[-1:] for e in (5, 7)]
    seeds += plain[2:] + [Genome(default, base_pin, 0, e, none) for e in range(2, len(EARLY))]
    while len(seeds) < size:
        jitter = rng.normal(0.0, rng.choice([0.5, 2.0, 8.0]), n)
        mask = masks[int(rng.integers(len(masks)))] if masks and rng.random() < 0.5 else none
        seeds.append(Genome((default, local)[len(seeds) % 2] + jitter, float(rng.choice(PIN_LEVELS)),
                            int(rng.integers(len(OUTPUTS))), int(rng.integers(len(EARLY))), mask))
    return seeds[:max(size, 1)]


def _genes(g: Genome, n: int) -> np.ndarray:
    """A genome's recompute genes, none if it has none."""
    return g.recompute if len(g.recompute) == n else np.zeros(n, np.bool_)


def _crossover(a: Genome, b: Genome, rng: np.random.Generator) -> Genome:
    take = rng.random(len(a.priority)) < 0.5
    if rng.random() < 0.5:  # one cut: keeps runs of relative order together
        cut = int(rng.integers(0, len(a.priority) + 1))
        take = np.arange(len(a.priority)) < cut
    n = max(len(a.recompute), len(b.recompute))
    mix = rng.random(n) < 0.5
    if rng.random() < 0.5:  # one parent's genes whole
        mix[:] = rng.random() < 0.5
    return Genome(np.where(take, a.priority, b.priority), a.pin if rng.random() < 0.5 else b.pin,
                  a.outputs if rng.random() < 0.5 else b.outputs, a.early if rng.random() < 0.5 else b.early,
                  np.where(mix, _genes(a, n), _genes(b, n)))


def _mutate(g: Genome, rng: np.random.Generator) -> Genome:
    if rng.random() < 0.8:  # move a few ops earlier or later
        priority = np.array(g.priority)
        ops = rng.integers(0, len(priority), size=int(rng.integers(1, 8)))
        priority[ops] += rng.normal(0.0, rng.choice([1.0, 5.0, 25.0]), len(ops))
        return attrs.evolve(g, priority=priority)
    which = rng.random()
    if which < 0.25:
        return attrs.evolve(g, pin=float(rng.choice(PIN_LEVELS)))
    if which < 0.5:
        return attrs.evolve(g, outputs=int(rng.integers(len(OUTPUTS))))
    if which < 0.75 or not len(g.recompute):
        return attrs.evolve(g, early=int(rng.integers(len(EARLY))))
    genes = np.array(g.recompute)  # recompute a few ops more, or fewer
    flip = rng.integers(0, len(genes), size=int(rng.integers(1, 8)))
    genes[flip] = ~genes[flip]
    return attrs.evolve(g, recompute=genes)


def _tournament(pop: list[Genome], fit: list[float], rng: np.random.Generator, k: int = 3) -> Genome:
    picks = rng.choice(len(pop), size=min(k, len(pop)), replace=False)
    return pop[min(picks, key=lambda i: (fit[i], i))]


def _report(opts: SearchOptions, gen: int, best: float, ideal: float, evaluations: int, started: float,
            interrupted: bool = False, g: Graph | None = None, polishing: float = 0.0) -> None:
    if opts.progress is not None:
        opts.progress(SearchProgress(gen, ideal / best if best < math.inf else 0.0, evaluations,
                                     time.perf_counter() - started, opts.budget_s, interrupted,
                                     1 if g is None else g.microbatches, polishing,
                                     g.bucket_mib if g is not None and g.ranks > 1 else None,
                                     g is not None and bool(g.bucket_members)))


def genetic_search(req: Request, opts: SearchOptions, on_generation: Callable[[int, float], None] | None = None
                   ) -> Outcome:
    search = Search(req, opts, on_generation)
    with search.closing():
        search.run(search.breeding_ends, opts.generations)
    return search.finish()


class Search:
    """One genetic search, run in slices: created, it sets up and scores its seeds (generation 0); ``run``
    breeds generations until a time or a generation count; ``finish`` ends it with the best plan.
    ``--microbatches auto`` and ``--bucket-mib auto`` race several (``optimize._climb``)."""

    def __init__(self, req: Request, opts: SearchOptions, on_generation: Callable[[int, float], None] | None = None,
                 started: float | None = None) -> None:
        self.started = time.perf_counter() if started is None else started  # (a race's searches share its start)
        self.req, self.opts, self.on_generation = req, opts, on_generation
        self.d = d = Decoder(req)
        self.rng = np.random.default_rng(opts.seed)
        self.ideal = ideal_ms(d.p)
        self.baselines = {m: baseline_setup(d.p, m, req.tensor_cap, d.no_swap)[0] for m in METHODS}
        masks = []
        if len(d.candidates) and d.no_swap > req.tensor_cap:
            evaluations = SEED_OP_EVALUATIONS // d.p.n_ops
            self.baselines["capuchin"] = capuchin_setup(req, d.p, d.extensions, d.no_swap, evaluations)[0]
            cheapest = d.extensions.candidates.cheapest(d.p)
            masks = [d.mask(self.baselines["capuchin"].recompute)]
            masks += [d.mask(rebuilt_makers(d.p, req.tensor_cap, spacing, at_cuts))
                      for spacing, at_cuts in CHEN_MASKS]
            masks += [d.mask(cheapest[:max(1, int(share * len(cheapest)))]) for share in (0.5, 1.0)]
            # every candidate that could run again alone, with the chains to it, but not the ops that work in
            # place nor the makers of what they write over: their clones run out of place, beside their inputs
            # (with them, this seed's step was 3.4-3.8x longer on GPT-2 medium and ResNet-152 in bf16 at 1/12)
            c = d.extensions.candidates
            masks.append(np.array([not d.p.in_place[m] and not any(t in c.consumer for t in d.p.op_outputs[m])
                                   for m in d.candidates], np.bool_))
            masks = list({m.tobytes(): m for m in masks}.values())  # (two rules may make one set)
        self.pop = _seeds(d, self.rng, opts.population, masks)
        first = d.score(self.pop[0])  # compiles the inner loop (or loads it) once, before workers fork
        self.scorer = _Scorer(req, d, opts.workers or os.cpu_count() or 1)
        self.scorer.cache[self.pop[0].key] = first
        self.generations = 0
        self.fit = [math.inf] * len(self.pop)
        self.interrupted = False
        self.polish_share = opts.polish if polishable(d.p) else 0.0
        with self.closing():
            self._guarded(self._first)

    @property
    def breeding_ends(self) -> float:
        """When breeding stops (``time.perf_counter()``): the budget's end, less the polish's share."""
        return self.started + self.opts.budget_s * (1 - self.polish_share)

    @property
    def best(self) -> float:
        """The best score so far (``Request.score``: the step in ms within the host budget)."""
        return min(self.fit)

    def run(self, until: float, generations: int) -> None:
        """Breed until ``time.perf_counter()`` passes ``until`` or ``generations`` generations are done
        in all (a Ctrl-C or SIGTERM ends it too: the search then keeps its best)."""
        def breed() -> None:
            while self.generations < generations and time.perf_counter() < until:
                self.fit = self._generation()
                self._reported()

        if not self.interrupted:
            self._guarded(breed)

    def _first(self) -> None:
        self.fit = self.scorer(self.pop)
        self._reported()

    def _generation(self) -> list[float]:
        order = sorted(range(len(self.pop)), key=lambda i: (self.fit[i], i))
        elite = [self.pop[i] for i in order[:max(2, len(self.pop) // 4)]]
        children = []
        while len(elite) + len(children) < len(self.pop):
            a, b = _tournament(self.pop, self.fit, self.rng), _tournament(self.pop, self.fit, self.rng)
            child = _crossover(a, b, self.rng) if self.rng.random() < 0.7 else a
            children.append(_mutate(child, self.rng))
        self.pop = elite + children
        self.generations += 1
        return self.scorer(self.pop)

    def _reported(self) -> None:
        _report(self.opts, self.generations, self.best, self.ideal, len(self.scorer.cache), self.started,
                g=self.req.graph)
        if self.on_generation is not None:
            self.on_generation(self.generations, self.best)

    def _guarded(self, body: Callable[[], None]) -> None:
        """``body``; on a Ctrl-C or SIGTERM in it, the population as far as it was scored, and the report."""
        try:
            body()
        except KeyboardInterrupt:
            self.fit = [self.scorer.cache.get(g.key, math.inf) for g in self.pop]
            self.interrupt()

    def interrupt(self) -> None:
        """Stop here (a Ctrl-C or SIGTERM came): ``run`` breeds no more, and the report says so once."""
        if not self.interrupted:
            self.interrupted = True
            _report(self.opts, self.generations, self.best, self.ideal, len(self.scorer.cache), self.started,
                    True, self.req.graph)

    def close(self) -> None:
        """Stop the workers (a search that lost a race ends so, without a plan)."""
        self.scorer.close()

    @contextlib.contextmanager
    def closing(self) -> Iterator[None]:
        """Stops the workers if what it wraps fails."""
        try:
            yield
        except BaseException:
            self.close()
            raise

    def finish(self) -> Outcome:
        """The best plan (``_finish``), polished (``polish.py``) on a graph it polishes, unless the search was
        interrupted or too little of the budget is left."""
        self.close()
        plan, extra = _finish(self.req, self.d, self.pop, self.fit, self.baselines, self.generations,
                              len(self.scorer.cache))
        limit = polish_limit(self.polish_share, time.perf_counter() - self.started, self.opts.budget_s)
        if limit is not None and not self.interrupted:
            _report(self.opts, self.generations, self.best, self.ideal, len(self.scorer.cache), self.started,
                    g=self.req.graph, polishing=limit)
            try:
                ranked = sorted(range(len(self.pop)), key=lambda k: (self.fit[k], k))
                bred = (self.d.plan(self.pop[k]) for k in ranked if self.fit[k] < math.inf)
                orders = polish_orders(self.d.p, itertools.chain([plan], bred))
                plan = polish(self.req, self.d.p, plan, orders, self.d.no_swap, extra, limit)
            except KeyboardInterrupt:
                self.interrupt()
        return Outcome(plan, self.generations, len(self.scorer.cache), time.perf_counter() - self.started)


def _finish(req: Request, d: Decoder, pop: list[Genome], fit: list[float], baselines: dict[str, Setup],
            generations: int, evaluations: int) -> tuple[Plan, dict[str, float]]:
    """The best of the population, of the baselines and of ``checkpoint``, and the search's figures (in
    the plan's too)."""
    i = min(range(len(pop)), key=lambda k: (fit[k], k))
    extra = {"generations": float(generations), "evaluations": float(evaluations)}
    scores = {m: d.setup_score(s) for m, s in baselines.items()}
    champion = min(scores, key=lambda m: (scores[m], m))
    best = d.plan(pop[i]) if fit[i] <= scores[champion] else None
    if best is None:
        s = baselines[champion]
        best = build_plan(req, d.p, "ga", s.schedule, s.pinned, s.policy, d.evaluator, s.recompute, d.extensions)
    plan = with_figures(best, d.p, d.no_swap, extra, recomputes=True)
    # (checkpointing swaps nothing, so it is never faster than the ideal step: no need to plan it then)
    checkpointed = _checkpoint(req) if req.plan_score(plan) > ideal_ms(d.p) else None
    if checkpointed is not None and req.plan_score(checkpointed) < req.plan_score(plan):
        plan = with_figures(attrs.evolve(checkpointed, method="ga"), d.p, d.no_swap, extra, recomputes=True)
    if req.plan_score(plan) >= PAST_BUDGET:
        raise host_budget_error(req, dict(plan.figures)["host_bytes"], "ga")
    return plan, extra


def _checkpoint(req: Request) -> Plan | None:
    try:
        return plan_checkpoint(req)
    except SwpError:
        return None

