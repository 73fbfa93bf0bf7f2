"""The plan interpreter: runs a training step exactly as a plan says.

One device arena of exactly the cap, tensors are views into it at the
plan's offsets, and the top of it the scratch region: the step counter,
then every kernel's temporaries (kernels write their results straight into
their outputs' regions, so a step allocates nothing); one host arena with a
slot for every tensor that ever has a host copy (pinned memory on CuPy);
three streams. When a plan is
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
  swap-out of the tensor.

Nothing else synchronises, so a plan that breaks its promises corrupts
numbers instead of quietly using more memory.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from types import ModuleType
from typing import Any, NamedTuple

import numpy as np

from swapdsl.common.errors import SwpError
from swapdsl.graph.ir import DType, Graph, TensorType
from swapdsl.graph.ops import KernelContext, REGISTRY
from swapdsl.graph.analysis import STATE_BYTES
from swapdsl.graph.ops.registry import Scratch, np_dtype
from swapdsl.plan.program import InstrKind, Plan, Region, Run, SwapIn, SwapOut, arena_bytes
from swapdsl.plan.replay import STREAM, Replay, Step
from swapdsl.plan.validate import check_describes, validate
from swapdsl.runtime.backend import require_memory, to_host
from swapdsl.runtime.data import init_persistent, synthetic_inputs
from swapdsl.runtime.streams import make_streams


class Work(NamedTuple):
    """One instruction as stream work."""

    stream: str
    waits: tuple[int, ...]  # the other streams' instructions (program indices) it waits for
    run: Callable[[], None]
    index: int  # its program index
    awaited: bool  # another stream waits for it: record an event


def check_runnable(g: Graph) -> None:
    """What the runtime cannot do, whatever the plan."""
    if any(t.type.dtype is DType.bf16 for t in g.tensors.values()):
        raise SwpError("the runtime cannot execute bf16 tensors (neither NumPy nor CuPy has a bf16 array type)",
                       hints=["use f16 or f32"])


class PlanRunner:
    def __init__(self, plan: Plan, g: Graph, backend: str, xp: ModuleType, seed: int,
                 check_plan: bool = True, copy_delay_s: float = 0.0, kernel_delay_s: float = 0.0) -> None:
        """``check_plan``: validate the plan against ``g`` (False: the caller has, or a test runs a broken
        plan to show what validation prevents; it must still describe ``g``). ``copy_delay_s``,
        ``kernel_delay_s`` (NumPy, for tests): every copy or kernel starts that much later, so that a wait
        the plan lacks shows up as a wrong number rather than being hidden by luck."""
        if check_plan:
            validate(plan, g)
        else:
            check_describes(plan, g)
        check_runnable(g)
        self.plan, self.g, self.backend, self.xp = plan, g, backend, xp
        self.copy_delay_s, self.kernel_delay_s = copy_delay_s, kernel_delay_s
        self.slots = self._host_slots()
        host_bytes = max((off + nbytes for off, nbytes in self.slots.values()), default=0)
        require_memory(xp, plan.cap, host_bytes, f"the plan's arena of {plan.cap} bytes and its host copies")
        self.arena = xp.zeros(plan.cap, dtype=np.uint8)  # the device arena: exactly the cap
        self.host = self._host_arena(host_bytes)
        self.streams = make_streams(backend)
        self.homes = {t.name: t.home for t in plan.tensors if t.home is not None}
        self.inputs = set(g.inputs)
        self._load_initial(seed)
        self.ctx = self._context()
        self.steps_run = 0
        self.host_ms = 0.0  # the last step's time to issue its work
        self.work = self._prepare()

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
            import cupyx

            return cupyx.empty_pinned(max(nbytes, 1), dtype=np.uint8)
        return np.zeros(max(nbytes, 1), dtype=np.uint8)

    def _context(self) -> KernelContext:
        """The kernels' context over the scratch region: the step counter (int64, on the device), then the
        temporaries."""
        base = self.plan.tensor_cap
        counter = self.arena[base:base + 8].view(np.int64).reshape(())
        counter.fill(0)
        return KernelContext(self.xp, Scratch(self.arena[base + STATE_BYTES:self.plan.cap]), counter)

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
        values = {**init_persistent(self.g, seed, np), **synthetic_inputs(self.g, seed, np)}
        for name, value in values.items():
            if name in self.slots:
                self.hview(name)[...] = value
            home = self.homes.get(name)
            if isinstance(home, Region) and name not in self.inputs:
                self._put(self.dview(name, home), value)

    def _put(self, dst: Any, src: np.ndarray) -> None:
        if self.backend == "cupy":
            dst.set(np.ascontiguousarray(src))
        else:
            dst[...] = src

    # -- copies, as stream work

    def _h2d(self, name: str, region: Region) -> None:
        src, dst = self.hview(name), self.dview(name, region)
        if self.backend == "cupy":
            dst.set(src, stream=self.streams["h2d"].stream)  # type: ignore[attr-defined]
        else:
            if self.copy_delay_s:
                time.sleep(self.copy_delay_s)
            np.copyto(dst, src)

    def _d2h(self, name: str, region: Region) -> None:
        src, dst = self.dview(name, region), self.hview(name)
        if self.backend == "cupy":
            src.get(stream=self.streams["d2h"].stream, out=dst)  # type: ignore[attr-defined]
        else:
            if self.copy_delay_s:
                time.sleep(self.copy_delay_s)
            np.copyto(dst, src)

    # -- one step

    def _prepare(self) -> list[Work]:
        """The program as stream work, built once. Frees are not stream work: their waits pass to the next
        tenant. Only instructions another stream waits for record an event."""
        r = Replay(self.plan)
        steps = [s for s in r.steps() if s.kind is not InstrKind.FREE]
        self.final_loc = dict(r.loc)
        stream_of = {s.index: STREAM[s.kind] for s in steps}
        waits = {s.index: tuple(dict.fromkeys(w for w in s.waits if stream_of[w] != stream_of[s.index]))
                 for s in steps}
        awaited = {w for ws in waits.values() for w in ws}
        return [Work(stream_of[s.index], waits[s.index], self._work(s), s.index, s.index in awaited)
                for s in steps]

    def _work(self, s: Step) -> Callable[[], None]:
        instr = s.instr
        if isinstance(instr, SwapIn):
            return functools.partial(self._h2d, instr.tensor, instr.region)
        if isinstance(instr, SwapOut):
            return functools.partial(self._d2h, instr.tensor, s.regions[0])
        assert isinstance(instr, Run)
        op = self.g.ops[instr.op]
        ins = [self.dview(n, region) for n, region in zip(op.inputs, s.regions)]
        out = self.dview(op.outputs[0], dict(instr.outs)[op.outputs[0]])
        kernel, attrs, ctx = REGISTRY[op.op].kernel, op.attr_dict, self.ctx

        def launch() -> None:
            if self.kernel_delay_s:
                time.sleep(self.kernel_delay_s)
            ctx.scratch.reset()
            kernel(ctx, ins, out, attrs)

        return launch

    def _count_step(self) -> None:
        self.xp.add(self.ctx.step, 1, out=self.ctx.step)

    def step(self, step: int) -> tuple[float, float]:
        """Run training step ``step`` (1, 2, ... in turn: the device counts them); return (loss, milliseconds)."""
        if step != self.steps_run + 1:
            raise ValueError(f"step {step} after step {self.steps_run}: a plan's steps run in order from 1")
        self.steps_run = step
        s = self.streams
        started = time.perf_counter()
        s["compute"].submit(self._count_step)
        for name, home in self.homes.items():
            if isinstance(home, Region) and name in self.inputs:  # this step's batch lands in its home region
                s["h2d"].submit(functools.partial(self._h2d, name, home))
        s["compute"].wait(s["h2d"].record())
        done: dict[int, Any] = {}
        for w in self.work:
            stream = s[w.stream]
            for index in w.waits:
                stream.wait(done[index])
            stream.submit(w.run)
            if w.awaited:
                done[w.index] = stream.record()
        self.host_ms = 1e3 * (time.perf_counter() - started)  # the host's part: issuing the step
        for stream in s.values():
            stream.synchronize()
        loss = self._read(self.g.loss, self.final_loc)
        return loss, 1e3 * (time.perf_counter() - started)

    def _read(self, name: str, loc: dict[str, Region]) -> float:
        if name in loc:
            return float(to_host(self.dview(name, loc[name])))
        return float(self.hview(name))

    def persistent_values(self) -> dict[str, np.ndarray]:
        """Params and optimiser state as the next step will see them (for comparisons)."""
        out = {}
        for t in self.plan.tensors:
            if t.home is None or t.kind == "input":
                continue
            home = t.home
            out[t.name] = to_host(self.dview(t.name, home)) if isinstance(home, Region) else self.hview(t.name).copy()
        return out

    def close(self) -> None:
        for stream in self.streams.values():
            stream.close()

