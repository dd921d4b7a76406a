"""Linear probes on frozen embeddings: multinomial logistic regression in torch, stored as the model's head.

`train_probe` fits a (C, D) head with cross-entropy (+ optional L2) on a seeded, class-stratified training
split and early-stops on the held-out split (patience on validation loss; the best epoch's weights are kept).
Features are standardised internally (better-conditioned optimisation); the standardisation is folded back into
W and b, so the returned head applies to the raw features. Full-batch L-BFGS for sets that fit in memory,
mini-batch AdamW (rows gathered chunk-wise from a memory map) for larger ones.

`run_probe` does this on a store entry and writes a new model id (default ``<backbone>+probe``) whose entries
hold the backbone's features with the probe's logits, for the fit set and any other dataset.
"""

from __future__ import annotations

import hashlib
import json
import math
import shutil
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from ..atomic import atomic_path
from ..chunking import iter_chunks, rows_per_chunk
from ..errors import ExtractError
from ..outputs import Head
from ..store import Store

__all__ = ["ProbeConfig", "ProbeResult", "fit_probe", "train_probe", "run_probe", "ProbeReport"]

# Above this many bytes of training features, "auto" switches from full-batch L-BFGS to mini-batches.
FULL_BATCH_BYTES = 2 * 2**30


@dataclass(frozen=True)
class ProbeConfig:
    """Hyper-parameters of a linear probe (all recorded in the probe's provenance)."""

    val_fraction: float = 0.1
    seed: int = 0
    weight_decay: float = 1e-4
    method: str = "auto"  # auto | lbfgs | minibatch
    max_epochs: int = 100
    patience: int = 5
    batch_size: int = 4096
    lr: float = 1e-3
    lbfgs_iterations: int = 20

    def __post_init__(self) -> None:
        if not 0.0 < self.val_fraction < 1.0:
            raise ExtractError(f"val_fraction must be in (0, 1); got {self.val_fraction}")
        if self.method not in ("auto", "lbfgs", "minibatch"):
            raise ExtractError(f"method must be auto, lbfgs or minibatch; got {self.method!r}")
        if self.weight_decay < 0 or not math.isfinite(self.weight_decay):
            raise ExtractError(f"weight_decay must be >= 0; got {self.weight_decay}")
        for name in ("max_epochs", "patience", "batch_size", "lbfgs_iterations"):
            if getattr(self, name) <= 0:
                raise ExtractError(f"{name} must be positive; got {getattr(self, name)}")
        if not self.lr > 0:
            raise ExtractError(f"lr must be positive; got {self.lr}")


@dataclass
class ProbeResult:
    """A trained probe: its head, the split sizes, the chosen epoch and the training history."""

    head: Head
    method: str
    train_rows: int
    val_rows: int
    best_epoch: int
    val_loss: float
    val_accuracy: float
    history: list[dict[str, float]] = field(default_factory=list)


def _stratified_split(labels: np.ndarray, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Seeded train/val row indices with ~`fraction` of every class (at least one per class of >= 2) held out."""
    rng = np.random.default_rng(seed)
    order = np.lexsort((rng.random(labels.shape[0]), labels))
    sorted_labels = labels[order]
    starts = np.searchsorted(sorted_labels, sorted_labels, side="left")
    rank = np.arange(labels.shape[0]) - starts
    classes, counts = np.unique(labels, return_counts=True)
    held = np.where(counts >= 2, np.maximum(1, np.round(counts * fraction)), 0).astype(np.int64)
    held = np.minimum(held, counts - 1)
    per_row = held[np.searchsorted(classes, sorted_labels)]
    val_mask = rank < per_row
    return np.sort(order[~val_mask]), np.sort(order[val_mask])


def _gather(features: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """features[rows] as float32, reading a memory map in sorted chunks."""
    out = np.empty((rows.shape[0], features.shape[1]), dtype=np.float32)
    step = rows_per_chunk(features.shape[1], bytes_per_value=4)
    for part in iter_chunks(rows.shape[0], step):
        out[part] = features[rows[part]]
    return out


def _moments(features: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mean and standard deviation (float64) over the given rows, streamed."""
    total = np.zeros(features.shape[1])
    total_sq = np.zeros(features.shape[1])
    step = rows_per_chunk(features.shape[1])
    for part in iter_chunks(rows.shape[0], step):
        block = np.asarray(features[rows[part]], dtype=np.float64)
        total += block.sum(axis=0)
        total_sq += np.square(block).sum(axis=0)
    mean = total / rows.shape[0]
    std = np.sqrt(np.maximum(total_sq / rows.shape[0] - np.square(mean), 0.0))
    return mean, np.where(std > 1e-6 * max(1.0, float(np.abs(mean).max(initial=0.0))), std, 1.0)


def fit_probe(
    features: np.ndarray,
    labels: np.ndarray,
    *,
    num_classes: int | None = None,
    config: ProbeConfig | None = None,
    device: str = "cpu",
    **overrides: Any,
) -> ProbeResult:
    """Train a multinomial logistic-regression head on (features, labels) with a held-out split and early stopping."""
    config = config or ProbeConfig()
    if overrides:
        config = ProbeConfig(**{**asdict(config), **overrides})
    labels = np.asarray(labels)
    if features.ndim != 2 or labels.shape != (features.shape[0],):
        raise ExtractError(f"need features (N, D) and labels (N,); got {features.shape} and {labels.shape}")
    if not np.issubdtype(labels.dtype, np.integer) or labels.size == 0 or labels.min() < 0:
        raise ExtractError("labels must be non-negative integers (class indices)")
    num_classes = int(num_classes if num_classes is not None else labels.max() + 1)
    if labels.max() >= num_classes:
        raise ExtractError(f"label {labels.max()} is out of range for {num_classes} classes")
    train_rows, val_rows = _stratified_split(labels.astype(np.int64), config.val_fraction, config.seed)
    if val_rows.size == 0:
        raise ExtractError("no class has two or more examples: cannot hold out a validation split")
    mean, std = _moments(features, train_rows)
    method = config.method
    if method == "auto":
        method = "lbfgs" if train_rows.size * features.shape[1] * 4 <= FULL_BATCH_BYTES else "minibatch"
    dev = torch.device(device)
    torch.manual_seed(config.seed)
    mean_t = torch.as_tensor(mean, dtype=torch.float32, device=dev)
    std_t = torch.as_tensor(std, dtype=torch.float32, device=dev)
    weight = torch.zeros(num_classes, features.shape[1], device=dev, requires_grad=True)
    bias = torch.zeros(num_classes, device=dev, requires_grad=True)
    y_val = torch.as_tensor(labels[val_rows], dtype=torch.long, device=dev)
    x_val = (torch.as_tensor(_gather(features, val_rows), device=dev) - mean_t) / std_t

    def penalty() -> torch.Tensor:
        return 0.5 * config.weight_decay * weight.square().sum()

    def evaluate() -> tuple[float, float]:
        with torch.no_grad():
            logits = x_val @ weight.T + bias
            return float(F.cross_entropy(logits, y_val)), float((logits.argmax(1) == y_val).float().mean())

    history: list[dict[str, float]] = []
    best = (math.inf, 0.0, 0, weight.detach().clone(), bias.detach().clone())
    stale = 0
    if method == "lbfgs":
        x_train = (torch.as_tensor(_gather(features, train_rows), device=dev) - mean_t) / std_t
        y_train = torch.as_tensor(labels[train_rows], dtype=torch.long, device=dev)
        optimizer = torch.optim.LBFGS(
            [weight, bias],
            lr=1.0,
            max_iter=config.lbfgs_iterations,
            history_size=20,
            line_search_fn="strong_wolfe",
            tolerance_grad=1e-9,
            tolerance_change=1e-12,
        )

        def closure() -> torch.Tensor:
            optimizer.zero_grad()
            loss = F.cross_entropy(x_train @ weight.T + bias, y_train) + penalty()
            loss.backward()
            return loss

        previous = math.inf
        for epoch in range(1, config.max_epochs + 1):
            train_loss = float(optimizer.step(closure).detach())
            val_loss, val_acc = evaluate()
            history.append({"epoch": epoch, "train_loss": train_loss, "val_loss": val_loss, "val_accuracy": val_acc})
            if val_loss < best[0] - 1e-7:
                best, stale = (val_loss, val_acc, epoch, weight.detach().clone(), bias.detach().clone()), 0
            else:
                stale += 1
            if stale >= config.patience or abs(previous - train_loss) < 1e-10:
                break
            previous = train_loss
    else:
        optimizer = torch.optim.AdamW([weight, bias], lr=config.lr, weight_decay=0.0)
        rng = np.random.default_rng(config.seed)
        for epoch in range(1, config.max_epochs + 1):
            order = train_rows[rng.permutation(train_rows.size)]
            total, seen = 0.0, 0
            for part in iter_chunks(order.size, config.batch_size):
                rows = np.sort(order[part])
                x = (torch.as_tensor(_gather(features, rows), device=dev) - mean_t) / std_t
                y = torch.as_tensor(labels[rows], dtype=torch.long, device=dev)
                optimizer.zero_grad()
                loss = F.cross_entropy(x @ weight.T + bias, y) + penalty()
                loss.backward()
                optimizer.step()
                total += float(loss.detach()) * rows.size
                seen += rows.size
            val_loss, val_acc = evaluate()
            history.append({"epoch": epoch, "train_loss": total / seen, "val_loss": val_loss, "val_accuracy": val_acc})
            if val_loss < best[0] - 1e-7:
                best, stale = (val_loss, val_acc, epoch, weight.detach().clone(), bias.detach().clone()), 0
            else:
                stale += 1
            if stale >= config.patience:
                break
    val_loss, val_acc, best_epoch, best_w, best_b = best
    # Fold the standardisation into the head: (x - μ)/σ · Wᵀ + b = x · (W/σ)ᵀ + (b - (W/σ)·μ).
    w_raw = best_w.double().cpu().numpy() / std[None, :]
    b_raw = best_b.double().cpu().numpy() - w_raw @ mean
    head = Head(w_raw.astype(np.float32), b_raw.astype(np.float32))
    return ProbeResult(head, method, int(train_rows.size), int(val_rows.size), best_epoch, val_loss, val_acc, history)


def train_probe(features: np.ndarray, labels: np.ndarray, **kwargs: Any) -> Head:
    """A linear head trained on (features, labels); keyword arguments as in `fit_probe` / `ProbeConfig`."""
    return fit_probe(features, labels, **kwargs).head


@dataclass
class ProbeReport:
    """What `run_probe` did."""

    probe_id: str
    trained: bool
    result: ProbeResult | None
    datasets: list[str]


def _head_digest(head: Head) -> str:
    digest = hashlib.sha256()
    digest.update(np.ascontiguousarray(head.weight, dtype=np.float32).tobytes())
    digest.update(np.ascontiguousarray(head.bias, dtype=np.float32).tobytes())
    return digest.hexdigest()


def run_probe(
    store: Store,
    model_id: str,
    fit_dataset: str,
    *,
    apply_to: Sequence[str] = (),
    probe_id: str | None = None,
    config: ProbeConfig | None = None,
    device: str = "cpu",
    shard_size: int = 65536,
) -> ProbeReport:
    """Train (or reuse) a probe on a store entry's embeddings, store it as a head, and write logits for datasets."""
    config = config or ProbeConfig()
    probe_id = probe_id or f"{model_id}+probe"
    fit_meta = store.meta(model_id, fit_dataset)
    backbone = fit_meta.get("provenance", {})
    fit = store.read(model_id, fit_dataset)
    if fit.labels is None:
        raise ExtractError(f"{model_id}/{fit_dataset} has no labels; a probe needs a labelled fit set")
    params = {
        **asdict(config),
        "fit_dataset": fit_dataset,
        "fit_item_hash": fit_meta.get("item_hash"),
        "backbone_model_id": model_id,
    }
    trained, result = False, None
    if store.has_head(probe_id):
        stored = store.head_meta(probe_id).get("provenance", {})
        if stored.get("probe") != params or stored.get("backbone") != backbone:
            raise ExtractError(
                f"{probe_id!r} already holds a probe trained differently (other data or parameters); "
                "pass --probe-id for a new one, or delete the old one"
            )
        head = store.read_head(probe_id)
    else:
        result = fit_probe(fit.features, fit.labels, config=config, device=device)
        head, trained = result.head, True
    provenance = {
        "model": f"{backbone.get('model')}+probe",
        "checkpoint": f"{backbone.get('checkpoint')}+probe:{_head_digest(head)[:16]}",
        "preprocessing": backbone.get("preprocessing"),
        "kind": "probe",
        "backbone": backbone,
        "probe": params,
    }
    if trained:
        store.write_head(probe_id, head, provenance=provenance)
    written: list[str] = []
    for dataset_id in dict.fromkeys([fit_dataset, *apply_to]):
        store.check_compatible((model_id, fit_dataset), (model_id, dataset_id))
        _write_probe_entry(store, model_id, dataset_id, probe_id, head, provenance, shard_size)
        written.append(dataset_id)
    return ProbeReport(probe_id, trained, result, written)


def _write_probe_entry(
    store: Store, model_id: str, dataset_id: str, probe_id: str, head: Head, provenance: dict[str, Any], shard_size: int
) -> None:
    """Copy a backbone entry's features (and labels, index) under the probe id, with the probe's logits."""
    if store.exists(probe_id, dataset_id):
        if store.meta(probe_id, dataset_id).get("provenance") != json.loads(json.dumps(provenance, default=str)):
            raise ExtractError(f"{probe_id}/{dataset_id} exists with another provenance; delete it or pass --probe-id")
        return
    source_meta = store.meta(model_id, dataset_id)
    source = store.read(model_id, dataset_id, check_finite=False)
    index = store.read_array(model_id, dataset_id, "index") if "index" in source_meta.get("arrays", {}) else None
    writer = store.writer(
        probe_id,
        dataset_id,
        provenance=provenance,
        num_items=len(source),
        shard_size=shard_size,
        item_hash=source_meta.get("item_hash"),
    )
    if writer.complete:
        return
    for shard in writer.pending_shards():
        rows = writer.shard_rows(shard)
        features = np.asarray(source.features[rows], dtype=np.float32)
        arrays = {
            "features": features,
            "logits": head.logits(features).astype(np.float32),
            "index": np.asarray(index[rows]) if index is not None else np.arange(rows.start, rows.stop),
        }
        if source.labels is not None:
            arrays["labels"] = np.asarray(source.labels[rows])
        skipped = source_meta.get("skipped", []) if shard == 0 else []
        writer.write_shard(shard, arrays, skipped=skipped)
    source_dir = store.entry_path(model_id, dataset_id)
    target_dir = store.entry_path(probe_id, dataset_id)
    extra = {"source_entry": f"{model_id}/{dataset_id}"}
    for key in ("dataset", "items", "items_file"):
        if key in source_meta:
            extra[key] = source_meta[key]
    if (source_dir / "items.txt").is_file() and not (target_dir / "items.txt").is_file():
        with atomic_path(target_dir / "items.txt") as tmp:
            shutil.copyfile(source_dir / "items.txt", tmp)
    writer.finalize(extra_meta=extra)
