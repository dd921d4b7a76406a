"""The demo's data and model: real data, seeded and deterministic."""

from __future__ import annotations

import numpy as np
import torch

from oodbench.demo import TRAIN_THREADS
from oodbench.demo.data import digits_splits, lfw_faces, uniform_noise
from oodbench.demo.model import checkpoint_sha256, forward_arrays, head_of, train_cnn

from .. import reference


def test_demo_data_is_real_and_split_by_class():
    splits = digits_splits(seed=0)
    assert set(np.unique(splits["digits-fit"].labels)) == {0, 1, 2, 3, 4, 5}
    assert set(np.unique(splits["digits-6to9"].labels)) == {6, 7, 8, 9}
    total = sum(len(s.images) for s in splits.values())
    assert total == 1797  # every digit scan is used exactly once
    faces = lfw_faces()
    assert faces.images.shape == (200, 1, 8, 8) and 0.0 <= faces.images.min() and faces.images.max() <= 1.0
    assert np.array_equal(uniform_noise(seed=3).images, uniform_noise(seed=3).images)


def test_training_is_deterministic_and_head_reproduces_logits():
    split = digits_splits(seed=0)["digits-fit"]
    images, labels = split.images[:200], split.labels[:200]
    before = torch.get_num_threads()
    # Determinism holds for a given seed and thread count (CPU kernels reduce per thread): pin the demo's count.
    torch.set_num_threads(TRAIN_THREADS)
    try:
        first = train_cnn(images, labels, 6, epochs=2, seed=1)
        second = train_cnn(images, labels, 6, epochs=2, seed=1)
        other = train_cnn(images, labels, 6, epochs=2, seed=2)
    finally:
        torch.set_num_threads(before)
    assert checkpoint_sha256(first) == checkpoint_sha256(second)
    # The seed decides the weights: equal checkpoints above are not a training that ignores it.
    assert checkpoint_sha256(other) != checkpoint_sha256(first)
    features, logits = forward_arrays(first, images[:50])
    head = head_of(first)
    # torch's float32 logits against the exact ones of the same float32 weights and features: float32 rounding only.
    reference.assert_float32_logits_of_head(logits, features, head)
