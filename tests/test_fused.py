"""Fused element-wise kernels (CuPy), as far as a CPU can check them: every one stands for a registered
op with the op's inputs, and one that does not match its op's own kernel, or fails to build, is left out
with a note instead of being used."""

from __future__ import annotations

import ctypes
import functools
import shutil
import subprocess
import tempfile
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from conftest import MODELS, build_graph
from swapdsl.graph.autodiff import training_graph
from swapdsl.graph.ops import REGISTRY
from swapdsl.runtime.fused import COMPOSITE, FUSED, FusedKernels


def test_every_fused_kernel_is_a_registered_element_wise_op_with_its_inputs() -> None:
    for name, f in FUSED.items():
        op = REGISTRY[name]
        params = [p.split()[-1] for p in f.params.split(",")]
        arity = op.arity[0]
        assert op.arity == (arity, arity)
        assert len(params) >= arity and "y" not in params and "y =" in f.body


def test_every_generic_type_is_bound_by_an_array() -> None:
    """CuPy cannot infer a type placeholder from a scalar alone (cupy/cupy#2091, a KeyError at the call, so
    the kernel fails its check and is left out): dropout's ``S scale`` was one, and on an H200 dropout took
    the ufunc chain's time (16 ms for 100M elements, half of GPT-2's kernel time; swapdsl profile)."""
    for name, f in FUSED.items():
        arity = REGISTRY[name].arity[0]
        types = [p.split()[-2] for p in f.params.split(",")]
        generic = {t for t in types if len(t) == 1 and t.isupper()}
        assert generic <= set(types[:arity]) | {"T"}, (name, generic)
        assert "T" in types[:arity], name


class _CopyingKernels:
    """A stand-in array module whose ElementwiseKernel 'computes' by copying its first input."""

    def __getattr__(self, name: str) -> Any:
        return getattr(np, name)

    @staticmethod
    def ElementwiseKernel(params: str, out: str, body: str, name: str, preamble: str = "") -> Any:  # noqa: N802
        return lambda *args: np.copyto(args[-1], args[0])


class _BrokenCompiler(_CopyingKernels):
    @staticmethod
    def ElementwiseKernel(*args: Any, **kw: Any) -> Any:  # noqa: N802
        raise RuntimeError("nvrtc: error")


def _graph() -> Any:
    return training_graph(build_graph(str(MODELS / "tiny_transformer.swp"), ["batch=2", "seq=8"])[1])


def test_a_fused_kernel_that_differs_from_its_op_is_not_used() -> None:
    t = _graph()
    found = FusedKernels.load(t, _CopyingKernels())
    fusable = {op.op for op in t.ops if op.op in FUSED or op.op in COMPOSITE}
    assert fusable and not found.kernels  # copying the input matches no op
    assert {n.split("`")[1] for n in found.notes} == fusable
    assert all("differs by" in n for n in found.notes)


def test_a_fused_kernel_that_fails_to_build_is_not_used() -> None:
    found = FusedKernels.load(_graph(), _BrokenCompiler())
    assert not found.kernels and found.notes and all("nvrtc: error" in n for n in found.notes)


# ---- the kernels' CUDA sources, compiled as C on the CPU -------------------------------------------------
#
# A fused body is C with CUDA's names for a few things. Compiled here with the system C compiler, one call
# running every index i, it is held to the op's own kernel on NumPy: the logic of a kernel a GPU would run,
# checked without one (what CuPy does with the parameters is checked on the GPU, at load).

_C_PRELUDE = """
#include <math.h>
#include <string.h>
#include <tgmath.h>
#define __device__ static
#define abs(v) fabs(v)
static float __int_as_float(unsigned int u) { float f; memcpy(&f, &u, 4); return f; }
"""
_C_TYPES = {"uint32": "unsigned int", "int32": "int", "int64": "long long"}


def _c_source(name: str, ctype: str) -> str:
    f = FUSED[name]
    return _c_function(f.params, f.body, REGISTRY[name].arity[0], ctype)


def _c_function(params: str, body: str, arity: int, ctype: str) -> str:
    from swapdsl.runtime.fused import _PREAMBLE

    unpack = []
    for k, p in enumerate(params.split(",")):
        *kind, t, var = p.split()
        c = ctype if len(t) == 1 else _C_TYPES[t]
        if k >= arity:
            unpack.append(f"const {c} {var} = ({c})sc[{k - arity}];")
        elif kind == ["raw"]:
            unpack.append(f"const {c} *{var} = (const {c} *)in[{k}];")
        else:
            unpack.append(f"const {c} {var} = ((const {c} *)in[{k}])[i];")
    return (f"{_C_PRELUDE}typedef {ctype} T;\n{_PREAMBLE}\n"
            f"void run(const void *const *in, const double *sc, T *out, long long n) {{\n"
            f"  for (long long i = 0; i < n; ++i) {{\n    {' '.join(unpack)}\n    T y;\n    {body}\n"
            f"    out[i] = y;\n  }}\n}}\n")


@functools.cache
def _compiled_source(source: str) -> Any:
    """The C function ``run`` of ``source``, compiled once per test process."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    folder = Path(tempfile.mkdtemp(prefix="swapdsl-fused-"))
    src, lib = folder / "kernel.c", folder / "kernel.so"
    src.write_text(source)
    subprocess.run([cc, "-O1", "-shared", "-fPIC", "-o", str(lib), str(src), "-lm"], check=True,
                   capture_output=True)
    return ctypes.CDLL(str(lib)).run


def _compiled(tmp: Any, name: str, ctype: str, source: str | None = None) -> Any:
    return _compiled_source(source or _c_source(name, ctype))


def _inputs(name: str, dtype: Any, rng: np.random.Generator) -> tuple[list[np.ndarray], dict[str, Any]]:
    if name == "max_pool2d_grad":  # small integers: many ties, so the first maximum decides
        a = {"kernel": (3, 3), "stride": (2, 2), "padding": (1, 1)}
        x = rng.integers(0, 4, (2, 3, 9, 8)).astype(dtype)
        x[0, 0, 0, 0] = np.nan
        return [x, rng.standard_normal((2, 3, 5, 4)).astype(dtype)], a
    a = {"lr": 0.1, "momentum": 0.9, "weight_decay": 0.01, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8,
         "p": 0.3, "seed": 5, "offset": 12345}  # (offset: where a micro-batch's dropout mask starts)
    return [rng.uniform(0.1, 0.9, 4096).astype(dtype) for _ in range(REGISTRY[name].arity[0])], a


# the update ops' attributes the step changes: a schedule (warmup, then cosine decay), AdamW's decoupled decay
SCHEDULES = {"none": {}, "warmup+cosine": {"warmup": 5, "cosine": 100, "min_lr": 0.01},
             "step decay": {"step_every": 30, "gamma": 0.5}, "adamw": {"decoupled_wd": 0.05}}


UPDATES = ("sgd", "sgd_apply", "momentum", "adam_m", "adam_v", "adam_apply")


@pytest.mark.parametrize("step", [3, 60])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name, schedule", [(n, "none") for n in sorted(FUSED)]
                         + [(n, s) for n in UPDATES for s in sorted(SCHEDULES) if s != "none"])
def test_each_fused_source_computes_its_op(tmp_path: Any, name: str, dtype: Any, schedule: str, step: int) -> None:
    """... at any step, with any learning-rate schedule and weight decay (a fused update once took its
    ``lr`` as written, and its load-time check at step 3 missed all but a warmup)."""
    from swapdsl.graph.ops.registry import KernelContext, type_of

    run = _compiled(tmp_path, name, "float" if dtype == np.float32 else "double")
    ins, a = _inputs(name, dtype, np.random.default_rng(1))
    a = {**a, **SCHEDULES[schedule]}
    out_type = REGISTRY[name].infer(tuple(map(type_of, ins)), a)
    want, got = np.empty(out_type.shape, dtype), np.empty(out_type.shape, dtype)
    ctx = KernelContext.standalone(np, 1 << 22, step=step)
    REGISTRY[name].kernel(ctx, ins, want, a)
    ctx.scratch.reset()
    scalars = [float(np.asarray(v)) for v in FUSED[name].scalars(ctx, ins, a)]
    pointers = (ctypes.c_void_p * len(ins))(*[x.ctypes.data for x in ins])
    run(pointers, (ctypes.c_double * max(len(scalars), 1))(*scalars), ctypes.c_void_p(got.ctypes.data),
        ctypes.c_longlong(got.size))
    if name in ("max_pool2d_grad", "dropout", "relu_grad"):  # no rounding between them: the same bits
        np.testing.assert_array_equal(got, want)
    else:
        np.testing.assert_allclose(got, want, rtol=2e-6 if dtype == np.float32 else 1e-12, atol=0)


@pytest.mark.gpu
def test_every_fused_kernel_passes_its_check_on_the_gpu() -> None:
    """Each fused kernel a GPT-2 and a ResNet use (dropout, GELU, Adam, max-pool's gradient, ...) builds on
    CuPy and matches its op: none left out with a note."""
    import cupy

    graphs = [training_graph(build_graph(str(MODELS / "gpt.swp"), d)[1]) for d in (
        ["layers=1", "hidden=32", "heads=2", "seq=16", "vocab=64", "positions=16", "batch=2"],)]
    graphs.append(training_graph(build_graph(str(MODELS / "resnet.swp"), ["depth=18", "batch=2", "image=32", "classes=10"])[1]))
    used = set()
    for t in graphs:
        found = FusedKernels.load(t, cupy)
        assert found.notes == []
        used |= {t.ops[i].op for i in found.kernels}
    assert {"dropout", "gelu", "max_pool2d_grad", "adam_apply", "batch_norm", "batch_norm_grad",
            "batch_norm_dscale", "layer_norm", "layer_norm_grad", "softmax", "softmax_grad",
            "softmax_cross_entropy_grad"} <= used


class _CElementwise:
    """Composite kernels' element-wise pieces compiled as C: each call broadcasts its inputs to the output's
    shape, as CuPy's kernels do, and runs every element."""

    def __init__(self, tmp: Any) -> None:
        self.tmp = tmp

    def __call__(self, params: str, body: str, name: str) -> Any:
        runs = {}

        def kernel(*args: np.ndarray) -> None:
            *ins, out = args
            ctype = "float" if out.dtype == np.float32 else "double"
            if ctype not in runs:
                arity = len(params.split(","))
                runs[ctype] = _compiled(self.tmp, f"piece_{name}", ctype, _c_function(params, body, arity, ctype))
            full = [np.ascontiguousarray(np.broadcast_to(x, out.shape)) for x in ins]
            got = np.empty(out.shape, out.dtype)
            pointers = (ctypes.c_void_p * len(full))(*[x.ctypes.data for x in full])
            runs[ctype](pointers, (ctypes.c_double * 1)(0.0), ctypes.c_void_p(got.ctypes.data),
                        ctypes.c_longlong(got.size))
            np.copyto(out, got)

        return kernel


_NORMS = ["batch_norm", "batch_norm_grad", "batch_norm_dscale", "layer_norm", "layer_norm_grad", "rms_norm",
          "rms_norm_grad"]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name", _NORMS)
@pytest.mark.parametrize("shape", [(3, 5, 4, 6), (8, 16, 32, 32), (4, 1, 2, 8)])  # tiles; a tiny tile
def test_each_composite_computes_its_op(tmp_path: Any, name: str, dtype: Any, shape: tuple[int, ...]) -> None:
    """Normalisation's fused passes, their CUDA bodies compiled as C, around the op's own statistics: the
    op's results on NumPy, tiles and all, within the load-time check's tolerance (scale over the channels
    for batch norm, over the last two axes for layer and RMS norm)."""
    from swapdsl.graph.ops.registry import KernelContext, type_of
    from swapdsl.runtime.fused import COMPOSITE, fused_kernel

    assert set(COMPOSITE) == set(_NORMS) | set(_SOFTMAX)
    rng = np.random.default_rng(2)
    x = (rng.standard_normal(shape) * 3 + 1).astype(dtype)
    scale_shape = (shape[1],) if name.startswith("batch") else shape[2:]
    k = rng.uniform(0.5, 2.0, scale_shape).astype(dtype)
    g = rng.standard_normal(shape).astype(dtype)
    ins = {"batch_norm": [x, k, k - 1], "batch_norm_grad": [x, k, g], "batch_norm_dscale": [x, g],
           "layer_norm": [x, k, k - 1], "layer_norm_grad": [x, k, g], "rms_norm": [x, k],
           "rms_norm_grad": [x, k, g]}[name]
    a = {"eps": 1e-5}
    out_type = REGISTRY[name].infer(tuple(map(type_of, ins)), a)
    want, got = np.empty(out_type.shape, dtype), np.empty(out_type.shape, dtype)
    scratch = REGISTRY[name].scratch(tuple(map(type_of, ins)), out_type, a)
    REGISTRY[name].kernel(KernelContext.standalone(np, scratch), ins, want, a)
    fused_kernel(np, name, _CElementwise(tmp_path))(KernelContext.standalone(np, scratch), ins, got, a)
    tolerance = 1e-5 if dtype == np.float32 else 1e-12
    assert np.max(np.abs(got - want)) <= tolerance * np.max(np.abs(want))


_SOFTMAX = ["softmax", "log_softmax", "softmax_grad", "log_softmax_grad", "softmax_cross_entropy_grad"]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name", _SOFTMAX)
@pytest.mark.parametrize("shape,axis", [((2, 3, 5, 7), 3), ((4, 6, 3), 1), ((1, 9), 0)])
def test_each_softmax_composite_computes_its_op(tmp_path: Any, name: str, dtype: Any, shape: tuple[int, ...],
                                                axis: int) -> None:
    """Softmax's, log-softmax's and cross-entropy's fused passes, their CUDA bodies compiled as C, around the
    op's own row maxima and sums: the op's results on NumPy within the load-time check's tolerance (rows of
    scores over 30 apart, as attention's are; cross-entropy's over the last axis, with every class labelled
    somewhere)."""
    from swapdsl.graph.ops.registry import KernelContext, type_of
    from swapdsl.runtime.fused import fused_kernel

    rng = np.random.default_rng(3)
    x = (rng.standard_normal(shape) * 10).astype(dtype)
    g = rng.standard_normal(shape).astype(dtype)
    labels = rng.integers(0, shape[-1], shape[:-1]).astype(np.int64)
    y = np.empty(shape, dtype)
    REGISTRY["log_softmax" if name.startswith("log") else "softmax"].kernel(
        KernelContext.standalone(np, 1 << 16), [x], y, {"axis": axis})
    ins = {"softmax": [x], "log_softmax": [x], "softmax_grad": [y, g], "log_softmax_grad": [y, g],
           "softmax_cross_entropy_grad": [x, labels, np.asarray(0.7, dtype)]}[name]
    a = {} if name.startswith("softmax_cross") else {"axis": axis}
    types = tuple(map(type_of, ins))
    out_type = REGISTRY[name].infer(types, a)
    want, got = np.empty(out_type.shape, dtype), np.empty(out_type.shape, dtype)
    scratch = REGISTRY[name].scratch(types, out_type, a)
    REGISTRY[name].kernel(KernelContext.standalone(np, scratch), ins, want, a)
    fused_kernel(np, name, _CElementwise(tmp_path))(KernelContext.standalone(np, scratch), ins, got, a)
    tolerance = 1e-6 if dtype == np.float32 else 1e-13
    assert np.max(np.abs(got - want)) <= tolerance * np.max(np.abs(want)), np.max(np.abs(got - want))


class _CPieces:
    """NumPy, its ElementwiseKernel compiling a composite kernel's pieces as C (and refusing the rest)."""

    def __init__(self, tmp: Any) -> None:
        self.pieces = _CElementwise(tmp)

    def __getattr__(self, name: str) -> Any:
        return getattr(np, name)

    def ElementwiseKernel(self, params: str, out: str, body: str, name: str, preamble: str = "") -> Any:  # noqa: N802
        from swapdsl.runtime.fused import PIECES

        piece = name.removeprefix("swapdsl_")
        if piece not in PIECES:
            raise RuntimeError(f"{piece} is no composite's piece")
        return self.pieces(params, body, piece)


def test_every_composite_a_transformer_uses_passes_its_load_check(tmp_path: Any) -> None:
    """The load-time check itself (its example shapes, its labels, both checked steps) passes each composite
    kernel tiny_transformer and an LSTM use, their pieces compiled as C: on a GPU, none would be left out."""
    graphs = [_graph(), training_graph(build_graph(str(MODELS / "lstm_lm.swp"), [])[1])]
    for t in graphs:
        found = FusedKernels.load(t, _CPieces(tmp_path))
        composite = {i for i, op in enumerate(t.ops) if op.op in COMPOSITE}
        assert composite and set(found.kernels) == composite, found.notes
        assert all("is no composite's piece" in n for n in found.notes)
