"""Writes the calibration batches committed beside this script (input.<n>.npz, one array
`input` of shape [1, 3, 224, 224], fp32, ImageNet mean/std normalised): smooth synthetic
images (7x7 random colour blocks upsampled to 224x224, 8-bit levels), seed 0. Deterministic:
rerunning gives the same arrays. Needs numpy only.

They exist so that `recipes/resnet50.toml`'s INT8 targets convert on a fresh clone, against the
stand-in model in recipes/models/. For the real ResNet-50, replace them with a few hundred of
your own validation images preprocessed exactly as at serving time.
"""
import os

import numpy as np

here = os.path.dirname(os.path.abspath(__file__))
rng = np.random.default_rng(0)
mean = np.array([0.485, 0.456, 0.406])[:, None, None]
std = np.array([0.229, 0.224, 0.225])[:, None, None]
for i in range(8):
    img = np.kron(rng.random((3, 7, 7)), np.ones((32, 32)))
    img = np.round(img * 255) / 255
    x = ((img - mean) / std).astype(np.float32)[None]
    np.savez_compressed(os.path.join(here, f"input.{i}.npz"), input=x)
