"""OracleLDA (out-of-fold) and the fingerprint's firing rule on splits with a known answer."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.discriminant_analysis import LinearDiscriminantAnalysis
from sklearn.metrics import roc_auc_score
from sklearn.model_selection import StratifiedKFold

from oodbench import Outputs
from oodbench.audit import AuditConfig, fingerprint, logistic_regression_head, oracle_lda, prepare_pool
from oodbench.core.errors import AuditError

from .audit_helpers import Pentagon, fast_config, single_thread_blas  # noqa: F401 (autouse fixture)


def test_out_of_fold_reader_on_pure_noise_is_at_chance_while_in_sample_is_not():
    rng = np.random.default_rng(0)
    # n ≲ D: an in-sample linear reader separates two samples of the *same* distribution.
    a, b = rng.normal(size=(100, 200)), rng.normal(size=(100, 200))
    x, y = np.r_[a, b], np.r_[np.ones(100), np.zeros(100)]
    in_sample = LinearDiscriminantAnalysis(solver="lsqr", shrinkage="auto").fit(x, y).decision_function(x)
    assert roc_auc_score(y, in_sample) > 0.85
    result = oracle_lda(a, b, folds=5, seed=0)
    assert abs(result.auroc - 0.5) < 0.12
    assert len(result.fold_aurocs) == 5 and result.n_id == 100 and result.n_ood == 100


def test_oracle_matches_an_independent_fold_by_fold_computation():
    rng = np.random.default_rng(3)
    ids, ood = rng.normal(size=(90, 6)), rng.normal(loc=0.6, size=(70, 6))
    result = oracle_lda(ids, ood, folds=4, seed=7)
    x, y = np.r_[ids, ood], np.r_[np.ones(90, int), np.zeros(70, int)]
    expected = []
    for train, held in StratifiedKFold(4, shuffle=True, random_state=7).split(x, y):
        reader = LinearDiscriminantAnalysis(solver="lsqr", shrinkage="auto").fit(x[train], y[train])
        expected.append(roc_auc_score(y[held], reader.decision_function(x[held])))
    np.testing.assert_allclose(result.fold_aurocs, expected, rtol=0, atol=1e-12)
    assert result.auroc == pytest.approx(np.mean(expected))
    assert result.low == min(expected) and result.high == max(expected)


def test_oracle_separates_separable_sets_and_subsamples_large_sides():
    rng = np.random.default_rng(1)
    result = oracle_lda(rng.normal(size=(400, 5)), rng.normal(loc=3.0, size=(300, 5)), max_rows_per_side=100)
    assert result.auroc > 0.99 and result.n_id == 100 and result.n_ood == 100


def test_oracle_rejects_too_few_rows_and_mismatched_widths():
    rng = np.random.default_rng(2)
    with pytest.raises(AuditError, match="at least 5 rows"):
        oracle_lda(rng.normal(size=(20, 3)), rng.normal(size=(4, 3)))
    with pytest.raises(AuditError, match="same width"):
        oracle_lda(rng.normal(size=(20, 3)), rng.normal(size=(20, 4)))
    with pytest.raises(AuditError, match="folds"):
        AuditConfig(folds=1)


def test_a_pool_parameter_or_logit_detector_that_would_drop_a_detector_is_refused_up_front():
    # A misspelt parameter used to fail the member's fit, which left it out of the pool (and out of the firing
    # rule) with only a footnote; an unknown logit detector vanished the same way.
    with pytest.raises(AuditError, match="pool_params for knn: knn has no parameter bogus"):
        AuditConfig(pool_params={"knn": {"bogus": 3}})
    with pytest.raises(AuditError, match="pool_params for maha: maha has no parameter k"):
        AuditConfig(pool_params={"maha": {"k": 3}})
    with pytest.raises(AuditError, match="logit detectors not registered: bogus"):
        AuditConfig(logit_detectors=("msp", "bogus"))
    assert AuditConfig(pool_params={"knn": {"k": 10}}).pool_params["knn"]["k"] == 10


def test_rule_fires_on_a_constructed_leak_and_not_on_its_clean_twin():
    world = Pentagon(seed=0)
    config = fast_config()
    leaked = fingerprint(world.leaked_fit(), world.id_test(), world.ood(), config=config)
    clean = fingerprint(world.clean_fit(), world.id_test(), world.ood(), config=config)
    assert leaked.oracle.auroc >= 0.95 and clean.oracle.auroc >= 0.95
    assert leaked.best_auroc < 0.65 and leaked.fires
    assert clean.best_auroc > 0.95 and not clean.fires
    assert set(leaked.pool_aurocs) == {"maha", "rmaha", "maha++", "rmaha++", "knn", "iforest"}
    assert leaked.best_auroc == max(leaked.pool_aurocs.values())
    assert leaked.pool_aurocs[leaked.best_detector] == leaked.best_auroc


def test_thresholds_are_configurable():
    world = Pentagon(seed=0)
    strict = fast_config(collapse_threshold=0.5)
    result = fingerprint(world.leaked_fit(), world.id_test(), world.ood(), config=strict)
    assert result.best_auroc >= 0.5 and not result.fires
    unreachable = fast_config(oracle_threshold=1.0)
    world_noisy = Pentagon(seed=1)
    result = fingerprint(world_noisy.leaked_fit(), world_noisy.id_test(), world_noisy.ood(), config=unreachable)
    assert result.fires == (result.oracle.auroc >= 1.0)


def test_logit_detectors_are_reported_beside_the_rule_not_in_it():
    world = Pentagon(seed=0)
    fit = world.leaked_fit()
    head = logistic_regression_head(fit.features, fit.labels)
    with_logits = lambda o: Outputs(o.features, head.logits(o.features).astype(np.float32), o.labels)  # noqa: E731
    config = fast_config(logit_detectors=("msp", "energy", "kl_matching"))  # KL matching reads fit-set logits
    result = fingerprint(with_logits(fit), with_logits(world.id_test()), with_logits(world.ood()), head, config=config)
    assert set(result.logit_aurocs) == {"msp", "energy", "kl_matching"} and not result.logit_skipped
    recomputed = fingerprint(fit, world.id_test(), world.ood(), head, config=config)  # no stored logits: from the head
    # Stored float32 logits vs float64 ones from the head (relative 6e-8): an AUROC moves in steps of 1/(n_id·n_ood)
    # > 1e-6, so abs=1e-6 requires that no ID/OOD pair changed order, i.e. equal AUROCs up to float64 rounding.
    assert recomputed.logit_aurocs == pytest.approx(result.logit_aurocs, abs=1e-6)
    assert not set(result.logit_aurocs) & set(result.pool_aurocs)
    # The head was trained on the leaked class, so its confidence reads the OOD class as ID too.
    assert max(result.logit_aurocs.values()) < 0.75
    without = fingerprint(fit, world.id_test(), world.ood(), config=fast_config())
    assert without.fires == result.fires and without.best_auroc == pytest.approx(result.best_auroc)


def test_pool_state_is_reused_and_misuse_is_reported():
    world = Pentagon(seed=0)
    config = fast_config(pool=("maha", "knn"))
    state = prepare_pool(world.leaked_fit(), world.id_test(), None, config)
    first = fingerprint(world.leaked_fit(), world.id_test(), world.ood(), config=config, state=state)
    assert set(first.pool_aurocs) == {"maha", "knn"}
    with pytest.raises(AuditError, match="not registered"):
        fingerprint(world.leaked_fit(), world.id_test(), world.ood(), config=AuditConfig(pool=("nope",)))
    with pytest.raises(AuditError, match="reads"):
        fingerprint(world.leaked_fit(), world.id_test(), world.ood(), config=AuditConfig(pool=("msp",)))
    with pytest.raises(AuditError, match="feature widths"):
        fingerprint(world.leaked_fit(), world.id_test(), Outputs(np.zeros((10, 3), np.float32)), config=config)
