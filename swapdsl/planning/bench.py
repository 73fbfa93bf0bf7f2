"""`swapdsl bench`: plan every (model, ratio, method) and tabulate the figures."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

import attrs

from swapdsl.common.atomic import check_writable, write_text_atomically
from swapdsl.common.drawing import plain, pyplot, save
from swapdsl.common.errors import SwpError
from swapdsl.common.paths import STDLIB_DIR
from swapdsl.common.units import MAX_BYTES
from swapdsl.devices.profiles import Device
from swapdsl.graph.autodiff import training_graph
from swapdsl.graph.ir import Graph
from swapdsl.graph.microbatch import check_microbatches, divisors, microbatched
from swapdsl.graph.precision import autocast, default_guard
from swapdsl.lang.elaborate import elaborate
from swapdsl.lang.loader import load
from swapdsl.plan.program import Run
from swapdsl.plan.validate import validate
from swapdsl.planning.compiled import no_swap_bytes
from swapdsl.planning.exactplan import TooLarge
from swapdsl.planning.ga import SearchOptions
from swapdsl.planning.bound import ideal_ms as bound_ideal_ms
from swapdsl.planning.optimize import optimize, optimize_microbatches
from swapdsl.planning.problem import Problem, Request

OUTPUTS = ("bench.json", "bench.md", "fraction.png")  # what --out DIR holds after a run
ZOO = ("resnet", "wide_resnet", "vgg", "inception_v4", "nasnet", "lstm_lm", "bert", "gpt")


def model_path(name: str) -> Path:
    path = Path(name)
    return path if path.suffix == ".swp" else STDLIB_DIR / "models" / f"{name}.swp"


def _training(path: Path, precision: str, guard: str | None, k: int = 1) -> tuple[Graph, Graph]:
    """(The forward graph at the written batch, the training graph run as ``k`` micro-batches)."""
    program = load(path)
    fwd = elaborate(program)
    micro = fwd if k == 1 else elaborate(program, {"batch": check_microbatches(dict(fwd.args).get("batch"), k)})
    micro = attrs.evolve(autocast(micro, precision), guard=default_guard(precision) if guard is None else guard)
    return fwd, microbatched(training_graph(micro), k)


def rows(models: list[str], ratios: list[float], methods: list[str], device: Device,
         search: SearchOptions, log: Any = None, host: tuple[int | None, float | None] = (None, None),
         precision: str = "f32", guard: str | None = None, microbatches: int | str = 1) -> list[dict[str, Any]]:
    """One row per (model, ratio, method); the cap for ratio r is the no-swap arena / r (of the model under
    ``precision``, in one pass). ``host``: a host budget for every plan, and one per (model, ratio) as a
    share of what belady keeps on the host there (the smaller holds). ``microbatches``: plans run the
    batch as this many passes (``auto``: the count ``optimize_microbatches`` chooses); the fraction is
    always of the ideal step of one pass over the whole batch."""
    rows = []
    for name in models:
        path = model_path(name)
        fwd, t = _training(path, precision, guard)
        p = Problem.build(t, device)
        no_swap, ideal = no_swap_bytes(p), bound_ideal_ms(p)

        def request_at(k: int, cap: int, host_cap: int | None) -> Request:
            return Request(t if k == 1 else _training(path, precision, guard, k)[1], device, cap, str(path),
                           fwd.args, host_cap)

        for ratio in ratios:
            if no_swap / ratio > MAX_BYTES:
                raise SwpError(f"ratio {ratio:g} gives `{Path(name).stem}` a cap of {no_swap / ratio:.3g} bytes, "
                               f"beyond the limit of {MAX_BYTES:,} (1 PiB)", hints=["give ratios nearer 1 or above"])
            cap = int(no_swap / ratio)
            host_cap = _host_cap(Request(t, device, cap, str(path), fwd.args), host)
            for method in methods:
                row: dict[str, Any] = {"model": Path(name).stem, "ratio": ratio, "method": method, "cap_bytes": cap,
                                       "precision": precision, "no_swap_bytes": no_swap}
                if host_cap is not None:
                    row["host_cap_bytes"] = host_cap
                started = time.perf_counter()
                try:
                    if microbatches == "auto":
                        counts = divisors(int(dict(fwd.args)["batch"]))
                        plan = optimize_microbatches(lambda k: request_at(k, cap, host_cap), counts, method, search)
                    else:
                        plan = optimize(request_at(int(microbatches), cap, host_cap), method, search)
                    validate(plan)
                except SwpError as exc:
                    row["error"] = exc.message
                    row["refused"] = isinstance(exc, TooLarge)  # (not infeasible: the method takes no such graph)
                else:
                    f = dict(plan.figures)
                    row.update({k: f[k] for k in ("iteration_ms", "bound_ms", "swap_bytes", "host_bytes")})
                    row.update(ideal_ms=ideal, fraction=ideal / f["iteration_ms"], microbatches=plan.microbatches)
                    row["swap_bound_ms"] = f.get("swap_bound_ms", f["bound_ms"])
                    row["recomputes"] = sum(1 for i in plan.program if isinstance(i, Run) and i.recompute)
                    row["search_seconds"] = time.perf_counter() - started
                rows.append(row)
                if log is not None:
                    log(format_row(row))
    return rows


def _host_cap(req: Request, host: tuple[int | None, float | None]) -> int | None:
    fixed, share = host
    if share is None:
        return fixed
    try:
        belady = dict(optimize(req, "belady").figures)["host_bytes"]
    except SwpError:
        return fixed
    return int(min(share * belady, fixed if fixed is not None else math.inf))


def format_row(r: dict[str, Any]) -> str:
    head = f"{r['model']:<13} {r['ratio']:>4g} {r['method']:<7}"
    if "error" in r:
        return f"{head} {_failed(r)}: {r['error']}"
    limit, swap_limit = r["ideal_ms"] / r["bound_ms"], r["ideal_ms"] / r["swap_bound_ms"]
    note = "  (the bus limits swapping)" if swap_limit < 0.53 else ""
    return (f"{head} fraction {r['fraction']:.3f} (bound {limit:.3f}, swap-only {swap_limit:.3f})  "
            f"iteration {r['iteration_ms']:10.1f} ms  swap {r['swap_bytes'] / 1e9:7.1f} GB  "
            f"host {r['host_bytes'] / 1e9:6.1f} GB  recomputes {r['recomputes']:5d}  "
            f"search {r['search_seconds']:6.1f} s" + (f"  microbatches {r['microbatches']}" if r["microbatches"] > 1
                                                        else "") + note)


def _failed(r: dict[str, Any]) -> str:
    return "refused" if r.get("refused") else "infeasible"


def markdown(rows: list[dict[str, Any]], methods: list[str]) -> str:
    lines = ["| model | ratio | " + " | ".join(f"{m}" for m in methods) + " | swap-only bound | bound |",
             "| --- | ---: | " + " | ".join("---:" for _ in methods) + " | ---: | ---: |"]
    keys = dict.fromkeys((r["model"], r["ratio"]) for r in rows)
    for model, ratio in keys:
        cells = {r["method"]: r for r in rows if (r["model"], r["ratio"]) == (model, ratio)}
        vals = []
        for m in methods:
            r = cells.get(m)
            vals.append("-" if r is None else _failed(r) if "error" in r
                        else f"{r['fraction']:.3f} ({r['swap_bytes'] / 1e9:.0f} GB"
                        + (f", {r['microbatches']} micro-batches)" if r["microbatches"] > 1 else ")"))
        ok = [r for r in cells.values() if "error" not in r]
        swap = f"{ok[0]['ideal_ms'] / ok[0]['swap_bound_ms']:.3f}" if ok else "-"
        limit = f"{max(r['ideal_ms'] / r['bound_ms'] for r in ok):.3f}" if ok else "-"  # the recompute bound, if any
        lines.append(f"| `{model}` | {ratio:g} | " + " | ".join(vals) + f" | {swap} | {limit} |")
    return "\n".join(lines) + "\n"


def output_folder(out: Path) -> None:
    """Make ``out`` (bench --out) and check its files can be written, before the rows are planned."""
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise SwpError(f"cannot make the folder `{out}` for --out: {exc.strerror or exc}") from None
    for name in OUTPUTS:
        check_writable(out / name, "bench output")


def write_outputs(rows: list[dict[str, Any]], methods: list[str], out: Path) -> list[Path]:
    output_folder(out)
    written = [out / "bench.json", out / "bench.md"]
    write_text_atomically(written[0], json.dumps(rows, indent=2) + "\n", "bench output")
    write_text_atomically(written[1], markdown(rows, methods), "bench output")
    plt = pyplot(None)
    if plt is None:  # (no figure: one an earlier run left would pass for this run's)
        (out / "fraction.png").unlink(missing_ok=True)
        return written
    models = list(dict.fromkeys(r["model"] for r in rows))
    fig, axes = plt.subplots(1, len(models), figsize=(3.2 * len(models), 3.2), squeeze=False)
    for ax, model in zip(axes[0], models):
        for m in methods:
            pts = [(r["ratio"], r["fraction"]) for r in rows if r["model"] == model and r["method"] == m
                   and "error" not in r]
            if pts:
                ax.plot(*zip(*pts), marker="o", label=m)
        ax.set_title(plain(model))
        ax.set_xlabel("memory ratio")
        ax.set_ylim(0, 1.05)
    axes[0][0].set_ylabel("fraction of ideal")
    axes[0][-1].legend()
    fig.tight_layout()
    save(fig, out / "fraction.png", "bench output", dpi=100)
    return written + [out / "fraction.png"]
