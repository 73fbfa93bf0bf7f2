"""Wrong arguments for the library API, and the verdict on each call: it returns, or raises SwpError.

Each case takes a valid call of one public function of ``swapdsl`` (on a small model with an output and a
loss, a plan of it and data for it) and replaces one argument by an adversary's value: a wrong type, an
edge number, a NumPy scalar, a Path, bytes, a callable where data goes. Every case must return or raise
``SwpError``: never another exception, never a hang. Calls run in the process, in a folder of their own
(a file name given as text is written there).
"""

from __future__ import annotations

import contextlib
import inspect
import os
import random
import signal
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import numpy as np

from swapdsl.fuzz.files import Verdict

MODEL = """model tiny(batch = 4) {
    input x: f32[batch, 6]
    input y: i32[batch]
    param w: [6, 3] = xavier
    logits = x @ w
    output scores = logits
    loss = softmax_cross_entropy(logits, y)
    report accuracy = mean(cast(argmax(logits) == y, f32))
    minimize loss with sgd(0.1)
}
"""
TIME_LIMIT_S = 20.0
ENDLESS = {"steps", "epochs"}  # (a valid count this large trains for ever: not a case the fuzzer can judge)
VALUES: dict[str, Callable[[], Any]] = {
    "None": lambda: None, "True": lambda: True, "0": lambda: 0, "-1": lambda: -1, "1.5": lambda: 1.5,
    "nan": lambda: float("nan"), "inf": lambda: float("inf"), "2**70": lambda: 2**70, "''": lambda: "",
    "'x'": lambda: "x", "b'x'": lambda: b"x", "[]": lambda: [], "{}": lambda: {}, "(1, 2)": lambda: (1, 2),
    "np.int64(3)": lambda: np.int64(3), "np.float64(0.5)": lambda: np.float64(0.5),
    "Path('nope')": lambda: Path("nope"), "print": lambda: print, "object()": lambda: object(),
    "'8MiB'": lambda: "8MiB", "'auto'": lambda: "auto", "'\\0'": lambda: "\0",
    "'n' * 300": lambda: "n" * 300, "'net.swp/x'": lambda: "net.swp/x",  # (too long a name; one under a file)
}


@attrs.frozen
class Case:
    function: str
    argument: str
    value: str  # a key of VALUES


def make_seeds(folder: Path) -> dict[str, Any]:
    """The files and objects the valid calls take, written into ``folder``."""
    import swapdsl

    folder.mkdir(parents=True, exist_ok=True)
    model = folder / "tiny.swp"
    model.write_text(MODEL, encoding="utf-8")
    rng = np.random.default_rng(0)
    np.savez(folder / "data.npz", x=rng.standard_normal((6, 6)).astype(np.float32),
             y=rng.integers(0, 3, 6).astype(np.int32))
    plan = swapdsl.optimize(str(model), memory="1MiB", method="belady")
    swapdsl.save(plan, folder / "tiny.plan")
    return {"model": str(model), "plan": plan, "plan_file": str(folder / "tiny.plan"),
            "data": str(folder / "data.npz"), "onnx": _onnx(folder)}


def _onnx(folder: Path) -> str | None:
    """A one-product ONNX model, where the `import` extra is installed."""
    try:
        import onnx
        from onnx import TensorProto, helper, numpy_helper
    except ImportError:
        return None
    w = numpy_helper.from_array(np.ones((6, 3), np.float32), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "net",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 6])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])], [w])
    path = folder / "net.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9), str(path))
    return str(path)


def calls(seeds: dict[str, Any]) -> dict[str, tuple[Callable[..., Any], dict[str, Any]]]:
    """Each public function (or option record) and a valid call of it, by name."""
    import swapdsl

    plan, model, data = seeds["plan"], seeds["model"], seeds["data"]
    found = {
        "load": (swapdsl.load, {"path": model, "batch": 4}),
        "optimize": (swapdsl.optimize, {"model": model, "memory": "1MiB", "method": "belady"}),
        "save": (swapdsl.save, {"plan": plan, "path": "out.plan"}),
        "read": (swapdsl.read, {"path": seeds["plan_file"]}),
        "simulate": (swapdsl.simulate, {"plan": plan}),
        "execute": (swapdsl.execute, {"target": plan, "steps": 1}),
        "predict": (swapdsl.predict, {"target": plan, "data": data}),
        "evaluate": (swapdsl.evaluate, {"target": model, "data": data}),
        "predict_scored": (swapdsl.predict_scored, {"target": plan, "data": data}),
        "Options": (lambda **kw: swapdsl.execute(plan, options=swapdsl.Options(**kw)), {"steps": 1}),
        "SearchOptions": (lambda **kw: swapdsl.optimize(model, memory="1MiB", search=swapdsl.SearchOptions(**kw)),
                          {"budget_s": 0.2, "generations": 1, "workers": 1}),
        "Hooks": (lambda **kw: swapdsl.execute(plan, steps=1, hooks=swapdsl.Hooks(**kw)), {}),
    }
    if seeds["onnx"] is not None:
        found["import_onnx"] = (swapdsl.import_onnx, {"path": seeds["onnx"], "out": "net.swp"})
    return found


def arguments(name: str, fn: Callable[..., Any], valid: dict[str, Any]) -> list[str]:
    """The arguments a case may replace: the function's own (or the record's fields) and the valid call's."""
    import swapdsl

    record = getattr(swapdsl, name, None)
    params = [f.name for f in attrs.fields(record)] if attrs.has(record) else [
        p.name for p in inspect.signature(fn).parameters.values() if p.kind is not p.VAR_KEYWORD]
    return list(dict.fromkeys(params + list(valid)))


def case_of(seed: int, index: int, table: dict[str, tuple[Callable[..., Any], dict[str, Any]]]) -> Case:
    rng = random.Random(f"{seed}:{index}")
    name = sorted(table)[index % len(table)]
    fn, valid = table[name]
    argument = rng.choice(arguments(name, fn, valid))
    value = rng.choice([v for v in VALUES if not (argument in ENDLESS and v in ("2**70", "inf"))])
    return Case(name, argument, value)


def judge(case: Case, table: dict[str, tuple[Callable[..., Any], dict[str, Any]]], work: Path,
          limit_s: float = TIME_LIMIT_S) -> Verdict:
    """Call the case in ``work``, stopped after ``limit_s`` seconds."""
    from swapdsl.common.errors import SwpError
    from swapdsl.fuzz import _Timeout

    fn, valid = table[case.function]
    kwargs = {**valid, case.argument: VALUES[case.value]()}

    def alarm(signum: int, frame: object) -> None:
        raise _Timeout

    previous = signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, limit_s)
    try:
        with contextlib.chdir(work), open(os.devnull, "w") as quiet, contextlib.redirect_stdout(quiet):
            fn(**kwargs)
    except _Timeout:
        return Verdict("hang", f"over {limit_s:.0f} s")
    except SwpError as exc:
        return Verdict("refused", exc.message.splitlines()[0][:200])
    except BaseException:  # noqa: BLE001 - any other exception is what the fuzzer looks for
        return Verdict("crash", traceback.format_exc(limit=-4))
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    return Verdict("ok")
