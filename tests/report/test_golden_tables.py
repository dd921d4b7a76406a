"""Golden files for the Markdown and LaTeX tables (set OODBENCH_UPDATE_GOLDEN=1 to rewrite them after a reviewed change),
plus checks of what the layouts mean: which cell is best, which detector is named, which value is averaged."""
from __future__ import annotations

import os
import re

import pytest

from report_fixtures import GOLDEN, VOCABULARIES
from oodbench.analysis.spread import spread_vs_noise
from oodbench.analysis.subsample import SubsampleSummary
from oodbench.errors import AnalysisError
from oodbench.report.latex import render_latex
from oodbench.report.markdown import render_markdown
from oodbench.report.tables import table1, table2, table_a1, table_a2, table_a6


def _check_golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("OODBENCH_UPDATE_GOLDEN") == "1":
        path.write_text(text, encoding="utf-8")
    assert path.is_file(), f"golden file {path} missing; run with OODBENCH_UPDATE_GOLDEN=1 and review it"
    assert text == path.read_text(encoding="utf-8")


def _summaries() -> list[SubsampleSummary]:
    return [
        SubsampleSummary("resnet50", "imagenet", "ninco", "knn", 655, 5879, 1000, 0.62, 0.6205, 0.0005, 0.0180, 0.0179, 0.912, 1000),
        SubsampleSummary("resnet50", "imagenet", "openimage-o", "knn", 655, 17632, 1000, 0.40, 0.3991, -0.0009, 0.0190, 0.0188, 0.954, 1000),
        SubsampleSummary("vit-b16", "imagenet", "ninco", "knn", 655, 5879, 1000, 0.45, 0.4496, -0.0004, 0.0185, 0.0183, 0.870, 998),
        SubsampleSummary("vit-b16", "imagenet", "openimage-o", "msp", 655, 17632, 1000, 0.30, 0.3002, 0.0002, 0.0177, 0.0176, float("nan"), 0),
    ]


@pytest.mark.parametrize("fmt", ["md", "tex"])
def test_golden_files(fmt, supervised_rows, zeroshot_rows) -> None:
    render = render_markdown if fmt == "md" else render_latex
    summaries = _summaries()
    tables = {
        "table1": table1(supervised_rows),
        "tableA1": table_a1(supervised_rows),
        "tableA2": table_a2(supervised_rows),
        "table2": table2(zeroshot_rows, VOCABULARIES),
        "tableA6": table_a6(summaries, spread_vs_noise(summaries)),
    }
    for name, table in tables.items():
        _check_golden(f"{name}.{fmt}", render(table))


def _cells(markdown: str) -> list[list[str]]:
    lines = [line for line in markdown.splitlines() if line.startswith("| ")]
    return [[c.strip() for c in line.strip("|").split(" | ")] for line in lines]


def test_table1_picks_best_per_model_and_bolds_best_model(supervised_rows) -> None:
    header, resnet, vit = _cells(render_markdown(table1(supervised_rows)))
    assert header[:3] == ["model", "ninco: FPR@95 ↓", "ninco: AUROC ↑"]
    # resnet50/ninco: energy and knn tie at 62.0 FPR; knn has the higher AUROC and wins the tie.
    assert resnet[1] == "62.0 (knn)" and resnet[2] == "88.0 (knn)"
    assert vit[1] == "**45.0** (knn)" and vit[2] == "**93.0** (knn)"
    # Mean over both sets: vit-b16 has no knn on openimage-o, so knn is out of its mean; msp (40.0) beats energy.
    assert vit[5] == "**40.0** (msp)"
    assert resnet[5] == "51.0 (knn)"  # (62 + 40) / 2


def test_table_a1_and_a2_semantics(supervised_rows) -> None:
    rows = _cells(render_markdown(table_a1(supervised_rows)))
    by_detector = {r[0]: r[1:] for r in rows[1:]}
    assert by_detector["knn"] == ["**51.0 / 89.5**", "–"]  # vit-b16 misses one OOD set for knn
    assert by_detector["msp"][1] == "**40.0 / 92.0**"
    rows = _cells(render_markdown(table_a2(supervised_rows)))
    assert rows[1] == ["ninco", "5879", "62.0 / 88.0 (knn)", "**45.0 / 93.0** (knn)"]
    assert rows[2] == ["openimage-o", "17632", "40.0 / 91.0 (knn)", "**30.0 / 94.0** (msp)"]


def test_table2_marks_best_deployable_vocabulary(zeroshot_rows) -> None:
    header, clip_b, clip_l = _cells(render_markdown(table2(zeroshot_rows, VOCABULARIES)))
    assert header == ["model", "best logit score", "WN (5,000)", "LLM siblings (20,000)", "oracle (370)†"]
    # Oracle is better but not deployable; LLM siblings: eoe (41.0) beats neglabel (42.0) on the mean.
    assert clip_b == ["clip-b16", "60.0 (mcm)", "50.0 (neglabel)", "**41.0** (eoe)", "15.0 (neglabel)"]
    # A tie between deployable vocabularies bolds both.
    assert clip_l == ["clip-l14", "66.0 (mcm)", "**50.0** (neglabel)", "**50.0** (neglabel)", "–"]


def test_table2_needs_vocabulary_rows(supervised_rows, zeroshot_rows) -> None:
    with pytest.raises(AnalysisError, match="neglabel\\[wordnet\\]"):
        table2(supervised_rows, VOCABULARIES)
    with pytest.raises(AnalysisError, match="unknown keys"):
        table2(zeroshot_rows, {"wordnet": {"lable": "WN"}})
    # Vocabularies without a mapping still appear, under their key.
    header = _cells(render_markdown(table2(zeroshot_rows)))[0]
    assert header == ["model", "best logit score", "wordnet", "llm-siblings", "oracle"]


def test_latex_is_booktabs_with_bold_best(supervised_rows) -> None:
    tex = render_latex(table1(supervised_rows))
    for needle in (r"\toprule", r"\midrule", r"\bottomrule", r"\cmidrule(lr){2-3}", r"\multicolumn{2}{c}{ninco}",
                   r"\textbf{45.0}~{\scriptsize (knn)}", r"FPR@95 $\downarrow$"):
        assert needle in tex
    # Every row has as many cells as the column spec declares.
    spec = re.search(r"\\begin\{tabular\}\{([lr]+)\}", tex).group(1)
    body = tex.split(r"\midrule")[1].split(r"\bottomrule")[0]
    for line in filter(None, (l.strip() for l in body.splitlines())):
        assert line.count(" & ") == len(spec) - 1
