"""Cheap sanity checks run before a long extraction: does the loaded classifier predict anything sensible?

A checkpoint loaded into the wrong architecture, or with the wrong preprocessing, can still run; the first sign is
often that every image gets the same class, or that logits are not finite. `probe_predictions` pushes the first
few images of the dataset through the network and reports what it sees, so the CLI can warn before hours of GPU
time are spent.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from .backbones.base import Backbone
from .datasets import ImageList, UnreadableImage
from .engines.common import ItemLoader

__all__ = ["ProbeCheck", "probe_predictions"]


@dataclass
class ProbeCheck:
    """Top-1 classes of a few images, with the warnings they raise."""

    n: int
    top1: list[int]
    correct: int | None = None
    warnings: list[str] = field(default_factory=list)


def probe_predictions(backbone: Backbone, images: ImageList, *, n: int = 16, min_images: int = 4) -> ProbeCheck | None:
    """Top-1 of the first `n` readable images; warns when they are degenerate (one class for all, non-finite).

    Returns None when the backbone produces no logits. With labels whose range fits the logits, the number of
    top-1 hits is reported too (a hint only: a folder dataset's class order need not be the model's).
    """
    if backbone.head() is None:
        return None
    load = ItemLoader(images, backbone.transform)
    tensors, positions = [], []
    for position in range(len(images)):
        if len(tensors) == n:
            break
        try:
            tensors.append(load(position))
        except UnreadableImage:  # reported by the extraction itself
            continue
        positions.append(position)
    if not tensors:
        return None
    logits = backbone.infer(torch.stack(tensors), amp=False)["logits"]
    top1 = logits.argmax(axis=1).astype(int).tolist()
    check = ProbeCheck(len(top1), top1)
    if not np.isfinite(logits).all():
        check.warnings.append(f"the logits of {len(top1)} probe images are not all finite")
    elif len(top1) >= min_images and len(set(top1)) == 1:
        check.warnings.append(
            f"all {len(top1)} probe images get the same top-1 class ({top1[0]}): the weights, the checkpoint "
            "conversion or the preprocessing are probably wrong"
        )
    if images.labels is not None:
        labels = np.asarray(images.labels)[positions]
        if labels.size and labels.min() >= 0 and labels.max() < logits.shape[1]:
            check.correct = int((labels == np.asarray(top1)).sum())
    return check
