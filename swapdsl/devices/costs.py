"""How long an op or a copy takes on a device: roofline plus fixed costs, or measured."""

from __future__ import annotations

from swapdsl.common.memo import by_identity
from swapdsl.devices.profiles import Device
from swapdsl.graph import ops
from swapdsl.graph.ir import Graph, Op
from swapdsl.graph.ops.collective import ring_seconds
from swapdsl.graph.printer import format_attr


def op_key(g: Graph, op: Op) -> str:
    """Identifies an op's work independently of tensor names: op, attrs, input types."""
    attrs = ",".join(f"{k}={format_attr(v)}" for k, v in op.attrs)
    return f"{op.op}[{attrs}]({','.join(str(g.type_of(n)) for n in op.inputs)})"


COLLECTIVES = {"allreduce_mean": ring_seconds}  # ops whose time is the network's, not the device's


def op_seconds(dev: Device, g: Graph, op: Op, measured: dict[str, float] | None = None) -> float:
    """Measured kernel time plus launch overhead if the profile has the op, else the roofline estimate."""
    ins = tuple(g.type_of(n) for n in op.inputs)
    if op.op in COLLECTIVES:  # the network's time, whatever a profile measured on one process
        return dev.launch_s + COLLECTIVES[op.op](ins, op.attr_dict)
    if measured:
        key = op_key(g, op)
        if key in measured:
            return dev.launch_s + measured[key]
    d = ops.REGISTRY[op.op]
    out = g.type_of(op.outputs[0])
    flops = d.flops(ins, out, op.attr_dict)
    moved = d.bytes_read(ins, out, op.attr_dict) + d.bytes_written(ins, out, op.attr_dict)
    compute = flops / (dev.peak_flops(out.dtype.label) * dev.compute_efficiency)
    memory = moved / (dev.mem_bw * dev.memory_efficiency)
    return dev.launch_s + max(compute, memory)


HOST_CALL_S = 5e-6  # the host lane's fixed cost per op (a Python call into NumPy)


def host_op_ms(dev: Device, g: Graph, op: Op) -> float:
    """An op's time on the host lane: the bytes it reads and writes at the host's bandwidth; a collective's,
    the network's (MPI from host memory)."""
    d = ops.REGISTRY[op.op]
    ins = tuple(g.type_of(n) for n in op.inputs)
    if op.op in COLLECTIVES:
        return 1e3 * (HOST_CALL_S + COLLECTIVES[op.op](ins, op.attr_dict))
    out = g.type_of(op.outputs[0])
    moved = d.bytes_read(ins, out, op.attr_dict) + d.bytes_written(ins, out, op.attr_dict)
    return 1e3 * (HOST_CALL_S + moved / dev.host_bw)


def op_times_ms(dev: Device, g: Graph) -> list[float]:
    return list(_op_times_ms(g, dev))


@by_identity()
def _op_times_ms(g: Graph, dev: Device) -> tuple[float, ...]:
    measured = dict(dev.op_times)
    return tuple(1e3 * op_seconds(dev, g, op, measured) for op in g.ops)


def copy_ms(dev: Device, nbytes: int, to_device: bool) -> float:
    bw = dev.h2d_bw if to_device else dev.d2h_bw
    return 1e3 * (dev.copy_latency_s + nbytes / bw)


def unmeasured_ops(dev: Device, g: Graph) -> tuple[int, int]:
    """(distinct ops of ``g`` a measured profile has no time for, distinct ops in all), collectives aside:
    an op a profile did not measure is estimated from the profile's peak figures."""
    keys = {op_key(g, op) for op in g.ops if op.op not in COLLECTIVES}
    measured = dict(dev.op_times)
    return sum(k not in measured for k in keys), len(keys)
