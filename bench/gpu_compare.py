"""Where a CuPy run of a plan departs from the reference: the tensors that differ most after each step, and
the places a step asks CuPy's pool for memory (it should ask for none).

Usage: python bench/gpu_compare.py [--configs tiny_resnet tiny_transformer] [--ratio 2] [--steps 3]

For each configuration: the plan (belady, cap = no-swap memory / ratio) runs on CuPy with the CUDA graph
off, in variants (vendor and fused kernels on and off), beside the reference executor on CuPy and on
NumPy (f64 is not used: the reference's own f32). Each step prints the loss of each and the five
persistent tensors furthest from the reference; the second step runs under an allocator that records the
stack of every allocation, printed once per distinct call site.
"""

from __future__ import annotations

import argparse
import collections
import traceback

import numpy as np

from swapdsl import api
from swapdsl.cli import parse_defines
from swapdsl.common.paths import STDLIB_DIR
from swapdsl.graph.ops import kernel_of
from swapdsl.graph.analysis import op_scratch
from swapdsl.graph.ops.registry import KernelContext, np_dtype
from swapdsl.runtime.backend import array_module
from swapdsl.runtime.interpreter import PlanRunner
from swapdsl.runtime.reference import Trainer
from swapdsl.runtime.training import relative_diff

CONFIGS = {"tiny_resnet": ("tiny_resnet", ["batch=8"]), "tiny_transformer": ("tiny_transformer", ["batch=4", "seq=32"]),
           "mlp": ("mlp", []), "lstm_lm": ("lstm_lm", [])}  # (bench scripts import only the package)


def worst(a: dict, b: dict, n: int = 5) -> str:
    diffs = sorted(((relative_diff(v, b[k]), k) for k, v in a.items()), reverse=True)[:n]
    return ", ".join(f"{k} {d:.1e}" for d, k in diffs)


def allocation_sites(runner: PlanRunner, step: int, cupy) -> float:  # noqa: ANN001
    """Step ``step`` under an allocator that records where each allocation came from; its loss."""
    sites: collections.Counter[str] = collections.Counter()
    pool = cupy.cuda.MemoryPool()

    def record(nbytes: int):  # noqa: ANN202
        frames = [f for f in traceback.extract_stack()[:-1] if "swapdsl" in f.filename]
        sites[" <- ".join(f"{f.filename.rsplit('/', 1)[-1]}:{f.lineno} {f.line}" for f in frames[-3:][::-1])] += nbytes
        return pool.malloc(nbytes)

    cupy.cuda.set_allocator(record)
    try:
        loss = runner.step(step)[0]
    finally:
        cupy.cuda.set_allocator(cupy.get_default_memory_pool().malloc)
    for site, nbytes in sites.most_common(12):
        print(f"    alloc {nbytes} B at {site}")
    print(f"    {len(sites)} allocation sites, {sum(sites.values())} bytes")
    return loss


def op_by_op(t, cupy, top: int = 12) -> None:  # noqa: ANN001
    """Step 1 of the NumPy reference, each op's kernel also run on CuPy with the same inputs: the ops whose
    outputs differ most (relative to the largest magnitude of the NumPy output)."""
    found = []

    def watch(i: int, out: np.ndarray, ins: list[np.ndarray]) -> None:
        op = t.ops[i]
        ty = t.type_of(op.outputs[0])
        dev = cupy.empty(ty.shape, dtype=np_dtype(cupy, ty.dtype))
        kernel = kernel_of(op.op, tuple(map(t.type_of, op.inputs)), ty, op.attr_dict)
        kernel(KernelContext.standalone(cupy, op_scratch(t, i), 1), [cupy.asarray(x) for x in ins], dev, op.attr_dict)
        found.append((relative_diff(cupy.asnumpy(dev), out), i, op.op, [x.shape for x in ins], op.attr_dict))

    Trainer(t, 0, np).step(1, watch)
    for d, i, name, shapes, attrs_ in sorted(found, key=lambda f: -f[0])[:top]:
        print(f"    op {i} {name} {d:.1e} inputs {shapes} {attrs_}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--configs", nargs="+", default=["tiny_transformer", "tiny_resnet"])
    ap.add_argument("--ratio", type=float, default=2.0)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--ops", action="store_true", help="only compare each op's CuPy kernel with NumPy's")
    args = ap.parse_args()
    _, cupy = array_module("cupy")
    for name in args.configs:
        model_name, defines = CONFIGS[name]
        model = api.load(STDLIB_DIR / "models" / f"{model_name}.swp", parse_defines(defines))
        no_swap = int(api.optimize(model, 1 << 50, "lru").figure("no_swap_bytes"))
        plan = api.optimize(model, int(no_swap / args.ratio), "belady", seed=0)
        t = model.training
        if args.ops:
            print(f"{name}: the ops whose CuPy kernels differ most from NumPy's")
            op_by_op(t, cupy)
            continue
        ref_np, ref_cp = Trainer(t, 0, np), Trainer(t, 0, cupy)
        runners = {"vendor": PlanRunner(plan, t, "cupy", cupy, 0, graph=False),
                   "plain": PlanRunner(plan, t, "cupy", cupy, 0, graph=False, vendor_kernels=False)}
        for step in range(1, args.steps + 1):
            losses = {"np": ref_np.step(step), "cp": ref_cp.step(step)}
            for k, r in runners.items():
                if step == 2:
                    print(f"  {name} {k}: allocations in step 2")
                    losses[k] = allocation_sites(r, step, cupy)
                else:
                    losses[k] = r.step(step)[0]
            print(f"{name} step {step}: losses " + ", ".join(f"{k} {v:.7g}" for k, v in losses.items()))
            s_np, s_cp = ref_np.state(), ref_cp.state()
            print(f"  ref cupy vs numpy: {worst(s_cp, s_np)}")
            for k, r in runners.items():
                s = r.state()
                print(f"  {k} vs ref cupy: {worst(s, s_cp)}")
                print(f"  {k} vs ref numpy: {worst(s, s_np)}")
        for r in runners.values():
            r.close()


if __name__ == "__main__":
    main()
