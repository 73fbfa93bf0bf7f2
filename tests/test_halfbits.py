"""bf16 kept as its bits where the array module has no bf16 type (CuPy; swapdsl/graph/ops/halfbits.py):
the conversions against ml_dtypes on every bf16 value and on f32 values rounding every way, their CUDA
bodies compiled as C, and whole training steps of bf16 models on a NumPy that keeps bits, which must give
the bits the NumPy backend gives."""

from __future__ import annotations

import ctypes
import shutil
import subprocess
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
