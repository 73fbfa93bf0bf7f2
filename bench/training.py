"""Training runs: examples per second with synthetic data and with --data, resuming, and checkpoint cost.

Usage: python bench/training.py [--backend numpy|cupy] [--steps 300] [--repeats 5]
                                [--checkpoint-models mlp tiny_resnet resnet bert gpt vgg]

Throughput: each model's plan (planned here with belady under the cap given) runs --steps steps on
its one synthetic batch, then on a memory-mapped .npy data set of 4,096 random examples, shuffled;
examples per second count from the end of the first step to the end of the last (the wall clock, so
loading the next batch counts wherever it is not hidden behind the step). Resuming: each plan runs
2 x 20 steps on the data with evaluation every 10, and again as 20 + checkpoint + resume + 20; the
losses, held-out figures and final checkpoints must agree bit for bit. Checkpoints: each zoo
model's parameters and optimiser state (its own initialisation), written as `exec --save` writes
them, then read back with safetensors.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file

import swapdsl
from swapdsl.common.paths import STDLIB_DIR
from swapdsl.common.units import format_bytes
from swapdsl.graph.ops.registry import np_dtype
from swapdsl.runtime import checkpoint, training
from swapdsl.runtime.data import init_persistent, integer_ranges

# (model, arguments, cap): the digits MLP of the README, and the demo's tiny_resnet
RUNS = [("mlp", {"features": 64, "hidden": 128, "depth": 4, "lr": 0.002}, "266KiB"),
        ("tiny_resnet", {"batch": 8}, "3MiB")]


def write_data(model: swapdsl.Model, folder: Path, examples: int) -> None:
    g = model.training
    rng = np.random.default_rng(0)
    limits = integer_ranges(g)
    for name in g.inputs:
        t = g.type_of(name)
        shape = (examples, *t.shape[1:])
        value = rng.standard_normal(shape) if t.dtype.is_float else rng.integers(0, limits.get(name, 2), shape)
        np.save(folder / f"{name}.npy", value.astype(np_dtype(np, t.dtype)))


def examples_per_second(plan: object, options: training.Options, backend: str) -> tuple[float, float]:
    """(examples per second by the wall clock after the warm-up steps, median step ms after them)."""
    ends: list[float] = []
    counts: list[int] = []

    def seen(r: training.StepRecord) -> None:
        ends.append(time.perf_counter())
        counts.append(r.examples)

    run = swapdsl.execute(plan, backend=backend, options=options, hooks=training.Hooks(on_step=seen))
    w = min(run.warmup_steps, len(ends) - 1)  # the first step, and on CuPy the one that captures the graph
    return sum(counts[w:]) / (ends[-1] - ends[w - 1]), run.steady_ms()


def throughput(steps: int, repeats: int, backend: str, folder: Path) -> None:
    print(f"| model | cap | data | examples/s, median of {repeats} (range) | median step |")
    print("| --- | ---: | --- | ---: | ---: |")
    for name, args, cap in RUNS:
        model = swapdsl.load(STDLIB_DIR / "models" / f"{name}.swp", **args)
        plan = swapdsl.optimize(model, memory=cap, method="belady")
        data = folder / name
        data.mkdir()
        write_data(model, data, 4096)
        runs = {"synthetic": training.Options(steps=steps),
                "--data --shuffle": training.Options(steps=steps, data=str(data), shuffle=True)}
        measured: dict[str, list[tuple[float, float]]] = {label: [] for label in runs}
        for _ in range(repeats):  # interleaved, so a busy moment of the machine hits both alike
            for label, opts in runs.items():
                measured[label].append(examples_per_second(plan, opts, backend))
        for label, results in measured.items():
            rates = sorted(r for r, _ in results)
            step = float(np.median([ms for _, ms in results]))
            print(f"| {name} | {cap} | {label} | {rates[len(rates) // 2]:,.0f} ({rates[0]:,.0f}-{rates[-1]:,.0f}) | "
                  f"{step:.2f} ms |", flush=True)
        resumes(plan, str(data), backend, folder / f"{name}.safetensors")


def resumes(plan: object, data: str, backend: str, path: Path) -> None:
    """40 steps straight, then 20 + checkpoint + resume + 20: the same losses, evaluations and state?"""
    def run(steps: int, **more: object) -> swapdsl.Execution:
        opts = training.Options(steps=steps, data=data, shuffle=True, eval=data, eval_every=10, save=str(path),
                                **more)  # type: ignore[arg-type]
        return swapdsl.execute(plan, backend=backend, options=opts)

    whole = run(40)
    final = load_file(path)
    first, second = run(20), run(40, resume=str(path))
    again = load_file(path)
    same = (first.losses + second.losses == whole.losses and all(np.array_equal(final[k], again[k]) for k in final)
            and [e.loss for e in (first.outcome.evals + second.outcome.evals)]  # type: ignore[union-attr]
            == [e.loss for e in whole.outcome.evals])  # type: ignore[union-attr]
    print(f"  resume after step 20 of 40 ({backend}): {'bit for bit' if same else 'DIFFERS'}", flush=True)


def checkpoints(models: list[str], folder: Path) -> None:
    print("\n| model | persistent tensors | checkpoint | write | read |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for name in models:
        g = swapdsl.load(STDLIB_DIR / "models" / f"{name}.swp").training
        values = init_persistent(g, 0, np)
        path = folder / f"{name}.safetensors"
        started = time.perf_counter()
        nbytes = checkpoint.save(str(path), g, values, 1, 1, 0, training.SYNTHETIC, False)
        wrote = time.perf_counter() - started
        started = time.perf_counter()
        back = load_file(path)
        read = time.perf_counter() - started
        assert all(np.array_equal(back[k], values[k]) for k in values)
        print(f"| {name} | {len(values)} | {format_bytes(nbytes)} | {wrote:.2f} s | {read:.2f} s |", flush=True)
        del values, back
        path.unlink()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backend", default="numpy", choices=("numpy", "cupy"))
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--checkpoint-models", nargs="*", default=["mlp", "tiny_resnet", "resnet", "bert", "gpt", "vgg"])
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        throughput(args.steps, args.repeats, args.backend, Path(tmp))
        checkpoints(args.checkpoint_models, Path(tmp))


if __name__ == "__main__":
    main()
