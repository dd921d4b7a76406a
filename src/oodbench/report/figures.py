"""The Fi-ImageNet-1k paper's figures with matplotlib (object API on the Agg canvas: no pyplot state, no display needed).

Each `fig_*` function returns a `matplotlib.figure.Figure`; `save_figure` writes PNG and PDF atomically and
`figure_png_base64` embeds one in HTML. Values are shown in %.
"""

from __future__ import annotations

import base64
import io
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from ..analysis.roc import roc_curve
from ..analysis.subsample import SubsampleStudy
from ..core import metrics
from ..core.errors import AnalysisError
from ..core.results import ResultRow
from ..util.atomic import atomic_path
from .tables import ResultGrid, Vocabulary, coerce_vocabularies, parse_vocabulary_score, supervised_rows

__all__ = [
    "save_figure",
    "figure_png_base64",
    "fig_best_detectors",
    "fig_subsample_curves",
    "fig_roc",
    "fig_score_histograms",
    "fig_vocab_sweep",
    "vocab_sweep_lines",
    "fig_top1_fpr",
]

_COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22"]


def _figure(width: float, height: float) -> Figure:
    figure = Figure(figsize=(width, height))
    FigureCanvasAgg(figure)
    return figure


def _finish(figure: Figure) -> Figure:
    # Lay out once here rather than with a layout engine, which would redo it on every save (PNG, PDF, base64).
    figure.tight_layout()
    return figure


def save_figure(
    figure: Figure,
    directory: str | os.PathLike[str],
    stem: str,
    formats: Sequence[str] = ("png", "pdf"),
    dpi: int = 150,
) -> list[Path]:
    """Write the figure as <directory>/<stem>.<format> for each format, atomically; returns the paths."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for fmt in formats:
        if fmt not in ("png", "pdf", "svg"):
            raise AnalysisError(f"unsupported figure format {fmt!r}; use png, pdf or svg")
        path = directory / f"{stem}.{fmt}"
        # No timestamps in the files, so a rerun on the same results writes the same bytes.
        metadata = {"CreationDate": None} if fmt == "pdf" else ({"Date": None} if fmt == "svg" else {"Software": None})
        with atomic_path(path) as tmp:
            figure.savefig(tmp, format=fmt, dpi=dpi, metadata=metadata)
        paths.append(path)
    return paths


def figure_png_base64(figure: Figure, dpi: int = 110) -> str:
    """The figure as a base64-encoded PNG (for a data: URI)."""
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=dpi, metadata={"Software": None})
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def _grid_shape(count: int, max_columns: int = 3) -> tuple[int, int]:
    columns = min(max_columns, max(1, count))
    return math.ceil(count / columns), columns


def fig_best_detectors(
    rows: Sequence[ResultRow],
    model: str,
    id_dataset: str | None = None,
    ood_datasets: Sequence[str] | None = None,
    tpr: float = metrics.DEFAULT_TPR,
) -> Figure:
    """Fig. 1: the best detector's FPR@95 and AUROC on each OOD set (benchmark) for one model, bars labelled by name
    (the rows' ``fpr95`` taken at `tpr`, which its title states)."""
    grid = ResultGrid(supervised_rows(rows))
    pair = grid.model_pair(model, id_dataset)
    oods = [o for o in (ood_datasets or grid.oods) if o in grid.values[pair]]
    if not oods:
        raise AnalysisError(f"no OOD results for {model!r}")
    figure = _figure(max(6.0, 1.1 * len(oods) + 2.5), 3.6)
    axes = figure.subplots(1, 2)
    fpr_title = f"{metrics.fpr_label(tpr)} (%) ↓"
    for ax, metric, title in ((axes[0], "fpr95", fpr_title), (axes[1], "auroc", "AUROC (%) ↑")):
        bests = [grid.best(pair, [o], metric) for o in oods]
        heights = [100 * b[1] if b else np.nan for b in bests]
        present = [h for h in heights if h == h]
        # FPR@95 axis: as tall as the data needs (bars of 1 % are invisible on 0–100), at least 0–5 %.
        top = 105.0 if metric == "auroc" else min(105.0, max(5.0, 1.35 * max(present, default=0.0)))
        bars = ax.bar(range(len(oods)), heights, color=_COLORS[0] if metric == "fpr95" else _COLORS[2], width=0.7)
        for bar, best in zip(bars, bests, strict=True):
            if best:
                height = bar.get_height()
                # The value above every bar (a bar of 0 % has no height to show); the name inside tall bars.
                ax.annotate(
                    f"{height:.1f}",
                    (bar.get_x() + bar.get_width() / 2, height),
                    xytext=(0, 2),
                    textcoords="offset points",
                    ha="center",
                    va="bottom",
                    fontsize=7,
                )
                inside = height > 0.5 * top
                ax.annotate(
                    best[0],
                    (bar.get_x() + bar.get_width() / 2, 0 if inside else height),
                    xytext=(0, 3) if inside else (0, 12),
                    textcoords="offset points",
                    ha="center",
                    va="bottom",
                    fontsize=7,
                    rotation=90,
                    color="white" if inside else "black",
                )
        ax.set_xticks(range(len(oods)), oods, rotation=30, ha="right", fontsize=8)
        ax.set_ylim(0, top if metric == "auroc" else top * (1.6 if top < 105 else 1.0))
        ax.set_title(title, fontsize=10)
        ax.grid(axis="y", alpha=0.3)
    figure.suptitle(f"{grid.label(pair)}: best detector per OOD set", fontsize=11)
    return _finish(figure)


def fig_subsample_curves(
    curves: Mapping[str, Sequence[SubsampleStudy]], title: str | None = None, tpr: float = metrics.DEFAULT_TPR
) -> Figure:
    """Fig. A4: the best detector's FPR@95 over n (mean ± 2σ of the draws, full set ± 2·closed-form SE), one panel per
    OOD set; labels state `tpr`, the rate the studies' threshold accepts."""
    fpr = metrics.fpr_label(tpr)
    if not curves:
        raise AnalysisError("no subsampling curves to plot")
    rows, columns = _grid_shape(len(curves))
    figure = _figure(3.6 * columns, 2.9 * rows)
    axes = np.atleast_1d(figure.subplots(rows, columns, squeeze=False).ravel())
    for ax, (name, studies) in zip(axes, curves.items(), strict=False):
        studies = sorted(studies, key=lambda s: s.n)
        if not studies:
            raise AnalysisError(f"curve {name!r} has no points")
        summaries = [s.summary() for s in studies]
        ns = np.array([s.n for s in summaries])
        mean = 100 * np.array([s.mean for s in summaries])
        std = 100 * np.array([s.std for s in summaries])
        se = 100 * np.array([s.se for s in summaries])
        full = 100 * summaries[0].full
        # A rate lives in [0, 100] %: the ±2σ band and the ±2·SE lines are clipped there.
        ax.fill_between(
            ns,
            np.clip(mean - 2 * std, 0, 100),
            np.clip(mean + 2 * std, 0, 100),
            color=_COLORS[0],
            alpha=0.25,
            label="draws: mean ± 2σ",
        )
        ax.plot(ns, mean, "o-", color=_COLORS[0], markersize=3, label="draws: mean")
        ax.plot(
            ns, np.clip(full + 2 * se, 0, 100), "--", color=_COLORS[1], linewidth=1, label="full ± 2·SE (closed form)"
        )
        ax.plot(ns, np.clip(full - 2 * se, 0, 100), "--", color=_COLORS[1], linewidth=1)
        ax.axhline(full, color="black", linewidth=0.8, linestyle=":", label="full set")
        ax.set_xscale("log")
        # A rate cannot be negative: the axis starts at 0, and an all-zero curve gets a 0–1 % axis, not ±0.04.
        high = float(np.nanmax(np.concatenate([mean + 2 * std, full + 2 * se, [full]])))
        ax.set_ylim(0, max(1.0, 1.1 * min(high, 100.0)))
        if high == 0.0:  # every line lies on the axis: the panel would look empty, so it says what it shows
            ax.text(
                0.5,
                0.5,
                f"{fpr} is 0 in every draw and on the full set:\n"
                f"no OOD image is accepted at {metrics.tpr_percent(tpr)}% TPR",
                transform=ax.transAxes,
                ha="center",
                va="center",
                fontsize=7,
                color=_COLORS[0],
            )
        ax.set_title(f"{name} ({summaries[0].detector}, N={summaries[0].n_total})", fontsize=9)
        ax.set_xlabel("n (OOD images drawn)", fontsize=8)
        ax.set_ylabel(f"{fpr} (%)", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
    for ax in axes[len(curves) :]:
        ax.set_visible(False)
    axes[0].legend(fontsize=7, loc="best")
    if title:
        figure.suptitle(title, fontsize=11)
    return _finish(figure)


def _check_detectors(id_scores: Mapping[str, object], ood_scores: Mapping[str, object]) -> list[str]:
    names = [d for d in id_scores if d in ood_scores]
    if not names:
        raise AnalysisError("no detector has both ID and OOD scores to plot")
    return names


def fig_roc(
    id_scores: Mapping[str, object], ood_scores: Mapping[str, object], title: str = "", tpr: float = 0.95
) -> Figure:
    """ROC curves (ID positive: x = OOD accepted, y = ID accepted), each detector's FPR@95 point marked (FPR@80 and
    its point at `tpr` 0.8: the legend states the rate).

    Two panels: the full [0, 1] square, and the same curves on a log-FPR axis from half an OOD image (1 / 2n) to 1,
    where curves that hug the corner of the square come apart.
    """
    names = _check_detectors(id_scores, ood_scores)
    figure = _figure(8.8, 4.2)
    linear, logarithmic = figure.subplots(1, 2)
    smallest, lowest = 1.0, 1.0
    for index, name in enumerate(names):
        fpr, tpr_values, thresholds = roc_curve(id_scores[name], ood_scores[name])
        color = _COLORS[index % len(_COLORS)]
        fpr_value = metrics.fpr_at_tpr(id_scores[name], ood_scores[name], tpr)
        auc = metrics.auroc(id_scores[name], ood_scores[name])
        n_ood = metrics.as_scores("ood_scores", ood_scores[name]).shape[0]
        floor = 0.5 / n_ood  # FPR = 0 has no place on a log axis: drawn at half an image
        smallest = min(smallest, floor)
        positive = np.flatnonzero(fpr > 0)
        lowest = min(lowest, float(tpr_values[positive[0]]) if positive.size else 1.0)
        # The operating point: the curve's vertex at the FPR@95 threshold (an ID score, so always a vertex).
        point = int(np.flatnonzero(thresholds == metrics.threshold_at_tpr(id_scores[name], tpr))[0])
        label = f"{name}: AUROC {100 * auc:.1f}, {metrics.fpr_label(tpr)} {100 * fpr_value:.1f}"
        for ax, xs in ((linear, fpr), (logarithmic, np.maximum(fpr, floor))):
            ax.plot(xs, tpr_values, color=color, linewidth=1.3, label=label)
            ax.plot([xs[point]], [tpr_values[point]], "o", color=color, markersize=4)
    for ax in (linear, logarithmic):
        ax.axhline(tpr, color="gray", linewidth=0.7, linestyle="--")
        ax.set_ylim(0, 1.01)
        ax.set_ylabel("ID accepted (TPR)", fontsize=9)
        ax.grid(alpha=0.3)
        ax.tick_params(labelsize=8)
    linear.plot([0, 1], [0, 1], color="gray", linewidth=0.6, linestyle=":")
    linear.set_xlim(0, 1)
    linear.set_xlabel("OOD accepted (FPR)", fontsize=9)
    linear.set_title("full range", fontsize=9)
    linear.legend(fontsize=7, loc="lower right")
    logarithmic.set_xscale("log")
    logarithmic.set_xlim(smallest, 1)
    # Zoom in on the part a log axis adds: from a little below the TPR where the first OOD image is accepted.
    logarithmic.set_ylim(max(0.0, np.floor(10 * lowest - 0.5) / 10), 1.01)
    logarithmic.set_xlabel("OOD accepted (FPR, log scale; 0 drawn at 1/2n)", fontsize=9)
    logarithmic.set_title("log FPR", fontsize=9)
    figure.suptitle(title or "ROC", fontsize=10)
    return _finish(figure)


def fig_score_histograms(
    id_scores: Mapping[str, object],
    ood_scores: Mapping[str, object],
    title: str = "",
    tpr: float = 0.95,
    bins: int = 40,
    labels: tuple[str, str] = ("ID", "OOD"),
) -> Figure:
    """ID and OOD score histograms per detector (shared bins, densities) with the FPR@95 threshold marked."""
    names = _check_detectors(id_scores, ood_scores)
    rows, columns = _grid_shape(len(names))
    figure = _figure(3.4 * columns, 2.6 * rows + 0.5)  # + room for the shared legend
    axes = figure.subplots(rows, columns, squeeze=False).ravel()
    for ax, name in zip(axes, names, strict=False):
        ids = metrics.as_scores(f"id_scores[{name!r}]", id_scores[name])
        ood = metrics.as_scores(f"ood_scores[{name!r}]", ood_scores[name])
        low, high = float(min(ids.min(), ood.min())), float(max(ids.max(), ood.max()))
        edges = np.linspace(low, high if high > low else low + 1.0, bins + 1)
        ax.hist(ids, bins=edges, density=True, histtype="stepfilled", alpha=0.55, color=_COLORS[0], label=labels[0])
        ax.hist(ood, bins=edges, density=True, histtype="stepfilled", alpha=0.55, color=_COLORS[1], label=labels[1])
        ax.axvline(
            metrics.threshold_at_tpr(ids, tpr),
            color="black",
            linewidth=0.9,
            linestyle="--",
            label=f"threshold (TPR {100 * tpr:g}%)",
        )
        ax.set_title(name, fontsize=9)
        ax.set_xlabel("score (higher = more ID)", fontsize=8)
        ax.set_ylabel("density", fontsize=8)
        ax.tick_params(labelsize=7)
    for ax in axes[len(names) :]:
        ax.set_visible(False)
    # One legend for all panels, above them: inside a panel it would cover a histogram.
    handles, texts = axes[0].get_legend_handles_labels()
    # Lay out the panels, then free a band at the top (inches: title 0.3, legend 0.25, panel titles 0.25).
    figure.tight_layout()
    height = float(figure.get_figheight())
    title_room = 0.3 / height if title else 0.0
    figure.subplots_adjust(top=1 - title_room - 0.5 / height)
    if title:
        figure.suptitle(title, fontsize=10, y=1 - 0.05 / height, va="top")
    figure.legend(
        handles,
        texts,
        loc="upper center",
        bbox_to_anchor=(0.5, 1 - title_room),
        ncol=3,
        fontsize=7,
        frameon=False,
    )
    return figure


def _sweep_line(vocab: Vocabulary, method: str, parameter: str) -> str:
    return f"{vocab.label} · {method}, {'k' if parameter == 'k' else 'M'} sweep"


def vocab_sweep_lines(
    rows: Sequence[ResultRow],
    vocabularies: Mapping[str, object] | None = None,
    metric: str = "fpr95",
    ood_datasets: Sequence[str] | None = None,
) -> dict[str, dict[str, dict[int, float]]]:
    """{panel (model): {line: {vocabulary size: metric averaged over the OOD sets}}} for Fig. A1/A2.

    A line per swept (score, vocabulary, k or M) through its sweep points ``score@vocab[k=K]`` / ``[m=M]`` and the
    vocabulary at its own k or M (sizes: see `Vocabulary.sweep_size`), and a line per (family, score) through the
    sized vocabularies of one family that are not swept. A point needs a value on every OOD set of its model.
    """
    if metric not in ("fpr95", "auroc"):
        raise AnalysisError(f"the vocabulary sweep shows fpr95 or auroc; got {metric!r}")
    vocabs = coerce_vocabularies(vocabularies)
    bound = [r for r in rows if r.metric == metric and parse_vocabulary_score(r.detector)]
    if not bound:
        return {}
    grid = ResultGrid(bound)
    lines: dict[str, dict[str, dict[int, list[float]]]] = {}
    for pair in grid.pairs:
        oods = [o for o in (ood_datasets or grid.oods) if o in grid.values[pair]]
        parsed = {d: parse_vocabulary_score(d) for d in grid.detectors if any(d in grid.values[pair][o] for o in oods)}
        swept = {(p.vocabulary, p.method, p.parameter, p.value) for p in parsed.values() if p and p.sweep}
        planned: list[tuple[str, int | None, str]] = []  # (line, size, detector)
        for detector, score in parsed.items():
            assert score is not None  # only vocabulary-bound rows are in the grid
            vocab = vocabs.get(score.vocabulary) or Vocabulary(score.vocabulary)
            if score.sweep:
                planned.append(
                    (
                        _sweep_line(vocab, score.method, score.parameter),  # type: ignore[arg-type]
                        vocab.sweep_size(score.parameter, score.value),
                        detector,
                    )
                )  # type: ignore[arg-type]
                continue
            parameters = {s[2] for s in swept if s[:2] == (score.vocabulary, score.method)}
            if not parameters:
                planned.append((f"{vocab.family or vocab.label} · {score.method}", vocab.size, detector))
            # A swept vocabulary at its own size is a point of its sweep line (unless the sweep has that point).
            for parameter in parameters:
                own = vocab.k if parameter == "k" else vocab.m
                if own is not None and (score.vocabulary, score.method, parameter, own) not in swept:
                    planned.append(
                        (_sweep_line(vocab, score.method, parameter), vocab.sweep_size(parameter, own), detector)
                    )
        for line, size, detector in planned:
            values = [grid.metric(pair, o, detector, metric) for o in oods]
            # Sizes go on a log axis: an empty sweep point (k=0) cannot be shown.
            if size is None or size <= 0 or not values or any(v is None for v in values):
                continue
            mean = sum(values) / len(values)  # type: ignore[arg-type]
            lines.setdefault(grid.label(pair), {}).setdefault(line, {}).setdefault(size, []).append(mean)
    return {
        panel: {
            line: {size: float(np.mean(points[size])) for size in sorted(points)} for line, points in per_line.items()
        }
        for panel, per_line in lines.items()
    }


def fig_vocab_sweep(
    rows: Sequence[ResultRow],
    vocabularies: Mapping[str, object] | None = None,
    metric: str = "fpr95",
    ood_datasets: Sequence[str] | None = None,
) -> Figure:
    """Fig. A1/A2: a zero-shot metric (mean over OOD sets) against vocabulary size, a panel per model.

    The lines are those of `vocab_sweep_lines`.
    """
    lines = vocab_sweep_lines(rows, vocabularies, metric, ood_datasets)
    if not lines:
        raise AnalysisError(
            "nothing to plot against vocabulary size: no sweep points (score@vocabulary[k=K] or [m=M]) "
            "and no vocabulary sizes (e.g. {'wn-1000': {'size': 1000, 'family': 'wordnet'}})"
        )
    rows_count, columns = _grid_shape(len(lines))
    figure = _figure(4.2 * columns, 3.2 * rows_count)
    axes = figure.subplots(rows_count, columns, squeeze=False).ravel()
    for ax, (panel, per_line) in zip(axes, lines.items(), strict=False):
        for index, (label, points) in enumerate(per_line.items()):
            ax.plot(
                list(points),
                [100 * v for v in points.values()],
                "o-",
                markersize=3,
                color=_COLORS[index % len(_COLORS)],
                label=label,
            )
        ax.set_xscale("log")
        ax.set_xlabel("vocabulary size (labels)", fontsize=8)
        ax.set_ylabel(("FPR@95" if metric == "fpr95" else "AUROC") + " (%)", fontsize=8)
        ax.set_title(panel, fontsize=9)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    for ax in axes[len(lines) :]:
        ax.set_visible(False)
    return _finish(figure)


def fig_top1_fpr(
    reproduced: Sequence[tuple[str, float, float]],
    published: Sequence[tuple[str, float, float]] = (),
    rho: tuple[float | None, float | None] = (None, None),
) -> Figure:
    """Top-1 against best FPR@95 on Fi-ImageNet-1k, one point per model: the run's and the paper's (Appendix E)."""
    if not reproduced and not published:
        raise AnalysisError("no models with both Top-1 and FPR@95 to plot")
    figure = _figure(5.6, 4.6)
    ax = figure.subplots()
    for points, color, marker, label, value in (
        (published, "#9aa3ae", "o", "paper (Table A7)", rho[1]),
        (reproduced, _COLORS[0], "D", "this run", rho[0]),
    ):
        if not points:
            continue
        suffix = f", ρ = {value:.2f}".replace("-", "−") if value is not None else ""
        ax.scatter(
            [p[1] for p in points],
            [p[2] for p in points],
            s=22,
            color=color,
            marker=marker,
            label=f"{label}{suffix}",
            zorder=3,
        )
    for name, top1, fpr in reproduced:
        ax.annotate(name, (top1, fpr), xytext=(3, 3), textcoords="offset points", fontsize=6)
    ax.set_xlabel("Top-1 on re-annotated labels (%)", fontsize=9)
    ax.set_ylabel("best FPR@95 on Fi-ImageNet-1k (%) ↓", fontsize=9)
    ax.set_title("Accuracy against OOD detection", fontsize=10)
    ax.tick_params(labelsize=8)
    ax.grid(alpha=0.3)
    ax.margins(x=0.1, y=0.08)  # room for the names beside the outermost points
    # Below the axes: inside, the legend would cover points wherever they fall.
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=2, frameon=False)
    return _finish(figure)
