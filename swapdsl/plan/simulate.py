"""The three-stream simulator: how long one iteration of a plan takes, and what it looks like.

Compute, host-to-device and device-to-host are three FIFO streams. Each
instruction starts when its stream is free and what it waits for is done:
an op waits for its inputs to be on the device and for the regions of its
outputs to fall free; a swap-in for op ``after``, its host copy and its
region; a swap-out for op ``after`` and the tensor itself; a free releases
its region when op ``after`` and any swap-out of the tensor are done. A
region falls free when the latest free of every byte in it has happened.
One pass, in plan order.
"""

from __future__ import annotations

import attrs

from swapdsl.devices.costs import copy_ms
from swapdsl.plan.program import Free, HOST, Plan, Region, Run, SwapIn, SwapOut
from swapdsl.plan.segments import Segments

STREAMS = ("compute", "h2d", "d2h")


@attrs.frozen
class Result:
    iteration_ms: float
    compute_ms: float  # sum of op times
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
    ops = {o.index: o for o in plan.ops}
    dev = plan.device
    op_end: dict[int, float] = {-1: 0.0}
    freed: Segments[float] = Segments()  # per byte, when it last fell free
    ready: dict[str, float] = {}  # on the device and complete
    host_ready: dict[str, float] = {t.name: 0.0 for t in plan.tensors if t.home == HOST or t.kind == "input"}
    copied_out: dict[str, float] = {}
    where: dict[str, Region] = {}
    clock = {s: 0.0 for s in STREAMS}
    events: list[tuple[float, int]] = []
    spans: list[tuple[str, str, float, float]] = []
    h2d = d2h = 0
    for t in plan.tensors:
        if isinstance(t.home, Region):
            where[t.name], ready[t.name] = t.home, 0.0
            events.append((0.0, t.bytes))
    for instr in plan.program:
        if isinstance(instr, Run):
            op = ops[instr.op]
            start = max([clock["compute"]] + [ready[n] for n in op.inputs]
                        + [_free_at(freed, r) for _, r in instr.outs])
            end = start + op.ms
            clock["compute"] = op_end[op.index] = end
            for name, region in instr.outs:
                if instr.in_place and name == op.outputs[0]:
                    where.pop(op.inputs[0], None)
                else:
                    events.append((start, tensors[name].bytes))
                where[name], ready[name] = region, end
            if timeline:
                spans.append(("compute", op.op, start, end))
        elif isinstance(instr, SwapIn):
            nbytes = tensors[instr.tensor].bytes
            start = max(clock["h2d"], op_end[instr.after], _free_at(freed, instr.region), host_ready[instr.tensor])
            end = start + copy_ms(dev, nbytes, to_device=True)
            clock["h2d"] = ready[instr.tensor] = end
            where[instr.tensor] = instr.region
            events.append((start, nbytes))
            h2d += nbytes
            if timeline:
                spans.append(("h2d", instr.tensor, start, end))
        elif isinstance(instr, SwapOut):
            nbytes = tensors[instr.tensor].bytes
            start = max(clock["d2h"], op_end[instr.after], ready[instr.tensor])
            end = start + copy_ms(dev, nbytes, to_device=False)
            clock["d2h"] = host_ready[instr.tensor] = copied_out[instr.tensor] = end
            d2h += nbytes
            if timeline:
                spans.append(("d2h", instr.tensor, start, end))
        else:
            assert isinstance(instr, Free)
            when = max(op_end[instr.after], copied_out.pop(instr.tensor, 0.0), ready.get(instr.tensor, 0.0))
            gone = where.pop(instr.tensor)
            freed.assign(gone.offset, gone.end, when)
            events.append((when, -tensors[instr.tensor].bytes))
    memory = _memory_curve(events)
    return Result(max(clock.values()), sum(o.ms for o in plan.ops), h2d, d2h,
                  max((b for _, b in memory), default=0),
                  sum(tensors[n].bytes for n in host_ready), tuple(spans) if timeline else (),
                  memory if timeline else ())


def _free_at(freed: Segments[float], region: Region) -> float:
    return max(freed.over(region.offset, region.end), default=0.0)


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
