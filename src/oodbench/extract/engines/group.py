"""Group engine: one decode per image for several models, each model fed exactly the batches it gets alone.

DataLoader workers read and decode the planned *decode batches* (shard-aligned, like every batch here); with the
``pil`` decoder they also apply every model's own transform to the one decoded image. The main process keeps, per
model, the prepared rows of its current batch and runs the model as soon as all positions of that batch are in.
A model's batches are planned from its own pending shards and batch size, exactly as a single-model run plans
them, and a batch holds its readable items in position order, so every model sees the batches (and the pixels) it
sees alone: its arrays are byte-identical. Memory: the decode batches in flight plus at most one batch per model.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch

from ..backbones.base import Backbone, autocast_dtype
from ..datasets import UnreadableImage
from ..decode import GroupLoader, TensorPreprocess, decode_on_device
from .common import BatchResult, BatchTask
from .local import default_workers, model_threads

__all__ = ["iter_group_results", "DecodeStats"]

# A worker's answer for one decode batch: per member, {position: prepared tensor or skip record}; for the device
# decoder, per position the read result (bytes / fallback pixels) or a skip record.
_Prepared = dict[int, "torch.Tensor | dict[str, Any]"]


class DecodeStats:
    """How the images of a run were decoded: on the device, or by PIL (``pil`` decoder, or device fallbacks)."""

    def __init__(self) -> None:
        self.device = 0
        self.pil = 0
        self.unreadable = 0

    def as_dict(self) -> dict[str, int]:
        """Counts as a JSON-friendly dict."""
        return {"device": self.device, "pil": self.pil, "unreadable": self.unreadable}


class _DecodeBatches(torch.utils.data.Dataset):
    """Items are decode batches: a worker reads (and for ``pil`` decodes and transforms) one batch at a time."""

    def __init__(self, loader: GroupLoader, tasks: Sequence[BatchTask], needs: Sequence[frozenset[int]]) -> None:
        self.loader, self.tasks, self.needs = loader, tasks, needs

    def __len__(self) -> int:
        return len(self.tasks)

    def __getitem__(self, index: int) -> tuple[int, Any]:
        task = self.tasks[index]
        members = [m for m, shards in enumerate(self.needs) if task.shard in shards]
        if self.loader.mode == "device":
            raw: dict[int, Any] = {}
            for position in task.positions:
                try:
                    raw[position] = self.loader.read(position)
                except UnreadableImage as exc:
                    raw[position] = _skip(self.loader, position, exc)
            return index, raw
        prepared: dict[int, _Prepared] = {m: {} for m in members}
        unreadable = 0
        for position in task.positions:
            try:
                image = self.loader.read(position)
            except UnreadableImage as exc:
                unreadable += 1
                for m in members:
                    prepared[m][position] = _skip(self.loader, position, exc)
                continue
            done: dict[int, Any] = {}  # members with the same transform share its output
            for m in members:
                first = self.loader.same_as[m]
                if first not in done:
                    try:
                        done[first] = self.loader.prepare(image, m)
                    except UnreadableImage as exc:
                        done[first] = _skip(self.loader, position, exc)
                prepared[m][position] = done[first]
        return index, (_pack(prepared, self.loader.same_as), unreadable)


def _pack(prepared: dict[int, _Prepared], same_as: Sequence[int]) -> tuple[dict[int, Any], dict[int, Any]]:
    """One tensor per transform for a decode batch, instead of one per image and model: a tensor a worker hands over
    holds a file descriptor in the main process until it is freed (torch's file_descriptor sharing), and per-image
    tensors buffered for several models and batches in flight outrun a 1,024-file limit."""
    packed: dict[int, Any] = {}
    stacks: dict[int, torch.Tensor | None] = {}
    for member, rows in prepared.items():
        first = same_as[member]  # members with one transform hold the same tensors
        positions = [p for p, row in rows.items() if not isinstance(row, dict)]
        if first not in stacks:
            stacks[first] = torch.stack([rows[p] for p in positions]) if positions else None
        packed[member] = (first, positions, {p: row for p, row in rows.items() if isinstance(row, dict)})
    return packed, stacks


def _unpack(payload: tuple[dict[int, Any], dict[int, Any]]) -> dict[int, _Prepared]:
    """Per member, {position: its row (a view of the batch's one tensor) or skip record}."""
    packed, stacks = payload
    prepared: dict[int, _Prepared] = {}
    for member, (first, positions, skips) in packed.items():
        rows: _Prepared = dict(skips)
        if positions:
            rows.update(zip(positions, stacks[first].unbind(0), strict=True))
        prepared[member] = rows
    return prepared


def _skip(loader: GroupLoader, position: int, exc: Exception) -> dict[str, Any]:
    return {"item": int(position), "path": loader.describe(position), "error": str(exc)}


def _identity(sample: Any) -> Any:
    return sample


def _device_prepare(
    raw: dict[int, Any],
    loader: GroupLoader,
    members: Sequence[int],
    tensor_steps: Sequence[TensorPreprocess | None],
    device: torch.device,
    stats: DecodeStats,
) -> dict[int, _Prepared]:
    """Decode one batch's JPEGs on the device, then each member's preprocessing (tensor, or its PIL transform)."""
    from PIL import Image

    positions = [p for p, value in raw.items() if not isinstance(value, dict)]
    pixels, routes = decode_on_device([raw[p] for p in positions], device)
    decoded: dict[int, Any] = dict(raw)
    for position, value, route in zip(positions, pixels, routes, strict=True):
        if isinstance(value, UnreadableImage):
            decoded[position] = _skip(loader, position, value)
        else:
            decoded[position] = value
            stats.device += route == "device"
            stats.pil += route == "pil"
    stats.unreadable += sum(isinstance(v, dict) for v in decoded.values())
    prepared: dict[int, _Prepared] = {m: {} for m in members}
    for position in sorted(decoded):
        value = decoded[position]
        for m in members:
            if isinstance(value, dict):
                prepared[m][position] = value
                continue
            try:
                step = tensor_steps[m]
                if step is not None:
                    prepared[m][position] = step(value)
                else:
                    image = Image.fromarray(value.permute(1, 2, 0).cpu().numpy(), "RGB")
                    prepared[m][position] = loader.prepare(image, m)
            except UnreadableImage as exc:
                prepared[m][position] = _skip(loader, position, exc)
            except Exception as exc:  # e.g. degenerate sizes in the tensor resize
                prepared[m][position] = _skip(
                    loader, position, UnreadableImage(f"preprocessing failed: {type(exc).__name__}: {exc}")
                )
    return prepared


def iter_group_results(
    backbones: Sequence[Backbone],
    loader: GroupLoader,
    decode_tasks: Sequence[BatchTask],
    member_tasks: Sequence[Sequence[BatchTask]],
    *,
    num_workers: int | None = None,
    amp: bool = True,
    amp_dtype: str = "auto",
    channels_last: bool = False,
    stats: DecodeStats | None = None,
) -> Iterator[tuple[int, BatchResult, int]]:
    """Yield (member, result, images decoded since the last yield) as each member's planned batches complete
    (`num_workers` None: `engines.local.default_workers`)."""
    if not decode_tasks:
        return
    if num_workers is None:
        num_workers = default_workers()
    stats = stats if stats is not None else DecodeStats()
    needs = [frozenset(task.shard for task in tasks) for tasks in member_tasks]
    device = backbones[0].device
    tensor_steps = [TensorPreprocess.of(b.preprocessing) if loader.mode == "device" else None for b in backbones]
    data = torch.utils.data.DataLoader(
        _DecodeBatches(loader, decode_tasks, needs),
        batch_size=None,
        shuffle=False,
        num_workers=num_workers,
        collate_fn=_identity,
        pin_memory=device.type == "cuda" and loader.mode == "pil",
        prefetch_factor=2 if num_workers > 0 else None,
        persistent_workers=False,
    )
    buffers: list[_Prepared] = [{} for _ in backbones]
    cursor = [0] * len(backbones)
    with model_threads(device, num_workers):
        for index, payload in data:
            task = decode_tasks[index]
            members = [m for m, shards in enumerate(needs) if task.shard in shards]
            if loader.mode == "device":
                payload = _device_prepare(payload, loader, members, tensor_steps, device, stats)
            else:
                packed, unreadable = payload
                payload = _unpack(packed)
                stats.pil += len(task.positions) - unreadable
                stats.unreadable += unreadable
            decoded = len(task.positions)
            for m in members:
                buffers[m].update(payload[m])
                tasks = member_tasks[m]
                while cursor[m] < len(tasks) and all(p in buffers[m] for p in tasks[cursor[m]].positions):
                    planned = tasks[cursor[m]]
                    rows = [buffers[m].pop(p) for p in planned.positions]
                    ok = [p for p, row in zip(planned.positions, rows, strict=True) if not isinstance(row, dict)]
                    skipped = [row for row in rows if isinstance(row, dict)]
                    arrays: dict[str, np.ndarray] = {}
                    if ok:
                        pixels = torch.stack([row for row in rows if not isinstance(row, dict)])
                        if channels_last:
                            pixels = pixels.contiguous(memory_format=torch.channels_last)
                        with autocast_dtype(amp_dtype):
                            arrays = backbones[m].infer(pixels, amp=amp)
                    yield m, BatchResult(planned, np.asarray(ok, dtype=np.int64), arrays, skipped), decoded
                    decoded = 0
                    cursor[m] += 1
            if decoded:
                yield -1, BatchResult(task, np.zeros(0, np.int64), {}), decoded
