"""The riskiest questions of a first GPU run, each answered in seconds, before anything long runs.

Usage: python bench/gpu_first_light.py [--json FILE]

In order, each printed as one `ok` or `FAIL` line with what it found, none stopping the others:

1. CuPy sees a GPU, and the runtime's reduction accelerators (CUB, cuTENSOR) are off;
2. cuBLAS through swapdsl's own handle: a strided-batched product equals NumPy's, issued eagerly and
   inside a captured CUDA graph (CuPy's own wrappers refuse under capture);
3. cuDNN Frontend builds the convolution graphs of a small ResNet (the vendor notes printed);
4. `exec --backend cupy --check` of mlp and tiny_transformer, planned with `belady` under half their
   no-swap memory (or the least of 1/1.5, 1/1.2 and all of it that plans): the steps equal the reference
   executor's, and how they ran (`graph`: captured, or eager and why).

Without a GPU (as on the development machines) the first check fails and the rest say they were skipped.
"""

from __future__ import annotations

import argparse
import json
import time
import traceback
from collections.abc import Callable
from typing import Any

import attrs
import numpy as np

from swapdsl import api
from swapdsl.cli import parse_defines
from swapdsl.common.errors import SwpError
from swapdsl.common.paths import STDLIB_DIR
from swapdsl.runtime.training import relative_diff


def check(results: list[dict], name: str, fn: Callable[[], str]) -> bool:
    started = time.perf_counter()
    try:
        found, ok = fn(), True
    except Exception as exc:  # every failure is an answer: report it and go on
        found, ok = f"{type(exc).__name__}: {exc}".strip()[:400], False
        traceback.print_exc()
    results.append({"check": name, "ok": ok, "found": found, "seconds": round(time.perf_counter() - started, 2)})
    print(f"{'ok  ' if ok else 'FAIL'} {name}: {found}", flush=True)
    return ok


def cupy_present() -> str:
    import cupy

    from swapdsl.runtime.backend import array_module

    name, xp = array_module("cupy")
    core = getattr(xp, "_core", None)
    accel = [getattr(core, f"get_{k}_accelerators", lambda: "?")() for k in ("routine", "reduction")]
    props = cupy.cuda.runtime.getDeviceProperties(0)
    return f"CuPy {cupy.__version__} on {props['name'].decode()}; accelerators (routine, reduction): {accel}"


def cublas_captured() -> str:
    import cupy

    from swapdsl.graph.ops.blas import matmul_into, own_cublas, workspace_bytes
    from swapdsl.graph.ops.registry import KernelContext

    if own_cublas(cupy) is None:
        raise RuntimeError("no cuBLAS library of our own could be opened")
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((3, 64, 48), np.float32), rng.standard_normal((48, 32), np.float32)
    want = x @ y
    dx, dy, out = cupy.asarray(x), cupy.asarray(y), cupy.zeros((3, 64, 32), cupy.float32)
    stream = cupy.cuda.Stream(non_blocking=True)
    ctx = attrs.evolve(KernelContext.standalone(cupy, 1), workspace=cupy.empty(workspace_bytes(cupy), np.uint8))
    with stream:
        matmul_into(ctx, dx, dy, out)
    stream.synchronize()
    eager = float(np.abs(out.get() - want).max())
    out.fill(0)
    cupy.cuda.Device().synchronize()
    free = cupy.cuda.runtime.memGetInfo()[0]
    with stream:
        stream.begin_capture()
        matmul_into(ctx, dx, dy, out)
        graph = stream.end_capture()
    graph.launch(stream)
    stream.synchronize()
    taken = free - cupy.cuda.runtime.memGetInfo()[0]  # (cuBLAS's own workspace would show here)
    captured = float(np.abs(out.get() - want).max())
    if max(eager, captured) > 1e-3:
        raise AssertionError(f"products differ from NumPy's: eager {eager:.1e}, captured {captured:.1e}")
    return (f"eager and captured products equal NumPy's (max abs diff {eager:.1e}, {captured:.1e}); "
            f"device memory taken by the capture: {taken} bytes")


def cudnn_convolutions() -> str:
    import cupy

    from swapdsl.graph.autodiff import training_graph
    from swapdsl.runtime.vendor import VendorKernels

    model = api.load(STDLIB_DIR / "models" / "tiny_resnet.swp", parse_defines(["batch=2"]))
    vendor = VendorKernels.load(training_graph(model.graph), lambda: cupy.cuda.get_current_stream().ptr)
    if not vendor.kernels:
        raise RuntimeError(f"no convolution got a cuDNN graph: {'; '.join(vendor.notes) or 'no notes'}")
    return f"{vendor.graphs} cuDNN graphs for {len(vendor.kernels)} ops; notes: {'; '.join(vendor.notes) or 'none'}"


def exec_checked(model_name: str, defines: list[str]) -> Callable[[], str]:
    def run() -> str:
        model = api.load(STDLIB_DIR / "models" / f"{model_name}.swp", parse_defines(defines))
        no_swap = int(api.optimize(model, 1 << 50, "lru").figure("no_swap_bytes"))
        plan = None
        for ratio in (2.0, 1.5, 1.2, 1.0):  # the tightest of these caps that the model plans under
            try:
                plan = api.optimize(model, int(no_swap / ratio), "belady")
                break
            except SwpError:
                continue
        # the reference's own kernels: the plan alone is measured, and must agree to rounding
        own = api.execute(plan, steps=3, backend="cupy", check=True, vendor_kernels=False)
        # cuDNN and fused kernels round differently; a model with a tie at its start (a ReLU over a batch
        # norm's exact zeros, an attention key bias whose gradient is zero) turns that into O(1) differences
        # in a few tensors, so only the losses are held to 1e-4 there
        run = api.execute(plan, steps=3, backend="cupy", check=True)
        losses = relative_diff(run.losses, own.losses)
        found: dict[str, Any] = {"graph": run.figures.get("graph"), "own_kernels_max_rel_diff": own.max_rel_diff,
                                 "own_at": own.max_rel_diff_at, "vendor_max_rel_diff": run.max_rel_diff,
                                 "vendor_at": run.max_rel_diff_at, "vendor_losses_rel_diff": losses,
                                 "vendor_notes": run.figures.get("vendor_notes"), "loss": run.losses}
        if own.max_rel_diff is None or own.max_rel_diff > 1e-5 or losses > 1e-4:
            raise AssertionError(f"differs from the reference: {json.dumps(found, default=str)[:400]}")
        return json.dumps(found, default=str)[:400]

    return run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", metavar="FILE")
    args = ap.parse_args()
    results: list[dict] = []
    if check(results, "cupy", cupy_present):
        check(results, "cublas under capture", cublas_captured)
        check(results, "cudnn frontend", cudnn_convolutions)
        check(results, "exec mlp", exec_checked("mlp", ["batch=64"]))
        check(results, "exec tiny_transformer", exec_checked("tiny_transformer", ["batch=4", "seq=32"]))
    else:
        for name in ("cublas under capture", "cudnn frontend", "exec mlp", "exec tiny_transformer"):
            results.append({"check": name, "ok": False, "found": "skipped: no GPU"})
            print(f"skip {name}: no GPU", flush=True)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
