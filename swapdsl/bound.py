"""Lower bounds on any plan's iteration time under a memory cap.

``ideal_ms`` is the sum of op times: every op runs on the one compute stream,
so no plan is faster, with any amount of memory.

``bound_ms`` adds what the bus must carry. Let C be the ops that read the
gradient seed (the `fill` that starts the backward pass), A the ops that are
ancestors of every op in C, and D the descendants of the seed. In any valid
order every op of A runs before any op of D: let T be the moment the first
op of D starts. Every tensor made by an op of A and read by an op of D exists
at T; say they add up to L bytes. At most `cap` bytes fit on the device, so at
T at least E = L - cap of them are on the host, which they reached by
device-to-host copies finished before T, and from which they must return by
host-to-device copies after T (each is read by an op of D). So

    T >= max(time(A), E / d2h_bandwidth)
    end - T >= max(time(D), E / h2d_bandwidth)

and also, counting whole-iteration traffic: persistent tensors (params and
optimiser state) of P bytes cannot all be on the device at the start if
P > cap, so at least P - cap of them start on the host; those read during the
step must come in, and those updated must go back out. Copies in one
direction share one stream, so

    bound = max(ideal, max(F, E/d2h) + max(B, E/h2d),
                (E + P_read - cap) / h2d, (E + P_upd - cap) / d2h)

with every excess term floored at zero. Copy latencies are left out, so the
bound stays below what the simulator can reach.
"""

from __future__ import annotations

from swapdsl.problem import Problem


def ideal_ms(p: Problem) -> float:
    return sum(p.op_ms)


def _closure(start: set[int], edges: dict[int, list[int]]) -> set[int]:
    seen, todo = set(start), list(start)
    while todo:
        for nxt in edges.get(todo.pop(), ()):
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def bound_ms(p: Problem, cap: int) -> float:
    producer = {t: op for op in range(p.n_ops) for t in p.op_outputs[op]}
    consumers: dict[int, list[int]] = {}
    preds: dict[int, list[int]] = {}
    for op in range(p.n_ops):
        for t in p.op_inputs[op]:
            consumers.setdefault(t, []).append(op)
            if t in producer:
                preds.setdefault(op, []).append(producer[t])
    succs: dict[int, list[int]] = {}
    for op, ps in preds.items():
        for q in ps:
            succs.setdefault(q, []).append(op)
    seeds = [op for op in range(p.n_ops) if not p.op_inputs[op] and p.kinds[p.op_outputs[op][0]] == "gradient"]
    ideal = ideal_ms(p)
    if not seeds:
        return ideal
    first = {c for s in seeds for c in succs.get(s, [])}
    backward = _closure(set(seeds), succs)
    before = set.intersection(*(_closure({c}, preds) - {c} for c in first)) if first else set()
    before -= backward
    live = sum(p.nbytes[t] for op in before for t in p.op_outputs[op]
               if any(c in backward for c in consumers.get(t, ())))
    excess = max(0, live - cap)
    dev = p.device
    to_host_ms = 1e3 * excess / dev.d2h_bw
    to_dev_ms = 1e3 * excess / dev.h2d_bw
    f = sum(p.op_ms[op] for op in before)
    b = sum(p.op_ms[op] for op in backward)
    read = sum(p.nbytes[t] for t in p.persistent if t in consumers)
    updated = sum(p.nbytes[old] for old, _ in p.updates)
    return max(ideal, max(f, to_host_ms) + max(b, to_dev_ms),
               1e3 * (excess + max(0, read - cap)) / dev.h2d_bw,
               1e3 * (excess + max(0, updated - cap)) / dev.d2h_bw)
