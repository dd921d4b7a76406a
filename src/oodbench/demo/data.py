"""The demo's real data, shipped by scikit-learn and scikit-image: digits (ID 0-5, near-OOD 6-9), LFW faces, noise."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

ID_CLASSES = (0, 1, 2, 3, 4, 5)
NEAR_OOD_CLASSES = (6, 7, 8, 9)
IMAGE_SIZE = 8


@dataclass(frozen=True)
class ImageSet:
    """Grey-level images in [0, 1], shape (N, 1, 8, 8), with integer labels (-1 where none)."""

    images: np.ndarray
    labels: np.ndarray


def digits_splits(seed: int = 0, test_fraction: float = 0.4) -> dict[str, ImageSet]:
    """Stratified train/test split of scikit-learn's 1,797 digits into ID (0-5) and near-OOD (6-9) parts."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    images = (digits.images / 16.0).astype(np.float32)[:, None]  # pixel values 0..16 -> [0, 1]
    labels = digits.target.astype(np.int64)
    train_x, test_x, train_y, test_y = train_test_split(
        images, labels, test_size=test_fraction, stratify=labels, random_state=seed
    )
    is_id_train = np.isin(train_y, ID_CLASSES)
    is_id_test = np.isin(test_y, ID_CLASSES)
    return {
        "digits-fit": ImageSet(train_x[is_id_train], train_y[is_id_train]),
        "digits-id-test": ImageSet(test_x[is_id_test], test_y[is_id_test]),
        "digits-6to9": ImageSet(test_x[~is_id_test], test_y[~is_id_test]),
        "digits-6to9-train": ImageSet(train_x[~is_id_train], train_y[~is_id_train]),
    }


def lfw_faces() -> ImageSet:
    """scikit-image's bundled LFW subset (200 faces) resized to 8x8 grey levels in [0, 1]."""
    from skimage.data import lfw_subset
    from skimage.transform import resize

    faces = lfw_subset().astype(np.float64)
    small = resize(faces, (faces.shape[0], IMAGE_SIZE, IMAGE_SIZE), anti_aliasing=True)
    low, high = small.min(axis=(1, 2), keepdims=True), small.max(axis=(1, 2), keepdims=True)
    small = (small - low) / np.maximum(high - low, 1e-12)  # per-image contrast stretch, as digits span 0..16
    return ImageSet(small.astype(np.float32)[:, None], np.full(faces.shape[0], -1, dtype=np.int64))


def uniform_noise(count: int = 300, seed: int = 0) -> ImageSet:
    """Uniform noise images in [0, 1] (seeded)."""
    rng = np.random.default_rng(seed + 12345)
    images = rng.uniform(0.0, 1.0, size=(count, 1, IMAGE_SIZE, IMAGE_SIZE)).astype(np.float32)
    return ImageSet(images, np.full(count, -1, dtype=np.int64))
