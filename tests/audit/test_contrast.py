"""Fit-set-exclusion contrast (label and cross-fitted nearest modes) and leave-class-out head retraining."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.linear_model import LogisticRegression
from sklearn.preprocessing import StandardScaler

from oodbench import Outputs
from oodbench.audit import exclusion_contrast, find_suspects, leave_class_out, logistic_regression_head
from oodbench.audit.leave_class_out import balanced_rows
from oodbench.core.errors import AuditError
from oodbench.core.metrics import auroc

from .audit_helpers import Orthogonal, Pentagon, fast_config, outputs, single_thread_blas  # noqa: F401 (autouse fixture)


def test_label_contrast_finds_the_leaked_class_and_recovers():
    world = Pentagon(seed=0)
    result = exclusion_contrast(world.leaked_fit(), world.id_test(), world.ood(), config=fast_config())
    assert result.suspects == (4,) and result.suspects_auto
    assert result.suspect_shares[4] == pytest.approx(1.0)
    assert result.removed_rows == 150 and result.remaining_rows == 600
    assert result.best_before < 0.65 and result.best_after > 0.95
    assert result.recovered and not result.partial
    # The OOD test rows and the excluded class's own training rows are indistinguishable to a linear reader.
    assert result.identity is not None and result.identity.auroc < 0.65


def test_label_contrast_with_absent_suspects_changes_nothing():
    world = Pentagon(seed=0)
    result = exclusion_contrast(world.clean_fit(), world.id_test(), world.ood(), suspects=[4], config=fast_config())
    assert result.removed_rows == 0 and not result.recovered
    assert result.after == result.before and "absent" in result.note


def test_explicit_suspects_and_errors():
    world = Pentagon(seed=0)
    config = fast_config()
    result = exclusion_contrast(world.leaked_fit(), world.id_test(), world.ood(), suspects=[3], config=config)
    assert result.suspects == (3,) and not result.suspects_auto and not result.recovered
    with pytest.raises(AuditError, match="empty"):
        exclusion_contrast(world.leaked_fit(), world.id_test(), world.ood(), suspects=[], config=config)
    unlabelled = Outputs(world.leaked_fit().features)
    with pytest.raises(AuditError, match="labels"):
        exclusion_contrast(unlabelled, world.id_test(), world.ood(), mode="label", config=fast_config(pool=("knn",)))
    with pytest.raises(AuditError, match="mode"):
        exclusion_contrast(world.leaked_fit(), world.id_test(), world.ood(), mode="other", config=config)


def test_find_suspects_covers_the_requested_mass():
    world = Pentagon(seed=0)
    mixed = outputs([world.test[4][:40], world.test[0][:30], world.test[1][:10]], [4, 0, 1])
    suspects, shares = find_suspects(world.leaked_fit(), mixed, mass=0.8, max_suspects=3)
    assert suspects == (4, 0)
    assert shares == pytest.approx({4: 0.5, 0: 0.375, 1: 0.125})
    assert find_suspects(world.leaked_fit(), mixed, mass=0.8, max_suspects=1)[0] == (4,)


def test_nearest_contrast_recovers_a_leak_without_labels():
    world = Pentagon(seed=0)
    fit = Outputs(world.leaked_fit().features)  # no labels: the label-noise setting
    config = fast_config(pool=("knn", "iforest"), nearest_per_ood=5)
    result = exclusion_contrast(fit, world.id_test(), world.ood(), mode="nearest", config=config)
    assert result.mode == "nearest" and result.removed_rows > 0
    assert result.best_before < 0.65 and result.recovered


def test_nearest_contrast_is_cross_fitted():
    """OOD drawn from the ID distribution itself (uniform on a sphere): removing the scored images' *own*
    neighbours fakes a recovery; cross-fitting (exclude for one half, score the other) must not."""
    rng = np.random.default_rng(0)

    def sphere(n: int) -> Outputs:
        x = rng.normal(size=(n, 3))
        return Outputs((x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32))

    fit, id_test, ood = sphere(3000), sphere(300), sphere(60)
    config = fast_config(pool=("knn",), nearest_per_ood=10)
    result = exclusion_contrast(fit, id_test, ood, mode="nearest", config=config)
    assert result.best_after < 0.65 and not result.recovered
    # The naive version: exclude the neighbours of every OOD image and score those same images.
    from oodbench.audit.neighbours import nearest_rows
    from oodbench.audit.pool import PoolMember, fit_pool

    drop = np.zeros(len(fit), bool)
    drop[np.unique(nearest_rows(fit.features, ood.features, 10, cosine=True))] = True
    naive = fit_pool(fit.subset(np.flatnonzero(~drop)), [PoolMember("knn", {"k": 10})])
    naive_auroc = auroc(naive.score(id_test)["knn"], naive.score(ood)["knn"])
    assert naive_auroc > 0.75


def test_logistic_regression_head_reproduces_scikit_learn_on_raw_features():
    world = Orthogonal(seed=1, classes=4, dim=6)
    fit = world.fit()
    head = logistic_regression_head(fit.features, fit.labels, max_per_class=None)
    x = np.asarray(fit.features, dtype=np.float64)
    scaler = StandardScaler().fit(x)
    reference = LogisticRegression(C=1.0, max_iter=1000, random_state=0).fit(scaler.transform(x), fit.labels)
    logits = head.logits(x)
    probabilities = np.exp(logits - logits.max(1, keepdims=True))
    probabilities /= probabilities.sum(1, keepdims=True)
    # Same solver on the same standardised float64 inputs; only the folding of the scaling into W and b differs, a
    # float64 sum of D = 6 products per logit: ≤ (D + 2)·eps64·Σ|terms| ≈ 2e-15·|logits| ≲ 1e-13 on probabilities.
    np.testing.assert_allclose(probabilities, reference.predict_proba(scaler.transform(x)), atol=1e-12)


def test_logistic_regression_head_binary_head_has_two_rows():
    rng = np.random.default_rng(0)
    x = np.r_[rng.normal(size=(50, 3)), rng.normal(loc=2, size=(50, 3))]
    y = np.r_[np.full(50, 3), np.full(50, 7)]
    head = logistic_regression_head(x, y)
    assert head.num_classes == 2
    assert (head.logits(x).argmax(1) == (y == 7)).mean() > 0.9
    with pytest.raises(AuditError, match="2 classes"):
        logistic_regression_head(x, np.zeros(100, int))


def test_balanced_rows_caps_each_class():
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 4, size=500)
    rows = balanced_rows(labels, 30, rng)
    counts = np.bincount(labels[rows], minlength=4)
    np.testing.assert_array_equal(counts, np.minimum(np.bincount(labels, minlength=4), 30))
    assert np.all(np.diff(rows) > 0)


def test_leave_class_out_lifts_the_logit_detectors():
    world = Orthogonal(seed=0)
    fit = world.fit()
    head = logistic_regression_head(fit.features, fit.labels)
    config = fast_config(logit_detectors=("msp", "energy"))
    result = leave_class_out(fit, world.test_without(4), world.test_of(4), head, [4], config=config)
    assert result.excluded == (4,) and result.kept_classes == (0, 1, 2, 3)
    assert set(result.before) == set(result.after) == {"msp", "energy"}
    # With class 4 in the head its images are confidently classified (AUROC low); without, they are not.
    assert result.before["msp"] < 0.6 and result.after["msp"] > 0.9
    assert result.probe_accuracy is not None and result.probe_accuracy > 0.95
    with pytest.raises(AuditError, match="two"):
        leave_class_out(fit, world.test_without(4), world.test_of(4), head, [0, 1, 2, 3], config=config)
