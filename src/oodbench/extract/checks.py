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

__all__ = ["ProbeCheck", "head_class_names", "probe_predictions"]


@dataclass
class ProbeCheck:
    """Top-1 classes of a few images (their names when the head's classes are known), with the warnings they raise."""

    n: int
    top1: list[int]
    correct: int | None = None
    warnings: list[str] = field(default_factory=list)
    names: list[str] | None = None  # the class name of each of top1

    def shown(self, limit: int = 8) -> str:
        """The first `limit` top-1 classes, by name where known: 'tabby cat, espresso, …'."""
        labels = self.names if self.names is not None else [str(i) for i in self.top1]
        return ", ".join(labels[:limit]) + (", …" if len(labels) > limit else "")


def head_class_names(backbone: Backbone) -> list[str] | None:
    """Names of the head's classes (timm's ImageNet subsets: 1k, 21k, …), or None when unknown."""
    head = backbone.head()
    if head is None:
        return None
    try:
        from timm.data import ImageNetInfo, infer_imagenet_subset

        subset = infer_imagenet_subset(backbone.model)
        if subset is None:
            return None
        info = ImageNetInfo(subset)
        if info.num_classes() != head.num_classes:
            return None
        return [info.index_to_description(i).split(",")[0] for i in range(head.num_classes)]
    except Exception:  # a model timm does not describe: indices are shown instead
        return None


def probe_predictions(backbone: Backbone, images: ImageList, *, n: int = 16, min_images: int = 4) -> ProbeCheck | None:
    """Top-1 of the first `n` readable images of an ID set; warns when they are degenerate (one class for all,
    non-finite). Run it on ID data only: OOD images (noise, textures) may well all get one class.

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
    names = head_class_names(backbone)
    check = ProbeCheck(len(top1), top1, names=None if names is None else [names[i] for i in top1])
    if not np.isfinite(logits).all():
        check.warnings.append(f"the logits of {len(top1)} probe images are not all finite")
    elif len(top1) >= min_images and len(set(top1)) == 1:
        check.warnings.append(
            f"all {len(top1)} probe images of this ID set get the same top-1 class "
            f"({check.names[0] if check.names else top1[0]}): the "
            "weights, the checkpoint conversion or the preprocessing are probably wrong"
        )
    # Hits are counted only where the labels name the head's classes: as many classes as the head (an ImageNet
    # layout, one folder per head class) or bare class indices in range; folder positions 0-6 are no ImageNet ids.
    named = images.class_names is None or len(images.class_names) == logits.shape[1]
    if images.labels is not None and named:
        labels = np.asarray(images.labels)[positions]
        if labels.size and labels.min() >= 0 and labels.max() < logits.shape[1]:
            check.correct = int((labels == np.asarray(top1)).sum())
    return check
