"""bf16 where the array module has no bf16 type (CuPy): a bf16 tensor is its bits, in a uint16 array.

A bf16 value is the top half of an f32 (sign, 8 exponent bits, 7 of the mantissa), so it widens exactly by a
shift and narrows by rounding the low half away, to nearest with ties to even, as ml_dtypes (the NumPy
backend's bf16) and a GPU's conversion do; a NaN stays a NaN. The kernels reach bf16 tensors only through
``widen`` and ``narrow`` (``kernels.kernel_of`` computes every half op in f32), through ops that move bytes
unchanged, and through vendor calls told the type (cuBLAS's 16BF products, cuDNN's BFLOAT16 graphs), so the
same kernel code runs on ml_dtypes arrays and on bits. The IR has no unsigned
integers, so a uint16 array is always bf16 bits.

On CuPy each conversion is one element-wise kernel, with no temporaries; elsewhere (a NumPy stand-in that
keeps bits, in tests) the same rules run as NumPy operations.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

Array = Any
BITS = np.dtype(np.uint16)

WIDEN_BODY = "y = __uint_as_float(((unsigned int)x) << 16);"
NARROW_BODY = """
    unsigned int u = __float_as_uint(x);
    y = (u & 0x7fffffffu) > 0x7f800000u ? (unsigned short)((u >> 16) | 0x0040u)
                                        : (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);"""


@functools.cache
def bfloat16() -> np.dtype:
    """ml_dtypes' bf16, NumPy's bf16 type: imported when first asked for (ml_dtypes 0.7 takes 0.4 s to load,
    half of what `swapdsl check` takes; a run that never meets bf16 never loads it)."""
    import ml_dtypes

    return np.dtype(ml_dtypes.bfloat16)


def is_bf16(dtype: Any) -> bool:
    """Whether a dtype is ml_dtypes' bf16 (told by name: asking loads nothing)."""
    return np.dtype(dtype).name == "bfloat16"


def is_bits(x: Array) -> bool:
    return x.dtype == BITS


def keeps_bits(xp: Any) -> bool:
    """Whether ``xp`` keeps bf16 as bits: every array module but NumPy itself, which has ml_dtypes'."""
    return xp is not np


def to_module(xp: Any, host: np.ndarray) -> Array:
    """A host array as an ``xp`` array (bf16 as its bits where ``xp`` keeps bits)."""
    return xp.asarray(host.view(BITS) if is_bf16(host.dtype) and keeps_bits(xp) else host)


def from_module(a: np.ndarray) -> np.ndarray:
    """A host copy of an ``xp`` array, bf16 bits seen as ml_dtypes' bf16 again."""
    return a.view(bfloat16()) if is_bits(a) else a


def widen(xp: Any, dst: Array, src: Array) -> None:
    """``dst`` (f32) = ``src`` (half: f16, ml_dtypes' bf16, or bf16 bits)."""
    if not is_bits(src):
        xp.copyto(dst, src, casting="unsafe")
    elif hasattr(xp, "ElementwiseKernel"):
        _kernels(xp)[0](src, dst)
    else:
        np.copyto(dst, (src.astype(np.uint32) << 16).view(np.float32))


def narrow(xp: Any, dst: Array, src: Array) -> None:
    """``dst`` (half: f16, ml_dtypes' bf16, or bf16 bits) = ``src`` (f32), rounded to nearest even."""
    if not is_bits(dst):
        xp.copyto(dst, src, casting="unsafe")
    elif hasattr(xp, "ElementwiseKernel"):
        _kernels(xp)[1](src, dst)
    else:
        u = np.ascontiguousarray(src, dtype=np.float32).view(np.uint32)
        rounded = ((u + np.uint32(0x7FFF) + ((u >> 16) & 1)) >> 16).astype(np.uint16)
        nan = ((u >> 16) | 0x0040).astype(np.uint16)
        np.copyto(dst, np.where((u & 0x7FFFFFFF) > 0x7F800000, nan, rounded))


@functools.cache
def _kernels(xp: Any) -> tuple[Any, Any]:
    return (xp.ElementwiseKernel("uint16 x", "float32 y", WIDEN_BODY, "swapdsl_bf16_widen"),
            xp.ElementwiseKernel("float32 x", "uint16 y", NARROW_BODY, "swapdsl_bf16_narrow"))
