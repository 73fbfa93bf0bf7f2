"""The `swapdsl` command line: argument parsing and printing around the library API (api.py)."""

from __future__ import annotations

import argparse
import difflib
import json
import math
import os
import re
import signal
import sys
import time
import traceback
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn, TextIO

from swapdsl import __version__, api
from swapdsl.common.atomic import check_outputs, check_writable, write_bytes_atomically, write_text_atomically
from swapdsl.common.drawing import pyplot
from swapdsl.common.errors import SwpError, path_refused
from swapdsl.common.units import format_bytes, format_count, parse_share, parse_size
from swapdsl.devices.costs import unmeasured_ops
from swapdsl.devices.profiles import BUILTIN, DEFAULT_DEVICE, Device, detect_device, load_device
from swapdsl.graph.analysis import untrained_note
from swapdsl.graph.ir import Graph
from swapdsl.graph.dataparallel import DEFAULT_BUCKET_MIB, DEFAULT_LINK_GBPS, MAX_BUCKET_MIB, MAX_RANKS, check_bucket
from swapdsl.graph.microbatch import MAX_MICROBATCHES
from swapdsl.graph.precision import GUARDS, PRECISIONS
from swapdsl.graph.printer import print_graph
from swapdsl.plan import show
from swapdsl.plan.figures import ONE_PASS_IDEAL
from swapdsl.plan.file import value_text
from swapdsl.plan.program import Plan
from swapdsl.plan.simulate import simulate
from swapdsl.planning import bench
from swapdsl.planning.ga import SearchOptions, SearchProgress
from swapdsl.planning.optimize import BUCKET_CHOICES, HOST_UPDATES, METHOD_NAMES
from swapdsl.planning.polish import ORDER_NAMES, POLISH_MAX_OPS, POLISH_MIN_S, POLISH_ORDERS, POLISH_SHARE
from swapdsl.runtime import dist
from swapdsl.runtime.backend import BACKENDS, array_module, device_memory_error
from swapdsl.runtime.progress import Progress
from swapdsl.runtime import training
from swapdsl.importer.text import LOSSES
from swapdsl.runtime.predict import npz_bytes, readable
from swapdsl.runtime.watchdog import DEFAULT_TIMEOUT_S
from swapdsl.runtime.dataset import Dataset
from swapdsl.runtime.log import plot_log, read_log
from swapdsl.runtime.profile import op_kind_totals, profile

EXIT_USER_ERROR = 2
MAX_SEED = training.MAX_SEED
MAX_POLISH = 0.9  # --polish: the search keeps at least a tenth of the budget
PROGRESS_EVERY_S = 5.0  # optimize's progress line when stderr is not a terminal
GUARD_HELP = ("none: updates apply as each gradient is ready; skip: after the whole backward pass, only if every "
              "gradient is finite (a step that is not leaves the state as it was); scale: skip, and dynamic loss "
              "scaling as torch.amp.GradScaler (the default for f16)")
PRECISION_HELP = ("f32 (the default: as the model is written), or bf16 / f16: matrix products and convolutions "
                  "take half inputs, activations are stored half, losses and reductions are f32, parameters keep "
                  "an f32 master copy (docs/design.md)")  # optimize's progress line when stderr is not a terminal


def _count(low: int, high: int | None = None) -> Callable[[str], int]:
    """An argparse type: an integer in [low, high]."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got `{text}`") from None
        if value < low or (high is not None and value > high):
            bounds = f"at least {low}" if high is None else f"from {low} to {high}"
            raise argparse.ArgumentTypeError(f"expected an integer {bounds}, got {value}")
        return value

    return parse


def _seconds(text: str) -> float:
    """An argparse type: a positive, finite number of seconds."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got `{text}`") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"expected a positive, finite number of seconds, got {text}")
    return value


def _float(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number such as 0.5, got `{text}`") from None


def _share(text: str) -> float:
    """An argparse type: a positive, finite share."""
    value = _float(text)
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"expected a positive, finite share, got {text}")
    return value


def _ratios(text: str) -> list[float]:
    """An argparse type: positive, finite memory ratios, each once, separated by commas."""
    try:
        values = [float(r) for r in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected numbers separated by commas, got `{text}`") from None
    if not all(math.isfinite(v) and v > 0 for v in values):
        raise argparse.ArgumentTypeError(f"expected positive, finite ratios, got {text}")
    return _once(values, text)


def _methods(text: str) -> list[str]:
    """An argparse type: planning methods, each once, separated by commas."""
    methods = text.split(",")
    if unknown := [m for m in methods if m not in METHOD_NAMES]:
        raise argparse.ArgumentTypeError(f"unknown method `{unknown[0]}` (methods: {', '.join(METHOD_NAMES)})")
    return _once(methods, text)


def _once(values: list[Any], text: str) -> list[Any]:
    if len(set(values)) != len(values):
        raise argparse.ArgumentTypeError(f"`{text}` names one twice")
    return values


def _polish(text: str) -> float:
    """An argparse type: the share of ga's budget for its exact polish, from 0 to MAX_POLISH."""
    value = _float(text)
    if not (math.isfinite(value) and 0 <= value <= MAX_POLISH):
        raise argparse.ArgumentTypeError(f"expected a share from 0 to {MAX_POLISH}, got {text}")
    return value


def _workers(text: str) -> int:
    cores = os.cpu_count() or 1
    value = _count(0)(text)
    if value > cores:
        raise argparse.ArgumentTypeError(f"this machine has {cores} cores; use at most {cores} (0: every core)")
    return value


def parse_defines(defines: Sequence[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for d in defines:
        key, sep, value = d.partition("=")
        if not sep or not key.strip() or not value.strip():
            raise SwpError(f"-D {d}: expected NAME=VALUE", hints=["e.g. -D batch=32"])
        out[key.strip()] = value.strip()
    return out


def _load(args: argparse.Namespace) -> api.Model:
    """The model a command names, with its -D arguments, precision, guard and micro-batches."""
    k = getattr(args, "microbatches", None)
    return api.load(args.file, parse_defines(args.define), args.precision or "f32", args.guard,
                    1 if k in (None, "auto") else k, getattr(args, "ranks", None) or 1,
                    _given(getattr(args, "network", None), DEFAULT_LINK_GBPS),
                    _given(_unless_auto(getattr(args, "bucket_mib", None)), DEFAULT_BUCKET_MIB))


def _unless_auto(value: float | str | None) -> float | None:
    return None if value == "auto" else value  # type: ignore[return-value]


def _given(value: float | None, default: float) -> float:
    return default if value is None else value


def _cmd_check(args: argparse.Namespace) -> int:
    model = _load(args)
    if args.ir:
        sys.stdout.write(print_graph(model.training if args.training else model.graph))
        return 0
    info = model.summary(training=args.training)
    note = untrained_note(model.training) if args.training else None
    if args.json:
        print(json.dumps(info | ({"notes": [note] if note else []} if args.training else {}), indent=2))
        return 0
    arg_text = " ".join(f"{k}={value_text(v)}" for k, v in info["args"].items()) or "(none)"
    rows = [
        ("arguments", arg_text),
        ("forward ops", str(info["forward_ops"])),
        ("tensors", str(info["tensors"])),
        ("inputs", f"{info['inputs']} ({format_bytes(info['input_bytes'])})"),
        ("parameters", f"{info['params']:,} in {info['param_tensors']} tensors ({format_bytes(info['param_bytes'])})"),
        ("forward FLOPs", format_count(info["forward_flops"], "FLOP")),
        ("activation peak", format_bytes(info["activation_peak_bytes"])),
        ("loss", f"{_loss_said(model.graph)}, {info['optimizer']}" if info["loss"]
         else "none: the model only predicts"),
        ("precision", f"{info['precision']}, guard {info['guard']}"),
    ]
    if args.training:
        passes = f", {model.microbatches} micro-batches" if model.microbatches > 1 else ""
        rows += [
            ("training ops", f"{info['ops']} ({info['backward_ops']} backward, {info['update_ops']} update)"),
            ("optimizer state", format_bytes(info["state_bytes"])),
            ("step FLOPs", format_count(info["flops"], "FLOP")),
            ("step peak", f"{format_bytes(info['peak_bytes'])} of tensors (default order, no swapping{passes})"),
            ("no-swap arena", f"{format_bytes(info['no_swap_bytes'])}{' in one pass' if passes else ''} (tensors "
                              "as plans place them, and the kernels' scratch: what --memory 1/2 halves)"),
        ]
        if passes:
            rows.append((f"{model.microbatches} micro-batches", f"{format_bytes(info['microbatched_no_swap_bytes'])} "
                         "no-swap arena (what a plan's memory ratio divides)"))
        if note:
            rows.append(("note", note))
    print(f"model {info['model']} ({args.file}): ok")
    for key, value in rows:
        print(f"  {key:<16} {value}")
    return 0


def _loss_said(g: Graph) -> str:
    """The loss by the op that makes it and its line (a `.swp` name is not kept in the graph: `%62`; inside
    a def, the def's line), or by its name where it has one (an imported model's)."""
    assert g.loss is not None
    t = g.tensors[g.loss]
    if not g.loss.startswith("%") or not t.label:
        return g.loss
    return f"{t.label}(...)" + (f" at line {t.span.line}" if t.span is not None else "")


def _cmd_exec(args: argparse.Namespace) -> int:
    dist.begin(args.rank_timeout)
    backend, _ = array_module(args.backend)
    options = training.Options(steps=args.steps, epochs=args.epochs, seed=args.seed, data=args.data,
                               shuffle=args.shuffle, eval=args.eval, eval_every=args.eval_every, save=args.save,
                               save_every=args.save_every, resume=args.resume, init=args.init, log=args.log,
                               on_nonfinite=args.on_nonfinite)
    for path, what in ((args.save, "checkpoint"), (args.log, "log")):
        if path is not None:
            check_writable(path, what)
    progress: list[Progress] = []
    header: list[str] = []  # what is run, printed once the data and checkpoints have been checked

    def start(first: int, last: int, ds: Dataset | None, seed: int) -> None:
        progress.append(Progress(last, ds.batches_per_epoch if ds else None, live=None if not args.json else False,
                                 every=max(1, -(-(last - first + 1) // 25))))  # (at most 25 lines and the last)
        if not args.json:
            data = (f"{ds.examples} examples of {args.data} ({ds.batches_per_epoch} batches of {ds.batch} an epoch"
                    + (f", {ds.dropped} in a partial batch left out" if ds.dropped else "") + ")"
                    if ds else "one synthetic batch")
            print(*header, sep="\n")
            print(f"  steps {first}..{last} on {data}" + (", shuffled" if args.shuffle else "")
                  + f", seed {seed}", flush=True)

    def quiet(method: str) -> Callable[[Any], None] | None:
        return None if args.json else lambda r: getattr(progress[-1], method)(r)

    hooks = training.Hooks(start, quiet("step"), quiet("evaluation"), quiet("save"))
    try:
        run = _execute(args, backend, options, hooks, header)
    finally:
        for p in progress:
            p.close()
    if args.json:  # (with the header's notes, which --json does not print)
        notes = [line.removeprefix("  note: ") for line in header if line.startswith("  note: ")]
        print(json.dumps(run.to_json() | {"notes": notes}, indent=2))
    else:
        _print_run(run, args.check)
    return 0


def _execute(args: argparse.Namespace, backend: str, options: training.Options, hooks: training.Hooks,
             header: list[str]) -> api.Execution:
    if api.is_plan_file(args.file):
        if args.define:
            raise SwpError("-D does not apply to a plan: its model arguments are fixed in the plan")
        plan, train = api.read_checked(args.file, need_model=True)
        assert train is not None
        for flag, given, planned in (("precision", args.precision, plan.precision), ("guard", args.guard, plan.guard),
                                     ("microbatches", args.microbatches, plan.microbatches),
                                     ("ranks", args.ranks, plan.ranks),
                                     ("bucket-mib", args.bucket_mib, plan.bucket_mib)):
            if given is not None and given != planned:
                raise SwpError(f"--{flag} {given}: the plan was made for {planned}",
                               hints=[f"a plan runs with the {flag} it was planned for; leave --{flag} out"])
        header.append(f"executing {args.file} ({train.name}, {plan.method} under {format_bytes(plan.cap)}) on {backend}")
        header += [f"  note: {note}" for note in [untrained_note(train)] if note]
        unused = [flag for flag, given in (("--tf32", args.tf32), ("--own-kernels", args.own_kernels),
                                           ("--graph off", args.graph == "off")) if given]
        if unused and backend != "cupy":
            header.append(f"  note: {' and '.join(unused)} {'apply' if len(unused) > 1 else 'applies'} on CuPy "
                          f"only: nothing changes on {backend}")
        run = api.execute_plan(plan, train, backend=backend, check=args.check, graph=args.graph == "on",
                               tf32=args.tf32, options=options, hooks=hooks, vendor_kernels=not args.own_kernels)
        if not args.json and backend == "cupy":
            print(f"  CUDA graph: {run.figures['graph']}")
            if train.ranks > 1:
                print(f"  all-reduces: {run.figures['collectives']}")
        return run
    if args.check and Path(args.file).exists():  # (a file that is not there is said so by _load)
        raise SwpError("--check compares a plan's execution with the reference executor; give a .plan file")
    model = _load(args)
    header.append(f"training {model.graph.name} ({args.file}) on {backend} with the reference executor (no cap)")
    header += [f"  note: {note}" for note in [untrained_note(model.training)] if note]
    return api.execute(model, backend=backend, options=options, hooks=hooks)


def _print_run(run: api.Execution, check: bool) -> None:
    first, last = run.losses[0], run.losses[-1]
    evals = run.outcome.evals if run.outcome else []
    held = (f"; held out: loss {evals[-1].loss:.6f}" + "".join(f", {k} {v:.4g}" for k, v in evals[-1].metrics.items())
            if evals else "")
    print(f"loss {first:.6f} -> {last:.6f} over {run.steps} steps, median step {run.steady_ms():.1f} ms{held}")
    skipped = sum(1 for m in run.metrics if m.get("finite", 1.0) != 1.0)
    if run.metrics and "finite" in run.metrics[-1]:
        scale = f"; loss scale now {run.metrics[-1]['loss_scale']:g}" if "loss_scale" in run.metrics[-1] else ""
        print(f"{skipped} steps skipped for a non-finite gradient (their updates not applied){scale}")
    if run.figures:
        f = run.figures
        workspace = (f" (cuBLAS's workspace, {format_bytes(f['blas_workspace_bytes'])} of it, beside the arena)"
                     if f["blas_workspace_bytes"] else "")
        compared = (f"; max rel diff against the reference {run.max_rel_diff:.2e} (in `{run.max_rel_diff_at}`)"
                    if check else "")
        print(f"simulated step {f['simulated_ms']:.3g} ms on {f['simulated_device']}; moved {format_bytes(f['h2d_bytes'])} in and "
              f"{format_bytes(f['d2h_bytes'])} out per step in a {format_bytes(f['device_arena_bytes'])} arena "
              f"({format_bytes(f['scratch_bytes'])} of it scratch); {format_bytes(f['device_bytes_allocated'])} "
              f"held on the device{workspace}{compared}")
        if run.backend == "numpy" and f["simulated_device"] in BUILTIN:
            print(f"  note: the simulated step is for a {f['simulated_device']} GPU, the device the plan was made "
                  f"for, not this CPU; `swapdsl profile MODEL.swp -o cpu.json` measures this machine and "
                  f"`swapdsl optimize ... --device cpu.json` plans for it")


def _cmd_predict(args: argparse.Namespace) -> int:
    check_writable(args.output, "prediction")
    if api.is_plan_file(args.file):
        if args.define:
            raise SwpError("-D does not apply to a plan: its model arguments are fixed in the plan")
        target: Any = api.read(args.file)  # (read and checked once)
    else:
        target = _load(args)
    started = time.perf_counter()
    outputs, held = api.predict_scored(target, args.data, args.init, args.backend, args.seed)  # (held: targets)
    seconds = time.perf_counter() - started
    written = readable(outputs)
    write_bytes_atomically(args.output, npz_bytes(written), "prediction")  # (once nothing else can fail)
    rows = next(iter(outputs.values())).shape[0]
    shapes = ", ".join(f"{k} {list(v.shape)} {written[k].dtype}" + (" (bf16, widened)" if v.dtype != written[k].dtype
                                                                      else "") for k, v in outputs.items())
    print(f"{args.output}: {rows} examples ({shapes}) in {seconds:.1f} s")
    if held is not None:
        figures = "".join(f", {k} {v:.4f}" for k, v in held.metrics.items())
        left = f"; the last {held.dropped} left out (no plan at that size)" if held.dropped else ""
        print(f"held out: loss {held.loss:.6f}{figures} ({held.examples} examples with their targets{left})")
    return 0


def _cmd_import(args: argparse.Namespace) -> int:
    dims = {}
    for d in args.dim:
        name, eq, value = d.partition("=")
        if not eq or not re.fullmatch(r"[0-9]{1,9}", value) or int(value) < 1:
            raise SwpError(f"--dim {d}: expected NAME=N with N a positive integer", hints=["e.g. --dim seq=128"])
        dims[name] = int(value)
    if args.loss is None and (args.target is not None or args.optimizer is not None):
        raise SwpError("--target and --optimizer shape the loss and its `minimize` line: give --loss too")
    m, r = api.import_onnx(args.file, args.output, args.weights, args.batch, dims, args.loss, args.target,
                           args.optimizer, args.freeze, args.flat, args.f32)
    weights = args.weights or str(Path(args.output).with_suffix(".safetensors"))
    count = sum(int(v.size) for v in r.params.values())
    print(f"{args.output}: model `{r.model}`, {len(r.text.splitlines())} lines, {len(m.graph.ops)} ops; "
          f"{weights}: {count:,} parameters in {len(r.params)} tensors"
          + (f" and the running statistics of {len(r.running)} batch norm{'s' if len(r.running) > 1 else ''}"
             if r.running else "")
          + (f"; {len(r.frozen)} of the tensors frozen" if r.frozen else ""))
    for note in r.notes:
        print(f"  note: {note}")
    print(f"  next: swapdsl predict {args.output} --init {weights} --data DIR -o out.npz"
          + (f"; swapdsl optimize {args.output} --memory SIZE -o net.plan" if args.loss else
             " (add --loss to train it)"))
    return 0


def _cmd_plot_log(args: argparse.Namespace) -> int:
    check_writable(args.output, "plot")
    notes: list[str] = []
    records = read_log(args.file, notes)
    plot_log(records, args.output, Path(args.file).stem)
    steps = [r for r in records if r["event"] == "step"]
    print(f"{args.output}: {len(steps)} steps, {sum(r['event'] == 'eval' for r in records)} evaluations")
    for note in notes:
        print(f"  note: {note}")
    return 0


def _cmd_optimize(args: argparse.Namespace) -> int:
    cap = args.memory if parse_share(args.memory) is not None else parse_size(args.memory)
    host = parse_size(args.host_memory) if args.host_memory is not None else None
    if args.output:
        check_writable(args.output, "plan")  # now, not after a search of a minute
    device = load_device(args.device)
    model = _load(args)
    given = {"budget_s": args.budget, "generations": args.generations, "population": args.population,
             "seed": args.seed, "workers": args.workers, "polish": args.polish}
    search = SearchOptions(**{k: v for k, v in given.items() if v is not None},
                           progress=None if args.json else _search_progress(sys.stderr))
    started = time.perf_counter()
    plan = api.optimize(model, cap, args.method, device, search, host_memory=host, host_updates=args.host_updates,
                        microbatches=args.microbatches,
                        bucket_mib="auto" if args.bucket_mib == "auto" else None)  # (a number: the model has it)
    if search.progress is not None and sys.stderr.isatty():
        sys.stderr.write("\n")
    seconds = time.perf_counter() - started
    if args.output:
        api.save(plan, args.output)
    info = {"method": plan.method, "device": device.name, "memory_bytes": plan.cap, **dict(plan.figures),
            "search_seconds": seconds, "plan": args.output, "microbatches": plan.microbatches}
    if plan.ranks > 1:
        info |= {"ranks": plan.ranks, "link_gbps": plan.link_gbps, "bucket_mib": plan.bucket_mib,
                 "buckets_searched": bool(plan.bucket_members)}
    info = _with_one_pass_fraction(info)
    notes = [note for note in [_beyond_device(plan, device), untrained_note(model.training),
                               _unprofiled_note(device, model, plan, args.device), *_unused_options(args, plan.ranks)]
             if note]
    if args.json:
        print(json.dumps(info | {"notes": notes}, indent=2))
        return 0
    runs = f" as {plan.microbatches} micro-batches" if plan.microbatches > 1 else ""
    if plan.ranks > 1:
        buckets = _size_said(plan.bucket_mib)
        if plan.bucket_members:
            buckets = f"{max(plan.bucket_members) + 1} buckets of members searched from {buckets}"
        runs += f" on {plan.ranks} ranks over {plan.link_gbps:g} Gb/s ({buckets})"
    print(f"{model.graph.name}: {plan.method} plan{runs} under {format_bytes(plan.cap)} on {device.name}"
          + (f", written to {args.output}" if args.output else ""))
    _print_figures(info)
    for note in notes:
        print(f"  note: {note}")
    return 0  # main turns this into 130 or 143 when a signal stopped the search


def _beyond_device(plan: Plan, device: Device) -> str | None:
    if plan.cap <= device.memory_bytes:
        return None
    return (f"the cap is more than the {format_bytes(device.memory_bytes)} {device.name} has: a study of the plan, "
            "not one that runs there (--device names the GPU to plan for)")


def _unprofiled_note(device: Device, model: api.Model, plan: Plan, spec: str | None) -> str | None:
    """Where a measured profile lacks some of the planned step's ops (measured on another model, batch,
    precision or micro-batch count), how many: those are estimated from its peak figures."""
    if not device.op_times:
        return None
    planned = model if plan.microbatches == model.microbatches else api.with_microbatches(model, plan.microbatches)
    missing, distinct = unmeasured_ops(device, planned.training)
    if not missing:
        return None
    return (f"the profile `{spec}` has no time for {missing} of this step's {distinct} distinct ops (measured on "
            "another model, batch, precision or micro-batch count?): they are estimated from its peak figures; "
            "`swapdsl profile` this model as planned to measure them")


SEARCH_FLAGS = ("budget", "generations", "population", "seed", "workers", "polish")  # optimize's, for ga


def _unused_options(args: argparse.Namespace, ranks: int) -> list[str]:
    """Notes on the flags given to optimize that change nothing in this plan: ga's search flags given to
    another method (exact reads --budget), and all-reduce flags on one rank."""
    search = [f"--{flag}" for flag in SEARCH_FLAGS if getattr(args, flag) is not None and args.method != "ga"
              and (args.method, flag) != ("exact", "budget")]
    net = [f"--{flag}" for flag, value in (("network", args.network), ("bucket-mib", args.bucket_mib))
           if value is not None and ranks == 1]
    why = "ga's search flags" + ("; exact reads --budget" if args.method == "exact" else "")
    return [f"{', '.join(flags)} {'do' if len(flags) > 1 else 'does'} nothing {where}" for flags, where in (
        (search, f"with --method {args.method} ({why})"), (net, "on one rank (no gradients are averaged)")) if flags]


def _size_said(mib: float) -> str:
    """A data-parallel plan's bucket size, in words."""
    return f"buckets of {mib:g} MiB" if mib else "one all-reduce per gradient"


def _search_progress(out: TextIO) -> Callable[[SearchProgress], None]:
    """A progress line: rewritten in place on a terminal, else one every PROGRESS_EVERY_S seconds."""
    live = out.isatty()
    shown = [-math.inf]

    def report(p: SearchProgress) -> None:
        passes = f"{p.microbatches} micro-batches, " if p.microbatches > 1 else ""
        if p.bucket_mib is not None:  # (data-parallel: the size searched, which ``--bucket-mib auto`` varies)
            size = _size_said(p.bucket_mib)
            passes += f"members searched from {size}, " if p.buckets_searched else f"{size}, "
        line = (f"ga: {p.seconds:5.1f} s of {p.budget_s:g} s, {passes}generation {p.generation}, best fraction "
                f"{p.best_fraction:.4f}, {p.evaluations:,} plans simulated")
        if p.polishing:
            line = (f"ga: {p.seconds:5.1f} s of {p.budget_s:g} s, best fraction {p.best_fraction:.4f}; the exact "
                    f"planner reworks it in up to {POLISH_ORDERS} orders (at most {p.polishing:.1f} s)")
        if p.interrupted:
            out.write(("\n" if live else "") + f"ga: interrupted after {p.seconds:.1f} s; keeping the best plan "
                      f"so far (fraction {p.best_fraction:.4f})\n")
        elif live:
            out.write(f"\r{line} ")
        elif p.seconds - shown[0] >= PROGRESS_EVERY_S or p.polishing:
            shown[0] = p.seconds
            out.write(line + "\n")
        out.flush()

    return report


def _print_figures(f: dict) -> None:
    swap_only = f", swap-only bound {f['swap_bound_ms']:.3f} ms" if "swap_bound_ms" in f else ""
    bound = f"bound {f['bound_ms']:.3f} ms" if "bound_ms" in f else "no bound recorded"
    print(f"  iteration        {f['iteration_ms']:.3f} ms   (ideal {f['ideal_ms']:.3f} ms, {bound}{swap_only})")
    if "one_pass_fraction" in f:  # (a micro-batched step's own ideal is slower than one pass's)
        print(f"  fraction         {f['one_pass_fraction']:.3f} of the infinite-memory speed (one pass: "
              f"{f['one_pass_ideal_ms']:.3f} ms; {f['fraction']:.3f} of this step's own ideal)")
    else:
        print(f"  fraction         {f['fraction']:.3f} of the infinite-memory speed")
    k = int(f.get("microbatches", 1))
    passes = f" in {k} micro-batches" if k > 1 else ""  # (`--memory 1/3` is a share of one pass's)
    if "ratio" in f:
        ratio = f"{f['ratio']:.2f}" if f["ratio"] >= 0.995 else f"{f['ratio']:.2g}, under 1: it fits with no swap"
        print(f"  memory ratio     {ratio} (no-swap arena{passes} {format_bytes(f['no_swap_bytes'])} / cap)")
    print(f"  swapped          {format_bytes(f['h2d_bytes'])} in, {format_bytes(f['d2h_bytes'])} out")
    print(f"  device peak      {format_bytes(f['peak_device_bytes'])} of tensors + "
          f"{format_bytes(f['scratch_bytes'])} of kernel scratch; host {format_bytes(f['host_bytes'])}")
    if "exact_schedule_ms" in f:
        proven = "the best" if f.get("exact_optimal") else "not proven best"
        print(f"  exact            {f['exact_schedule_ms']:.3f} ms, the program's value ({proven} of the phased "
              f"plans in this order; none of them below {f['exact_bound_ms']:.3f} ms)")
    if "search_seconds" in f:
        print(f"  search           {f['search_seconds']:.2f} s"
              + (f", {f['generations']:.0f} generations, {f['evaluations']:.0f} evaluations"
                 if "generations" in f else ""))
    if "polished_from_ms" in f:
        order = ORDER_NAMES[int(f.get("polish_order", 0))]
        print(f"  polish           the exact planner, in {order}: {f['polished_from_ms']:.3f} ms -> "
              f"{f['iteration_ms']:.3f} ms")


def _with_one_pass_fraction(info: dict[str, Any]) -> dict[str, Any]:
    """A micro-batched plan's speed as a fraction of one pass's ideal step (its own graph's is slower)."""
    one, step = info.get(ONE_PASS_IDEAL), info["iteration_ms"]
    return info if one is None or step <= 0 else info | {"one_pass_fraction": one / step}


def _cmd_simulate(args: argparse.Namespace) -> int:
    plan, train = api.read_checked(args.file)
    info = {"method": plan.method, "device": plan.device.name, "memory_bytes": plan.cap, **api.simulate(plan),
            "plan": args.file, "microbatches": plan.microbatches, "model_checked": train is not None}
    info = _with_one_pass_fraction(info)
    if args.json:
        print(json.dumps(info | {"notes": api.figure_notes(plan, info)}, indent=2))
        return 0
    against = "" if train is not None else (f" (the plan alone: its model `{plan.model_path}` was not found, so the "
                                            "ops were not checked against it)")
    print(f"{args.file}: valid{against}; simulated on {plan.device.name} under {format_bytes(plan.cap)}")
    _print_figures(info)
    for note in api.figure_notes(plan, info):
        print(f"  note: {note}")
    return 0


def _cmd_show(args: argparse.Namespace) -> int:
    if args.plot:
        check_writable(args.plot, "plot")
        pyplot("--plot")  # (before the summary: matplotlib missing is said first)
    plan, train = api.read_checked(args.file)
    labels = {name: t.title for name, t in train.tensors.items()} if train is not None else None
    print(show.summary(plan, simulate(plan), labels))
    if args.plot:
        show.plot(plan, args.plot, labels)
        print(f"timeline written to {args.plot}")
    return 0


def _cmd_profile(args: argparse.Namespace) -> int:
    check_writable(args.output, "profile")
    model = _load(args)
    backend, xp = array_module(args.backend)
    base = load_device(args.base)
    notes: list[str] = []
    measured = profile(model.training, xp, backend, base, args.repeat, notes=notes)
    write_text_atomically(args.output, json.dumps(measured.to_json(), indent=2) + "\n", "profile")
    kinds = op_kind_totals(model.training, dict(measured.op_times))
    step = sum(t for _, _, t in kinds)
    print(f"kernel time of one step: {1e3 * step:.1f} ms; costliest ops: " + ", ".join(
        f"{name} {1e3 * t:.1f} ms ({100 * t / step:.0f}%, {n} ops)" for name, n, t in kinds[:6]))
    for note in notes:
        print(f"note: {note}")
    print(f"profiled {len(model.training.ops)} ops ({len(measured.op_times)} distinct) of {model.graph.name} on "
          f"{backend}: host->device {measured.h2d_bw / 1e9:.1f} GB/s, device->host {measured.d2h_bw / 1e9:.1f} GB/s, "
          f"memory {measured.mem_bw / 1e9:.1f} GB/s, launch {1e6 * measured.launch_s:.1f} us; "
          f"written to {args.output}")
    return 0


def _a_path(arg: str) -> bool:
    return Path(arg).is_file() or os.sep in arg or arg.endswith(".swp")


def _cmd_bench(args: argparse.Namespace) -> int:
    ratios, methods = args.ratios, args.methods
    # (zoo names with commas too, as --ratios and --methods take them; a path stays whole)
    args.models = [m for arg in args.models for m in ([arg] if _a_path(arg) else arg.split(",")) if m]
    if not args.models:
        raise SwpError("--models names no model", hints=[f"zoo models: {', '.join(bench.ZOO)}; or .swp files"])
    if args.out:
        out = Path(args.out)
        check_outputs([(out / name, "bench output") for name in bench.OUTPUTS],
                      [(m, "model") for m in args.models if Path(m).suffix] + [(args.device, "device profile")])
        bench.output_folder(out)
    search = SearchOptions(budget_s=args.budget, generations=args.generations, seed=args.seed, workers=args.workers)
    rows = bench.rows(args.models, ratios, methods, load_device(args.device or DEFAULT_DEVICE), search,
                      log=None if args.json else print,
                      host=(parse_size(args.host_memory) if args.host_memory is not None else None, args.host_share),
                      precision=args.precision or "f32", guard=args.guard, microbatches=args.microbatches or 1)
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        print()
        print(bench.markdown(rows, methods), end="")
    if args.out:
        for path in bench.write_outputs(rows, methods, Path(args.out)):
            print(f"wrote {path}", file=sys.stderr)
    return 0


def _cmd_devices(args: argparse.Namespace) -> int:
    if args.json:
        print(json.dumps({name: d.to_json() for name, d in BUILTIN.items()}, indent=2))
        return 0
    default = detect_device()
    print(f"{'device':<11} {'memory':>9} {'f32 TFLOP/s':>12} {'f16 TFLOP/s':>12} {'HBM GB/s':>9} {'link GB/s':>10}")
    for name, d in BUILTIN.items():
        mark = "  (default)" if name == default else ""
        print(f"{name:<11} {format_bytes(d.memory_bytes):>9} {d.peak_flops('f32') / 1e12:>12.1f} "
              f"{d.peak_flops('f16') / 1e12:>12.1f} {d.mem_bw / 1e9:>9.0f} {d.h2d_bw / 1e9:>10.0f}{mark}")
        print(f"{'':<11} {d.source}")
    return 0


class _UsageError(SwpError):
    """A command line argparse refused (``speak``: this rank prints it; ``_agreed``)."""

    speak = True


# each command's files: (the attribute of each output, what it is), (each input's), and the (output, input)
# kinds that may be one file; a data folder's files are its inputs (atomic.check_outputs)
_FILES: dict[str, tuple[tuple[tuple[str, str], ...], tuple[tuple[str, str], ...], tuple[tuple[str, str], ...]]] = {
    "optimize": ((("output", "plan"),), (("file", "model"), ("device", "device profile")), ()),
    "exec": ((("save", "checkpoint"), ("log", "log")), (("file", "plan or model"),), ()),  # (the data: Options)
    "predict": ((("output", "prediction"),), (("file", "plan or model"), ("data", "data"),
                                              ("init", "checkpoint")), ()),
    "plot-log": ((("output", "plot"),), (("file", "log"),), ()),
    "show": ((("plot", "plot"),), (("file", "plan"),), ()),
    "profile": ((("output", "profile"),), (("file", "model"),), ()),
}


def _check_files(args: argparse.Namespace) -> None:
    """No output of the command overwrites one of its inputs or another output (before any work)."""
    outputs, inputs, may_replace = _FILES.get(args.command, ((), (), ()))
    check_outputs([(getattr(args, a), what) for a, what in outputs],
                  [(getattr(args, a), what) for a, what in inputs], may_replace)


def _agreed(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace:
    """The parsed command line, once every rank's has parsed: under an MPI launcher a rank whose line is
    refused stops every rank (``dist.command_lines``), without an abort; each error is printed once. So
    does one that printed ``--help`` or ``--version`` (it exits 0; the others, 2)."""
    try:
        args, refused = parser.parse_args(argv), None
    except _UsageError as err:
        args, refused = None, err
    except SystemExit:  # (argparse printed the help or the version)
        dist.command_lines("")
        raise
    timeout_s = getattr(args, "rank_timeout", DEFAULT_TIMEOUT_S)  # (this rank's, where its line gives one)
    stop, speak = dist.command_lines(None if refused is None else refused.render(), timeout_s)
    if refused is None and stop:
        raise dist.Silent("another rank's command line was refused")
    if refused is not None:
        refused.speak = speak
        raise refused
    return args


class _Parser(argparse.ArgumentParser):
    """argparse, with its errors reported like every other mistake (one message, exit code 2); a misspelt
    option is named (argparse names a missing required one first), with the options it is close to."""

    _given: Sequence[str] = ()
    _last: _Parser | None = None  # the innermost parser that read the line: the command's, once one is named

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        # a value that starts with a minus and a digit is a value (`--memory -5%`, `--seed -1`), so that its
        # own check says what is wrong with it, not argparse's "expected one argument"
        self._negative_number_matcher = re.compile(r"^-\d")

    def parse_known_args(self, args: Sequence[str] | None = None, namespace: Any = None) -> Any:
        self._given = list(sys.argv[1:] if args is None else args)
        _Parser._last = self
        return super().parse_known_args(args, namespace)

    def error(self, message: str) -> NoReturn:
        hints, unknown, options = [f"see `{self.prog} --help`"], [], []
        if message.startswith("the following arguments are required") and (unknown := self._unknown()):
            message = f"unrecognized option{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}"
            options = self._long_options()
        elif chosen := re.match(r"argument COMMAND: invalid choice: '?([^' ]*)", message):  # a misspelt command
            unknown, options = [chosen.group(1)], self._subcommands()
        elif message.startswith("unrecognized arguments") and (last := _Parser._last) is not None:
            unknown = [a.split("=")[0] for a in message.split(":", 1)[1].split() if a.startswith("--")]
            options, hints = last._long_options(), [f"see `{last.prog} --help`"]
        close = difflib.get_close_matches(unknown[0], options, n=1) if unknown else []
        raise _UsageError(message, hints=[f"did you mean {c}?" for c in close] + hints)

    def _unknown(self) -> list[str]:
        """The options on the line (before a `--`) that are none of this parser's, nor a prefix of one."""
        given = list(self._given)
        given = given[:given.index("--")] if "--" in given else given
        names = [a.split("=")[0] for a in given if a.startswith("--")]
        return [o for o in names if o not in self._option_string_actions
                and not (self.allow_abbrev and self._get_option_tuples(o))]

    def _long_options(self) -> list[str]:
        return [o for o in self._option_string_actions if o.startswith("--")]

    def _subcommands(self) -> list[str]:
        return sorted(name for a in self._actions if isinstance(a, argparse._SubParsersAction) for name in a.choices)


def _precision_options(parser: argparse.ArgumentParser, auto: bool = False) -> None:
    parser.add_argument("--precision", choices=PRECISIONS, help=PRECISION_HELP)
    parser.add_argument("--guard", choices=GUARDS, help=GUARD_HELP)
    parser.add_argument("--microbatches", type=_microbatches(auto), metavar="K" + ("|auto" if auto else ""),
                        help="run each step's batch as K forward and backward passes and one update (gradient "
                             "accumulation; default 1)" + ("; auto: the count among the batch's divisors whose "
                                                          "plan is fastest" if auto else ""))
    parser.add_argument("--ranks", type=_whole(1, MAX_RANKS), metavar="N",
                        help="train data-parallel on N processes (`mpiexec -n N swapdsl exec`), each on the model's "
                             "batch of a batch N times larger, gradients averaged over them (default 1)")
    parser.add_argument("--network", type=float, metavar="GBPS",
                        help=f"the ranks' network link in Gb/s, for planning (default {DEFAULT_LINK_GBPS:g})")
    parser.add_argument("--bucket-mib", type=_bucket(auto), metavar="MIB" + ("|auto" if auto else ""),
                        help="average the ranks' gradients in buckets of about MIB MiB, one all-reduce each, as "
                             f"PyTorch's DDP does (default {DEFAULT_BUCKET_MIB:g}; 0: one all-reduce per gradient"
                             + (f"; auto: the size among {', '.join(f'{b:g}' for b in BUCKET_CHOICES)} whose plan "
                                "is fastest)" if auto else ")"))


def _whole(low: int, high: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            n = int(text)
        except ValueError:
            n = low - 1
        if not low <= n <= high:
            raise argparse.ArgumentTypeError(f"expected a whole number from {low} to {high}, got `{text}`")
        return n
    return parse


def _bucket(auto: bool) -> Callable[[str], float | str]:
    def parse(text: str) -> float | str:
        if auto and text == "auto":
            return text
        try:
            return check_bucket(float(text))
        except (ValueError, SwpError):
            only = " (auto is for `optimize` alone)" if text == "auto" else ""
            raise argparse.ArgumentTypeError(f"expected a size in MiB from 0 to {MAX_BUCKET_MIB}"
                                             + (" or auto" if auto else "") + f", got `{text}`{only}") from None
    return parse


def _microbatches(auto: bool) -> Callable[[str], int | str]:
    def parse(text: str) -> int | str:
        if auto and text == "auto":
            return text
        try:
            k = int(text)
        except ValueError:
            k = 0
        if not 1 <= k <= MAX_MICROBATCHES:
            raise argparse.ArgumentTypeError(f"expected a whole number from 1 to {MAX_MICROBATCHES}"
                                             + (" or auto" if auto else "") + f", got `{text}`")
        return k
    return parse


def make_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="swapdsl", description="Train models larger than GPU memory.")
    p.add_argument("--version", action="version", version=f"swapdsl {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    check = sub.add_parser("check", help="parse and elaborate a .swp model, print its figures or IR")
    check.add_argument("file", metavar="FILE.swp")
    _precision_options(check)
    check.add_argument("-D", dest="define", action="append", default=[], metavar="NAME=VALUE",
                       help="override a model argument (repeatable)")
    out = check.add_mutually_exclusive_group()
    out.add_argument("--ir", action="store_true", help="print the forward IR")
    out.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    check.add_argument("--training", action="store_true",
                       help="also build the training graph (backward and optimiser ops) and report on it")
    check.set_defaults(handler=_cmd_check)

    ex = sub.add_parser("exec", help="run a plan under its cap, or train a .swp model with the reference executor")
    ex.add_argument("file", metavar="FILE.plan|FILE.swp")
    _precision_options(ex)
    ex.add_argument("-D", dest="define", action="append", default=[], metavar="NAME=VALUE",
                    help="override a model argument (repeatable)")
    length = ex.add_mutually_exclusive_group()
    length.add_argument("--steps", type=_count(1), help="train until this step (default: one epoch of --data, "
                        "or 10 steps of synthetic data)")
    length.add_argument("--epochs", type=_count(1), help="train until this many passes over --data")
    ex.add_argument("--seed", type=_count(0, MAX_SEED - 1), help="seed for parameters, synthetic data and "
                    "shuffling (default 0; with --resume, the checkpoint's)")
    ex.add_argument("--data", default=training.SYNTHETIC, metavar="DIR|FILE.npz|synthetic",
                    help="training data: NAME.npy per model input (first axis: examples) in a folder, or one "
                         ".npz; read through memory maps (default: one synthetic batch, repeated)")
    ex.add_argument("--shuffle", action="store_true", help="shuffle the examples every epoch (by --seed)")
    ex.add_argument("--eval", metavar="DIR|FILE.npz", help="held-out data: mean loss and reports on it at the end")
    ex.add_argument("--eval-every", type=_count(1), default=0, metavar="N", help="and every N steps")
    ex.add_argument("--save", metavar="FILE.safetensors", help="checkpoint (parameters, optimiser state, step, "
                    "data position) at the end, on Ctrl-C, and every --save-every steps")
    ex.add_argument("--save-every", type=_count(1), default=0, metavar="N", help="checkpoint every N steps")
    start = ex.add_mutually_exclusive_group()
    start.add_argument("--resume", metavar="FILE.safetensors", help="continue the run that wrote this checkpoint")
    start.add_argument("--init", metavar="FILE.safetensors", help="start from this checkpoint's parameters")
    ex.add_argument("--log", metavar="FILE.jsonl", help="append one JSON object per step, evaluation and "
                    "checkpoint (swapdsl plot-log draws it)")
    ex.add_argument("--on-nonfinite", choices=training.ON_NONFINITE, default="stop",
                    help="when a step's loss (or the state to checkpoint) is NaN or infinite: stop with exit 2, "
                         "naming the op that made the first such value, and save nothing (default); skip (a "
                         "guarded plan, --guard skip|scale: its skipped steps go on); or continue regardless")
    ex.add_argument("--backend", choices=BACKENDS, default="auto", help="array backend (default auto)")
    ex.add_argument("--check", action="store_true",
                    help="(plans) run the reference executor beside it and compare every loss and parameter")
    ex.add_argument("--graph", choices=("on", "off"), default="on",
                    help="(plans, CuPy) capture each step as one CUDA graph and replay it (default on; where capture "
                         "fails the run says why and runs eagerly)")
    ex.add_argument("--tf32", action="store_true",
                    help="(plans, CuPy) let FP32 matrix products and convolutions use TF32 tensor cores: faster, "
                         "about 1e-3 relative from the FP32 reference instead of 1e-6")
    ex.add_argument("--own-kernels", action="store_true",
                    help="(plans, CuPy) swapdsl's own kernels only, no cuDNN graphs or fused kernels: the "
                         "reference's, so that --check measures the plan alone")
    ex.add_argument("--rank-timeout", type=_seconds, default=DEFAULT_TIMEOUT_S, metavar="SECONDS",
                    help="(data-parallel) how long a rank waits for the others in an all-reduce before the run "
                         f"stops with exit 2, naming the rank that did not come (default {DEFAULT_TIMEOUT_S:g})")
    ex.add_argument("--json", action="store_true", help="print one JSON object instead of a line per step")
    ex.set_defaults(handler=_cmd_exec)

    pd = sub.add_parser("predict", help="a model's outputs for every example: a plan's forward graph under its cap, "
                        "or a .swp model with the reference executor")
    pd.add_argument("file", metavar="FILE.plan|FILE.swp")
    pd.add_argument("-D", dest="define", action="append", default=[], metavar="NAME=VALUE",
                    help="(models) override a model argument (repeatable)")
    pd.add_argument("--data", required=True, metavar="DIR|FILE.npz",
                    help="the inputs the outputs need: NAME.npy per input in a folder, or one .npz")
    pd.add_argument("--init", metavar="FILE.safetensors", help="the parameters (and running statistics) to "
                    "predict with, as `exec --save` wrote them (default: the seed's initialisation)")
    pd.add_argument("-o", dest="output", required=True, metavar="FILE.npz",
                    help="write each `output` of the model, one row per example in the data's order")
    pd.add_argument("--seed", type=_count(0, MAX_SEED - 1), default=0, help="seed of the initialisation without --init")
    pd.add_argument("--backend", choices=BACKENDS, default="auto", help="array backend (default auto)")
    pd.set_defaults(handler=_cmd_predict, precision=None, guard=None, microbatches=None)

    im = sub.add_parser("import", help="an ONNX model as a .swp file and its weights as a checkpoint --init reads")
    im.add_argument("file", metavar="FILE.onnx")
    im.add_argument("-o", dest="output", required=True, metavar="FILE.swp", help="the model to write")
    im.add_argument("--weights", metavar="FILE.safetensors",
                    help="where its weights go (default: FILE.swp's name with .safetensors)")
    im.add_argument("--batch", type=_count(1), help="the batch: every input's first axis (default: the file's size "
                    "there, else 1); a model argument of the .swp")
    im.add_argument("--dim", action="append", default=[], metavar="NAME=N",
                    help="a size for one of the file's other symbolic dimensions (repeatable)")
    im.add_argument("--loss", choices=LOSSES, help="add a target input and a loss on the first output, and a "
                    "`minimize` line (without it the model predicts only)")
    im.add_argument("--target", metavar="NAME", help="the target input's name (target)")
    im.add_argument("--optimizer", metavar="TEXT",
                    help="the `minimize` line's optimiser, as the language writes it (sgd(lr = 0.01))")
    im.add_argument("--freeze", metavar="REGEX", help="declare `frozen` (loaded, never trained) the parameters whose "
                    "ONNX or .swp name matches (constants the graph computes always are)")
    im.add_argument("--flat", action="store_true", help="one line per op: no `def` for repeated modules")
    im.add_argument("--f32", action="store_true", help="a bf16 or f16 export as f32 (its weights widened exactly), "
                    "to train with f32 master weights under optimize --precision bf16")
    im.set_defaults(handler=_cmd_import)

    pl = sub.add_parser("plot-log", help="draw a training log (exec --log): loss and reports against the step")
    pl.add_argument("file", metavar="FILE.jsonl")
    pl.add_argument("-o", "--output", required=True, metavar="OUT.png", help="a .png, .pdf or .svg file")
    pl.set_defaults(handler=_cmd_plot_log)

    op = sub.add_parser("optimize", help="plan a training step under a memory cap")
    op.add_argument("file", metavar="FILE.swp")
    op.add_argument("--memory", required=True, metavar="SIZE", help="the cap: 8GiB, 512MiB, 1.5GB, bytes, or a share "
                    "of the no-swap arena of one pass (`check --training` shows it): 1/3, 33%%")
    op.add_argument("--method", choices=METHOD_NAMES, default="ga", help="planner (default ga)")
    op.add_argument("--host-memory", metavar="SIZE", help="the most host memory the plan's host copies may take "
                    "(default: any); ga and capuchin trade swaps for recomputation to keep within it")
    op.add_argument("--host-updates", choices=HOST_UPDATES, default="none",
                    help="where the optimiser updates run: none on the device (the default), all on the host "
                         "(only gradients and the forward's weights cross the bus), auto: the largest parameters' on "
                         "the host where the simulated step is faster")
    # (no defaults here: SearchOptions has them, and a flag given to a method that does not search is said so)
    op.add_argument("--budget", type=_seconds, metavar="SECONDS",
                    help="ga: wall-clock budget; exact: the solver's time limit (60)")
    op.add_argument("--generations", type=_count(1), help="ga: generation limit (100000)")
    op.add_argument("--population", type=_count(2, 100_000), help="ga: candidates per generation (64)")
    op.add_argument("--seed", type=_count(0, MAX_SEED - 1), help="ga: random seed (0)")
    op.add_argument("--workers", type=_workers, help="ga: worker processes (0: every core)")
    op.add_argument("--polish", type=_polish, metavar="SHARE",
                    help=f"ga, on graphs of at most {POLISH_MAX_OPS} ops, one rank, updates on the device: the "
                    f"share of the budget in which the exact planner reworks the best plan in its own order (0: "
                    f"none; default {POLISH_SHARE:g}; after a search its generation limit stopped early: the "
                    f"search's time x SHARE / (1 - SHARE), at least {POLISH_MIN_S:g} s)")
    op.add_argument("--device", metavar="NAME|FILE.json", help="device profile (default: the GPU found, "
                    f"else {DEFAULT_DEVICE})")
    _precision_options(op, auto=True)
    op.add_argument("-D", dest="define", action="append", default=[], metavar="NAME=VALUE",
                    help="override a model argument (repeatable)")
    op.add_argument("-o", "--output", metavar="FILE.plan", help="write the plan here (atomically)")
    op.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    op.set_defaults(handler=_cmd_optimize)

    sim = sub.add_parser("simulate", help="validate a plan and recompute its figures from the plan alone")
    sim.add_argument("file", metavar="FILE.plan")
    sim.add_argument("--json", action="store_true")
    sim.set_defaults(handler=_cmd_simulate)

    sh = sub.add_parser("show", help="summarise a plan; --plot draws its timeline")
    sh.add_argument("file", metavar="FILE.plan")
    sh.add_argument("--plot", metavar="OUT.png",
                    help="draw the three streams and device memory (matplotlib): a .png, .pdf or .svg file")
    sh.set_defaults(handler=_cmd_show)

    pr = sub.add_parser("profile", help="measure op times and copy bandwidth on this backend into a profile")
    pr.add_argument("file", metavar="FILE.swp")
    _precision_options(pr)
    pr.add_argument("-D", dest="define", action="append", default=[], metavar="NAME=VALUE",
                    help="override a model argument (repeatable)")
    pr.add_argument("-o", "--output", required=True, metavar="PROFILE.json")
    pr.add_argument("--backend", choices=BACKENDS, default="auto")
    pr.add_argument("--repeat", type=_count(1), default=5, help="timed runs per op (median; default 5)")
    pr.add_argument("--base", metavar="NAME", help="profile supplying what is not measured (memory size, FLOP/s)")
    pr.set_defaults(handler=_cmd_profile)

    be = sub.add_parser("bench", help="plan every (model, ratio, method) and tabulate fraction, time, swap, search")
    be.add_argument("--models", nargs="+", default=list(bench.ZOO),
                    help="zoo names or .swp files (separated by spaces or commas)")
    be.add_argument("--ratios", type=_ratios, default=[2.0, 4.0, 8.0, 12.0],
                    help="memory ratios, comma-separated (2,4,8,12)")
    be.add_argument("--methods", type=_methods, default=["lru", "vdnn", "belady", "ga"],
                    help="comma-separated (lru,vdnn,belady,ga)")
    be.add_argument("--device", help=f"device profile (default {DEFAULT_DEVICE})")
    be.add_argument("--precision", choices=PRECISIONS, help="plan every model under this precision (f32)")
    be.add_argument("--guard", choices=GUARDS, help="and this guard (default: scale for f16, else none)")
    be.add_argument("--microbatches", type=_microbatches(True), metavar="K|auto",
                    help="plan each step as K micro-batches, or auto (the fraction stays that of one pass over "
                         "the whole batch)")
    be.add_argument("--host-memory", metavar="SIZE", help="a host budget for every plan (default: any)")
    be.add_argument("--host-share", metavar="SHARE", type=_share,
                    help="a host budget per row: this share of what belady keeps on the host at that cap (e.g. 0.5)")
    be.add_argument("--budget", type=_seconds, default=60.0, metavar="SECONDS", help="ga budget per plan (60)")
    be.add_argument("--generations", type=_count(1), default=100_000, help="ga generation limit per plan (100000)")
    be.add_argument("--seed", type=_count(0, MAX_SEED - 1), default=0)
    be.add_argument("--workers", type=_workers, default=0, help="ga worker processes (0: every core)")
    be.add_argument("--json", action="store_true", help="print the rows as JSON")
    be.add_argument("--out", metavar="DIR", help="write bench.json, bench.md and fraction.png here")
    be.set_defaults(handler=_cmd_bench)

    dv = sub.add_parser("devices", help="list the built-in device profiles")
    dv.add_argument("--json", action="store_true")
    dv.set_defaults(handler=_cmd_devices)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command: 0 on success, 2 on a mistake, 128 + the signal's number when SIGINT (130) or
    SIGTERM (143) stopped it (an interrupted search still writes its best plan first)."""
    received: list[int] = []
    previous = _catch_signals(received)
    # NaN and infinity are the guard's business (exec --on-nonfinite): no NumPy warning per kernel
    warnings.filterwarnings("ignore", r"(overflow|invalid value|divide by zero) encountered", RuntimeWarning)
    try:
        args = _agreed(make_parser(), argv)
        _check_files(args)
        if dist.rank() > 0:  # one of several ranks: rank 0 speaks for the run (errors are each rank's own)
            sys.stdout = open(os.devnull, "w", encoding="utf-8")  # noqa: SIM115 (for the process's life)
        code = args.handler(args)
        if received:  # the search kept its best plan and the command finished: still report the signal
            print(f"swapdsl: stopped by {signal.Signals(received[0]).name}", file=sys.stderr)
            return 128 + received[0]
        return code
    except _UsageError as err:
        if err.speak:
            print(err.render(), file=sys.stderr)
        return EXIT_USER_ERROR
    except SwpError as err:
        if isinstance(err, dist.Silent):  # (the rank that stopped printed why)
            return EXIT_USER_ERROR
        if not isinstance(err, dist.EveryRank) and dist.starting():  # the others wait at a start check
            if dist.failed_at_start(err.render()):
                print(err.render(), file=sys.stderr)
            return EXIT_USER_ERROR
        if not (isinstance(err, dist.EveryRank) and dist.rank() > 0):
            print(err.render(), file=sys.stderr)
        if not isinstance(err, dist.EveryRank):
            dist.abort_others(EXIT_USER_ERROR)
        return EXIT_USER_ERROR
    except MemoryError as err:
        return _out_of_memory(device_memory_error(err) or SwpError(
            "ran out of memory", hints=["a smaller model, batch or --memory cap needs less"]))
    except training.Interrupted as stop:
        saved = f"; checkpoint of step {stop.step} in {stop.saved}" if stop.saved else ""
        if dist.rank() == 0:  # (every rank stopped after the same step)
            print(f"swapdsl: interrupted after step {stop.step}{saved}", file=sys.stderr)
        return 128 + stop.signum
    except KeyboardInterrupt as stop:
        print("swapdsl: interrupted", file=sys.stderr)
        dist.abort_others(128 + _signal_of(stop, received))
        return 128 + _signal_of(stop, received)
    except BrokenPipeError:
        return 0
    except Exception as err:  # a bug: its traceback, and no rank left waiting for this one
        if (gpu := device_memory_error(err)) is not None:  # (not a bug: a library beside the arena ran out)
            return _out_of_memory(gpu)
        if (path := path_refused(err)) is not None:  # (nor is a name the system refuses: too long, say)
            print(path.render(), file=sys.stderr)
            dist.abort_others(EXIT_USER_ERROR)
            return EXIT_USER_ERROR
        if dist.world() is not None:
            traceback.print_exc()
            dist.abort_others(1)
        raise
    finally:
        dist.started()  # (a command that stopped before its start checks leaves nothing for the next one)
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _out_of_memory(err: SwpError) -> int:
    print(err.render(), file=sys.stderr)
    dist.abort_others(EXIT_USER_ERROR)
    return EXIT_USER_ERROR


def _signal_of(stop: KeyboardInterrupt, received: list[int]) -> int:
    if stop.args and isinstance(stop.args[0], int):
        return stop.args[0]
    return received[0] if received else signal.SIGINT


def _catch_signals(received: list[int]) -> dict[int, Any]:
    """SIGINT and SIGTERM raise KeyboardInterrupt (a search keeps its best plan; worker processes are shut
    down rather than orphaned) and are recorded in ``received`` for the exit code. Returns the handlers
    replaced (none off the main thread, where signals cannot be caught)."""

    def interrupt(signum: int, frame: object) -> None:
        received.append(signum)
        raise KeyboardInterrupt(signum)

    previous: dict[int, Any] = {}
    try:
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous[sig] = signal.signal(sig, interrupt)
    except ValueError:  # not the main thread: leave signals alone
        pass
    return previous


if __name__ == "__main__":
    sys.exit(main())
