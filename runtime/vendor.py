"""Vendor kernels on CuPy: convolutions and their gradients through NVIDIA's cuDNN Frontend.

When a plan is loaded on CuPy, each convolution op gets a cuDNN graph built
once per distinct shape (``ConvKey``) and executed with device pointers into
the arena: its output in its region, its workspace from the scratch region,
limited to what the op declares (``OpDef.scratch``; engines needing more are
deselected), so the plan's memory promise holds with vendor kernels too.
FP32 convolutions exclude tensor-core engines (TF32), so results stay within
1e-4 of the NumPy reference. Anything that cannot be built falls back to the
op's own kernel, and ``notes`` says which and why; the package is imported
only here, lazily, so nothing else needs it.
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import Any

import attrs
import numpy as np

from swapdsl.graph.analysis import op_scratch
from swapdsl.graph.ir import Graph, TensorType
from swapdsl.graph.ops.registry import Array, Attrs, Kernel, KernelContext

CONV_OPS = {"conv2d": "fprop", "conv2d_grad_input": "dgrad", "conv2d_grad_weight": "wgrad"}
# half convolutions read and write half tensors (bf16 as its bits: graph/ops/halfbits.py) and compute in f32
_DTYPES = {"f32": "FLOAT", "f64": "DOUBLE", "f16": "HALF", "bf16": "BFLOAT16"}


@attrs.frozen
class ConvKey:
    """What a convolution's cuDNN graph depends on: one graph serves every op with the same key."""

    kind: str  # fprop, dgrad or wgrad
    image: tuple[int, ...]  # x: [N, C, H, W]
    weight: tuple[int, ...]  # w: [O, C/groups, KH, KW]
    output: tuple[int, ...]  # y (or its gradient): [N, O, Ho, Wo]
    stride: tuple[int, ...]
    padding: tuple[int, ...]
    dilation: tuple[int, ...]
    dtype: str


def conv_key(op: str, ins: tuple[TensorType, ...], out: TensorType, a: Attrs) -> ConvKey | None:
    """The key of a convolution op on these types, or None if it is not one cuDNN is asked for."""
    kind = CONV_OPS.get(op)
    if kind is None or out.dtype.label not in _DTYPES or any(t.dtype != out.dtype for t in ins):
        return None  # (one graph has one data type for its tensors)
    if kind == "fprop":
        x, w, y = ins[0], ins[1], out
    elif kind == "dgrad":
        y, w, x = ins[0], ins[1], out
    else:
        x, y, w = ins[0], ins[1], out
    return ConvKey(kind, x.shape, w.shape, y.shape, tuple(a["stride"]), tuple(a["padding"]),
                   tuple(a["dilation"]), out.dtype.label)


def contiguous_strides(shape: tuple[int, ...]) -> list[int]:
    strides, step = [], 1
    for d in reversed(shape):
        strides.append(step)
        step *= d
    return strides[::-1]


@attrs.frozen
class Built:
    """A built cuDNN graph and the uids of its image, weight and output tensors."""

    graph: Any
    uids: tuple[int, int, int]
    workspace: int


def build(cudnn: ModuleType, handle: Any, key: ConvKey, budget: int, tf32: bool = False) -> Built:
    """The cuDNN graph for ``key``, using at most ``budget`` bytes of workspace (``tf32``: FP32 may use TF32
    tensor cores); raises where cuDNN cannot."""
    dtype = getattr(cudnn.data_type, _DTYPES[key.dtype])
    compute = cudnn.data_type.DOUBLE if key.dtype == "f64" else cudnn.data_type.FLOAT
    g = cudnn.pygraph(io_data_type=dtype, intermediate_data_type=compute, compute_data_type=compute, handle=handle)

    def tensor(shape: tuple[int, ...]) -> Any:
        return g.tensor(dim=list(shape), stride=contiguous_strides(shape), data_type=dtype)

    geometry = {"pre_padding": list(key.padding), "post_padding": list(key.padding), "stride": list(key.stride),
                "dilation": list(key.dilation)}
    if key.kind == "fprop":
        x, w = tensor(key.image), tensor(key.weight)
        y = g.conv_fprop(image=x, weight=w, **geometry)
        made, shape = y, key.output
    elif key.kind == "dgrad":
        y, w = tensor(key.output), tensor(key.weight)
        x = g.conv_dgrad(loss=y, filter=w, **geometry)
        made, shape = x, key.image
    else:
        x, y = tensor(key.image), tensor(key.output)
        w = g.conv_wgrad(image=x, loss=y, **geometry)
        made, shape = w, key.weight
    made.set_output(True).set_data_type(dtype).set_dim(list(shape)).set_stride(contiguous_strides(shape))
    g.validate()
    g.build_operation_graph()
    g.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
    if key.dtype == "f32" and not tf32:
        g.deselect_numeric_notes([cudnn.numerical_note.TENSOR_CORE])  # FP32 stays FP32: no TF32
    if key.dtype in ("f16", "bf16"):  # partial sums in f32 too: the result rounded to half once
        g.deselect_numeric_notes([cudnn.numerical_note.REDUCED_PRECISION_REDUCTION])
    g.deselect_workspace_greater_than(budget)
    g.check_support()
    g.build_plans()
    workspace = int(g.get_workspace_size())
    if workspace > budget:
        raise RuntimeError(f"its workspace of {workspace} bytes is over the op's scratch of {budget}")
    return Built(g, (x.get_uid(), w.get_uid(), y.get_uid()), workspace)


def pointer(a: Array) -> int:
    """A device array's address (a host array's, for tests)."""
    data = a.data
    return int(data.ptr) if hasattr(data, "ptr") else int(a.ctypes.data)


@attrs.define
class VendorKernels:
    """The vendor kernels of a plan's ops (op index -> kernel), and what fell back and why."""

    kernels: dict[int, Kernel] = attrs.field(factory=dict)
    notes: list[str] = attrs.field(factory=list)
    graphs: int = 0  # distinct cuDNN graphs built

    @staticmethod
    def load(g: Graph, stream: Callable[[], int], cudnn: ModuleType | None = None,
             tf32: bool = False) -> VendorKernels:
        """Build every convolution's cuDNN graph (once per key); ``stream``: the current stream's handle."""
        found = VendorKernels()
        keys = {i: conv_key(op.op, tuple(g.type_of(n) for n in op.inputs), g.type_of(op.outputs[0]), op.attr_dict)
                for i, op in enumerate(g.ops)}
        keys = {i: k for i, k in keys.items() if k is not None}
        if not keys:
            return found
        if cudnn is None:
            try:
                import cudnn  # type: ignore[import-not-found,no-redef]
            except Exception as exc:  # not installed, or no cuDNN library behind it
                found.notes.append(f"cuDNN Frontend unavailable ({type(exc).__name__}: {exc}); convolutions use "
                                   "swapdsl's own kernels")
                return found
        try:
            handle = cudnn.create_handle()
        except Exception as exc:  # the frontend imports, but no libcudnn (or no device) stands behind it
            found.notes.append(f"cuDNN handle unavailable ({type(exc).__name__}: {exc}); convolutions use "
                               "swapdsl's own kernels")
            return found
        built: dict[ConvKey, Built | None] = {}
        for i, key in keys.items():
            if key not in built:
                try:
                    built[key] = build(cudnn, handle, key, op_scratch(g, i), tf32)
                except Exception as exc:
                    built[key] = None
                    found.notes.append(f"op {i} `{g.ops[i].op}` {list(key.image)}: no cuDNN plan ({exc}); it uses "
                                       "swapdsl's own kernel")
            if built[key] is not None:
                found.kernels[i] = _kernel(cudnn, handle, key, built[key], stream)
        found.graphs = sum(b is not None for b in built.values())
        return found


def _kernel(cudnn: ModuleType, handle: Any, key: ConvKey, b: Built, stream: Callable[[], int]) -> Kernel:
    """The kernel that runs a built graph: the image, weight and output found among the op's arrays."""
    roles = {"fprop": (0, 1, -1), "dgrad": (-1, 1, 0), "wgrad": (0, -1, 1)}[key.kind]
    uids = b.uids

    def run(c: KernelContext, ins: list[Array], out: Array, a: Attrs) -> None:
        arrays = [out if r == -1 else ins[r] for r in roles]
        workspace = c.scratch.take((max(b.workspace, 1),), np.uint8)
        cudnn.set_stream(handle=handle, stream=stream())
        b.graph.execute({uid: pointer(x) for uid, x in zip(uids, arrays)}, pointer(workspace), handle=handle)

    return run
