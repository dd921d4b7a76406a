"""A run's provenance as a typed record (what run.json says about it), and the report tables that show it.

`RunProvenance.from_run` is the one place that reads run.json's provenance fields; every value that run.json does
not record is None (or empty) in the record, and `shown` is the one place that renders such a value (as `MISSING`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..analysis.rundata import RunData
from ..core.tabular import Cell, Table

__all__ = [
    "MISSING",
    "EntryProvenance",
    "RunProvenance",
    "plain_text",
    "provenance_tables",
    "report_versions",
    "shown",
    "slug",
]

MISSING = "–"  # what a table cell shows for a value that run.json does not record


def slug(text: str) -> str:
    """`text` with every character but letters, digits and ``-_.`` replaced by ``-`` (for file names and anchors)."""
    return "".join(ch if ch.isalnum() or ch in "-_." else "-" for ch in text)


def plain_text(value: object) -> str:
    """A provenance value as reading text: nested mappings as `key: value` pairs, lists comma-separated.

    Never a Python repr: `{'input': '8x8'}` reads as `input: 8x8`, and a nested `{'sizes': {'fit': 650}}` as
    `sizes: (fit: 650)`.
    """
    if isinstance(value, Mapping):
        return "; ".join(f"{k}: {_nested(v)}" for k, v in value.items()) or MISSING
    if isinstance(value, (list, tuple)):
        return ", ".join(plain_text(v) for v in value) or MISSING
    return MISSING if value is None else str(value)


def _nested(value: object) -> str:
    if isinstance(value, Mapping) and value:
        return "(" + ", ".join(f"{k}: {_nested(v)}" for k, v in value.items()) + ")"
    return plain_text(value)


def shown(value: object) -> str:
    """A record's value as table text: `MISSING` for an unrecorded one (None or empty), else `plain_text`."""
    return MISSING if value is None or value == "" else plain_text(value)


def _mapping(value: object) -> Mapping[str, Any]:
    # run.json writes null or omits a key for "nothing recorded"; either reads as an empty mapping.
    return value if isinstance(value, Mapping) else {}


def _versions(value: object) -> dict[str, str]:
    return {str(lib): str(version) for lib, version in _mapping(value).items()}


@dataclass(frozen=True)
class EntryProvenance:
    """One store entry a run read: its dataset, size, hash, provenance and the libraries that extracted it."""

    dataset: str
    rows: int | None  # images in the entry
    item_hash: str | None  # SHA-256 over the entry's item names
    model: object  # the extracting model's name, as the store recorded it
    checkpoint: object  # its checkpoint (a tag, a hash or a mapping)
    preprocessing: object  # the image preprocessing (text or a mapping)
    finished: str | None  # when extraction finished (ISO 8601)
    versions: Mapping[str, str]  # library -> version at extraction

    @classmethod
    def from_meta(cls, dataset: str, meta: object) -> EntryProvenance:
        """The record of run.json's ``entries[dataset]``."""
        meta = _mapping(meta)
        prov = _mapping(meta.get("provenance"))
        return cls(
            dataset=dataset,
            rows=meta.get("num_rows"),
            item_hash=meta.get("item_hash"),
            model=prov.get("model"),
            checkpoint=prov.get("checkpoint"),
            preprocessing=prov.get("preprocessing"),
            finished=meta.get("finished"),
            versions=_versions(meta.get("versions")),
        )

    def cells(self) -> tuple[Cell, ...]:
        """The entry's row of the store-entries table."""
        values = (self.rows, self.item_hash, self.model, self.checkpoint, self.preprocessing, self.finished)
        return (Cell(self.dataset), *(Cell(shown(v)) for v in values))


@dataclass(frozen=True)
class RunProvenance:
    """What a run's run.json records about it; None (or empty) where it records nothing."""

    path: Path  # the run directory
    recorded: bool  # whether the run has a run.json at all (a bare results file has none)
    zeroshot: bool  # a zero-shot run (else supervised)
    model: str | None
    store: str | None  # the feature store's root
    fit_dataset: str | None  # the set detectors were fitted on (zero-shot runs have none)
    id_dataset: str | None
    ood_datasets: tuple[str, ...]
    head: Mapping[str, Any]  # the classifier head's provenance (checkpoint, preprocessing, ...)
    head_versions: Mapping[str, str]  # library -> version when the head was written
    complete: bool | None  # whether every planned (detector, OOD set) finished
    detectors: Mapping[str, Mapping[str, Any]]  # detector -> its parameters, in the run's order
    skipped: Mapping[str, object]  # detector -> why the run skipped it
    entries: tuple[EntryProvenance, ...]  # the store entries the run read

    @classmethod
    def from_run(cls, run: RunData) -> RunProvenance:
        """The record of a loaded run (its run.json, as `RunData.info`)."""
        info = run.info
        head = _mapping(info.get("head"))
        return cls(
            path=run.path,
            recorded=bool(info),
            zeroshot=run.is_zeroshot,
            model=info.get("model"),
            store=info.get("store"),
            fit_dataset=info.get("fit_dataset"),
            id_dataset=info.get("id_dataset"),
            ood_datasets=tuple(info.get("ood_datasets") or ()),
            head=_mapping(head.get("provenance")),
            head_versions=_versions(head.get("versions")),
            complete=info.get("complete"),
            detectors={name: _mapping(params) for name, params in _mapping(info.get("detectors")).items()},
            skipped=dict(_mapping(info.get("skipped_detectors"))),
            entries=tuple(EntryProvenance.from_meta(d, m) for d, m in _mapping(info.get("entries")).items()),
        )

    @property
    def key(self) -> str:
        """The run's part of its tables' keys: the run directory's name."""
        return slug(self.path.name or "run")

    def detector_text(self) -> str:
        """The detectors with their parameters, e.g. ``msp, energy(temperature=2)``."""
        return ", ".join(
            f"{name}({', '.join(f'{k}={plain_text(v)}' for k, v in params.items())})" if params else name
            for name, params in self.detectors.items()
        )

    def settings(self) -> dict[str, str]:
        """What the run was evaluated with, flattened (each detector's parameters, fit set, head, store); unrecorded
        values are empty strings, so that runs compare field by field."""
        flat = {
            name: ", ".join(f"{k}={plain_text(v)}" for k, v in sorted(params.items()))
            for name, params in self.detectors.items()
        }
        flat["fit set"] = str(self.fit_dataset or "")
        flat["head"] = plain_text(dict(sorted(self.head.items()))) if self.head else ""
        flat["store"] = str(self.store or "")
        return flat

    def library_versions(self) -> dict[str, list[str]]:
        """Library -> the versions (sorted) that extracted the run's entries or wrote its head."""
        versions: dict[str, set[str]] = {}
        for mapping in [*(entry.versions for entry in self.entries), self.head_versions]:
            for lib, version in mapping.items():
                versions.setdefault(lib, set()).add(version)
        return {lib: sorted(v) for lib, v in sorted(versions.items())}


def _item_table(key: str, title: str, items: list[tuple[str, str]]) -> Table:
    return Table(
        key, title, ("item", "value"), tuple((Cell(k), Cell(v)) for k, v in items), align=("l", "l"), wrap=True
    )


def _run_table(record: RunProvenance) -> Table:
    """The run's description: model, directory, kind, store, datasets, head, detectors."""
    items = [
        ("model", shown(record.model)),
        ("run directory", str(record.path)),
        ("kind", "zero-shot" if record.zeroshot else "supervised"),
        ("store", shown(record.store)),
        ("fit set", shown(record.fit_dataset)),
        ("ID test set", shown(record.id_dataset)),
        ("OOD sets", shown(", ".join(record.ood_datasets))),
        ("head", shown(record.head)),
        ("complete", shown(record.complete)),
        ("detectors", shown(record.detector_text())),
    ]
    items += [(f"skipped {name}", plain_text(reason)) for name, reason in record.skipped.items()]
    return _item_table(f"prov-{record.key}", f"Run: {record.model or record.path.name}", items)


def provenance_tables(run: RunData) -> list[Table]:
    """The run's description (datasets, detectors), its store entries' provenance and the library versions."""
    record = RunProvenance.from_run(run)
    if not record.recorded:
        return [_item_table(f"prov-{record.key}", f"Run {run.path}", [("run.json", "absent: no provenance recorded")])]
    result = [_run_table(record)]
    if record.entries:
        result.append(
            Table(
                f"entries-{record.key}",
                "Store entries (dataset hashes, checkpoints)",
                ("dataset", "rows", "item hash (SHA-256)", "model", "checkpoint", "preprocessing", "extracted"),
                tuple(entry.cells() for entry in record.entries),
                align=("l", "r", "l", "l", "l", "l", "l"),
                wrap=True,
            )
        )
        versions = record.library_versions()
        if versions:
            result.append(
                Table(
                    f"versions-{record.key}",
                    "Library versions at extraction",
                    ("library", "version"),
                    tuple((Cell(lib), Cell(", ".join(v))) for lib, v in versions.items()),
                )
            )
    return result


def report_versions() -> Table:
    """The library versions that made this report."""
    import platform

    import matplotlib
    import scipy

    from .. import __version__

    items = [
        ("python", platform.python_version()),
        ("oodbench", __version__),
        ("numpy", np.__version__),
        ("scipy", scipy.__version__),
        ("matplotlib", matplotlib.__version__),
    ]
    return Table(
        "versions-report",
        "Library versions of this report",
        ("library", "version"),
        tuple((Cell(k), Cell(v)) for k, v in items),
    )
