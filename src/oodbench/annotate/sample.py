"""`oodbench annotate init PROJECT --demo`: a sample project that needs no image data and no download.

The candidates are real: the first images that ReaL leaves without a label (timm's copy) and that
Northcutt et al.'s MTurk workers said fit neither label (the copy shipped with oodbench), with their
original labels and the confusion counts of both re-annotations (evidence E). The ImageNet images
themselves cannot ship, so each candidate gets a generated image: coloured blocks in the palette of its
original class mixed with the palette of the class it is most often confused with. Evidence D comes
from a deliberately tiny embedding model (joint colour histograms) of those images against a
generated image of each class's palette. It is a weak model, not a vision-language model: with 1,000
palettes in 64 colour bins the original class is among its top 5 for about half of the images (8 of 18
with the defaults), which is what a sample needs to show the evidence panel at work.
"""

from __future__ import annotations

import secrets
from pathlib import Path

import numpy as np

from ..core.errors import AnnotateError
from ..text.classes import load_classes
from .importers import BUILTIN, Import, load_original_labels, read_mturk, read_real
from .project import Project, add_vlm_evidence, import_candidates

DEMO_MODEL = "demo colour histogram (4x4x4 bins; not a VLM)"
ACCOUNTS = ("admin", "ann1", "ann2", "ann3")
_SIZE = 96  # pixels per side of a generated image
_BLOCK = 8  # pixels per side of a colour block
_BINS = 4  # histogram bins per colour channel (4**3 joint bins)


def palette(class_index: int) -> np.ndarray:
    """Three colours (3, 3) uint8 that stand for a class in the sample."""
    return np.random.default_rng(class_index).integers(0, 256, (3, 3), dtype=np.uint8)


def blocks(colours: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """A (_SIZE, _SIZE, 3) uint8 image of blocks drawn from the given colours, with mild noise."""
    cells = _SIZE // _BLOCK
    picks = colours[rng.integers(0, len(colours), (cells, cells))]
    image = picks.repeat(_BLOCK, axis=0).repeat(_BLOCK, axis=1).astype(np.int16)
    image += rng.integers(-12, 13, image.shape, dtype=np.int16)
    return np.clip(image, 0, 255).astype(np.uint8)


def embed(pixels: np.ndarray) -> np.ndarray:
    """The tiny model: square roots of joint colour histograms (N, _BINS**3) of (N, H, W, 3) uint8 images.

    Square roots make the dot product of two embeddings the Bhattacharyya coefficient of their histograms.
    """
    pixels = np.asarray(pixels)
    n = pixels.shape[0]
    bins = (pixels.reshape(n, -1, 3).astype(np.int64) * _BINS) // 256  # (N, P, 3): the bin of each channel
    cells = (bins[..., 0] * _BINS + bins[..., 1]) * _BINS + bins[..., 2]  # (N, P): the joint bin
    counts = np.zeros((n, _BINS**3), np.float64)
    np.add.at(counts, (np.repeat(np.arange(n), cells.shape[1]), cells.ravel()), 1.0)
    return np.sqrt(counts / counts.sum(axis=1, keepdims=True)).astype(np.float32)


def class_embeddings(n_classes: int) -> np.ndarray:
    """Embedding of each class: the tiny model applied to a generated image in the class's palette."""
    return np.concatenate([embed(blocks(palette(c), np.random.default_rng(c))[None]) for c in range(n_classes)])


def _subset(imp: Import, count: int) -> Import:
    """The first `count` candidates of an import, with the confusion pairs of the whole re-annotation."""
    return Import(imp.candidates[:count], imp.confusion_pairs, imp.source)


def build_sample(directory: str | Path, *, n_real: int = 12, n_mturk: int = 6, seed: int = 0) -> tuple[Project, str]:
    """Create the sample project in `directory` (which must not hold a project); returns it and the accounts' password."""
    from PIL import Image

    directory = Path(directory).absolute()
    if (directory / "project.json").exists():
        raise AnnotateError(f"{directory} already holds a project; give --demo a new folder")
    classes = load_classes("imagenet1k:timm")
    real = _subset(read_real(BUILTIN, load_original_labels(BUILTIN)), n_real)
    mturk = _subset(read_mturk(BUILTIN), n_mturk)
    confused = {int(a): int(b) for a, b in np.concatenate([real.confusion_pairs, mturk.confusion_pairs])[::-1]}
    rng = np.random.default_rng(seed)
    images_root, examples_root = directory / "sample-images", directory / "sample-examples"
    shown: set[int] = set()
    for cand in real.candidates + mturk.candidates:
        label = int(cand.original_label)
        other = confused.get(label, (label + 1) % len(classes))
        shown.update((label, other))
        image = np.where(rng.random((_SIZE, _SIZE, 1)) < 0.6, blocks(palette(label), rng), blocks(palette(other), rng))
        target = images_root / cand.path
        target.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(image).save(target, format="JPEG", quality=90)
    for label in sorted(shown):
        for number in range(3):
            target = examples_root / classes.wnids[label] / f"example{number}.JPEG"
            target.parent.mkdir(parents=True, exist_ok=True)
            Image.fromarray(blocks(palette(label), rng)).save(target, format="JPEG", quality=90)
    project = Project.create(directory, images_root, classes, example_root=str(examples_root), title="oodbench sample")
    import_candidates(project, [real, mturk])
    stored = project.store().images()
    pixels = np.stack([np.asarray(Image.open(project.image_file(img)).convert("RGB")) for img in stored])
    add_vlm_evidence(
        project, [img.key for img in stored], embed(pixels), class_embeddings(len(classes)), model=DEMO_MODEL
    )
    password = secrets.token_urlsafe(9)
    for name in ACCOUNTS:
        project.store().add_user(name, password, is_admin=name == "admin")
    return project, password
