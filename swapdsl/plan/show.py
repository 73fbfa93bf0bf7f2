"""Reading a plan as a person: a summary, and a timeline plot."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from swapdsl.common.drawing import plain, pyplot, save
from swapdsl.common.units import format_bytes
from swapdsl.plan.figures import ONE_PASS_IDEAL
from swapdsl.plan.program import HOST, HostRun, Plan, Region, Run, SwapIn, SwapOut
from swapdsl.plan.simulate import Result, simulate


def summary(plan: Plan, result: Result, labels: Mapping[str, str] | None = None) -> str:
    """The plan in a screenful; ``labels`` (a tensor's name -> what the model calls it, see
    ``Tensor.title``) name unnamed tensors such as %12 by their layer path."""
    figures = dict(plan.figures)
    kinds = Counter(type(i).__name__ for i in plan.program)
    again = [i for i in plan.program if isinstance(i, Run) and i.recompute]
    pinned = [t for t in plan.tensors if isinstance(t.home, Region) and t.kind != "input"]
    on_host = [t for t in plan.tensors if t.home == HOST]
    lines = [
        f"plan for {plan.model_path} ({', '.join(f'{k}={v}' for k, v in plan.args)})",
        f"  method          {plan.method}",
        f"  device          {plan.device.name}",
        f"  precision       {plan.precision}, guard {plan.guard}",
        f"  cap             {format_bytes(plan.cap)} (one arena; tensors at offsets)",
        f"  scratch         {format_bytes(plan.scratch)} at the top of the arena (kernels' temporaries, reused "
        f"by every op)",
        f"  ops             {len(plan.ops)}; {kinds['SwapIn']} swap-ins, {kinds['SwapOut']} swap-outs, "
        f"{kinds['Free']} frees",
        f"  recomputed      {len(again)} runs again, {sum(plan.ops[i.op].ms for i in again):.3f} ms of compute",
        *([f"  on the host     {kinds['HostRun']} update ops, "
           f"{sum(plan.ops[i.op].host_ms or 0.0 for i in plan.program if isinstance(i, HostRun)):.3f} ms of the "
           "host lane"] if kinds["HostRun"] else []),
        f"  persistent      {len(pinned)} pinned on the device "
        f"({format_bytes(sum(t.bytes for t in pinned))}), {len(on_host)} on the host "
        f"({format_bytes(sum(t.bytes for t in on_host))})",
        f"  iteration       {result.iteration_ms:.3f} ms (ideal {result.compute_ms:.3f} ms"
        + (f", bound {figures['bound_ms']:.3f} ms)" if "bound_ms" in figures else ")"),
        *([f"  one pass        ideal {figures[ONE_PASS_IDEAL]:.3f} ms over the whole batch: this step runs at "
           f"{figures[ONE_PASS_IDEAL] / result.iteration_ms:.3f} of it ({plan.microbatches} micro-batches)"]
          if ONE_PASS_IDEAL in figures and result.iteration_ms > 0 else []),
        f"  swapped         {format_bytes(result.h2d_bytes)} in, {format_bytes(result.d2h_bytes)} out",
        f"  device peak     {format_bytes(result.peak_device_bytes)} of tensors + {format_bytes(plan.scratch)} of "
        f"scratch ({100 * (result.peak_device_bytes + plan.scratch) / max(plan.cap, 1):.0f}% of the cap)",
    ]
    moved = Counter()
    for i in plan.program:
        if isinstance(i, (SwapIn, SwapOut)):
            moved[i.tensor] += 1
    if moved:
        sizes = plan.tensor_map()
        top = sorted(moved, key=lambda n: -moved[n] * sizes[n].bytes)[:5]
        lines.append("  most moved      " + ", ".join(f"{_named(n, labels)} ({moved[n]}x "
                                                           f"{format_bytes(sizes[n].bytes)})" for n in top))
    return "\n".join(lines)


def _named(name: str, labels: Mapping[str, str] | None) -> str:
    """``%12`` as ``layer1.dense.matmul (%12)``; a named tensor as its name."""
    label = (labels or {}).get(name, "")
    return name if not label or label == name else f"{label} ({name})"


def memory_unit(nbytes: int) -> tuple[str, int]:
    """The binary unit a size reads best in (its value at least 1): ("KiB", 1024) for 266 KiB."""
    unit, scale = "B", 1
    for name, size in (("KiB", 2**10), ("MiB", 2**20), ("GiB", 2**30), ("TiB", 2**40)):
        if nbytes >= size:
            unit, scale = name, size
    return unit, scale


def _largest_copies(r: Result, plan: Plan) -> list[tuple[str, str, float, float]]:
    """The step's largest copies (at most 50), the largest first (then the earliest)."""
    sizes = plan.tensor_map()
    return sorted((s for s in r.timeline if s[0] in ("h2d", "d2h")), key=lambda s: (-sizes[s[1]].bytes, s[2]))[:50]


def _mark(lanes: Any, copies: list[tuple[str, str, float, float]], labels: Mapping[str, str] | None,
          named: int) -> None:
    """Name the largest copies above their lanes, at most ``named``, each only where its label, as drawn,
    overlaps no label already placed and stays inside the figure."""
    fig = lanes.figure
    renderer = fig.canvas.get_renderer()
    frame = fig.bbox
    placed: list[Any] = []
    for stream, name, start, end in copies:
        if len(placed) == named:
            break
        note = lanes.annotate(plain(_named(name, labels)), ((start + end) / 2, 2 - ("compute", "h2d", "d2h").index(stream)
                                                     + 0.42), fontsize=7, ha="center", va="bottom",
                              annotation_clip=False)
        box = note.get_window_extent(renderer).padded(6)  # (a space between two labels)
        if box.x0 < frame.x0 or box.x1 > frame.x1 or any(box.overlaps(b) for b in placed):
            note.remove()
        else:
            placed.append(box)


def plot(plan: Plan, out: str | Path, labels: Mapping[str, str] | None = None, named: int = 6) -> None:
    """Three stream lanes over time, and device memory over time against the cap (in the cap's unit); the
    ``named`` largest copies are marked with the tensor's label."""
    plt = pyplot("--plot")
    r = simulate(plan, timeline=True)
    fig, (lanes, mem) = plt.subplots(2, 1, figsize=(12, 6), sharex=True, height_ratios=[1, 1.4])
    colors = {"compute": "#4c72b0", "h2d": "#55a868", "d2h": "#c44e52"}
    for row, stream in enumerate(("compute", "h2d", "d2h")):
        spans = [(s, e - s) for st, what, s, e in r.timeline if st == stream and not what.startswith("recompute ")]
        lanes.broken_barh(spans, (2 - row - 0.4, 0.8), facecolors=colors[stream])
    again = [(s, e - s) for st, what, s, e in r.timeline if what.startswith("recompute ")]
    if again:  # recomputations, on the compute lane in their own colour
        lanes.broken_barh(again, (2 - 0.4, 0.8), facecolors="#dd8452", label="recompute")
        lanes.legend(loc="upper right")
    host = [(s, e - s) for st, _, s, e in r.timeline if st == "host"]
    if host:  # updates run on the host: a fourth lane
        lanes.broken_barh(host, (-1 - 0.4, 0.8), facecolors="#8172b3")
    lanes.set_yticks([2, 1, 0, -1][:4 if host else 3],
                     ["compute", "host to device", "device to host", "host (updates)"][:4 if host else 3])
    lanes.set_title(plain(f"{Path(plan.model_path).stem}: {plan.method} under {format_bytes(plan.cap)} on "
                          f"{plan.device.name}, {r.iteration_ms:.1f} ms per iteration"))
    fig.tight_layout()
    _mark(lanes, _largest_copies(r, plan), labels, named)
    unit, scale = memory_unit(plan.cap)
    times = [t for t, _ in r.memory] + [r.iteration_ms]
    levels = [b / scale for _, b in r.memory]
    mem.step(times[:-1], levels, where="post", color="#4c72b0", label="tensors on the device")
    mem.axhline(plan.cap / scale, color="#c44e52", linestyle="--", label="cap")
    mem.set_ylim(0, 1.25 * plan.cap / scale)  # headroom above the cap for the legend
    mem.set_ylabel(unit)
    mem.set_xlabel("ms")
    mem.legend(loc="upper center", bbox_to_anchor=(0.5, 1.0), ncol=2, frameon=False)
    fig.tight_layout()
    save(fig, out, "plot", dpi=110)
