"""Outcome statistics of a construction project, overall and per candidate-source flag."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from .db import ImageInfo
from .protocol import Outcome, Status, Verdict

ALL = "all"


def _pct(part: int, whole: int) -> float | None:
    return None if whole == 0 else round(100.0 * part / whole, 1)


def _group(name: str, outcomes: list[Outcome]) -> dict[str, Any]:
    final = [o for o in outcomes if o.status is Status.FINAL]
    counts = Counter(o.verdict for o in final)
    ood = [o for o in final if o.verdict is Verdict.OOD]
    fine = sum(o.fine_grained for o in ood)
    decided = len(final)
    return {
        "group": name,
        "candidates": len(outcomes),
        "decided": decided,
        "pending": len(outcomes) - decided,
        "ood": counts[Verdict.OOD],
        "ood_pct": _pct(counts[Verdict.OOD], decided),
        "id": counts[Verdict.ID],
        "id_pct": _pct(counts[Verdict.ID], decided),
        "ambiguous": counts[Verdict.AMBIGUOUS],
        "ambiguous_pct": _pct(counts[Verdict.AMBIGUOUS], decided),
        "concepts": len({o.concept for o in ood}),
        "fine_grained": fine,
        "fine_grained_pct": _pct(fine, len(ood)),
        "by_agreement": sum(o.decided_in == 2 for o in final),
        "by_review": sum(o.decided_in == 3 for o in final),
    }


def outcome_stats(
    images: Iterable[ImageInfo], outcomes: Mapping[int, Outcome], class_names: Sequence[str] | None = None
) -> dict[str, Any]:
    """Counts and percentages (of decided images) overall and per source flag, plus OOD concepts.

    An image with several flags counts in each of its flags' rows, once in `all`.
    """
    images = list(images)
    per_flag: dict[str, list[Outcome]] = {}
    for image in images:
        for flag in image.flags:
            per_flag.setdefault(flag, []).append(outcomes[image.id])
    rows = [_group(ALL, [outcomes[i.id] for i in images])]
    rows += [_group(flag, per_flag[flag]) for flag in sorted(per_flag)]
    concepts = Counter(o.concept for o in outcomes.values() if o.status is Status.FINAL and o.verdict is Verdict.OOD)
    returned = Counter(o.class_index for o in outcomes.values() if o.status is Status.FINAL and o.verdict is Verdict.ID)
    return {
        "groups": rows,
        "concepts": [{"concept": c, "images": n} for c, n in sorted(concepts.items(), key=lambda kv: (-kv[1], kv[0]))],
        "returned_classes": [
            {"class": c, "name": class_names[c] if class_names else None, "images": n}
            for c, n in sorted(returned.items(), key=lambda kv: (-kv[1], kv[0]))
        ],
    }


COLUMNS = (
    ("group", "source"),
    ("candidates", "candidates"),
    ("decided", "decided"),
    ("ood", "OOD"),
    ("ood_pct", "OOD %"),
    ("id", "ID"),
    ("id_pct", "ID %"),
    ("ambiguous", "ambiguous"),
    ("ambiguous_pct", "ambiguous %"),
    ("concepts", "concepts"),
    ("fine_grained_pct", "fine-grained % of OOD"),
    ("pending", "pending"),
)


def stats_markdown(stats: Mapping[str, Any]) -> str:
    """The statistics table in Markdown (percentages are of decided images)."""
    lines = ["| " + " | ".join(title for _, title in COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for row in stats["groups"]:
        cells = ["–" if row[key] is None else str(row[key]) for key, _ in COLUMNS]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
