"""Checkpoints: a training run's persistent tensors and where it stood, in safetensors format.

The tensors are the training graph's persistent ones (parameters, optimiser state, reports' last
values) under their graph names; the metadata (strings, as safetensors keeps them) names the model
(its source hash and arguments), the step, the data position and the seed. Randomness is
counter-based (dropout hashes (seed, step, element)), so the step and the seed are the whole RNG state.
A file is written whole or not at all; PyTorch reads it with ``safetensors.torch.load_file``.

Reading trusts nothing: every metadata field is checked, and each tensor's bytes against the SHA-256
digest recorded when it was saved (``sha256`` in the metadata), so a flipped byte is named, not trained on.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Callable, Mapping
from pathlib import Path

import attrs
import numpy as np

from swapdsl.common.atomic import atomic_path
from swapdsl.common.errors import SwpError, did_you_mean
from swapdsl.graph.ir import Graph, Kind
from swapdsl.graph.ops.halfbits import bfloat16
from swapdsl.graph.ops.registry import np_dtype
from swapdsl.runtime.nonfinite import all_finite

FORMAT = "swapdsl-checkpoint"
VERSION = "2"  # 2: tensor digests; 1 had none
MAX_COUNT = 2**63 - 1  # steps, data positions and seeds are below 2^63, as --steps and --seed are
_COUNT = re.compile(r"[0-9]{1,19}")
RUNNING = (".running_mean", ".running_var")
_FLOATS = {"float16": 1, "bfloat16": 1, "float32": 2, "float64": 3}  # an --init weight widens to a wider kind


@attrs.frozen
class Checkpoint:
    path: str
    values: dict[str, np.ndarray] = attrs.field(repr=False)  # the tensors read (``read``'s ``wanted``)
    meta: dict[str, str]
    step: int
    position: int  # batches of data consumed so far (one per step)
    seed: int
    names: tuple[str, ...] = ()  # every tensor the file holds, read or not


def identity(g: Graph) -> dict[str, str]:
    """What makes two runs the same training: the model source, its arguments and its optimiser."""
    return {"model": g.name, "model_sha256": g.source_sha256, "args": json.dumps(dict(g.args), sort_keys=True),
            "optimizer": str(g.optimizer), "precision": g.precision, "guard": g.guard, "ranks": str(g.ranks)}


def save(path: str, g: Graph, values: Mapping[str, np.ndarray], step: int, position: int, seed: int,
         data: str, shuffle: bool, data_id: tuple[int, str] | None = None) -> int:
    """Write the checkpoint atomically; returns its size in bytes. ``data_id``: the data's examples and
    fingerprint (``dataset.fingerprint``), which a resumed run's data must match."""
    from safetensors import SafetensorError
    from safetensors.numpy import save_file

    tensors = {name: np.asarray(values[name], order="C") for name in g.persistent}
    meta = {"format": FORMAT, "version": VERSION, **identity(g), "step": str(step), "position": str(position),
            "seed": str(seed), "data": data, "shuffle": json.dumps(shuffle),
            "rng": "counter-based: (seed, step) is the whole state",
            "sha256": json.dumps({name: digest(a) for name, a in tensors.items()}, sort_keys=True)}
    if data_id is not None:
        meta |= {"data_examples": str(data_id[0]), "data_sha256": data_id[1]}
    with atomic_path(path, "checkpoint") as tmp:
        try:
            save_file(tensors, tmp, metadata=meta)
        except SafetensorError as exc:  # (its own error for the OSError of a write: a full disk)
            raise SwpError(f"cannot write the checkpoint `{path}`: {exc}", hints=[
                "a checkpoint already there is kept as it was; free some space (and --resume from it)"]) from None
    return Path(path).stat().st_size


def digest(a: np.ndarray) -> str:
    """SHA-256 of a tensor's bytes in C order."""
    return hashlib.sha256(np.asarray(a, order="C").reshape(-1).view(np.uint8)).hexdigest()


def read(path: str, flag: str, tensors: bool = True, wanted: Callable[[str], bool] | None = None) -> Checkpoint:
    """A checkpoint file (``tensors``: with its tensors read, else its metadata only; ``wanted``: only the
    tensors it says yes to, so --init of a checkpoint with Adam's state reads a third of it), or a clear
    error saying why it is not one."""
    from safetensors import SafetensorError, safe_open

    if not Path(path).is_file():
        raise SwpError(f"{flag} `{path}`: no such checkpoint file")
    try:
        with safe_open(path, framework="np") as f:
            meta = dict(f.metadata() or {})
            every = tuple(f.keys())
            names = [n for n in every if wanted is None or wanted(n)] if tensors else []
            if any(f.get_slice(name).get_dtype() == "BF16" for name in names):
                bfloat16()  # (NumPy knows bf16 once ml_dtypes is loaded, which is done only when needed)
            values = {name: f.get_tensor(name) for name in names}
    except (SafetensorError, OSError, ValueError, TypeError) as exc:  # (TypeError: a dtype NumPy lacks)
        raise SwpError(f"{flag} `{path}` is not a safetensors file: {exc}") from None
    if meta.get("format") != FORMAT:
        if flag == "--init" and tensors:  # weights alone, as `safetensors.torch.save_file` writes them
            return Checkpoint(path, values, meta, 0, 0, 0, every)
        raise SwpError(f"{flag} `{path}` is a safetensors file but not a swapdsl checkpoint",
                       hints=["--resume takes one written by `swapdsl exec --save`; --init takes weights alone too"])
    if "version" not in meta:
        raise SwpError(f"{flag} `{path}`: metadata field `version` is missing",
                       hints=["the checkpoint was edited: use the one `swapdsl exec --save` wrote"])
    if meta.get("version") != VERSION:
        raise SwpError(f"{flag} `{path}` is checkpoint version {meta.get('version')}; this swapdsl reads {VERSION}",
                       hints=["version 1 (no tensor digests) came from an earlier swapdsl: resume it with that "
                              "release, or start afresh"])
    step, position, seed = (_count(meta, key, flag, path) for key in ("step", "position", "seed"))
    if position != step:
        raise SwpError(f"{flag} `{path}`: its metadata say data position {position} at step {step}; a run consumes "
                       "one batch a step, so they are equal", hints=["the checkpoint was edited: use the one "
                                                                     "`swapdsl exec --save` wrote"])
    if meta.get("shuffle") not in ("true", "false"):
        raise SwpError(f"{flag} `{path}`: metadata field `shuffle` is {meta.get('shuffle')!r}, not true or false")
    if tensors:
        _check_digests(path, flag, meta, values, every)
    return Checkpoint(path, values, meta, step, position, seed, every)


def _count(meta: Mapping[str, str], key: str, flag: str, path: str) -> int:
    text = meta.get(key)
    if text is None:
        raise SwpError(f"{flag} `{path}`: metadata field `{key}` is missing",
                       hints=["the checkpoint was edited: use the one `swapdsl exec --save` wrote"])
    if not _COUNT.fullmatch(text) or int(text) > MAX_COUNT:
        raise SwpError(f"{flag} `{path}`: metadata field `{key}` is {text[:40]!r}, not an integer from 0 to "
                       f"2^63-1", hints=["the checkpoint was edited: use the one `swapdsl exec --save` wrote"])
    return int(text)


def _check_digests(path: str, flag: str, meta: Mapping[str, str], values: Mapping[str, np.ndarray],
                   every: tuple[str, ...]) -> None:
    """Each tensor read against its recorded digest, and a digest recorded for each tensor of the file."""
    try:
        recorded = json.loads(meta.get("sha256", ""))
    except json.JSONDecodeError:
        recorded = None
    if not (isinstance(recorded, dict) and set(recorded) == set(every)
            and all(isinstance(v, str) for v in recorded.values())):
        raise SwpError(f"{flag} `{path}`: metadata field `sha256` does not list a digest for each tensor",
                       hints=["the checkpoint was edited: use the one `swapdsl exec --save` wrote"])
    for name in sorted(values):
        if digest(values[name]) != recorded[name]:
            raise SwpError(f"{flag} `{path}`: tensor `{name}` does not match the digest recorded when it was saved",
                           hints=["the file is damaged (or was edited): use an intact copy"])


def check_same_run(ck: Checkpoint, g: Graph) -> None:
    """Refuse to resume a checkpoint of another model, other arguments or another optimiser."""
    mine = identity(g)
    theirs = {**ck.meta, "precision": ck.meta.get("precision", "f32"), "guard": ck.meta.get("guard", "none"),
              "ranks": ck.meta.get("ranks", "1")}
    for key, label in (("model_sha256", "model source"), ("args", "model arguments"), ("optimizer", "optimiser"),
                       ("precision", "precision"), ("guard", "guard"), ("ranks", "data-parallel ranks")):
        if theirs.get(key) != mine[key]:
            hint = (f"resume in a run of {label} {theirs[key]} (the model with --{key} {theirs[key]}, or a plan made "
                    "with it), or start from its parameters alone with --init"
                    if key in ("precision", "guard", "ranks") else "resume with the model file and arguments that "
                    "wrote it, or start from its parameters alone with --init")
            raise SwpError(f"--resume `{ck.path}` was written by another run: its {label} differ"
                           + ("" if key in ("args", "ranks") else "s"),  # (arguments and ranks are plural)
                           notes=[f"checkpoint: model `{ck.meta.get('model')}`, {label} {theirs.get(key)}",
                                  f"this run:   model `{g.name}`, {label} {mine[key]}"], hints=[hint])
    _check_tensors(ck, g, g.persistent, "--resume")


def check_same_data(ck: Checkpoint, data: str, shuffle: bool, synthetic: str) -> None:
    """Refuse to resume on other data, or with the order of its examples changed (--shuffle given or not):
    a resumed run goes on exactly as the one that wrote the checkpoint would have. ``synthetic``: the name
    of the seed's data, which no other data is. Data at another path is refused where both paths name files
    here; a path that does not resolve from here (a relative one an older run recorded) is taken as written."""
    if ck.meta["shuffle"] != json.dumps(shuffle):
        said = "with" if ck.meta["shuffle"] == "true" else "without"
        raise SwpError(f"--resume `{ck.path}` was written by a run {said} --shuffle: resume {said} it",
                       hints=["or start from its parameters alone with --init"])
    theirs = ck.meta.get("data", data)
    hint = "resume on the data it trained on, or start from its parameters alone with --init"
    if theirs == synthetic and data != synthetic:
        raise SwpError(f"--resume `{ck.path}` was written by a run on synthetic data (no --data), not `{data}`",
                       hints=[hint])
    if data == synthetic and theirs != synthetic:
        raise SwpError(f"--resume `{ck.path}` was written by a run on `{theirs}`, not on synthetic data: give its "
                       "--data", hints=[hint])
    if theirs != data and os.path.exists(theirs) and os.path.exists(data) and not os.path.samefile(theirs, data):
        raise SwpError(f"--resume `{ck.path}` was written by a run on `{theirs}`, not `{data}`", hints=[hint])


def check_same_contents(ck: Checkpoint, data: str, data_id: tuple[int, str]) -> None:
    """Refuse to resume on data changed since the checkpoint was written (regenerated or extended at the
    same path): its batches, and so the run, would differ. A checkpoint that records no fingerprint (an
    older swapdsl's) is taken as it is."""
    theirs = ck.meta.get("data_sha256")
    if theirs is None or theirs == data_id[1]:
        return
    examples = ck.meta.get("data_examples", "?")
    changed = (f"held {examples} examples; it holds {data_id[0]} now" if examples != str(data_id[0])
               else f"has changed since (the same {examples} examples, other contents)")
    raise SwpError(f"--resume `{ck.path}`: the data `{data}` it was written on {changed}",
                   hints=["resume on the data it trained on, or start from its parameters alone with --init"])


def for_init(g: Graph, state: bool = False) -> Callable[[str], bool]:
    """What --init reads of a file for ``g``: its parameters and batch norm's running statistics (``state``:
    every state tensor but a report's, as a prediction starts from)."""
    keep = set(g.params) | {n for n in g.state if (state and g.tensors[n].kind != Kind.metric)
                            or n.endswith(RUNNING)}
    return keep.__contains__


def parameters(ck: Checkpoint, g: Graph) -> dict[str, np.ndarray]:
    """The checkpoint's values of ``g``'s parameters (for --init), each checked for name, shape, dtype and
    finiteness, and of batch norm's running statistics where it has them (`swapdsl import` writes them)."""
    running = tuple(n for n in g.state if n.endswith(RUNNING) and n in ck.values)
    values = dict(ck.values)
    for name in g.params + running:
        have, want = values.get(name), np.dtype(np_dtype(np, g.type_of(name).dtype))
        if have is None or have.dtype == want:
            continue
        if name in g.frozen and have.dtype == np.float32:  # stored half under a half precision: rounded to it
            values[name] = _narrowed(ck, name, have, want)
        elif _FLOATS.get(have.dtype.name, 99) < _FLOATS.get(want.name, 0):
            values[name] = have.astype(want)  # (exact: a half-precision weight into an f32 parameter)
    ck = attrs.evolve(ck, values=values)
    _check_tensors(ck, g, g.params + running, "--init")
    for name in g.params + running:
        if not all_finite([values[name]]):
            raise SwpError(f"--init `{ck.path}`: tensor `{name}` holds a value that is not finite",
                           hints=["a run starts from finite values; mend or drop the file"])
    return {name: values[name] for name in g.params + running}


def _narrowed(ck: Checkpoint, name: str, have: np.ndarray, want: np.dtype) -> np.ndarray:
    """An f32 value rounded to the half type a frozen parameter is stored in, refused where it overflows."""
    with np.errstate(over="ignore"):
        out = have.astype(want)
    if not np.isfinite(out.astype(np.float32)).all() and np.isfinite(have).all():
        worst = float(np.abs(have).max())
        raise SwpError(f"--init `{ck.path}`: tensor `{name}` holds {worst:g}, beyond {want.name}'s range, the "
                       "type this frozen parameter is stored in", hints=["train it in f32, or scale the weight"])
    return out


_TRANSPOSED = ("its transpose fits: PyTorch's nn.Linear keeps [out, in], a swapdsl `x @ w` weight [in, out]; "
               "write `w.T` into the file (a square weight needs it too, though no shape tells)")


def _check_tensors(ck: Checkpoint, g: Graph, names: tuple[str, ...], flag: str) -> None:
    for name in names:
        t = g.type_of(name)
        have = ck.values.get(name)
        if have is None:
            theirs = sorted(n for n in ck.names if n not in g.tensors)  # (names the model has are not meant)
            listed = [f"its other tensors: {', '.join(theirs[:6])}"
                      + (f" and {len(theirs) - 6} more" if len(theirs) > 6 else "")] if theirs else []
            hints = ([f"it was written for model `{ck.meta.get('model')}`"] if ck.meta.get("format") == FORMAT else
                     did_you_mean(name, theirs) or listed)
            raise SwpError(f"{flag} `{ck.path}` has no tensor `{name}` ({t})", hints=hints)
        want = np.dtype(np_dtype(np, t.dtype))
        if tuple(have.shape) != t.shape or have.dtype != want:
            hints = [_TRANSPOSED] if len(t.shape) == 2 and tuple(have.shape) == t.shape[::-1] else []
            raise SwpError(f"{flag} `{ck.path}`: tensor `{name}` is {have.dtype}{list(have.shape)}, the model's is {t}",
                           hints=hints)
