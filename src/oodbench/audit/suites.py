"""Suite manifests: the OOD classes of published near-OOD suites (WordNet ids or names), shipped as package data.

Each manifest records where its list came from (repository, commit, path, licence, how it was derived); see
``oodbench/data/suites/SOURCES.md``. ``kind`` is ``wordnet`` (OOD classes as WordNet ids), ``names`` (only
class names are published) or ``unavailable`` (no OOD class list exists; the manifest says why).
"""

from __future__ import annotations

import importlib.resources
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..core.errors import AuditError
from .wordnet import WNID

__all__ = ["SuiteManifest", "shipped_suites", "load_suite", "load_suites", "KINDS"]

KINDS = ("wordnet", "names", "unavailable")
_PACKAGE_DIR = ("data", "suites")


@dataclass(frozen=True)
class SuiteManifest:
    """One suite's OOD class list and its provenance."""

    name: str
    title: str
    paper: str
    url: str
    kind: str
    id_label_space: str
    ood_wnids: tuple[str, ...] = ()
    ood_names: tuple[str, ...] = ()
    id_wnids: tuple[str, ...] = ()
    annotations: Mapping[str, Any] = field(default_factory=dict)
    source: Mapping[str, Any] = field(default_factory=dict)
    notes: str = ""

    @property
    def available(self) -> bool:
        """False when no OOD class list exists for this suite."""
        return self.kind != "unavailable"

    @property
    def num_classes(self) -> int:
        """Number of OOD classes listed."""
        return len(self.ood_wnids) + len(self.ood_names)


def _suite_dir() -> Any:
    return importlib.resources.files("oodbench").joinpath(*_PACKAGE_DIR)


def shipped_suites() -> list[str]:
    """Names of the suite manifests shipped with oodbench, sorted."""
    return sorted(entry.name[:-5] for entry in _suite_dir().iterdir() if entry.name.endswith(".json"))


def _parse(data: Mapping[str, Any], origin: str) -> SuiteManifest:
    if data.get("schema") != 1:
        raise AuditError(f"{origin}: unsupported manifest schema {data.get('schema')!r} (expected 1)")
    missing = [key for key in ("name", "title", "kind", "source") if key not in data]
    if missing:
        raise AuditError(f"{origin}: manifest lacks {', '.join(missing)}")
    kind = data["kind"]
    if kind not in KINDS:
        raise AuditError(f"{origin}: kind must be one of {', '.join(KINDS)}; got {kind!r}")
    wnids = tuple(data.get("ood_wnids") or ())
    names = tuple(data.get("ood_names") or ())
    id_wnids = tuple(data.get("id_wnids") or ())
    bad = [w for w in (*wnids, *id_wnids) if not WNID.match(str(w))]
    if bad:
        raise AuditError(f"{origin}: not WordNet noun ids: {', '.join(map(str, bad[:5]))}")
    if kind == "wordnet" and not wnids:
        raise AuditError(f"{origin}: kind 'wordnet' needs a non-empty ood_wnids list")
    if kind == "names" and not names:
        raise AuditError(f"{origin}: kind 'names' needs a non-empty ood_names list")
    if kind == "unavailable" and (wnids or names):
        raise AuditError(f"{origin}: kind 'unavailable' must not list OOD classes")
    if len(set(wnids)) != len(wnids):
        raise AuditError(f"{origin}: ood_wnids has duplicates")
    return SuiteManifest(
        name=str(data["name"]),
        title=str(data["title"]),
        paper=str(data.get("paper", "")),
        url=str(data.get("url", "")),
        kind=kind,
        id_label_space=str(data.get("id_label_space", "")),
        ood_wnids=wnids,
        ood_names=names,
        id_wnids=id_wnids,
        annotations=dict(data.get("annotations") or {}),
        source=dict(data["source"]),
        notes=str(data.get("notes", "")),
    )


def load_suite(name_or_path: str | os.PathLike[str]) -> SuiteManifest:
    """A shipped manifest by name (e.g. 'ssb-hard') or a manifest JSON file by path."""
    key = str(name_or_path)
    path = Path(key)
    if key.endswith(".json") and path.is_file():
        text, origin = path.read_text(encoding="utf-8"), str(path)
    else:
        entry = _suite_dir() / f"{key}.json"
        if not entry.is_file():
            raise AuditError(
                f"no suite manifest {key!r}; shipped: {', '.join(shipped_suites())} (or give a .json path)"
            )
        text, origin = entry.read_text(encoding="utf-8"), f"suite {key}"
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise AuditError(f"{origin}: invalid JSON: {exc}") from exc
    return _parse(data, origin)


def load_suites(names: list[str] | None = None) -> list[SuiteManifest]:
    """The named manifests (all shipped ones when None)."""
    return [load_suite(name) for name in (names or shipped_suites())]
