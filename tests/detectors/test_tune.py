"""The tune helper: grid expansion, every point reported, the best point, metric direction, errors."""

from __future__ import annotations

import numpy as np
import pytest

from oodbench.core.errors import DetectorError
from oodbench.core.metrics import evaluate
from oodbench.detectors import create, tune
from oodbench.detectors.tune import expand_grid


def _split(problem):
    return problem.test.subset(slice(0, problem.n_id)), problem.test.subset(slice(problem.n_id, len(problem.test)))


def test_expand_grid():
    assert expand_grid({"a": [1, 2], "b": ["x"]}) == [{"a": 1, "b": "x"}, {"a": 2, "b": "x"}]
    assert expand_grid([{"a": 1}, {"b": 2}]) == [{"a": 1}, {"b": 2}]
    with pytest.raises(DetectorError, match="non-empty list"):
        expand_grid({"a": []})
    with pytest.raises(DetectorError, match="non-empty list"):
        expand_grid({"a": "abc"})
    with pytest.raises(DetectorError, match="empty"):
        expand_grid([])


def test_tune_reports_every_point_with_the_direct_metrics(problem):
    id_val, ood_val = _split(problem)
    result = tune(
        "react", {"percentile": [50.0, 80.0, 95.0]}, problem.fit, problem.head, id_val, ood_val, metric="auroc"
    )
    assert [point.params for point in result.points] == [
        {"percentile": 50.0},
        {"percentile": 80.0},
        {"percentile": 95.0},
    ]
    for point in result.points:
        detector = create("react", **point.params).fit(problem.fit, problem.head)
        direct = evaluate(detector.score(id_val), detector.score(ood_val))
        assert point.metrics["ood"] == direct
        assert point.value == direct["auroc"]
    assert result.best.value == max(point.value for point in result.points)
    assert "best" in result.table() and result.table().count("\n") == 4


def test_tune_minimises_fpr_and_averages_ood_sets(problem):
    id_val, ood_val = _split(problem)
    halves = {"a": ood_val.subset(slice(0, 70)), "b": ood_val.subset(slice(70, len(ood_val)))}
    result = tune("knn", {"k": [1, 10, 40]}, problem.fit, None, id_val, halves, metric="fpr95")
    for point in result.points:
        assert set(point.metrics) == {"a", "b"}
        assert point.value == pytest.approx(np.mean([point.metrics[s]["fpr95"] for s in "ab"]))
    assert result.best.value == min(point.value for point in result.points)


def test_tune_errors(problem):
    id_val, ood_val = _split(problem)
    with pytest.raises(DetectorError, match="unknown detector"):
        tune("nope", {"k": [1]}, problem.fit, None, id_val, ood_val)
    with pytest.raises(DetectorError, match="metric"):
        tune("knn", {"k": [1]}, problem.fit, None, id_val, ood_val, metric="accuracy")
    with pytest.raises(DetectorError, match="no parameter"):
        tune("knn", {"kk": [1]}, problem.fit, None, id_val, ood_val)
    with pytest.raises(DetectorError, match="knn"):
        tune("knn", {"k": [1, 0]}, problem.fit, None, id_val, ood_val)  # every point is validated before fitting
    with pytest.raises(DetectorError, match="OOD"):
        tune("knn", {"k": [1]}, problem.fit, None, id_val, {})
