"""One entry point for every planning method: the baselines by policy, and the genetic search; and where
each parameter's update runs (``--host-updates``)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Iterator

import attrs

from swapdsl.common.errors import SwpError
from swapdsl.common.memo import by_identity
from swapdsl.graph.dataparallel import DEFAULT_BUCKET_MIB
from swapdsl.graph.ir import Graph
from swapdsl.graph.offload import host_split, offloadable, reduces_on_host
from swapdsl.plan.program import Plan
from swapdsl.planning.baselines import (baseline_timing, host_budget_error, plan_baseline, plan_capuchin,
                                       plan_checkpoint)
from swapdsl.planning.bound import ideal_ms
from swapdsl.planning.ga import Search, SearchOptions, genetic_search
from swapdsl.planning.policy import METHODS
from swapdsl.planning.compiled import no_swap_bytes
from swapdsl.planning.exactplan import host_updates_refused, plan_exact
from swapdsl.planning.problem import Problem, Request
from swapdsl.planning.sizing import below_smallest_cap, least_cap

PLANNERS = {"capuchin": plan_capuchin, "checkpoint": plan_checkpoint}  # besides the policies of METHODS
METHOD_NAMES = ("ga", *sorted([*METHODS, *PLANNERS, "exact"]))
HOST_UPDATES = ("none", "all", "auto")
HOST_SHARES = (0.25, 0.5, 0.75, 1.0)  # auto: the largest parameters' updates first, this share of them


def host_choices(g: Graph) -> list[tuple[str, ...]]:
    """What ``auto`` chooses among: no update on the host, then the updates of the largest parameters
    (by bytes; ties in graph order) at each of ``HOST_SHARES`` of them."""
    place = {p: k for k, p in enumerate(g.params)}
    ranked = sorted(offloadable(g), key=lambda p: (-g.tensors[p].type.nbytes, place[p]))
    chosen = [set(ranked[:math.ceil(share * len(ranked))]) for share in HOST_SHARES]
    return list(dict.fromkeys([(), *(tuple(p for p in g.params if p in c) for c in chosen)]))


def host_requests(req: Request, host_updates: str) -> list[Request]:
    """The requests ``host_updates`` (all, or auto) chooses among: all that can, or each of
    ``host_choices``; with data-parallel ranks, each with its gradients all-reduced on the device, over
    the host copies of those updated there where that moves any (``offload.host_split``'s ``reduce``),
    and over every gradient's host copy where that moves more (``every``: a mean the device reads comes
    back up)."""
    g = req.graph
    out = []
    for choice in [offloadable(g)] if host_updates == "all" else host_choices(g):
        out.append(attrs.evolve(req, host_updates=choice, host_reduce=False, reduce_all=False))
        reduce = bool(choice) and g.ranks > 1 and reduces_on_host(g, choice)
        if reduce:
            out.append(attrs.evolve(req, host_updates=choice, host_reduce=True, reduce_all=False))
        if g.ranks > 1 and host_split(g, choice, reduce, every=True).ops != host_split(g, choice, reduce).ops:
            out.append(attrs.evolve(req, host_updates=choice, host_reduce=reduce, reduce_all=True))
    return out


def with_host_updates(req: Request, method: str, host_updates: str) -> Request:
    """``req`` with its updates on the host as ``host_updates`` says: none, all that can, or ``auto``: the
    request among ``host_requests`` whose plan (for ``ga``: whose ``belady`` plan) is fastest."""
    if host_updates not in HOST_UPDATES:
        raise SwpError(f"unknown --host-updates `{host_updates}`", hints=[f"one of {', '.join(HOST_UPDATES)}"])
    if host_updates != "none" and method == "exact":
        raise host_updates_refused()
    if host_updates == "all" and method == "checkpoint":
        raise SwpError("checkpoint keeps the parameters and optimiser state on the device: it cannot update any "
                       "on the host", hints=["use --host-updates none or auto with checkpoint, or a method that swaps"])
    if host_updates == "none" or method == "checkpoint":
        return attrs.evolve(req, host_updates=(), host_reduce=False, reduce_all=False)
    trials = host_requests(req, host_updates)
    if len(trials) == 1:
        return trials[0]
    scored, refused = [], []
    for k, trial in enumerate(trials):
        try:
            scored.append((req.plan_score(PLANNERS[method](trial)) if method in PLANNERS else
                           _baseline_score(trial, _SCOUT.get(method, method)), k, trial))
        except SwpError as err:  # (below this choice's smallest cap: another may fit)
            refused.append(err)
    if not scored:  # the refusal whose smallest feasible cap is least (an all-reduce over host copies may fit)
        raise min(refused, key=_least_cap)
    return min(scored, key=lambda s: s[:2])[2]


def least_cap_with(req: Request, method: str, host_updates: str | None) -> int:
    """The least cap ``req`` plans under with ``method`` where ``host_updates`` lets updates leave the device:
    the least over ``all``'s requests (``auto`` tries them too, and moving an update off the device only
    takes tensors from it)."""
    if host_updates in (None, "none") or method in ("checkpoint", "exact") or \
            (not offloadable(req.graph) and req.graph.ranks == 1):  # (ranks: gradients over host copies)
        return least_cap(Problem.of(req))
    return min(least_cap(Problem.of(r)) for r in host_requests(req, "all"))


_SCOUT = {"ga": "belady"}  # auto scores ga's choices by belady's plans (a search per choice would cost more)
BUCKET_CHOICES = (0.0, 1.0, 5.0, DEFAULT_BUCKET_MIB, 100.0)  # MiB: what ``--bucket-mib auto`` chooses among


def bucket_requests(request_at: Callable[[float], Request]) -> list[Request]:
    """The requests whose gradients travel in buckets of each of ``BUCKET_CHOICES`` MiB
    (``request_at(mib)``), DDP's size first, then from the smallest (the order ties go by); a size that
    cuts the same buckets as one before it is left out."""
    out, seen = [], set()
    for mib in sorted(BUCKET_CHOICES, key=lambda b: (b != DEFAULT_BUCKET_MIB, b)):
        req = request_at(mib)
        cut = tuple((op.op, op.inputs) for op in req.graph.ops if op.op in ("bucket_pack", "allreduce_mean"))
        if cut not in seen:
            seen.add(cut)
            out.append(req)
    return out


def best_buckets(request_at: Callable[[float], Request], method: str, host_updates: str | None = None) -> Request:
    """``--bucket-mib auto`` for a baseline: of ``bucket_requests``, the one whose plan is fastest (for
    ``ga`` and ``exact``: whose ``belady`` plan is; ``ga`` alone races searches instead, ``race_buckets``)."""
    scout = scout_for(method)
    scored, refused = [], []
    for req in bucket_requests(request_at):
        try:
            scored.append((score(req, scout, host_updates), len(scored), req))
        except SwpError as err:  # (below this size's smallest cap: another may fit)
            refused.append((err, req))
    if not scored:
        raise least_refused(refused)
    return min(scored, key=lambda s: s[:2])[2]


def scout_for(method: str) -> str:
    """What scores ``--bucket-mib auto``'s choices for ``method``: a baseline itself, else ``belady``."""
    return method if method in PLANNERS or method in METHODS else "belady"


def _least_cap(err: SwpError) -> float:
    """A refusal's smallest feasible cap (``below_smallest_cap``'s), infinite where it names none."""
    return getattr(err, "least", math.inf)


def least_refused(refused: list[tuple[SwpError, Request]]) -> SwpError:
    """Of the refusals of ``--bucket-mib auto``'s sizes, the one whose smallest feasible cap is least (the
    first where none says), naming its size."""
    err, req = min(refused, key=lambda r: _least_cap(r[0]))
    err.notes = [*err.notes, f"with the gradients in buckets of {req.graph.bucket_mib:g} MiB, the size of "
                             f"--bucket-mib auto that needs the least"]
    err.bucket_mib = req.graph.bucket_mib  # type: ignore[attr-defined]  (what the micro-batch hint tries)
    return err


def optimize(req: Request, method: str, search: SearchOptions | None = None, host_updates: str | None = None) -> Plan:
    """The plan ``method`` makes for ``req``: ``ga`` (searching as ``search`` says) or a baseline; with
    ``host_updates`` (``HOST_UPDATES``), first where each update runs (else as ``req`` says)."""
    if method in PLANNERS:
        return _planned(req, method, host_updates)
    req = _settled(req, method, host_updates)
    if method == "ga":
        return genetic_search(req, search or SearchOptions()).plan  # (it keeps to the host budget itself)
    if method == "exact":
        plan = plan_exact(req, (search or SearchOptions()).budget_s)
    elif method not in METHODS:
        raise SwpError(f"unknown method `{method}`", hints=[f"methods: {', '.join(METHOD_NAMES)}"])
    else:
        plan = plan_baseline(req, method)
    return _within_host_budget(req, plan, method)


@by_identity(size=4)
def _planned(req: Request, method: str, host_updates: str | None) -> Plan:
    """A planner's plan (``capuchin``'s, ``checkpoint``'s), remembered per request: a search among requests
    scores one by its plan (``score``), then keeps that plan."""
    req = _settled(req, method, host_updates)
    return _within_host_budget(req, PLANNERS[method](req), method)


def _within_host_budget(req: Request, plan: Plan, method: str) -> Plan:
    host = dict(plan.figures)["host_bytes"]
    if req.host_excess(int(host)):
        raise host_budget_error(req, host, method)
    return plan


def score(req: Request, method: str, host_updates: str | None = None) -> float:
    """``req.plan_score(optimize(req, method, None, host_updates))``, refused where that is refused; a
    baseline of ``METHODS`` is scored by the compiled simulator with no plan built (``baseline_timing``),
    so a search among requests builds only the plan it keeps."""
    if method not in METHODS:
        return req.plan_score(optimize(req, method, None, host_updates))
    req = _settled(req, method, host_updates)
    timing = baseline_timing(req, method)
    if req.host_excess(timing.host_bytes):
        raise host_budget_error(req, timing.host_bytes, method)
    return req.score(timing.iteration_ms, timing.host_bytes)


def _baseline_score(req: Request, method: str) -> float:
    timing = baseline_timing(req, method)
    return req.score(timing.iteration_ms, timing.host_bytes)


def _settled(req: Request, method: str, host_updates: str | None) -> Request:
    """``req`` with its updates placed as ``host_updates`` says (None: as it says), refused where not even
    the kernels' scratch fits its cap."""
    if host_updates is not None and req.tensor_cap > 0:
        req = with_host_updates(req, method, host_updates)
    if req.tensor_cap <= 0:
        p = Problem.of(req)
        raise below_smallest_cap(p, req.cap, no_swap_bytes(p, list(range(p.n_ops))))
    return req


AUTO_MAX_OPS = 200_000  # auto tries no micro-batch count whose step graph would have more ops than this


def optimize_microbatches(request_at: Callable[[int], Request], counts: list[int], method: str,
                          search: SearchOptions | None = None, host_updates: str | None = None) -> Plan:
    """``--microbatches auto``: of the micro-batch ``counts`` (ascending; ``request_at(k)`` the request
    with k micro-batches), the plan of the count whose plan is fastest. The counts stop at the first that
    swaps nothing (more would only add ops) or whose graph passes ``AUTO_MAX_OPS``. ``ga`` climbs the
    counts instead (``climb_microbatches``)."""
    if method == "ga":
        return climb_microbatches(request_at, counts, search or SearchOptions(), host_updates)
    best: tuple[float, int, Plan] | None = None
    refused: list[SwpError] = []
    for k, req in _counts(request_at, counts):
        try:
            plan = optimize(req, method, search, host_updates)
        except SwpError as err:  # below this count's smallest cap: a larger count may fit
            refused.append(err)
            continue
        score = req.plan_score(plan)
        if best is None or score < best[0]:
            best = (score, k, plan)
        if _swaps_nothing(plan):
            break
    if best is None:
        raise refused[-1]
    return best[2]


def _counts(request_at: Callable[[int], Request], counts: list[int]) -> Iterator[tuple[int, Request]]:
    for k in counts:
        req = request_at(k)
        if k > 1 and len(req.graph.ops) > AUTO_MAX_OPS:
            return
        yield k, req


def _swaps_nothing(plan: Plan) -> bool:
    f = dict(plan.figures)
    return f["h2d_bytes"] == 0 and f["d2h_bytes"] == 0


PROBE = 0.1  # climb_microbatches: the share of the budget (or generations) each count's search has to show its worth
CLIMB = 0.5  # climb_microbatches: past this share of the breeding time no further count is tried
PATIENCE = 1  # climb_microbatches: counts in a row that may do no better before the climb stops


def climb_microbatches(request_at: Callable[[int], Request], counts: list[int], search: SearchOptions,
                       host_updates: str | None = None) -> Plan:
    """``ga`` under ``--microbatches auto``: a search per count, in ascending order, each run for ``PROBE``
    of the budget once set up, until ``PATIENCE`` + 1 counts in a row do no better than the best so far
    (fewer passes spare launches and weight reads, more shrink what must be swapped: between them the step
    time has a low point, with bumps); the best search then has the rest of the budget (less its polish's
    share, on a small graph). No count is tried once ``CLIMB`` of the leader's breeding time is spent,
    when its ideal step is no faster than the best plan found, or past one whose ``belady`` plan swaps
    nothing; ``belady`` also tells whether a count fits at all. A
    probe is ``PROBE`` of ``SearchOptions.generations`` too: with a generation limit (and time to reach
    it) the seed fixes the plan."""
    return _climb((req for _, req in _counts(request_at, counts)), search, host_updates, scout=True)


def race_buckets(requests: Iterable[Request], search: SearchOptions, host_updates: str | None = None) -> Plan:
    """``ga`` under ``--bucket-mib auto``: a search per bucket size (``bucket_requests``), each run for
    ``PROBE`` of the budget once set up, the best then running for the rest, as ``climb_microbatches``
    runs them; sizes are not ordered as counts are, so the ``CLIMB`` share alone stops the race early
    (a size whose ideal step is no faster than the best plan so far is passed over). (``belady``'s ranking
    of the sizes misled ``ga``: GPT-2 XL on 8 ranks, 16 GiB, 10 s, 1 MiB by ``belady`` gave 1142 ms,
    ``ga``'s plan in 25 MiB buckets 1075 ms.)"""
    return _climb(requests, search, host_updates, scout=False)


def _climb(requests: Iterable[Request], search: SearchOptions, host_updates: str | None, scout: bool) -> Plan:
    """The race of ``climb_microbatches`` (``scout``: with its ``belady`` scouts and stops) and
    ``race_buckets``: a probe search per request, the best so far kept, the winner run to the end."""
    started = time.perf_counter()
    leader: Search | None = None
    refused: list[tuple[SwpError, Request]] = []
    misses = 0  # requests in a row that did no better than the leader
    try:
        for req in requests:
            try:
                req = with_host_updates(req, "ga", host_updates) if host_updates and req.tensor_cap > 0 else req
                if leader is not None and time.perf_counter() - started > CLIMB * (leader.breeding_ends - started):
                    break
                if leader is not None and ideal_ms(Problem.of(req)) >= leader.best:
                    if scout:  # (a larger count's ideal step is no faster)
                        break
                    continue
                scouted = optimize(req, "belady") if scout else None
                challenger = _probe(req, search, started)
            except SwpError as err:  # below this request's smallest cap: the next may fit
                refused.append((err, req))
                continue
            # (by the population's best: a baseline that beats it at ``finish`` is among its seeds)
            if leader is None or challenger.best < leader.best:
                if leader is not None:
                    leader.close()
                leader, misses = challenger, 0
            else:
                challenger.close()
                misses += 1
            if challenger.interrupted:
                leader.interrupt()
            if leader.interrupted or (scouted is not None and (misses > PATIENCE or _swaps_nothing(scouted))):
                break
    except KeyboardInterrupt:  # while a request was being set up: the best search so far finishes
        if leader is None:
            raise
        leader.interrupt()
    except BaseException:
        if leader is not None:
            leader.close()
        raise
    if leader is None:
        raise refused[-1][0] if scout else least_refused(refused)
    with leader.closing():
        leader.run(leader.breeding_ends, search.generations)
    return leader.finish().plan


def _probe(req: Request, search: SearchOptions, started: float) -> Search:
    """A search set up for ``req`` and run for ``PROBE`` of ``search``'s budget and generations (not past
    the budget)."""
    challenger = Search(req, search, started=started)
    until = min(time.perf_counter() + PROBE * search.budget_s, challenger.breeding_ends)
    with challenger.closing():
        challenger.run(until, max(1, int(PROBE * search.generations)))
    return challenger
