"""A training run's log (``exec --log FILE.jsonl``: one JSON object per step, evaluation and checkpoint),
read back and drawn: loss and each report against the step, evaluations as points."""

from __future__ import annotations

import io
import json
from pathlib import Path

from swapdsl.common.atomic import write_bytes_atomically
from swapdsl.common.errors import Span, SwpError

EVENTS = ("step", "eval", "save")


def read_log(path: str) -> list[dict]:
    """The log's records, each checked for what the plot reads; a bad line is an error at that line."""
    if Path(path).exists() and not Path(path).is_file():
        raise SwpError(f"the log `{path}` is not a regular file")
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as exc:
        raise SwpError(f"the log `{path}` is not text (byte {exc.start} is not UTF-8)",
                       hints=["give the JSON-lines file `swapdsl exec --log FILE` wrote"]) from None
    except OSError as exc:
        raise SwpError(f"cannot read the log `{path}`: {exc.strerror or exc}") from None
    records = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            r = json.loads(line)
        except json.JSONDecodeError as exc:
            raise SwpError(f"not a JSON object: {exc.msg}", Span.point(path, n, exc.colno)) from None
        except RecursionError:
            raise SwpError("not a record of `swapdsl exec --log`: nested too deeply", Span.point(path, n, 1)) from None
        if not (isinstance(r, dict) and r.get("event") in EVENTS and isinstance(r.get("step"), int)
                and (r["event"] == "save" or (_number(r.get("loss")) and isinstance(r.get("metrics"), dict)
                                              and all(map(_number, r["metrics"].values()))))):
            raise SwpError("not a record of `swapdsl exec --log`", Span.point(path, n, 1),
                           hints=['each line is {"event": "step"|"eval"|"save", "step": N, "loss": X, '
                                  '"metrics": {...}, ...}'])
        records.append(r)
    if not any(r["event"] == "step" for r in records):
        raise SwpError(f"the log `{path}` holds no training steps")
    return records


def _number(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def plot_log(records: list[dict], out: str, title: str = "") -> None:
    """Loss (and, below it, each report) against the step; evaluations as points. Written atomically."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [r for r in records if r["event"] == "step"]
    evals = [r for r in records if r["event"] == "eval"]
    names = sorted({k for r in steps + evals for k in r["metrics"]})
    fig, axes = plt.subplots(1 + len(names), 1, figsize=(8, 3 + 2 * len(names)), sharex=True, squeeze=False)
    for ax, key in zip(axes[:, 0], ["loss", *names]):
        def value(r: dict) -> float | None:
            return r["loss"] if key == "loss" else r["metrics"].get(key)

        pts = [(r["step"], value(r)) for r in steps if value(r) is not None]
        ax.plot([s for s, _ in pts], [v for _, v in pts], color="#4c72b0", linewidth=1, label="training")
        held = [(r["step"], value(r)) for r in evals if value(r) is not None]
        if held:
            ax.plot([s for s, _ in held], [v for _, v in held], "o-", color="#c44e52", label="held out")
        ax.set_ylabel(key)
        ax.grid(alpha=0.3)
        ax.legend(loc="best")
    axes[0, 0].set_title(title)
    axes[-1, 0].set_xlabel("step")
    fig.tight_layout()
    buf = io.BytesIO()
    try:
        fig.savefig(buf, format="png", dpi=100)
    finally:
        plt.close(fig)
    write_bytes_atomically(out, buf.getvalue(), "plot")
