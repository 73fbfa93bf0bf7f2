"""The cuBLAS plan of a matrix product (the CuPy path), checked on the CPU: every planned strided-batched
GEMM run as cuBLAS would run it (column-major, on the operands' own memory) gives NumPy's matmul."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from swapdsl.graph.ops.blas import emulate, plan_gemm


def _elements(a: np.ndarray) -> tuple[int, ...]:
    return tuple(s // a.itemsize for s in a.strides)


def _base_offset(view: np.ndarray, base: np.ndarray) -> int:
    return (view.__array_interface__["data"][0] - base.__array_interface__["data"][0]) // view.itemsize


def run_planned(x: np.ndarray, y: np.ndarray, out: np.ndarray, bases: tuple[np.ndarray, ...]) -> bool:
    """Compute out = x @ y through the plan and the emulator; False if the plan refused the layouts."""
    calls = plan_gemm(x.shape, _elements(x), y.shape, _elements(y), out.shape, _elements(out))
    if calls is None:
        return False
    bx, by, bo = bases
    ox, oy, oo = _base_offset(x, bx), _base_offset(y, by), _base_offset(out, bo)
    for g in calls:  # the emulator reads flat buffers from each view's first element, as cuBLAS gets pointers
        emulate(g._replace(a_offset=g.a_offset + oy, b_offset=g.b_offset + ox, c_offset=g.c_offset + oo),
                by.reshape(-1), bx.reshape(-1), bo.reshape(-1))
    return True


@st.composite
def products(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray, tuple[int, ...], tuple[np.ndarray, np.ndarray]]:
    m, k, n = (draw(st.integers(1, 5)) for _ in range(3))
    batch = tuple(draw(st.lists(st.integers(1, 3), max_size=3)))
    x_batch = tuple(d if draw(st.booleans()) else 1 for d in batch)[draw(st.integers(0, len(batch))):]
    y_batch = tuple(d if draw(st.booleans()) else 1 for d in batch)[draw(st.integers(0, len(batch))):]

    def operand(lead: tuple[int, ...], rows: int, cols: int) -> tuple[np.ndarray, np.ndarray]:
        rng = np.random.default_rng(draw(st.integers(0, 2**31)))
        if draw(st.booleans()):  # stored transposed: a swapped view of a [..., cols, rows] array
            base = rng.standard_normal(lead + (cols, rows))
            return base.swapaxes(-1, -2), base
        pad = draw(st.integers(0, 2))  # rows longer than the matrix: a slice of wider rows
        base = rng.standard_normal(lead + (rows, cols + pad))
        return base[..., :cols], base

    x, bx = operand(x_batch, m, k)
    y, by = operand(y_batch, k, n)
    return x, y, np.broadcast_shapes(x.shape[:-2], y.shape[:-2]) + (m, n), (bx, by)


@settings(max_examples=300, deadline=None)
@given(products())
def test_planned_gemms_compute_numpys_matmul(case: tuple) -> None:
    x, y, out_shape, (bx, by) = case
    out_base = np.full((2,) + out_shape, np.nan)
    out = out_base[1]  # an output that is a view inside a larger buffer
    assert run_planned(x, y, out, (bx, by, out_base))
    np.testing.assert_allclose(out, np.matmul(x, y), rtol=1e-12, atol=1e-12)
    assert np.isnan(out_base[0]).all()  # nothing written outside the output


def test_the_convolution_layouts_are_planned() -> None:
    """The products convolution kernels make: a weight broadcast over a chunk of samples and groups,
    and the weight gradient's transposed columns."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((2, 3, 12))  # [G, O/G, C/G*KH*KW]
    cols = rng.standard_normal((4, 2, 12, 9))  # [n, G, K, P]
    out = np.empty((4, 2, 3, 9))
    calls = plan_gemm(w.shape, _elements(w), cols.shape, _elements(cols), out.shape, _elements(out))
    assert calls is not None and len(calls) == 4 and calls[0].batch == 2  # a loop over samples, groups batched
    assert run_planned(w, cols, out, (w, cols, out))
    np.testing.assert_allclose(out, np.matmul(w, cols))
    colsT = rng.standard_normal((2, 12, 36)).swapaxes(-1, -2)
    gy = rng.standard_normal((2, 3, 36))
    dw = np.empty((2, 3, 12))
    assert run_planned(gy, colsT, dw, (gy, colsT.base, dw))
    np.testing.assert_allclose(dw, gy @ colsT)


def test_a_layout_without_a_contiguous_axis_is_refused() -> None:
    x = np.zeros((4, 6))[::2, ::2]  # neither rows nor columns contiguous
    y = np.zeros((3, 2))
    out = np.zeros((2, 2))
    assert plan_gemm(x.shape, _elements(x), y.shape, _elements(y), out.shape, _elements(out)) is None
    with pytest.raises(ValueError):
        plan_gemm((2, 3), (3, 1), (4, 2), (2, 1), (2, 2), (2, 1))


class _FakeCublas:
    """A stand-in for libcublas: records the C calls as OwnCublas makes them through ctypes."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def cublasCreate_v2(self, handle_ref) -> int:  # noqa: ANN001, N802
        handle_ref._obj.value = 4242
        return 0

    def cublasSetMathMode(self, handle, mode) -> int:  # noqa: ANN001, N802
        self.calls.append(("math", handle.value, mode.value))
        return 0

    def cublasSetStream_v2(self, handle, stream) -> int:  # noqa: ANN001, N802
        self.calls.append(("stream", handle.value, stream.value))
        return 0

    def cublasSetWorkspace_v2(self, handle, pointer, size) -> int:  # noqa: ANN001, N802
        self.calls.append(("workspace", handle.value, pointer.value or 0, size.value))
        return 0

    def cublasGemmStridedBatchedEx(self, *args) -> int:  # noqa: ANN002, N802
        self.calls.append(("gemm", *(getattr(a, "value", a) for a in args)))
        return 0


def _device_array(ptr: int, nbytes: int = 0, dtype: type = np.float32):  # noqa: ANN202
    from types import SimpleNamespace

    return SimpleNamespace(data=SimpleNamespace(ptr=ptr), dtype=np.dtype(dtype), nbytes=nbytes)


def test_products_call_cublas_on_a_handle_of_our_own_bound_to_the_current_stream(monkeypatch) -> None:  # noqa: ANN001
    """CuPy's cuBLAS wrappers refuse to run while a stream is capturing, so a CUDA graph could not hold a
    product: each GEMM goes through the C API on our handle, bound to the current stream first, then to the
    workspace given (binding a stream unbinds it), with the operands' pointers at their offsets and 64-bit
    strides (a stand-in library records the calls)."""
    from types import SimpleNamespace

    from swapdsl.graph.ops import blas

    lib = _FakeCublas()
    own = blas.OwnCublas(lib)
    monkeypatch.setattr(blas, "own_cublas", lambda xp: own)
    one, zero = np.ones((), np.float32), np.zeros((), np.float32)
    monkeypatch.setattr(blas, "_cublas_types", lambda xp, dtype, tf32: (0, 68, one, zero))
    xp = SimpleNamespace(cuda=SimpleNamespace(get_current_stream=lambda: SimpleNamespace(ptr=77)))
    calls = plan_gemm((3, 4, 5), (20, 5, 1), (5, 6), (6, 1), (3, 4, 6), (24, 6, 1))
    arrays = _device_array(1000), _device_array(2000), _device_array(3000)
    blas._cublas(xp, calls, *arrays, False, workspace=_device_array(9000, 4096, np.uint8))
    # (the handle adds a half product's partial sums in f32: CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION)
    assert lib.calls[:3] == [("math", 4242, 16), ("stream", 4242, 77), ("workspace", 4242, 9000, 4096)]
    assert len(lib.calls) == 3 + len(calls)
    g, got = calls[0], lib.calls[3]
    assert got[1:7] == (4242, int(g.transa), int(g.transb), g.m, g.n, g.k)
    assert got[8] == 1000 + 4 * g.a_offset and got[12] == 2000 + 4 * g.b_offset and got[17] == 3000 + 4 * g.c_offset
    assert (got[11], got[15], got[20], got[21], got[22]) == (g.stride_a, g.stride_b, g.stride_c, g.batch, 68)
    lib.calls.clear()  # an empty workspace is bound as none at all: cuBLAS then runs algorithms needing none
    blas._cublas(xp, calls[:1], *arrays, False, workspace=_device_array(5000, 0, np.uint8))
    assert lib.calls[:2] == [("stream", 4242, 77), ("workspace", 4242, 0, 0)]


def test_each_product_on_cuda_is_handed_the_runners_workspace(monkeypatch) -> None:  # noqa: ANN001
    """Left to itself, cuBLAS takes a new workspace for each CUDA graph it is captured into: each product on
    CUDA is handed the context's workspace (the runner's, beside the arena), whatever the op; a context
    without one (tests, profiling) leaves cuBLAS its own pool (the stand-in records what each call got)."""
    import attrs

    from swapdsl.graph.ir import DType, TensorType
    from swapdsl.graph.ops import blas
    from swapdsl.graph.ops.kernels import kernel_of, scratch_need
    from swapdsl.graph.ops.registry import KernelContext

    seen: list[object] = []

    def cublas(xp, calls, a, b, c, tf32, accumulate=False, workspace=None) -> None:  # noqa: ANN001
        seen.append(workspace)
        flat = [np.lib.stride_tricks.as_strided(v, (v.size,), (v.itemsize,)) for v in (a, b, c)]  # (pointers)
        for g in calls:
            blas.emulate(g, *flat)

    monkeypatch.setattr(blas, "_cublas", cublas)
    monkeypatch.setattr(blas, "on_cuda", lambda xp: True)
    rng = np.random.default_rng(0)
    workspace = np.zeros(1024, np.uint8)
    for op, shapes in (("matmul", ((4, 5), (5, 3))), ("matmul_tn_fold_acc", ((5, 3), (2, 4, 5), (2, 4, 3)))):
        types = tuple(TensorType(s, DType.f32) for s in shapes)
        out_t = TensorType(shapes[0] if op != "matmul" else (4, 3), DType.f32)
        plain = KernelContext.standalone(np, scratch_need(op, types, out_t, {}))
        ins = [rng.standard_normal(s).astype(np.float32) for s in shapes]
        want = ins[0] @ ins[1] if op == "matmul" else ins[0] + ins[1].reshape(-1, 5).T @ ins[2].reshape(-1, 3)
        for ctx, given in ((attrs.evolve(plain, workspace=workspace), workspace), (plain, None)):
            out = np.zeros(out_t.shape, np.float32)
            seen.clear()
            kernel_of(op, types, out_t, {})(ctx, ins, out, {})
            assert seen and all(w is given for w in seen), (op, seen)
            np.testing.assert_allclose(out, want, rtol=1e-5)


def test_cublas_workspace_is_cublas_own_default_size() -> None:
    from types import SimpleNamespace

    from swapdsl.graph.ops.blas import workspace_bytes

    def gpu(capability: str) -> SimpleNamespace:
        return SimpleNamespace(cuda=SimpleNamespace(Device=lambda: SimpleNamespace(compute_capability=capability)))

    assert [workspace_bytes(gpu(c)) >> 20 for c in ("70", "80", "86", "90", "100")] == [4, 4, 4, 32, 32]


def test_without_a_cublas_library_of_its_own_it_says_none(monkeypatch) -> None:  # noqa: ANN001
    import ctypes
    from types import SimpleNamespace

    from swapdsl.graph.ops import blas

    def refuse(name: str) -> None:
        raise OSError(f"{name}: cannot open shared object file")

    monkeypatch.setattr(ctypes, "CDLL", refuse)
    blas.own_cublas.cache_clear()
    class CudaModule:  # hashable, as a module is (own_cublas is cached per array module)
        cuda = SimpleNamespace(runtime=SimpleNamespace(runtimeGetVersion=lambda: 12040))

    assert blas.own_cublas(CudaModule()) is None
    blas.own_cublas.cache_clear()


def test_a_status_cupys_wrappers_raise_is_a_cublas_error(monkeypatch) -> None:  # noqa: ANN001
    """Without a library of our own the GEMMs go through CuPy's wrappers, whose errors are CuPy's own class:
    a type the GPU refuses (NOT_SUPPORTED, 15) must still reach half_gemm as a CublasError with its status,
    so that the product is staged in f32 instead of failing the step."""
    import sys
    from types import ModuleType, SimpleNamespace

    from swapdsl.graph.ops import blas

    class CUBLASError(RuntimeError):  # noqa: N818 (CuPy's name)
        def __init__(self, status: int) -> None:
            super().__init__(f"CUBLAS_STATUS {status}")
            self.status = status

    def gemm(*args: object) -> None:
        raise CUBLASError(15)

    wrappers = ModuleType("cupy_backends.cuda.libs.cublas")
    wrappers.__dict__.update(CUBLASError=CUBLASError, setStream=lambda handle, stream: None,
                             gemmStridedBatchedEx=gemm, CUBLAS_GEMM_DEFAULT=-1)
    for name in ("cupy_backends", "cupy_backends.cuda"):
        monkeypatch.setitem(sys.modules, name, ModuleType(name))
    monkeypatch.setitem(sys.modules, "cupy_backends.cuda.libs", SimpleNamespace(cublas=wrappers))
    monkeypatch.setitem(sys.modules, "cupy_backends.cuda.libs.cublas", wrappers)
    monkeypatch.setattr(blas, "own_cublas", lambda xp: None)
    one, zero = np.ones((), np.float32), np.zeros((), np.float32)
    monkeypatch.setattr(blas, "_cublas_types", lambda xp, dtype, tf32: (14, 68, one, zero))
    xp = SimpleNamespace(cuda=SimpleNamespace(get_current_stream=lambda: SimpleNamespace(ptr=77),
                                              device=SimpleNamespace(get_cublas_handle=lambda: 9)))
    array = SimpleNamespace(data=SimpleNamespace(ptr=1000), dtype=np.dtype(np.uint16))
    with pytest.raises(blas.CublasError) as err:
        blas._cublas(xp, plan_gemm((3, 4), (4, 1), (4, 5), (5, 1), (3, 5), (5, 1)), array, array, array, False)
    assert err.value.status == 15 and err.value.status in blas.REFUSALS


def test_a_runners_device_memory_counts_cublas_workspace_beside_the_arena() -> None:
    """On CuPy a runner takes the arena (exactly the cap) and cuBLAS's workspace beside it, once: refused
    before allocating where the GPU's free memory holds the arena but not both (a stand-in CuPy); NumPy
    takes the arena alone."""
    from types import SimpleNamespace

    from swapdsl.common.errors import SwpError
    from swapdsl.runtime.backend import device_memory

    def gpu(free: int) -> SimpleNamespace:
        return SimpleNamespace(
            cuda=SimpleNamespace(Device=lambda: SimpleNamespace(compute_capability="90"),
                                 runtime=SimpleNamespace(memGetInfo=lambda: (free, 80 << 30))),
            get_default_memory_pool=lambda: SimpleNamespace(free_all_blocks=lambda: None),
            zeros=np.zeros, empty=np.empty)

    cap = 8 << 20
    memory = device_memory(gpu(cap + (40 << 20)), cap, 0, "the plan's arena")
    assert memory.arena.nbytes == cap and memory.blas_workspace.nbytes == 32 << 20 and memory.nbytes == cap + (32 << 20)
    with pytest.raises(SwpError, match=r"the plan's arena \(and cuBLAS's workspace, 32\.00 MiB\) needs 40\.00 MiB, "
                                       r"but there is only 24\.00 MiB of free GPU"):
        device_memory(gpu(cap + (16 << 20)), cap, 0, "the plan's arena")
    plain = device_memory(np, cap, 0, "the plan's arena")
    assert plain.blas_workspace is None and plain.nbytes == cap
