"""Fused element-wise kernels (CuPy), as far as a CPU can check them: every one stands for a registered
op with the op's inputs, and one that does not match its op's own kernel, or fails to build, is left out
with a note instead of being used."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np

from conftest import MODELS, build_graph
from swapdsl.graph.autodiff import training_graph
from swapdsl.graph.ops import REGISTRY
from swapdsl.runtime.fused import FUSED, FusedKernels


def test_every_fused_kernel_is_a_registered_element_wise_op_with_its_inputs() -> None:
    for name, f in FUSED.items():
        op = REGISTRY[name]
        params = [p.split()[-1] for p in f.params.split(",")]
        arity = op.arity[0]
        assert op.arity == (arity, arity)
        assert len(params) >= arity and "y" not in params and "y =" in f.body


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
    fusable = {op.op for op in t.ops if op.op in FUSED}
    assert fusable and not found.kernels  # copying the input matches no op
    assert {n.split("`")[1] for n in found.notes} == fusable
    assert all("differs by" in n for n in found.notes)


def test_a_fused_kernel_that_fails_to_build_is_not_used() -> None:
    found = FusedKernels.load(_graph(), _BrokenCompiler())
    assert not found.kernels and found.notes and all("nvrtc: error" in n for n in found.notes)
