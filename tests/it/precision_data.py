"""Calibration and evaluation batches for the PaddleOCR direction classifier (input x:
[N, 3, 48, 192], text-line crops normalised to [-1, 1]), for the precision tests.

usage: precision_data.py OUT_DIR
  OUT_DIR/calib/  16 batches of 2 synthetic text lines (dark strokes on a light, noisy
                  background, half of them upside down), seed 1
  OUT_DIR/eval/   16 more batches from the same generator (a held-out evaluation set)
  OUT_DIR/bad/    2 batches of near-constant inputs: a deliberately useless calibration set,
                  whose activation ranges destroy the quantized model
"""
import os
import sys

import numpy as np


def textline(rng):
    img = np.full((48, 192), 255.0)
    x = 4
    while x < 180:
        w = rng.integers(6, 14)
        h0 = rng.integers(8, 16)
        h1 = rng.integers(32, 42)
        v = rng.integers(0, 80)
        img[h0:h1, x : x + rng.integers(2, 4)] = v
        img[h0 : h0 + rng.integers(2, 4), x : x + w] = v
        img[h1 - 3 : h1, x : x + w] = v
        x += w + rng.integers(3, 8)
    img = img + rng.normal(0, 8, img.shape)
    if rng.random() < 0.5:
        img = img[::-1, ::-1]
    x = np.stack([img] * 3) / 255.0
    return ((x - 0.5) / 0.5).astype(np.float32)[None]


def main(out):
    rng = np.random.default_rng(1)
    for name in ("calib", "eval"):
        d = os.path.join(out, name)
        os.makedirs(d, exist_ok=True)
        for i in range(16):
            np.save(os.path.join(d, f"x.{i:02d}.npy"), np.concatenate([textline(rng) for _ in range(2)]))
    d = os.path.join(out, "bad")
    os.makedirs(d, exist_ok=True)
    for i in range(2):
        np.save(os.path.join(d, f"x.{i}.npy"), np.full((1, 3, 48, 192), 1e-3 * (i + 1), np.float32))


if __name__ == "__main__":
    main(sys.argv[1])
