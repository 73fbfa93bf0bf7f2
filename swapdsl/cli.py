"""The `swapdsl` command line: it wires the pipeline's stages together."""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import signal
import sys
import time
from collections.abc import Callable
from typing import Any, NoReturn

import numpy as np
from collections.abc import Sequence

from swapdsl import __version__
from swapdsl.common.errors import Span, SwpError
from swapdsl.graph.analysis import peak_bytes, summary, training_summary
from swapdsl.graph.autodiff import training_graph
from swapdsl.graph.checker import check_graph
from swapdsl.graph.ir import Graph
from swapdsl.graph.printer import print_graph
from swapdsl.lang.elaborate import elaborate
from swapdsl.lang.loader import Program, load
from pathlib import Path

from swapdsl.planning import bench as benchmark

from swapdsl.common.atomic import check_writable, write_text_atomically
from swapdsl.common.units import format_bytes, format_count, parse_size
from swapdsl.devices.profiles import BUILTIN, DEFAULT_DEVICE, detect_device, load_device
from swapdsl.graph.printer import format_attr
from swapdsl.plan import show
from swapdsl.plan.figures import plan_figures
from swapdsl.plan.file import find_model, locate_model, read_plan, write_plan
from swapdsl.plan.program import Plan
from swapdsl.plan.simulate import simulate
from swapdsl.plan.validate import validate
from swapdsl.planning.ga import SearchOptions
from swapdsl.planning.optimize import optimize
from swapdsl.planning.policy import METHODS
from swapdsl.planning.problem import Request
from swapdsl.runtime import reference
from swapdsl.runtime.backend import BACKENDS, array_module, require_memory, to_host
from swapdsl.runtime.interpreter import PlanRunner
from swapdsl.runtime.profile import profile
from swapdsl.runtime.reference import Trainer

EXIT_USER_ERROR = 2
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as shells report it
MAX_SEED = 2**63


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


def _workers(text: str) -> int:
    cores = os.cpu_count() or 1
    value = _count(0)(text)
    if value > cores:
        raise argparse.ArgumentTypeError(f"this machine has {cores} cores; use at most {cores} (0: every core)")
    return value


def build_graph(path: str, defines: Sequence[str]) -> tuple[Program, Graph]:
    """Parse, resolve imports, elaborate and check: the front half of the pipeline."""
    program = load(path)
    graph = elaborate(program, parse_defines(defines))
    check_graph(graph)
    return program, graph


def parse_defines(defines: Sequence[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for d in defines:
        key, sep, value = d.partition("=")
        if not sep or not key.strip() or not value.strip():
            raise SwpError(f"-D {d}: expected NAME=VALUE", hints=["e.g. -D batch=32"])
        out[key.strip()] = value.strip()
    return out


def _cmd_check(args: argparse.Namespace) -> int:
    _, graph = build_graph(args.file, args.define)
    train = training_graph(graph) if args.training else None
    if train is not None:
        check_graph(train)
    if args.ir:
        sys.stdout.write(print_graph(train or graph))
        return 0
    info = summary(graph) | (training_summary(train) if train is not None else {})
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    arg_text = " ".join(f"{k}={v}" for k, v in info["args"].items()) or "(none)"
    rows = [
        ("arguments", arg_text),
        ("forward ops", str(info["forward_ops"])),
        ("tensors", str(info["tensors"])),
        ("inputs", f"{info['inputs']} ({format_bytes(info['input_bytes'])})"),
        ("parameters", f"{info['params']:,} in {info['param_tensors']} tensors ({format_bytes(info['param_bytes'])})"),
        ("forward FLOPs", format_count(info["forward_flops"], "FLOP")),
        ("activation peak", format_bytes(info["activation_peak_bytes"])),
        ("loss", f"{info['loss']}, {info['optimizer']}"),
    ]
    if train is not None:
        rows += [
            ("training ops", f"{info['ops']} ({info['backward_ops']} backward, {info['update_ops']} update)"),
            ("optimizer state", format_bytes(info["state_bytes"])),
            ("step FLOPs", format_count(info["flops"], "FLOP")),
            ("step peak", f"{format_bytes(info['peak_bytes'])} (default order, no swapping)"),
        ]
    print(f"model {info['model']} ({args.file}): ok")
    for key, value in rows:
        print(f"  {key:<16} {value}")
    return 0


def _is_plan(path: str) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(12) == b"swapdsl-plan"
    except OSError:
        return False


def _cmd_exec(args: argparse.Namespace) -> int:
    if _is_plan(args.file):
        return _exec_plan(args)
    if args.check:
        raise SwpError("--check compares a plan's execution with the reference executor; give a .plan file")
    _, graph = build_graph(args.file, args.define)
    train = training_graph(graph)
    check_graph(train)
    backend, xp = array_module(args.backend)
    require_memory(xp, peak_bytes(train), 0, f"training `{graph.name}` with no cap")
    if not args.json:
        print(f"training {graph.name} ({args.file}) for {args.steps} steps on {backend}, seed {args.seed}")

    def report(step: int, loss: float, ms: float) -> None:
        if not args.json:
            print(f"  step {step:>{len(str(args.steps))}}/{args.steps}  loss {loss:.6f}  {ms:8.1f} ms", flush=True)

    result = reference.train(train, args.steps, args.seed, xp, on_step=report)
    if args.json:
        print(json.dumps({"model": graph.name, "backend": backend, "steps": args.steps, "seed": args.seed,
                          "loss": result.losses, "step_ms": result.step_ms}, indent=2))
    else:
        first, last = result.losses[0], result.losses[-1]
        print(f"loss {first:.6f} -> {last:.6f} ({last / first:.1%} of the first), "
              f"median step {sorted(result.step_ms)[len(result.step_ms) // 2]:.1f} ms")
    return 0


def _exec_plan(args: argparse.Namespace) -> int:
    if args.define:
        raise SwpError("-D does not apply to a plan: its model arguments are fixed in the plan")
    plan, train = load_plan(args.file, need_model=True)
    assert train is not None
    backend, xp = array_module(args.backend)
    runner = PlanRunner(plan, train, backend, xp, args.seed, check_plan=False)  # load_plan validated it
    reference = Trainer(train, args.seed, xp) if args.check else None
    sim = simulate(plan)
    h2d, d2h, simulated_ms = sim.h2d_bytes, sim.d2h_bytes, sim.iteration_ms
    if not args.json:
        print(f"executing {args.file} ({train.name}, {plan.method} under {format_bytes(plan.cap)}) for {args.steps} "
              f"steps on {backend}, seed {args.seed}")
    losses, times, worst = [], [], 0.0
    try:
        for step in range(1, args.steps + 1):
            loss, ms = runner.step(step)
            losses.append(loss)
            times.append(ms)
            line = f"  step {step:>{len(str(args.steps))}}/{args.steps}  loss {loss:.6f}  {ms:8.1f} ms"
            if reference is not None:
                diff = max(relative_diff(loss, reference.step(step)),
                           *(relative_diff(v, to_host(reference.persistent[k]))
                             for k, v in runner.persistent_values().items()))
                worst = max(worst, diff)
                line += f"  max rel diff {diff:.2e}"
            if not args.json:
                print(line, flush=True)
    finally:
        runner.close()
    info = {"model": train.name, "backend": backend, "steps": args.steps, "seed": args.seed, "loss": losses,
            "step_ms": times, "h2d_bytes": h2d, "d2h_bytes": d2h, "device_arena_bytes": int(runner.arena.nbytes),
            "host_arena_bytes": int(runner.host.nbytes), "simulated_ms": simulated_ms}
    if reference is not None:
        info["max_rel_diff"] = worst
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    median = sorted(times)[len(times) // 2]
    print(f"median step {median:.1f} ms (simulated {simulated_ms:.1f} ms); moved "
          f"{format_bytes(h2d)} in and {format_bytes(d2h)} out per step in a {format_bytes(runner.arena.nbytes)} arena"
          + (f"; max rel diff against the reference {worst:.2e}" if reference is not None else ""))
    return 0


def relative_diff(a: object, b: object) -> float:
    x, y = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    scale = max(float(np.max(np.abs(y))) if y.size else 0.0, 1e-12)
    return float(np.max(np.abs(x - y))) / scale if x.size else 0.0


def _cmd_optimize(args: argparse.Namespace) -> int:
    cap = parse_size(args.memory)
    if args.output:
        check_writable(args.output, "plan")  # now, not after a search of a minute
    device = load_device(args.device)
    _, graph = build_graph(args.file, args.define)
    train = training_graph(graph)
    check_graph(train)
    search = SearchOptions(args.budget, args.generations, args.population, args.seed, args.workers,
                           progress=sys.stderr.isatty() and not args.json)
    started = time.perf_counter()
    plan = optimize(Request(train, device, cap, args.file, graph.args), args.method, search)
    seconds = time.perf_counter() - started
    validate(plan)
    if args.output:
        write_plan(plan, args.output)
    info = {"method": plan.method, "device": device.name, "memory_bytes": cap, **dict(plan.figures),
            "search_seconds": seconds, "plan": args.output}
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    print(f"{graph.name}: {plan.method} plan under {format_bytes(cap)} on {device.name}"
          + (f", written to {args.output}" if args.output else ""))
    _print_figures(info)
    return 0


def _print_figures(f: dict) -> None:
    print(f"  iteration        {f['iteration_ms']:.3f} ms   (ideal {f['ideal_ms']:.3f} ms, "
          f"bound {f['bound_ms']:.3f} ms)")
    print(f"  fraction         {f['fraction']:.3f} of the infinite-memory speed")
    print(f"  memory ratio     {f['ratio']:.2f} (no-swap arena {format_bytes(f['no_swap_bytes'])} / cap)")
    print(f"  swapped          {format_bytes(f['h2d_bytes'])} in, {format_bytes(f['d2h_bytes'])} out")
    print(f"  device peak      {format_bytes(f['peak_device_bytes'])}; host {format_bytes(f['host_bytes'])}")
    if "search_seconds" in f:
        print(f"  search           {f['search_seconds']:.2f} s"
          + (f", {f['generations']:.0f} generations, {f['evaluations']:.0f} evaluations" if "generations" in f else ""))


def load_plan(path: str, need_model: bool = False) -> tuple[Plan, Graph | None]:
    """A plan checked completely: against its model's training graph when the model is found (always
    when ``need_model``), and replayed. Returns the plan and that training graph (or None)."""
    plan = read_plan(path)
    model = find_model(plan, path) if need_model else locate_model(plan, path)
    try:
        train = None if model is None else _training_graph(str(model), plan.model_sha256, plan.args)
    except SwpError as err:  # the model built before, so the plan's arguments are at fault
        raise _at_plan_arg(err, plan) from None
    validate(plan, train)
    return plan, train


def _at_plan_arg(err: SwpError, plan: Plan) -> SwpError:
    """The error, placed at the plan's `arg` line it is about (the first such line if none is named)."""
    names = [k for k, _ in plan.args]
    i = next((i for i, k in enumerate(names) if f"-D {k}=" in err.message or f"`{k}`" in err.message), 0)
    line = plan.origin.line("arg", i) if plan.origin is not None else None
    where = [f"at {err.span}"] if err.span is not None else []
    out = SwpError(f"the plan's model arguments do not build its model: {err.message}", None,
                   hints=["the plan was edited; run `swapdsl optimize` again"], notes=where + list(err.notes))
    if line is not None and plan.origin is not None:
        out.span = Span.point(plan.origin.file, line, 1)
    return out


@functools.lru_cache(maxsize=4)
def _training_graph(model: str, sha256: str, args: tuple[tuple[str, int | float | bool], ...]) -> Graph:
    """The training graph of a model file with these arguments (its hash in the key: a file may change)."""
    _, graph = build_graph(model, [f"{k}={format_attr(v)}" for k, v in args])
    return training_graph(graph)


def _cmd_simulate(args: argparse.Namespace) -> int:
    plan, _ = load_plan(args.file)
    stored = dict(plan.figures)
    figures = plan_figures(plan, simulate(plan), *(stored.get(k) for k in ("bound_ms", "no_swap_bytes",
                                                                          "graph_peak_bytes")))
    info = {"method": plan.method, "device": plan.device.name, "memory_bytes": plan.cap, **figures,
            "plan": args.file}
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    print(f"{args.file}: valid; simulated on {plan.device.name} under {format_bytes(plan.cap)}")
    _print_figures(info)
    return 0


def _cmd_show(args: argparse.Namespace) -> int:
    plan, _ = load_plan(args.file)
    print(show.summary(plan, simulate(plan)))
    if args.plot:
        show.plot(plan, args.plot)
        print(f"timeline written to {args.plot}")
    return 0


def _cmd_profile(args: argparse.Namespace) -> int:
    check_writable(args.output, "profile")
    _, graph = build_graph(args.file, args.define)
    train = training_graph(graph)
    backend, xp = array_module(args.backend)
    base = load_device(args.base)
    measured = profile(train, xp, backend, base, args.repeat)
    write_text_atomically(args.output, json.dumps(measured.to_json(), indent=2) + "\n", "profile")
    print(f"profiled {len(train.ops)} ops ({len(measured.op_times)} distinct) of {graph.name} on {backend}: "
          f"host->device {measured.h2d_bw / 1e9:.1f} GB/s, device->host {measured.d2h_bw / 1e9:.1f} GB/s, "
          f"memory {measured.mem_bw / 1e9:.1f} GB/s, launch {1e6 * measured.launch_s:.1f} us; "
          f"written to {args.output}")
    return 0


def _cmd_bench(args: argparse.Namespace) -> int:
    try:
        ratios = [float(r) for r in args.ratios.split(",")]
    except ValueError:
        raise SwpError(f"--ratios takes numbers separated by commas, got `{args.ratios}`") from None
    methods = args.methods.split(",")
    unknown = [m for m in methods if m not in ("ga", *METHODS)]
    if unknown or min(ratios) <= 0:
        raise SwpError(f"bad --methods or --ratios: {', '.join(unknown) or args.ratios}",
                       hints=[f"methods: ga, {', '.join(METHODS)}; ratios are positive"])
    search = SearchOptions(budget_s=args.budget, generations=args.generations, seed=args.seed, workers=args.workers)
    rows = benchmark.run(args.models, ratios, methods, load_device(args.device or DEFAULT_DEVICE), search,
                         log=None if args.json else print)
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        print()
        print(benchmark.markdown(rows, methods), end="")
    if args.out:
        for path in benchmark.write_outputs(rows, methods, Path(args.out)):
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


class _Parser(argparse.ArgumentParser):
    """argparse, with its errors reported like every other mistake (one message, exit code 2)."""

    def error(self, message: str) -> NoReturn:
        raise SwpError(message, hints=[f"see `{self.prog} --help`"])


def make_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="swapdsl", description="Train models larger than GPU memory.")
    p.add_argument("--version", action="version", version=f"swapdsl {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    check = sub.add_parser("check", help="parse and elaborate a .swp model, print its figures or IR")
    check.add_argument("file", metavar="FILE.swp")
    check.add_argument("-D", dest="define", action="append", default=[], metavar="NAME=VALUE",
                       help="override a model argument (repeatable)")
    out = check.add_mutually_exclusive_group()
    out.add_argument("--ir", action="store_true", help="print the forward IR")
    out.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    check.add_argument("--training", action="store_true",
                       help="also build the training graph (backward and optimiser ops) and report on it")
    check.set_defaults(run=_cmd_check)

    ex = sub.add_parser("exec", help="run a plan under its cap, or train a .swp model with the reference executor")
    ex.add_argument("file", metavar="FILE.plan|FILE.swp")
    ex.add_argument("-D", dest="define", action="append", default=[], metavar="NAME=VALUE",
                    help="override a model argument (repeatable)")
    ex.add_argument("--steps", type=_count(1), default=10, help="training steps (default 10)")
    ex.add_argument("--seed", type=_count(0, MAX_SEED - 1), default=0, help="seed for parameters and data (default 0)")
    ex.add_argument("--backend", choices=BACKENDS, default="auto", help="array backend (default auto)")
    ex.add_argument("--check", action="store_true",
                    help="(plans) run the reference executor beside it and compare every loss and parameter")
    ex.add_argument("--json", action="store_true", help="print one JSON object instead of a line per step")
    ex.set_defaults(run=_cmd_exec)

    op = sub.add_parser("optimize", help="plan a training step under a memory cap")
    op.add_argument("file", metavar="FILE.swp")
    op.add_argument("--memory", required=True, metavar="SIZE", help="the cap: 8GiB, 512MiB, 1.5GB or bytes")
    op.add_argument("--method", choices=["ga", *sorted(METHODS)], default="ga", help="planner (default ga)")
    op.add_argument("--budget", type=_seconds, default=60.0, metavar="SECONDS", help="ga: wall-clock budget (60)")
    op.add_argument("--generations", type=_count(1), default=100_000, help="ga: generation limit (100000)")
    op.add_argument("--population", type=_count(2, 100_000), default=64, help="ga: candidates per generation (64)")
    op.add_argument("--seed", type=_count(0, MAX_SEED - 1), default=0, help="ga: random seed (0)")
    op.add_argument("--workers", type=_workers, default=0, help="ga: worker processes (0: every core)")
    op.add_argument("--device", metavar="NAME|FILE.json", help="device profile (default: the GPU found, "
                    f"else {DEFAULT_DEVICE})")
    op.add_argument("-D", dest="define", action="append", default=[], metavar="NAME=VALUE",
                    help="override a model argument (repeatable)")
    op.add_argument("-o", "--output", metavar="FILE.plan", help="write the plan here (atomically)")
    op.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    op.set_defaults(run=_cmd_optimize)

    sim = sub.add_parser("simulate", help="validate a plan and recompute its figures from the plan alone")
    sim.add_argument("file", metavar="FILE.plan")
    sim.add_argument("--json", action="store_true")
    sim.set_defaults(run=_cmd_simulate)

    sh = sub.add_parser("show", help="summarise a plan; --plot draws its timeline")
    sh.add_argument("file", metavar="FILE.plan")
    sh.add_argument("--plot", metavar="OUT.png", help="draw the three streams and device memory (matplotlib)")
    sh.set_defaults(run=_cmd_show)

    pr = sub.add_parser("profile", help="measure op times and copy bandwidth on this backend into a profile")
    pr.add_argument("file", metavar="FILE.swp")
    pr.add_argument("-D", dest="define", action="append", default=[], metavar="NAME=VALUE",
                    help="override a model argument (repeatable)")
    pr.add_argument("-o", "--output", required=True, metavar="PROFILE.json")
    pr.add_argument("--backend", choices=BACKENDS, default="auto")
    pr.add_argument("--repeat", type=_count(1), default=5, help="timed runs per op (median; default 5)")
    pr.add_argument("--base", metavar="NAME", help="profile supplying what is not measured (memory size, FLOP/s)")
    pr.set_defaults(run=_cmd_profile)

    be = sub.add_parser("bench", help="plan every (model, ratio, method) and tabulate fraction, time, swap, search")
    be.add_argument("--models", nargs="+", default=list(benchmark.ZOO), help="zoo names or .swp files")
    be.add_argument("--ratios", default="2,4,8,12", help="memory ratios, comma-separated (2,4,8,12)")
    be.add_argument("--methods", default="lru,vdnn,belady,ga", help="comma-separated (lru,vdnn,belady,ga)")
    be.add_argument("--device", help=f"device profile (default {DEFAULT_DEVICE})")
    be.add_argument("--budget", type=_seconds, default=60.0, metavar="SECONDS", help="ga budget per plan (60)")
    be.add_argument("--generations", type=_count(1), default=100_000, help="ga generation limit per plan (100000)")
    be.add_argument("--seed", type=_count(0, MAX_SEED - 1), default=0)
    be.add_argument("--workers", type=_workers, default=0, help="ga worker processes (0: every core)")
    be.add_argument("--json", action="store_true", help="print the rows as JSON")
    be.add_argument("--out", metavar="DIR", help="write bench.json, bench.md and fraction.png here")
    be.set_defaults(run=_cmd_bench)

    dv = sub.add_parser("devices", help="list the built-in device profiles")
    dv.add_argument("--json", action="store_true")
    dv.set_defaults(run=_cmd_devices)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    previous = _terminate_like_interrupt()
    try:
        args = make_parser().parse_args(argv)
        return args.run(args)
    except SwpError as err:
        print(err.render(), file=sys.stderr)
        return EXIT_USER_ERROR
    except MemoryError:
        print("error: ran out of memory", file=sys.stderr)
        print("  = hint: a smaller model, batch or --memory cap needs less", file=sys.stderr)
        return EXIT_USER_ERROR
    except KeyboardInterrupt:
        print("swapdsl: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        return 0
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _terminate_like_interrupt() -> Any:
    """SIGTERM ends a command as Ctrl-C does (a search keeps its best plan; worker processes are shut
    down rather than orphaned). Returns the handler it replaced, or None off the main thread."""

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    try:
        return signal.signal(signal.SIGTERM, interrupt)
    except ValueError:  # not the main thread: leave signals alone
        return None


if __name__ == "__main__":
    sys.exit(main())
