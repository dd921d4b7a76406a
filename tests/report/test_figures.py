"""Figures plot the numbers they claim to: bar heights, curve points, ROC vertices, thresholds; files are valid."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from oodbench.analysis.roc import roc_curve
from oodbench.analysis.subsample import subsample_curve
from oodbench.core import metrics
from oodbench.core.errors import AnalysisError
from oodbench.core.results import ResultRow
from oodbench.report.figures import (
    fig_best_detectors,
    fig_roc,
    fig_score_histograms,
    fig_subsample_curves,
    fig_top1_fpr,
    fig_vocab_sweep,
    figure_png_base64,
    save_figure,
)
from oodbench.report.tables import Vocabulary, format_p

from .helpers import VOCABULARIES


def test_fig1_bars_are_the_best_values_with_detector_names(supervised_rows) -> None:
    figure = fig_best_detectors(supervised_rows, "vit-b16")
    fpr_ax, auroc_ax = figure.axes
    assert [p.get_height() for p in fpr_ax.patches] == pytest.approx([45.0, 30.0])
    assert [t.get_text() for t in fpr_ax.texts] == ["45.0", "knn", "30.0", "msp"]
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


# ------------------------------------------------------------------ what a reader trips on (issue 14, "Report")


def test_fig1_small_fprs_are_visible_and_labelled() -> None:
    rows = [
        ResultRow("m", "id", ood, "vim", metric, value, 1000, 300)
        for ood, fpr in (("a", 0.01), ("b", 0.0), ("c", 0.004))
        for metric, value in (("fpr95", fpr), ("auroc", 0.99))
    ]
    fpr_ax = fig_best_detectors(rows, "m").axes[0]
    # A 1 % bar on a 0–105 axis is a hairline; the axis now ends near the data (at least 5 %, here ≤ 10 %).
    assert fpr_ax.get_ylim()[1] <= 10
    assert fpr_ax.patches[0].get_height() / fpr_ax.get_ylim()[1] > 0.1
    # Every bar carries its value, so a 0 % bar (no height) still reads as 0.0.
    assert [t.get_text() for t in fpr_ax.texts if t.get_text()[0].isdigit()] == ["1.0", "0.0", "0.4"]


def test_fig_a4_all_zero_curve_is_drawn_from_zero(scores) -> None:
    ids, _ = scores
    # OOD scores far below every ID score: FPR@95 is 0 at every n.
    perfect = {name: values.min() - 10.0 - np.arange(200, dtype=float) for name, values in ids.items()}
    studies = subsample_curve(ids, perfect, [10, 50, 200], draws=20, seed=0, ood_dataset="far")
    ax = fig_subsample_curves({"far": studies}).axes[0]
    low, high = ax.get_ylim()
    assert low == 0.0 and high >= 1.0  # not −0.04…0.04
    # The lines lie on the axis, so the panel says why it looks empty; a curve above 0 gets no such text.
    assert [t.get_text() for t in ax.texts] == [
        "FPR@95 is 0 in every draw and on the full set:\nno OOD image is accepted at 95% TPR"
    ]
    curve = subsample_curve(ids, scores[1], [10, 50, 200], draws=20, seed=0, ood_dataset="near")
    assert len(fig_subsample_curves({"near": curve}).axes[0].texts) == 0


def test_histograms_have_axis_labels_and_a_legend_outside_the_panels(scores) -> None:
    ids, oods = scores
    figure = fig_score_histograms(ids, oods, "title")
    visible = [ax for ax in figure.axes if ax.get_visible()]
    for ax in visible:
        assert ax.get_xlabel() and ax.get_ylabel() == "density"
        assert ax.get_legend() is None
    assert len(figure.legends) == 1
    renderer = figure.canvas.get_renderer()
    legend_box = figure.legends[0].get_window_extent(renderer)
    for ax in visible:
        assert not legend_box.overlaps(ax.get_window_extent(renderer))


def test_roc_has_a_log_fpr_panel(scores) -> None:
    ids, oods = scores
    figure = fig_roc(ids, oods, "t")
    linear, logarithmic = figure.axes
    assert linear.get_xscale() == "linear" and logarithmic.get_xscale() == "log"
    # FPR = 0 is drawn at half an OOD image: the log axis starts there.
    assert logarithmic.get_xlim()[0] == pytest.approx(0.5 / 250)
    curve = next(line for line in logarithmic.lines if line.get_label().startswith("a:"))
    assert min(curve.get_xdata()) >= 0.5 / 250


@pytest.mark.parametrize(
    ("p", "text"), [(1.23e-5, "< 0.001"), (0.000999, "< 0.001"), (0.001, "0.001"), (0.3456, "0.346"), (1.0, "1.000")]
)
def test_p_values_are_printed_like_the_other_numbers(p: float, text: str) -> None:
    assert format_p(p) == text


def test_top1_scatter_shows_both_point_sets_and_their_rho() -> None:
    figure = fig_top1_fpr([("a", 80.0, 70.0), ("b", 85.0, 66.0)], [("p", 84.9, 80.2)], (-1.0, -0.61))
    ax = figure.axes[0]
    assert [len(c.get_offsets()) for c in ax.collections] == [1, 2]
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels == ["paper (Table A7), ρ = −0.61", "this run, ρ = −1.00"]
    with pytest.raises(AnalysisError):
        fig_top1_fpr([], [])
