"""The measured fraction on a GPU, and PyTorch beside it.

Usage: python bench/gpu_bench.py [--models resnet50 wide_resnet50_2 bert_base gpt2_small] [--ratios 2 4 8]
                                 [--steps 5] [--budget 10] [--json FILE] [--small]

For each model: swapdsl profiles the GPU (`swapdsl profile`: each distinct op's time, the copy
bandwidths), runs a plan with room for everything (cap = the no-swap arena, nothing swapped: the
infinite-memory step on the same runtime, one CUDA graph a step), then for each ratio plans `ga` under
cap = no-swap memory / ratio with that profile and runs the plan. Measured fraction = no-swap step /
capped step (the reference executor's step, op by op with its own allocations, is shown beside it); simulated fraction = the plan's ideal / simulated step. PyTorch
(when installed) trains the same architecture, batch and FP32 setting (TF32 off) in a process of its
own: eager with no cap, then under the same cap (`set_per_process_memory_fraction`) with
`save_on_cpu(pin_memory=True)` and with activation checkpointing per block: its median step, or "out
of memory". `--small` runs tiny models on the CPU (NumPy, and PyTorch on the CPU with no cap) to try
the script without a GPU.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from typing import Any

from swapdsl import api
from swapdsl.cli import parse_defines
from swapdsl.common.paths import STDLIB_DIR
from swapdsl.common.units import format_bytes

# name: (swapdsl model, its arguments, the PyTorch builder's arguments)
MODELS: dict[str, tuple[str, list[str], dict[str, Any]]] = {
    "resnet50": ("resnet", ["depth=50", "batch=64"], {"arch": "resnet50", "batch": 64, "image": 224}),
    "wide_resnet50_2": ("wide_resnet", ["batch=64"], {"arch": "wide_resnet50_2", "batch": 64, "image": 224}),
    "bert_base": ("bert", ["layers=12", "hidden=768", "heads=12", "intermediate=3072", "seq=512", "batch=32"],
                  {"arch": "bert", "layers": 12, "hidden": 768, "heads": 12, "ffn": 3072, "seq": 512, "batch": 32,
                   "vocab": 30522}),
    "gpt2_small": ("gpt", ["layers=12", "hidden=768", "heads=12", "seq=1024", "batch=8"],
                   {"arch": "gpt", "layers": 12, "hidden": 768, "heads": 12, "ffn": 3072, "seq": 1024, "batch": 8,
                    "vocab": 50257}),
    # tiny ones, to try the script on a CPU
    "tiny_transformer": ("tiny_transformer", ["batch=4", "seq=32"],
                         {"arch": "gpt", "layers": 2, "hidden": 64, "heads": 4, "ffn": 256, "seq": 32, "batch": 4,
                          "vocab": 1000}),
}


def swapdsl_rows(name: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    from swapdsl.devices.profiles import load_device
    from swapdsl.runtime import reference
    from swapdsl.runtime.backend import array_module
    from swapdsl.runtime.profile import profile

    model_name, defines, _ = MODELS[name]
    model = api.load(STDLIB_DIR / "models" / f"{model_name}.swp", parse_defines(defines))
    backend, xp = array_module(args.backend)
    device = profile(model.training, xp, backend, load_device(None), repeat=3)
    reference_ms = statistics.median(reference.train(model.training, args.steps, 0, xp).step_ms[1:])
    room = api.optimize(model, api.no_swap_arena(model.training), "belady", device=device)
    free_ms = api.execute_plan(room, model.training, args.steps, 0, backend).steady_ms()
    no_swap = int(room.figure("no_swap_bytes"))
    rows = []
    for ratio in args.ratios:
        cap = int(no_swap / ratio)
        row: dict[str, Any] = {"model": name, "ratio": ratio, "cap_bytes": cap, "no_cap_ms": free_ms,
                               "reference_ms": reference_ms}
        try:
            plan = api.optimize(model, cap, "ga", device=device, budget_s=args.budget, seed=0)
        except Exception as exc:  # below the smallest feasible cap
            rows.append(row | {"swapdsl": f"infeasible: {str(exc).splitlines()[0]}"})
            continue
        run = api.execute_plan(plan, model.training, args.steps, 0, backend)
        step = run.steady_ms()  # after the first step and the one that captured the CUDA graph
        rows.append(row | {"swapdsl_ms": step, "measured_fraction": free_ms / step,
                           "simulated_fraction": plan.figure("fraction"), "simulated_ms": plan.figure("iteration_ms"),
                           "device_bytes_allocated": run.figures["device_bytes_allocated"],
                           "vendor_kernels": run.figures["vendor_kernels"]})
    return rows


def torch_step(name: str, mode: str, cap: int | None, steps: int, device: str) -> str:
    """PyTorch's median step for one model and mode, in a process of its own: 'ms', 'out of memory' or
    'unavailable'."""
    cmd = [sys.executable, __file__, "--torch-run", name, mode, str(cap or 0), str(steps), device]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    lines = done.stdout.strip().splitlines()
    return lines[-1] if done.returncode == 0 and lines else f"failed: {done.stderr.strip().splitlines()[-1:]}"


def torch_run(name: str, mode: str, cap: int, steps: int, device: str) -> None:
    try:
        import torch
    except ImportError:
        print("unavailable (no PyTorch)")
        return
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dev = torch.device(device)
    if dev.type == "cuda" and dev.index is None:  # the memory fraction wants a device with its index
        dev = torch.device("cuda", torch.cuda.current_device())
    if cap and dev.type == "cuda":
        torch.cuda.set_per_process_memory_fraction(cap / torch.cuda.get_device_properties(dev).total_memory, dev)
    model, batch, optimizer = _torch_model(torch, MODELS[name][2], dev)
    times = []
    try:
        for _ in range(steps):
            _sync(torch, dev)
            t0 = time.perf_counter()
            optimizer.zero_grad(set_to_none=True)
            if mode == "save_on_cpu":
                with torch.autograd.graph.save_on_cpu(pin_memory=dev.type == "cuda"):
                    loss = model(*batch, checkpoint=False)
            else:
                loss = model(*batch, checkpoint=mode == "checkpoint")
            loss.backward()
            optimizer.step()
            _sync(torch, dev)
            times.append(1e3 * (time.perf_counter() - t0))
    except torch.cuda.OutOfMemoryError:
        print("out of memory")
        return
    print(f"{statistics.median(times[1:] or times):.1f}")


def _sync(torch: Any, dev: Any) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def _torch_model(torch: Any, spec: dict[str, Any], dev: Any) -> tuple[Any, tuple[Any, ...], Any]:
    """The PyTorch counterpart of a zoo model: the module (called with its batch and whether to checkpoint
    each block), one batch, and the same optimiser."""
    from torch import nn
    from torch.utils.checkpoint import checkpoint as ckpt

    if spec["arch"] in ("resnet50", "wide_resnet50_2"):
        import torchvision

        net = getattr(torchvision.models, spec["arch"])(num_classes=1000).to(dev)
        blocks = [b for layer in (net.layer1, net.layer2, net.layer3, net.layer4) for b in layer]

        class Classifier(nn.Module):
            def forward(self, x: Any, y: Any, checkpoint: bool) -> Any:
                h = net.maxpool(net.relu(net.bn1(net.conv1(x))))
                for b in blocks:
                    h = ckpt(b, h, use_reentrant=False) if checkpoint else b(h)
                return nn.functional.cross_entropy(net.fc(torch.flatten(net.avgpool(h), 1)), y)

        x = torch.randn(spec["batch"], 3, spec["image"], spec["image"], device=dev)
        y = torch.randint(0, 1000, (spec["batch"],), device=dev)
        return Classifier(), (x, y), torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    lm = _LanguageModel(torch, spec).to(dev)
    tokens = torch.randint(0, spec["vocab"], (spec["batch"], spec["seq"]), device=dev)
    labels = torch.randint(0, spec["vocab"], (spec["batch"], spec["seq"]), device=dev)
    decay = 0.01 if spec["arch"] == "bert" else 0.0
    return lm, (tokens, labels), torch.optim.Adam(lm.parameters(), lr=1e-4, weight_decay=decay)


def _LanguageModel(torch: Any, spec: dict[str, Any]) -> Any:  # noqa: N802  (builds a class)
    """BERT (post-norm encoder, masked-LM head over every position) or GPT-2 (pre-norm, causal), as the
    zoo writes them: embeddings, blocks, a final norm or transform, a decoder tied to the embedding."""
    from torch import nn
    from torch.utils.checkpoint import checkpoint as ckpt

    bert = spec["arch"] == "bert"

    class LM(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(spec["vocab"], spec["hidden"])
            self.pos = nn.Parameter(torch.randn(spec["seq"], spec["hidden"]) * 0.01)
            self.blocks = nn.ModuleList(
                nn.TransformerEncoderLayer(spec["hidden"], spec["heads"], spec["ffn"], dropout=0.1,
                                           activation="gelu", batch_first=True, norm_first=not bert,
                                           layer_norm_eps=1e-12 if bert else 1e-5)
                for _ in range(spec["layers"]))
            self.norm = nn.LayerNorm(spec["hidden"])
            self.transform = nn.Linear(spec["hidden"], spec["hidden"]) if bert else nn.Identity()
            self.bias = nn.Parameter(torch.zeros(spec["vocab"]))
            mask = None if bert else torch.triu(torch.full((spec["seq"], spec["seq"]), float("-inf")), 1)
            self.register_buffer("mask", mask)

        def forward(self, tokens: Any, labels: Any, checkpoint: bool) -> Any:
            h = self.embed(tokens) + self.pos
            for b in self.blocks:
                h = ckpt(b, h, self.mask, use_reentrant=False) if checkpoint else b(h, self.mask)
            h = self.norm(nn.functional.gelu(self.transform(h))) if bert else self.norm(h)
            logits = h @ self.embed.weight.T + self.bias
            return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))

    return LM()


def table(rows: list[dict[str, Any]]) -> str:
    lines = ["| model | ratio | cap | reference ms | swapdsl no-swap ms | swapdsl ms | measured fraction | "
             "simulated fraction | device held | PyTorch eager ms | save_on_cpu ms | checkpoint ms |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        ours = (f"{r['swapdsl_ms']:.1f} | {r['measured_fraction']:.3f} | {r['simulated_fraction']:.3f} | "
                f"{format_bytes(r['device_bytes_allocated'])}") if "swapdsl_ms" in r else f"{r['swapdsl']} | | |"
        lines.append(f"| {r['model']} | {r['ratio']:g} | {format_bytes(r['cap_bytes'])} | {r['reference_ms']:.1f} | "
                     f"{r['no_cap_ms']:.1f} | "
                     f"{ours} | {r.get('torch_eager', '-')} | {r.get('torch_save_on_cpu', '-')} | "
                     f"{r.get('torch_checkpoint', '-')} |")
    return "\n".join(lines)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--torch-run":
        name, mode, cap, steps, device = sys.argv[2:7]
        torch_run(name, mode, int(cap), int(steps), device)
        return
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=["resnet50", "wide_resnet50_2", "bert_base", "gpt2_small"],
                    choices=sorted(MODELS))
    ap.add_argument("--ratios", type=float, nargs="+", default=[2.0, 4.0, 8.0])
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--budget", type=float, default=10.0, help="ga search seconds per plan")
    ap.add_argument("--backend", default="cupy")
    ap.add_argument("--torch-device", default="cuda")
    ap.add_argument("--small", action="store_true", help="tiny models, NumPy and PyTorch on the CPU")
    ap.add_argument("--json", metavar="FILE")
    args = ap.parse_args()
    if args.small:
        args.models, args.backend, args.torch_device = ["tiny_transformer"], "numpy", "cpu"
    rows = []
    for name in args.models:
        eager = torch_step(name, "eager", None, args.steps, args.torch_device)
        for row in swapdsl_rows(name, args):
            capped = {f"torch_{mode}": torch_step(name, mode, row["cap_bytes"], args.steps, args.torch_device)
                      for mode in ("save_on_cpu", "checkpoint")}  # on a CPU the cap is not applied
            rows.append(row | {"torch_eager": eager} | capped)
            print(table(rows[-1:]).splitlines()[-1], flush=True)
    print(table(rows))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
