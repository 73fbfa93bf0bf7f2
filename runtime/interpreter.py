"""The plan interpreter: runs a training step exactly as a plan says.

One device arena of exactly the cap, tensors are views into it at the
plan's offsets, and the top of it the scratch region: the step counter,
then every kernel's temporaries (kernels write their results straight into
their outputs' regions, so a step allocates nothing); one host arena with a
slot for every tensor that ever has a host copy (pinned memory on CuPy);
the streams. When a plan is
loaded, its replay (swapdsl/plan/replay.py) turns the instruction list into
stream work with the waits between streams, views and kernel arguments
built once; a step enqueues that list in order on the calling thread:

- ``run``: the compute stream waits for the swap-ins of its inputs and for
  the regions of its outputs to fall free, then runs the kernel into them;
- ``swapin``: the host-to-device stream waits for op ``after``, for its region
  to fall free and for the tensor's host copy, then copies;
- ``swapout``: the device-to-host stream waits for op ``after`` (and the
  tensor's swap-in, if that is how it came), then copies;
- ``free``: no work; the region's next tenant waits for op ``after`` and any
  swap-out of the tensor;
- ``host``: the host lane (a fourth thread, on NumPy; on CuPy a stream of
  host functions, ``runtime/hostfn.py``) waits for the copies that wrote the
  op's inputs to the host, and for the swap-ins reading host memory it writes
  over, then runs the kernel on host memory, with scratch and a step counter
  of its own (an all-reduce of host copies: MPI, on a communicator of its own);
- a ``run`` of an all-reduce (data-parallel ranks) goes on the network lane (a
  fifth thread; on CuPy a stream of its own, NCCL's, ``runtime/nccl.py``), so
  that it overlaps the compute stream; the same waits.

Nothing else synchronises, so a plan that breaks its promises corrupts
numbers instead of quietly using more memory.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Collection, Iterable, Mapping
from types import ModuleType
from typing import Any, NamedTuple

import attrs
import numpy as np

from swapdsl.graph.ir import Graph, TensorType
from swapdsl.graph.ops import KernelContext
from swapdsl.graph.analysis import STATE_BYTES
from swapdsl.graph.ops.halfbits import is_bits
from swapdsl.graph.ops.kernels import kernel_of, scratch_need
from swapdsl.graph.ops.registry import Scratch, np_dtype
from swapdsl.plan.program import NET_OPS, HostRun, InstrKind, Plan, Region, Run, SwapIn, SwapOut, arena_bytes
from swapdsl.plan.replay import START, Replay, Step
from swapdsl.plan.validate import check_describes, validate
from swapdsl.runtime.backend import DeviceMemory, copy_fn, device_memory, pinned, to_host
from swapdsl.runtime.data import init_persistent, synthetic_inputs
from swapdsl.runtime.dist import comm_for, lane_timeout_s
from swapdsl.runtime import hostfn, hostsplit
from swapdsl.runtime.fused import FusedKernels
from swapdsl.runtime.hostfn import HostFuncs
from swapdsl.runtime.hostsplit import HostKernels
from swapdsl.runtime.nccl import gpu_comm
from swapdsl.runtime.streams import STREAMS, CudaItem, Item, ThreadLanes, cuda_streams, issue_cuda
from swapdsl.runtime.vendor import VendorKernels

FORKED = ("h2d", "d2h", "net", "host")  # the streams a captured step forks from the compute stream and joins
START_INPUTS = START - 1  # the pseudo-instruction of the step's batch copies (START: its step counter)


class Work(NamedTuple):
    """One instruction as stream work."""

    stream: str
    waits: tuple[int, ...]  # the other streams' instructions (program indices) it waits for
    run: Callable[[], None]
    index: int  # its program index
    awaited: bool  # another stream waits for it: record an event


def capture_choice(backend: str, graph: bool, comm: Any, host_reduces: bool) -> tuple[bool, str]:
    """Whether a step is captured as a CUDA graph (after its first, eager, step), and a note saying why."""
    if backend != "cupy":
        return False, "no CUDA graph on NumPy"
    if not graph:
        return False, "off: each step issued item by item"
    if comm is not None and not comm.capturable:
        return False, "off: the all-reduces wait on the host (MPI through host memory)"
    if comm is not None and host_reduces:  # (NCCL, captured, launches host functions of its own)
        return False, ("off: an all-reduce of host copies holds the driver's host-function thread, which NCCL's "
                       "captured all-reduces need")
    return True, "captured at the second step"


class PlanRunner:
    def __init__(self, plan: Plan, g: Graph, backend: str, xp: ModuleType, seed: int,
                 check_plan: bool = True, copy_delay_s: float = 0.0, kernel_delay_s: float = 0.0,
                 graph: bool = True, vendor_kernels: bool = True, tf32: bool = False,
                 memory: DeviceMemory | None = None,
                 host_threads: int | None = None) -> None:
        """``check_plan``: validate the plan against ``g`` (False: the caller has, or a test runs a broken
        plan to show what validation prevents; it must still describe ``g``). ``copy_delay_s``,
        ``kernel_delay_s`` (NumPy, for tests): every copy or kernel starts that much later, so that a wait
        the plan lacks shows up as a wrong number rather than being hidden by luck. ``graph`` (CuPy):
        capture the step as one CUDA graph and replay it (falling back, with ``graph_note`` saying why,
        where capture fails); ``vendor_kernels`` (CuPy): convolutions through cuDNN Frontend and
        element-wise ops as fused kernels where they build (``vendor.notes``, ``fused.notes``: what fell
        back); ``tf32`` (CuPy): FP32 matrix products and convolutions may use TF32 tensor cores;
        ``memory``: another runner's device memory (an arena of the plan's cap, cuBLAS's workspace) to run in
        instead of new memory (evaluation runs in the training plan's), whose contents this runner
        overwrites; ``host_threads``: workers the host lane splits its element-wise kernels over
        (``hostsplit``; default ``hostsplit.host_threads()``)."""
        if check_plan:
            validate(plan, g)
        else:
            check_describes(plan, g)
        self.plan, self.g, self.backend, self.xp = plan, g, backend, xp
        hosted = any(isinstance(i, HostRun) for i in plan.program)
        threads = (host_threads or hostsplit.host_threads()) if hosted else 1  # (before anything is held)
        self.vendor_kernels = vendor_kernels
        self.copy_delay_s, self.kernel_delay_s = copy_delay_s, kernel_delay_s
        # (first: on CuPy it makes this rank's GPU current, before the arena is allocated on it)
        self.comm, self.comm_note = self._communicator()
        self.slots = self._host_slots()
        host_bytes = max((off + nbytes for off, nbytes in self.slots.values()), default=0)
        self.memory = memory or device_memory(xp, plan.cap, host_bytes,
                                               f"the plan's arena of {plan.cap} bytes and its host copies")
        self.arena = self.memory.arena  # the device arena: the cap
        self.host = self._host_arena(host_bytes)
        self.homes = {t.name: t.home for t in plan.tensors if t.home is not None}
        self.inputs = set(g.inputs)
        tf32 = tf32 and backend == "cupy"
        # (before anything is loaded: the convolutions' checks borrow the arena, then it is cleared)
        self.vendor = VendorKernels()
        if backend == "cupy" and vendor_kernels:
            self.vendor = VendorKernels.load(g, lambda: xp.cuda.get_current_stream().ptr, tf32=tf32, xp=xp,
                                             space=self.arena, blas_workspace=self.memory.blas_workspace)
            self.arena.fill(0)
        self.fused = FusedKernels.load(g, xp) if backend == "cupy" and vendor_kernels else FusedKernels()
        self._load_initial(seed)
        self.ctx = attrs.evolve(self._context(), tf32=tf32, workspace=self.memory.blas_workspace)
        # the network lane's own scratch: its kernels run beside compute's, and must not reset compute's
        net = self._scratch_for(i.op for i in plan.program if isinstance(i, Run) and g.ops[i.op].op in NET_OPS)
        self.net_ctx = attrs.evolve(self.ctx, scratch=Scratch(xp.zeros(max(net, 1), np.uint8)))
        self.host_ctx = self._host_context()
        self.host_kernels = HostKernels(threads)
        self.steps_run = 0
        self.host_ms = 0.0  # the last step's time to issue its work
        self.warmup_steps = 1  # the steps that did one-off work (kernels compiled; on CuPy, the graph captured)
        self.work = self._prepare()
        self._lanes: tuple[dict[str, list[Item]], list[threading.Lock]] | None = None  # NumPy, at the first step
        self._cuda: list[CudaItem] | None = None  # CuPy, at the first step
        # (the host lane has a communicator of its own only where it runs an all-reduce of host copies)
        self.graph_mode, self.graph_note = capture_choice(backend, graph, self.comm, self.host_ctx.comm is not None)
        self._graph: Any = None
        self._eager_steps = 0  # on CuPy: the capture waits for one eager step (kernels compiled, cuBLAS set up)
        if backend == "cupy":
            self.streams = cuda_streams()
            self.hostfns = HostFuncs(lambda: xp.cuda.get_current_stream().ptr) if hosted else None
        else:
            self.threads = ThreadLanes(lane_timeout_s(g))
            self.hostfns = None
        self._settle()  # (the step counter's zero and the lanes' scratch, written on the null stream)

    def _communicator(self) -> tuple[Any, str]:
        """The ranks' communicator for the step's all-reduces (None: one rank) and a note saying which: MPI
        on NumPy; on CuPy NCCL, or MPI through host memory where NCCL cannot run (``runtime/nccl.py``)."""
        comm = comm_for(self.g)
        if comm is None:
            return None, "one rank" if self.g.ranks == 1 else "no MPI world"
        if self.backend != "cupy":
            return comm, f"MPI over {comm.Get_size()} ranks"
        return gpu_comm(self.xp, comm)

    # -- memory

    def _host_slots(self) -> dict[str, tuple[int, int]]:
        """Host arena slots: inputs, host-homed persistent tensors, and everything ever swapped out.
        A persistent tensor's new value shares its slot, so a write-back lands where the next step reads."""
        sizes = {t.name: t.bytes for t in self.plan.tensors}
        owner = self.plan.host_slot_owner()
        slots: dict[str, tuple[int, int]] = {}
        offset = 0
        for name in (n for n in self.plan.host_copies() if owner[n] == n):
            slots[name] = (offset, sizes[name])
            offset += arena_bytes(sizes[name])
        for name, home in owner.items():
            if home != name:
                slots[name] = slots[home]
        return slots

    def _host_arena(self, nbytes: int) -> np.ndarray:
        if self.backend == "cupy":
            return pinned(max(nbytes, 1), np.uint8, "the plan's host copies")
        return np.zeros(max(nbytes, 1), dtype=np.uint8)

    def _context(self) -> KernelContext:
        """The kernels' context over the scratch region: the step counter (int64, on the device), then the
        temporaries."""
        base = self.plan.tensor_cap
        counter = self.arena[base:base + 8].view(np.int64).reshape(())
        counter.fill(0)
        return KernelContext(self.xp, Scratch(self.arena[base + STATE_BYTES:self.plan.cap]), counter, comm=self.comm)

    def _host_context(self) -> KernelContext:
        """The host lane's context: NumPy, scratch for its largest kernel, a step counter of its own."""
        runs = [i.op for i in self.plan.program if isinstance(i, HostRun)]
        need = self._scratch_for(runs)
        reduces = any(self.g.ops[i].op in NET_OPS for i in runs)  # (an all-reduce of host copies: data-parallel)
        return KernelContext(np, Scratch(np.zeros(max(need, 1), np.uint8)), np.zeros((), np.int64),
                             comm=comm_for(self.g, "host") if reduces else None)

    def _scratch_for(self, ops: Iterable[int]) -> int:
        """The most scratch one kernel among these ops needs (a lane's own scratch)."""
        g = self.g
        return max((scratch_need(g.ops[i].op, tuple(map(g.type_of, g.ops[i].inputs)), g.type_of(g.ops[i].outputs[0]),
                                 g.ops[i].attr_dict) for i in ops), default=0)

    def _type(self, name: str) -> TensorType:
        return self.g.type_of(name)

    def dview(self, name: str, region: Region) -> Any:
        t = self._type(name)
        off = region.offset
        return self.arena[off:off + t.nbytes].view(np_dtype(self.xp, t.dtype)).reshape(t.shape)

    def hview(self, name: str) -> np.ndarray:
        off, nbytes = self.slots[name]
        t = self._type(name)
        return self.host[off:off + nbytes].view(np_dtype(np, t.dtype)).reshape(t.shape)

    def _load_initial(self, seed: int) -> None:
        self._load({**init_persistent(self.g, seed, np), **synthetic_inputs(self.g, seed, np)})
        self._settle()

    def _settle(self) -> None:
        """Values written on the current stream, which the step's streams do not wait for, made to land."""
        if self.backend == "cupy":
            self.xp.cuda.runtime.deviceSynchronize()

    def _load(self, values: Mapping[str, np.ndarray]) -> None:
        """Values of persistent tensors or inputs, into their host slots and device homes."""
        for name, value in values.items():
            if name in self.slots:
                self.hview(name)[...] = value
            home = self.homes.get(name)
            if isinstance(home, Region) and name not in self.inputs:
                self._put(self.dview(name, home), value)

    # -- a training run's view (runtime/training.py): batches in, state in and out

    def set_batch(self, batch: Mapping[str, np.ndarray]) -> None:
        """The next step's inputs, into their host slots (the step's first copies take them from there)."""
        for name in self.g.inputs:
            np.copyto(self.hview(name), batch[name])

    def metrics(self) -> dict[str, float]:
        """The reports' values at the last step."""
        homes = {t: home for t in self.g.metrics.values() if isinstance(home := self.homes[t], Region)}
        return {name: self._read(tensor, homes) for name, tensor in self.g.metrics.items()}

    def state(self, names: Collection[str] | None = None) -> dict[str, np.ndarray]:
        return self.persistent_values(names)

    def load_state(self, values: Mapping[str, np.ndarray], step: int) -> None:
        """Continue from ``values`` (every persistent tensor, or some) as if ``step`` steps had run."""
        self._load({name: values[name] for name in self.g.persistent if name in values})
        self.ctx.step.fill(step)
        self.host_ctx.step.fill(step)
        self.steps_run = step
        self._settle()

    def _put(self, dst: Any, src: np.ndarray) -> None:
        if self.backend == "cupy":
            host = np.asarray(src, order="C")  # (ascontiguousarray makes a 0-d array 1-d)
            dst.set(host.view(dst.dtype) if is_bits(dst) else host)  # (bf16 as its bits: halfbits)
        else:
            dst[...] = src

    # -- copies, as stream work

    def _copy(self, name: str, region: Region, to_device: bool) -> Callable[[], None]:
        """The copy of ``name`` between its host slot and ``region``, as stream work (``backend.copy_fn``)."""
        copy = copy_fn(self.xp, self.dview(name, region), self.hview(name), to_device)
        if self.copy_delay_s:
            delay = self.copy_delay_s
            return lambda: (time.sleep(delay), copy())  # type: ignore[func-returns-value]
        return copy

    # -- one step

    def _prepare(self) -> list[Work]:
        """The program as stream work, built once. Frees are not stream work: their waits pass to the next
        tenant. Only instructions another stream waits for fire an event."""
        r = Replay(self.plan)
        steps = [s for s in r.steps() if s.kind is not InstrKind.FREE]
        self.final_loc = dict(r.loc)
        stream_of = {s.index: s.stream for s in steps}
        waits = {s.index: tuple(dict.fromkeys(w for w in s.waits if stream_of[w] != stream_of[s.index]))
                 for s in steps}
        awaited = {w for ws in waits.values() for w in ws}
        batch = [name for name, home in self.homes.items() if isinstance(home, Region) and name in self.inputs]
        # this step's batch, into its home regions (the last copy fires for them all), then the step counter
        start = [Work("h2d", (), self._copy(name, self.homes[name], True), START_INPUTS if k == len(batch) - 1
                      else START_INPUTS - 1 - k, k == len(batch) - 1) for k, name in enumerate(batch)]
        start.append(Work("compute", (START_INPUTS,) if batch else (), self._count_step, START, False))
        if any(s.kind is InstrKind.HOST for s in steps):
            start.append(Work("host", (), self._count_host_step, START, False))
        return start + [Work(stream_of[s.index], waits[s.index], self._work(s), s.index, s.index in awaited)
                        for s in steps]

    def _work(self, s: Step) -> Callable[[], None]:
        instr = s.instr
        if isinstance(instr, SwapIn):
            return self._copy(instr.tensor, instr.region, True)
        if isinstance(instr, SwapOut):
            return self._copy(instr.tensor, s.regions[0], False)
        if isinstance(instr, HostRun):
            return self._host_work(instr)
        assert isinstance(instr, Run)
        op = self.g.ops[instr.op]
        views: dict[tuple[str, Region], Any] = {}  # one object per tensor (`add(x, x)` in place over x)
        for n, region in zip(op.inputs, s.regions):
            if (n, region) not in views:
                views[n, region] = self.dview(n, region)
        ins = [views[n, region] for n, region in zip(op.inputs, s.regions)]
        region = dict(instr.outs)[op.outputs[0]]
        if instr.in_place and region == s.regions[0] and self._type(op.outputs[0]) == self._type(op.inputs[0]):
            out = ins[0]  # one object: CuPy copies (allocates) an input overlapping an output that is another
        else:
            out = self.dview(op.outputs[0], region)
        kernel = (self.vendor.kernels.get(instr.op) or self.fused.kernels.get(instr.op)
                  or kernel_of(op.op, tuple(map(self.g.type_of, op.inputs)), self.g.type_of(op.outputs[0]),
                               op.attr_dict))
        return self._launch(kernel, self.net_ctx if s.stream == "net" else self.ctx, ins, out, op.attr_dict)

    def _launch(self, kernel: Any, ctx: KernelContext, ins: list[Any], out: Any, attrs: Any) -> Callable[[], None]:
        """A kernel as stream work: its scratch reset, then the kernel (after ``kernel_delay_s``, in tests)."""
        reset = ctx.scratch.reset
        if self.kernel_delay_s:
            delay = self.kernel_delay_s

            def slow_launch() -> None:
                time.sleep(delay)
                reset()
                kernel(ctx, ins, out, attrs)

            return slow_launch

        def launch() -> None:
            reset()
            kernel(ctx, ins, out, attrs)

        return launch

    def _host_work(self, instr: HostRun) -> Callable[[], None]:
        op = self.g.ops[instr.op]
        ins = [self.hview(n) for n in op.inputs]
        out = self.hview(op.outputs[0])
        work = self.host_kernels.launcher(op.op, ins, out, op.attr_dict, tuple(map(self.g.type_of, op.inputs)),
                                          self.g.type_of(op.outputs[0]), self.host_ctx)
        if not self.kernel_delay_s:
            return work
        delay = self.kernel_delay_s

        def slow_work() -> None:
            time.sleep(delay)
            work()

        return slow_work

    def _count_step(self) -> None:
        self.xp.add(self.ctx.step, 1, out=self.ctx.step)

    def _count_host_step(self) -> None:
        np.add(self.host_ctx.step, 1, out=self.host_ctx.step)

    def _thread_lanes(self) -> tuple[dict[str, list[Item]], list[threading.Lock]]:
        """The work as a list of items per stream with their events (built at the first step, so a test may edit
        ``work`` before it)."""
        events = {w.index: threading.Lock() for w in self.work if w.awaited}
        lanes: dict[str, list[Item]] = {name: [] for name in STREAMS}
        for w in self.work:
            lanes[w.stream].append(Item(tuple(events[i] for i in w.waits), w.run, events.get(w.index)))
        return lanes, list(events.values())

    def _cuda_items(self) -> list[CudaItem]:
        events = {w.index: self.xp.cuda.Event(disable_timing=True) for w in self.work if w.awaited}
        return [CudaItem(self.streams[w.stream], tuple(events[i] for i in w.waits),
                         self.hostfns.enqueue(w.run) if w.stream == "host" and self.hostfns else w.run,
                         events.get(w.index))
                for w in self.work]

    def step(self, step: int) -> tuple[float, float]:
        """Run training step ``step`` (1, 2, ... in turn: the device counts them); return (loss, milliseconds)."""
        if step != self.steps_run + 1:
            raise ValueError(f"step {step} after step {self.steps_run}: a plan's steps run in order from 1")
        self.steps_run = step
        started = time.perf_counter()
        if self.backend == "cupy":
            self._step_cuda()
        else:
            self._lanes = self._lanes or self._thread_lanes()
            self.host_ms = 1e3 * (time.perf_counter() - started)  # handing out three prepared lists
            self.threads.run(*self._lanes)
        loss = self._read(self.g.loss, self.final_loc)
        return loss, 1e3 * (time.perf_counter() - started)

    run_step = step  # the name runtime/training.py calls it by

    def _step_cuda(self) -> None:
        started = time.perf_counter()
        self._cuda = self._cuda or self._cuda_items()
        if self._graph is None and self._eager_steps == 1:  # (after one eager step: kernels compiled, cuBLAS set up)
            if self.graph_mode:  # this step captures (the capture issues every item from Python), then replays
                self.warmup_steps = self._eager_steps + 1  # (this run's steps: a resumed run counts from its first)
            self._graph = self._agreed(self._capture() if self.graph_mode else None)
        compute = self.streams["compute"]
        if self._graph is not None:
            self._graph.launch(compute)
        else:
            issue_cuda(self._cuda)
            self._eager_steps += 1
        self.host_ms = 1e3 * (time.perf_counter() - started)
        streams = list(self.streams.values())
        if self.comm is not None:
            self.comm.finish(streams)
        elif self.hostfns is not None:
            hostfn.wait(streams, hostfn.cuda_status(self.xp))
        else:
            for stream in streams:
                stream.synchronize()
        if self.hostfns is not None:
            self.hostfns.finish()

    def _capture(self) -> Any:
        """The whole step as one CUDA graph: the copy streams fork from the compute stream and join it again
        inside the capture. None, with ``graph_note`` saying which instruction refused, where capture fails."""
        cuda, compute = self.xp.cuda, self.streams["compute"]
        at = [-1]
        try:
            compute.begin_capture()
            try:
                fork = cuda.Event(disable_timing=True)
                fork.record(compute)
                for name in FORKED:
                    self.streams[name].wait_event(fork)
                issue_cuda(self._cuda, on_item=lambda k: at.__setitem__(0, k))
                for name in FORKED:
                    join = cuda.Event(disable_timing=True)
                    join.record(self.streams[name])
                    compute.wait_event(join)
            except BaseException:  # (a second Ctrl-C too: ending the broken capture fails, and must not hide it)
                with contextlib.suppress(Exception):
                    compute.end_capture()
                raise
            graph = compute.end_capture()
        except Exception as exc:  # an op CuPy cannot capture: run eagerly, and say so
            self.graph_mode = False
            self.graph_note = f"capture failed at {self._describe(at[0])} ({type(exc).__name__}: {exc}); ran eagerly"
            return None
        self.graph_note = f"one CUDA graph per step ({len(self._cuda)} items)"
        return graph

    def _agreed(self, graph: Any) -> Any:
        """``graph``, where every rank captured its step (NCCL's all-reduces are captured on all ranks or on
        none); else None, the step issued item by item."""
        if self.comm is None or self.comm.all_agree(graph is not None):
            return graph
        if graph is not None:
            self.graph_mode = False
            self.graph_note = "off: another rank's step is not captured, and NCCL needs all ranks or none"
        return None

    def _describe(self, k: int) -> str:
        if not 0 <= k < len(self.work):
            return "the streams' fork or join"
        index = self.work[k].index
        if index < 0:
            return "the step's start (batch copy, step counter)"
        instr = self.plan.program[index]
        what = f"op {instr.op} `{self.g.ops[instr.op].op}`" if isinstance(instr, Run) else type(instr).__name__
        return f"instruction {index} ({what})"

    def _read(self, name: str, loc: dict[str, Region]) -> float:
        if name in loc:
            return float(to_host(self.dview(name, loc[name])))
        return float(self.hview(name))

    def persistent_values(self, names: Collection[str] | None = None) -> dict[str, np.ndarray]:
        """Params and optimiser state as the next step will see them (``names``: those alone): copies, which
        later steps leave alone."""
        out = {}
        for t in self.plan.tensors:
            if t.home is None or t.kind == "input" or (names is not None and t.name not in names):
                continue
            home = t.home
            out[t.name] = np.array(to_host(self.dview(t.name, home)) if isinstance(home, Region) else self.hview(t.name))
        return out

    def close(self) -> None:
        if self.backend == "cupy":
            if self.hostfns is not None:
                hostfn.wait(list(self.streams.values()), hostfn.cuda_status(self.xp))
                self.hostfns.close()
            for stream in self.streams.values():
                stream.synchronize()
            if self.comm is not None:
                self.comm.close()
        else:
            self.threads.close()
        self.host_kernels.close()

