"""The three-stream simulator: how long one iteration of a plan takes, and what it looks like.

Compute, host-to-device and device-to-host are three FIFO streams. Each
instruction starts when its stream is free and what it waits for is done:
an op waits for its inputs to be on the device and for the regions of its
outputs to fall free; a swap-in for op ``after``, its host copy and its
region; a swap-out for op ``after`` and the tensor itself; a free releases
its region when op ``after`` and any swap-out of the tensor are done. A
region falls free when the latest free of every byte in it has happened.
Ops a plan runs on the host (``host``) take a fourth FIFO lane, the host's,
for their ``host_ms``, once the copies to the host they read are done; the
all-reduces of data-parallel ranks a fifth, the network's (``NET_OPS``). Every all-reduce, on either lane,
holds the one network link: it starts once the all-reduces before it in plan order are done.
One pass, in plan order, driving the plan's replay (``replay.py``) for what
each instruction waits for.
"""

from __future__ import annotations

import attrs

from swapdsl.devices.costs import copy_ms
from swapdsl.plan.program import NET_OPS, Free, HostRun, Plan, Region, Run
from swapdsl.plan.replay import walk

STREAMS = ("compute", "h2d", "d2h", "host", "net")


@attrs.frozen
class Result:
    iteration_ms: float
    compute_ms: float  # the ideal step: the op times of the longer of the compute stream and the network lane
    h2d_bytes: int
    d2h_bytes: int
    peak_device_bytes: int  # most tensor bytes on the device at once (in-flight copies included)
    host_bytes: int  # bytes of every tensor with a host copy during the iteration
    timeline: tuple[tuple[str, str, float, float], ...] = ()  # (stream, what, start ms, end ms)
    memory: tuple[tuple[float, int], ...] = ()  # (ms, device bytes from then on)

    @property
    def swap_bytes(self) -> int:
        return self.h2d_bytes + self.d2h_bytes


def simulate(plan: Plan, timeline: bool = False) -> Result:
    tensors = plan.tensor_map()
    dev = plan.device
    end: dict[int, float] = {}  # program index -> when that instruction is done
    clock = {s: 0.0 for s in STREAMS}
    events: list[tuple[float, int]] = [(0.0, t.bytes) for t in plan.tensors if isinstance(t.home, Region)]
    spans: list[tuple[str, str, float, float]] = []
    moved = {"h2d": 0, "d2h": 0}
    link = 0.0  # when the network link is free
    for step in walk(plan):
        instr = step.instr
        after = max([end[w] for w in step.waits]) if step.waits else 0.0
        if isinstance(instr, Free):
            events.append((after, -tensors[instr.tensor].bytes))
            continue
        stream = step.stream
        start = max(clock[stream], after)
        op = plan.ops[instr.op] if isinstance(instr, (Run, HostRun)) else None
        if isinstance(instr, Run):
            took, what = op.ms, ("recompute " if instr.recompute else "") + op.op
        elif isinstance(instr, HostRun):
            took, what = op.host_ms or 0.0, op.op
        else:
            nbytes = tensors[instr.tensor].bytes
            took, what = copy_ms(dev, nbytes, to_device=stream == "h2d"), instr.tensor
            moved[stream] += nbytes
        if op is not None and op.op in NET_OPS:
            start = max(start, link)
            link = start + took
        if isinstance(instr, Run):  # (its outputs take their bytes as it starts)
            first = op.outputs[0] if instr.in_place else None
            events += [(start, tensors[name].bytes) for name, _ in instr.outs if name != first]
        elif stream == "h2d":
            events.append((start, tensors[instr.tensor].bytes))
        clock[stream] = end[step.index] = start + took
        if timeline:
            spans.append((stream, what, start, start + took))
    memory = _memory_curve(events)
    return Result(max(clock.values()), plan.ideal_ms(), moved["h2d"], moved["d2h"],
                  max((b for _, b in memory), default=0), sum(tensors[n].bytes for n in plan.host_copies()),
                  tuple(spans) if timeline else (), memory if timeline else ())


def _memory_curve(events: list[tuple[float, int]]) -> tuple[tuple[float, int], ...]:
    """Device bytes over time; at equal times frees come before allocations (memory changes hands)."""
    curve: list[tuple[float, int]] = []
    level = 0
    for when, delta in sorted(events, key=lambda e: (e[0], e[1])):
        level += delta
        if curve and curve[-1][0] == when:
            curve[-1] = (when, level)
        else:
            curve.append((when, level))
    return tuple(curve)
