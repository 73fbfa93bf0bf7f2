"""Checkpoints: a training run's persistent tensors and where it stood, in safetensors format.

The tensors are the training graph's persistent ones (parameters, optimiser state, reports' last
values) under their graph names; the metadata (strings, as safetensors keeps them) names the model
(its source hash and arguments), the step, the data position and the seed. Randomness is
counter-based (dropout hashes (seed, step, element)), so the step and the seed are the whole RNG state.
A file is written whole or not at all; PyTorch reads it with ``safetensors.torch.load_file``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import attrs
import numpy as np

from swapdsl.common.atomic import atomic_path
from swapdsl.common.errors import SwpError
from swapdsl.graph.ir import Graph
from swapdsl.graph.ops.registry import np_dtype

FORMAT = "swapdsl-checkpoint"
VERSION = "1"


@attrs.frozen
class Checkpoint:
    path: str
    values: dict[str, np.ndarray] = attrs.field(repr=False)
    meta: dict[str, str]

    @property
    def step(self) -> int:
        return int(self.meta["step"])

    @property
    def position(self) -> int:
        """Batches of data consumed so far (one per step)."""
        return int(self.meta["position"])

    @property
    def seed(self) -> int:
        return int(self.meta["seed"])


def identity(g: Graph) -> dict[str, str]:
    """What makes two runs the same training: the model source, its arguments and its optimiser."""
    return {"model": g.name, "model_sha256": g.source_sha256, "args": json.dumps(dict(g.args), sort_keys=True),
            "optimizer": str(g.optimizer)}


def save(path: str, g: Graph, values: Mapping[str, np.ndarray], step: int, position: int, seed: int,
         data: str, shuffle: bool) -> int:
    """Write the checkpoint atomically; returns its size in bytes."""
    from safetensors.numpy import save_file

    meta = {"format": FORMAT, "version": VERSION, **identity(g), "step": str(step), "position": str(position),
            "seed": str(seed), "data": data, "shuffle": json.dumps(shuffle),
            "rng": "counter-based: (seed, step) is the whole state"}
    with atomic_path(path, "checkpoint") as tmp:
        save_file({name: np.asarray(values[name], order="C") for name in g.persistent}, tmp, metadata=meta)
    return Path(path).stat().st_size


def read(path: str, flag: str, tensors: bool = True) -> Checkpoint:
    """A checkpoint file (``tensors``: with its tensors read, else its metadata only), or a clear error
    saying why it is not one."""
    from safetensors import SafetensorError, safe_open

    if not Path(path).is_file():
        raise SwpError(f"{flag} `{path}`: no such checkpoint file")
    try:
        with safe_open(path, framework="np") as f:
            meta = dict(f.metadata() or {})
            names = f.keys() if tensors else []
            values = {name: f.get_tensor(name) for name in names}
    except (SafetensorError, OSError, ValueError) as exc:
        raise SwpError(f"{flag} `{path}` is not a safetensors file: {exc}") from None
    if meta.get("format") != FORMAT:
        raise SwpError(f"{flag} `{path}` is a safetensors file but not a swapdsl checkpoint",
                       hints=["--init takes one written by `swapdsl exec --save`"])
    if meta.get("version") != VERSION:
        raise SwpError(f"{flag} `{path}` is checkpoint version {meta.get('version')}; this swapdsl reads {VERSION}")
    return Checkpoint(path, values, meta)


def check_same_run(ck: Checkpoint, g: Graph) -> None:
    """Refuse to resume a checkpoint of another model, other arguments or another optimiser."""
    mine = identity(g)
    for key, label in (("model_sha256", "model source"), ("args", "model arguments"), ("optimizer", "optimiser")):
        if ck.meta.get(key) != mine[key]:
            raise SwpError(f"--resume `{ck.path}` was written by another run: its {label} differ",
                           notes=[f"checkpoint: model `{ck.meta.get('model')}`, {label} {ck.meta.get(key)}",
                                  f"this run:   model `{g.name}`, {label} {mine[key]}"],
                           hints=["resume with the model file and arguments that wrote it, or start from its "
                                  "parameters alone with --init"])
    _check_tensors(ck, g, g.persistent, "--resume")


def parameters(ck: Checkpoint, g: Graph) -> dict[str, np.ndarray]:
    """The checkpoint's values of ``g``'s parameters (for --init), each checked for name, shape and dtype."""
    _check_tensors(ck, g, g.params, "--init")
    return {name: ck.values[name] for name in g.params}


def _check_tensors(ck: Checkpoint, g: Graph, names: tuple[str, ...], flag: str) -> None:
    for name in names:
        t = g.type_of(name)
        have = ck.values.get(name)
        if have is None:
            raise SwpError(f"{flag} `{ck.path}` has no tensor `{name}` ({t})",
                           hints=[f"it was written for model `{ck.meta.get('model')}`"])
        want = np.dtype(np_dtype(np, t.dtype))
        if tuple(have.shape) != t.shape or have.dtype != want:
            raise SwpError(f"{flag} `{ck.path}`: tensor `{name}` is {have.dtype}{list(have.shape)}, the model's is {t}")
