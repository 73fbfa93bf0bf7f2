"""The cuDNN Frontend path, as far as it runs without a GPU: which ops get which graph (one per shape),
the workspace each may use (its op's declared scratch), what it is given to execute, and every fallback.
A stand-in for the `cudnn` module records what swapdsl asks of it."""

from __future__ import annotations

import sys
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from conftest import MODELS, build_graph
from swapdsl.graph.analysis import op_scratch
from swapdsl.graph.autodiff import training_graph
from swapdsl.graph.ops.registry import KernelContext
from swapdsl.runtime.vendor import CONV_OPS, VendorKernels, conv_key, contiguous_strides


class _Tensor:
    uids = iter(range(1, 10**6))

    def __init__(self, dim: list[int] | None = None) -> None:
        self.uid, self.dim, self.output = next(_Tensor.uids), dim, False

    def get_uid(self) -> int:
        return self.uid

    def set_output(self, flag: bool) -> _Tensor:
        self.output = flag
        return self

    def set_data_type(self, dtype: Any) -> _Tensor:
        return self

    def set_dim(self, dim: list[int]) -> _Tensor:
        self.dim = dim
        return self

    def set_stride(self, stride: list[int]) -> _Tensor:
        self.stride = stride
        return self


class FakeCudnn:
    """Records graphs built and executions; ``workspace`` and ``refuse`` steer what it answers."""

    data_type = SimpleNamespace(FLOAT="f32", HALF="f16", BFLOAT16="bf16", DOUBLE="f64")
    heur_mode = SimpleNamespace(A="A", FALLBACK="FALLBACK")
    numerical_note = SimpleNamespace(TENSOR_CORE="TENSOR_CORE", REDUCED_PRECISION_REDUCTION="REDUCED")

    def __init__(self, workspace: int = 0, refuse: str | None = None) -> None:
        self.workspace, self.refuse = workspace, refuse
        self.graphs: list[Any] = []
        self.executed: list[tuple[dict[int, int], int]] = []
        self.streams: list[int] = []
        outer = self

        class pygraph:  # noqa: N801  (the module's own name)
            def __init__(self, **kw: Any) -> None:
                self.calls: list[tuple[str, Any]] = [("new", kw)]
                outer.graphs.append(self)

            def tensor(self, dim: list[int], stride: list[int], data_type: Any) -> _Tensor:
                assert stride == contiguous_strides(tuple(dim))
                return _Tensor(dim)

            def _op(self, name: str, **kw: Any) -> _Tensor:
                self.calls.append((name, kw))
                if outer.refuse == name:
                    raise RuntimeError(f"{name} not supported")
                return _Tensor()

            def conv_fprop(self, **kw: Any) -> _Tensor:
                return self._op("conv_fprop", **kw)

            def conv_dgrad(self, **kw: Any) -> _Tensor:
                return self._op("conv_dgrad", **kw)

            def conv_wgrad(self, **kw: Any) -> _Tensor:
                return self._op("conv_wgrad", **kw)

            def __getattr__(self, name: str) -> Any:  # validate, build_operation_graph, ... : recorded
                return lambda *args: self.calls.append((name, args))

            def get_workspace_size(self) -> int:
                return outer.workspace

            def execute(self, pack: dict[int, int], workspace: int, handle: Any) -> None:
                outer.executed.append((pack, workspace))

        self.pygraph = pygraph

    def create_handle(self) -> str:
        return "handle"

    def set_stream(self, handle: Any, stream: int) -> None:
        self.streams.append(stream)


def resnet_training() -> Any:
    return training_graph(build_graph(str(MODELS / "tiny_resnet.swp"), ["batch=2", "width=4", "blocks=1"])[1])


def conv_ops(t: Any) -> list[int]:
    return [i for i, op in enumerate(t.ops) if op.op in CONV_OPS]


def test_one_graph_per_distinct_shape_and_every_convolution_gets_it() -> None:
    t = resnet_training()
    fake = FakeCudnn()
    vendor = VendorKernels.load(t, lambda: 7, cudnn=fake)
    convs = conv_ops(t)
    keys = {conv_key(t.ops[i].op, tuple(t.type_of(n) for n in t.ops[i].inputs), t.type_of(t.ops[i].outputs[0]),
                     t.ops[i].attr_dict) for i in convs}
    assert set(vendor.kernels) == set(convs) and not vendor.notes
    assert len(fake.graphs) == vendor.graphs == len(keys) < len(convs)  # shared by equal shapes
    kinds = {call[0] for g in fake.graphs for call in g.calls}
    assert {"conv_fprop", "conv_dgrad", "conv_wgrad", "build_plans", "check_support"} <= kinds


def test_each_graph_may_use_no_more_workspace_than_its_op_declares() -> None:
    t = resnet_training()
    fake = FakeCudnn()
    VendorKernels.load(t, lambda: 7, cudnn=fake)
    budgets = [args[0] for g in fake.graphs for name, args in g.calls if name == "deselect_workspace_greater_than"]
    assert len(budgets) == len(fake.graphs)
    first_of_each = {}
    for i in conv_ops(t):
        op = t.ops[i]
        key = conv_key(op.op, tuple(t.type_of(n) for n in op.inputs), t.type_of(op.outputs[0]), op.attr_dict)
        first_of_each.setdefault(key, op_scratch(t, i))
    assert budgets == list(first_of_each.values())
    # FP32 graphs exclude tensor-core (TF32) engines
    assert all(("deselect_numeric_notes", (["TENSOR_CORE"],)) in g.calls for g in fake.graphs)


def test_the_kernel_executes_on_the_arrays_own_memory_and_takes_its_workspace_from_scratch() -> None:
    t = resnet_training()
    fake = FakeCudnn(workspace=512)
    vendor = VendorKernels.load(t, lambda: 42, cudnn=fake)
    i = next(i for i in conv_ops(t) if t.ops[i].op == "conv2d_grad_input")
    op = t.ops[i]
    ins = [np.zeros(t.type_of(n).shape, np.float32) for n in op.inputs]
    out = np.zeros(t.type_of(op.outputs[0]).shape, np.float32)
    ctx = KernelContext.standalone(np, op_scratch(t, i))
    vendor.kernels[i](ctx, ins, out, op.attr_dict)
    pack, workspace = fake.executed[-1]
    addresses = set(pack.values())
    assert addresses == {ins[0].ctypes.data, ins[1].ctypes.data, out.ctypes.data}  # dy, w and dx
    assert workspace == ctx.scratch.buffer.ctypes.data and ctx.scratch.used >= 512
    assert fake.streams == [42]


@pytest.mark.parametrize("refuse", ["conv_wgrad"])
def test_an_unsupported_graph_falls_back_to_the_ops_own_kernel_and_says_so(refuse: str) -> None:
    t = resnet_training()
    vendor = VendorKernels.load(t, lambda: 0, cudnn=FakeCudnn(refuse=refuse))
    wgrads = [i for i in conv_ops(t) if t.ops[i].op == "conv2d_grad_weight"]
    assert wgrads and not set(wgrads) & set(vendor.kernels)
    assert set(vendor.kernels) == set(conv_ops(t)) - set(wgrads)
    assert vendor.notes and all("conv2d_grad_weight" in n and "not supported" in n for n in vendor.notes)


def test_a_workspace_over_the_declared_scratch_falls_back() -> None:
    t = resnet_training()
    vendor = VendorKernels.load(t, lambda: 0, cudnn=FakeCudnn(workspace=1 << 40))
    keys = {conv_key(t.ops[i].op, tuple(t.type_of(n) for n in t.ops[i].inputs), t.type_of(t.ops[i].outputs[0]),
                     t.ops[i].attr_dict) for i in conv_ops(t)}
    assert not vendor.kernels and vendor.graphs == 0 and len(vendor.notes) == len(keys)  # one note per graph
    assert all("over the op's scratch" in n for n in vendor.notes)


def test_without_the_package_every_convolution_keeps_its_own_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "cudnn", None)  # import cudnn now fails
    vendor = VendorKernels.load(resnet_training(), lambda: 0)
    assert not vendor.kernels and len(vendor.notes) == 1 and "cuDNN Frontend unavailable" in vendor.notes[0]


def test_a_frontend_without_its_library_falls_back_with_a_note() -> None:
    """The frontend package imports, but creating a handle fails (no libcudnn behind it): every convolution
    keeps its own kernel and the run says why, instead of failing to start."""
    class NoLibrary(FakeCudnn):
        def create_handle(self) -> str:
            raise RuntimeError("libcudnn.so.9: cannot open shared object file")

    vendor = VendorKernels.load(resnet_training(), lambda: 0, cudnn=NoLibrary())
    assert not vendor.kernels and len(vendor.notes) == 1 and "libcudnn.so.9" in vendor.notes[0]


def test_a_model_without_convolutions_needs_nothing() -> None:
    t = training_graph(build_graph(str(MODELS / "mlp.swp"), ["batch=8", "features=32", "hidden=16"])[1])
    vendor = VendorKernels.load(t, lambda: 0, cudnn=FakeCudnn(refuse="conv_fprop"))
    assert not vendor.kernels and not vendor.notes


@pytest.mark.parametrize("precision", ["bf16", "f16"])
def test_half_convolutions_get_half_graphs_computing_in_f32(precision: str) -> None:
    """A half model's convolutions read and write half tensors in cuDNN (bf16 as its bits on CuPy), computing
    in f32, tensor cores allowed; none stays on swapdsl's own kernel."""
    import swapdsl

    t = swapdsl.load(MODELS / "tiny_resnet.swp", {"batch": 2, "width": 4, "blocks": 1}, precision=precision).training
    half = [i for i in conv_ops(t) if t.type_of(t.ops[i].outputs[0]).dtype.label == precision]
    assert half
    fake = FakeCudnn()
    vendor = VendorKernels.load(t, lambda: 7, cudnn=fake)
    assert set(half) <= set(vendor.kernels) and not vendor.notes
    made = [g.calls[0][1] for g in fake.graphs if g.calls[0][1]["io_data_type"] == precision]
    assert made and all(kw["compute_data_type"] == kw["intermediate_data_type"] == "f32" for kw in made)
    deselected = [args for g in fake.graphs if g.calls[0][1]["io_data_type"] == precision
                  for name, args in g.calls if name == "deselect_numeric_notes"]
    assert deselected and all(args == (["REDUCED"],) for args in deselected)  # (tensor cores stay)


def test_tf32_is_an_opt_in() -> None:
    """Only with tf32 asked for may FP32 graphs keep tensor-core (TF32) engines."""
    t = resnet_training()
    fake = FakeCudnn()
    VendorKernels.load(t, lambda: 0, cudnn=fake, tf32=True)
    assert not any(name == "deselect_numeric_notes" for g in fake.graphs for name, _ in g.calls)
