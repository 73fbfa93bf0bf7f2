"""Mutated input files for a training run, and the verdict on each: trains, or is refused cleanly.

The surfaces are the files `exec`, `plot-log` and `optimize --device` read besides models and plans:
a data folder of ``.npy`` arrays, an ``.npz`` archive (members stored or compressed), a checkpoint
(``--resume`` and ``--init``), weights alone (a safetensors file with no swapdsl metadata, for ``--init``),
a training log and a device profile. Each case starts from a valid file
written by swapdsl or NumPy and changes its bytes (a flipped bit, a cut, an insertion, an overwritten
run) or one token of its text part (the ``.npy`` header, the safetensors JSON header, a log line, the
profile) to an adversary's value. Run in process, every case must end with exit 0 or with exit 2 and
one ``error:`` line: never a traceback, never a hang.
"""

from __future__ import annotations

import json
import random
import re
from collections import Counter
from collections.abc import Mapping
from pathlib import Path

import attrs
import numpy as np

from swapdsl.fuzz import run_cli

SURFACES = ("npy", "npz", "checkpoint", "weights", "log", "profile")
KINDS = ("flip", "cut", "insert", "overwrite", "token")
VERDICTS = ("ok", "refused", "crash", "hang")
TIME_LIMIT_S = 20.0
MLP_ARGS = {"batch": 4, "features": 6, "hidden": 5, "depth": 1, "classes": 3}
_ODD = ["-1", "0", "1e999", "-1e999", "99999999999999999999999", "NaN", "Infinity", '"x"', "[]", "{}", "null",
        "true", "2147483648", "9223372036854775808", "-9223372036854775809", "1.5", "[" * 5000, ""]
_TOKEN = re.compile(r"-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?|\"(?:[^\"\\]|\\.)*\"|true|false|null|[\[\]{}(),:]")


@attrs.frozen
class Case:
    surface: str
    kind: str
    what: str  # the change, as a person reads it


@attrs.frozen
class Verdict:
    verdict: str  # one of VERDICTS
    detail: str = ""


def mlp_defines() -> list[str]:
    return [x for k, v in MLP_ARGS.items() for x in ("-D", f"{k}={v}")]


def make_seeds(folder: Path, model: Path) -> dict[str, Path]:
    """Valid files of every surface for the small MLP ``model``, written into ``folder``."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((12, MLP_ARGS["features"])).astype(np.float32)
    y = rng.integers(0, MLP_ARGS["classes"], 12).astype(np.int32)
    (folder / "data").mkdir(parents=True, exist_ok=True)
    np.save(folder / "data" / "x.npy", x)
    np.save(folder / "data" / "y.npy", y)
    np.savez(folder / "stored.npz", x=x, y=y)
    np.savez_compressed(folder / "packed.npz", x=x, y=y)
    run = run_cli(["exec", str(model), *mlp_defines(), "--steps", "2", "--data", str(folder / "data"),
                   "--save", str(folder / "c.safetensors"), "--log", str(folder / "log.jsonl"), "--json"])
    assert run.code == 0, run.err or run.crash
    from safetensors.numpy import load_file, save_file

    from swapdsl.devices.profiles import BUILTIN

    params = {k: v for k, v in load_file(folder / "c.safetensors").items() if "/" not in k}  # (no state, no meta)
    save_file(params, str(folder / "w.safetensors"), metadata={"format": "pt"})

    (folder / "p.json").write_text(json.dumps(BUILTIN["v100-16gb"].to_json(), indent=1), encoding="utf-8")
    return {"npy": folder / "data" / "y.npy", "stored.npz": folder / "stored.npz",
            "packed.npz": folder / "packed.npz", "checkpoint": folder / "c.safetensors",
            "weights": folder / "w.safetensors",
            "log": folder / "log.jsonl", "profile": folder / "p.json"}


def mutate(data: bytes, kind: str, rng: random.Random, text: tuple[int, int]) -> tuple[bytes, str]:
    """``data`` changed by one mutation of ``kind``; ``text``: the byte range of its text part (for "token")."""
    n = len(data)
    if kind == "flip" and n:
        i = rng.randrange(n)
        return data[:i] + bytes([data[i] ^ (1 << rng.randrange(8))]) + data[i + 1:], f"bit flipped at {i}"
    if kind == "cut":
        i = rng.randrange(n + 1)
        return data[:i], f"cut to {i} bytes"
    if kind == "insert":
        i, chunk = rng.randrange(n + 1), bytes(rng.randrange(256) for _ in range(rng.choice([1, 3, 64])))
        return data[:i] + chunk + data[i:], f"{len(chunk)} bytes inserted at {i}"
    if kind == "overwrite" and n:
        i, width = rng.randrange(n), rng.choice([1, 4, 8, 32])
        fill = rng.choice([b"\xff", b"\x00", b"\x7f"]) * width
        return data[:i] + fill[: n - i] + data[i + width:], f"{width} bytes overwritten at {i}"
    lo, hi = text
    found = list(_TOKEN.finditer(data[lo:hi].decode("latin-1")))
    if not found:
        return mutate(data, "flip", rng, text)
    m, new = rng.choice(found), rng.choice(_ODD)
    start, end = lo + m.start(), lo + m.end()
    return data[:start] + new.encode("latin-1") + data[end:], f"token {m.group()[:20]!r} at {start} -> {new[:20]!r}"


def text_part(surface: str, data: bytes) -> tuple[int, int]:
    """The byte range of the file's text: a .npy header, a safetensors JSON header, or all of it."""
    if surface == "npy" and data[:6] == b"\x93NUMPY":
        return 10, 10 + int.from_bytes(data[8:10], "little")
    if surface in ("checkpoint", "weights") and len(data) >= 8:
        return 8, min(len(data), 8 + int.from_bytes(data[:8], "little"))
    return 0, len(data)


def case_of(seed: int, index: int, seeds: dict[str, Path], model: Path, work: Path) -> tuple[Case, list[str]]:
    """Case ``index`` of a run seeded ``seed``: a mutated file written under ``work`` and the command line
    (on the small MLP ``model``) that reads it."""
    rng = random.Random(f"{seed}:{index}")
    surface = SURFACES[index % len(SURFACES)]
    kind = KINDS[(index // len(SURFACES)) % len(KINDS)]
    source = seeds[rng.choice(["stored.npz", "packed.npz"])] if surface == "npz" else seeds[surface]
    data = source.read_bytes()
    changed, what = mutate(data, kind, rng, text_part(surface, data))
    target = _place(surface, source, work)
    target.write_bytes(changed)
    return Case(surface, kind, f"{source.name}: {what}"), _argv(surface, target, str(model), work, rng)


def _place(surface: str, source: Path, work: Path) -> Path:
    """Where the mutant goes: a data folder keeps its other (intact) array beside it."""
    if surface == "npy":
        folder = work / "data"
        folder.mkdir(exist_ok=True)
        (folder / "x.npy").write_bytes((source.parent / "x.npy").read_bytes())
        return folder / "y.npy"
    return work / source.name


def _argv(surface: str, target: Path, model: str, work: Path, rng: random.Random) -> list[str]:
    train = ["exec", model, *mlp_defines(), "--backend", "numpy"]
    if surface == "checkpoint":
        return train + ["--steps", "4", rng.choice(["--resume", "--init"]), str(target)]
    if surface == "weights":
        return train + ["--steps", "2", "--init", str(target)]
    if surface in ("npy", "npz"):
        return train + ["--steps", "1", "--data", str(target if surface == "npz" else target.parent)]
    if surface == "log":
        return ["plot-log", str(target), "-o", str(work / "log.png")]
    return ["optimize", model, *mlp_defines(), "--memory", "1MiB", "--method", "belady", "--device", str(target)]


def tally(counts: Mapping[str, Counter[str]], label: str) -> int:
    """Print the count of each verdict per row (a surface, a function); 1 if any crashed or hung, else 0."""
    width = max([len(label), *map(len, counts)]) + 2
    print(f"{label:<{width}}" + "".join(f"{v:>9}" for v in VERDICTS))
    for row, c in counts.items():
        print(f"{row:<{width}}" + "".join(f"{c[v]:>9}" for v in VERDICTS))
    return 1 if any(c["crash"] or c["hang"] for c in counts.values()) else 0


def judge(argv: list[str], limit_s: float = TIME_LIMIT_S) -> Verdict:
    run = run_cli(argv, limit_s)
    if run.crash == "hang":
        return Verdict("hang", f"over {limit_s:.0f} s")
    if run.code is None:
        return Verdict("crash", run.crash)
    lines = run.err.splitlines()
    if run.code == 0:
        return Verdict("ok")
    if run.code == 2 and lines and lines[0].startswith("error: ") and "Traceback" not in run.err:
        return Verdict("refused", lines[0])
    return Verdict("crash", f"exit {run.code}: {run.err[-500:]}")
