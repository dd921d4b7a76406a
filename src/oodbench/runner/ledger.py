"""The runner's record of finished units: one small JSON file per unit, written last and atomically.

A unit counts as done only when its record exists, carries the unit's current content key, and the outputs
it lists still verify (the plan checks them). A record is written after the unit's outputs, so a run killed
mid-unit leaves no record and the unit is redone; a record whose key differs (the config changed) marks the
unit stale.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..util.atomic import atomic_write_json

__all__ = ["Ledger", "content_key", "FORMAT"]

# Bumped when the runner's unit outputs change meaning, so every old record turns stale.
FORMAT = 1


def content_key(*parts: Any) -> str:
    """16-hex SHA-256 of the canonical JSON of `parts` (the identity of a unit's inputs)."""
    payload = json.dumps([FORMAT, *parts], sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()[:16]


class Ledger:
    """Unit records under ``<workdir>/ledger/<stage>/<label path>.json``."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)

    def path(self, stage: str, label: str) -> Path:
        """Where the record of one unit lives (its label's parts become folders)."""
        return self.root / stage / f"{label}.json"

    def read(self, stage: str, label: str) -> dict[str, Any] | None:
        """The unit's record, or None (absent or unreadable, which counts as not done)."""
        path = self.path(stage, label)
        try:
            return json.loads(path.read_text(encoding="utf-8"))
        except (FileNotFoundError, json.JSONDecodeError, UnicodeDecodeError):
            return None

    def write(self, stage: str, label: str, key: str, **details: Any) -> dict[str, Any]:
        """Record the unit as done with `key` and its details (output fingerprints, skip reasons, ...)."""
        record = {
            "stage": stage,
            "unit": label,
            "key": key,
            "finished": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
            **details,
        }
        atomic_write_json(self.path(stage, label), record)
        return record

    def done(self, stage: str, label: str, key: str) -> Mapping[str, Any] | None:
        """The record when it carries `key`, else None."""
        record = self.read(stage, label)
        return record if record is not None and record.get("key") == key else None
