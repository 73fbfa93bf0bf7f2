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
from collections.abc import Callable
from types import ModuleType
from typing import Any, NamedTuple

import attrs
import numpy as np

from swapdsl.devices.costs import COLLECTIVES, op_key
from swapdsl.devices.profiles import Device
from swapdsl.graph.analysis import op_scratch
from swapdsl.graph.ir import DType, Graph, TensorType
from swapdsl.graph.ops import REGISTRY, KernelContext
from swapdsl.graph.ops.blas import workspace_bytes
from swapdsl.graph.ops.kernels import kernel_of, scratch_need
from swapdsl.graph.ops.registry import np_dtype
from swapdsl.runtime.backend import copy_fn, pinned, synchronize
from swapdsl.runtime.data import init_persistent, synthetic_inputs
from swapdsl.runtime.reference import last_uses
from swapdsl.runtime.streams import CudaItem, Item, ThreadLanes, cuda_streams, issue_cuda
from swapdsl.runtime.fused import FusedKernels
from swapdsl.runtime.hostsplit import HostKernels, host_threads
from swapdsl.runtime.vendor import VendorKernels


def _timed(xp: ModuleType, fn: Any, repeat: int, capture: bool = False) -> float:
    """Median seconds of ``fn`` over ``repeat`` runs, after one warm-up: device time between CUDA events
    on CuPy, and with ``capture`` of ``fn`` captured as a CUDA graph where it can be (as a captured step
    runs an op: one of many small kernels timed eagerly waits on the host's launches, some 10 us each,
    between them); wall time on NumPy."""
    fn()
    if capture and xp is not np:
        synchronize(xp)
        captured = _timed_captured(xp, fn, repeat)
        if captured is not None:
            return captured
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


def _timed_captured(xp: ModuleType, fn: Any, repeat: int) -> float | None:
    """Median seconds of a replay of ``fn`` captured as one CUDA graph; None if it cannot be captured."""
    stream = xp.cuda.Stream(non_blocking=True)
    with stream:
        try:
            stream.begin_capture()
            try:
                fn()
            finally:
                graph = stream.end_capture()
        except Exception:  # an op that refuses capture is timed eagerly
            return None
        graph.launch(stream)
        times = []
        for _ in range(repeat):
            start, end = xp.cuda.Event(), xp.cuda.Event()
            start.record(stream)
            graph.launch(stream)
            end.record(stream)
            end.synchronize()
            times.append(xp.cuda.get_elapsed_time(start, end) / 1e3)
    return statistics.median(times)


def op_times(g: Graph, xp: ModuleType, repeat: int, seed: int = 0,
             notes: list[str] | None = None) -> dict[str, float]:
    """Each distinct op signature of the training graph, timed on real inputs, as the interpreter runs it:
    into a preallocated output, with the op's own scratch, through cuDNN and fused kernels where the
    interpreter would (``notes`` gets what fell back to the op's own kernel, and why)."""
    env = {**init_persistent(g, seed, xp), **synthetic_inputs(g, seed, xp)}
    last = last_uses(g)
    persistent = set(g.persistent)
    measured: dict[str, float] = {}
    vendor = VendorKernels.load(g, lambda: xp.cuda.get_current_stream().ptr) if xp is not np else VendorKernels()
    fused = FusedKernels.load(g, xp) if xp is not np else FusedKernels()
    if notes is not None:
        notes.extend(vendor.notes + fused.notes)
    # (as a runner's: left to itself, cuBLAS takes a workspace for each graph an op is captured into)
    workspace = xp.empty(workspace_bytes(xp), dtype=np.uint8) if xp is not np else None
    for i, op in enumerate(g.ops):
        t = g.type_of(op.outputs[0])
        if op.op in COLLECTIVES:  # timed by the network's model (devices/costs.py), not on one process
            env[op.outputs[0]] = env[op.inputs[0]]
            continue
        kernel = (vendor.kernels.get(i) or fused.kernels.get(i)
                  or kernel_of(op.op, tuple(map(g.type_of, op.inputs)), t, op.attr_dict))
        attrs_ = op.attr_dict
        ins = [env[n] for n in op.inputs]
        out = xp.empty(t.shape, dtype=np_dtype(xp, t.dtype))
        ctx = attrs.evolve(KernelContext.standalone(xp, op_scratch(g, i)), workspace=workspace)

        def run() -> None:
            ctx.scratch.reset()
            kernel(ctx, ins, out, attrs_)

        run()
        key = op_key(g, op)
        if key not in measured:
            measured[key] = _timed(xp, run, repeat, capture=True)
        env[op.outputs[0]] = out
        for n in op.inputs:
            if last.get(n) == i and n not in persistent:
                env.pop(n, None)
    return measured


class Copies(NamedTuple):
    """What copies cost here: each direction's bandwidth with the other direction busy too (a swapping
    plan's two copy streams overlap), each alone, the fixed cost of one copy, and device memory's bandwidth."""

    h2d_bw: float
    d2h_bw: float
    h2d_alone_bw: float
    d2h_alone_bw: float
    latency_s: float
    mem_bw: float


def fit_line(sizes: list[int], seconds: list[float]) -> tuple[float, float]:
    """(fixed seconds, bytes per second) of the least-squares line seconds = fixed + size / bandwidth."""
    n = len(sizes)
    mx, my = sum(sizes) / n, sum(seconds) / n
    var = sum((x - mx) ** 2 for x in sizes)
    slope = sum((x - mx) * (y - my) for x, y in zip(sizes, seconds)) / var if var else my / max(mx, 1)
    slope = max(slope, 1e-15)
    return max(my - slope * mx, 0.0), 1.0 / slope


def copy_profile(xp: ModuleType, backend: str, sizes: tuple[int, ...], repeat: int) -> Copies:
    """Copies each way over ``sizes`` (a line fitted through them), then both ways at once at the largest."""
    largest = max(sizes)
    device = xp.ones(2 * largest, dtype=np.uint8)
    host = _host_buffer(backend, 2 * largest)
    h2d = {n: copy_fn(xp, device[:n], host[:n], True) for n in sizes}
    d2h = {n: copy_fn(xp, device[largest:largest + n], host[largest:largest + n], False) for n in sizes}
    lat_in, bw_in = fit_line(list(sizes), [_timed(xp, h2d[n], repeat) for n in sizes])
    lat_out, bw_out = fit_line(list(sizes), [_timed(xp, d2h[n], repeat) for n in sizes])
    both = _timed(xp, _together(xp, backend, h2d[largest], d2h[largest]), repeat)
    a, b = device[:largest], device[largest:]
    mem = 2 * largest / _timed(xp, lambda: xp.copyto(b, a), repeat)  # a device copy reads and writes every byte
    return Copies(min(bw_in, largest / both), min(bw_out, largest / both), bw_in, bw_out, (lat_in + lat_out) / 2, mem)


def _host_buffer(backend: str, nbytes: int) -> np.ndarray:
    if backend == "cupy":
        return pinned(nbytes, np.uint8, "the copies' host buffer")
    return np.ones(nbytes, dtype=np.uint8)


def _together(xp: ModuleType, backend: str, first: Callable[[], None],
              second: Callable[[], None]) -> Callable[[], None]:
    """Both copies at once: on two CUDA streams (the current one waiting for both), or two threads."""
    if backend == "cupy":
        streams = [xp.cuda.Stream(non_blocking=True) for _ in range(2)]

        def on_streams() -> None:
            current = xp.cuda.get_current_stream()
            start = xp.cuda.Event(disable_timing=True)
            start.record(current)
            for stream, fn in zip(streams, (first, second)):
                stream.wait_event(start)
                with stream:
                    fn()
                done = xp.cuda.Event(disable_timing=True)
                done.record(stream)
                current.wait_event(done)

        return on_streams

    def on_threads() -> None:
        other = threading.Thread(target=second)
        other.start()
        first()
        other.join()

    return on_threads


def launch_seconds(backend: str, ops: int = 2000) -> float:
    """Per-instruction overhead of the interpreter's dispatch, as a step runs: on NumPy a prepared lane of
    trivial items, each firing its event; on CuPy a CUDA graph of trivial kernels, each recording an
    event, replayed (what a captured step pays per instruction)."""
    if backend == "cupy":
        return _graph_node_seconds(ops)
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


def _graph_node_seconds(ops: int) -> float:
    import cupy

    compute = cuda_streams()["compute"]
    one = cupy.zeros(1, dtype=np.float32)
    items = [CudaItem(compute, (), lambda: cupy.add(one, 1, out=one), cupy.cuda.Event(disable_timing=True))
             for _ in range(ops)]
    issue_cuda(items)  # compile the kernel outside the capture
    compute.synchronize()
    compute.begin_capture()
    issue_cuda(items)
    graph = compute.end_capture()
    graph.launch(compute)
    compute.synchronize()
    start, end = cupy.cuda.Event(), cupy.cuda.Event()
    start.record(compute)
    graph.launch(compute)
    end.record(compute)
    end.synchronize()
    return cupy.cuda.get_elapsed_time(start, end) / 1e3 / ops


COPY_SIZES = (64 * 2**10, 2**20, 16 * 2**20, 64 * 2**20)
HOST_UPDATE_ELEMENTS = 4 * 2**20  # the arrays host_update_bw times Adam over (16 MiB each in f32)


def host_update_bw(repeat: int, elements: int = HOST_UPDATE_ELEMENTS, threads: int | None = None) -> float:
    """Bytes/s an Adam update sustains on this host, run as the host lane runs it (each op's kernel on NumPy
    arrays, split over ``threads``, default ``hostsplit.host_threads()``; the registry's bytes per op): what
    ``--host-updates`` plans price host ops by."""
    t = TensorType((elements,), DType.f32)
    rng = np.random.default_rng(0)
    p, g, m, v = (rng.standard_normal(elements).astype(np.float32) for _ in range(4))
    np.abs(v, out=v)  # (a second moment)
    chain = [("adam_m", [m, g, p], m, {"beta1": 0.9, "weight_decay": 0.0}),
             ("adam_v", [v, g, p], v, {"beta2": 0.999, "weight_decay": 0.0}),
             ("adam_apply", [p, m, v], p, {"lr": 1e-3, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8})]
    ctx = KernelContext.standalone(np, max(scratch_need(op, (t,) * len(ins), t, a) for op, ins, _, a in chain))
    moved = sum(REGISTRY[op].bytes_read((t,) * len(ins), t, a) + REGISTRY[op].bytes_written((t,) * len(ins), t, a)
                for op, ins, _, a in chain)
    kernels = HostKernels(threads or host_threads())
    try:
        work = [kernels.launcher(op, ins, out, a, (t,) * len(ins), t, ctx) for op, ins, out, a in chain]

        def update() -> None:
            for w in work:
                w()

        return moved / _timed(np, update, repeat)
    finally:
        kernels.close()


def op_kind_totals(g: Graph, times: dict[str, float]) -> list[tuple[str, int, float]]:
    """(op name, ops, seconds) over one training step, costliest first: where a step's kernel time goes."""
    count: dict[str, int] = {}
    total: dict[str, float] = {}
    for op in g.ops:
        t = times.get(op_key(g, op))
        if t is not None:
            count[op.op] = count.get(op.op, 0) + 1
            total[op.op] = total.get(op.op, 0.0) + t
    return sorted(((name, count[name], total[name]) for name in total), key=lambda r: (-r[2], r[0]))


def profile(g: Graph, xp: ModuleType, backend: str, base: Device, repeat: int = 5,
            copy_sizes: tuple[int, ...] = COPY_SIZES, notes: list[str] | None = None) -> Device:
    c = copy_profile(xp, backend, copy_sizes, repeat)
    return attrs.evolve(
        base, name=f"measured-{backend}", mem_bw=c.mem_bw, h2d_bw=c.h2d_bw, d2h_bw=c.d2h_bw,
        launch_s=launch_seconds(backend), copy_latency_s=c.latency_s, compute_efficiency=1.0, memory_efficiency=1.0,
        host_bw=host_update_bw(repeat),
        source=f"measured by swapdsl profile on {backend} ({len(g.ops)} ops of {g.name})",
        op_times=tuple(sorted(op_times(g, xp, repeat, notes=notes).items())))
