"""Which gradients share an all-reduce bucket: the search ``--bucket-mib auto`` runs after choosing a size.

The size rule (``graph/dataparallel.py``) cuts the gradients into buckets of about one size, in the order
the backward pass finishes them. Who shares a bucket decides when each all-reduce may start (a bucket
waits for its last gradient), how much of the network's work is left once the backward pass ends (the
last buckets'), how many ring hops and launches the step pays, and how long a pack holds device memory;
one size for every bucket is rarely the best cut (GPT-2 small on 8 ranks at 2 GiB and 25 Gb/s: 516 ms in
5 MiB buckets, 491 ms with the first bucket closed at 1 MiB).

From the chosen size's buckets, a local search changes one bucket at a time (split it in two by bytes,
merge it with the next bucket of its dtype to close, or move one gradient across that boundary), plans
each change with the method's own planner (``ga``'s: ``belady``, whose plan then races as one more
entrant), and keeps a change that plans faster. Changes are drawn from a seeded generator, so the same
seed gives the same buckets. The members found go in the plan (``ranks ... members``).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence

from swapdsl.common.errors import SwpError
from swapdsl.graph.dataparallel import canonical
from swapdsl.planning.optimize import score
from swapdsl.planning.problem import Request

MEMBER_TRIES = 16  # changes planned from the chosen size's buckets
MOVES = ("split", "merge", "give", "take")
_DRAWS = 32  # draws per try before the neighbourhood counts as seen


def search_members(req: Request, start: tuple[int, ...], grads: Sequence[tuple[int, str]],
                   request_with: Callable[[tuple[int, ...]], Request], scout: str, host_updates: str | None = None,
                   seed: int = 0, tries: int = MEMBER_TRIES) -> Request:
    """The request whose buckets plan fastest with ``scout``, of ``req`` (its buckets ``start``, over
    ``grads``: each gradient's bytes and dtype, in ``gradient_order``) and up to ``tries`` changes of one
    bucket from the best so far (``request_with(members)``: the request with those members); ``req``
    itself where it does not plan."""
    try:
        best = score(req, scout, host_updates)
    except SwpError:  # (a size that does not fit: auto's refusal stands)
        return req
    nbytes, dtypes = [b for b, _ in grads], [d for _, d in grads]
    rng = random.Random(seed)
    best_req, current, seen = req, start, {start}
    for _ in range(tries):
        change = next((c for c in (_changed(current, nbytes, dtypes, rng) for _ in range(_DRAWS))
                       if c is not None and c not in seen), None)
        if change is None:
            break
        seen.add(change)
        trial = request_with(change)
        try:
            trial_score = score(trial, scout, host_updates)
        except SwpError:  # (a pack too large for the cap)
            continue
        if trial_score < best:
            best, best_req, current = trial_score, trial, change
    return best_req


def _changed(members: tuple[int, ...], nbytes: Sequence[int], dtypes: Sequence[str],
             rng: random.Random) -> tuple[int, ...] | None:
    """``members`` with one bucket changed by a move drawn from ``rng`` (None: that move does not apply)."""
    buckets: dict[int, list[int]] = {}
    for i, b in enumerate(members):
        buckets.setdefault(b, []).append(i)
    closing = sorted(buckets, key=lambda b: buckets[b][-1])
    b = rng.choice(closing)
    later = [c for c in closing[closing.index(b) + 1:] if dtypes[buckets[c][0]] == dtypes[buckets[b][0]]]
    nxt = later[0] if later else None
    labels = list(members)
    move = rng.choice(MOVES)
    if move == "split":
        if len(buckets[b]) < 2:
            return None
        half, held = sum(nbytes[i] for i in buckets[b]) / 2, 0
        for k, i in enumerate(buckets[b][:-1]):
            held += nbytes[i]
            if held >= half or k == len(buckets[b]) - 2:
                for j in buckets[b][k + 1:]:
                    labels[j] = len(buckets)
                break
    elif nxt is None:
        return None
    elif move == "merge":
        for j in buckets[nxt]:
            labels[j] = b
    elif move == "give":  # b's last gradient closes the next bucket instead
        if len(buckets[b]) < 2:
            return None
        labels[buckets[b][-1]] = nxt
    else:  # "take": the next bucket's first gradient joins b
        if len(buckets[nxt]) < 2:
            return None
        labels[buckets[nxt][0]] = b
    return canonical(labels)
