"""Detector parameters against the fit set's size: the checks before any work, and the small-fit-set adaptation."""

from __future__ import annotations

import numpy as np
import pytest

from oodbench import Head, Outputs
from oodbench.core.errors import DetectorError
from oodbench.detectors import create
from oodbench.detectors.fitsize import FitSize, adapt_plan, describe_changes, plan_size_problems
from oodbench.evaluation.evaluate import FitSetTooSmall, check_fit_size

ROWS = 84


def small_fit(rows: int = ROWS, dim: int = 16, classes: int = 7, seed: int = 0) -> tuple[Outputs, Head]:
    """Post-ReLU Gaussian features of `classes` classes and a random linear head (C = 10)."""
    rng = np.random.default_rng(seed)
    labels = np.arange(rows) % classes
    features = np.maximum(rng.normal(size=(rows, dim)) + labels[:, None] * 0.3, 0).astype(np.float32)
    weight, bias = rng.normal(size=(10, dim)).astype(np.float32), rng.normal(size=10).astype(np.float32)
    return Outputs(features, features @ weight.T + bias, labels), Head(weight, bias)


def test_knn_and_nnguide_defaults_cannot_fit_84_rows():
    size = FitSize(ROWS, 7, 1280)
    assert create("knn").size_problems(size) == ["k=1000 exceeds the fit set's 84 rows; use k <= 84"]
    # int(84 · 0.01) = 0 bank rows for k = 100: even the whole fit set (alpha = 1) has fewer than k rows.
    (problem,) = create("nnguide").size_problems(size)
    assert "bank holds 0 rows (alpha=0.01 of 84) but k=100" in problem and "lower k to <= 84" in problem
    # 20,000 rows: a bank of 200 >= 100, no problem; 5,000 rows: 50 < 100, alpha must reach 100/5000 = 0.02.
    assert create("nnguide").size_problems(FitSize(20_000)) == []
    assert "raise alpha to >= 0.02 or lower k to <= 50" in create("nnguide").size_problems(FitSize(5_000))[0]
    assert create("knn", k=84).size_problems(size) == []
    assert create("knn", index="ivf", nlist=100, k=5).size_problems(size) == [
        "nlist=100 exceeds the fit set's 84 rows; use nlist <= 84"
    ]


def test_vim_and_neco_need_more_rows_than_directions():
    # ViM's default dim for D = 1280 is 512 (768 <= D < 2048): 84 rows span at most 84 directions.
    (problem,) = create("vim").size_problems(FitSize(ROWS, None, 1280))
    assert problem == (
        "dim=512 (the default for D=1280) needs more fit rows than principal directions, "
        "and the fit set has 84; use dim < 84"
    )
    assert create("vim").size_problems(FitSize(ROWS)) == []  # D unknown: checked at fit
    assert create("vim").size_problems(FitSize(2000, None, 1280)) == []
    assert "exceeds the feature dimension D=64" in create("neco").size_problems(FitSize(500, None, 64))[0]
    assert "fit set has 84; use dim < 84" in create("neco").size_problems(FitSize(ROWS, None, 1280))[0]
    assert create("neco", dim=0.9).size_problems(FitSize(ROWS, None, 1280)) == []


def test_adapted_values_follow_the_documented_rules():
    size = FitSize(ROWS, 7, 1280)
    assert create("knn").adapted_to(size) == {"k": 1}  # one neighbour per 1,000 rows, at least one
    assert create("knn").adapted_to(FitSize(5_000)) == {}  # k = 1000 <= 5000: nothing to adapt
    assert create("knn", k=10_000).adapted_to(FitSize(5_000)) == {"k": 5}
    assert create("nnguide").adapted_to(size) == {"alpha": 1.0, "k": 1}  # whole set, ~1 % of its rows
    assert create("nnguide").adapted_to(FitSize(2_000)) == {"alpha": 1.0, "k": 20}
    assert create("vim").adapted_to(size) == {"dim": 42}  # half of min(N, D)
    assert create("neco").adapted_to(size) == {"dim": 41}  # half of the N - 1 directions centred rows span
    for name in ("knn", "nnguide", "vim", "neco"):
        adapted = create(name, **create(name).adapted_to(size))
        assert adapted.size_problems(size) == [], name


def test_fit_raises_the_same_problem_the_check_reports():
    fit, head = small_fit()
    with pytest.raises(DetectorError, match="knn: k=1000 exceeds the fit set's 84 rows; use k <= 84"):
        create("knn").fit(fit, head)
    with pytest.raises(DetectorError, match="nnguide: the bank holds 0 rows"):
        create("nnguide").fit(fit, head)
    adapted = create("knn", **create("knn").adapted_to(FitSize.of(fit))).fit(fit, head)
    assert np.isfinite(adapted.score(fit)).all()


def test_adapt_plan_keeps_explicit_values_and_reports_them():
    size = FitSize(ROWS, 7, 1280)
    plan = {"knn": {}, "nnguide": {"k": 50}, "msp": {}}
    instances = {name: create(name, **params) for name, params in plan.items()}
    assert plan_size_problems(instances, size)[0].startswith("knn: k=1000")
    new_plan, changed, refused = adapt_plan(plan, instances, size)
    assert new_plan["knn"] == {"k": 1} and changed == {"knn": {"k": {"from": 1000, "to": 1}}}
    assert refused == ["nnguide: nnguide.k=50 was given explicitly and is kept (only defaults are adapted)"]
    assert describe_changes(changed) == "knn.k 1000 -> 1"


def test_check_fit_size_names_every_parameter_at_once():
    plan = {"knn": {}, "nnguide": {}, "vim": {}, "msp": {}}
    with pytest.raises(FitSetTooSmall) as error:
        check_fit_size(plan, FitSize(ROWS, 7, 1280))
    message = str(error.value)
    assert message.startswith("the fit set (84 rows, 7 classes) is too small for: knn: k=1000")
    assert "vim: dim=512" in message and "nnguide: the bank" in message and "--small-fit-set adapt" in message
    adapted, changed = check_fit_size(plan, FitSize(ROWS, 7, 1280), "adapt")
    assert adapted == {"knn": {"k": 1}, "nnguide": {"alpha": 1.0, "k": 1}, "vim": {"dim": 42}, "msp": {}}
    assert set(changed) == {"knn", "nnguide", "vim"}
    # Ignored detectors (those that will be skipped) are not checked; an explicit value is never adapted.
    assert check_fit_size({"knn": {}}, FitSize(ROWS), ignore={"knn"}) == ({"knn": {}}, {})
    with pytest.raises(FitSetTooSmall, match="knn.k=500 was given explicitly"):
        check_fit_size({"knn": {"k": 500}}, FitSize(ROWS), "adapt")
    with pytest.raises(DetectorError, match="small_fit_set must be one of fail, adapt"):
        check_fit_size(plan, FitSize(ROWS), "shrink")
