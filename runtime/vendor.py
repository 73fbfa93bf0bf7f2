"""Vendor kernels on CuPy: convolutions and their gradients through NVIDIA's cuDNN Frontend.

When a plan is loaded on CuPy, each convolution op gets a cuDNN graph built
once per distinct shape (``ConvKey``) and executed with device pointers into
the arena: its output in its region, its workspace from the scratch region,
limited to what the op declares (``OpDef.scratch``; engines needing more are
deselected), so the plan's memory promise holds with vendor kernels too.
FP32 convolutions exclude tensor-core engines (TF32), so results stay within
1e-4 of the NumPy reference. Each built graph is checked once, at its own
shapes, against the op's own kernel before any step uses it. Anything that
cannot be built or differs falls back to the op's own kernel, and ``notes``
says which and why; the package is imported only here, lazily, so nothing
else needs it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from types import ModuleType
from typing import Any

import attrs
import numpy as np

from swapdsl.graph.analysis import op_scratch
from swapdsl.graph.ir import Graph, TensorType
from swapdsl.graph.ops.halfbits import from_module, to_module
from swapdsl.graph.ops.kernels import kernel_of, scratch_need
from swapdsl.graph.ops.registry import Array, Attrs, Kernel, KernelContext, Scratch, np_dtype
from swapdsl.plan.program import arena_bytes
from swapdsl.runtime.backend import separate_pool

CONV_OPS = {"conv2d": "fprop", "conv2d_grad_input": "dgrad", "conv2d_grad_weight": "wgrad"}
# half convolutions read and write half tensors (bf16 as its bits: graph/ops/halfbits.py) and compute in f32
_DTYPES = {"f32": "FLOAT", "f64": "DOUBLE", "f16": "HALF", "bf16": "BFLOAT16"}
# How far a graph's output may be from the op's own kernel's at load, relative to its largest element: FP32
# engines (FFT, Winograd, split sums) order their sums otherwise; a half result rounds once either way, so
# the two may differ by one of its ulps (f16 2^-10, bf16 2^-7); TF32 keeps 10 bits of each product's inputs.
TOLERANCE = {"f64": 1e-12, "f32": 1e-4, "f16": 2e-3, "bf16": 1.6e-2}
TF32_TOLERANCE = 1e-2
CHECKED_SAMPLES = 2  # the samples of the batch the check gives values (the rest are zeros)
_WEIGHT = {"fprop": 1, "dgrad": 1, "wgrad": 2}  # where the weight is among (input 0, input 1, output)


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
    if isinstance(a, np.ndarray):  # (ml_dtypes' bf16 has no buffer protocol: its address from the interface)
        return int(a.__array_interface__["data"][0])
    return int(a.data.ptr)


@attrs.define
class VendorKernels:
    """The vendor kernels of a plan's ops (op index -> kernel), and what fell back and why."""

    kernels: dict[int, Kernel] = attrs.field(factory=dict)
    notes: list[str] = attrs.field(factory=list)
    graphs: int = 0  # distinct cuDNN graphs built

    @staticmethod
    def load(g: Graph, stream: Callable[[], int], cudnn: ModuleType | None = None, tf32: bool = False,
             xp: ModuleType | None = None, space: Array | None = None,
             blas_workspace: Array | None = None) -> VendorKernels:
        """Build every convolution's cuDNN graph (once per key); ``stream``: the current stream's handle.
        With ``xp``, each graph is checked against its op's own kernel before it is used (``_disagreement``),
        its arrays taken from ``space`` (a flat byte array: the plan's arena, holding nothing yet; the check
        writes over it) where they fit in it, else from ``xp``'s allocator; the own kernel's products work
        in ``blas_workspace`` (the runner's: cuBLAS takes none of its own)."""
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
        own_pool = separate_pool(xp) if xp is not None else contextlib.nullcontext
        for i, key in keys.items():
            if key not in built:
                with own_pool():  # what the checks allocate is not what a run holds
                    built[key] = _usable(cudnn, handle, g, i, key, stream, tf32, xp, (space, blas_workspace),
                                         found.notes)
            if built[key] is not None:
                found.kernels[i] = _kernel(cudnn, handle, key, built[key], stream)
        found.graphs = sum(b is not None for b in built.values())
        return found


def _usable(cudnn: ModuleType, handle: Any, g: Graph, i: int, key: ConvKey, stream: Callable[[], int], tf32: bool,
            xp: ModuleType | None, space: tuple[Array | None, Array | None], notes: list[str]) -> Built | None:
    """``key``'s graph, built for op ``i`` and (with ``xp``) checked against its own kernel; None, with a note
    saying why, where it cannot be built or differs."""
    where = f"op {i} `{g.ops[i].op}` {list(key.image)}"
    try:
        b = build(cudnn, handle, key, op_scratch(g, i), tf32)
    except Exception as exc:
        notes.append(f"{where}: no cuDNN plan ({exc}); it uses swapdsl's own kernel")
        return None
    if xp is None:
        return b
    try:
        off = _disagreement(xp, g, i, _kernel(cudnn, handle, key, b, stream), b.workspace, *space)
    except Exception as exc:  # the graph fails to execute, or the check cannot drive the op
        notes.append(f"{where}: its cuDNN graph failed its check ({type(exc).__name__}: {exc}); it uses "
                     "swapdsl's own kernel")
        return None
    allowed = TF32_TOLERANCE if tf32 and key.dtype == "f32" else TOLERANCE[key.dtype]
    if not off <= allowed:
        notes.append(f"{where}: its cuDNN graph differs from swapdsl's kernel by {off:.1e} (allowed {allowed:.0e}); "
                     "it uses swapdsl's own kernel")
        return None
    return b


def _disagreement(xp: ModuleType, g: Graph, i: int, vendor: Kernel, workspace: int, space: Array | None,
                  blas_workspace: Array | None = None) -> float:
    """How far ``vendor`` is from op ``i``'s own kernel, relative to the largest output element: the vendor
    kernel at the op's own shapes (the engine a step runs) on random values in the batch's first samples
    and zeros in the rest, the own kernel on those samples alone (a convolution's samples are independent,
    and the rest add nothing to a weight gradient)."""
    op = g.ops[i]
    types = [*(g.type_of(n) for n in op.inputs), g.type_of(op.outputs[0])]
    kind = CONV_OPS[op.op]
    n = min(types[0].shape[0], CHECKED_SAMPLES)  # (the first input is never the weight)
    cut = [t if k == _WEIGHT[kind] else TensorType((n, *t.shape[1:]), t.dtype) for k, t in enumerate(types)]
    *arrays, scratch = _arrays(xp, types, arena_bytes(max(workspace, 1)), space)  # (as the kernel takes it)
    rng = np.random.default_rng(0)
    scale = 1 / np.sqrt(_summed(kind, types, n))  # (each output a sum of under 1: finite in f16 at any size)
    for a, t in zip(arrays[:2], cut):
        a[...] = 0
        a[:t.shape[0]] = to_module(xp, (scale * rng.uniform(0.1, 0.9, t.shape)).astype(np_dtype(np, t.dtype)))
    step = xp.ones((), dtype=xp.int64)
    vendor(KernelContext(xp, Scratch(scratch), step), arrays[:2], arrays[2], op.attr_dict)
    ins = [a[:t.shape[0]] for a, t in zip(arrays[:2], cut)]
    want = xp.empty(cut[2].shape, dtype=np_dtype(xp, cut[2].dtype))
    own = KernelContext(xp, Scratch(xp.zeros(max(scratch_need(op.op, (*cut[:2],), cut[2], op.attr_dict), 1),
                                             dtype=np.uint8)), step, workspace=blas_workspace)
    kernel_of(op.op, (*cut[:2],), cut[2], op.attr_dict)(own, ins, want, op.attr_dict)
    got, ref = _wide(arrays[2][:cut[2].shape[0]]), _wide(want)
    return float(np.max(np.abs(got - ref)) / max(float(np.max(np.abs(ref))), 1e-30))


def _summed(kind: str, types: list[TensorType], n: int) -> int:
    """How many products each output element of the check sums, at most: over the weight's other axes
    (fprop: its input channels; dgrad: its output channels) or the checked samples' output pixels (wgrad)."""
    w = types[_WEIGHT[kind]].shape
    if kind == "wgrad":
        return n * types[1].shape[2] * types[1].shape[3]
    return (w[1] if kind == "fprop" else w[0]) * w[2] * w[3]


def _arrays(xp: ModuleType, types: list[TensorType], workspace: int, space: Array | None) -> list[Array]:
    """Arrays of these types and a workspace of that many bytes: views of ``space`` where they fit in it."""
    sizes = [t.nbytes for t in types] + [workspace]
    if space is None or sum(map(arena_bytes, sizes)) > space.size:
        flat = [xp.zeros(size, dtype=np.uint8) for size in sizes]
    else:
        starts = np.cumsum([0, *map(arena_bytes, sizes)])
        flat = [space[int(a):int(a) + size] for a, size in zip(starts, sizes)]
    return [f.view(np_dtype(xp, t.dtype)).reshape(t.shape) for f, t in zip(flat, types)] + [flat[-1]]


def _wide(a: Array) -> np.ndarray:
    return np.asarray(from_module(a.get() if hasattr(a, "get") else a), dtype=np.float64)


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
