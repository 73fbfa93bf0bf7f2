"""Data-parallel collectives on CuPy (runtime/nccl.py), on stand-ins for CuPy, NCCL and the MPI world: which
GPU each rank takes, NCCL or MPI through host memory (the same choice on every rank), and the calls each
makes. ``allreduce_mean`` runs on them end to end, its peer simulated; a GPU run checks the real ones."""

from __future__ import annotations

import contextlib
import ctypes
import sys
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from swapdsl.common.errors import SwpError
from swapdsl.graph.ir import DType, TensorType
from swapdsl.graph.ops.kernels import kernel_of
from swapdsl.graph.ops.registry import KernelContext
from swapdsl.runtime.nccl import Nccl, Staged, choice, gpu_comm, placements


class DeviceArray(np.ndarray):
    """A NumPy array that answers ``.data.ptr`` as a CuPy array does (its address)."""

    @property
    def data(self) -> Any:  # type: ignore[override]
        return SimpleNamespace(ptr=self.ctypes.data)


def device(values: list[float], dtype: Any = np.float64) -> DeviceArray:
    return np.array(values, dtype=dtype).view(DeviceArray)


def at(ptr: int, count: int, dtype: Any) -> np.ndarray:
    """``count`` elements of ``dtype`` at address ``ptr``, as a view."""
    nbytes = count * np.dtype(dtype).itemsize
    return np.frombuffer((ctypes.c_char * nbytes).from_address(ptr), dtype=dtype)


class Dog:
    def __init__(self) -> None:
        self.entered: list[str] = []

    @contextlib.contextmanager
    def collective(self, what: str) -> Iterator[None]:
        self.entered.append(what)
        yield


class World:
    """One rank of an MPI world whose other ranks are scripted: what they gather, rank 0's broadcast, and
    the peer's share of each all-reduce."""

    def __init__(self, rank: int, seen: list[Any], peer: np.ndarray | None = None) -> None:
        self.rank, self.seen, self.peer = rank, seen, peer
        self.dog = Dog()
        self.comm = self

    def Get_rank(self) -> int:  # noqa: N802
        return self.rank

    def Get_size(self) -> int:  # noqa: N802
        return len(self.seen)

    def allgather(self, mine: Any) -> list[Any]:
        return [mine if r == self.rank else s for r, s in enumerate(self.seen)]

    def bcast(self, value: Any, root: int) -> Any:
        return value if self.rank == root else ("uid from rank", root)

    def Allreduce(self, send: np.ndarray, recv: np.ndarray) -> None:  # noqa: N802
        assert self.peer is not None
        np.add(send, self.peer, out=recv)


class FakeNccl:
    """NCCL's module and a communicator in one; ``fails_at``: the call of ``check_async_error`` that reports
    an error (None: never)."""

    available = True
    NCCL_FLOAT32, NCCL_FLOAT64, NCCL_SUM = 7, 8, 0

    class NcclError(RuntimeError):
        pass

    def __init__(self, peer: np.ndarray | None = None, fails_at: int | None = None) -> None:
        self.peer, self.made, self.calls = peer, [], []
        self.destroyed = self.aborted = False
        self.fails_at, self.checks = fails_at, 0

    def destroy(self) -> None:
        self.destroyed = True

    def abort(self) -> None:
        self.aborted = True

    def check_async_error(self) -> None:
        self.checks += 1
        if self.checks == self.fails_at:
            raise self.NcclError("NCCL_ERROR_REMOTE_ERROR: remote process exited or there was a network error")

    def get_unique_id(self) -> tuple[str, int]:
        return ("uid made by", 0)

    def NcclCommunicator(self, size: int, uid: Any, rank: int) -> Any:  # noqa: N802
        self.made.append((size, uid, rank))
        return self

    def allReduce(self, send: int, recv: int, count: int, dtype: int, op: int, stream: int) -> None:  # noqa: N802
        self.calls.append((send, recv, count, dtype, op, stream))
        kind = np.float64 if dtype == self.NCCL_FLOAT64 else np.float32
        np.add(at(send, count, kind), self.peer, out=at(recv, count, kind))


class Stream:
    """A stream as ``cudaStreamQuery`` sees it (through ``FakeCupy``'s runtime): done after ``busy`` queries,
    or failed with ``error`` (then ``synchronize`` raises CUDA's error)."""

    def __init__(self, busy: int = 0, error: int = 0, ptr: int = 4242) -> None:
        self.busy, self.error, self.ptr, self.queries = busy, error, ptr, 0
        STREAMS[ptr] = self

    def query(self) -> int:
        self.queries += 1
        if self.error:
            return self.error
        self.busy -= 1
        return 0 if self.busy < 0 else 600

    def synchronize(self) -> None:
        raise RuntimeError(f"cudaErrorIllegalAddress ({self.error})")


STREAMS: dict[int, Stream] = {}


class FakeCupy:
    """CuPy as runtime/nccl.py uses it: the devices' bus ids, making one current, the current stream, and
    asynchronous copies (done at once)."""

    def __init__(self, buses: tuple[str, ...], nccl: Any) -> None:
        self.used: list[int] = []
        self.copies: list[str] = []
        stream = Stream()
        free = iter([8 << 30, (8 << 30) - (96 << 20)])  # (NCCL's buffers: 96 MiB)
        runtime = SimpleNamespace(getDeviceCount=lambda: len(buses), deviceGetPCIBusId=lambda d: buses[d],
                                  memcpyDeviceToHost=2, memcpyHostToDevice=1, memcpyAsync=self._copy,
                                  memGetInfo=lambda: (next(free), 16 << 30),
                                  streamQuery=lambda ptr: STREAMS[ptr].query())
        self.cuda = SimpleNamespace(runtime=runtime, nccl=nccl, get_current_stream=lambda: stream,
                                    Device=lambda d: SimpleNamespace(use=lambda: self.used.append(d)))

    def _copy(self, dst: int, src: int, nbytes: int, kind: int, stream: int) -> None:
        assert stream == 4242
        self.copies.append({1: "to device", 2: "to host"}[kind])
        ctypes.memmove(dst, src, nbytes)


@pytest.fixture
def pinned(monkeypatch: pytest.MonkeyPatch) -> None:
    """CuPy's pinned memory (``backend.pinned``) as plain host memory."""
    cuda = SimpleNamespace(PinnedMemory=bytearray, PinnedMemoryPointer=lambda mem, offset: memoryview(mem)[offset:])
    monkeypatch.setitem(sys.modules, "cupy", SimpleNamespace(cuda=cuda))


def test_ranks_on_one_machine_take_its_gpus_in_turn() -> None:
    seen = [("a", ("b0", "b1"), True)] * 3 + [("c", ("b0",), True)]
    assert placements(seen) == [(0, "a/b0"), (1, "a/b1"), (0, "a/b0"), (0, "c/b0")]
    assert choice(seen) == "ranks 0, 2 share GPU a/b0, and NCCL takes one rank per GPU"


def test_ranks_given_one_gpu_each_by_the_launcher_are_told_apart() -> None:
    """Each rank sees one GPU, index 0, and they are different devices (their bus ids): NCCL."""
    seen = [("a", ("b0",), True), ("a", ("b1",), True)]
    assert placements(seen) == [(0, "a/b0"), (0, "a/b1")] and choice(seen) is None


def test_one_rank_without_nccl_sends_every_rank_through_mpi() -> None:
    seen = [("a", ("b0",), True), ("b", ("b0",), False)]
    assert choice(seen) == "rank 1's CuPy has no NCCL"


def test_a_rank_that_sees_no_gpu_is_refused() -> None:
    with pytest.raises(SwpError, match="rank 1 sees no GPU"):
        placements([("a", ("b0",), True), ("b", (), True)])


def two_gpus(host: str) -> list[Any]:
    return [(host, ("b0", "b1"), True)] * 2


def test_nccl_starts_on_the_ranks_own_gpu_with_rank_0s_id(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("socket.gethostname", lambda: "m")
    nccl = FakeNccl()
    cupy = FakeCupy(("b0", "b1"), nccl)
    world = World(1, two_gpus("m"))
    comm, note = gpu_comm(cupy, world)
    assert isinstance(comm, Nccl) and comm.capturable
    assert note == "NCCL on GPU 1 (m/b1); its buffers take 96.00 MiB outside the cap"
    assert cupy.used == [1] and nccl.made == [(2, ("uid from rank", 0), 1)]
    assert world.dog.entered == ["the GPU placement check", "NCCL's start"]
    assert comm.all_agree(True) and world.dog.entered[-1] == "the CUDA graph check"
    world.seen = [False, True]  # (rank 0 did not capture its step)
    assert not comm.all_agree(True)
    comm.close()
    assert nccl.destroyed


def test_ranks_sharing_a_gpu_reduce_through_host_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("socket.gethostname", lambda: "m")
    nccl = FakeNccl()
    world = World(0, [("m", ("b0",), True)] * 2)
    comm, note = gpu_comm(FakeCupy(("b0",), nccl), world)
    assert isinstance(comm, Staged) and not comm.capturable and nccl.made == []
    assert note == "MPI through host memory (ranks 0, 1 share GPU m/b0, and NCCL takes one rank per GPU)"


def mean_kernel(dtype: DType) -> Any:
    t = TensorType((3,), dtype)
    return kernel_of("allreduce_mean", (t,), t, {"ranks": 2, "link_bw": 1e9})


@pytest.mark.parametrize("in_place", [False, True])
def test_the_mean_kernel_averages_through_nccl_on_the_current_stream(in_place: bool) -> None:
    nccl = FakeNccl(peer=np.array([10.0, 20.0, 30.0], np.float32))
    cupy = FakeCupy(("b0",), nccl)
    x = device([1.0, 2.0, 3.0], np.float32)
    out = x if in_place else device([0.0] * 3, np.float32)
    ctx = KernelContext.standalone(np, 0, comm=Nccl(cupy, nccl, nccl, World(0, [None, None])))
    mean_kernel(DType.f32)(ctx, [x], out, {"ranks": 2, "link_bw": 1e9})
    np.testing.assert_array_equal(out, np.array([5.5, 11.0, 16.5], np.float32))
    assert nccl.calls == [(x.ctypes.data, out.ctypes.data, 3, FakeNccl.NCCL_FLOAT32, FakeNccl.NCCL_SUM, 4242)]


def test_nccl_refuses_a_half_bucket_clearly() -> None:
    nccl = FakeNccl()
    comm = Nccl(FakeCupy(("b0",), nccl), nccl, nccl, World(0, [None, None]))
    with pytest.raises(SwpError, match="float32 or float64, not float16"):
        comm.Allreduce(device([1.0], np.float16), device([1.0], np.float16))


def test_the_staged_all_reduce_copies_out_averages_and_copies_back(pinned: None) -> None:
    cupy = FakeCupy(("b0",), FakeNccl())
    world = World(0, [("m", ("b0",), True)] * 2, peer=np.array([10.0, 20.0, 30.0]))
    ctx = KernelContext.standalone(np, 0, comm=Staged(cupy, world))
    x, out = device([1.0, 2.0, 3.0]), device([0.0] * 3)
    for _ in range(2):  # (the second step reuses the pinned pair)
        mean_kernel(DType.f64)(ctx, [x], out, {"ranks": 2, "link_bw": 1e9})
        np.testing.assert_array_equal(out, [5.5, 11.0, 16.5])
    assert cupy.copies == ["to host", "to device"] * 2 and cupy.cuda.get_current_stream().queries == 4
    assert len(ctx.comm._buffers) == 1


def step_world(step: int) -> World:
    world = World(0, [None, None])
    world.dog.step = step  # type: ignore[attr-defined]
    return world


def test_the_steps_end_asks_nccl_whether_it_failed_while_the_streams_run() -> None:
    nccl = FakeNccl()
    world = step_world(3)
    comm = Nccl(FakeCupy(("b0",), nccl), nccl, nccl, world)
    comm.finish([Stream(0, ptr=1), Stream(4, ptr=2)])
    assert nccl.checks >= 4 and not nccl.aborted
    assert world.dog.entered == ["the step's all-reduces (NCCL's, and any of host copies)"]
    comm.close()
    assert nccl.destroyed


def test_an_error_nccl_reports_ends_the_step_naming_it_and_aborts_the_communicator() -> None:
    """A peer lost mid-step: NCCL's kernels may never finish, so the wait would last until the watchdog's
    timeout; NCCL's own report ends it at once."""
    nccl = FakeNccl(fails_at=3)
    comm = Nccl(FakeCupy(("b0",), nccl), nccl, nccl, step_world(7))
    with pytest.raises(SwpError, match="NCCL failed in the all-reduces of step 7: NCCL_ERROR_REMOTE_ERROR") as err:
        comm.finish([Stream(10**9, ptr=3)])
    assert "--resume" in err.value.hints[0]
    assert nccl.checks == 3 and nccl.aborted
    comm.close()  # (an aborted communicator is gone: destroying it too would free it twice)
    assert not nccl.destroyed


def test_a_cuda_error_ends_the_wait_with_cudas_own_message() -> None:
    """``cudaStreamQuery`` reports a sticky error (say an illegal address) for ever: the wait raises it at once
    rather than polling until the watchdog's timeout."""
    nccl = FakeNccl()
    comm = Nccl(FakeCupy(("b0",), nccl), nccl, nccl, step_world(2))
    with pytest.raises(RuntimeError, match="cudaErrorIllegalAddress"):
        comm.finish([Stream(1, ptr=5), Stream(error=700, ptr=6)])


class HostSettable(np.ndarray):
    """A NumPy array with CuPy's ``set`` (a copy from the host), counting its calls."""

    sets = 0

    def set(self, value: np.ndarray) -> None:
        HostSettable.sets += 1
        self[...] = value


def test_a_device_array_given_to_mpi_goes_through_host_memory() -> None:
    """The reference executor on CuPy averages with MPI's communicator (``--check`` beside a data-parallel
    plan): the kernel copies the bucket to the host and back rather than hand MPI a device pointer."""
    xp = SimpleNamespace(asnumpy=lambda a: np.array(a, copy=True), divide=np.divide, cuda=SimpleNamespace())
    world = World(0, [None, None], peer=np.array([10.0, 20.0, 30.0]))
    ctx = KernelContext.standalone(np, 0, comm=world)
    ctx = KernelContext(xp, ctx.scratch, ctx.step, comm=world)
    x, out = np.array([1.0, 2.0, 3.0]), np.zeros(3).view(HostSettable)
    before = HostSettable.sets
    mean_kernel(DType.f64)(ctx, [x], out, {"ranks": 2, "link_bw": 1e9})
    np.testing.assert_array_equal(out, [5.5, 11.0, 16.5])
    assert HostSettable.sets == before + 1  # (copied back from the host)


def test_a_step_with_host_copy_all_reduces_is_not_captured_beside_nccl() -> None:
    """A host function that waits for an all-reduce of host copies holds the driver's host-function thread,
    which NCCL's captured all-reduces need for their own (which may be serialised behind ours): with NCCL,
    such a step is issued eagerly (NCCL then launches none), and says why; without host all-reduces, or with
    one rank, it is captured."""
    from types import SimpleNamespace

    from swapdsl.runtime.interpreter import capture_choice

    nccl, staged = SimpleNamespace(capturable=True), SimpleNamespace(capturable=False)
    assert capture_choice("cupy", True, nccl, False) == (True, "captured at the second step")
    off, why = capture_choice("cupy", True, nccl, True)
    assert not off and "host-function thread" in why
    assert capture_choice("cupy", True, None, True)[0]
    assert capture_choice("cupy", True, staged, False) == (False, "off: the all-reduces wait on the host "
                                                                  "(MPI through host memory)")
    assert capture_choice("cupy", False, nccl, False) == (False, "off: each step issued item by item")
    assert capture_choice("numpy", True, None, False) == (False, "no CUDA graph on NumPy")
