"""Measuring this machine: per-op kernel times and copy bandwidths, as a device profile.

`swapdsl profile` writes what it measures into a profile that `optimize
--device PROFILE.json` reads, so the simulator predicts this backend: op
times are looked up by the op's signature (devices.costs.op_key), copies use the
measured bandwidths.
"""

from __future__ import annotations

import statistics
import threading
import time
from types import ModuleType
from typing import Any

import attrs
import numpy as np

from swapdsl.devices.costs import op_key
from swapdsl.devices.profiles import Device
from swapdsl.graph.analysis import op_scratch
from swapdsl.graph.ir import Graph
from swapdsl.graph.ops import KernelContext, REGISTRY
from swapdsl.graph.ops.registry import np_dtype
from swapdsl.runtime.backend import synchronize
from swapdsl.runtime.data import init_persistent, synthetic_inputs
from swapdsl.runtime.reference import last_uses
from swapdsl.runtime.streams import CudaItem, Item, ThreadLanes, cuda_streams, issue_cuda
from swapdsl.runtime.vendor import VendorKernels


def _timed(xp: ModuleType, fn: Any, repeat: int) -> float:
    """Median seconds of ``fn`` over ``repeat`` runs, after one warm-up: device time between CUDA events
    on CuPy (what the op costs the stream, not the host's time to launch it), wall time on NumPy."""
    fn()
    times = []
    for _ in range(repeat):
        synchronize(xp)
        if xp is np:
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
            continue
        start, end = xp.cuda.Event(), xp.cuda.Event()
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(xp.cuda.get_elapsed_time(start, end) / 1e3)
    return statistics.median(times)


def op_times(g: Graph, xp: ModuleType, repeat: int, seed: int = 0) -> dict[str, float]:
    """Each distinct op signature of the training graph, timed on real inputs, as the interpreter runs it:
    into a preallocated output, with the op's own scratch, through cuDNN where the interpreter would."""
    env = {**init_persistent(g, seed, xp), **synthetic_inputs(g, seed, xp)}
    last = last_uses(g)
    persistent = set(g.persistent)
    measured: dict[str, float] = {}
    vendor = VendorKernels.load(g, lambda: xp.cuda.get_current_stream().ptr) if xp is not np else VendorKernels()
    for i, op in enumerate(g.ops):
        kernel, attrs_ = vendor.kernels.get(i) or REGISTRY[op.op].kernel, op.attr_dict
        ins = [env[n] for n in op.inputs]
        t = g.type_of(op.outputs[0])
        out = xp.empty(t.shape, dtype=np_dtype(xp, t.dtype))
        ctx = KernelContext.standalone(xp, op_scratch(g, i))

        def run() -> None:
            ctx.scratch.reset()
            kernel(ctx, ins, out, attrs_)

        run()
        key = op_key(g, op)
        if key not in measured:
            measured[key] = _timed(xp, run, repeat)
        env[op.outputs[0]] = out
        for n in op.inputs:
            if last.get(n) == i and n not in persistent:
                env.pop(n, None)
    return measured


def copy_bandwidths(xp: ModuleType, backend: str, nbytes: int, repeat: int) -> tuple[float, float, float]:
    """(host->device, device->host, device memory) bytes per second for ``nbytes`` copies."""
    device_a = xp.ones(nbytes, dtype=np.uint8)
    device_b = xp.empty(nbytes, dtype=np.uint8)
    if backend == "cupy":
        import cupyx

        host = cupyx.empty_pinned(nbytes, dtype=np.uint8)
        h2d = _timed(xp, lambda: device_b.set(host), repeat)
        d2h = _timed(xp, lambda: device_a.get(out=host), repeat)
    else:
        host = np.ones(nbytes, dtype=np.uint8)
        h2d = _timed(xp, lambda: np.copyto(device_b, host), repeat)
        d2h = _timed(xp, lambda: np.copyto(host, device_a), repeat)
    dev = _timed(xp, lambda: xp.copyto(device_b, device_a), repeat)
    # a device copy reads and writes every byte
    return nbytes / h2d, nbytes / d2h, 2 * nbytes / dev


def launch_seconds(backend: str, ops: int = 2000) -> float:
    """Per-instruction overhead of the interpreter's dispatch: a prepared lane of trivial items, each firing
    its event, as a step runs them."""
    if backend == "cupy":
        import cupy

        compute = cuda_streams()["compute"]
        items = [CudaItem(compute, (), _nothing, cupy.cuda.Event(disable_timing=True)) for _ in range(ops)]
        issue_cuda(items)
        compute.synchronize()
        t0 = time.perf_counter()
        issue_cuda(items)
        compute.synchronize()
        return (time.perf_counter() - t0) / ops
    lanes = ThreadLanes()
    try:
        events = [threading.Lock() for _ in range(ops)]
        step = ({"compute": [Item((), _nothing, e) for e in events]}, events)
        lanes.run(*step)
        t0 = time.perf_counter()
        lanes.run(*step)
        return (time.perf_counter() - t0) / ops
    finally:
        lanes.close()


def _nothing() -> None:
    return None


def profile(g: Graph, xp: ModuleType, backend: str, base: Device, repeat: int = 5,
            copy_bytes: int = 64 * 2**20) -> Device:
    h2d, d2h, mem = copy_bandwidths(xp, backend, copy_bytes, repeat)
    return attrs.evolve(
        base, name=f"measured-{backend}", mem_bw=mem, h2d_bw=h2d, d2h_bw=d2h, launch_s=launch_seconds(backend),
        copy_latency_s=launch_seconds(backend), compute_efficiency=1.0, memory_efficiency=1.0,
        source=f"measured by swapdsl profile on {backend} ({len(g.ops)} ops of {g.name})",
        op_times=tuple(sorted(op_times(g, xp, repeat).items())))
