"""On-disk cache of `Outputs` per (model, dataset): sharded, atomic, resumable, memory-mapped, with provenance.

Layout::

    <root>/<model-id>/head/{weight.npy, bias.npy, meta.json}
    <root>/<model-id>/<dataset-id>/meta.json                 provenance, shapes, dtypes, skipped items
    <root>/<model-id>/<dataset-id>/shards/<array>.<k>.npy     while writing: one file per array per shard
    <root>/<model-id>/<dataset-id>/shards/<k>.done.json       marks shard k complete (written last)
    <root>/<model-id>/<dataset-id>/<array>.npy                after finalize: one contiguous file per array

Shards are the unit of resumable writing: every file is written under a temporary name and renamed, and a
shard counts only once its ``done`` marker exists and every file it lists has the recorded size, so a
killed writer never leaves a shard a reader accepts. ``finalize`` appends the shards of each array to
one contiguous ``.npy`` (bounded memory), deleting each shard once it is copied, so that readers memory-map
a single file even for 1.28 M rows and the entry never needs much more disk than its own size plus one shard;
``shards/merge.json`` records the merge's progress so that a killed ``finalize`` resumes where it stopped.
Array names: ``features``, ``logits``, ``labels``, ``index`` (the item position of each row, so skipped
unreadable items leave no silent hole) and ``extra.<name>`` for extras.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import platform
import shutil
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .atomic import atomic_save_npy, atomic_write_json
from .errors import StoreError
from .names import check_name
from .outputs import Head, Outputs

__all__ = ["Store", "EntryWriter", "PROVENANCE_KEYS", "hash_items", "library_versions"]

FORMAT_VERSION = 1
# Provenance fields that must agree between the datasets of one evaluation (same network, same inputs).
PROVENANCE_KEYS = ("model", "checkpoint", "preprocessing")
_EXTRA = "extra."


def _check_name(kind: str, name: str) -> str:
    return check_name(name, f"invalid {kind}", error=StoreError)


def hash_items(items: Iterable[str]) -> str:
    """SHA-256 of an ordered item list (e.g. relative image paths), the dataset's identity in provenance."""
    digest = hashlib.sha256()
    for item in items:
        digest.update(str(item).encode("utf-8"))
        digest.update(b"\n")
    return digest.hexdigest()


def library_versions() -> dict[str, str]:
    """Versions of Python and of the numerical libraries already imported (recorded in meta.json)."""
    versions = {"python": platform.python_version(), "numpy": np.__version__}
    from . import __version__

    versions["oodbench"] = __version__
    for module in ("torch", "torchvision", "timm", "open_clip", "faiss", "sklearn", "scipy"):
        loaded = sys.modules.get(module)
        if loaded is not None and hasattr(loaded, "__version__"):
            versions[module] = str(loaded.__version__)
    return versions


def _read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise StoreError(f"missing {path}") from None
    except json.JSONDecodeError as exc:
        raise StoreError(f"corrupt JSON in {path}: {exc}") from None


def _now() -> str:
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")


@dataclass(frozen=True)
class EntryKey:
    """A (model-id, dataset-id) pair naming one store entry."""

    model_id: str
    dataset_id: str

    def __str__(self) -> str:
        return f"{self.model_id}/{self.dataset_id}"


class Store:
    """A feature store rooted at a directory; one entry per (model-id, dataset-id)."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)

    def __repr__(self) -> str:
        return f"Store({str(self.root)!r})"

    # ----------------------------------------------------------------- paths and listing
    def entry_path(self, model_id: str, dataset_id: str) -> Path:
        """Directory of one (model, dataset) entry."""
        return self.root / _check_name("model id", model_id) / _check_name("dataset id", dataset_id)

    def models(self) -> list[str]:
        """Model ids present in the store."""
        if not self.root.is_dir():
            return []
        return sorted(p.name for p in self.root.iterdir() if p.is_dir() and not p.name.startswith("."))

    def datasets(self, model_id: str) -> list[str]:
        """Dataset ids with a meta.json under a model (complete or not)."""
        model_dir = self.root / _check_name("model id", model_id)
        if not model_dir.is_dir():
            return []
        return sorted(p.name for p in model_dir.iterdir() if (p / "meta.json").is_file() and p.name != "head")

    def exists(self, model_id: str, dataset_id: str) -> bool:
        """True when the entry is complete (finalized) and readable."""
        meta_path = self.entry_path(model_id, dataset_id) / "meta.json"
        if not meta_path.is_file():
            return False
        return bool(_read_json(meta_path).get("complete"))

    def meta(self, model_id: str, dataset_id: str) -> dict[str, Any]:
        """The entry's meta.json, checked to belong to this (model, dataset)."""
        path = self.entry_path(model_id, dataset_id)
        if not (path / "meta.json").is_file():
            if not self.root.is_dir():
                what = "is not a directory" if self.root.exists() else "does not exist"
                raise StoreError(f"the store {self.root} {what} (no store entry {model_id}/{dataset_id})")
            known = self.datasets(model_id)
            hint = (
                f"; datasets stored for {model_id!r}: {', '.join(known)}"
                if known
                else f"; models in store: {', '.join(self.models()) or 'none'}"
            )
            raise StoreError(f"no store entry {model_id}/{dataset_id} under {self.root}{hint}")
        meta = _read_json(path / "meta.json")
        if meta.get("model_id") != model_id or meta.get("dataset_id") != dataset_id:
            raise StoreError(
                f"{path} holds {meta.get('model_id')}/{meta.get('dataset_id')}, not {model_id}/{dataset_id}: "
                "the directory was copied or renamed from another model/dataset; re-extract it"
            )
        return meta

    # ----------------------------------------------------------------- writing
    def writer(
        self,
        model_id: str,
        dataset_id: str,
        *,
        provenance: Mapping[str, Any],
        num_items: int,
        shard_size: int,
        item_hash: str | None = None,
    ) -> EntryWriter:
        """Open (or resume) an entry for sharded writing; refuses to mix runs with different provenance."""
        return EntryWriter(
            self,
            model_id,
            dataset_id,
            provenance=provenance,
            num_items=num_items,
            shard_size=shard_size,
            item_hash=item_hash,
        )

    def write_outputs(
        self,
        model_id: str,
        dataset_id: str,
        outputs: Outputs,
        *,
        provenance: Mapping[str, Any],
        shard_size: int = 65536,
        item_hash: str | None = None,
        overwrite: bool = False,
    ) -> Path:
        """Write a whole in-memory `Outputs` as a complete entry (sharded, atomic)."""
        if len(outputs) == 0:
            # Checked before anything touches the disk: a zero-row entry would have no shard to define its arrays.
            raise StoreError(f"{model_id}/{dataset_id}: the outputs have no rows; an entry needs at least one")
        if overwrite:
            self.delete(model_id, dataset_id)
        n = len(outputs)
        writer = self.writer(
            model_id, dataset_id, provenance=provenance, num_items=n, shard_size=shard_size, item_hash=item_hash
        )
        for shard in writer.pending_shards():
            rows = writer.shard_rows(shard)
            arrays: dict[str, np.ndarray] = {
                "features": outputs.features[rows],
                "index": np.arange(rows.start, rows.stop),
            }
            if outputs.logits is not None:
                arrays["logits"] = outputs.logits[rows]
            if outputs.labels is not None:
                arrays["labels"] = outputs.labels[rows]
            for name, value in outputs.extras.items():
                arrays[_EXTRA + name] = value[rows]
            writer.write_shard(shard, arrays)
        writer.finalize()
        return self.entry_path(model_id, dataset_id)

    def delete(self, model_id: str, dataset_id: str) -> None:
        """Remove an entry if present."""
        path = self.entry_path(model_id, dataset_id)
        if path.exists():
            shutil.rmtree(path)

    # ----------------------------------------------------------------- reading
    def read(self, model_id: str, dataset_id: str, *, mmap: bool = True, check_finite: bool = True) -> Outputs:
        """The entry as `Outputs`, memory-mapped; raises StoreError if incomplete or corrupt."""
        meta = self.meta(model_id, dataset_id)
        if not meta.get("complete"):
            done = len(EntryWriter._done_shards(self.entry_path(model_id, dataset_id) / "shards"))
            raise StoreError(
                f"store entry {model_id}/{dataset_id} is incomplete ({done} of {meta.get('num_shards')} shards written); "
                "rerun the extraction to finish it"
            )
        arrays = {name: self._load(model_id, dataset_id, name, spec, mmap) for name, spec in meta["arrays"].items()}
        extras = {name[len(_EXTRA) :]: value for name, value in arrays.items() if name.startswith(_EXTRA)}
        try:
            return Outputs(
                features=arrays["features"],
                logits=arrays.get("logits"),
                labels=arrays.get("labels"),
                extras=extras,
                check_finite=check_finite,
                provenance=self.entry_provenance(model_id, dataset_id, meta),
            )
        except ValueError as exc:
            raise StoreError(f"store entry {model_id}/{dataset_id} holds invalid arrays: {exc}") from exc

    def entry_provenance(self, model_id: str, dataset_id: str, meta: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Where an entry's outputs come from (plain JSON): model id, dataset, checkpoint, preprocessing, store,
        item hash, rows, the entry's provenance and the head's. A detector fitted on them records it."""
        meta = self.meta(model_id, dataset_id) if meta is None else meta
        entry = dict(meta.get("provenance") or {})
        provenance: dict[str, Any] = {key: entry.get(key) for key in PROVENANCE_KEYS}
        provenance.update(
            {
                "model_id": model_id,
                "dataset": dataset_id,
                "store": str(self.root.resolve()),
                "item_hash": meta.get("item_hash"),
                "num_rows": meta.get("num_rows"),
                "entry_finished": meta.get("finished"),
                "entry_provenance": entry,
                "head": self.head_meta(model_id).get("provenance") if self.has_head(model_id) else None,
            }
        )
        return json.loads(json.dumps(provenance, default=str))

    def read_array(self, model_id: str, dataset_id: str, name: str, *, mmap: bool = True) -> np.ndarray:
        """One named array of a complete entry (e.g. ``index``)."""
        meta = self.meta(model_id, dataset_id)
        if name not in meta.get("arrays", {}):
            raise StoreError(
                f"store entry {model_id}/{dataset_id} has no array {name!r}; it has {sorted(meta.get('arrays', {}))}"
            )
        return self._load(model_id, dataset_id, name, meta["arrays"][name], mmap)

    def _load(self, model_id: str, dataset_id: str, name: str, spec: Mapping[str, Any], mmap: bool) -> np.ndarray:
        path = self.entry_path(model_id, dataset_id) / f"{name}.npy"
        try:
            array = np.load(path, mmap_mode="r" if mmap else None, allow_pickle=False)
        except (OSError, ValueError) as exc:
            raise StoreError(f"cannot read {path}: {exc}") from exc
        if list(array.shape) != list(spec["shape"]) or str(array.dtype) != spec["dtype"]:
            raise StoreError(
                f"{path} has shape {array.shape} dtype {array.dtype} but meta.json records {tuple(spec['shape'])} {spec['dtype']}: corrupt entry"
            )
        return array

    # ----------------------------------------------------------------- heads
    def write_head(self, model_id: str, head: Head, *, provenance: Mapping[str, Any]) -> Path:
        """Store the model's linear head (weight, bias) with its provenance."""
        path = self.root / _check_name("model id", model_id) / "head"
        atomic_save_npy(path / "weight.npy", np.asarray(head.weight))
        atomic_save_npy(path / "bias.npy", np.asarray(head.bias))
        atomic_write_json(
            path / "meta.json",
            {
                "format": FORMAT_VERSION,
                "model_id": model_id,
                "provenance": dict(provenance),
                "num_classes": head.num_classes,
                "num_features": head.num_features,
                "written": _now(),
                "versions": library_versions(),
            },
        )
        return path

    def has_head(self, model_id: str) -> bool:
        """True when a head is stored for the model."""
        return (self.root / _check_name("model id", model_id) / "head" / "meta.json").is_file()

    def read_head(self, model_id: str) -> Head:
        """The model's stored head."""
        path = self.root / _check_name("model id", model_id) / "head"
        meta = _read_json(path / "meta.json")
        if meta.get("model_id") != model_id:
            raise StoreError(f"{path} holds the head of {meta.get('model_id')!r}, not {model_id!r}")
        try:
            return Head(np.load(path / "weight.npy"), np.load(path / "bias.npy"))
        except (OSError, ValueError) as exc:
            raise StoreError(f"cannot read head of {model_id}: {exc}") from exc

    def head_meta(self, model_id: str) -> dict[str, Any]:
        """The stored head's meta.json."""
        return _read_json(self.root / _check_name("model id", model_id) / "head" / "meta.json")

    # ----------------------------------------------------------------- provenance
    def check_compatible(self, *entries: tuple[str, str]) -> None:
        """Raise StoreError unless all (model-id, dataset-id) entries come from the same checkpoint and preprocessing."""
        if len(entries) < 2:
            return
        reference_key = entries[0]
        reference = self.meta(*reference_key).get("provenance", {})
        for key in entries[1:]:
            other = self.meta(*key).get("provenance", {})
            for field in PROVENANCE_KEYS:
                if reference.get(field) != other.get(field):
                    raise StoreError(
                        f"mismatched model provenance: {reference_key[0]}/{reference_key[1]} has {field}={reference.get(field)!r} "
                        f"but {key[0]}/{key[1]} has {field}={other.get(field)!r}; ID and OOD sets of one evaluation must come "
                        "from the same checkpoint and preprocessing (re-extract one of them)"
                    )


class EntryWriter:
    """Writes one entry shard by shard; rerunning skips complete shards."""

    def __init__(
        self,
        store: Store,
        model_id: str,
        dataset_id: str,
        *,
        provenance: Mapping[str, Any],
        num_items: int,
        shard_size: int,
        item_hash: str | None,
    ) -> None:
        if num_items < 0:
            raise StoreError(f"num_items must be >= 0; got {num_items}")
        if shard_size <= 0:
            raise StoreError(f"shard_size must be positive; got {shard_size}")
        self.store, self.model_id, self.dataset_id = store, model_id, dataset_id
        self.path = store.entry_path(model_id, dataset_id)
        self.shard_dir = self.path / "shards"
        self.num_items, self.shard_size = int(num_items), int(shard_size)
        self.num_shards = max(1, -(-self.num_items // self.shard_size)) if self.num_items else 0
        self.meta: dict[str, Any] = {
            "format": FORMAT_VERSION,
            "model_id": model_id,
            "dataset_id": dataset_id,
            "provenance": json.loads(json.dumps(dict(provenance), default=str)),
            "item_hash": item_hash,
            "num_items": self.num_items,
            "shard_size": self.shard_size,
            "num_shards": self.num_shards,
            "complete": False,
        }
        meta_path = self.path / "meta.json"
        if meta_path.is_file():
            existing = store.meta(model_id, dataset_id)
            for key in ("provenance", "item_hash", "num_items", "shard_size"):
                if existing.get(key) != self.meta[key]:
                    raise StoreError(
                        f"store entry {model_id}/{dataset_id} was started with a different {key} "
                        f"({existing.get(key)!r} vs {self.meta[key]!r}); delete it or use another dataset id"
                    )
            self.meta = existing
        else:
            self.meta["started"] = _now()
            atomic_write_json(meta_path, self.meta)

    @property
    def complete(self) -> bool:
        """True once finalized."""
        return bool(self.meta.get("complete"))

    def shard_rows(self, shard: int) -> slice:
        """Item positions covered by a shard."""
        if not 0 <= shard < self.num_shards:
            raise StoreError(f"shard {shard} out of range [0, {self.num_shards})")
        return slice(shard * self.shard_size, min(self.num_items, (shard + 1) * self.shard_size))

    @staticmethod
    def _done_shards(shard_dir: Path) -> dict[int, dict[str, Any]]:
        done: dict[int, dict[str, Any]] = {}
        if not shard_dir.is_dir():
            return done
        for marker in shard_dir.glob("*.done.json"):
            try:
                record = json.loads(marker.read_text(encoding="utf-8"))
                shard = int(marker.name.split(".")[0])
            except (ValueError, json.JSONDecodeError):
                continue
            files_ok = all(
                (shard_dir / f"{name}.{shard:05d}.npy").is_file()
                and (shard_dir / f"{name}.{shard:05d}.npy").stat().st_size == spec["nbytes"]
                for name, spec in record["arrays"].items()
            )
            if files_ok:
                done[shard] = record
        return done

    def completed_shards(self) -> set[int]:
        """Shards whose marker and files are all present and of the recorded size."""
        if self.complete or self._merge_file.is_file():
            # Once finalize has drawn up its plan every shard is written (and may already be released).
            return set(range(self.num_shards))
        return set(self._done_shards(self.shard_dir))

    def pending_shards(self) -> list[int]:
        """Shards still to write, in order."""
        done = self.completed_shards()
        return [k for k in range(self.num_shards) if k not in done]

    def write_shard(
        self, shard: int, arrays: Mapping[str, np.ndarray], *, skipped: Iterable[Mapping[str, Any]] = ()
    ) -> None:
        """Atomically write one shard: every array file first, the done marker last."""
        if self.complete or self._merge_file.is_file():
            raise StoreError(f"store entry {self.model_id}/{self.dataset_id} is already finalized (or finalizing)")
        rows = self.shard_rows(shard)
        if "features" not in arrays:
            raise StoreError("a shard needs a 'features' array")
        n = int(np.asarray(arrays["features"]).shape[0])
        if n > rows.stop - rows.start:
            raise StoreError(f"shard {shard} covers {rows.stop - rows.start} items but got {n} rows")
        record: dict[str, Any] = {"rows": n, "arrays": {}, "skipped": list(skipped)}
        for name, value in arrays.items():
            if name != "features" and not name.startswith(_EXTRA) and name not in ("logits", "labels", "index"):
                raise StoreError(f"unknown array name {name!r}: use features, logits, labels, index or extra.<name>")
            array = np.asarray(value)
            if array.shape[:1] != (n,):
                raise StoreError(f"array {name!r} has {array.shape[:1]} rows but features has {n}")
            nbytes = atomic_save_npy(self.shard_dir / f"{name}.{shard:05d}.npy", array)
            record["arrays"][name] = {"shape": list(array.shape), "dtype": str(array.dtype), "nbytes": nbytes}
        atomic_write_json(self.shard_dir / f"{shard:05d}.done.json", record)

    def finalize(self, *, extra_meta: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Merge complete shards into one memory-mappable file per array and mark the entry complete.

        Disk: each shard file is deleted as soon as it is copied, so the entry never needs much more than its own
        size plus one shard. Kill-safe: ``shards/merge.json`` records the plan and how many shards of each array
        are copied (written after the copy is on disk, before the shard is deleted); a rerun resumes from it.
        """
        if self.complete:
            shutil.rmtree(self.shard_dir, ignore_errors=True)  # what a finalize killed after completing left
            return self.meta
        state = self._merge_state()
        _merge_step("planned")
        for name, spec in state["arrays"].items():
            self._merge(name, spec, state)
        plan = state["plan"]
        skipped = [item for k in range(self.num_shards) for item in plan[str(k)].get("skipped", [])]
        self.meta.update(
            {
                "arrays": {
                    name: {"shape": spec["shape"], "dtype": spec["dtype"]} for name, spec in state["arrays"].items()
                },
                "num_rows": sum(record["rows"] for record in plan.values()),
                "skipped": skipped,
                "complete": True,
                "finished": _now(),
                "versions": library_versions(),
            }
        )
        if extra_meta:
            self.meta.update(dict(extra_meta))
        _merge_step("merged")
        atomic_write_json(self.path / "meta.json", self.meta)
        _merge_step("completed")
        shutil.rmtree(self.shard_dir, ignore_errors=True)
        return self.meta

    @property
    def _merge_file(self) -> Path:
        return self.shard_dir / _MERGE_STATE

    def _merge_state(self) -> dict[str, Any]:
        """The merge plan and progress: resumed from merge.json, or drawn up from the complete shards."""
        if self._merge_file.is_file():
            return _read_json(self._merge_file)
        done = self._done_shards(self.shard_dir)
        missing = [k for k in range(self.num_shards) if k not in done]
        if missing:
            raise StoreError(
                f"cannot finalize {self.model_id}/{self.dataset_id}: shards {missing[:10]} are not written"
            )
        names = sorted({name for record in done.values() for name in record["arrays"]})
        total_rows = sum(record["rows"] for record in done.values())
        arrays: dict[str, Any] = {}
        for name in names:
            shapes = [done[k]["arrays"].get(name) for k in range(self.num_shards)]
            if any(spec is None for spec in shapes):
                raise StoreError(f"array {name!r} is missing from some shards of {self.model_id}/{self.dataset_id}")
            tails = {tuple(spec["shape"][1:]) for spec in shapes}
            dtypes = {spec["dtype"] for spec in shapes}
            if len(tails) != 1 or len(dtypes) != 1:
                raise StoreError(f"array {name!r} changes shape or dtype across shards: {tails} {dtypes}")
            arrays[name] = {"shape": [total_rows, *tails.pop()], "dtype": dtypes.pop(), "copied": 0}
        state = {"plan": {str(k): record for k, record in done.items()}, "arrays": arrays}
        atomic_write_json(self._merge_file, state)
        return state

    def _merge(self, name: str, spec: dict[str, Any], state: dict[str, Any]) -> None:
        """Append the shards of one array to `.<name>.npy.partial`, releasing each; rename it when complete.

        Steps per shard: copy its rows (truncating first whatever an interrupted copy left), fsync, record the
        count in merge.json, delete the shard file. A kill between any two steps leaves a state that the next
        run recognises: the file beyond the recorded count is cut off and copied again.
        """
        final, partial = self.path / f"{name}.npy", self.path / f".{name}.npy.partial"
        if spec["copied"] == self.num_shards and final.is_file() and not partial.exists():
            return
        dtype, shape = np.dtype(spec["dtype"]), tuple(spec["shape"])
        row_bytes = dtype.itemsize * int(np.prod(shape[1:], dtype=np.int64))
        plan = state["plan"]
        if spec["copied"] and not partial.exists():
            raise StoreError(
                f"finalizing {self.model_id}/{self.dataset_id}: {partial.name} is gone but {spec['copied']} of its "
                "shards were already released; delete the entry and extract it again"
            )
        for shard in range(spec["copied"]):  # copied and recorded, but a kill came before their release
            (self.shard_dir / f"{name}.{shard:05d}.npy").unlink(missing_ok=True)
        with open(partial, "r+b" if partial.exists() else "w+b") as handle:
            handle.seek(0)
            np.lib.format.write_array_header_1_0(
                handle, {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False, "shape": shape}
            )
            header = handle.tell()
            rows_done = sum(plan[str(k)]["rows"] for k in range(spec["copied"]))
            handle.truncate(header + rows_done * row_bytes)
            for shard in range(spec["copied"], self.num_shards):
                source = self.shard_dir / f"{name}.{shard:05d}.npy"
                part = np.load(source, mmap_mode="r")
                handle.seek(header + rows_done * row_bytes)
                step = max(1, _COPY_BYTES // max(1, row_bytes))
                for start in range(0, part.shape[0], step):
                    handle.write(memoryview(np.ascontiguousarray(part[start : start + step])).cast("B"))
                del part
                handle.flush()
                os.fsync(handle.fileno())
                rows_done += plan[str(shard)]["rows"]
                _merge_step(f"copied {name} {shard}")
                spec["copied"] = shard + 1
                atomic_write_json(self._merge_file, state)
                _merge_step(f"recorded {name} {shard}")
                source.unlink(missing_ok=True)
                _merge_step(f"released {name} {shard}")
        os.replace(partial, final)
        _merge_step(f"renamed {name}")


# The merge's progress record inside the shard directory, and the bytes copied per write.
_MERGE_STATE = "merge.json"
_COPY_BYTES = 64 * 2**20


def _merge_step(step: str) -> None:
    """Hook between the merge's durable steps (tests inject failures here to check every interruption resumes)."""
