"""The evaluation run directory, and its one owner: `RunDir` writes and reads every file in it.

Layout (the same for `oodbench evaluate`, zero-shot evaluation and each model of `oodbench run`)::

    <run>/results.parquet              tidy rows (`results.ResultRow`), one per (model, ID, OOD, detector, metric)
    <run>/scores/<model>/<dataset>.npz per-image scores, one array per detector
    <run>/table.md                     the rendered detector table
    <run>/run.json                     what was evaluated: datasets, detectors and parameters, store provenance,
                                       ``score_keys`` (the content key of each detector's saved scores),
                                       ``complete``; ``"kind": "zeroshot"`` for zero-shot runs
    <run>/verified.json                the store entries (and head) whose every byte was checked against their
                                       checksums for this run, with a seal of what was checked

Before the first evaluation into a directory reads the store, `RunDir.verify_store` checks the entries
against their checksums; later runs into the same directory check again only what changed since.

Writes are atomic. Scores are saved as each detector finishes and ``run.json`` records their keys, so a rerun
with the same inputs resumes from the saved scores (`RunDir.resume`); results and the table are written last.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..util.atomic import atomic_write_json, atomic_write_text, read_regular, unwritable
from ..util.progress import progress_bar
from ..util.schema import ListOf, MapOf, Nullable, Record, SchemaError, Str, validate
from .errors import RunDirError, StoreError
from .results import ResultRow, read_rows, write_rows
from .scores import list_scores, load_scores, save_scores, score_path
from .store import Store, Verification

__all__ = ["RunDir", "RESULTS", "INFO", "TABLE", "VERIFIED", "RUN_KINDS"]

RESULTS, INFO, TABLE, VERIFIED = "results.parquet", "run.json", "table.md", "verified.json"
RUN_KINDS = ("supervised", "zeroshot")  # run.json "kind"; absent means supervised (`oodbench evaluate`)
# The fields of run.json that oodbench reads back (others are descriptive and read defensively).
_INFO_SCHEMA = Record(
    {},
    {
        "kind": Nullable(Str("supervised|zeroshot")),
        "model": Nullable(str),
        "store": Nullable(str),
        "fit_dataset": Nullable(str),
        "id_dataset": Nullable(str),
        "csid_datasets": ListOf(str),
        "ood_datasets": ListOf(str),
        "detectors": MapOf(dict),
        "skipped_detectors": dict,
        "failed_detectors": dict,
        "adapted_parameters": dict,
        "score_keys": MapOf(str),
        "head": Nullable(dict),
        "entries": MapOf(dict),
        "complete": bool,
    },
    open=True,
)
_VERIFIED_SCHEMA = MapOf(Record({"seal": Str("[0-9a-f]{32}")}, {"seconds": float}, open=True))
_JSON_LIMIT = 64 * 2**20


class RunDir:
    """One evaluation run directory (see the module docstring for its files)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        # What verify_store checked, written with the run description (nothing is written before the run's own
        # checks have passed and its first result exists).
        self._verified: dict[str, Any] | None = None

    def __repr__(self) -> str:
        return f"RunDir({str(self.path)!r})"

    # ------------------------------------------------------------------ paths
    @property
    def results_path(self) -> Path:
        """The tidy result rows."""
        return self.path / RESULTS

    @property
    def info_path(self) -> Path:
        """The run description (run.json)."""
        return self.path / INFO

    @property
    def table_path(self) -> Path:
        """The rendered detector table."""
        return self.path / TABLE

    def score_path(self, model: str, dataset: str) -> Path:
        """Where the per-image scores of one (model, dataset) live."""
        return score_path(self.path, model, dataset)

    # ------------------------------------------------------------------ checks
    def check_writable(self, what: str = "--out") -> None:
        """Raise (naming `what`) when the directory cannot be created or written; creates nothing."""
        problem = unwritable(self.path)
        if problem is not None:
            raise RunDirError(f"{what}: {problem}")

    def check_readable(self) -> None:
        """Raise unless this is a run directory with results (the message says how to make one)."""
        if not self.path.is_dir():
            what = "is a file, not a run directory" if self.path.exists() else "does not exist"
            raise RunDirError(f"{self.path} {what}")
        if not self.results_path.is_file():
            raise RunDirError(
                f"{self.path} is not an evaluation run directory: it has no {RESULTS} "
                f"(create one with `oodbench evaluate --out {self.path}`)"
            )

    # ------------------------------------------------------------------ run.json
    def read_info(self) -> dict[str, Any]:
        """The run description ({} when there is none); a RunDirError when it is not a JSON object."""
        if not os.path.lexists(self.info_path):
            return {}
        try:
            info = json.loads(read_regular(self.info_path, _JSON_LIMIT).decode("utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
            raise RunDirError(f"{self.info_path} is not valid JSON: {exc}") from None
        except OSError as exc:
            raise RunDirError(f"cannot read {self.info_path}: {exc.strerror or exc}") from None
        if not isinstance(info, dict):
            raise RunDirError(f"{self.info_path} must hold a JSON object, not {type(info).__name__}")
        kind = info.get("kind")
        if kind not in (None, *RUN_KINDS):
            raise RunDirError(f"{self.info_path}: unknown run kind {kind!r}; expected one of {', '.join(RUN_KINDS)}")
        try:
            validate(_INFO_SCHEMA, info)
        except SchemaError as exc:
            raise RunDirError(f"{self.info_path} is damaged: {exc}"[:500]) from None
        return info

    def write_info(self, info: Mapping[str, Any]) -> None:
        """Write the run description atomically (and the record of the store entries verified for it)."""
        if self._verified is not None:
            atomic_write_json(self.path / VERIFIED, self._verified)
            self._verified = None
        atomic_write_json(self.info_path, dict(info))

    # ------------------------------------------------------------------ store verification
    def verify_store(
        self, store: Store, model: str, datasets: Sequence[str], *, force: bool = False, progress: bool = False
    ) -> str:
        """Check every byte of the entries (and head) this run reads, once per run directory; the summary line.

        ``verified.json`` records a seal of each verified entry (its checksums and when it was finished); an entry
        whose seal is unchanged is not hashed again unless `force`. Raises StoreError naming the first damage.
        The record is written with the next `write_info`, so a run refused before its first result writes nothing.
        """
        record = self._read_verified()
        # Stamps (size, mtime, inode) are taken before hashing: a file changed during or after the check is
        # verified again next time.
        seals = {f"{model}/{name}": _seal(store.meta(model, name), store.file_stamps(model, name)) for name in datasets}
        if store.has_head(model):
            seals[f"{model}/head"] = _seal(store.head_meta(model), store.file_stamps(model, "head"))
        todo = [key for key, seal in seals.items() if force or record.get(key, {}).get("seal") != seal]
        if not todo:
            return f"store entries already verified for this run directory ({len(seals)} checked before)"
        started = time.perf_counter()
        results: list[Verification] = []
        total = sum(_entry_bytes(store, model, key.split("/", 1)[1]) for key in todo)
        with progress_bar(progress, rate_unit="MB", transient=True) as bar:
            task = bar.add_task("verifying store entries (MB)", total=round(total / 1e6, 1))
            for key in todo:
                name = key.split("/", 1)[1]
                advance = lambda n: bar.advance(task, n / 1e6)  # noqa: E731
                result = (
                    store.verify_head(model, advance=advance)
                    if name == "head"
                    else store.verify(model, name, advance=advance)
                )
                results.append(result)
                if result.problems:
                    break
        for result in results:
            if result.problems:
                raise StoreError(
                    f"store entry {result.entry} is damaged: {result.problems[0]}"
                    + (f" (and {len(result.problems) - 1} more)" if len(result.problems) > 1 else "")
                    + f"; {store.damage_remedy}"
                )
        seconds = time.perf_counter() - started
        for key in todo:
            record[key] = {"seal": seals[key], "seconds": round(seconds, 3)}
        self._verified = record  # written with run.json, once the run has something to describe
        nbytes = sum(r.nbytes for r in results)
        legacy = [r.entry for r in results if not r.checksums]
        note = (
            f"; {len(legacy)} written without checksums (sizes, headers and shapes checked only; re-extract "
            f"to add them): {', '.join(legacy)}"
            if legacy
            else ""
        )
        return f"verified {len(results)} store entries ({nbytes / 1e6:,.1f} MB) against their checksums in {seconds:.2f} s{note}"

    def _read_verified(self) -> dict[str, Any]:
        """verified.json ({} when absent or unreadable: then everything is verified again)."""
        try:
            record = json.loads(read_regular(self.path / VERIFIED, _JSON_LIMIT).decode("utf-8"))
            return validate(_VERIFIED_SCHEMA, record)
        except (OSError, ValueError, RecursionError):  # SchemaError is a ValueError
            return {}

    # ------------------------------------------------------------------ scores
    def has_scores(self, model: str, dataset: str) -> bool:
        """Whether per-image scores of (model, dataset) were saved."""
        # Anything planted there counts, so that loading refuses a link, a FIFO or a directory in one line
        # rather than the run skipping (or silently recomputing over) it.
        return os.path.lexists(self.score_path(model, dataset))

    def load_scores(self, model: str, dataset: str) -> dict[str, np.ndarray]:
        """{detector: per-image scores} of one (model, dataset)."""
        return load_scores(self.path, model, dataset)

    def save_scores(self, model: str, dataset: str, scores: Mapping[str, np.ndarray], *, replace: bool = False) -> Path:
        """Save {detector: scores}, merged with those already saved (or replacing them)."""
        return save_scores(self.path, model, dataset, scores, replace=replace)

    def list_scores(self) -> list[tuple[str, str]]:
        """(model, dataset) pairs with saved scores."""
        return list_scores(self.path)

    def resume(
        self, model: str, datasets: Sequence[str], keys: Mapping[str, str]
    ) -> tuple[dict[str, dict[str, np.ndarray]], dict[str, str]]:
        """Saved scores that a rerun may reuse: those whose recorded key equals `keys[detector]`.

        Returns ({dataset: {detector: scores}}, {detector: key} of the detectors saved for every dataset).
        """
        recorded = self.read_info().get("score_keys", {}) if self.info_path.is_file() else {}
        reusable = {d for d, key in keys.items() if recorded.get(d) == key}
        cached: dict[str, dict[str, np.ndarray]] = {}
        for dataset in datasets:
            if self.has_scores(model, dataset):
                cached[dataset] = {d: s for d, s in self.load_scores(model, dataset).items() if d in reusable}
        done = {d: keys[d] for d in reusable if all(d in cached.get(ds, {}) for ds in datasets)}
        return cached, done

    # ------------------------------------------------------------------ results
    def write_results(
        self,
        model: str,
        rows: Iterable[ResultRow],
        scores: Mapping[str, Mapping[str, np.ndarray]],
        table_markdown: str,
    ) -> None:
        """The finished run: every dataset's scores (exactly these detectors), the rows and the table."""
        # Replaced, not merged: scores of detectors dropped since an earlier run in the same directory must not
        # leak into analyses that read every saved score.
        for dataset, per_detector in scores.items():
            if per_detector:
                self.save_scores(model, dataset, per_detector, replace=True)
        write_rows(rows, self.results_path)
        atomic_write_text(self.table_path, table_markdown)

    def read_rows(self) -> list[ResultRow]:
        """The tidy result rows (a RunDirError when there are none)."""
        self.check_readable()
        rows = read_rows(self.results_path)
        if not rows:
            raise RunDirError(f"{self.results_path} holds no result rows")
        return rows


def _seal(meta: Mapping[str, Any], stamps: Sequence[Sequence[Any]]) -> str:
    """What identifies a verified store entry or head: its recorded arrays and checksums, when it was written, and
    each array file's size, modification time and inode (a file changed since it was verified gets a new seal)."""
    fields = [meta.get(key) for key in ("arrays", "checksum_rows", "finished", "written")] + [list(stamps)]
    return hashlib.sha256(json.dumps(fields, sort_keys=True, default=str).encode()).hexdigest()[:32]


def _entry_bytes(store: Store, model: str, name: str) -> int:
    """Bytes of an entry's (or the head's) array files: the work of verifying it."""
    folder = store.root / model / name
    return sum(p.stat().st_size for p in folder.glob("*.npy"))
