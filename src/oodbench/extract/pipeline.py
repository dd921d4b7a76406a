"""Extraction pipeline: plan shard-aligned batches, run them on an engine, write shards, finalize, store the head."""

from __future__ import annotations

import contextlib
import errno
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..core.errors import ExtractError
from ..core.store import PROVENANCE_KEYS, EntryWriter, Store
from ..util.atomic import atomic_write_text
from ..util.progress import note_work
from .backbones.base import Backbone
from .datasets import ImageList
from .engines.common import BatchResult, ItemLoader, plan_tasks

__all__ = [
    "ExtractionReport",
    "GroupMember",
    "SkipLines",
    "extract",
    "extract_group",
    "check_model_id",
    "ENGINES",
    "INLINE_ITEMS",
]

ENGINES = ("local", "ray")
# Entries up to this many items also list their items inline in meta.json (items.txt is always written).
INLINE_ITEMS = 1000


@dataclass
class ExtractionReport:
    """What one extraction call did."""

    model_id: str
    dataset_id: str
    num_items: int
    num_rows: int
    processed: int
    seconds: float
    skipped: list[dict[str, Any]] = field(default_factory=list)
    head_written: bool = False
    path: Path | None = None
    decode: dict[str, int] | None = None  # shared-decode passes: images decoded on the device / by PIL / unreadable

    @property
    def images_per_second(self) -> float:
        """Items processed per second in this call (0 when nothing was left to do)."""
        return self.processed / self.seconds if self.seconds > 0 and self.processed else 0.0


def check_model_id(store: Store, model_id: str, provenance: Mapping[str, Any]) -> None:
    """Refuse to add to a model id whose entries or head come from another model, checkpoint or preprocessing."""
    others = [
        (dataset_id, store.meta(model_id, dataset_id).get("provenance", {})) for dataset_id in store.datasets(model_id)
    ]
    if store.has_head(model_id):
        others.append(("head", store.head_meta(model_id).get("provenance", {})))
    for where, other in others:
        for key in PROVENANCE_KEYS:
            if other.get(key) != provenance.get(key):
                raise ExtractError(
                    f"model id {model_id!r} already holds {where} with {key}={other.get(key)!r}, but this extraction has "
                    f"{key}={provenance.get(key)!r}; pass another --model-id (or delete the old entries)"
                )


class SkipLines:
    """One line on stderr per unreadable image (naming the file and what is wrong), however many models skip it and
    however many passes over its dataset a process makes into one store (the runner makes one per group of models);
    `count` is how many this pass met, said again in its closing line."""

    # (store root, file) pairs already reported by this process
    reported: set[tuple[str, str]] = set()

    def __init__(
        self, dataset: ImageList, dataset_id: str, store: Store, write: Callable[[str], Any] | None = None
    ) -> None:
        self.dataset, self.dataset_id, self.store = dataset, dataset_id, str(store.root)
        self.write = write or sys.stderr.write
        self.seen: set[int] = set()
        self.repeated = 0

    def __call__(self, item: Mapping[str, Any]) -> None:
        position = int(item["item"])
        if position in self.seen:
            return
        self.seen.add(position)
        key = (self.store, str(self.dataset.path(position)))
        if key in SkipLines.reported:
            self.repeated += 1
            return
        SkipLines.reported.add(key)
        self.write(f"{self.dataset_id}: skipped {key[1]}: {item['error']}\n")

    @property
    def count(self) -> int:
        """Unreadable images this pass met."""
        return len(self.seen)

    def summary(self) -> None:
        """One closing line with the count, when any image was skipped."""
        if self.seen:
            where = "each listed above" if not self.repeated else f"{self.repeated:,} of them listed by an earlier pass"
            self.write(
                f"{self.dataset_id}: {len(self.seen):,} unreadable image(s) skipped ({where}); every entry records them "
                "in meta.json (skipped)\n"
            )


_DISK_FULL = frozenset({errno.ENOSPC, errno.EDQUOT})


@contextlib.contextmanager
def _disk_full(store: Store, what: str) -> Iterator[None]:
    """A full disk (or quota) while writing becomes one ExtractError line; the store's shards and merge are atomic
    (done markers and meta.json last), so nothing half-written is read as complete and a rerun resumes."""
    try:
        yield
    except OSError as exc:
        if exc.errno not in _DISK_FULL:
            raise
        raise ExtractError(
            f"no space left on the device while writing {what} into the store {store.root} ({exc.strerror}); "
            "whole shards written so far are kept: free space and rerun to resume"
        ) from None


class _ShardAssembler:
    """Collects batch results per shard and writes a shard once all its batches are in (any arrival order)."""

    def __init__(
        self,
        writer: EntryWriter,
        expected: dict[int, int],
        labels: np.ndarray | None,
        fallback_spec: Callable[[], dict[str, tuple[tuple[int, ...], np.dtype]]],
        on_skip: Callable[[Mapping[str, Any]], None] | None = None,
    ) -> None:
        self.writer, self.expected, self.labels = writer, expected, labels
        self.fallback_spec = fallback_spec
        self.on_skip = on_skip
        self.parts: dict[int, dict[int, BatchResult]] = {}
        self.spec: dict[str, tuple[tuple[int, ...], np.dtype]] | None = None
        self.deferred: list[int] = []
        self.skipped: list[dict[str, Any]] = []
        self.rows = 0

    def add(self, result: BatchResult) -> None:
        if result.arrays and self.spec is None:
            self.spec = {name: (value.shape[1:], value.dtype) for name, value in result.arrays.items()}
        shard_parts = self.parts.setdefault(result.task.shard, {})
        shard_parts[result.task.seq] = result
        if len(shard_parts) == self.expected[result.task.shard]:
            self._write(result.task.shard)
        if self.spec is not None and self.deferred:
            for shard in self.deferred[:]:
                self.deferred.remove(shard)
                self._write(shard)

    def _write(self, shard: int) -> None:
        results = [self.parts[shard][seq] for seq in sorted(self.parts[shard])]
        positions = np.concatenate([r.positions for r in results]) if results else np.zeros(0, np.int64)
        with_rows = [r for r in results if r.arrays]
        if not with_rows and self.spec is None:
            self.deferred.append(shard)  # all items unreadable: shapes come from another shard later
            return
        names = with_rows[0].arrays.keys() if with_rows else self.spec.keys()  # type: ignore[union-attr]
        arrays: dict[str, np.ndarray] = {}
        for name in names:
            if with_rows:
                arrays[name] = np.concatenate([r.arrays[name] for r in with_rows], axis=0)
            else:
                tail, dtype = self.spec[name]  # type: ignore[index]
                arrays[name] = np.zeros((0, *tail), dtype=dtype)
        arrays["index"] = positions.astype(np.int64)
        if self.labels is not None:
            arrays["labels"] = self.labels[positions]
        skipped = [item for r in results for item in r.skipped]
        self.writer.write_shard(shard, arrays, skipped=skipped)
        if self.on_skip is not None:
            for item in skipped:
                self.on_skip(item)
        self.skipped.extend(skipped)
        self.rows += len(positions)
        del self.parts[shard]

    def finish(self) -> None:
        if self.deferred:
            if self.spec is None:
                self.spec = self.fallback_spec()
            for shard in self.deferred[:]:
                self.deferred.remove(shard)
                self._write(shard)
        if self.parts:
            raise ExtractError(f"engine returned incomplete shards {sorted(self.parts)[:5]}; rerun to finish them")


def _progress(total: int, completed: int, enabled: bool, description: str):
    from ..util.progress import make_progress

    progress = make_progress(enabled, rate_unit="img")  # stderr, like every progress bar of oodbench
    task = progress.add_task(description, total=total, completed=completed)
    return progress, task


def _engine_results(
    engine: str,
    backbone: Backbone,
    loader: Callable[[int], torch.Tensor],
    tasks: list,
    *,
    num_workers: int | None,
    amp: bool,
    options: Mapping[str, Any],
) -> Iterator[BatchResult]:
    if engine == "local":
        from .engines.local import iter_results

        return iter_results(backbone, loader, tasks, num_workers=num_workers, amp=amp, **options)
    if engine == "ray":
        from .engines.ray_engine import iter_results as ray_results

        return ray_results(backbone, loader, tasks, amp=amp, **options)
    raise ExtractError(f"unknown engine {engine!r}; use one of {', '.join(ENGINES)}")


def extract(
    store: Store,
    backbone: Backbone,
    dataset: ImageList,
    *,
    dataset_id: str,
    model_id: str | None = None,
    engine: str = "local",
    batch_size: int = 64,
    shard_size: int = 4096,
    num_workers: int | None = None,
    device: str = "auto",
    amp: bool = True,
    progress: bool = True,
    loader: Callable[[int], torch.Tensor] | None = None,
    engine_options: Mapping[str, Any] | None = None,
) -> ExtractionReport:
    """Extract `dataset` with `backbone` into `store` as (model_id, dataset_id); resumes whatever is missing.

    `num_workers`: loader processes of the local engine (None: `engines.local.default_workers`).
    """
    if engine not in ENGINES:
        raise ExtractError(f"unknown engine {engine!r}; use one of {', '.join(ENGINES)}")
    if batch_size <= 0 or shard_size <= 0:
        raise ExtractError(f"batch size and shard size must be positive; got {batch_size} and {shard_size}")
    if len(dataset) == 0:
        raise ExtractError(f"dataset {dataset_id} has no items")
    model_id = model_id or backbone.default_model_id()
    provenance = backbone.provenance()
    where = f"{model_id}/{dataset_id}"
    with _disk_full(store, where):
        writer, entry = _open_entry(store, model_id, dataset_id, provenance, dataset, shard_size)
    started = time.perf_counter()
    processed = 0
    assembler: _ShardAssembler | None = None
    skips = SkipLines(dataset, dataset_id, store)
    if not writer.complete:
        pending = writer.pending_shards()
        tasks = plan_tasks(((k, writer.shard_rows(k)) for k in pending), batch_size)
        expected: dict[int, int] = {}
        for task in tasks:
            expected[task.shard] = expected.get(task.shard, 0) + 1
        if engine == "local":
            backbone.to(device)

        def fallback_spec() -> dict[str, tuple[tuple[int, ...], np.dtype]]:
            dummy = torch.zeros(1, *backbone.input_size())
            return {name: (value.shape[1:], value.dtype) for name, value in backbone.infer(dummy, amp=amp).items()}

        assembler = _ShardAssembler(writer, expected, dataset.labels, fallback_spec, skips)
        item_loader = loader or ItemLoader(dataset, backbone.transform)
        done_items = len(dataset) - sum(len(task.positions) for task in tasks)
        bar, bar_task = _progress(len(dataset), done_items, progress, f"{model_id}/{dataset_id}")
        topic = f"extract {model_id}/{dataset_id}"

        def note_shards() -> None:
            # Rows count once their shard is written, atomically: a rerun resumes from whole shards, so they are
            # "kept" only once there is one (a Ctrl-C on the first batch keeps nothing).
            rows = done_items + assembler.rows
            if rows:
                note_work(
                    topic,
                    finished=f"{rows} of {len(dataset)} images of {dataset_id}",
                    kept=f"whole shards in store {store.root}",
                )

        note_shards()
        with bar, _disk_full(store, where):
            for result in _engine_results(
                engine, backbone, item_loader, tasks, num_workers=num_workers, amp=amp, options=engine_options or {}
            ):
                assembler.add(result)
                processed += len(result.task.positions)
                bar.update(bar_task, advance=len(result.task.positions))
                note_shards()
            assembler.finish()
            _finalize(writer, dataset)
        skips.summary()
    seconds = time.perf_counter() - started
    with _disk_full(store, f"the head of {model_id}"):
        return _report(store, backbone, model_id, dataset_id, provenance, dataset, processed, seconds, entry, amp=amp)


def _open_entry(
    store: Store, model_id: str, dataset_id: str, provenance: Mapping[str, Any], dataset: ImageList, shard_size: int
) -> tuple[EntryWriter, Path]:
    """Check the model id's provenance, open (or resume) the entry's writer and write its items file once."""
    check_model_id(store, model_id, provenance)
    writer = store.writer(
        model_id,
        dataset_id,
        provenance=provenance,
        num_items=len(dataset),
        shard_size=shard_size,
        item_hash=dataset.item_hash(),
    )
    entry = store.entry_path(model_id, dataset_id)
    items_file = entry / "items.txt"
    if not items_file.is_file():
        atomic_write_text(items_file, "".join(f"{item}\n" for item in dataset.items))
    return writer, entry


def _finalize(writer: EntryWriter, dataset: ImageList) -> None:
    extra_meta: dict[str, Any] = {"dataset": dataset.describe(), "items_file": "items.txt"}
    if len(dataset) <= INLINE_ITEMS:
        extra_meta["items"] = list(dataset.items)
    writer.finalize(extra_meta=extra_meta)


def _report(
    store: Store,
    backbone: Backbone,
    model_id: str,
    dataset_id: str,
    provenance: Mapping[str, Any],
    dataset: ImageList,
    processed: int,
    seconds: float,
    entry: Path,
    *,
    amp: bool,
) -> ExtractionReport:
    head_written = _store_head(store, backbone, model_id, dataset_id, provenance, loose=amp)
    meta = store.meta(model_id, dataset_id)
    return ExtractionReport(
        model_id,
        dataset_id,
        len(dataset),
        int(meta.get("num_rows", 0)),
        processed,
        seconds,
        list(meta.get("skipped", [])),
        head_written,
        entry,
    )


def _store_head(
    store: Store, backbone: Backbone, model_id: str, dataset_id: str, provenance: Mapping[str, Any], *, loose: bool
) -> bool:
    """Store the backbone's head once per model, after checking it reproduces the stored logits."""
    head = backbone.head()
    if head is None:
        return False
    outputs = store.read(model_id, dataset_id)
    # Under GPU autocast the logits carry half-precision rounding; the per-batch check already used the strict
    # float32 tolerance wherever the forward pass ran in float32.
    tolerance = 2e-2 if loose else 1e-3
    try:
        head.check_outputs(outputs, rtol=tolerance, atol=tolerance)
    except ValueError as exc:
        raise ExtractError(f"refusing to store the head of {model_id}: {exc}") from exc
    if store.has_head(model_id):
        stored = store.read_head(model_id)
        if not (np.array_equal(stored.weight, head.weight) and np.array_equal(stored.bias, head.bias)):
            raise ExtractError(f"model id {model_id!r} already has a different head; pass another --model-id")
        return False
    store.write_head(model_id, head, provenance=provenance)
    return True


@dataclass
class GroupMember:
    """One model of a shared-decode pass: its backbone, store model id (None: its default) and batch size."""

    backbone: Backbone
    model_id: str | None = None
    batch_size: int = 64


def runtime_provenance(
    device: torch.device, *, amp: bool, amp_dtype: str = "auto", decode: str = "pil", channels_last: bool = False
) -> dict[str, Any]:
    """How the pixels were made and the network run, when that differs from PIL decoding and float32 on CPU.

    Empty for the default CPU path, so entries made before these options existed keep their provenance.
    """
    from .backbones.base import autocast_dtype, resolved_amp_dtype

    runtime: dict[str, Any] = {}
    with autocast_dtype(amp_dtype):
        dtype = resolved_amp_dtype(device, amp)
    if dtype is not None:
        runtime["autocast"] = dtype
    if decode == "device":
        runtime["decode"] = f"torchvision.io.decode_jpeg on {device.type} (PIL for other files), tensor preprocessing"
    if channels_last:
        runtime["channels_last"] = True
    return runtime


def extract_group(
    store: Store,
    members: Sequence[GroupMember],
    dataset: ImageList,
    *,
    dataset_id: str,
    shard_size: int = 4096,
    num_workers: int | None = None,
    device: str = "auto",
    amp: bool = True,
    amp_dtype: str = "auto",
    decode: str = "pil",
    channels_last: bool = False,
    progress: bool = True,
) -> list[ExtractionReport]:
    """Extract `dataset` with several backbones in one pass: each image is read and decoded once for all of them.

    Every model gets its own store entry, resumed at its own missing shards, with the arrays it gets when extracted
    alone (`extract`): the same batches (its own batch size, restarting at each shard) and, with ``decode="pil"``,
    the same pixels (its own transform on the shared PIL image). ``decode="device"`` decodes JPEGs with
    ``torchvision.io.decode_jpeg`` on the model device and preprocesses on tensors (recorded in provenance).
    """
    from .backbones.base import AMP_DTYPES, resolve_device
    from .decode import GroupLoader, resolve_decode
    from .engines.group import DecodeStats, iter_group_results

    if not members:
        raise ExtractError("no models to extract")
    if shard_size <= 0 or any(m.batch_size <= 0 for m in members):
        sizes = ", ".join(str(m.batch_size) for m in members)
        raise ExtractError(f"batch sizes and shard size must be positive; got {sizes} and {shard_size}")
    if amp_dtype not in AMP_DTYPES:
        raise ExtractError(f"autocast dtype must be one of {', '.join(AMP_DTYPES)}; got {amp_dtype!r}")
    if len(dataset) == 0:
        raise ExtractError(f"dataset {dataset_id} has no items")
    target = resolve_device(device)
    mode = resolve_decode(decode, target)
    ids = [m.model_id or m.backbone.default_model_id() for m in members]
    if len(set(ids)) != len(ids):
        repeated = sorted({i for i in ids if ids.count(i) > 1})
        raise ExtractError(f"model id {repeated[0]!r} appears twice in one group; give each model its own --model-id")
    runtime = runtime_provenance(target, amp=amp, amp_dtype=amp_dtype, decode=mode, channels_last=channels_last)
    provenances = []
    for member in members:
        provenance = member.backbone.provenance()
        if runtime:
            provenance["runtime"] = runtime
        provenances.append(provenance)
    for model_id, provenance in zip(ids, provenances, strict=True):  # validate every model before writing anything
        check_model_id(store, model_id, provenance)
    where = f"{', '.join(ids)}/{dataset_id}"
    with _disk_full(store, where):
        opened = [
            _open_entry(store, model_id, dataset_id, provenance, dataset, shard_size)
            for model_id, provenance in zip(ids, provenances, strict=True)
        ]
    started = time.perf_counter()
    writers = [writer for writer, _ in opened]
    member_tasks = [
        plan_tasks(((k, w.shard_rows(k)) for k in w.pending_shards()), m.batch_size) if not w.complete else []
        for w, m in zip(writers, members, strict=True)
    ]
    active = [i for i, tasks in enumerate(member_tasks) if tasks]
    processed = [0] * len(members)
    stats = DecodeStats()
    skips = SkipLines(dataset, dataset_id, store)
    if active:
        for i in active:
            members[i].backbone.to(target)
            if channels_last:
                members[i].backbone.model.to(memory_format=torch.channels_last)
        shards = sorted({task.shard for i in active for task in member_tasks[i]})
        reference = writers[active[0]]
        decode_tasks = plan_tasks(((k, reference.shard_rows(k)) for k in shards), max(m.batch_size for m in members))
        assemblers: dict[int, _ShardAssembler] = {}
        for i in active:
            expected: dict[int, int] = {}
            for task in member_tasks[i]:
                expected[task.shard] = expected.get(task.shard, 0) + 1
            assemblers[i] = _ShardAssembler(
                writers[i], expected, dataset.labels, _fallback_spec(members[i].backbone, amp), skips
            )
        loader = GroupLoader(dataset, [members[i].backbone.transform for i in active], mode)
        done_items = len(dataset) - sum(len(t.positions) for t in decode_tasks)
        names = ", ".join(ids[i] for i in active)
        bar, bar_task = _progress(len(dataset), done_items, progress, f"{names}/{dataset_id}")
        with bar, _disk_full(store, where):
            for local, result, decoded in iter_group_results(
                [members[i].backbone for i in active],
                loader,
                decode_tasks,
                [member_tasks[i] for i in active],
                num_workers=num_workers,
                amp=amp,
                amp_dtype=amp_dtype,
                channels_last=channels_last,
                stats=stats,
            ):
                if local >= 0:
                    assemblers[active[local]].add(result)
                    processed[active[local]] += len(result.task.positions)
                if decoded:
                    bar.update(bar_task, advance=decoded)
            for i in active:
                assemblers[i].finish()
                _finalize(writers[i], dataset)
        skips.summary()
    seconds = time.perf_counter() - started
    with _disk_full(store, f"the heads of {', '.join(ids)}"):
        reports = [
            _report(store, m.backbone, model_id, dataset_id, provenance, dataset, processed[i], seconds, entry, amp=amp)
            for i, (m, model_id, provenance, (_, entry)) in enumerate(
                zip(members, ids, provenances, opened, strict=True)
            )
        ]
    for report in reports:
        report.decode = stats.as_dict()
    return reports


def _fallback_spec(backbone: Backbone, amp: bool) -> Callable[[], dict[str, tuple[tuple[int, ...], np.dtype]]]:
    def spec() -> dict[str, tuple[tuple[int, ...], np.dtype]]:
        dummy = torch.zeros(1, *backbone.input_size())
        return {name: (value.shape[1:], value.dtype) for name, value in backbone.infer(dummy, amp=amp).items()}

    return spec
