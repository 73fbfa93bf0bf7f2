"""How examples/digits_cnn.onnx was made: a small CNN trained in PyTorch on scikit-learn's digits, then
exported to ONNX, the file the README's `swapdsl import` tour starts from.

    python examples/digits.py tour/digits                       # the data, split as swapdsl's runs see it
    python examples/digits_cnn.py tour/digits examples/digits_cnn.onnx

needs torch (any recent CPU build) besides the `examples` extra; swapdsl itself never imports torch. The
export keeps batch norm as its own node (`do_constant_folding=False`: folded into the convolution it could
not be trained further) and the batch size symbolic.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np


def build():  # noqa: ANN201
    import torch
    from torch import nn

    class DigitsCNN(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.features = nn.Sequential(
                nn.Conv2d(1, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
                nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1))
            self.head = nn.Linear(32, 10)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.head(torch.flatten(self.features(x.reshape(-1, 1, 8, 8)), 1))

    return DigitsCNN()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("data", type=Path, help="the folder examples/digits.py wrote")
    parser.add_argument("out", type=Path, help="the .onnx file to write")
    parser.add_argument("--epochs", type=int, default=8)
    args = parser.parse_args()
    import torch

    torch.manual_seed(0)
    x, y = (torch.from_numpy(np.load(args.data / "train" / f"{n}.npy")) for n in ("x", "y"))
    net = build()
    opt = torch.optim.Adam(net.parameters(), lr=1e-2)
    for _ in range(args.epochs):
        for i in torch.randperm(len(x)).split(64):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(net(x[i]), y[i].long()).backward()
            opt.step()
    net.eval()
    tx, ty = (torch.from_numpy(np.load(args.data / "test" / f"{n}.npy")) for n in ("x", "y"))
    with torch.no_grad():
        accuracy = (net(tx).argmax(1) == ty).float().mean().item()
    torch.onnx.export(net, (tx[:2],), str(args.out), input_names=["x"], output_names=["logits"], opset_version=17,
                      dynamic_axes={"x": {0: "batch"}, "logits": {0: "batch"}}, do_constant_folding=False,
                      dynamo=False)
    print(f"{args.out}: held-out accuracy {accuracy:.4f} in PyTorch")


if __name__ == "__main__":
    main()
