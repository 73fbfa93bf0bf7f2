"""bf16 kept as its bits where the array module has no bf16 type (CuPy; swapdsl/graph/ops/halfbits.py):
the conversions against ml_dtypes on every bf16 value and on f32 values rounding every way, their CUDA
bodies compiled as C, and whole training steps of bf16 models on a NumPy that keeps bits, which must give
the bits the NumPy backend gives."""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest

import swapdsl
from conftest import MODELS
from swapdsl.graph.ops import halfbits
from swapdsl.graph.ops.kernels import staged
from swapdsl.graph.ops.registry import np_dtype
from swapdsl.runtime.reference import Trainer

BF16 = np.dtype(ml_dtypes.bfloat16)


class BitsNumpy(types.ModuleType):
    """NumPy, but an array module that is not NumPy itself: bf16 arrays are its bits, as on CuPy."""

    def __getattr__(self, name: str) -> Any:
        return getattr(np, name)


BITS_NP = BitsNumpy("bits_numpy")


def every_bf16() -> np.ndarray:
    return np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)


def hard_f32(rng: np.random.Generator) -> np.ndarray:
    """f32 values that round every way: random bits (NaNs and infinities among them), exact ties to even
    and odd, just either side of them, the largest finite values (which round to infinity), subnormals."""
    hi = rng.integers(0, 1 << 16, 4096, dtype=np.uint32) << 16
    low = np.array([0, 1, 0x7FFF, 0x8000, 0x8001, 0xFFFF], np.uint32)
    edges = np.array([0x7F7FFFFF, 0xFF7FFFFF, 0x7F800000, 0x7FC00000, 0x7F800001, 0x7FFFFFFF, 0x00000001,
                      0x80000001, 0x007FFFFF], np.uint32)
    return np.concatenate([(hi[:, None] | low[None, :]).ravel(), rng.integers(0, 1 << 32, 8192, dtype=np.uint32),
                           edges]).view(np.float32)


def ml_dtypes_bf16(x: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore"):  # (NaNs among them)
        return x.astype(BF16).view(np.uint16)


def assert_same_bf16(got: np.ndarray, want: np.ndarray) -> None:
    """Equal bits, except that a NaN need only be a NaN (ml_dtypes keeps more of its payload)."""
    nan = np.isnan(want.view(BF16).astype(np.float32))
    assert np.array_equal(np.isnan(got.view(BF16).astype(np.float32)), nan)
    assert np.array_equal(got[~nan], want[~nan])


def test_widening_every_bf16_value_gives_ml_dtypes_f32() -> None:
    bits = every_bf16()
    got = np.empty(bits.shape, np.float32)
    halfbits.widen(BITS_NP, got, bits)
    assert np.array_equal(got.view(np.uint32), bits.view(BF16).astype(np.float32).view(np.uint32))


def test_narrowing_rounds_to_nearest_even_as_ml_dtypes_does() -> None:
    x = hard_f32(np.random.default_rng(0))
    got = np.empty(x.shape, np.uint16)
    halfbits.narrow(BITS_NP, got, x)
    assert_same_bf16(got, ml_dtypes_bf16(x))
    assert got[x.view(np.uint32) == 0x7F7FFFFF][0] == 0x7F80  # (the largest f32 rounds to infinity)


PRELUDE = """
#include <string.h>
static float __uint_as_float(unsigned int u) { float f; memcpy(&f, &u, 4); return f; }
static unsigned int __float_as_uint(float f) { unsigned int u; memcpy(&u, &f, 4); return u; }
void widen(const unsigned short *in, float *out, long long n) {
  for (long long i = 0; i < n; ++i) { unsigned short x = in[i]; float y; %s out[i] = y; } }
void narrow(const float *in, unsigned short *out, long long n) {
  for (long long i = 0; i < n; ++i) { float x = in[i]; unsigned short y; %s out[i] = y; } }
"""


def test_the_cuda_bodies_compiled_as_c_convert_as_ml_dtypes(tmp_path: Path) -> None:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    src, lib = tmp_path / "bits.c", tmp_path / "bits.so"
    src.write_text(PRELUDE % (halfbits.WIDEN_BODY, halfbits.NARROW_BODY))
    subprocess.run([cc, "-O1", "-shared", "-fPIC", "-o", str(lib), str(src)], check=True, capture_output=True)
    c = ctypes.CDLL(str(lib))
    bits = every_bf16()
    wide = np.empty(bits.shape, np.float32)
    c.widen(ctypes.c_void_p(bits.ctypes.data), ctypes.c_void_p(wide.ctypes.data), ctypes.c_longlong(bits.size))
    assert np.array_equal(wide.view(np.uint32), bits.view(BF16).astype(np.float32).view(np.uint32))
    x = hard_f32(np.random.default_rng(1))
    got = np.empty(x.shape, np.uint16)
    c.narrow(ctypes.c_void_p(x.ctypes.data), ctypes.c_void_p(got.ctypes.data), ctypes.c_longlong(x.size))
    assert_same_bf16(got, ml_dtypes_bf16(x))


def test_only_numpy_itself_has_a_bf16_type() -> None:
    assert np_dtype(np, "bf16") is ml_dtypes.bfloat16
    assert np.dtype(np_dtype(BITS_NP, "bf16")) == np.uint16
    assert np_dtype(BITS_NP, "f16") is np.float16


MODELS_RUN = {"mlp": ("mlp", {"depth": 2, "batch": 8, "features": 32, "hidden": 16}),
              "mlp in blocks": ("mlp", {"depth": 2, "batch": 64, "features": 256, "hidden": 1024}),
              "tiny_transformer": ("tiny_transformer", {"batch": 2, "seq": 8, "vocab": 32, "dim": 16, "heads": 2,
                                                        "ffn": 32}),
              "tiny_resnet": ("tiny_resnet", {"batch": 2, "image": 8, "width": 4, "classes": 10}),
              "lstm_lm": ("lstm_lm", {"batch": 2, "seq": 4, "vocab": 16, "hidden": 8})}


@pytest.mark.parametrize("model", sorted(MODELS_RUN))
def test_bf16_training_steps_on_bits_are_the_bits_of_ml_dtypes(model: str) -> None:
    """Every kernel of these bf16 models, on arrays of bits, as CuPy runs them: the same loss and the same
    parameters and optimiser state, bit for bit, as on ml_dtypes' bf16, over three steps."""
    name, args = MODELS_RUN[model]
    t = swapdsl.load(MODELS / f"{name}.swp", args, precision="bf16").training
    assert any(x.type.dtype.label == "bf16" for x in t.tensors.values())
    if model == "mlp in blocks":  # (large enough that half ops run a block at a time: narrowed into strided views)
        assert any(staged(op.op, tuple(map(t.type_of, op.inputs)), t.type_of(op.outputs[0]), op.attr_dict)
                   for op in t.ops)
    ends = []
    for xp in (np, BITS_NP):
        trainer = Trainer(t, 3, xp)
        losses = [trainer.step(s) for s in (1, 2, 3)]
        ends.append((losses, {k: v.tobytes() for k, v in trainer.state().items()}))
    assert ends[0] == ends[1]


class CudaBits(BitsNumpy):
    """The bits stand-in, saying it has CUDA: kernels take their CUDA paths (cuBLAS, here recorded)."""

    cuda = types.SimpleNamespace()


def _flat(v: np.ndarray) -> np.ndarray:
    """The memory of ``v`` (a view starting where its buffer starts) as a flat array, as cuBLAS's pointer."""
    return np.lib.stride_tricks.as_strided(v, (v.size,), (v.itemsize,))


PRODUCTS = {"matmul": ((2, 3, 4), (4, 5)), "matmul_nt": ((2, 3, 4), (5, 4)), "matmul_tn": ((3, 4), (3, 5)),
            "matmul_tn_fold": ((2, 3, 4), (2, 3, 5))}


def _products_both_ways(record: list[str]) -> None:
    """Each product on half tensors through ``kernel_of`` on the bits stand-in (f32 staging) and on it with
    CUDA: the same bits."""
    from swapdsl.graph.ir import DType, TensorType
    from swapdsl.graph.ops import REGISTRY
    from swapdsl.graph.ops.kernels import kernel_of, scratch_need
    from swapdsl.graph.ops.registry import KernelContext

    rng = np.random.default_rng(2)
    for dtype in (DType.bf16, DType.f16):
        for op, (sx, sy) in PRODUCTS.items():
            types_ = (TensorType(sx, dtype), TensorType(sy, dtype))
            out_t = REGISTRY[op].infer(types_, {})
            host = [rng.standard_normal(s).astype(np_dtype(np, dtype)) for s in (sx, sy)]
            got = []
            for xp in (BITS_NP, CudaBits("cuda_bits")):
                ins = [halfbits.to_module(xp, h) for h in host]
                out = np.zeros(out_t.shape, np_dtype(xp, dtype))
                ctx = KernelContext.standalone(xp, scratch_need(op, types_, out_t, {}))
                kernel_of(op, types_, out_t, {})(ctx, ins, out, {})
                got.append(out.tobytes())
            assert got[0] == got[1], (op, dtype, record)


def _emulated_cublas(seen: list[tuple[str, bool]]) -> Any:
    """A stand-in for swapdsl's cuBLAS calls on the bits stand-in: the planned GEMMs as cuBLAS would run them
    (column-major, on each operand's memory: ``blas.emulate``) in f32, the output's old value added where it
    accumulates (beta 1), rounded once; each call's (output dtype, accumulate) recorded in ``seen``."""
    from swapdsl.graph.ops import blas

    def wide(v: Any) -> np.ndarray:
        w = np.empty(v.size, np.float32)
        halfbits.widen(BITS_NP, w, _flat(v))
        return w

    def cublas(xp: Any, calls: Any, a: Any, b: Any, c: Any, tf32: bool, accumulate: bool = False,
               workspace: Any = None) -> None:
        seen.append((str(c.dtype), accumulate))
        product = np.zeros(c.size, np.float32)
        for g in calls:
            blas.emulate(g, wide(a), wide(b), product)
        halfbits.narrow(BITS_NP, _flat(c), product + wide(c) if accumulate else product)

    return cublas


def test_half_products_on_cuda_go_to_cublas_as_they_are(monkeypatch: pytest.MonkeyPatch) -> None:
    """matmul, matmul_nt, matmul_tn and matmul_tn_fold on half tensors (bf16 bits, f16) reach cuBLAS without
    f32 copies (``OpDef.on_half``): the stand-in cuBLAS runs the planned GEMMs as cuBLAS would (column-major,
    on each operand's memory: ``blas.emulate``) in f32 and rounds once, which must be what the f32 staging
    computes, bit for bit."""
    from swapdsl.graph.ops import blas

    seen: list[tuple[str, bool]] = []
    monkeypatch.setattr(blas, "_cublas", _emulated_cublas(seen))
    monkeypatch.setattr(blas, "_refused", set())
    _products_both_ways(seen)
    assert seen == [("uint16", False)] * 4 + [("float16", False)] * 4


def test_a_half_product_cublas_refuses_is_staged_from_then_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """A GPU whose cuBLAS has no such half product (NOT_SUPPORTED, as bf16 before sm_80): the product is
    staged in f32 (the same bits), and cuBLAS is not asked for that type again."""
    from swapdsl.graph.ops import blas

    seen: list[str] = []

    def cublas(xp: Any, calls: Any, a: Any, b: Any, c: Any, tf32: bool, *more: Any) -> None:
        seen.append(str(c.dtype))
        if str(c.dtype) in blas.HALF_DATA:
            raise blas.CublasError("cublasGemmStridedBatchedEx", 15)
        c[...] = np.asarray(b) @ np.asarray(a)  # (f32, staged)

    monkeypatch.setattr(blas, "_cublas", cublas)
    monkeypatch.setattr(blas, "_refused", set())
    _products_both_ways(seen)
    assert seen.count("uint16") == 1 and seen.count("float16") == 1 and blas._refused == {"uint16", "float16"}


def test_cublas_is_told_each_half_type(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    from swapdsl.graph.ops import blas

    libs = types.SimpleNamespace(CUBLAS_COMPUTE_32F=68, CUBLAS_COMPUTE_32F_FAST_TF32=77, CUBLAS_COMPUTE_64F=70)
    monkeypatch.setitem(sys.modules, "cupy_backends", types.SimpleNamespace())
    monkeypatch.setitem(sys.modules, "cupy_backends.cuda", types.SimpleNamespace())
    monkeypatch.setitem(sys.modules, "cupy_backends.cuda.libs", types.SimpleNamespace(cublas=libs))
    xp = CudaBits("cuda_types")
    xp.cuda = types.SimpleNamespace(runtime=types.SimpleNamespace(CUDA_R_32F=0, CUDA_R_16F=2, CUDA_R_64F=1,
                                                                  CUDA_R_16BF=14))
    assert blas._cublas_types(xp, "uint16", False)[:2] == (14, 68)  # (bf16's bits: 16BF, f32 accumulation)
    assert blas._cublas_types(xp, "float16", True)[:2] == (2, 68)  # (TF32 is for f32 alone)
    assert blas._cublas_types(xp, "float32", True)[:2] == (0, 77)


@pytest.mark.parametrize("in_place", [True, False])
def test_a_half_weight_gradient_summed_into_goes_to_cublas_with_beta_one(monkeypatch: pytest.MonkeyPatch,
                                                                          in_place: bool) -> None:
    """matmul_tn_fold_acc (a weight gradient summed over micro-batches or time steps) on half tensors reaches
    cuBLAS as they are, adding into its output (beta 1) after the sum so far is copied there (nothing to copy
    when the op runs in place): the same bits as the f32 staging, and the sum so far left as it was."""
    from swapdsl.graph.ir import DType, TensorType
    from swapdsl.graph.ops import blas
    from swapdsl.graph.ops.kernels import kernel_of, scratch_need
    from swapdsl.graph.ops.registry import KernelContext

    seen: list[tuple[str, bool]] = []
    monkeypatch.setattr(blas, "_cublas", _emulated_cublas(seen))
    monkeypatch.setattr(blas, "_refused", set())
    rng = np.random.default_rng(4)
    op = "matmul_tn_fold_acc"
    for dtype in (DType.bf16, DType.f16):
        shapes = ((4, 5), (2, 3, 4), (2, 3, 5))
        types_ = tuple(TensorType(s, dtype) for s in shapes)
        out_t = TensorType((4, 5), dtype)
        host = [rng.standard_normal(s).astype(np_dtype(np, dtype)) for s in shapes]
        got = []
        for xp in (BITS_NP, CudaBits("cuda_bits")):
            ins = [halfbits.to_module(xp, h).copy() for h in host]
            out = ins[0] if in_place else np.zeros(out_t.shape, np_dtype(xp, dtype))
            ctx = KernelContext.standalone(xp, scratch_need(op, types_, out_t, {}))
            kernel_of(op, types_, out_t, {})(ctx, ins, out, {})
            got.append(out.tobytes())
            if not in_place:
                assert ins[0].tobytes() == halfbits.to_module(xp, host[0]).tobytes()
        assert got[0] == got[1], dtype
    assert seen == [("uint16", True), ("float16", True)]


def test_ml_dtypes_loads_only_when_bf16_is_met() -> None:
    """ml_dtypes 0.7 takes 0.4 s to import: half of `swapdsl check`'s time, paid by runs that never meet bf16."""
    code = ("import sys, swapdsl\n"
            "swapdsl.execute(swapdsl.load(sys.argv[1], batch=8), steps=1)\n"
            "print('ml_dtypes' in sys.modules)\n"
            "swapdsl.execute(swapdsl.load(sys.argv[1], batch=8, precision='bf16'), steps=1)\n"
            "print('ml_dtypes' in sys.modules)\n")
    done = subprocess.run([sys.executable, "-c", code, str(MODELS / "mlp.swp")], capture_output=True, text=True,
                          env={**os.environ, "OPENBLAS_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "True"]
