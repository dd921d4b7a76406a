"""Golden files for the Markdown and LaTeX tables (set OODBENCH_UPDATE_GOLDEN=1 to rewrite them after a reviewed change),
plus checks of what the layouts mean: which cell is best, which detector is named, which value is averaged."""

from __future__ import annotations

import os
import re

import pytest

from oodbench.analysis.spread import spread_vs_noise
from oodbench.analysis.subsample import SubsampleSummary
from oodbench.core.errors import AnalysisError
from oodbench.core.tabular import render_markdown
from oodbench.report.latex import render_latex
from oodbench.report.tables import VocabScore, parse_vocabulary_score, table1, table2, table_a1, table_a2, table_a6
from oodbench.report.tables import supervised_rows as supervised_rows_of

from .helpers import GOLDEN, VOCABULARIES, metric_rows


def _check_golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("OODBENCH_UPDATE_GOLDEN") == "1":
        path.write_text(text, encoding="utf-8")
    assert path.is_file(), f"golden file {path} missing; run with OODBENCH_UPDATE_GOLDEN=1 and review it"
    assert text == path.read_text(encoding="utf-8")


def _summaries() -> list[SubsampleSummary]:
    return [
        SubsampleSummary(
            "resnet50", "imagenet", "ninco", "knn", 655, 5879, 1000, 0.62, 0.6205, 0.0005, 0.0180, 0.0179, 0.912, 1000
        ),
        SubsampleSummary(
            "resnet50",
            "imagenet",
            "openimage-o",
            "knn",
            655,
            17632,
            1000,
            0.40,
            0.3991,
            -0.0009,
            0.0190,
            0.0188,
            0.954,
            1000,
        ),
        SubsampleSummary(
            "vit-b16", "imagenet", "ninco", "knn", 655, 5879, 1000, 0.45, 0.4496, -0.0004, 0.0185, 0.0183, 0.870, 998
        ),
        SubsampleSummary(
            "vit-b16",
            "imagenet",
            "openimage-o",
            "msp",
            655,
            17632,
            1000,
            0.30,
            0.3002,
            0.0002,
            0.0177,
            0.0176,
            float("nan"),
            0,
        ),
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
    with pytest.raises(AnalysisError, match="neglabel@wordnet"):
        table2(supervised_rows, VOCABULARIES)
    with pytest.raises(AnalysisError, match="unknown keys"):
        table2(zeroshot_rows, {"wordnet": {"lable": "WN"}})
    with pytest.raises(AnalysisError, match="non-negative integer"):
        table2(zeroshot_rows, {"wordnet": {"size": "5000"}})
    # Vocabularies without a mapping still appear, under their key.
    header = _cells(render_markdown(table2(zeroshot_rows)))[0]
    assert header == ["model", "best logit score", "wordnet", "llm-siblings", "oracle"]
    # Named zero-shot models without any vocabulary score still get their logit-space column.
    logit_only = [r for r in zeroshot_rows if "@" not in r.detector and r.model == "clip-l14"]
    assert _cells(render_markdown(table2(logit_only, pairs=[("clip-l14", "imagenet")]))) == [
        ["model", "best logit score"],
        ["clip-l14", "66.0 (mcm)"],
    ]


@pytest.mark.parametrize(
    "name, parsed",
    [
        ("neglabel@wn-vitb16", VocabScore("neglabel", "wn-vitb16", None, None)),
        ("eoe@eoe-far", VocabScore("eoe", "eoe-far")),
        ("neglabel@llm[k=5]", VocabScore("neglabel", "llm", "k", 5)),
        ("neglabel@wn+llm,v2[m=1000]", VocabScore("neglabel", "wn+llm,v2", "m", 1000)),
        ("mcm", None),
        ("rmaha++", None),
        ("ash_s", None),
    ],
)
def test_parse_vocabulary_score_reads_the_canonical_names(name, parsed) -> None:
    assert parse_vocabulary_score(name) == parsed
    if parsed is not None:
        assert parsed.name == name and parsed.sweep == (parsed.parameter is not None)


@pytest.mark.parametrize(
    "name",
    [
        "neglabel[wordnet]",
        "neglabel@wn[x=3]",
        "neglabel@wn[k=]",
        "neglabel@",
        "@wn",
        "neglabel@wn[k=5][m=3]",
        "neglabel@a@b",
    ],
)
def test_parse_vocabulary_score_rejects_other_spellings(name) -> None:
    with pytest.raises(AnalysisError, match="malformed score name"):
        parse_vocabulary_score(name)


def test_table2_uses_sweep_points_only_for_vocabularies_without_others() -> None:
    rows = metric_rows(
        "clip",
        "ninco",
        100,
        {
            "mcm": (0.70, 0.80),
            "neglabel@siblings[k=1]": (0.50, 0.80),
            "neglabel@siblings[k=5]": (0.40, 0.85),
            "neglabel@siblings[k=10]": (0.45, 0.84),
            "neglabel@wn[m=100]": (0.30, 0.90),
            "neglabel@wn[m=1000]": (0.35, 0.88),
        },
    ) + metric_rows(
        "clip",
        "far",
        200,
        {
            "mcm": (0.50, 0.90),
            "neglabel@siblings[k=1]": (0.30, 0.92),
            "neglabel@siblings[k=5]": (0.20, 0.95),
            "neglabel@siblings[k=10]": (0.25, 0.94),
            "neglabel@wn[m=100]": (0.10, 0.97),
            "neglabel@wn[m=1000]": (0.15, 0.96),
        },
    )
    # The siblings' own k is known (5): that point stands in; WordNet's own M is not: the largest (M=1000) does.
    vocabularies = {"siblings": {"label": "LLM", "classes": 100, "k": 5}, "wn": {"label": "WN"}}
    header, line = _cells(render_markdown(table := table2(rows, vocabularies)))
    assert header == ["model", "best logit score", "LLM", "WN"]
    assert line == ["clip", "60.0 (mcm)", "30.0 (neglabel, k=5)", "**25.0** (neglabel, m=1000)"]
    assert any("sweep points" in note for note in table.notes)


def test_table2_joins_vocabularies_shown_alike() -> None:
    # Each model mined its own WordNet list (different keys, one label): one WN column, sizes as a range.
    rows = metric_rows("clip-b", "ninco", 100, {"mcm": (0.7, 0.8), "neglabel@wn-b": (0.4, 0.9)}) + metric_rows(
        "clip-l", "ninco", 100, {"mcm": (0.6, 0.8), "neglabel@wn-l": (0.3, 0.9)}
    )
    vocabularies = {"wn-b": {"label": "WN", "size": 9990}, "wn-l": {"label": "WN", "size": 10000}}
    table = table2(rows, vocabularies)
    header, clip_b, clip_l = _cells(render_markdown(table))
    assert header == ["model", "best logit score", "WN (9,990–10,000)"]
    assert clip_b[2] == "**40.0** (neglabel)" and clip_l[2] == "**30.0** (neglabel)"
    assert any("wn-b, wn-l" in note for note in table.notes)


def test_supervised_tables_leave_zero_shot_models_out(supervised_rows, zeroshot_rows) -> None:
    mixed = supervised_rows + zeroshot_rows
    assert {r.model for r in supervised_rows_of(mixed)} == {"resnet50", "vit-b16"}
    for table in (table1(mixed), table_a1(mixed), table_a2(mixed)):
        text = render_markdown(table)
        assert not any(name in text for name in ("clip", "mcm", "neglabel", "eoe"))
    assert render_markdown(table1(mixed)) == render_markdown(table1(supervised_rows))
    # A zero-shot model named by its run (no vocabulary scores needed) is left out too.
    assert {r.model for r in supervised_rows_of(mixed, [("resnet50", "imagenet")])} == {"vit-b16"}


def test_latex_is_booktabs_with_bold_best(supervised_rows) -> None:
    tex = render_latex(table1(supervised_rows))
    for needle in (
        r"\toprule",
        r"\midrule",
        r"\bottomrule",
        r"\cmidrule(lr){2-3}",
        r"\multicolumn{2}{c}{ninco}",
        r"\textbf{45.0}~{\scriptsize (knn)}",
        r"FPR@95 $\downarrow$",
    ):
        assert needle in tex
    # Every row has as many cells as the column spec declares.
    spec = re.search(r"\\begin\{tabular\}\{([lr]+)\}", tex).group(1)
    body = tex.split(r"\midrule")[1].split(r"\bottomrule")[0]
    for line in filter(None, (text.strip() for text in body.splitlines())):
        assert line.count(" & ") == len(spec) - 1
