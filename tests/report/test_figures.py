"""Figures plot the numbers they claim to: bar heights, curve points, ROC vertices, thresholds; files are valid."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image
from report_fixtures import VOCABULARIES

from oodbench import metrics
from oodbench.analysis.roc import roc_curve
from oodbench.analysis.subsample import subsample_curve
from oodbench.errors import AnalysisError
from oodbench.report.figures import (
    fig_best_detectors,
    fig_roc,
    fig_score_histograms,
    fig_subsample_curves,
    fig_vocab_sweep,
    figure_png_base64,
    save_figure,
)
from oodbench.report.tables import Vocabulary
from oodbench.results import ResultRow


def test_fig1_bars_are_the_best_values_with_detector_names(supervised_rows) -> None:
    figure = fig_best_detectors(supervised_rows, "vit-b16")
    fpr_ax, auroc_ax = figure.axes
    assert [p.get_height() for p in fpr_ax.patches] == pytest.approx([45.0, 30.0])
    assert [t.get_text() for t in fpr_ax.texts] == ["knn", "msp"]
    assert [p.get_height() for p in auroc_ax.patches] == pytest.approx([93.0, 94.0])
    assert [t.get_text() for t in fpr_ax.get_xticklabels()] == ["ninco", "openimage-o"]
    with pytest.raises(AnalysisError, match="expected one"):
        fig_best_detectors(supervised_rows, "nonexistent")


@pytest.fixture(scope="module")
def scores():
    rng = np.random.default_rng(0)
    ids = {"a": rng.normal(2, 1, 300), "b": rng.normal(1, 1, 300), "c": rng.integers(0, 5, 300).astype(float)}
    oods = {"a": rng.normal(0, 1, 250), "b": rng.normal(0, 1, 250), "c": rng.integers(-2, 3, 250).astype(float)}
    return ids, oods


def test_fig_a4_plots_mean_band_and_closed_form(scores) -> None:
    ids, oods = scores
    studies = subsample_curve(ids, oods, [20, 60, 250], draws=200, seed=1, ood_dataset="set")
    figure = fig_subsample_curves({"set": studies, "again": studies})
    ax = figure.axes[0]
    summaries = [s.summary() for s in studies]
    mean_line = next(line for line in ax.lines if line.get_label() == "draws: mean")
    np.testing.assert_allclose(mean_line.get_ydata(), [100 * s.mean for s in summaries])
    upper = next(line for line in ax.lines if line.get_label().startswith("full ± 2·SE"))
    np.testing.assert_allclose(upper.get_ydata(), [100 * (s.full + 2 * s.se) for s in summaries])
    band = ax.collections[0].get_paths()[0].vertices
    assert band[:, 1].max() == pytest.approx(max(100 * (s.mean + 2 * s.std) for s in summaries))
    assert studies[0].best in ax.get_title()


def test_roc_figure_draws_the_roc_curve_and_operating_point(scores) -> None:
    ids, oods = scores
    figure = fig_roc(ids, oods, "t")
    ax = figure.axes[0]
    curves = [line for line in ax.lines if line.get_label().startswith(("a:", "b:", "c:"))]
    assert [c.get_label().split(":")[0] for c in curves] == ["a", "b", "c"]
    fpr, tpr, _ = roc_curve(ids["c"], oods["c"])
    np.testing.assert_allclose(curves[2].get_xdata(), fpr)
    np.testing.assert_allclose(curves[2].get_ydata(), tpr)
    points = [line for line in ax.lines if line.get_marker() == "o"]
    for name, point in zip("abc", points, strict=False):
        # The marked operating point is exactly FPR@95 under the metric convention (ties included).
        assert point.get_xdata()[0] == pytest.approx(metrics.fpr_at_tpr(ids[name], oods[name]))
        assert f"FPR@95 {100 * metrics.fpr_at_tpr(ids[name], oods[name]):.1f}" in curves["abc".index(name)].get_label()


def test_histograms_mark_the_threshold(scores) -> None:
    ids, oods = scores
    figure = fig_score_histograms(ids, oods)
    visible = [ax for ax in figure.axes if ax.get_visible()]
    assert [ax.get_title() for ax in visible] == ["a", "b", "c"]
    for ax, name in zip(visible, "abc", strict=False):
        vline = [line for line in ax.lines if line.get_linestyle() == "--"][0]
        assert vline.get_xdata()[0] == pytest.approx(metrics.threshold_at_tpr(ids[name]))


def test_vocabulary_sweep_plots_means_by_size(zeroshot_rows) -> None:
    vocabularies = dict(VOCABULARIES)
    vocabularies["wordnet-1k"] = {"label": "WN 1k", "size": 1000, "family": "WordNet"}
    vocabularies["llm-siblings"] = {**VOCABULARIES["llm-siblings"], "classes": 1000, "k": 20}
    rows = list(zeroshot_rows)
    rows += [
        ResultRow("clip-l14", "imagenet", ood, "neglabel@wordnet-1k", "fpr95", v, 50000, 1)
        for ood, v in (("ninco", 0.7), ("openimage-o", 0.5))
    ]
    # A k sweep of the siblings: k=1 and k=5 siblings for each of the 1000 ID classes; k=0 has no labels.
    rows += [
        ResultRow("clip-b16", "imagenet", ood, f"neglabel@llm-siblings[k={k}]", "fpr95", v, 50000, 1)
        for k, values in ((0, (0.9, 0.9)), (1, (0.8, 0.6)), (5, (0.6, 0.5)))
        for ood, v in zip(("ninco", "openimage-o"), values, strict=False)
    ]
    figure = fig_vocab_sweep(rows, vocabularies)
    clip_b, clip_l = figure.axes[:2]
    assert (clip_b.get_title(), clip_l.get_title()) == ("clip-b16", "clip-l14")

    def line(ax, label):
        found = next(ln for ln in ax.lines if ln.get_label() == label)
        return list(found.get_xdata()), list(found.get_ydata())

    # The M sweep of clip-b16 (mean of ninco and openimage-o), with the vocabulary at its own M=5000 in between.
    xs, ys = line(clip_b, "WN · neglabel, M sweep")
    assert xs == [1000, 5000, 10000] and ys == pytest.approx([40.0, 50.0, 20.0])
    # The k sweep: size = k × 1000 classes; the vocabulary at its own k=20 (its plain score) closes the line.
    xs, ys = line(clip_b, "LLM siblings · neglabel, k sweep")
    assert xs == [1000, 5000, 20000] and ys == pytest.approx([70.0, 55.0, 42.0])
    # Unswept vocabularies of one family at several sizes form a line (clip-l14: WN 1k and WN 5000).
    xs, ys = line(clip_l, "WordNet · neglabel")
    assert xs == [1000, 5000] and ys == pytest.approx([60.0, 50.0])
    assert "WordNet · neglabel" not in [ln.get_label() for ln in clip_b.lines]  # clip-b16's WordNet list is swept
    # Only vocabulary-bound scores are plotted.
    assert not any(ln.get_label().startswith(("mcm", "energy")) for ax in figure.axes for ln in ax.lines)
    with pytest.raises(AnalysisError, match="vocabulary sizes"):
        fig_vocab_sweep([r for r in rows if "[" not in r.detector], {"wordnet": "WN"})


def test_sweep_sizes_follow_how_zero_shot_vocabularies_select_labels() -> None:
    union = Vocabulary("WN+LLM", size=5000 + 3 * 1000, classes=1000, k=3, m=5000)
    assert union.sweep_size("k", 10) == 10 * 1000 + 5000  # the WordNet prefix stays at its own M
    assert union.sweep_size("m", 2000) == 2000 + 3 * 1000  # the siblings stay at their own k
    assert Vocabulary("WN", m=5000).sweep_size("m", 2000) == 2000
    assert Vocabulary("siblings", classes=100).sweep_size("k", 4) == 400
    assert Vocabulary("siblings").sweep_size("k", 4) is None  # the number of classes is needed
    assert union.is_default("k", 3) and not union.is_default("m", 3)


def test_saved_files_are_valid_and_reproducible(supervised_rows, tmp_path) -> None:
    figure = fig_best_detectors(supervised_rows, "resnet50")
    png, pdf = save_figure(figure, tmp_path, "fig1", ("png", "pdf"))
    with Image.open(png) as image:
        pixels = np.asarray(image.convert("L"), dtype=float)
    assert pixels.std() > 10  # not blank
    assert pdf.read_bytes().startswith(b"%PDF")
    first = pdf.read_bytes()
    save_figure(figure, tmp_path, "fig1", ("pdf",))
    assert pdf.read_bytes() == first  # no timestamps: reruns write identical files
    assert figure_png_base64(figure).startswith("iVBORw0KGgo")  # PNG magic, base64
    with pytest.raises(AnalysisError, match="unsupported figure format"):
        save_figure(figure, tmp_path, "x", ("gif",))
