"""Seeded parameter initialisation and synthetic training data.

Every random draw is made with NumPy from a generator seeded by (seed, a
stable hash of the tensor's name), so a tensor's values do not depend on the
order of declaration or on the backend.
"""

from __future__ import annotations

import math
import zlib
from types import ModuleType
from typing import Any

import numpy as np

from swapdsl.graph.ir import Graph, Init, TensorType
from swapdsl.graph.ops.halfbits import to_module
from swapdsl.graph.ops.registry import np_dtype
from swapdsl.runtime.dist import shard


def rng_for(seed: int, name: str) -> np.random.Generator:
    return np.random.default_rng([seed, zlib.crc32(name.encode("utf-8"))])


def fans(shape: tuple[int, ...]) -> tuple[int, int]:
    """(fan_in, fan_out): [in, out] matrices, [out, in, kh, kw] convolution kernels, vectors."""
    if len(shape) < 2:
        n = shape[0] if shape else 1
        return n, n
    if len(shape) == 2:
        return shape[0], shape[1]
    field = math.prod(shape[2:])
    return shape[1] * field, shape[0] * field


def initial_value(init: Init, typ: TensorType, rng: np.random.Generator) -> np.ndarray:
    a = dict(init.args)
    fan_in, fan_out = fans(typ.shape)
    shape = typ.shape
    draws: dict[str, Any] = {
        "zeros": lambda: np.zeros(shape),
        "ones": lambda: np.ones(shape),
        "constant": lambda: np.full(shape, a.get("value", 0.0)),
        "normal": lambda: rng.normal(a.get("mean", 0.0), a.get("std", 1.0), shape),
        "uniform": lambda: rng.uniform(a.get("low", -1.0), a.get("high", 1.0), shape),
        "xavier_uniform": lambda: rng.uniform(-1, 1, shape) * math.sqrt(6.0 / (fan_in + fan_out)),
        "xavier_normal": lambda: rng.normal(0, math.sqrt(2.0 / (fan_in + fan_out)), shape),
        "he_normal": lambda: rng.normal(0, math.sqrt(2.0 / fan_in), shape),
        "he_uniform": lambda: rng.uniform(-1, 1, shape) * math.sqrt(6.0 / fan_in),
    }
    return draws[init.kind]()


def init_persistent(g: Graph, seed: int, xp: ModuleType) -> dict[str, Any]:
    """Initial values of the params (by their initialisers) and the optimiser state (zeros)."""
    out = {}
    for name in g.persistent:
        t = g.tensors[name]
        value = initial_value(t.init or Init("zeros"), t.type, rng_for(seed, name))
        out[name] = to_module(xp, value.astype(np_dtype(np, t.type.dtype)))
    return out


def integer_ranges(g: Graph) -> dict[str, int]:
    """For each integer input, how many values it may take: classes for labels, rows for ids (read
    through the slices that hand each micro-batch its rows)."""
    ranges: dict[str, int] = {}
    source: dict[str, str] = {}
    for op in g.ops:
        if op.op == "slice":
            source[op.outputs[0]] = source.get(op.inputs[0], op.inputs[0])
        elif op.op in ("softmax_cross_entropy", "embedding"):
            ids, table = (1, 0) if op.op == "softmax_cross_entropy" else (0, 1)
            shape = g.type_of(op.inputs[table]).shape
            limit = shape[-1] if op.op == "softmax_cross_entropy" else shape[0]
            name = source.get(op.inputs[ids], op.inputs[ids])
            ranges[name] = min(ranges.get(name, limit), limit)
    return ranges


def synthetic_inputs(g: Graph, seed: int, xp: ModuleType) -> dict[str, Any]:
    """One fixed batch: floats ~ N(0, 1), integers uniform over their valid range.

    The same batch every step, so training memorises it and a falling loss shows
    that the training step works.
    """
    ranges = integer_ranges(g)
    out = {}
    for name in g.inputs:
        t = g.tensors[name].type
        rng = rng_for(seed, "input:" + name)
        shape = (t.shape[0] * g.ranks, *t.shape[1:]) if t.shape else t.shape  # data-parallel: the whole batch
        if t.dtype.is_float:
            value = rng.standard_normal(shape)
        else:
            value = rng.integers(0, ranges.get(name, 2), shape)
        out[name] = value.astype(np_dtype(np, t.dtype))
    return {name: to_module(xp, value) for name, value in shard(g, out).items()}
