"""Linear probes on frozen embeddings: multinomial logistic regression in torch, stored as the model's head.

`train_probe` fits a (C, D) head with cross-entropy + L2 on a seeded, class-stratified training split and
early-stops on the held-out split (patience on validation loss; the best epoch's weights are kept). The weight
decay is chosen on the held-out rows from a small grid (strongest first, each run warm-started from the previous).
Features are standardised internally (better-conditioned optimisation); the standardisation is folded back into
W and b, so the returned head applies to the raw features. Full-batch L-BFGS: in memory for sets up to 2 GiB,
streamed chunk by chunk from the memory map for larger ones (the same optimiser and solution; each pass reads the
rows once). Mini-batch AdamW with a cosine learning-rate decay remains as an option. A run that the epoch cap stops
while its held-out loss still improves raises a `ProbeCapWarning`.

`run_probe` does this on a store entry and writes a new model id (default ``<backbone>+probe``) whose entries
hold the backbone's features with the probe's logits, for the fit set and any other dataset.
"""

from __future__ import annotations

import hashlib
import json
import math
import shutil
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from ..core.errors import ExtractError
from ..core.outputs import Head
from ..core.store import Store
from ..util.atomic import atomic_path
from ..util.chunking import iter_chunks, rows_per_chunk

__all__ = ["ProbeConfig", "ProbeResult", "ProbeCapWarning", "fit_probe", "train_probe", "run_probe", "ProbeReport"]

# Above this many bytes of training features, "auto" streams the L-BFGS passes from the memory map in chunks
# instead of holding the training rows in memory (same optimiser, same solution).
FULL_BATCH_BYTES = 2 * 2**30
# Weight decays tried when none is given; the one with the lowest held-out loss is kept. With the mean
# cross-entropy, weight decay λ corresponds to scikit-learn's C = 1 / (λ · n_train).
DEFAULT_WEIGHT_DECAYS = (1e-1, 1e-2, 1e-3, 1e-4, 1e-5, 1e-6)
METHODS = ("auto", "lbfgs", "streamed", "minibatch")


class ProbeCapWarning(UserWarning):
    """The epoch cap stopped a probe whose held-out loss was still improving."""


@dataclass(frozen=True)
class ProbeConfig:
    """Hyper-parameters of a linear probe (all recorded in the probe's provenance).

    ``weight_decay=None`` chooses it from ``weight_decays`` on the held-out rows (lowest held-out loss).
    ``method``: ``lbfgs`` (full batch in memory), ``streamed`` (full-batch L-BFGS whose every pass reads the
    training rows chunk by chunk), ``minibatch`` (AdamW, cosine-decayed learning rate), ``auto`` (``lbfgs`` up to
    2 GiB of training features, else ``streamed``).
    """

    val_fraction: float = 0.1
    seed: int = 0
    weight_decay: float | None = None
    weight_decays: tuple[float, ...] = DEFAULT_WEIGHT_DECAYS
    method: str = "auto"
    max_epochs: int = 100
    patience: int = 5
    batch_size: int = 4096
    lr: float = 1e-2
    lbfgs_iterations: int = 20
    chunk_rows: int | None = None

    def __post_init__(self) -> None:
        if not 0.0 < self.val_fraction < 1.0:
            raise ExtractError(f"val_fraction must be in (0, 1); got {self.val_fraction}")
        if self.method not in METHODS:
            raise ExtractError(f"method must be one of {', '.join(METHODS)}; got {self.method!r}")
        object.__setattr__(self, "weight_decays", tuple(float(v) for v in self.weight_decays))
        decays = self.weight_decays if self.weight_decay is None else (self.weight_decay,)
        if not decays:
            raise ExtractError("weight_decays is empty: give at least one weight decay to try")
        for value in decays:
            if value < 0 or not math.isfinite(value):
                raise ExtractError(f"weight decay must be finite and >= 0; got {value}")
        for name in ("max_epochs", "patience", "batch_size", "lbfgs_iterations"):
            if getattr(self, name) <= 0:
                raise ExtractError(f"{name} must be positive; got {getattr(self, name)}")
        if self.chunk_rows is not None and self.chunk_rows <= 0:
            raise ExtractError(f"chunk_rows must be positive; got {self.chunk_rows}")
        if not self.lr > 0:
            raise ExtractError(f"lr must be positive; got {self.lr}")

    @property
    def grid(self) -> tuple[float, ...]:
        """The weight decays to try, strongest first (each run starts from the previous one's weights)."""
        return (
            (self.weight_decay,) if self.weight_decay is not None else tuple(sorted(self.weight_decays, reverse=True))
        )


@dataclass
class ProbeResult:
    """A trained probe: its head, the split sizes, the chosen epoch and weight decay, and the training history.

    ``search`` holds one row per weight decay tried (held-out loss and accuracy at its best epoch);
    ``stopped_at_cap`` is True when the epoch cap stopped the chosen run while its held-out loss still improved.
    """

    head: Head
    method: str
    train_rows: int
    val_rows: int
    best_epoch: int
    val_loss: float
    val_accuracy: float
    history: list[dict[str, float]] = field(default_factory=list)
    weight_decay: float = 0.0
    search: list[dict[str, float]] = field(default_factory=list)
    stopped_at_cap: bool = False


@dataclass
class _Run:
    """One weight decay's training run: the best epoch's weights and held-out numbers."""

    weight_decay: float
    val_loss: float
    val_accuracy: float
    best_epoch: int
    weight: torch.Tensor
    bias: torch.Tensor
    history: list[dict[str, float]]
    stopped_at_cap: bool


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


class _Rows:
    """Standardised training rows as torch chunks: held in memory (one chunk) or read from the source per pass."""

    def __init__(
        self,
        features: np.ndarray,
        labels: np.ndarray,
        rows: np.ndarray,
        mean: torch.Tensor,
        std: torch.Tensor,
        device: torch.device,
        *,
        in_memory: bool,
        chunk_rows: int,
    ) -> None:
        self.features, self.labels, self.rows = features, labels, rows
        self.mean, self.std, self.device, self.chunk_rows = mean, std, device, chunk_rows
        self.cached = [self._load(rows)] if in_memory else None

    def _load(self, rows: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        x = (torch.as_tensor(_gather(self.features, rows), device=self.device) - self.mean) / self.std
        return x, torch.as_tensor(self.labels[rows], dtype=torch.long, device=self.device)

    def chunks(
        self, order: np.ndarray | None = None, size: int | None = None
    ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Every training row once, in chunks (in `order`, in chunks of `size`, when given)."""
        if self.cached is not None and order is None:
            yield from self.cached
            return
        rows = self.rows if order is None else order
        for part in iter_chunks(rows.shape[0], size or self.chunk_rows):
            yield self._load(np.sort(rows[part]))


def fit_probe(
    features: np.ndarray,
    labels: np.ndarray,
    *,
    num_classes: int | None = None,
    config: ProbeConfig | None = None,
    device: str = "cpu",
    **overrides: Any,
) -> ProbeResult:
    """Train a multinomial logistic-regression head on (features, labels): held-out split, early stopping, and the
    weight decay chosen on the held-out rows (see `ProbeConfig`)."""
    config = config or ProbeConfig()
    if overrides:
        config = ProbeConfig(**{**asdict(config), **overrides})
    labels = np.asarray(labels)
    if features.ndim != 2 or labels.shape != (features.shape[0],):
        raise ExtractError(f"need features (N, D) and labels (N,); got {features.shape} and {labels.shape}")
    if not np.issubdtype(labels.dtype, np.integer) or labels.size == 0 or labels.min() < 0:
        raise ExtractError("labels must be non-negative integers (class indices)")
    present = np.unique(labels)
    if present.size < 2:
        raise ExtractError(f"the fit set holds a single class ({int(present[0])}); a probe needs at least two")
    num_classes = int(num_classes if num_classes is not None else labels.max() + 1)
    if labels.max() >= num_classes:
        raise ExtractError(f"label {labels.max()} is out of range for {num_classes} classes")
    train_rows, val_rows = _stratified_split(labels.astype(np.int64), config.val_fraction, config.seed)
    if val_rows.size == 0:
        raise ExtractError("no class has two or more examples: cannot hold out a validation split")
    mean, std = _moments(features, train_rows)
    method = config.method
    if method == "auto":
        method = "lbfgs" if train_rows.size * features.shape[1] * 4 <= FULL_BATCH_BYTES else "streamed"
    from .backbones.base import resolve_device

    dev = resolve_device(device)  # a device that does not exist is one line, not a CUDA traceback
    torch.manual_seed(config.seed)
    mean_t = torch.as_tensor(mean, dtype=torch.float32, device=dev)
    std_t = torch.as_tensor(std, dtype=torch.float32, device=dev)
    chunk_rows = config.chunk_rows or rows_per_chunk(features.shape[1], bytes_per_value=4)
    data = _Rows(features, labels, train_rows, mean_t, std_t, dev, in_memory=method == "lbfgs", chunk_rows=chunk_rows)
    x_val, y_val = data._load(val_rows)
    weight = torch.zeros(num_classes, features.shape[1], device=dev)
    bias = torch.zeros(num_classes, device=dev)
    runs: list[_Run] = []
    for decay in config.grid:
        train = _train_minibatch if method == "minibatch" else _train_lbfgs
        run = train(data, x_val, y_val, weight, bias, decay, config)
        runs.append(run)
        weight, bias = run.weight, run.bias  # warm start: the next, weaker decay starts from this solution
    best = min(runs, key=lambda r: (r.val_loss, -r.weight_decay))
    if best.stopped_at_cap:
        warnings.warn(
            f"the linear probe (weight decay {best.weight_decay:g}) reached max_epochs={config.max_epochs} while its "
            "held-out loss was still improving; raise max_epochs",
            ProbeCapWarning,
            stacklevel=2,
        )
    # Fold the standardisation into the head: (x - μ)/σ · Wᵀ + b = x · (W/σ)ᵀ + (b - (W/σ)·μ).
    w_raw = best.weight.double().cpu().numpy() / std[None, :]
    b_raw = best.bias.double().cpu().numpy() - w_raw @ mean
    head = Head(w_raw.astype(np.float32), b_raw.astype(np.float32))
    search = [
        {
            "weight_decay": r.weight_decay,
            "val_loss": r.val_loss,
            "val_accuracy": r.val_accuracy,
            "best_epoch": r.best_epoch,
        }
        for r in runs
    ]
    return ProbeResult(
        head,
        method,
        int(train_rows.size),
        int(val_rows.size),
        best.best_epoch,
        best.val_loss,
        best.val_accuracy,
        best.history,
        best.weight_decay,
        search,
        best.stopped_at_cap,
    )


# A run counts as still improving at the cap when its last epoch lowered the held-out loss by more than this share.
_IMPROVING = 1e-4


def _early_stopping(
    epochs: Iterator[tuple[float, torch.Tensor, torch.Tensor, bool]],
    x_val: torch.Tensor,
    y_val: torch.Tensor,
    decay: float,
    config: ProbeConfig,
) -> _Run:
    """Follow a run epoch by epoch: keep the best held-out epoch, stop after `patience` epochs without improvement
    or when the optimiser reports convergence, and flag a run that the epoch cap stopped while improving."""
    history: list[dict[str, float]] = []
    best: tuple[float, float, int, torch.Tensor, torch.Tensor] | None = None
    stale, previous_val, capped = 0, math.inf, False
    for epoch, (train_loss, weight, bias, converged) in enumerate(epochs, start=1):
        with torch.no_grad():
            logits = x_val @ weight.T + bias
            val_loss = float(F.cross_entropy(logits, y_val))
            val_acc = float((logits.argmax(1) == y_val).float().mean())
        history.append({"epoch": epoch, "train_loss": train_loss, "val_loss": val_loss, "val_accuracy": val_acc})
        if best is None or val_loss < best[0] - 1e-7:
            best, stale = (val_loss, val_acc, epoch, weight.detach().clone(), bias.detach().clone()), 0
        else:
            stale += 1
        improving = previous_val - val_loss > _IMPROVING * max(abs(val_loss), 1e-12)
        previous_val = val_loss
        if stale >= config.patience or converged:
            break
        if epoch == config.max_epochs:
            capped = improving
            break
    assert best is not None
    return _Run(decay, best[0], best[1], best[2], best[3], best[4], history, capped)


def _train_lbfgs(
    data: _Rows,
    x_val: torch.Tensor,
    y_val: torch.Tensor,
    weight0: torch.Tensor,
    bias0: torch.Tensor,
    decay: float,
    config: ProbeConfig,
) -> _Run:
    """Full-batch L-BFGS (strong Wolfe line search); each loss evaluation is one pass over the training chunks,
    so the rows need not fit in memory. An epoch is `lbfgs_iterations` L-BFGS iterations."""
    weight = weight0.detach().clone().requires_grad_(True)
    bias = bias0.detach().clone().requires_grad_(True)
    n = float(data.rows.shape[0])
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
        total = 0.0
        for x, y in data.chunks():
            loss = F.cross_entropy(x @ weight.T + bias, y, reduction="sum") / n  # gradients add up over chunks
            loss.backward()
            total += float(loss.detach())
        penalty = 0.5 * decay * weight.square().sum()
        penalty.backward()
        return torch.tensor(total + float(penalty.detach()))

    def epochs() -> Iterator[tuple[float, torch.Tensor, torch.Tensor, bool]]:
        previous = math.inf
        for _ in range(config.max_epochs):
            train_loss = float(optimizer.step(closure))
            yield train_loss, weight.detach(), bias.detach(), abs(previous - train_loss) <= 1e-10 * max(1.0, train_loss)
            previous = train_loss

    return _early_stopping(epochs(), x_val, y_val, decay, config)


def _train_minibatch(
    data: _Rows,
    x_val: torch.Tensor,
    y_val: torch.Tensor,
    weight0: torch.Tensor,
    bias0: torch.Tensor,
    decay: float,
    config: ProbeConfig,
) -> _Run:
    """Mini-batch AdamW whose learning rate decays from `lr` to 0 over `max_epochs` (cosine), so the last epochs
    settle instead of hovering at a fixed step size."""
    weight = weight0.detach().clone().requires_grad_(True)
    bias = bias0.detach().clone().requires_grad_(True)
    optimizer = torch.optim.AdamW([weight, bias], lr=config.lr, weight_decay=0.0)
    steps_per_epoch = math.ceil(data.rows.shape[0] / config.batch_size)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=config.max_epochs * steps_per_epoch)
    rng = np.random.default_rng(config.seed)

    def epochs() -> Iterator[tuple[float, torch.Tensor, torch.Tensor, bool]]:
        for _ in range(config.max_epochs):
            order = data.rows[rng.permutation(data.rows.shape[0])]
            total, seen = 0.0, 0
            for x, y in data.chunks(order, config.batch_size):
                optimizer.zero_grad()
                loss = F.cross_entropy(x @ weight.T + bias, y) + 0.5 * decay * weight.square().sum()
                loss.backward()
                optimizer.step()
                schedule.step()
                total += float(loss.detach()) * y.shape[0]
                seen += y.shape[0]
            yield total / seen, weight.detach(), bias.detach(), False

    return _early_stopping(epochs(), x_val, y_val, decay, config)


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
    from .backbones.base import resolve_device

    resolve_device(device)  # before reading anything: a device that does not exist is one line
    config = config or ProbeConfig()
    probe_id = probe_id or f"{model_id}+probe"
    fit_meta = store.meta(model_id, fit_dataset)
    backbone = fit_meta.get("provenance", {})
    fit = store.read(model_id, fit_dataset)
    if fit.labels is None:
        raise ExtractError(f"{model_id}/{fit_dataset} has no labels; a probe needs a labelled fit set")
    targets = list(dict.fromkeys([fit_dataset, *apply_to]))
    _check_targets(store, model_id, fit_dataset, targets, fit.num_features)  # before any training or writing
    params = json.loads(
        json.dumps(
            {
                **asdict(config),
                "fit_dataset": fit_dataset,
                "fit_item_hash": fit_meta.get("item_hash"),
                "backbone_model_id": model_id,
            }
        )
    )
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
    for dataset_id in targets:
        _write_probe_entry(store, model_id, dataset_id, probe_id, head, provenance, shard_size)
        written.append(dataset_id)
    return ProbeReport(probe_id, trained, result, written)


def _check_targets(store: Store, model_id: str, fit_dataset: str, targets: Sequence[str], width: int) -> None:
    """Every entry to write logits for exists, is complete, matches the fit set's provenance and width, and holds
    finite features; checked before training so that a typo or a bad entry costs nothing and leaves nothing."""
    missing = [d for d in targets if not store.exists(model_id, d)]
    if missing:
        raise ExtractError(f"no store entry {model_id}/{missing[0]}: nothing to apply the probe to (check --apply-to)")
    for dataset_id in targets:
        store.check_compatible((model_id, fit_dataset), (model_id, dataset_id))
        source = store.read(model_id, dataset_id, check_finite=False)
        if source.features.ndim != 2 or source.features.shape[1] != width:
            raise ExtractError(
                f"{model_id}/{dataset_id}: features have shape {tuple(source.features.shape)}; the probe reads "
                f"{width} features per row (the width of {model_id}/{fit_dataset})"
            )
        step = rows_per_chunk(width, bytes_per_value=4)
        for part in iter_chunks(len(source), step):
            block = np.asarray(source.features[part])
            if not np.isfinite(block).all():
                row = part.start + int(np.flatnonzero(~np.isfinite(block).all(axis=1))[0])
                raise ExtractError(
                    f"{model_id}/{dataset_id}: features contain NaN or inf (first at row {row}); the probe's logits "
                    "would not be finite"
                )


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
