"""The per-detector table of one model: rows = detectors, columns = OOD sets, cells `FPR@95 / AUROC` in %."""

from __future__ import annotations

from collections.abc import Sequence

from ..results import ResultRow


def _lookup(rows: Sequence[ResultRow]) -> dict[tuple[str, str, str], float]:
    return {(r.detector, r.ood_dataset, r.metric): r.value for r in rows}


def detector_table_markdown(
    rows: Sequence[ResultRow], detectors: Sequence[str] | None = None, ood_datasets: Sequence[str] | None = None
) -> str:
    """Markdown table with FPR@95 / AUROC (%) per detector and OOD set, the best FPR@95 of each column in bold."""
    values = _lookup(rows)
    detectors = list(detectors) if detectors is not None else list(dict.fromkeys(r.detector for r in rows))
    ood_datasets = list(ood_datasets) if ood_datasets is not None else list(dict.fromkeys(r.ood_dataset for r in rows))
    n_ood = {r.ood_dataset: r.n_ood for r in rows}
    best: dict[str, float] = {}
    for ood in ood_datasets:
        fprs = [values[(d, ood, "fpr95")] for d in detectors if (d, ood, "fpr95") in values]
        if fprs:
            best[ood] = min(fprs)
    header = "| detector | " + " | ".join(f"{ood} (n={n_ood.get(ood, '?')})" for ood in ood_datasets) + " | mean |"
    lines = [header, "|---|" + "---:|" * (len(ood_datasets) + 1)]
    for detector in detectors:
        cells, fpr_sum, auroc_sum, count = [], 0.0, 0.0, 0
        for ood in ood_datasets:
            fpr = values.get((detector, ood, "fpr95"))
            auc = values.get((detector, ood, "auroc"))
            if fpr is None or auc is None:
                cells.append("–")
                continue
            cell = f"{100 * fpr:.1f} / {100 * auc:.1f}"
            cells.append(f"**{cell}**" if fpr == best.get(ood) else cell)
            fpr_sum, auroc_sum, count = fpr_sum + fpr, auroc_sum + auc, count + 1
        mean = f"{100 * fpr_sum / count:.1f} / {100 * auroc_sum / count:.1f}" if count else "–"
        lines.append(f"| {detector} | " + " | ".join(cells) + f" | {mean} |")
    return "\n".join(lines) + "\n"
