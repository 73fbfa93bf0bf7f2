"""Lower bounds on any plan's iteration time under a memory cap.

``ideal_ms`` is the sum of op times: every op runs on the one compute stream,
so no plan is faster, with any amount of memory.

``bound_ms`` adds what the bus must carry. Let C be the ops that read the
gradient seed (the `fill` that starts the backward pass), A the ops that are
ancestors of every op in C, and D the descendants of the seed. In any valid
order every op of A runs before any op of D: let T be the moment the first
op of D starts. Let S be the tensors that exist at T and are read by an op of
D: those made by an op of A, plus persistent tensors and inputs read by D;
S_a the part made by A. At T at most `cap` bytes are on the device (tensors
in flight count: their bytes are taken), so

- at least |S_a| - cap bytes of S_a are on the host, which they reached by
  device-to-host copies finished before T;
- at least |S| - cap bytes of S are on the host, and every one of them is
  read after T, so host-to-device copies after T carry at least that much.

Persistent tensors start where they end, and at most `cap` bytes of them
start on the device, so of those read by A at least P_A - cap come in before
T, and of those updated (by ops of D) at least P_upd - cap are written back
after T. Copies in one direction share one stream, so with every excess
floored at zero:

    T       >= max(F, (|S_a| - cap) / d2h, (P_A - cap) / h2d)
    end - T >= max(B, (|S| - cap) / h2d, (P_upd - cap) / d2h)

and the bound is the larger of ideal and their sum. Each excess also pays one
copy latency per tensor for the fewest tensors that add up to it (a copy
moves one whole tensor). Whole-iteration traffic gives two more terms, kept
for graphs where they are larger: (|S_a| - cap + P_read - cap) / h2d and
(|S_a| - cap + P_upd - cap) / d2h.
"""

from __future__ import annotations

from swapdsl.devices.profiles import Device
from swapdsl.plan import program
from swapdsl.planning.problem import Problem, edges


def ideal_ms(p: Problem) -> float:
    return program.ideal_ms(p.op_ms)


def _closure(start: set[int], links: list[list[int]]) -> set[int]:
    seen, todo = set(start), list(start)
    while todo:
        for nxt in links[todo.pop()]:
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def bound_ms(p: Problem, cap: int) -> float:
    e = edges(p)
    producer, consumers, preds, succs = e.producer, e.readers, e.preds, e.succs
    seeds = [op for op in range(p.n_ops) if not p.op_inputs[op] and p.kinds[p.op_outputs[op][0]] == "gradient"]
    ideal = ideal_ms(p)
    if not seeds:
        return ideal
    first = {c for s in seeds for c in succs[s]}
    backward = _closure(set(seeds), succs)
    before = set.intersection(*(_closure({c}, preds) - {c} for c in first)) if first else set()
    before -= backward
    made_before = {t for op in before for t in p.op_outputs[op]}
    read_after = {t for op in backward for t in p.op_inputs[op]}
    crossing = [p.nbytes[t] for t in made_before & read_after]
    standing = [p.nbytes[t] for t in read_after - producer.keys()]  # persistent tensors and inputs
    read_before = {t for op in before for t in p.op_inputs[op]}
    fwd_read = [p.nbytes[t] for t in p.persistent if t in read_before]
    updated = [p.nbytes[old] for old, _ in p.updates]
    read = sum(p.nbytes[t] for t in p.persistent if t in consumers)
    dev = p.device
    f = sum(p.op_ms[op] for op in before)
    b = sum(p.op_ms[op] for op in backward)
    excess = max(0, sum(crossing) - cap)
    until_t = max(f, _copies_ms(crossing, cap, dev.d2h_bw, dev), _copies_ms(fwd_read, cap, dev.h2d_bw, dev))
    after_t = max(b, _copies_ms(crossing + standing, cap, dev.h2d_bw, dev), _copies_ms(updated, cap, dev.d2h_bw, dev))
    return max(ideal, until_t + after_t,
               1e3 * (excess + max(0, read - cap)) / dev.h2d_bw,
               1e3 * (excess + max(0, sum(updated) - cap)) / dev.d2h_bw)


def _copies_ms(sizes: list[int], cap: int, bw: float, dev: Device) -> float:
    """The least time one link needs to move all but ``cap`` bytes of these tensors, a whole tensor
    per copy: the bytes, plus a latency for each of the fewest tensors that add up to them."""
    excess = sum(sizes) - cap
    if excess <= 0:
        return 0.0
    copies, moved = 0, 0
    for size in sorted(sizes, reverse=True):
        if moved >= excess:
            break
        copies, moved = copies + 1, moved + size
    return 1e3 * (excess / bw + copies * dev.copy_latency_s)
