"""Classification accuracy beside OOD detection: top-1 on original and re-annotated labels, zero-shot top-1.

Per model and labelled dataset (the ID test set) a run directory gets ``accuracy.json``::

    {"model": "...", "rows": [{"dataset": "...", "labels": "original" | "real" | <name>,
                               "top1": 0.0-1.0, "n": images used, "n_excluded": images left out}]}

* **original**: the dataset's own single labels; a prediction is correct when it equals the label.
* **re-annotated** (``real`` = ImageNet-ReaL, or any file in its format, e.g. ReImageNet when released): each
  image has a *set* of acceptable classes; a prediction is correct when it lies in the set. Images whose set is
  empty (no acceptable ImageNet class) are excluded, and so are images the file does not cover; ``n_excluded``
  counts both. The ReaL labels are read from timm's copy (``timm/data/_info/imagenet_real_labels.json``).
* **zero-shot** (VLMs): the prediction is the class whose template-averaged text embedding (the eight templates
  of the Fi-ImageNet-1k paper, Appendix G) is most similar to the ℓ2-normalised image embedding.

`rank_correlation` gives Spearman's ρ between models' Top-1 and their best FPR@95 (the Fi-ImageNet-1k paper
reports ρ = −0.61 over its classifiers, Appendix E).
"""

from __future__ import annotations

import functools
import json
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..core.errors import OodbenchError
from ..core.outputs import Outputs
from ..core.store import Store
from ..util.atomic import atomic_write_json
from ..util.chunking import iter_chunks, rows_per_chunk

__all__ = [
    "ACCURACY_FILE",
    "AccuracyRow",
    "IMAGENET_1K",
    "LabelSet",
    "MultiLabels",
    "describe_row",
    "head_label_set",
    "real_labels_path",
    "load_multilabels",
    "predictions",
    "zero_shot_predictions",
    "top1",
    "multilabel_top1",
    "entry_items",
    "accuracy_rows",
    "class_text_embeddings",
    "write_accuracy",
    "read_accuracy",
    "record_accuracy",
    "rank_correlation",
]

ACCURACY_FILE = "accuracy.json"
_VAL_ID = re.compile(r"ILSVRC2012_val_(\d{8})")


class AccuracyError(OodbenchError):
    """Labels, predictions or an accuracy file that cannot be used."""


@dataclass(frozen=True)
class AccuracyRow:
    """Top-1 of one model on one dataset under one labelling (NaN, with the `reason`, when it is not computed)."""

    dataset: str
    labels: str
    top1: float
    n: int
    n_excluded: int
    label_set: str = ""  # the classes the labels name, e.g. "ImageNet-1k"
    reason: str = ""  # why top1 is not computed (empty when it is)


@dataclass(frozen=True)
class LabelSet:
    """How a dataset's labels name the head's classes: a description and, when they differ, label -> head class."""

    name: str
    to_head: np.ndarray | None = None


IMAGENET_1K = "ImageNet-1k"


def head_label_set(dataset: Mapping[str, Any] | None, labels: np.ndarray, num_classes: int) -> LabelSet | str:
    """The label set of a labelled entry (its meta.json's ``dataset`` record) against a head of `num_classes`
    classes, or one line saying why its labels do not index the head (so no Top-1 is computed).

    ImageNet layouts and synset file lists name ImageNet-1k classes; class folders named by ImageNet synsets are
    mapped to them; other class folders index the head only when there are as many as the head has classes (their
    sorted order is then taken as the head's, as torchvision's ImageFolder numbers them); bare integer labels
    (a file list, a torch dataset) must lie in [0, C).
    """
    info = dict(dataset or {})
    names = info.get("class_names")
    known = labels[labels >= 0]
    if names:
        from ..extract.datasets import imagenet_synsets

        synsets = imagenet_synsets()
        if list(names) == list(synsets):
            if num_classes == len(synsets):
                return LabelSet(IMAGENET_1K)
            return f"its labels are {IMAGENET_1K} classes but the model's head has {num_classes} classes"
        index = {name: i for i, name in enumerate(synsets)}
        if num_classes == len(synsets) and all(name in index for name in names):
            return LabelSet(
                f"{IMAGENET_1K} (class folders named by synset)", np.asarray([index[n] for n in names], np.int64)
            )
        if len(names) == num_classes:
            return LabelSet(f"{len(names)} class folders in sorted order, taken as the head's classes")
        return (
            f"its labels number its {len(names)} class folders (0-{len(names) - 1}), not the {num_classes} classes "
            "of the model's head; Top-1 needs labels in the head's classes (an ImageNet layout, a file list of "
            "synset ids or class indices, or one folder per head class)"
        )
    if known.size and int(known.max()) >= num_classes:
        return f"its labels reach {int(known.max())} but the model's head has {num_classes} classes"
    return LabelSet(f"class indices 0-{num_classes - 1}")


@dataclass(frozen=True)
class MultiLabels:
    """Sets of acceptable classes per image, keyed by image name (an ImageNet val id or a file name)."""

    sets: Mapping[str, tuple[int, ...]]
    source: str

    def for_items(self, items: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """(N, K) label sets of `items` padded with -1, and a mask of the items the file covers."""
        keys = [_item_key(item) for item in items]
        found = np.array([key in self.sets for key in keys], dtype=bool)
        width = max((len(self.sets[k]) for k in keys if k in self.sets), default=0)
        padded = np.full((len(items), max(width, 1)), -1, dtype=np.int64)
        for row, key in enumerate(keys):
            labels = self.sets.get(key, ())
            padded[row, : len(labels)] = labels
        return padded, found


def _item_key(item: str) -> str:
    """ImageNet val images by their id (ILSVRC2012_val_XXXXXXXX); anything else by its file name."""
    found = _VAL_ID.search(item)
    return found.group(0) if found else os.path.basename(item)


def real_labels_path() -> Path:
    """timm's copy of the ImageNet-ReaL labels (a list of 50,000 label lists, val image 1 first)."""
    import importlib.util

    spec = importlib.util.find_spec("timm")
    if spec is None or not spec.submodule_search_locations:
        raise AccuracyError("the ReaL labels come with timm, which is not installed")
    path = Path(next(iter(spec.submodule_search_locations)), "data", "_info", "imagenet_real_labels.json")
    if not path.is_file():
        raise AccuracyError(f"timm has no ReaL label file at {path}; pass a label file explicitly")
    return path


def load_multilabels(path: str | os.PathLike[str] | None = None) -> MultiLabels:
    """Read a multi-label file: ReaL's format (a JSON list, entry i for ILSVRC2012_val_{i+1:08d}) or a JSON object
    mapping image names (val ids or file names) to label lists. Default: timm's ReaL labels."""
    path = Path(path) if path is not None else real_labels_path()
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise AccuracyError(f"cannot read multi-label file {path}: {exc}") from exc
    if isinstance(data, list):
        pairs = ((f"ILSVRC2012_val_{i + 1:08d}", labels) for i, labels in enumerate(data))
    elif isinstance(data, dict):
        pairs = ((_item_key(str(name)), labels) for name, labels in data.items())
    else:
        raise AccuracyError(f"{path}: expected a JSON list (ReaL format) or an object of label lists")
    sets: dict[str, tuple[int, ...]] = {}
    for name, labels in pairs:
        if not isinstance(labels, list) or not all(isinstance(v, int) and v >= 0 for v in labels):
            raise AccuracyError(f"{path}: labels of {name} must be a list of class indices; got {labels!r}")
        sets[name] = tuple(labels)
    return MultiLabels(sets, str(path))


def _argmax_rows(matrix_rows: int, width: int, block: Any) -> np.ndarray:
    """Row-wise argmax of a (possibly memory-mapped or computed) matrix, chunk by chunk."""
    out = np.empty(matrix_rows, dtype=np.int64)
    for rows in iter_chunks(matrix_rows, rows_per_chunk(width, bytes_per_value=4)):
        out[rows] = np.asarray(block(rows)).argmax(axis=1)
    return out


def predictions(logits: np.ndarray) -> np.ndarray:
    """Top-1 class per row of (N, C) logits."""
    logits = np.asarray(logits) if not isinstance(logits, np.ndarray) else logits
    if logits.ndim != 2 or logits.shape[1] == 0:
        raise AccuracyError(f"logits must be (N, C) with C > 0; got shape {logits.shape}")
    return _argmax_rows(logits.shape[0], logits.shape[1], lambda rows: logits[rows])


def zero_shot_predictions(image_embeddings: np.ndarray, text_embeddings: np.ndarray) -> np.ndarray:
    """Top-1 class per image: the most cosine-similar class text embedding (rows are ℓ2-normalised first)."""
    text = np.asarray(text_embeddings, dtype=np.float32)
    if image_embeddings.ndim != 2 or text.ndim != 2 or image_embeddings.shape[1] != text.shape[1]:
        raise AccuracyError(
            f"image embeddings {image_embeddings.shape} and text embeddings {text.shape} do not share a dimension"
        )
    text = text / np.linalg.norm(text, axis=1, keepdims=True)

    def similarities(rows: slice) -> np.ndarray:
        # Cosine: the norm of an image row is a positive factor of its whole row, so the argmax ignores it.
        return np.asarray(image_embeddings[rows], dtype=np.float32) @ text.T

    return _argmax_rows(image_embeddings.shape[0], text.shape[0], similarities)


def top1(predicted: np.ndarray, labels: np.ndarray) -> tuple[float, int]:
    """(accuracy, n) of single-label predictions; rows with a negative label (unknown) are not counted."""
    predicted, labels = np.asarray(predicted), np.asarray(labels)
    if predicted.shape != labels.shape:
        raise AccuracyError(f"{predicted.shape[0]} predictions for {labels.shape[0]} labels")
    known = labels >= 0
    n = int(known.sum())
    return (float((predicted[known] == labels[known]).mean()) if n else float("nan")), n


def multilabel_top1(predicted: np.ndarray, label_sets: np.ndarray, covered: np.ndarray | None = None) -> AccuracyRow:
    """Top-1 under the multi-label rule: correct when the prediction is in the image's set (-1 pads a set).

    Images with an empty set, or not `covered` by the label file, are excluded. The dataset/labels fields of the
    returned row are empty; `accuracy_rows` fills them.
    """
    predicted = np.asarray(predicted)
    if label_sets.ndim != 2 or label_sets.shape[0] != predicted.shape[0]:
        raise AccuracyError(f"{label_sets.shape[0]} label sets for {predicted.shape[0]} predictions")
    used = (label_sets >= 0).any(axis=1)
    if covered is not None:
        used &= covered
    hits = (label_sets == predicted[:, None]).any(axis=1) & used
    n = int(used.sum())
    accuracy = float(hits.sum() / n) if n else float("nan")
    return AccuracyRow("", "", accuracy, n, int(predicted.shape[0] - n))


def entry_items(store: Store, model_id: str, dataset_id: str) -> list[str]:
    """The image of every row of a store entry, in row order (items.txt indexed by the entry's `index` array)."""
    entry = store.entry_path(model_id, dataset_id)
    meta = store.meta(model_id, dataset_id)
    if (entry / "items.txt").is_file():
        items = (entry / "items.txt").read_text(encoding="utf-8").splitlines()
    elif "items" in meta:
        items = list(meta["items"])
    else:
        raise AccuracyError(f"{model_id}/{dataset_id} records no item list, so re-annotated labels cannot be matched")
    if "index" in meta.get("arrays", {}):
        return [items[i] for i in np.asarray(store.read_array(model_id, dataset_id, "index"))]
    return items[: int(meta.get("num_rows", len(items)))]


def accuracy_rows(
    store: Store,
    model_id: str,
    dataset_id: str,
    *,
    multilabels: Mapping[str, MultiLabels] | None = None,
    text_embeddings: np.ndarray | None = None,
    need_items: bool = True,
    outputs: Outputs | None = None,
) -> list[AccuracyRow]:
    """Top-1 rows of one entry: original labels, then each re-annotation; zero-shot when text embeddings are given.

    Classifiers predict from the stored logits; a VLM (pass `text_embeddings` of the ID classes, in label order)
    predicts from its stored image embeddings. Re-annotations need the entry's item list; without one they raise,
    or are skipped when `need_items` is False. `outputs`: the entry, when the caller has it read already.
    """
    if outputs is None:
        outputs = store.read(model_id, dataset_id)
    if text_embeddings is not None:
        predicted = zero_shot_predictions(outputs.features, text_embeddings)
    elif outputs.logits is not None:
        predicted = predictions(outputs.logits)
    else:
        raise AccuracyError(
            f"{model_id}/{dataset_id} has no logits; a VLM's zero-shot top-1 needs the ID classes' text embeddings"
        )
    rows: list[AccuracyRow] = []
    if outputs.labels is not None:
        labels = np.asarray(outputs.labels)
        if text_embeddings is not None:
            label_set: LabelSet | str = LabelSet(f"the {len(text_embeddings)} classes of the text embeddings")
        else:
            meta = store.meta(model_id, dataset_id) if store.exists(model_id, dataset_id) else {}
            label_set = head_label_set(meta.get("dataset"), labels, outputs.logits.shape[1])
        if isinstance(label_set, str):
            rows.append(AccuracyRow(dataset_id, "original", float("nan"), 0, len(predicted), reason=label_set))
        else:
            if label_set.to_head is not None:
                labels = np.where(labels >= 0, label_set.to_head[np.maximum(labels, 0)], labels)
            accuracy, n = top1(predicted, labels)
            rows.append(AccuracyRow(dataset_id, "original", accuracy, n, len(predicted) - n, label_set.name))
    if multilabels:
        try:
            items = entry_items(store, model_id, dataset_id)
        except AccuracyError:
            if need_items:
                raise
            return rows
        for name, labels in multilabels.items():
            sets, covered = labels.for_items(items)
            if not covered.any():
                continue  # the file does not describe this dataset (e.g. ReaL for a non-ImageNet set)
            row = multilabel_top1(predicted, sets, covered)
            # Re-annotations are sets of ImageNet-1k classes by construction (ReaL's format).
            rows.append(AccuracyRow(dataset_id, name, row.top1, row.n, row.n_excluded, f"{IMAGENET_1K} ({name})"))
    return rows


def describe_row(row: AccuracyRow) -> str:
    """One line for the terminal: the Top-1 and its label set, or why it is not computed."""
    what = f"Top-1 on {row.dataset} ({row.labels} labels"
    if row.reason:
        return f"{what}): not computed: {row.reason}"
    label_set = f", {row.label_set}" if row.label_set else ""
    value = "n/a" if row.top1 != row.top1 else f"{100 * row.top1:.1f}%"
    return f"{what}{label_set}): {value} of {row.n} images" + (
        f" ({row.n_excluded} excluded)" if row.n_excluded else ""
    )


def class_text_embeddings(store: Store, model_id: str, classes: str = "imagenet1k") -> np.ndarray:
    """The cached template-averaged text embeddings of the ID classes (eight templates) of a VLM, in label order.

    They are cached by a zero-shot run or by `oodbench extract --text-labels`; nothing is encoded here.
    """
    from ..extract.openclip import cached_text_embeddings
    from ..text.classes import load_classes
    from ..text.templates import SEED_TEMPLATES

    names = list(load_classes(classes).names)
    return cached_text_embeddings(store, model_id, names, SEED_TEMPLATES)


def write_accuracy(run_dir: str | os.PathLike[str], model: str, rows: Sequence[AccuracyRow]) -> Path:
    """Write ``accuracy.json`` into a run directory (replacing rows of the same dataset and labelling)."""
    path = Path(run_dir) / ACCURACY_FILE
    kept: dict[tuple[str, str], dict[str, Any]] = {}
    if path.is_file():
        previous = read_accuracy(run_dir)
        if previous["model"] == model:
            kept = {(r["dataset"], r["labels"]): r for r in previous["rows"]}
    for row in rows:
        record = asdict(row)
        record["top1"] = None if record["top1"] != record["top1"] else float(record["top1"])
        for optional in ("label_set", "reason"):
            if not record[optional]:
                del record[optional]
        kept[(row.dataset, row.labels)] = record
    Path(run_dir).mkdir(parents=True, exist_ok=True)
    atomic_write_json(path, {"model": model, "rows": list(kept.values())})
    return path


def read_accuracy(run_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """Read a run directory's ``accuracy.json`` (checked against the schema written by `write_accuracy`)."""
    path = Path(run_dir) / ACCURACY_FILE
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise AccuracyError(f"{run_dir} has no {ACCURACY_FILE}") from None
    except ValueError as exc:
        raise AccuracyError(f"{path} is not JSON: {exc}") from exc
    if not isinstance(data, dict) or not isinstance(data.get("model"), str) or not isinstance(data.get("rows"), list):
        raise AccuracyError(f"{path}: expected {{'model': str, 'rows': [...]}}")
    for row in data["rows"]:
        if not isinstance(row, dict) or not _ROW_KEYS <= set(row) <= _ROW_KEYS | _OPTIONAL_KEYS:
            raise AccuracyError(f"{path}: malformed row {row!r}")
    return data


_ROW_KEYS = frozenset({"dataset", "labels", "top1", "n", "n_excluded"})
_OPTIONAL_KEYS = frozenset({"label_set", "reason"})  # absent from files written before they existed


def record_accuracy(
    run_dir: str | os.PathLike[str] | None,
    store: Store,
    model_id: str,
    dataset_id: str,
    *,
    multilabels: Mapping[str, MultiLabels] | None = None,
    text_embeddings: np.ndarray | None = None,
    outputs: Outputs | None = None,
) -> list[AccuracyRow]:
    """Compute `accuracy_rows` and write them into `run_dir`.

    Without `multilabels`, ReaL is scored when timm ships it and the entry lists its images (skipped otherwise).
    """
    automatic = multilabels is None
    if multilabels is None:
        try:
            multilabels = {"real": _real_labels_cached()}
        except AccuracyError:
            multilabels = {}
    rows = accuracy_rows(
        store,
        model_id,
        dataset_id,
        multilabels=multilabels,
        text_embeddings=text_embeddings,
        need_items=not automatic,
        outputs=outputs,
    )
    if run_dir is not None and rows:
        write_accuracy(run_dir, model_id, rows)
    return rows


@functools.cache
def _real_labels_cached() -> MultiLabels:
    """timm's ReaL labels, read once per process (50,000 lists)."""
    return load_multilabels(real_labels_path())


def _ranks(values: np.ndarray) -> np.ndarray:
    """Ranks 1..n with ties given their average rank."""
    order = np.argsort(values, kind="stable")
    ranks = np.empty(len(values), dtype=np.float64)
    ranks[order] = np.arange(1, len(values) + 1)
    unique, inverse = np.unique(values, return_inverse=True)
    sums = np.bincount(inverse, weights=ranks, minlength=len(unique))
    counts = np.bincount(inverse, minlength=len(unique))
    return (sums / counts)[inverse]


def rank_correlation(top1_by_model: Mapping[str, float], fpr_by_model: Mapping[str, float]) -> tuple[float, int]:
    """Spearman's ρ (average ranks for ties) between Top-1 and best FPR@95 over the models both give; (ρ, n).

    NaN when fewer than three models are shared or either side is constant.
    """
    models = [m for m in top1_by_model if m in fpr_by_model]
    a = np.array([top1_by_model[m] for m in models], dtype=np.float64)
    b = np.array([fpr_by_model[m] for m in models], dtype=np.float64)
    keep = np.isfinite(a) & np.isfinite(b)
    a, b = a[keep], b[keep]
    if a.size < 3:
        return float("nan"), int(a.size)
    ra, rb = _ranks(a) - (a.size + 1) / 2, _ranks(b) - (b.size + 1) / 2
    denominator = float(np.sqrt((ra * ra).sum() * (rb * rb).sum()))
    return (float((ra * rb).sum() / denominator) if denominator > 0 else float("nan")), int(a.size)
