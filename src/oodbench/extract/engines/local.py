"""Local engine: DataLoader workers decode and preprocess, the main process runs the backbone batch by batch."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch

from ...util.cores import available_cores
from ..backbones.base import Backbone
from .common import BatchResult, BatchTask, load_batch

__all__ = ["default_workers", "iter_results", "model_threads"]


class _Batches(torch.utils.data.Dataset):
    """A dataset whose items are whole planned batches, so a worker loads one batch (and its failures) at a time."""

    def __init__(self, loader: Callable[[int], torch.Tensor], tasks: Sequence[BatchTask]) -> None:
        self.loader = loader
        self.tasks = tasks

    def __len__(self) -> int:
        return len(self.tasks)

    def __getitem__(self, index: int) -> tuple[int, torch.Tensor | None, list[int], list[dict[str, Any]]]:
        pixels, ok, skipped = load_batch(self.loader, self.tasks[index].positions)
        return index, pixels, ok, skipped


def _identity(sample: Any) -> Any:
    return sample


def default_workers() -> int:
    """Loader processes by default: one less than the cores this process may use (the main process runs the
    model), at most 4; 0 on one core. torch warns when workers outnumber those cores."""
    return max(0, min(4, available_cores() - 1))


@contextmanager
def model_threads(device: torch.device, num_workers: int) -> Iterator[int]:
    """Within the block, torch's intra-op threads in this process leave the loader workers their cores (CPU only).

    On a CPU device the model's threads and the loader processes share the cores: two model threads beside one
    worker on two cores spin against each other, which cut extraction on two cores from about 800 to 165 images/s
    (docs/rehearsal.md). A GPU model needs few CPU threads either way, so only a CPU device is limited.
    """
    before = torch.get_num_threads()
    wanted = max(1, available_cores() - num_workers) if device.type == "cpu" and num_workers > 0 else before
    if wanted < before:
        torch.set_num_threads(wanted)
    try:
        yield min(wanted, before)
    finally:
        if wanted < before:
            torch.set_num_threads(before)


def iter_results(
    backbone: Backbone,
    loader: Callable[[int], torch.Tensor],
    tasks: Sequence[BatchTask],
    *,
    num_workers: int | None = None,
    amp: bool = True,
) -> Iterator[BatchResult]:
    """Run every planned batch through the backbone, in order, with `num_workers` loader processes (None: auto)."""
    if not tasks:
        return
    if num_workers is None:
        num_workers = default_workers()
    pin = backbone.device.type == "cuda"
    data = torch.utils.data.DataLoader(
        _Batches(loader, tasks),
        batch_size=None,
        shuffle=False,
        num_workers=num_workers,
        collate_fn=_identity,
        pin_memory=pin,
        prefetch_factor=2 if num_workers > 0 else None,
        persistent_workers=False,
    )
    with model_threads(backbone.device, num_workers):
        for index, pixels, ok, skipped in data:
            arrays = backbone.infer(pixels, amp=amp) if pixels is not None else {}
            yield BatchResult(tasks[index], np.asarray(ok, dtype=np.int64), arrays, skipped)
