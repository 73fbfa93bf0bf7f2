"""Matrix products into a given output, allocating nothing, on NumPy and CuPy.

NumPy's ``matmul(out=...)`` already computes in place. CuPy's batched matmul
does not: it copies an operand that is not C-contiguous (every transposed
view) and allocates arrays of matrix pointers for a broadcast batch. So on
CuPy every product (2-d ones too) is planned here as cuBLAS strided-batched
GEMMs over the operands' own memory (``plan_gemm``, pure and tested on the CPU against
NumPy), and each is one cuBLAS call with the stream and the output given, through the C
API on a handle of swapdsl's own (``OwnCublas``): CuPy's wrappers refuse to run while a
stream is being captured into a CUDA graph. cuBLAS's workspace is one the runner allocates once
beside the arena (``KernelContext.workspace``, of cuBLAS's own default size: ``workspace_bytes``),
bound to the handle after the stream before each call: left to itself, cuBLAS takes a new one for
every CUDA graph it is captured into.

cuBLAS is column-major: a row-major matrix with row stride ``s`` is, read
column-major, its transpose with leading dimension ``s``. So out = x @ y
(row-major) is computed as out^T = y^T @ x^T, with cuBLAS's A from ``y``
and B from ``x``.
"""

from __future__ import annotations

import functools
import itertools
from typing import Any, NamedTuple

import numpy as np

from swapdsl.graph.ops.registry import KernelContext, on_cuda

Array = Any


class Gemm(NamedTuple):
    """One strided-batched GEMM in cuBLAS's terms: C = op(A) op(B), m x n, over ``batch`` matrices.
    Offsets, leading dimensions and strides are in elements."""

    transa: bool
    transb: bool
    m: int
    n: int
    k: int
    a_offset: int
    lda: int
    stride_a: int
    b_offset: int
    ldb: int
    stride_b: int
    c_offset: int
    ldc: int
    stride_c: int
    batch: int


class _Layout(NamedTuple):
    transposed: bool  # the matrix is stored column by column (a transposed view of a row-major one)
    ld: int


def _layout(rows: int, cols: int, s_row: int, s_col: int) -> _Layout | None:
    """How a rows x cols matrix with these element strides sits in memory, for cuBLAS; None if neither
    its rows nor its columns are contiguous."""
    if (s_col == 1 or cols == 1) and (rows == 1 or s_row >= cols):
        return _Layout(False, s_row if rows > 1 else max(cols, 1))
    if (s_row == 1 or rows == 1) and (cols == 1 or s_col >= rows):
        return _Layout(True, s_col if cols > 1 else max(rows, 1))
    return None


def _batch_dims(shapes: list[tuple[int, ...]], strides: list[tuple[int, ...]],
                out_batch: tuple[int, ...]) -> list[tuple[int, list[int]]]:
    """The batch dimensions as (size, each operand's stride), broadcast operands striding 0, merged where
    every operand allows it; innermost last."""
    dims: list[tuple[int, list[int]]] = []
    nd = len(out_batch)
    for i in range(nd):
        per = []
        for shape, stride in zip(shapes, strides):
            j = i - (nd - (len(shape) - 2))
            per.append(0 if j < 0 or shape[j] == 1 else stride[j])
        if out_batch[i] == 1:
            continue
        if dims and all(prev == cur * out_batch[i] for prev, cur in zip(dims[-1][1], per)):
            size, _ = dims[-1]
            dims[-1] = (size * out_batch[i], per)
        else:
            dims.append((out_batch[i], per))
    return dims


def plan_gemm(x_shape: tuple[int, ...], x_strides: tuple[int, ...], y_shape: tuple[int, ...],
              y_strides: tuple[int, ...], out_shape: tuple[int, ...],
              out_strides: tuple[int, ...]) -> list[Gemm] | None:
    """The cuBLAS calls that compute out = x @ y (NumPy's matmul rules, rank 2 or more, element strides),
    or None where a layout does not fit (then the caller falls back)."""
    (m_rows, k), (k2, n) = x_shape[-2:], y_shape[-2:]
    if k != k2 or out_shape[-2:] != (m_rows, n):
        raise ValueError(f"matmul shapes {x_shape} @ {y_shape} -> {out_shape}")
    lx, ly = _layout(m_rows, k, *x_strides[-2:]), _layout(k, n, *y_strides[-2:])
    lo = _layout(m_rows, n, *out_strides[-2:])
    if lx is None or ly is None or lo is None or lo.transposed:
        return None
    dims = _batch_dims([x_shape, y_shape, out_shape], [x_strides, y_strides, out_strides], tuple(out_shape[:-2]))
    inner_size, (sx, sy, so) = dims[-1] if dims else (1, [0, 0, 0])
    calls = []
    for index in itertools.product(*(range(size) for size, _ in dims[:-1])):
        ox, oy, oo = (sum(i * s[j] for i, (_, s) in zip(index, dims)) for j in range(3))
        calls.append(Gemm(ly.transposed, lx.transposed, n, m_rows, k, oy, ly.ld, sy, ox, lx.ld, sx, oo, lo.ld, so,
                          inner_size))
    return calls


def emulate(call: Gemm, a: np.ndarray, b: np.ndarray, c: np.ndarray) -> None:
    """What cuBLAS does for ``call`` on flat buffers (column-major): for tests on a CPU."""
    item = a.itemsize
    for i in range(call.batch):
        rows_a, cols_a = (call.k, call.m) if call.transa else (call.m, call.k)
        rows_b, cols_b = (call.n, call.k) if call.transb else (call.k, call.n)
        ma = np.lib.stride_tricks.as_strided(a[call.a_offset + i * call.stride_a:], (rows_a, cols_a),
                                             (item, call.lda * item))
        mb = np.lib.stride_tricks.as_strided(b[call.b_offset + i * call.stride_b:], (rows_b, cols_b),
                                             (item, call.ldb * item))
        mc = np.lib.stride_tricks.as_strided(c[call.c_offset + i * call.stride_c:], (call.m, call.n),
                                             (item, call.ldc * item))
        mc[...] = (ma.T if call.transa else ma) @ (mb.T if call.transb else mb)


def matmul_into(c: KernelContext, x: Array, y: Array, out: Array) -> None:
    """out = x @ y, computed in ``out``; ``c.tf32`` (CuPy, FP32): cuBLAS may use TF32 tensor cores."""
    xp = c.xp
    if not on_cuda(xp):
        xp.matmul(x, y, out=out)
        return
    itemsize = out.dtype.itemsize
    calls = plan_gemm(x.shape, _elements(x.strides, itemsize), y.shape, _elements(y.strides, itemsize),
                      out.shape, _elements(out.strides, itemsize))
    if calls is None or x.dtype != out.dtype or y.dtype != out.dtype:
        xp.matmul(x, y, out=out)  # a layout cuBLAS cannot read as it is: CuPy's matmul copies it
        return
    _cublas(xp, calls, y, x, out, c.tf32, False, c.workspace)


HALF_DATA = ("float16", "uint16")  # the half arrays cuBLAS multiplies as they are (uint16: bf16's bits, halfbits)
REFUSALS = (8, 15)  # CUBLAS_STATUS_ARCH_MISMATCH, CUBLAS_STATUS_NOT_SUPPORTED: this GPU has no such product
_refused: set[str] = set()  # the half dtypes cuBLAS refused here: staged from then on


class CublasError(RuntimeError):
    def __init__(self, what: str, status: int) -> None:
        super().__init__(f"{what} failed with cuBLAS status {status}")
        self.status = status


def half_gemm(c: KernelContext, x: Array, y: Array, out: Array, acc: Array | None = None) -> bool:
    """out = x @ y (``acc``: acc + x @ y) on half arrays of one dtype by cuBLAS, as they are: products
    accumulated in f32 (compute type 32F, tensor cores; partial sums in f32 too, ``MATH_MODE``), ``acc`` added
    in f32 (beta 1), rounded once to half; False where it cannot (no CUDA, other dtypes, a layout cuBLAS cannot
    read, a GPU whose cuBLAS refuses the type), and the caller computes it another way (over the whole output
    again; ``acc`` is left as it was)."""
    xp, dtype = c.xp, str(out.dtype)
    if not on_cuda(xp) or dtype not in HALF_DATA or dtype in _refused or x.dtype != out.dtype or y.dtype != out.dtype:
        return False
    itemsize = out.dtype.itemsize
    calls = plan_gemm(x.shape, _elements(x.strides, itemsize), y.shape, _elements(y.strides, itemsize),
                      out.shape, _elements(out.strides, itemsize))
    if calls is None or (acc is not None and (acc.dtype != out.dtype or acc.shape != out.shape)):
        return False
    if acc is not None and not _same_memory(acc, out):
        xp.copyto(out, acc)  # (an op in place is handed its output as its first input: then nothing to copy)
    try:
        _cublas(xp, calls, y, x, out, False, acc is not None, c.workspace)
    except CublasError as err:
        if err.status not in REFUSALS:
            raise
        _refused.add(dtype)
        return False
    return True


def _wrapped_gemms(xp: Any, calls: list[Gemm], arrays: tuple[Array, Array, Array], types: tuple[int, int],
                   scalars: tuple[np.ndarray, np.ndarray], stream: int) -> None:
    """The GEMMs through CuPy's cuBLAS wrappers, whose own error (``CUBLASError``) becomes a ``CublasError``
    with its status (so that a half type the GPU refuses is staged from then on, as on our own library).
    They bind the stream before each call, which unbinds any workspace: cuBLAS uses its own pool here."""
    from cupy_backends.cuda.libs import cublas

    (a, b, c), (data, compute), (one, beta), item = arrays, types, scalars, arrays[2].dtype.itemsize
    handle = xp.cuda.device.get_cublas_handle()
    try:
        cublas.setStream(handle, stream)
        for g in calls:
            cublas.gemmStridedBatchedEx(
                handle, int(g.transa), int(g.transb), g.m, g.n, g.k, one.ctypes.data,
                a.data.ptr + g.a_offset * item, data, g.lda, g.stride_a,
                b.data.ptr + g.b_offset * item, data, g.ldb, g.stride_b,
                beta.ctypes.data, c.data.ptr + g.c_offset * item, data, g.ldc, g.stride_c,
                g.batch, compute, cublas.CUBLAS_GEMM_DEFAULT)
    except cublas.CUBLASError as err:
        raise CublasError("cublasGemmStridedBatchedEx", int(getattr(err, "status", -1))) from None


def _same_memory(a: Array, b: Array) -> bool:
    """Whether two arrays are one view of the same memory (same address, shape and strides)."""
    def address(v: Array) -> int:
        return int(v.data.ptr) if hasattr(v.data, "ptr") else int(v.__array_interface__["data"][0])

    return a is b or (address(a) == address(b) and a.shape == b.shape and a.strides == b.strides)


def _elements(strides: tuple[int, ...], itemsize: int) -> tuple[int, ...]:
    return tuple(s // itemsize for s in strides)


@functools.cache
def _cublas_types(xp: Any, dtype: str, tf32: bool) -> tuple[int, int, np.ndarray, np.ndarray]:
    """(data type, compute type, alpha, beta) for a dtype: FP32 computes in FP32 unless ``tf32``."""
    from cupy_backends.cuda.libs import cublas

    runtime = xp.cuda.runtime
    if dtype == "float64":
        return runtime.CUDA_R_64F, cublas.CUBLAS_COMPUTE_64F, np.ones((), np.float64), np.zeros((), np.float64)
    data = {"float32": runtime.CUDA_R_32F, "float16": runtime.CUDA_R_16F,
            "uint16": getattr(runtime, "CUDA_R_16BF", 14)}[dtype]  # (uint16: bf16's bits)
    compute = cublas.CUBLAS_COMPUTE_32F_FAST_TF32 if tf32 and dtype == "float32" else cublas.CUBLAS_COMPUTE_32F
    return data, compute, np.ones((), np.float32), np.zeros((), np.float32)


def _cublas(xp: Any, calls: list[Gemm], a: Array, b: Array, c: Array, tf32: bool, accumulate: bool = False,
            workspace: Array | None = None) -> None:
    """The planned GEMMs, c = a b (column-major), or c += a b where ``accumulate`` (beta 1), with ``workspace``
    (bytes on the device, none where empty) as cuBLAS's; None: cuBLAS's own pool."""
    data, compute, one, zero = _cublas_types(xp, str(c.dtype), tf32)
    beta = one if accumulate else zero
    item, stream = c.dtype.itemsize, xp.cuda.get_current_stream().ptr
    own = own_cublas(xp)
    if own is None:  # no library of our own: CuPy's wrappers, which refuse to run in a capture
        _wrapped_gemms(xp, calls, (a, b, c), (data, compute), (one, beta), stream)
        return
    own.bind(stream, None if workspace is None else _bound(workspace))
    for g in calls:
        own.gemm(g, (a.data.ptr + g.a_offset * item, b.data.ptr + g.b_offset * item,
                     c.data.ptr + g.c_offset * item), data, compute, one, beta)


def _bound(workspace: Array) -> tuple[int, int]:
    """(pointer, bytes) of a workspace: null where it is empty."""
    return (workspace.data.ptr, workspace.nbytes) if workspace.nbytes else (0, 0)


def workspace_bytes(xp: Any) -> int:
    """cuBLAS's own default workspace on this GPU: 32 MiB from Hopper (compute capability 9) on, else 4 MiB."""
    return (32 if int(xp.cuda.Device().compute_capability) >= 90 else 4) << 20


_GEMM_DEFAULT = -1  # cublasGemmAlgo_t CUBLAS_GEMM_DEFAULT


# CUBLAS_DEFAULT_MATH | CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION: a half product's split partial sums
# are added in f32 too, so it is rounded once (by default cuBLAS may add them in half)
MATH_MODE = 16


class OwnCublas:
    """cuBLAS through ctypes, on a handle swapdsl owns. CuPy's wrappers bind their handle to the current
    stream before every call and refuse to while a stream is capturing (CuPy 14), so no CUDA graph could
    hold a matrix product; the C API binds and runs under capture, and this handle is bound before each call."""

    def __init__(self, lib: Any) -> None:
        import ctypes

        self.lib, self.c = lib, ctypes
        handle = ctypes.c_void_p()
        self._check(lib.cublasCreate_v2(ctypes.byref(handle)), "cublasCreate")
        self._check(lib.cublasSetMathMode(handle, ctypes.c_int(MATH_MODE)), "cublasSetMathMode")
        self.handle = handle

    def _check(self, status: int, what: str) -> None:
        if status != 0:
            raise CublasError(what, status)

    def bind(self, stream: int, workspace: tuple[int, int] | None) -> None:
        """The handle on ``stream``, with ``workspace`` (pointer, bytes) as its workspace, or cuBLAS's own pool
        (binding a stream unbinds the workspace, so both are bound before each product)."""
        c = self.c
        self._check(self.lib.cublasSetStream_v2(self.handle, c.c_void_p(stream)), "cublasSetStream")
        if workspace is not None:
            pointer, size = workspace
            self._check(self.lib.cublasSetWorkspace_v2(self.handle, c.c_void_p(pointer), c.c_size_t(size)),
                        "cublasSetWorkspace")

    def gemm(self, g: Gemm, pointers: tuple[int, int, int], data: int, compute: int,
             one: np.ndarray, beta: np.ndarray) -> None:
        c = self.c
        a_ptr, b_ptr, c_ptr = (c.c_void_p(p) for p in pointers)
        self._check(self.lib.cublasGemmStridedBatchedEx(
            self.handle, c.c_int(int(g.transa)), c.c_int(int(g.transb)), c.c_int(g.m), c.c_int(g.n), c.c_int(g.k),
            c.c_void_p(one.ctypes.data), a_ptr, c.c_int(data), c.c_int(g.lda), c.c_longlong(g.stride_a),
            b_ptr, c.c_int(data), c.c_int(g.ldb), c.c_longlong(g.stride_b),
            c.c_void_p(beta.ctypes.data), c_ptr, c.c_int(data), c.c_int(g.ldc), c.c_longlong(g.stride_c),
            c.c_int(g.batch), c.c_int(compute), c.c_int(_GEMM_DEFAULT)), "cublasGemmStridedBatchedEx")


@functools.cache
def own_cublas(xp: Any) -> OwnCublas | None:
    """The cuBLAS library CuPy loaded (by its soname, for this CUDA major version), on a handle of ours;
    None where it cannot be opened (then CuPy's wrappers run, and a capture falls back to eager steps)."""
    import ctypes

    try:  # CuPy loads libcublas (from its wheels' folder, too) on this import; CDLL then finds it by soname
        import cupy_backends.cuda.libs.cublas  # noqa: F401
    except ImportError:
        pass
    major = xp.cuda.runtime.runtimeGetVersion() // 1000
    for name in (f"libcublas.so.{major}", "libcublas.so"):
        try:
            return OwnCublas(ctypes.CDLL(name))
        except (OSError, AttributeError, RuntimeError):
            continue
    return None
