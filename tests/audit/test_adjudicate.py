"""Adjudication: every branch on hand-built numbers, and end to end on leaked, clean and hard-clean splits."""

from __future__ import annotations

import numpy as np
import pytest

from oodbench import Outputs
from oodbench.audit import (
    CLEAN,
    HARD_CLEAN,
    INCONCLUSIVE,
    LEAK,
    AuditConfig,
    ContrastResult,
    Fingerprint,
    OracleLDA,
    adjudicate,
    audit_split,
)

from .audit_helpers import Pentagon, fast_config, single_thread_blas  # noqa: F401 (autouse fixture)


def _fp(
    oracle: float, best: float, folds: tuple[float, ...] | None = None, config: AuditConfig = AuditConfig()
) -> Fingerprint:
    folds = folds or (oracle,) * 5
    fires = oracle >= config.oracle_threshold and best < config.collapse_threshold
    return Fingerprint(
        OracleLDA(oracle, folds, 100, 100),
        {"maha": best},
        {},
        "maha",
        best,
        fires,
        config.oracle_threshold,
        config.collapse_threshold,
        500,
        100,
        100,
        8,
    )


def _contrast(
    after: float,
    removed: int = 50,
    identity: float | None = None,
    config: AuditConfig = AuditConfig(),
    auto: bool = False,
    limit: float | None = None,
) -> ContrastResult:
    recovered = after >= config.recovery_threshold
    return ContrastResult(
        "label",
        (3,),
        {3: 1.0},
        auto,
        removed,
        450,
        {"maha": 0.5},
        {"maha": after},
        0.5,
        after,
        "maha",
        config.recovery_threshold,
        recovered,
        not recovered and after >= config.collapse_threshold,
        None if identity is None else OracleLDA(identity, (identity,) * 5, 100, 100),
        identity_class=None if identity is None else 3,
        identity_null=() if limit is None else (0.5,) * 19,
        identity_limit=limit,
    )


def test_silent_rule_is_clean_with_the_reason():
    verdict = adjudicate(_fp(0.99, 0.90), None)
    assert verdict.label == CLEAN and "pool detects" in verdict.reasons[0]
    verdict = adjudicate(_fp(0.80, 0.55), None)
    assert verdict.label == CLEAN and "does not separate" in verdict.reasons[0]


def test_silent_rule_by_fold_noise_is_inconclusive():
    verdict = adjudicate(_fp(0.945, 0.55, folds=(0.93, 0.96, 0.94, 0.95, 0.945)), None)
    assert verdict.label == INCONCLUSIVE and "fold noise" in verdict.reasons[0]


def test_firing_branches():
    fires = _fp(0.99, 0.55)
    assert adjudicate(fires, None).label == INCONCLUSIVE
    assert adjudicate(fires, _contrast(0.90)).label == LEAK
    assert adjudicate(fires, _contrast(0.70)).label == INCONCLUSIVE  # partial: between 0.65 and 0.75
    assert adjudicate(fires, _contrast(0.60)).label == HARD_CLEAN
    assert adjudicate(fires, _contrast(0.55, removed=0)).label == HARD_CLEAN
    reasons = adjudicate(fires, _contrast(0.90)).reasons
    assert "0.990" in reasons[0] and "0.550" in reasons[0] and "0.900" in reasons[1]


def test_margin_and_identity_threshold_are_configurable():
    wide = AuditConfig(recovery_margin=0.3)
    assert adjudicate(_fp(0.99, 0.55, config=wide), _contrast(0.90, config=wide), wide).label == INCONCLUSIVE
    strict = AuditConfig(identity_threshold=0.95)
    assert adjudicate(_fp(0.99, 0.55), _contrast(0.90, identity=0.99), strict).label == INCONCLUSIVE
    assert adjudicate(_fp(0.99, 0.55), _contrast(0.90, identity=0.52), strict).label == LEAK
    assert adjudicate(_fp(0.99, 0.55), _contrast(0.90, identity=0.99)).label == LEAK  # off by default


def test_automatic_contrast_needs_the_ood_set_to_be_the_excluded_class():
    """Suspects found by proximity: a recovery is a leak only if the identity reading stays within its null."""
    fires = _fp(0.99, 0.55)
    assert adjudicate(fires, _contrast(0.93, identity=0.52, auto=True, limit=0.58)).label == LEAK
    verdict = adjudicate(fires, _contrast(0.93, identity=0.87, auto=True, limit=0.58))
    assert verdict.label == HARD_CLEAN and "0.870 > 0.580" in verdict.reasons[-1]
    assert adjudicate(fires, _contrast(0.93, auto=True)).label == INCONCLUSIVE  # identity could not be read
    # A designated class is the auditor's claim: the identity reading is reported, not required.
    assert adjudicate(fires, _contrast(0.93, identity=0.87, auto=False)).label == LEAK
    assert adjudicate(fires, _contrast(0.60, identity=0.87, auto=True, limit=0.58)).label == HARD_CLEAN


def test_end_to_end_leak_and_clean():
    world = Pentagon(seed=2)
    config = fast_config()
    leak = audit_split(world.leaked_fit(), world.id_test(), world.ood(), config=config)
    clean = audit_split(world.clean_fit(), world.id_test(), world.ood(), config=config)
    assert leak.verdict.label == LEAK and leak.contrast is not None
    assert clean.verdict.label == CLEAN and clean.contrast is None  # contrast only when the rule fires
    payload = leak.to_dict()
    assert payload["verdict"]["label"] == LEAK and payload["fingerprint"]["fires"] is True
    assert payload["overlap"]["k"] == 10


def _shifted_blob(seed: int, dim: int, n_fit: int, n_test: int, delta: float):
    """ID: one isotropic Gaussian (two arbitrary label halves). OOD: the same Gaussian shifted by `delta` along one
    (oblique) direction. A linear reader sees the shift; fit-set density readers in many dimensions barely do.
    Nothing leaked."""
    rng = np.random.default_rng(seed)
    fit = Outputs(rng.normal(size=(n_fit, dim)).astype(np.float32), labels=rng.integers(0, 2, n_fit))
    id_test = Outputs(rng.normal(size=(n_test, dim)).astype(np.float32))
    direction = rng.normal(size=dim)
    shifted = rng.normal(size=(n_test, dim)) + delta * direction / np.linalg.norm(direction)
    return fit, id_test, Outputs(shifted.astype(np.float32))


def test_hard_clean_pair_fires_but_does_not_recover():
    fit, id_test, ood = _shifted_blob(0, dim=32, n_fit=600, n_test=300, delta=3.5)
    # k-NN on normalised features and relative Mahalanobis both miss an oblique mean shift in 32 dimensions.
    config = fast_config(pool=("knn", "rmaha"))
    audit = audit_split(fit, id_test, ood, config=config, run_overlap=False)
    assert audit.fingerprint.fires
    assert audit.verdict.label == HARD_CLEAN
    assert audit.contrast is not None and audit.contrast.best_after < config.collapse_threshold


@pytest.mark.slow
def test_hard_clean_pair_with_the_full_default_pool():
    fit, id_test, ood = _shifted_blob(1, dim=384, n_fit=1500, n_test=400, delta=3.3)
    audit = audit_split(fit, id_test, ood, config=fast_config(), run_overlap=False)
    assert audit.fingerprint.fires and audit.verdict.label == HARD_CLEAN
