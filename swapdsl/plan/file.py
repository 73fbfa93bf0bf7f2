"""Plan files: the text form of a Plan, written atomically and read back exactly."""

from __future__ import annotations

import functools
import math
import json
from pathlib import Path
from typing import Any

import lark
from lark import Token, Transformer, v_args
import lark.exceptions
from lark.exceptions import UnexpectedInput

from swapdsl.common.atomic import write_text_atomically
from swapdsl.common.errors import Span, SwpError
from swapdsl.common.paths import GRAMMAR_DIR
from swapdsl.devices.profiles import Device
from swapdsl.graph.dataparallel import check_bucket, check_numbering, check_ranks
from swapdsl.graph.microbatch import MAX_MICROBATCHES
from swapdsl.graph.precision import GUARDS, PRECISIONS
from swapdsl.lang.loader import load, read_source
from swapdsl.plan.program import Free, HOST, HostRun, Origin, Plan, PlanOp, PlanTensor, Region, Run, SwapIn, SwapOut

VERSION = 4  # 4: recomputation; 3: a scratch region for kernels; 2: tensors at arena offsets; 1: slab classes
_DEVICE_SCALARS = ("memory_bytes", "mem_bw", "h2d_bw", "d2h_bw", "launch_s", "copy_latency_s",
                   "compute_efficiency", "memory_efficiency", "source")


def _q(s: str) -> str:
    return json.dumps(s)


def value_text(v: Any) -> str:
    """A model argument's value as `.swp` writes it (`true`, `0.1`, `\"same\"`)."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return repr(v)
    if isinstance(v, str):
        return _q(v)
    return str(v)


def _home(t: PlanTensor) -> str:
    if t.home is None:
        return ""
    return f" home {t.home if t.home == HOST else _region(t.home)}"


def _region(r: Region | str) -> str:
    assert isinstance(r, Region)
    return f"@{r.offset}+{r.size}"


def _instr(i: Any) -> str:
    if isinstance(i, Run):
        outs = " ".join(f"{_q(t)} {_region(r)}" + (" inplace" if i.in_place else "") for t, r in i.outs)
        return f"{'recompute' if i.recompute else 'run'} {i.op} {outs}"
    if isinstance(i, SwapIn):
        return f"swapin {_q(i.tensor)} {_region(i.region)} after {i.after} before {i.before}"
    if isinstance(i, SwapOut):
        return f"swapout {_q(i.tensor)} after {i.after}"
    if isinstance(i, HostRun):
        return f"host {i.op}"
    return f"free {_q(i.tensor)} after {i.after}"


def format_plan(plan: Plan) -> str:
    lines = [f"swapdsl-plan {VERSION}", f"model {_q(plan.model_path)} sha256 {_q(plan.model_sha256)}"]
    lines += [f"arg {k} {value_text(v)}" for k, v in plan.args]
    lines.append(f"method {plan.method}")
    if plan.precision != "f32":
        lines.append(f"precision {plan.precision}")
    if plan.guard != "none":
        lines.append(f"guard {plan.guard}")
    if plan.microbatches != 1:
        lines.append(f"microbatches {plan.microbatches}")
    if plan.ranks != 1:
        members = "".join(f" {b}" for b in plan.bucket_members)
        lines.append(f"ranks {plan.ranks} link {value_text(plan.link_gbps)} bucket {value_text(plan.bucket_mib)}"
                     + (f" members{members}" if members else ""))
    dev = " ".join(f"{k} {value_text(getattr(plan.device, k))}" for k in _DEVICE_SCALARS)
    lines.append(f"device {_q(plan.device.name)} {dev}")
    lines += [f"flops {k} {value_text(v)}" for k, v in plan.device.flops]
    lines.append(f"cap {plan.cap}")
    lines.append(f"scratch {plan.scratch}")
    lines += [f"tensor {_q(t.name)} bytes {t.bytes} kind {t.kind}{_home(t)}" for t in plan.tensors]
    for o in plan.ops:
        ins = "".join(f" {_q(n)}" for n in o.inputs)
        outs = "".join(f" {_q(n)}" for n in o.outputs)
        host = "" if o.host_ms is None else f" host_ms {value_text(o.host_ms)}"
        lines.append(f"op {o.index} {_q(o.op)} ms {value_text(o.ms)}{host} in{ins} out{outs}")
    lines.append(f"loss {_q(plan.loss)}")
    lines += [f"update {_q(old)} {_q(new)}" for old, new in plan.updates]
    lines += [_instr(i) for i in plan.program]
    lines += [f"figure {k} {value_text(v)}" for k, v in plan.figures]
    return "\n".join(lines) + "\n"


def write_plan(plan: Plan, path: str | Path) -> None:
    write_text_atomically(path, format_plan(plan), "plan")


# ---- reading ---------------------------------------------------------------------


@functools.cache
def _lark() -> lark.Lark:
    return lark.Lark((GRAMMAR_DIR / "plan.lark").read_text(encoding="utf-8"), parser="lalr",
                     lexer="contextual", propagate_positions=True)


def read_plan(path: str | Path) -> Plan:
    text = read_source(path, "a plan file")
    return parse_plan(text, str(path))


def parse_plan(text: str, file: str = "<plan>") -> Plan:
    if not text.lstrip().startswith("swapdsl-plan"):
        raise SwpError(f"`{file}` is not a plan file (plans start with `swapdsl-plan`)",
                       hints=["make one with `swapdsl optimize MODEL.swp --memory SIZE -o FILE.plan`"])
    try:
        tree = _lark().parse(text)
    except UnexpectedInput as exc:
        col = getattr(exc, "column", 1)
        raise SwpError(f"`{file}` is not a valid plan: unexpected input at line {exc.line}",
                       Span.point(file, exc.line, max(col, 1)),
                       hints=["plans are written by `swapdsl optimize`"]) from None
    try:
        return _Build(file).build(tree)
    except lark.exceptions.VisitError as exc:  # a statement refused while it was read
        if isinstance(exc.orig_exc, SwpError):
            raise exc.orig_exc from None
        if isinstance(exc.orig_exc, (ValueError, OverflowError)):  # a number of thousands of digits, a bad escape
            meta = getattr(exc.obj, "meta", None)
            line = getattr(meta, "line", 1) if meta is not None and not getattr(meta, "empty", True) else 1
            raise SwpError(f"`{file}` is not a valid plan: a value it cannot read ({exc.orig_exc})",
                           Span.point(file, line, 1), hints=["plans are written by `swapdsl optimize`"]) from None
        raise


def _number(tok: Token) -> int | float:
    return float(tok) if tok.type == "FLOAT" else int(tok)


def _value(tok: Token) -> int | float | bool | str:
    if tok.type == "STRING":
        return json.loads(tok)
    if tok.type in ("TRUE", "FALSE"):
        return tok.type == "TRUE"
    return _number(tok)


def _region_of(tok: Token) -> Region:
    offset, size = tok[1:].split("+")
    return Region(int(offset), int(size))


@v_args(meta=True)
class _Build(Transformer):
    """Collects each statement into the fields of a Plan."""

    def __init__(self, file: str) -> None:
        super().__init__()
        self.file = file
        self.f: dict[str, Any] = {"args": [], "device_fields": {}, "flops": [], "tensors": [],
                                  "ops": [], "updates": [], "program": [], "figures": []}
        self.lines: dict[str, list[int]] = {}
        self.seen: dict[tuple[str, str], int] = {}  # (statement, key) -> its line, for statements given once

    def _at(self, meta: Any, section: str, key: str | None = None) -> None:
        """Note the line of a statement; a statement (or key) that may appear once must not come twice."""
        if key is not None:
            first = self.seen.setdefault((section, key), meta.line)
            if first != meta.line:
                what = f"`{section}`" if key == "" else f"`{section} {key}`"
                raise self._err(meta, f"a second {what} line in the plan (the first is line {first})")
        self.lines.setdefault(section, []).append(meta.line)

    def build(self, tree: lark.Tree) -> Plan:
        self.transform(tree)
        f = self.f
        missing = [k for k in ("model", "method", "device", "cap", "scratch", "loss") if k not in f]
        if missing:
            raise SwpError(f"`{self.file}` is not a complete plan: no {', '.join(missing)} line",
                           Span.point(self.file, 1, 1), hints=["plans are written by `swapdsl optimize`"])
        dev = dict(f["device_fields"], name=f["device"], flops=tuple(f["flops"]))
        try:
            device = Device(**dev)
        except TypeError as exc:
            line = self.lines.get("device", [1])[0]
            raise SwpError(f"`{self.file}`: bad device line ({exc})", Span.point(self.file, line, 1)) from None
        origin = Origin(self.file, {k: tuple(v) for k, v in self.lines.items()})
        return Plan(f["model"][0], f["model"][1], tuple(f["args"]), f["method"], device, f["cap"], f["scratch"],
                    tuple(f["tensors"]), tuple(f["ops"]), f["loss"], tuple(f["updates"]),
                    tuple(f["program"]), tuple(f["figures"]), f.get("precision", "f32"), f.get("guard", "none"),
                    f.get("microbatches", 1), *f.get("ranks", (1, 0.0, 0.0, ())), origin=origin)

    def _err(self, meta: Any, message: str) -> SwpError:
        return SwpError(message, Span.point(self.file, meta.line, meta.column))

    def header(self, meta: Any, c: list[Token]) -> None:
        if int(c[0]) != VERSION:
            raise SwpError(f"plan format version {c[0]} is not supported (this swapdsl reads {VERSION})",
                           Span.point(self.file, meta.line, meta.column),
                           hints=["plans are tied to the swapdsl that wrote them: run `swapdsl optimize` again"])

    def model(self, meta: Any, c: list[Token]) -> None:
        self._at(meta, "model", "")
        self.f["model"] = (json.loads(c[0]), json.loads(c[1]))

    def arg(self, meta: Any, c: list[Token]) -> None:
        self._at(meta, "arg", str(c[0]))
        value = _value(c[1])
        if isinstance(value, float) and not math.isfinite(value):
            raise self._err(meta, f"model argument `{c[0]}` is {value}; expected a finite number")
        self.f["args"].append((str(c[0]), _value(c[1])))

    def method(self, meta: Any, c: list[Token]) -> None:
        self._at(meta, "method", "")
        self.f["method"] = str(c[0])

    def precision(self, meta: Any, c: list[Token]) -> None:
        self._at(meta, "precision", "")
        if str(c[0]) not in PRECISIONS or str(c[0]) == "f32":
            raise self._err(meta, f"unknown precision `{c[0]}` (plans name bf16 or f16; f32 has no line)")
        self.f["precision"] = str(c[0])

    def guard(self, meta: Any, c: list[Token]) -> None:
        self._at(meta, "guard", "")
        if str(c[0]) not in GUARDS or str(c[0]) == "none":
            raise self._err(meta, f"unknown guard `{c[0]}` (plans name skip or scale; none has no line)")
        self.f["guard"] = str(c[0])

    def microbatches(self, meta: Any, c: list[Token]) -> None:
        self._at(meta, "microbatches", "")
        if not 2 <= int(c[0]) <= MAX_MICROBATCHES:
            raise self._err(meta, f"`microbatches {c[0]}`: a plan runs 2 to {MAX_MICROBATCHES} micro-batches "
                                  "(1 has no line)")
        self.f["microbatches"] = int(c[0])

    def ranks(self, meta: Any, c: list[Any]) -> None:
        self._at(meta, "ranks", "")
        said = f"{c[0]} link {c[1]}" + (f" bucket {c[2]}" if len(c) > 2 else "")
        said += " members ..." if len(c) > 3 else ""
        try:
            link = float(_number(c[1]))
            bucket = check_bucket(float(_number(c[2]))) if len(c) > 2 else 0.0  # (a plan before buckets: none)
            members = c[3] if len(c) > 3 else ()
            check_numbering(members)
            self.f["ranks"] = check_ranks(int(c[0]), link)[0], link, bucket, members
        except SwpError as exc:
            raise self._err(meta, f"`ranks {said}`: {exc.message}") from None
        if int(c[0]) == 1:
            raise self._err(meta, "`ranks 1`: one rank has no line")

    def device(self, meta: Any, c: list[Any]) -> None:
        self._at(meta, "device", "")
        self.f["device"] = json.loads(c[0])
        for key, value in c[1:]:
            if key not in _DEVICE_SCALARS:
                raise self._err(meta, f"unknown device field `{key}`")
            if key in self.f["device_fields"]:
                raise self._err(meta, f"the device field `{key}` is given twice")
            self.f["device_fields"][key] = value

    def field(self, meta: Any, c: list[Token]) -> tuple[str, Any]:
        value = _value(c[1])
        return str(c[0]), float(value) if str(c[0]) not in ("memory_bytes", "source") else value

    def flops(self, meta: Any, c: list[Token]) -> None:
        self._at(meta, "flops", str(c[0]))
        self.f["flops"].append((str(c[0]), float(_number(c[1]))))

    def cap(self, meta: Any, c: list[Token]) -> None:
        self._at(meta, "cap", "")
        self.f["cap"] = int(c[0])

    def scratch(self, meta: Any, c: list[Token]) -> None:
        self._at(meta, "scratch", "")
        self.f["scratch"] = int(c[0])

    def tensor(self, meta: Any, c: list[Any]) -> None:
        self._at(meta, "tensor")
        home = c[3] if len(c) > 3 else None
        self.f["tensors"].append(PlanTensor(json.loads(c[0]), int(c[1]), str(c[2]), home))

    def home(self, meta: Any, c: list[Token]) -> Region | str:
        return HOST if c[0].type == "HOST" else _region_of(c[0])

    def op(self, meta: Any, c: list[Any]) -> None:
        self._at(meta, "op")
        host_ms = c[3] if len(c) == 6 else None
        self.f["ops"].append(PlanOp(int(c[0]), json.loads(c[1]), float(_number(c[2])), c[-2], c[-1], host_ms))

    def hostms(self, meta: Any, c: list[Token]) -> float:
        return float(_number(c[0]))

    def members(self, meta: Any, c: list[Token]) -> tuple[int, ...]:
        return tuple(int(t) for t in c)

    def ins(self, meta: Any, c: list[Token]) -> tuple[str, ...]:
        return tuple(json.loads(t) for t in c)

    outs = ins

    def loss(self, meta: Any, c: list[Token]) -> None:
        self._at(meta, "loss", "")
        self.f["loss"] = json.loads(c[0])

    def update(self, meta: Any, c: list[Token]) -> None:
        self._at(meta, "update")
        self.f["updates"].append((json.loads(c[0]), json.loads(c[1])))

    def run(self, meta: Any, c: list[Any]) -> None:
        self._run(meta, c, recompute=False)

    def recompute(self, meta: Any, c: list[Any]) -> None:
        self._run(meta, c, recompute=True)

    def _run(self, meta: Any, c: list[Any], recompute: bool) -> None:
        self._at(meta, "program")
        in_place = any(flag for _, _, flag in c[1:])
        self.f["program"].append(Run(int(c[0]), tuple((t, s) for t, s, _ in c[1:]), in_place, recompute))

    def out(self, meta: Any, c: list[Token]) -> tuple[str, Region, bool]:
        return json.loads(c[0]), _region_of(c[1]), len(c) > 2

    def swapin(self, meta: Any, c: list[Token]) -> None:
        self._at(meta, "program")
        self.f["program"].append(SwapIn(json.loads(c[0]), _region_of(c[1]), int(c[2]), int(c[3])))

    def swapout(self, meta: Any, c: list[Token]) -> None:
        self._at(meta, "program")
        self.f["program"].append(SwapOut(json.loads(c[0]), int(c[1])))

    def free(self, meta: Any, c: list[Token]) -> None:
        self._at(meta, "program")
        self.f["program"].append(Free(json.loads(c[0]), int(c[1])))

    def hostrun(self, meta: Any, c: list[Token]) -> None:
        self._at(meta, "program")
        self.f["program"].append(HostRun(int(c[1])))

    def figure(self, meta: Any, c: list[Token]) -> None:
        self._at(meta, "figure", str(c[0]))
        self.f["figures"].append((str(c[0]), float(_number(c[1]))))


def _model_candidates(plan: Plan, plan_path: str | Path) -> list[Path]:
    """Where the model may be: as the plan names it (from here, then from the plan's folder), then beside
    the plan by its file name alone."""
    given, folder = Path(plan.model_path), Path(plan_path).parent
    return list(dict.fromkeys([given, folder / given, folder / given.name]))


def locate_model(plan: Plan, plan_path: str | Path) -> Path | None:
    """The plan's model file if it can be found: the first candidate unchanged since the plan was made (one
    that changed is refused where no other is the model), else None."""
    changed: list[SwpError] = []
    unreadable: list[SwpError] = []
    for candidate in (c for c in _model_candidates(plan, plan_path) if c.is_file()):
        try:
            sha = load(candidate).sha256
        except SwpError as err:  # (not the model: said below if no other is)
            unreadable.append(err)
            continue
        if sha == plan.model_sha256:
            return candidate
        changed.append(_changed(plan, sha))
    if changed or unreadable:
        raise (changed or unreadable)[0]  # (a model that changed is the likelier story)
    return None


def find_model(plan: Plan, plan_path: str | Path) -> Path:
    """The plan's model file, unchanged since the plan was made."""
    found = locate_model(plan, plan_path)
    if found is None:
        raise SwpError(f"cannot find the plan's model `{plan.model_path}`", _model_span(plan),
                       hints=["run from the folder the plan was made in, or put the model beside the plan"])
    return found


def _model_span(plan: Plan) -> Span | None:
    line = plan.origin.line("model") if plan.origin is not None else None
    return Span.point(plan.origin.file, line, 1) if plan.origin is not None and line is not None else None


def _changed(plan: Plan, sha: str) -> SwpError:
    return SwpError(f"the model `{plan.model_path}` has changed since this plan was made", _model_span(plan),
                    hints=[f"plan made for sha256 {plan.model_sha256[:16]}..., the model now is {sha[:16]}...",
                           "run `swapdsl optimize` again"])
