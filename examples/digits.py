"""The handwritten digits that scikit-learn ships (1,797 8x8 images, 10 classes), as swapdsl training data.

    python examples/digits.py DIR

writes DIR/train/{x,y}.npy (80% of the images) and DIR/test/{x,y}.npy (the rest): `x` is f32[N, 64], the
pixels scaled to [0, 1]; `y` is i32[N], the digit. The split is stratified and fixed (seed 0), so every run
sees the same held-out images. Train stdlib/models/mlp.swp on it with -D features=64 (see the README).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np


def split(y: np.ndarray, test_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Train and test indices, each class divided in the same proportion."""
    rng = np.random.default_rng(seed)
    train, test = [], []
    for label in np.unique(y):
        idx = rng.permutation(np.flatnonzero(y == label))
        cut = int(round(len(idx) * test_fraction))
        test.append(idx[:cut])
        train.append(idx[cut:])
    return np.sort(np.concatenate(train)), np.sort(np.concatenate(test))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="folder to write train/ and test/ into")
    parser.add_argument("--test-fraction", type=float, default=0.2)
    args = parser.parse_args()
    from sklearn.datasets import load_digits  # scikit-learn: the `examples` extra

    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    y = digits.target.astype(np.int32)
    train, test = split(y, args.test_fraction, seed=0)
    for name, rows in (("train", train), ("test", test)):
        folder = args.out / name
        folder.mkdir(parents=True, exist_ok=True)
        np.save(folder / "x.npy", x[rows])
        np.save(folder / "y.npy", y[rows])
        print(f"{folder}: {len(rows)} images")


if __name__ == "__main__":
    main()
