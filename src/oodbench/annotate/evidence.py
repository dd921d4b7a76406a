"""Evidence shown beside each image: (C) original label, (D) VLM-nearest ID classes with example
images, (E) classes most confused with the original label, (A) an LLM description, (B) reverse
image search links. Every source is optional; a missing one is stored as `{"absent": why}`.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote

import numpy as np

from ..core.errors import AnnotateError
from ..text.classes import ClassList

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".webp", ".bmp", ".gif", ".tif", ".tiff")
SOURCES = ("original", "vlm", "confusions", "llm", "reverse_search")
SOURCE_TITLES = {
    "original": "C · original label",
    "vlm": "D · nearest ID classes (VLM)",
    "confusions": "E · classes confused with the original label",
    "llm": "A · multimodal LLM description",
    "reverse_search": "B · reverse image search",
}


def absent(reason: str) -> dict[str, str]:
    """The marker of an evidence source that is not available, with the reason shown to annotators."""
    return {"absent": reason}


def open_matrix(source: np.ndarray | str | Path, what: str) -> np.ndarray:
    """A 2-D array from an array or an `.npy` path (memory-mapped), shape checked."""
    if isinstance(source, (str, Path)):
        path = Path(source)
        if not path.is_file():
            raise AnnotateError(f"{what}: file not found: {path}")
        source = np.load(path, mmap_mode="r", allow_pickle=False)
    array = np.asarray(source)
    if array.ndim != 2 or array.shape[0] == 0 or array.shape[1] == 0:
        raise AnnotateError(f"{what}: expected a non-empty 2-D array (rows × dims), got shape {array.shape}")
    if not (np.issubdtype(array.dtype, np.floating) or np.issubdtype(array.dtype, np.integer)):
        raise AnnotateError(f"{what}: expected numbers, got dtype {array.dtype}")
    return array


def _unit_rows(block: np.ndarray, what: str) -> np.ndarray:
    """float32 copy of a block with ℓ2-normalised rows; NaN, inf and zero rows are errors."""
    block = np.asarray(block, dtype=np.float32)
    if not np.isfinite(block).all():
        raise AnnotateError(f"{what}: contains NaN or infinite values")
    norms = np.linalg.norm(block, axis=1, keepdims=True)
    if (norms == 0).any():
        raise AnnotateError(f"{what}: contains all-zero rows, which have no direction")
    # Cached open_clip embeddings are normalised already; re-normalising makes cosine exact either way.
    return block / norms


def vlm_topk(
    image_embeddings: np.ndarray | str | Path,
    text_embeddings: np.ndarray | str | Path,
    k: int = 5,
    chunk: int = 4096,
) -> tuple[np.ndarray, np.ndarray]:
    """Indices (N, k) and cosine similarities (N, k) of the k closest class-name embeddings per image."""
    images = open_matrix(image_embeddings, "image embeddings")
    texts = _unit_rows(open_matrix(text_embeddings, "class-name embeddings"), "class-name embeddings")
    if images.shape[1] != texts.shape[1]:
        raise AnnotateError(f"image embeddings have {images.shape[1]} dims but class-name embeddings {texts.shape[1]}")
    if not 1 <= k <= texts.shape[0]:
        raise AnnotateError(f"k must be between 1 and the number of classes ({texts.shape[0]}), got {k}")
    n = images.shape[0]
    top = np.empty((n, k), dtype=np.int64)
    sims = np.empty((n, k), dtype=np.float32)
    for start in range(0, n, chunk):
        block = _unit_rows(images[start : start + chunk], "image embeddings") @ texts.T
        part = np.argpartition(-block, k - 1, axis=1)[:, :k]
        part_sims = np.take_along_axis(block, part, axis=1)
        # Order the k by similarity (equal similarities by class index) so output is reproducible.
        order = np.lexsort((part, -part_sims), axis=1)
        top[start : start + chunk] = np.take_along_axis(part, order, axis=1)
        sims[start : start + chunk] = np.take_along_axis(part_sims, order, axis=1)
    return top, sims


def vlm_evidence(
    indices: np.ndarray, similarities: np.ndarray, classes: ClassList, model: str | None = None
) -> list[dict[str, Any]]:
    """Evidence (D) per image from `vlm_topk` output."""
    return [
        {
            "model": model,
            "classes": [
                {"class": int(c), "name": classes.name(int(c)), "score": round(float(s), 4)}
                for c, s in zip(row_idx, row_sim, strict=True)
            ],
        }
        for row_idx, row_sim in zip(indices, similarities, strict=True)
    ]


def top_confusions(pairs: np.ndarray, labels: Iterable[int], k: int = 5) -> dict[int, list[tuple[int, int]]]:
    """For each wanted original label, its k most frequent re-assigned classes with their counts."""
    pairs = np.asarray(pairs, dtype=np.int64).reshape(-1, 2)
    wanted = np.unique(np.fromiter(labels, dtype=np.int64))
    result: dict[int, list[tuple[int, int]]] = {int(label): [] for label in wanted}
    if pairs.size == 0 or wanted.size == 0:
        return result
    pairs = pairs[np.isin(pairs[:, 0], wanted)]
    if pairs.size == 0:
        return result
    unique, counts = np.unique(pairs, axis=0, return_counts=True)
    # Most frequent first; ties by class index. Rows of one original label end up contiguous.
    order = np.lexsort((unique[:, 1], -counts, unique[:, 0]))
    unique, counts = unique[order], counts[order]
    starts = np.flatnonzero(np.r_[True, unique[1:, 0] != unique[:-1, 0]])
    ends = np.r_[starts[1:], len(unique)]
    for start, end in zip(starts, ends, strict=True):
        stop = min(end, start + k)
        result[int(unique[start, 0])] = [
            (int(c), int(n)) for c, n in zip(unique[start:stop, 1], counts[start:stop], strict=True)
        ]
    return result


def confusion_evidence(
    original: int | None, confusions: Mapping[int, list[tuple[int, int]]], classes: ClassList, source: str
) -> dict[str, Any]:
    """Evidence (E) for one image."""
    if original is None:
        return absent("the image has no original label, so there is nothing to be confused with")
    found = confusions.get(original)
    if found is None:
        return absent("no re-annotation with original labels was imported")
    if not found:
        return absent(f"the re-annotation ({source}) never re-assigned this class")
    return {
        "of": original,
        "source": source,
        "classes": [{"class": c, "name": classes.name(c), "count": n} for c, n in found],
    }


def original_evidence(original: int | None, classes: ClassList) -> dict[str, Any]:
    """Evidence (C) for one image."""
    if original is None:
        return absent("the candidate source gave no original label for this image")
    return {"class": original, "name": classes.name(original)}


REVERSE_SEARCH = (
    ("Google Lens", "https://lens.google.com/uploadbyurl?url={}"),
    ("Bing", "https://www.bing.com/images/search?view=detailv2&iss=sbi&q=imgurl:{}"),
    ("TinEye", "https://tineye.com/search?url={}"),
    ("Yandex", "https://yandex.com/images/search?rpt=imageview&url={}"),
)


def reverse_search_evidence(url: str | None) -> dict[str, Any]:
    """Evidence (B): search-by-image links for a publicly reachable image URL."""
    if not url:
        return absent("no public URL is known for this image (set a public URL template in project.json)")
    if not url.startswith(("http://", "https://")):
        raise AnnotateError(f"a public image URL must be http(s), got {url!r}")
    encoded = quote(url, safe="")
    return {"url": url, "links": [{"name": name, "href": tpl.format(encoded)} for name, tpl in REVERSE_SEARCH]}


def example_images(
    root: str | Path, classes: ClassList, per_class: int = 3, wanted: Iterable[int] | None = None
) -> dict[int, list[str]]:
    """Up to `per_class` example files per class from an ImageFolder-style ID root.

    Class folders are the class list's folder ids when it has them (e.g. WordNet ids), otherwise the
    sorted sub-folder names in class-index order. Paths are relative to `root`.
    """
    root = Path(root)
    if not root.is_dir():
        raise AnnotateError(f"ID example root is not a folder: {root}")
    folders: Sequence[str]
    if classes.wnids is not None:
        folders = [str(w) for w in classes.wnids]
    else:
        folders = sorted(entry.name for entry in os.scandir(root) if entry.is_dir())
        if len(folders) != len(classes):
            raise AnnotateError(
                f"{root} has {len(folders)} class folders but the class list has {len(classes)} classes"
            )
    indices = range(len(classes)) if wanted is None else sorted(set(wanted))
    examples: dict[int, list[str]] = {}
    for index in indices:
        folder = root / folders[index]
        if not folder.is_dir():
            continue
        # Only the first few names in sorted order are needed; scandir avoids stat-ing every file.
        names = sorted(e.name for e in os.scandir(folder) if e.name.lower().endswith(IMAGE_SUFFIXES))
        if names:
            examples[index] = [f"{folders[index]}/{name}" for name in names[:per_class]]
    return examples
