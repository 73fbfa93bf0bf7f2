"""An ONNX file, read and checked: its inputs (with symbolic sizes), weights, nodes and outputs."""

from __future__ import annotations

import re
import stat
from pathlib import Path
from typing import Any

import attrs
import numpy as np

from swapdsl.common.errors import SwpError

MIN_OPSET = 13  # Squeeze, Unsqueeze, Split and ReduceSum take their axes as inputs from 13 on
MAX_BYTES = 1 << 34

# ONNX TensorProto element types swapdsl has
DTYPES = {1: "f32", 11: "f64", 10: "f16", 16: "bf16", 6: "i32", 7: "i64"}


@attrs.frozen
class Input:
    name: str
    dtype: str
    dims: tuple[int | str, ...]  # a str is a symbolic size (dim_param)


@attrs.frozen
class Source:
    path: str
    name: str
    opset: int
    producer: str
    inputs: tuple[Input, ...]
    weights: dict[str, np.ndarray] = attrs.field(repr=False)
    nodes: tuple[Any, ...] = attrs.field(repr=False)  # onnx NodeProto, in the file's (topological) order
    outputs: tuple[str, ...]
    buffers: frozenset[str] = frozenset()  # initialisers torch.export calls buffers or constants: not trained
    rewritten: tuple[str, ...] = ()  # weights the dynamo exporter's optimiser made (``_rewritten``)


def read_onnx(path: str) -> Source:
    """The file's graph, or a clear error saying why it cannot be imported."""
    onnx = _onnx()
    p = Path(path)
    try:
        st = p.stat()
    except (FileNotFoundError, NotADirectoryError):
        raise SwpError(f"`{path}`: no such ONNX file") from None
    if stat.S_ISDIR(st.st_mode):
        raise SwpError(f"`{path}` is a directory, not an ONNX file")
    if not stat.S_ISREG(st.st_mode):  # (a FIFO or a device: the read would block, or never end)
        raise SwpError(f"`{path}` is not a regular file")
    if st.st_size > MAX_BYTES:
        raise SwpError(f"`{path}` is {st.st_size} bytes, more than the {MAX_BYTES} an import reads")
    try:
        model = onnx.load(str(p))
        onnx.checker.check_model(model)
    except Exception as exc:  # noqa: BLE001 (protobuf, checker and external-data errors have no common base)
        first = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__
        raise SwpError(f"`{path}` is not a valid ONNX model: {first}") from None
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    if opset < MIN_OPSET:
        raise SwpError(f"`{path}` uses ONNX opset {opset}; swapdsl imports opset {MIN_OPSET} and later",
                       hints=["export again with `torch.onnx.export(..., opset_version=17)`"])
    g = model.graph
    weights = {t.name: _array(onnx, t, path) for t in g.initializer}
    inputs = tuple(_input(v, path) for v in g.input if v.name not in weights)
    if not inputs:
        raise SwpError(f"`{path}` has no inputs besides its weights")
    return Source(str(p), g.name or p.stem, opset, f"{model.producer_name} {model.producer_version}".strip(),
                  inputs, weights, tuple(g.node), tuple(o.name for o in g.output), _buffers(g),
                  _rewritten(g, weights))


def _signature(graph: Any) -> str:
    """The dynamo exporter's graph signature (its parameters, buffers and inputs), or ''."""
    signature = next((p.value for p in graph.metadata_props
                      if p.key == "pkg.torch.export.ExportedProgram.graph_signature"), "")
    if isinstance(signature, bytes):  # protobuf hands back a string that is not UTF-8 as bytes
        signature = signature.decode("utf-8", "replace")
    return signature


def _targets(graph: Any, kinds: str) -> frozenset[str]:
    """The names the dynamo exporter's graph signature gives values of these kinds (`BUFFER|PARAMETER`)."""
    return frozenset(re.findall(rf": (?:{kinds}) target='([^']+)'", _signature(graph)))


def _buffers(graph: Any) -> frozenset[str]:
    """The initialisers the dynamo exporter's graph signature names as buffers (rotary frequencies, masks)."""
    return _targets(graph, "BUFFER|CONSTANT_TENSOR")


def _rewritten(graph: Any, weights: dict[str, np.ndarray]) -> tuple[str, ...]:
    """Weights of a dynamo export its optimiser made (``optimize=True``, the default): those its signature
    does not name (`val_6`, a transposed copy; `mul`, a folded constant), scalars aside. Equal weights it
    merged leave no trace but a name missing, as a tied weight does: not told apart."""
    targets = _targets(graph, "PARAMETER|BUFFER|CONSTANT_TENSOR")
    return tuple(k for k, v in weights.items() if k not in targets and v.size > 1) if targets else ()


def _onnx() -> Any:
    try:
        import onnx
    except ImportError:
        raise SwpError("importing ONNX needs the `onnx` package",
                       hints=["pip install 'swapdsl[import]'"]) from None
    return onnx


def _array(onnx: Any, t: Any, path: str) -> np.ndarray:
    from onnx import numpy_helper

    try:
        return np.asarray(numpy_helper.to_array(t))
    except Exception as exc:  # noqa: BLE001
        raise SwpError(f"`{path}`: weight `{t.name}` cannot be read: {str(exc)[:200]}") from None


def _input(v: Any, path: str) -> Input:
    tt = v.type.tensor_type
    if not v.type.HasField("tensor_type") or tt.elem_type not in DTYPES:
        raise SwpError(f"`{path}`: input `{v.name}` is not a tensor of a type swapdsl has",
                       hints=[f"types: {', '.join(sorted(set(DTYPES.values())))}"])
    if not tt.HasField("shape"):
        raise SwpError(f"`{path}`: input `{v.name}` has no shape; swapdsl plans static shapes")
    dims: list[int | str] = []
    for d in tt.shape.dim:
        if d.HasField("dim_value") and d.dim_value > 0:
            dims.append(int(d.dim_value))
        elif d.HasField("dim_param") and d.dim_param:
            dims.append(d.dim_param)
        else:
            raise SwpError(f"`{path}`: input `{v.name}` has a dimension with neither a size nor a name")
    return Input(v.name, DTYPES[tt.elem_type], tuple(dims))
