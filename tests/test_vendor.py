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


class ComputingCudnn(FakeCudnn):
    """A stand-in that computes: each graph runs swapdsl's own kernel on the arrays behind the pointers it is
    given (host memory on NumPy), at the graph's own shapes; ``fault`` makes it wrong in one way."""

    def __init__(self, fault: str | None = None, scale: float = 0.0) -> None:
        super().__init__()
        self.fault, self.scale, self.addresses = fault, scale, []
        made = self.pygraph
        outer = self

        class computing(made):  # noqa: N801
            def _op(self, name: str, **kw: Any) -> _Tensor:
                self.kind, self.kw, made_tensor = name, kw, super()._op(name, **kw)
                self.made = made_tensor
                return made_tensor

            def execute(self, pack: dict[int, int], workspace: int, handle: Any) -> None:
                outer.addresses += list(pack.values())
                if outer.fault == "raise":
                    raise RuntimeError("CUDNN_STATUS_EXECUTION_FAILED")
                outer.compute(self, pack)

        self.pygraph = computing

    def compute(self, graph: Any, pack: dict[int, int]) -> None:
        import ctypes

        from swapdsl.graph.ir import TensorType
        from swapdsl.graph.ops.kernels import kernel_of, scratch_need
        from swapdsl.graph.ops.registry import np_dtype
        from swapdsl.graph.ir import DType

        label = graph.calls[0][1]["io_data_type"]
        kw = graph.kw
        names = {"conv_fprop": ("image", "weight"), "conv_dgrad": ("loss", "filter"), "conv_wgrad": ("image", "loss")}
        tensors = [kw[n] for n in names[graph.kind]] + [graph.made]

        def array(t: _Tensor) -> np.ndarray:
            dtype = np.dtype(np_dtype(np, label))
            n = int(np.prod(t.dim)) * dtype.itemsize
            raw = np.ctypeslib.as_array((ctypes.c_uint8 * n).from_address(pack[t.uid]))
            return raw.view(dtype).reshape(t.dim)

        ins, out = [array(t) for t in tensors[:2]], array(tensors[2])
        image = tensors[2].dim if graph.kind == "conv_dgrad" else tensors[0].dim
        weight = tensors[1].dim if graph.kind != "conv_wgrad" else tensors[2].dim
        a = {"stride": tuple(kw["stride"]), "padding": tuple(kw["pre_padding"]), "dilation": tuple(kw["dilation"]),
             "groups": image[1] // weight[1], "input_hw": tuple(image[2:]), "kernel": tuple(weight[2:])}
        op = {"conv_fprop": "conv2d", "conv_dgrad": "conv2d_grad_input", "conv_wgrad": "conv2d_grad_weight"}[graph.kind]
        types = tuple(TensorType(tuple(x.shape), DType[label]) for x in ins)
        out_t = TensorType(tuple(out.shape), DType[label])
        ctx = KernelContext.standalone(np, scratch_need(op, types, out_t, a))
        if self.fault == "convolution" and op != "conv2d_grad_weight":  # a true convolution: the filter flipped
            ins[1] = np.ascontiguousarray(ins[1][:, :, ::-1, ::-1])
        kernel_of(op, types, out_t, a)(ctx, ins, out, a)
        if self.fault == "convolution" and op == "conv2d_grad_weight":
            out[...] = out[:, :, ::-1, ::-1].copy()
        if self.scale:
            out[...] = (out.astype(np.float64) * (1 + self.scale)).astype(out.dtype)


def resnet_at(batch: int, precision: str = "f32") -> Any:
    import swapdsl

    return swapdsl.load(MODELS / "tiny_resnet.swp", {"batch": batch, "width": 4, "blocks": 1},
                        precision=precision).training


@pytest.mark.parametrize("precision, bits", [("f32", False), ("bf16", False), ("bf16", True), ("f16", False)])
def test_a_graph_that_computes_the_convolution_passes_its_check(precision: str, bits: bool) -> None:
    """The check runs each graph at its own shapes, in the arena it is given, on a batch whose first two samples
    hold values; the op's own kernel on those two alone gives the same numbers (the samples are independent).
    ``bits``: bf16 as its bits in uint16 arrays, as on CuPy."""
    from test_halfbits import BITS_NP

    t = resnet_at(5, precision)
    space = np.zeros(1 << 22, np.uint8)
    fake = ComputingCudnn()
    vendor = VendorKernels.load(t, lambda: 0, cudnn=fake, xp=BITS_NP if bits else np, space=space)
    assert set(vendor.kernels) == set(conv_ops(t)) and not vendor.notes
    lo, hi = space.ctypes.data, space.ctypes.data + space.size
    assert fake.addresses and all(lo <= p < hi for p in fake.addresses)  # the arena, not new memory


def test_the_checks_own_kernel_works_in_the_runners_cublas_workspace(monkeypatch: pytest.MonkeyPatch) -> None:
    """The op's own kernel the check holds a graph to multiplies through cuBLAS on CUDA: it is handed the
    runner's workspace, so cuBLAS takes none of its own beside the arena for the rest of the run (without one,
    none is bound: cuBLAS's own pool)."""
    from swapdsl.graph.ops import blas

    seen: list[Any] = []

    def cublas(xp: Any, calls: Any, a: Any, b: Any, c: Any, tf32: bool, accumulate: bool = False,
               workspace: Any = None) -> None:
        seen.append(workspace)
        np.matmul(np.asarray(b), np.asarray(a), out=c)  # (c = b a, row-major: matmul_into's x @ y)

    monkeypatch.setattr(blas, "_cublas", cublas)
    monkeypatch.setattr(blas, "on_cuda", lambda xp: True)
    workspace = np.zeros(4096, np.uint8)
    t = resnet_at(3)
    vendor = VendorKernels.load(t, lambda: 0, cudnn=ComputingCudnn(), xp=np, blas_workspace=workspace)
    assert set(vendor.kernels) == set(conv_ops(t)) and not vendor.notes, vendor.notes
    mine = [w for w in seen if w is workspace]  # (the stand-in cuDNN computes by the same kernel, unbound)
    assert mine and len(mine) < len(seen)
    seen.clear()
    VendorKernels.load(t, lambda: 0, cudnn=ComputingCudnn(), xp=np)
    assert seen and all(w is None for w in seen)


@pytest.mark.parametrize("fault, scale, precision, fails", [
    ("convolution", 0.0, "f32", True),  # a true convolution (the filter flipped) where the op correlates
    (None, 1e-3, "f32", True),  # FP32 off by 1e-3: refused
    (None, 1e-3, "bf16", False),  # within one bf16 ulp: accepted
    (None, 4e-2, "bf16", True),
    ("raise", 0.0, "f32", True),
])
def test_a_graph_that_differs_from_the_op_falls_back_with_a_note(fault: str | None, scale: float, precision: str,
                                                                 fails: bool) -> None:
    t = resnet_at(3, precision)
    vendor = VendorKernels.load(t, lambda: 0, cudnn=ComputingCudnn(fault, scale), xp=np)
    if not fails:
        assert set(vendor.kernels) == set(conv_ops(t)) and not vendor.notes
        return
    weights = {i: t.type_of(t.ops[i].inputs[1] if t.ops[i].op != "conv2d_grad_weight" else t.ops[i].outputs[0])
               for i in conv_ops(t)}
    wrong = {i for i, w in weights.items() if fault != "convolution" or w.shape[2:] != (1, 1)}  # (1x1: no flip)
    assert wrong and not wrong & set(vendor.kernels) and vendor.notes
    said = "CUDNN_STATUS_EXECUTION_FAILED" if fault == "raise" else "differs from swapdsl's kernel"
    assert all(said in n and "own kernel" in n for n in vendor.notes), vendor.notes


def test_a_large_half_weight_gradient_is_checked_on_values_that_stay_finite() -> None:
    """A weight gradient sums over every output pixel of the checked samples: at 400x400, values near 1 would
    overflow f16 (65504) in both kernels, and inf - inf would refuse a correct graph. The check scales its
    values to the number of products each output sums."""
    import swapdsl

    t = swapdsl.load(MODELS / "tiny_resnet.swp", {"batch": 2, "width": 1, "blocks": 1, "image": 400},
                     precision="f16").training
    vendor = VendorKernels.load(t, lambda: 0, cudnn=ComputingCudnn(), xp=np)
    assert set(vendor.kernels) == set(conv_ops(t)) and not vendor.notes, vendor.notes


def test_a_check_that_does_not_fit_the_space_given_allocates_its_own() -> None:
    t = resnet_at(3)
    space = np.zeros(64, np.uint8)
    fake = ComputingCudnn()
    vendor = VendorKernels.load(t, lambda: 0, cudnn=fake, xp=np, space=space)
    assert set(vendor.kernels) == set(conv_ops(t)) and not vendor.notes
    assert not any(space.ctypes.data <= p < space.ctypes.data + 64 for p in fake.addresses) and not space.any()
