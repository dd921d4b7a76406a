"""Benchmark construction: candidate pools from label errors, evidence, the three-stage
annotation protocol, a multi-annotator web app and the benchmark export.

The pure parts (importers, evidence, protocol) import only numpy; the database, web app and LLM
client need the `web` extra and live in `db`, `web`, `project`, `export` and `llm`.
"""

from ..classes import ClassList, load_classes
from .evidence import top_confusions, vlm_topk
from .importers import (
    Candidate,
    Import,
    TableMapping,
    load_original_labels,
    merge_candidates,
    read_mturk,
    read_real,
    read_table,
)
from .protocol import (
    AMBIGUITY_REASONS,
    Event,
    EventKind,
    ImageRecord,
    Judgement,
    LabelMatcher,
    Outcome,
    Status,
    Verdict,
    agree,
    normalise_label,
    replay,
)

__all__ = [
    "AMBIGUITY_REASONS",
    "Candidate",
    "ClassList",
    "Event",
    "EventKind",
    "ImageRecord",
    "Import",
    "Judgement",
    "LabelMatcher",
    "Outcome",
    "Status",
    "TableMapping",
    "Verdict",
    "agree",
    "load_classes",
    "load_original_labels",
    "merge_candidates",
    "normalise_label",
    "read_mturk",
    "read_real",
    "read_table",
    "replay",
    "top_confusions",
    "vlm_topk",
]
