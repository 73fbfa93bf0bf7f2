"""An ONNX graph as a `.swp` model: lowered at the sizes asked for, then lowered again with each
symbolic size one larger, so that every number which follows a size is written in its terms
(`reshape(h, [batch, 512])`, not `[8, 512]`)."""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping

import attrs
import numpy as np

from swapdsl.common.errors import SwpError
from swapdsl.importer import blocks
from swapdsl.importer.context import RESERVED, Lowering, readable
from swapdsl.importer.onnx_read import Source, read_onnx
from swapdsl.importer.walk import lower
from swapdsl.importer.widen import HALF, widened
from swapdsl.lang.elaborate import OPTIMIZERS

LOSSES = ("cross_entropy", "mse")
TARGET, OPTIMIZER = "target", "sgd(lr = 0.01)"  # with a loss: the target input's name, the `minimize` line's
_INT = re.compile(r"(?<![\w.])\d+(?![\w.])")


@attrs.frozen
class Imported:
    text: str
    model: str
    params: dict[str, np.ndarray] = attrs.field(repr=False)  # `.swp` parameter -> its ONNX weight
    running: dict[str, tuple[np.ndarray, np.ndarray]] = attrs.field(repr=False)  # batch-norm scale -> stats
    notes: tuple[str, ...] = ()
    frozen: tuple[str, ...] = ()  # parameters declared `frozen`


def convert(path: str, batch: int | None = None, dims: Mapping[str, int] | None = None, loss: str | None = None,
            target: str = TARGET, optimizer: str = OPTIMIZER, freeze: str | None = None,
            flat: bool = False, f32: bool = False) -> Imported:
    """The ONNX file at ``path`` as `.swp` text and the parameters it starts from. Every input's first axis
    is the batch (``batch``, else its size in the file, else 1); ``dims`` gives the file's other symbolic
    sizes; ``loss`` adds a target input and a `minimize` line; ``freeze`` (a regular expression over ONNX or
    `.swp` names) declares the parameters it matches `frozen`, as every constant the graph computes is.
    Repeated modules become `def`s (``blocks``) unless ``flat``; ``f32``: a half-precision export's weights,
    inputs and casts widened to f32 (``widen``)."""
    src = widened(read_onnx(path)) if f32 else read_onnx(path)
    try:
        re.compile(freeze or "")
    except re.error as exc:
        raise SwpError(f"--freeze `{freeze}` is not a regular expression: {exc}") from None
    if loss is not None and loss not in LOSSES:
        raise SwpError(f"unknown loss `{loss}`", hints=[f"losses: {', '.join(LOSSES)}"])
    if not re.fullmatch(r"[a-z]\w*\([^\n\r{}#]*\)", optimizer):
        raise SwpError(f"--optimizer `{optimizer[:80]}` is not one optimiser call",
                       hints=["e.g. --optimizer \"adamw(lr = 1e-4, warmup = 100, cosine = 10000)\""])
    if optimizer.split("(")[0] not in OPTIMIZERS:
        raise SwpError(f"--optimizer `{optimizer[:80]}`: no optimiser `{optimizer.split('(')[0]}`",
                       hints=[f"optimisers: {', '.join(OPTIMIZERS)}"])
    sizes = _sizes(src, batch, dict(dims or {}))
    base = _lowered_at_batch(src, sizes, freeze, batch)

    def render(lw: Lowering) -> list[str]:
        return _declarations(lw) + _outputs(src, lw, loss, target, optimizer)

    body, notes, fixed = _symbolic(src, base, sizes, render)
    notes = base.notes + notes
    names = _size_names(sizes)
    n_in, n_ops = len(base.inputs), len(base.lines)
    folded = blocks.fold(body[n_in:n_in + n_ops], base.scopes, base.classes,
                         body[n_in + n_ops:], list(names.values()), [t.name for _, t in base.inputs],
                         enabled=not flat)
    body = body[:n_in] + list(folded.body) + list(folded.after)
    name_of = folded.renamed
    if freeze and not base.frozen_by_pattern:
        notes.append(f"--freeze `{freeze}` matched no parameter")
    if made := [o for o, name in base.param_of.items() if o.startswith("onnx::") and name not in base.frozen]:
        notes.append(f"{len(made)} weight{'s' if len(made) > 1 else ''} (`{made[0]}`{', ...' * (len(made) > 1)}) "
                     "the exporter computed from the model's (do_constant_folding): a transposed copy trains as "
                     "its weight would, a scaled or combined one does not; export with do_constant_folding=False "
                     "to keep each weight as PyTorch holds it")
    if src.rewritten:
        notes.append(f"the exporter's optimiser rewrote this file's weights ({len(src.rewritten)} its signature "
                     f"does not name, `{src.rewritten[0]}`{', ...' * (len(src.rewritten) > 1)}; equal ones merged): "
                     "it predicts as the PyTorch model does, but merged weights train as one, copies apart from "
                     "their originals, and folded constants as weights; export with torch.onnx.export(..., "
                     "optimize=False) to train it as PyTorch would")
    if half := sorted({HALF[v.dtype.name] for k, v in base.params.items() if k not in base.frozen
                       and v.dtype.name in HALF}):
        notes.append(f"the weights are {' and '.join(half)}: the model trains in {' and '.join(half)} throughout "
                     "(its parameters and optimiser state too); for f32 master weights, import with --f32 (the "
                     "weights widened exactly) and plan with --precision bf16")
    args = {names[s]: v for s, v in sizes.items() if s not in fixed}  # (an argument that changes nothing: none)
    stem = readable(src.path.rsplit("/", 1)[-1].rsplit(".", 1)[0])  # exporters name every graph alike
    model = stem if stem not in RESERVED else f"{stem}_model"
    head = [f"# Imported from {src.path.rsplit('/', 1)[-1]} ({src.producer or 'unknown producer'}, opset "
            f"{src.opset}) by `swapdsl import`.",
            f"model {model}({', '.join(f'{k} = {v}' for k, v in args.items())}) {{"]
    text = "\n".join(head[:1] + list(folded.defs) + head[1:] + [f"    {line}" for line in body] + ["}", ""])
    return Imported(text, model, {name_of.get(k, k): v for k, v in base.params.items()},
                    {name_of.get(k, k): v for k, v in base.running.items()}, tuple(notes),
                    tuple(name_of.get(k, k) for k in base.frozen))


def _sizes(src: Source, batch: int | None, dims: dict[str, int]) -> dict[str, int]:
    first = src.inputs[0].dims[0] if src.inputs[0].dims else 1
    sizes = {"batch": batch if batch is not None else first if isinstance(first, int) else 1}
    symbols = {d: i.name for i in src.inputs for d in i.dims[1:] if isinstance(d, str) and d != "batch"}
    for name in dims:  # (a name the file lacks first: `--dim seq=8` was told to give `sequence` a value)
        if name == "batch":
            raise SwpError("--dim batch: the batch is every input's first axis; give it with --batch")
        if name not in symbols:
            raise SwpError(f"--dim {name}: the file has no symbolic size of that name",
                           hints=[f"its sizes: {', '.join(sorted(symbols)) or '(only the batch)'}"])
    for d, owner in symbols.items():
        if d not in dims:
            raise SwpError(f"input `{owner}` has the symbolic size `{d}`; give it a value",
                           hints=[f"swapdsl import ... --dim {d}=N"])
        sizes[d] = dims[d]
    if any(v < 1 for v in sizes.values()):
        raise SwpError("sizes must be positive integers")
    return sizes


def _lowered_at_batch(src: Source, sizes: dict[str, int], freeze: str | None, batch: int | None) -> Lowering:
    """The graph lowered at ``sizes``; where ``batch`` differs from a batch the file writes as a number and
    only the file's own lowers, an error that says so (a static export's arithmetic fixes its batch)."""
    try:
        return lower(src, sizes, freeze)
    except SwpError as exc:
        first = src.inputs[0].dims[0] if src.inputs[0].dims else None
        if batch is None or not isinstance(first, int) or first == batch:
            given = ", ".join(f"--dim {k}={v}" for k, v in sizes.items() if k != "batch")
            if given and "broadcast" in exc.message:  # (a constant of the file may hold fewer rows than asked)
                exc.hints += (f"at {given}: if a smaller size imports, a constant of the file (a table of "
                              "positions?) has rows for fewer",)
            raise
        try:
            lower(src, {**sizes, "batch": first}, freeze)
        except SwpError:
            raise exc from None  # (the file fails at its own batch too: the first error is the one to show)
        raise SwpError(f"--batch {batch}: the file fixes the batch at {first} (its shape arithmetic has it as a "
                       "number, as a static export does)", hints=[
                           "import without --batch, or export with a dynamic batch (torch.onnx.export's "
                           "dynamic_shapes or dynamic_axes)"]) from None


def _size_names(sizes: Mapping[str, int]) -> dict[str, str]:
    """Each size's model argument: `batch`, and the file's symbolic sizes made readable."""
    return {s: "batch" if s == "batch" else _arg(s) for s in sizes}


def _arg(symbol: str) -> str:
    name = readable(symbol)
    return name if name not in RESERVED else f"{name}_size"


def _symbolic(src: Source, base: Lowering, sizes: dict[str, int],
              render: Callable[[Lowering], list[str]]) -> tuple[list[str], list[str], set[str]]:
    """``base``'s lines with each number that follows a size written as its product with those sizes; notes;
    the sizes fixed at their value (no model argument then)."""
    lines, notes = render(base), []
    bumped, fixed = {}, set()
    for s in sizes:
        try:
            bumped[s] = render(lower(src, {**sizes, s: sizes[s] + 1}, base.freeze and base.freeze.pattern))
        except SwpError:
            fixed.add(s)
            notes.append(f"`{s}` is fixed at {sizes[s]}: the graph does not import at {sizes[s] + 1} (a static "
                         "export, or a constant with rows for no more, such as a table of positions?), so the "
                         "model takes no argument for it")
            continue
        if len(bumped[s]) != len(lines):
            del bumped[s]
            fixed.add(s)
            notes.append(f"`{s}` is fixed at {sizes[s]}: the graph changes with it, so the model takes no "
                         "argument for it")
    names = _size_names(sizes)
    return [_line(k, line, bumped, sizes, names) for k, line in enumerate(lines)], notes, fixed


def _line(k: int, line: str, bumped: dict[str, list[str]], sizes: dict[str, int], names: dict[str, str]) -> str:
    numbers = [m for m in _INT.finditer(line)]
    others = {s: [int(m.group()) for m in _INT.finditer(b[k])] for s, b in bumped.items()}
    out, last = [], 0
    for j, m in enumerate(numbers):
        v = int(m.group())
        varying = [s for s, nums in others.items() if j < len(nums) and nums[j] != v]
        out.append(line[last:m.start()])
        out.append(_product(v, varying, sizes, names) if varying else m.group())
        last = m.end()
    return "".join(out) + line[last:]


def _product(v: int, symbols: list[str], sizes: dict[str, int], names: dict[str, str]) -> str:
    unit = math.prod(sizes[s] for s in symbols)
    if v % unit:
        raise SwpError(f"a size {v} follows {', '.join(symbols)} but is not a multiple of them",
                       hints=["import with fixed sizes instead (every symbolic size given with --dim and --batch)"])
    factor = v // unit
    return " * ".join(([str(factor)] if factor != 1 else []) + [names[s] for s in symbols])


def _declarations(lw: Lowering) -> list[str]:
    return [f"input {t.name}: {t.dtype}{list(t.shape)}" for _, t in lw.inputs] + lw.lines


def _outputs(src: Source, base: Lowering, loss: str | None, target: str, optimizer: str) -> list[str]:
    outs, lines = [], []
    for name in src.outputs:
        v = base.env[name]
        if isinstance(v, np.ndarray):
            raise SwpError(f"the graph's output `{name}` is a constant; nothing to compute")
        outs.append(v)
        out_name = readable(name)
        if out_name in base.taken and out_name != v.name:
            out_name = f"{out_name}_out"
        lines.append(f"output {out_name} = {v.name}")
    if loss is None:
        return lines
    pred = outs[0]
    if target in base.taken or target in RESERVED or not re.fullmatch(r"[A-Za-z_]\w*", target):
        raise SwpError(f"--target `{target}` is taken or not a name", hints=["pick another with --target"])
    if loss == "cross_entropy":
        lines += [f"input {target}: i32{list(pred.shape[:-1])}",
                  f"loss = softmax_cross_entropy({pred.name}, {target})",
                  f"report accuracy = mean(cast(argmax({pred.name}) == {target}, f32))"]
    else:
        lines += [f"input {target}: {pred.dtype}{list(pred.shape)}", f"loss = mse_loss({pred.name}, {target})"]
    return lines + [f"minimize loss with {optimizer}"]
