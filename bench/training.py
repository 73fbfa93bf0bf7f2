"""Training runs on NumPy: examples per second with synthetic data and with --data, and checkpoint cost.

Usage: python bench/training.py [--steps 300] [--repeats 5] [--checkpoint-models mlp tiny_resnet resnet bert gpt vgg]

Throughput: each model's plan (planned here with belady under the cap given) runs --steps steps on
its one synthetic batch, then on a memory-mapped .npy data set of 4,096 random examples, shuffled;
examples per second count from the end of the first step to the end of the last (the wall clock, so
loading the next batch counts wherever it is not hidden behind the step). Checkpoints: each zoo
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


def examples_per_second(plan: object, options: training.Options) -> tuple[float, float]:
    """(examples per second by the wall clock after the first step, median step ms)."""
    ends: list[float] = []
    counts: list[int] = []

    def seen(r: training.StepRecord) -> None:
        ends.append(time.perf_counter())
        counts.append(r.examples)

    run = swapdsl.execute(plan, backend="numpy", options=options, hooks=training.Hooks(on_step=seen))
    return sum(counts[1:]) / (ends[-1] - ends[0]), float(np.median(run.step_ms))


def throughput(steps: int, repeats: int, folder: Path) -> None:
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
                measured[label].append(examples_per_second(plan, opts))
        for label, results in measured.items():
            rates = sorted(r for r, _ in results)
            step = float(np.median([ms for _, ms in results]))
            print(f"| {name} | {cap} | {label} | {rates[len(rates) // 2]:,.0f} ({rates[0]:,.0f}-{rates[-1]:,.0f}) | "
                  f"{step:.2f} ms |", flush=True)


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
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--checkpoint-models", nargs="*", default=["mlp", "tiny_resnet", "resnet", "bert", "gpt", "vgg"])
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        throughput(args.steps, args.repeats, Path(tmp))
        checkpoints(args.checkpoint_models, Path(tmp))


if __name__ == "__main__":
    main()
