"""Export of a construction project: file lists `oodbench extract` reads, manifests, statistics.

Everything is recomputed by replaying the event log, never read from the cached status column.
Files written into the output folder (each atomically):

    <name>.csv            verified OOD images as an extract file list: `path,label` with empty labels
    <name>-id.csv         images returned to ID: `path,label` with the agreed class index
    ood_manifest.csv      verified OOD: key, path, OOD label, concept, fine-grained, original label, flags, …
    ambiguous.csv         images left ambiguous, with the reason
    manifest.csv / .json  every candidate with its status and outcome (JSON also holds stats and file names)
    stats.json / stats.md outcome counts and percentages overall and per source flag
    events.jsonl          the complete append-only event log (who, what, when)
"""

from __future__ import annotations

import csv
import io
import json
import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ..core.errors import AnnotateError
from ..util.atomic import atomic_write_text
from .project import Project
from .protocol import Outcome, Status, Verdict
from .stats import outcome_stats, stats_markdown

FORMAT = "oodbench-construct-manifest/1"
MANIFEST_COLUMNS = (
    "key",
    "path",
    "status",
    "verdict",
    "ood_label",
    "ood_concept",
    "class_index",
    "class_name",
    "reason",
    "fine_grained",
    "original_label",
    "original_label_name",
    "flags",
    "decided_in",
    "annotators",
)
OOD_COLUMNS = (
    "key",
    "path",
    "ood_label",
    "ood_concept",
    "fine_grained",
    "original_label",
    "original_label_name",
    "flags",
    "decided_in",
    "annotators",
)
AMBIGUOUS_COLUMNS = ("key", "path", "reason", "original_label", "original_label_name", "flags", "decided_in")


def _csv(rows: list[dict[str, Any]], columns: tuple[str, ...]) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=columns, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: ("" if row.get(k) is None else row[k]) for k in columns})
    return buffer.getvalue()


def _row(project: Project, image: Any, outcome: Outcome, path: str) -> dict[str, Any]:
    final = outcome.status is Status.FINAL
    verdict = outcome.verdict if final else None
    names = project.classes
    return {
        "key": image.key,
        "path": path,
        "status": outcome.status.value,
        "verdict": verdict.value if verdict else None,
        "ood_label": outcome.label if verdict is Verdict.OOD else None,
        "ood_concept": outcome.concept if verdict is Verdict.OOD else None,
        "class_index": outcome.class_index if verdict is Verdict.ID else None,
        "class_name": names.name(outcome.class_index) if verdict is Verdict.ID else None,
        "reason": outcome.reason if verdict is Verdict.AMBIGUOUS else None,
        "fine_grained": int(outcome.fine_grained) if final else None,
        "original_label": image.original_label,
        "original_label_name": names.name(image.original_label),
        "flags": ";".join(image.flags),
        "decided_in": outcome.decided_in,
        "annotators": ";".join(outcome.annotators) if final else None,
    }


def export(project: Project, out_dir: str | Path, *, name: str = "ood", relative: bool = False) -> dict[str, Any]:
    """Write the benchmark files of a project; returns the JSON manifest (with statistics).

    Paths in file lists are absolute unless `relative`, in which case they are relative to the
    output folder (extract resolves list paths against the list's folder).
    """
    if not name or "/" in name or name.startswith("."):
        raise AnnotateError(f"invalid export name {name!r}: use a plain file stem such as 'fi-imagenet-1k'")
    out = Path(out_dir).absolute()
    store = project.store()
    images = store.images()
    outcomes = store.replay_all()
    rows: list[dict[str, Any]] = []
    missing: list[str] = []
    for image in images:
        file = project.image_file(image)
        if file is None:
            missing.append(image.key)
            continue
        path = Path(os.path.relpath(file, out)).as_posix() if relative else str(file)
        rows.append(_row(project, image, outcomes[image.id], path))
    if missing:
        raise AnnotateError(
            f"{len(missing)} image file(s) are no longer inside their roots (e.g. {', '.join(missing[:3])}); "
            "fix the image roots in project.json before exporting"
        )
    ood = [r for r in rows if r["verdict"] == Verdict.OOD.value]
    returned = [r for r in rows if r["verdict"] == Verdict.ID.value]
    ambiguous = [r for r in rows if r["verdict"] == Verdict.AMBIGUOUS.value]
    stats = outcome_stats(images, outcomes, project.classes.names)
    files = {
        "ood_list": f"{name}.csv",
        "id_list": f"{name}-id.csv",
        "ood_manifest": "ood_manifest.csv",
        "ambiguous": "ambiguous.csv",
        "manifest_csv": "manifest.csv",
        "stats_json": "stats.json",
        "stats_md": "stats.md",
        "events": "events.jsonl",
    }
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(
        out / files["ood_list"], _csv([{"path": r["path"], "label": None} for r in ood], ("path", "label"))
    )
    atomic_write_text(
        out / files["id_list"],
        _csv([{"path": r["path"], "label": r["class_index"]} for r in returned], ("path", "label")),
    )
    atomic_write_text(out / files["ood_manifest"], _csv(ood, OOD_COLUMNS))
    atomic_write_text(out / files["ambiguous"], _csv(ambiguous, AMBIGUOUS_COLUMNS))
    atomic_write_text(out / files["manifest_csv"], _csv(rows, MANIFEST_COLUMNS))
    atomic_write_text(out / files["stats_json"], json.dumps(stats, indent=2) + "\n")
    atomic_write_text(out / files["stats_md"], stats_markdown(stats))
    atomic_write_text(out / files["events"], "".join(json.dumps(e) + "\n" for e in store.events()))
    manifest = {
        "format": FORMAT,
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "project": str(project.dir),
        "classes": len(project.classes),
        "counts": {
            "images": len(rows),
            "ood": len(ood),
            "id": len(returned),
            "ambiguous": len(ambiguous),
            "pending": len(rows) - len(ood) - len(returned) - len(ambiguous),
        },
        "files": files,
        "stats": stats,
        "images": rows,
    }
    atomic_write_text(out / "manifest.json", json.dumps(manifest, indent=2) + "\n")
    return manifest
