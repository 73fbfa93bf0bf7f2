"""What lowering an ONNX graph keeps as it walks: values by ONNX name, the `.swp` lines written, the
parameters declared, and readable names."""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Mapping
from typing import Any

import attrs
import numpy as np

from swapdsl.common.errors import SwpError
from swapdsl.importer.onnx_read import DTYPES, Source
from swapdsl.lang.builtins import BUILTINS

KEYWORDS = frozenset({"and", "as", "assert", "def", "else", "false", "for", "if", "import", "in", "input",
                      "minimize", "model", "not", "or", "output", "param", "report", "return", "true", "with",
                      "range", "len", "min", "max", "int", "prod", "pair", "batch", "loss"})
RESERVED = KEYWORDS | frozenset(BUILTINS)


@attrs.frozen
class Tensor:
    """A value the model computes: its `.swp` name, static shape and dtype."""

    name: str
    shape: tuple[int, ...]
    dtype: str


@attrs.frozen
class NanTest:
    """IsNaN of a tensor, which only a Where that puts a constant where it holds may read."""

    of: Tensor


@attrs.frozen
class TensorList:
    """SplitToSequence's pieces, which SequenceAt reads one at a time."""

    items: tuple[Tensor, ...]


Value = Tensor | NanTest | TensorList | np.ndarray  # an array: a constant, folded at import


def swp_dtype(a: np.ndarray) -> str:
    kinds = {"float32": "f32", "float64": "f64", "float16": "f16", "bfloat16": "bf16", "int32": "i32",
             "int64": "i64"}
    if a.dtype.name not in kinds:
        raise SwpError(f"a constant of type {a.dtype.name} has no swapdsl dtype")
    return kinds[a.dtype.name]


def np_dtype(name: str) -> Any:
    if name == "bf16":
        import ml_dtypes

        return ml_dtypes.bfloat16
    return {"f32": np.float32, "f64": np.float64, "f16": np.float16, "i32": np.int32, "i64": np.int64}[name]


class Lowering:
    """The state of one walk: values by ONNX name, the lines written, the parameters declared."""

    def __init__(self, src: Source, sizes: Mapping[str, int], freeze: str | None = None) -> None:
        self.src = src
        self.freeze = re.compile(freeze) if freeze else None
        self.frozen: list[str] = []
        self.frozen_by_pattern = 0
        self.env: dict[str, Value] = dict(src.weights)
        # what training changes: the initialisers besides torch.export's buffers, and the aliases exporters
        # give equal ones through Identity
        self.weights = set(src.weights) - src.buffers
        self.lines: list[str] = []
        self.scopes: list[tuple[str, ...]] = []  # the module each line came from (`blocks`)
        self.producer: dict[str, Any] = {}  # ONNX value name -> the node that made it
        self.slices: dict[str, tuple[str, int, int, int]] = {}  # a one-axis slice: (of, axis, start, stop)
        self.classes: dict[tuple[str, ...], str] = {}  # a module's class, where the exporter says
        self.params: dict[str, np.ndarray] = {}  # swp name -> value
        self.param_of: dict[str, str] = {}  # ONNX weight name -> swp name
        self.computed: dict[tuple[Any, ...], str] = {}  # a computed constant's value -> its parameter
        self.folded_from: dict[str, tuple[str, str]] = {}  # a constant folded from a weight -> (weight, first op)
        self.running: dict[str, tuple[np.ndarray, np.ndarray]] = {}  # batch norm scale param -> (mean, var)
        self.taken: set[str] = set(RESERVED)
        self.inputs: list[tuple[str, Tensor]] = []
        self.notes: list[str] = []
        for i in src.inputs:
            shape = tuple(sizes["batch"] if k == 0 else sizes[d] if isinstance(d, str) else d
                          for k, d in enumerate(i.dims))
            t = Tensor(self.fresh(i.name), shape, i.dtype)
            self.env[i.name] = t
            self.inputs.append((i.name, t))

    @functools.cached_property
    def readers(self) -> dict[str, list[Any]]:
        """ONNX value name -> the nodes that read it."""
        out: dict[str, list[Any]] = {}
        for node in self.src.nodes:
            for name in dict.fromkeys(node.input):
                out.setdefault(name, []).append(node)
        return out

    # -- names

    def fresh(self, onnx_name: str) -> str:
        """A readable, unused `.swp` name for an ONNX value or node name."""
        base = readable(onnx_name)
        base = f"{base}_out" if base in RESERVED else base
        name, n = base, 1
        while name in self.taken:
            n += 1
            name = f"{base}_{n}"
        self.taken.add(name)
        return name

    # -- values

    def get(self, node: Any, i: int) -> Value | None:
        if i >= len(node.input) or not node.input[i]:
            return None
        if node.input[i] not in self.env:
            raise SwpError(f"node `{node.name or node.op_type}` reads `{node.input[i]}`, which nothing before it "
                           "makes")
        return self.env[node.input[i]]

    def tensor(self, node: Any, i: int, shape: tuple[int, ...] | None = None) -> Tensor:
        """Input ``i`` as a tensor of the model: a weight becomes a parameter (``shape``: declared so)."""
        v = self.get(node, i)
        if v is None:
            raise unsupported(node, f"input {i} is missing")
        if isinstance(v, Tensor):
            return v
        if isinstance(v, NanTest):
            raise unsupported(node, f"input {i} is an IsNaN test, which swapdsl imports only as Where's condition")
        if isinstance(v, TensorList):
            raise unsupported(node, f"input {i} is a sequence, which swapdsl imports only as SequenceAt's input")
        if not np.issubdtype(v.dtype, np.floating) and v.dtype.name != "bfloat16":
            raise unsupported(node, f"input {i} is an integer constant where a tensor is expected")
        return self.param(node.input[i], v if shape is None else v.reshape(shape))

    def param(self, onnx_name: str, value: np.ndarray) -> Tensor:
        computed = (value.dtype.str, value.shape, value.tobytes()) if onnx_name not in self.weights else None
        if onnx_name not in self.param_of and computed in self.computed:
            self.param_of[onnx_name] = self.computed[computed]  # equal constants (each layer's mask): one
        if onnx_name not in self.param_of:
            name = self.fresh(onnx_name)
            if computed is not None:
                self.computed[computed] = name
            self.param_of[onnx_name] = name
            self.params[name] = value
            # a value the graph computes (a Constant node, folded arithmetic) is no weight: frozen
            named = bool(self.freeze and (self.freeze.fullmatch(onnx_name) or self.freeze.fullmatch(name)))
            self.frozen_by_pattern += named
            frozen = onnx_name not in self.weights or named
            if frozen:
                self.frozen.append(name)
                if not named and onnx_name in self.folded_from:
                    weight, op = self.folded_from[onnx_name]
                    self.notes.append(f"`{weight}` is read through {op} with constants alone: `{name}` is a "
                                      "frozen copy of it, which training does not change")
            if bad := int(np.size(value) - np.count_nonzero(np.isfinite(value.astype(np.float64)))):
                what = "weight" if onnx_name in self.src.weights else "constant"
                self.notes.append(f"{what} `{onnx_name}` holds {bad} NaN or "
                                  f"infinite value{'s' if bad > 1 else ''}: --init refuses the weights file, so "
                                  "predict and training from it stop; a mask of -inf works exported with "
                                  "torch.finfo(torch.float32).min in its place")
            self.lines.append(f"param {name}: {swp_dtype(value) if value.dtype != np.float32 else ''}"
                              f"{list(value.shape)} = {initialiser(value)}{' frozen' if frozen else ''}")
        name = self.param_of[onnx_name]
        return Tensor(name, tuple(self.params[name].shape), swp_dtype(self.params[name]))

    def emit(self, node: Any, expr: str, shape: tuple[int, ...], dtype: str, out: int = 0) -> Tensor:
        t = Tensor(self.fresh(module_name(node) or (node.output[out] if out < len(node.output) else node.name)),
                   tuple(shape), dtype)
        self.lines.append(f"{t.name} = {expr}")
        self.env[node.output[out]] = t
        return t

    def const(self, node: Any, i: int) -> np.ndarray | None:
        v = self.get(node, i)
        if not isinstance(v, np.ndarray) and v is not None:
            raise unsupported(node, f"input {i} must be a constant (shape arithmetic swapdsl folds), but it is "
                              "computed from the model's inputs")
        return v


def module_name(node: Any) -> str | None:
    """A dynamo export's value named by its module (`layer1.1.conv1`), and by its op inside a module of
    many ops (`layers.0.self_attn` + `view`); None where the exporter says nothing of modules."""
    found = torch_scopes(node)
    if found is None or len(found[0]) < 3:  # none, or the exported module's own op: the op's name
        return None
    scopes, kinds = found
    leaf = len(kinds) >= len(scopes) - 1 and kinds[len(scopes) - 2].startswith("torch.nn.modules.")
    op = re.sub(r"_\d+$", "", scopes[-1])
    return scopes[-2] if leaf else f"{scopes[-2]}.{op}"


def torch_scopes(node: Any) -> tuple[list[str], list[str]] | None:
    """The dynamo exporter's metadata: the node's module paths (`['', 'm', 'm.layers.0', ..., op]`) and
    their classes, or None where it wrote none."""
    meta = {p.key: p.value for p in node.metadata_props}
    if "pkg.torch.onnx.name_scopes" not in meta:
        return None
    return strings(meta["pkg.torch.onnx.name_scopes"]), strings(meta.get("pkg.torch.onnx.class_hierarchy", ""))


def strings(text: str | bytes) -> list[str]:
    """The strings of a Python list literal as the exporter writes it (`['', 'm', 'm.layers.0']`)."""
    return re.findall(r"'([^']*)'", utf8(text))


def utf8(text: str | bytes) -> str:
    """A protobuf string field: protobuf hands back one that is not UTF-8 as bytes."""
    return text.decode("utf-8", "replace") if isinstance(text, bytes) else text


def readable(onnx_name: str) -> str:
    """`/layer1/layer1.0/conv1/Conv_output_0` -> `layer1_0_conv1`; `fc.weight` -> `fc_weight`."""
    parts = [p for p in re.sub(r"_output_\d+$", "", utf8(onnx_name)).split("/") if p]
    parts = [p for k, p in enumerate(parts) if not (k + 1 < len(parts) and parts[k + 1].startswith(p + "."))]
    if len(parts) > 1 and re.fullmatch(r"[A-Z][A-Za-z]*(_\d+)?", parts[-1]):  # the op's name in its module
        parts.pop()
    name = re.sub(r"[^A-Za-z0-9]+", "_", "_".join(parts)).strip("_").lower() or "v"
    return f"v{name}" if name[0].isdigit() else name


def initialiser(value: np.ndarray) -> str:
    """An initialiser of the weight's own scale, for training from scratch without `--init` (of its finite
    values: a mask's -inf is the checkpoint's to carry)."""
    v = value.astype(np.float64).reshape(-1)
    v = v[np.isfinite(v)]
    if not v.size:
        return "zeros"
    if np.all(v == v.flat[0]):
        return "zeros" if v.flat[0] == 0 else "ones" if v.flat[0] == 1 else f"constant({v.flat[0]:.8g})"
    std, mean = float(v.std()), float(v.mean())
    return f"normal(std = {std:.6g})" if abs(mean) < 1e-3 * max(std, 1e-12) or abs(mean) < 1e-6 \
        else f"normal(std = {std:.6g}, mean = {mean:.6g})"


def unsupported(node: Any, why: str) -> SwpError:
    return SwpError(f"ONNX node `{node.name or '(unnamed)'}` ({node.op_type}): {why}",
                    hints=["docs/import.md lists the ops and forms swapdsl imports"])


def onnx_dtype(code: int, node: Any) -> str:
    if code not in DTYPES:
        raise unsupported(node, f"element type {code} has no swapdsl dtype")
    return DTYPES[code]


def reshape_target(shape: tuple[int, ...], target: np.ndarray, node: Any, allowzero: int = 0) -> tuple[int, ...]:
    dims = [int(d) for d in target.reshape(-1)]
    dims = [shape[i] if d == 0 and not allowzero and i < len(shape) else d for i, d in enumerate(dims)]
    if dims.count(-1) > 1 or any(d < -1 for d in dims):
        raise unsupported(node, f"reshape target {dims}")
    if -1 in dims:
        known = math.prod(d for d in dims if d != -1)
        dims[dims.index(-1)] = math.prod(shape) // known if known else 0
    if math.prod(dims) != math.prod(shape) or 0 in dims:
        raise unsupported(node, f"cannot reshape {list(shape)} to {dims}")
    return tuple(dims)


def flag(a: dict[str, Any], name: str, default: int, node: Any) -> bool:
    """A 0-or-1 attribute (keepdims, transB, ...): any other value is refused, not guessed at."""
    v = a.get(name, default)
    if v not in (0, 1):
        raise unsupported(node, f"attribute {name} is {v}, not 0 or 1")
    return bool(v)


def attributes(node: Any) -> dict[str, Any]:
    from onnx import helper

    out = {}
    for a in node.attribute:
        v = helper.get_attribute_value(a)
        out[a.name] = v.decode() if isinstance(v, bytes) else v
    return out
