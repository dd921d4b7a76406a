"""What the engines share: batch plans aligned to store shards, per-item loading with failure capture, npz packing.

Batches never cross shard boundaries and are planned from the shard start, so a resumed run, and the Ray
engine, see exactly the batches an uninterrupted local run sees; that keeps arrays byte-identical even where
a kernel's rounding depends on the batch composition.
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from ..datasets import ImageList, UnreadableImage, load_rgb

__all__ = ["BatchTask", "BatchResult", "ItemLoader", "plan_tasks", "load_batch", "pack", "unpack"]


@dataclass(frozen=True)
class BatchTask:
    """One batch: its shard, its number within the shard, and the item positions it covers."""

    shard: int
    seq: int
    positions: tuple[int, ...]


@dataclass
class BatchResult:
    """Arrays of the readable items of one batch, plus the items that were skipped."""

    task: BatchTask
    positions: np.ndarray
    arrays: dict[str, np.ndarray]
    skipped: list[dict[str, Any]] = field(default_factory=list)


class ItemLoader:
    """Loads item `position` of a dataset as a preprocessed tensor (picklable, for worker processes)."""

    def __init__(self, dataset: ImageList, transform: Callable[[Any], torch.Tensor]) -> None:
        self.dataset = dataset
        self.transform = transform

    def describe(self, position: int) -> str:
        """The item's path as recorded in the store (relative to the dataset root)."""
        return self.dataset.items[position]

    def __call__(self, position: int) -> torch.Tensor:
        image = load_rgb(self.dataset.path(position))
        try:
            return self.transform(image)
        except Exception as exc:  # e.g. degenerate sizes; the image is skipped and reported like an unreadable one
            raise UnreadableImage(f"preprocessing failed: {type(exc).__name__}: {exc}") from exc


def plan_tasks(shard_rows: Iterable[tuple[int, slice]], batch_size: int) -> list[BatchTask]:
    """Batches of at most `batch_size` positions, restarting at every shard boundary."""
    if batch_size <= 0:
        raise ValueError(f"batch_size must be positive; got {batch_size}")
    tasks: list[BatchTask] = []
    for shard, rows in shard_rows:
        for seq, start in enumerate(range(rows.start, rows.stop, batch_size)):
            tasks.append(BatchTask(shard, seq, tuple(range(start, min(rows.stop, start + batch_size)))))
    return tasks


def load_batch(
    loader: Callable[[int], torch.Tensor], positions: Sequence[int]
) -> tuple[torch.Tensor | None, list[int], list[dict[str, Any]]]:
    """Stack the loadable items of a batch; unreadable ones become skip records {"item", "path", "error"}."""
    tensors: list[torch.Tensor] = []
    ok: list[int] = []
    skipped: list[dict[str, Any]] = []
    for position in positions:
        try:
            tensors.append(loader(position))
            ok.append(int(position))
        except UnreadableImage as exc:
            describe = getattr(loader, "describe", str)
            skipped.append({"item": int(position), "path": describe(position), "error": str(exc)})
    return (torch.stack(tensors) if tensors else None), ok, skipped


def pack(arrays: dict[str, np.ndarray], **meta: Any) -> bytes:
    """Arrays plus JSON metadata as one bytes blob (how rows travel through Ray Data)."""
    buffer = io.BytesIO()
    np.savez(buffer, __meta__=np.frombuffer(json.dumps(meta).encode("utf-8"), dtype=np.uint8), **arrays)
    return buffer.getvalue()


def unpack(blob: bytes) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Inverse of `pack`."""
    with np.load(io.BytesIO(blob), allow_pickle=False) as data:
        arrays = {name: data[name] for name in data.files if name != "__meta__"}
        meta = json.loads(bytes(data["__meta__"]).decode("utf-8"))
    return arrays, meta
