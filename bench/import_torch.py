"""PyTorch models through ONNX into swapdsl (issue 39): export, import, the forward pass against onnxruntime,
the parameter count against PyTorch's, and three training steps beside PyTorch (f32 and f64) from the
same weights.

Usage: python bench/import_torch.py [--models resnet50,...,vgg11@224] [--image 96] [--batch 4]
                                   [--hf gpt2,bert,llama] [--seq 64] [--lr 0.01] [--grads]
                                   [--zero-init-residual] [--keep DIR]

Needs torch, torchvision, transformers, onnx, onnxscript and onnxruntime (outside CI; on these machines
`pip install torch==2.14.1 torchvision==0.29.1 transformers onnxscript` beside the `import` extra). Every
model goes through the dynamo exporter unoptimised: the Hugging Face ones (GPT-2 small, BERT-base as a
masked LM, a two-layer LLaMA with grouped-query heads) with a symbolic batch and sequence, imported at
batch 2, the torchvision ones with a symbolic batch. Per model it prints the import's size, the largest relative difference of the outputs from
onnxruntime's on the same file, the parameters (swapdsl's, of which frozen constants, and PyTorch's),
and the losses of three SGD steps in swapdsl, in PyTorch (`model.train()`, dropout off) and in PyTorch
in f64, with the largest relative difference of each f32 run from f64 and of ours from PyTorch's.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

import swapdsl


def export(name: str, image: int, path: Path, zero_init_residual: bool = False):  # noqa: ANN201
    import torch
    import torchvision

    torch.manual_seed(0)
    kwargs = {"zero_init_residual": True} if zero_init_residual and name.startswith("resnet") else {}
    model = getattr(torchvision.models, name)(**kwargs).eval()
    for m in model.modules():
        if isinstance(m, (torch.nn.Dropout, torchvision.ops.StochasticDepth)):
            m.p = 0.0  # so that training steps compare (EfficientNet drops whole blocks at random)
    torch.onnx.export(model, (torch.randn(2, 3, image, image),), str(path), input_names=["x"],
                      output_names=["logits"], dynamo=True, optimize=False,
                      dynamic_shapes=({0: torch.export.Dim("batch")},))
    return model


def export_hf(name: str, path: Path, seq: int):  # noqa: ANN201
    """Hugging Face's GPT-2 small, BERT-base (masked LM), or a two-layer LLaMA with grouped-query heads,
    through the dynamo exporter unoptimised, the batch and the sequence symbolic, dropout off."""
    import torch
    from transformers import (BertConfig, BertForMaskedLM, GPT2Config, GPT2LMHeadModel, LlamaConfig,
                              LlamaForCausalLM)

    torch.manual_seed(0)
    if name == "gpt2":
        model = GPT2LMHeadModel(GPT2Config(resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)).eval()
    elif name == "bert":
        model = BertForMaskedLM(BertConfig(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)).eval()
    else:
        model = LlamaForCausalLM(LlamaConfig(num_hidden_layers=2, hidden_size=256, num_attention_heads=8,
                                             num_key_value_heads=2, intermediate_size=688, vocab_size=1000)).eval()

    class Logits(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.m = model

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            return self.m(input_ids=ids, use_cache=False).logits

    ids = torch.randint(0, model.config.vocab_size, (2, seq))
    # unoptimised: the optimiser folds transposed weights into unnamed copies and shares equal ones
    sizes = {0: torch.export.Dim("batch"), 1: torch.export.Dim("sequence", max=model.config.max_position_embeddings)}
    torch.onnx.export(Logits(), (ids,), str(path), input_names=["ids"], output_names=["logits"], dynamo=True,
                      optimize=False, dynamic_shapes=(sizes,))
    return Logits()


def hf(name: str, args: argparse.Namespace) -> None:
    import onnxruntime as ort

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        path, swp = folder / f"{name}.onnx", folder / f"{name}.swp"
        model = export_hf(name, path, args.seq)
        started = time.perf_counter()
        m, r = swapdsl.import_onnx(str(path), str(swp), batch=2, dims={"sequence": args.seq}, loss="cross_entropy",
                                   optimizer=f"sgd(lr = {args.lr})")
        took = time.perf_counter() - started
        vocab = model.m.config.vocab_size
        rng = np.random.default_rng(0)
        ids, y = (rng.integers(0, vocab, (2, args.seq)).astype(np.int64) for _ in range(2))
        theirs = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"ids": ids})[0]
        np.savez(folder / "ids.npz", ids=ids)
        ours = swapdsl.predict(str(swp), str(folder / "ids.npz"), init=str(swp.with_suffix(".safetensors")))["logits"]
        gap = float(np.abs(ours - theirs).max() / np.abs(theirs).max())
        print(f"{name}: {len(r.text.splitlines())} lines, {len(m.graph.ops)} ops, imported in {took:.1f} s; "
              f"parameters {sum(v.size for v in r.params.values() if v.size):,} of which frozen "
              f"{sum(r.params[k].size for k in r.frozen):,} (PyTorch {sum(p.numel() for p in model.parameters()):,});"
              f" forward vs onnxruntime {gap:.1e}; notes: {'; '.join(r.notes) or 'none'}", flush=True)
        report(name, m, swp, folder, {"ids": ids, "target": y.astype(np.int32)}, model, (ids, y), args)
        if args.grads:
            data = {"ids": ids, "target": y.astype(np.int32)}
            print(f"{name}: {gradient_gaps(path, folder, data, model, (ids, y), 2, {'sequence': args.seq})}", flush=True)


def report(name: str, m, swp: Path, folder: Path, data: dict, model, xy: tuple,  # noqa: ANN001
           args: argparse.Namespace) -> None:
    """Three SGD steps in swapdsl, in PyTorch and in PyTorch f64, from the same weights and data."""
    np.savez(folder / "train.npz", **data)
    run = swapdsl.execute(m, options=swapdsl.Options(steps=args.steps, data=str(folder / "train.npz"),
                                                     init=str(swp.with_suffix(".safetensors"))))
    ours = list(run.losses)
    theirs, exact = (torch_losses(model, *xy, args.steps, args.lr, f64) for f64 in (False, True))

    def gap(losses: list[float]) -> float:
        return max(abs(a - b) / abs(b) for a, b in zip(losses, exact))
    print(f"{name}: losses {', '.join(f'{v:.6f}' for v in ours)}, PyTorch {', '.join(f'{v:.6f}' for v in theirs)}, "
          f"PyTorch in f64 {', '.join(f'{v:.6f}' for v in exact)}; largest relative difference from f64: "
          f"ours {gap(ours):.1e}, PyTorch's f32 {gap(theirs):.1e}; ours from PyTorch's f32 "
          f"{max(abs(a - b) / abs(b) for a, b in zip(ours, theirs)):.1e}", flush=True)


_LR = 2.0 ** 20


def gradient_gaps(path: Path, folder: Path, data: dict, model, xy: tuple, batch: int,  # noqa: ANN001
                  dims: dict | None = None) -> str:
    """The first step's gradients (one SGD step of lr 2^20 from the checkpoint: (w0 - w1) / 2^20, so that the
    step, not the weight, sets w1's rounding), swapdsl's and PyTorch's f32 ones, each against PyTorch's f64."""
    import copy

    import torch
    from safetensors.numpy import load_file

    m, _ = swapdsl.import_onnx(str(path), str(folder / "g.swp"), batch=batch, dims=dims, loss="cross_entropy",
                               optimizer=f"sgd(lr = {float(_LR)})", flat=True)
    np.savez(folder / "g.npz", **data)
    swapdsl.execute(m, options=swapdsl.Options(steps=1, data=str(folder / "g.npz"), save=str(folder / "g1.st"),
                                               init=str(folder / "g.safetensors")))
    w0, w1 = load_file(str(folder / "g.safetensors")), load_file(str(folder / "g1.st"))
    grads = {}
    for dtype in (torch.float64, torch.float32):
        mm = copy.deepcopy(model).to(dtype).train()
        x, y = (torch.from_numpy(v) for v in xy)
        logits = mm(x.to(dtype) if x.dtype.is_floating_point else x)
        torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.long().reshape(-1)).backward()
        grads[dtype] = {n.replace(".", "_"): p.grad.double().numpy() for n, p in mm.named_parameters()}
    ours = {n: (w0[n].astype(np.float64) - w1[n].astype(np.float64)) / _LR for n in grads[torch.float64] if n in w0}
    exact = grads[torch.float64]

    def gap(g: dict) -> float:  # all the gradients as one vector, as tests/test_torch_oracle.py compares them
        return float(np.sqrt(sum(np.sum((g[n].reshape(-1) - exact[n].reshape(-1)) ** 2) for n in ours)
                             / sum(np.sum(exact[n] ** 2) for n in ours)))
    return (f"first step's gradients ({len(ours)} of {len(exact)} parameters, by name) against "
            f"PyTorch f64, relative L2: ours {gap(ours):.1e}, PyTorch's f32 {gap(grads[torch.float32]):.1e}")


def forward_gap(path: Path, swp: Path, x: np.ndarray, folder: Path) -> float:
    import onnxruntime as ort

    theirs = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.savez(folder / "x.npz", x=x)
    ours = swapdsl.predict(str(swp), str(folder / "x.npz"), init=str(swp.with_suffix(".safetensors")))["logits"]
    return float(np.abs(ours - theirs).max() / np.abs(theirs).max())


def torch_losses(model, x: np.ndarray, y: np.ndarray, steps: int, lr: float,  # noqa: ANN001
                 f64: bool = False) -> list[float]:
    import copy

    import torch

    model = copy.deepcopy(model)
    if f64:
        model, x = model.double(), x.astype(np.float64) if x.dtype.kind == "f" else x
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    out = []
    for _ in range(steps):
        opt.zero_grad()
        logits = model(torch.from_numpy(x))
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                 torch.from_numpy(y).long().reshape(-1))
        out.append(float(loss.detach()))
        loss.backward()
        opt.step()
    return out


def vision(spec: str, args: argparse.Namespace) -> None:
    """A torchvision model (`vgg11@224`: at its own image size) exported, imported, compared, trained."""
    name, _, size = spec.partition("@")
    image = int(size or args.image)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((args.batch, 3, image, image)).astype(np.float32)
    y = rng.integers(0, 1000, args.batch).astype(np.int32)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        path, swp = folder / f"{name}.onnx", folder / f"{name}.swp"
        model = export(name, image, path, args.zero_init_residual)
        started = time.perf_counter()
        m, r = swapdsl.import_onnx(str(path), str(swp), batch=args.batch, loss="cross_entropy",
                                   optimizer=f"sgd(lr = {args.lr})")
        if args.keep:
            swapdsl.import_onnx(str(path), str(Path(args.keep) / swp.name), weights=str(folder / "kept.st"))
        took = time.perf_counter() - started
        gap = forward_gap(path, swp, x, folder)
        print(f"{spec}: {len(r.text.splitlines())} lines, {len(m.graph.ops)} ops, imported in {took:.1f} s; "
              f"parameters {sum(v.size for v in r.params.values()):,} (PyTorch "
              f"{sum(p.numel() for p in model.parameters()):,}); forward vs onnxruntime {gap:.1e}", flush=True)
        report(spec, m, swp, folder, {"x": x, "target": y}, model, (x, y), args)
        if args.grads:
            print(f"{spec}: {gradient_gaps(path, folder, {'x': x, 'target': y}, model, (x, y), args.batch)}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="resnet50,mobilenet_v3_small,mobilenet_v2,efficientnet_b0,vgg11@224",
                    help="torchvision models, NAME or NAME@IMAGE")
    ap.add_argument("--image", type=int, default=96)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--lr", type=float, default=0.01, help="SGD's learning rate, both sides")
    ap.add_argument("--hf", default="gpt2,bert,llama", help="Hugging Face models (transformers installed), or ''")
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--zero-init-residual", action="store_true",
                    help="ResNets with each block's last batch norm scale 0 (torchvision's training recipe): "
                         "better conditioned than the default at a few small images")
    ap.add_argument("--grads", action="store_true", help="also compare the first step's gradients with f64")
    ap.add_argument("--keep", metavar="DIR", help="write each imported .swp there too (docs/resnet50.swp came so)")
    args = ap.parse_args()
    for name in filter(None, args.hf.split(",")):
        hf(name, args)
    for spec in filter(None, args.models.split(",")):
        vision(spec, args)


if __name__ == "__main__":
    main()
