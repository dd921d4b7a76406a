"""Hand-made result rows and vocabulary mapping shared by the report tests (a uniquely named module, not conftest)."""

from __future__ import annotations

import json
from pathlib import Path

from oodbench.core.results import ResultRow

GOLDEN = Path(__file__).parent / "golden"

VOCABULARIES = {
    "wordnet": {"label": "WN", "size": 5000, "family": "WordNet", "m": 5000},
    "llm-siblings": {"label": "LLM siblings", "size": 20000, "family": "LLM"},
    "oracle": {"label": "oracle", "size": 370, "deployable": False},
}


def metric_rows(
    model: str, ood: str, n_ood: int, values: dict[str, tuple[float, float]], id_dataset: str = "imagenet"
) -> list[ResultRow]:
    """fpr95 and auroc rows of several detectors on one (model, OOD set)."""
    rows = []
    for detector, (fpr, auroc) in values.items():
        rows.append(ResultRow(model, id_dataset, ood, detector, "fpr95", fpr, 50000, n_ood))
        rows.append(ResultRow(model, id_dataset, ood, detector, "auroc", auroc, 50000, n_ood))
    return rows


def write_accuracy(
    run_dir: Path, model: str, top1: dict[str, tuple[float, int]], dataset: str = "imagenet-val"
) -> Path:
    """RUN_DIR/accuracy.json as helper `paper` writes it: {labels: (top-1 fraction, n)} per label set."""
    path = Path(run_dir) / "accuracy.json"
    rows = [
        {"dataset": dataset, "labels": labels, "top1": value, "n": n, "n_excluded": 0}
        for labels, (value, n) in top1.items()
    ]
    path.write_text(json.dumps({"model": model, "rows": rows}), encoding="utf-8")
    return path
