"""Benchmark construction: candidate pools from label errors, evidence, the three-stage
annotation protocol, a multi-annotator web app and the benchmark export.

The pure parts (importers, evidence, protocol) import only numpy; the database, web app and LLM
client need the `web` extra and live in `db`, `web`, `project`, `export` and `llm`.

Every name below is imported from its module on first use (`oodbench.util.lazy`), so that importing the package
(and `oodbench --help`) stays fast.
"""

from __future__ import annotations

from ..util.lazy import lazy_package

_EXPORTS = {
    "AMBIGUITY_REASONS": ".protocol",
    "Candidate": ".importers",
    "ClassList": "..text.classes",
    "Event": ".protocol",
    "EventKind": ".protocol",
    "ImageRecord": ".protocol",
    "Import": ".importers",
    "Judgement": ".protocol",
    "LabelMatcher": ".protocol",
    "Outcome": ".protocol",
    "Status": ".protocol",
    "TableMapping": ".importers",
    "Verdict": ".protocol",
    "agree": ".protocol",
    "load_classes": "..text.classes",
    "load_original_labels": ".importers",
    "merge_candidates": ".importers",
    "label_match_key": ".protocol",
    "read_mturk": ".importers",
    "read_real": ".importers",
    "read_table": ".importers",
    "replay": ".protocol",
    "top_confusions": ".evidence",
    "vlm_topk": ".evidence",
}

__all__ = list(_EXPORTS)
lazy_package(__name__, _EXPORTS)
