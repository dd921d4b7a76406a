"""The controlled battery on a digits feature set built here (raw pixels, a probe head) and its validation."""

from __future__ import annotations

import json
from html import escape

import numpy as np
import pytest

from oodbench import Outputs
from oodbench.audit import HARD_CLEAN, LEAK, logistic_regression_head, make_battery, run_battery
from oodbench.audit.battery import CLEAN_KIND, LEAKED, NOT_IN_FIT
from oodbench.audit.render import html_renderer, use_html_renderer
from oodbench.audit.report import battery_document, definitions_text
from oodbench.audit.synthetic import synthetic_battery_data
from oodbench.core.errors import AuditError
from oodbench.report.html_report import render_audit_html

from .audit_helpers import digits_features, fast_config, single_thread_blas  # noqa: F401 (autouse fixture)


@pytest.fixture(scope="module")
def digits():
    data = digits_features(seed=0)
    head = logistic_regression_head(data["train"].features, data["train"].labels)

    def with_logits(o: Outputs) -> Outputs:
        return Outputs(o.features, head.logits(o.features).astype(np.float32), o.labels)

    extra = lambda o: o.subset(np.flatnonzero(np.isin(o.labels, [6, 7])))  # noqa: E731 (two extra classes keep it fast)
    return {
        "head": head,
        "train": with_logits(data["train"]),
        "test": with_logits(data["test"]),
        "extra_train": with_logits(extra(data["extra_train"])),
        "extra_test": with_logits(extra(data["extra_test"])),
        "noise": with_logits(data["noise"]),
    }


def test_battery_reports_sensitivity_and_specificity(digits):
    config = fast_config(logit_detectors=("msp",))
    splits = make_battery(
        digits["train"],
        digits["test"],
        digits["head"],
        classes=[0, 1, 2],
        extra_train=digits["extra_train"],
        extra_test=digits["extra_test"],
        far={"noise": digits["noise"]},
        config=config,
    )
    kinds = [s.kind for s in splits]
    assert kinds.count(LEAKED) == 5 and kinds.count(CLEAN_KIND) == 6
    result = run_battery(splits, config)
    trained = [a for a in result.audits if a.meta["family"] == "trained-class"]
    # A trained class designated OOD with its data in the fit set: the rule fires and the contrast confirms it.
    for audit in trained:
        if audit.meta["kind"] == LEAKED:
            assert audit.fingerprint.fires and audit.verdict.label == LEAK, audit.name
            assert audit.contrast.suspects == (audit.meta["ood_class"],)
        else:
            assert not audit.fingerprint.fires and audit.verdict.label != LEAK, audit.name
    assert result.specificity == 1.0 and result.rule_specificity == 1.0
    assert 0.6 <= result.sensitivity <= 1.0
    leaked = [a for a in result.audits if a.meta["kind"] == LEAKED]
    assert result.sensitivity == sum(a.verdict.label == LEAK for a in leaked) / len(leaked)
    assert result.counts[LEAKED][LEAK] == sum(a.verdict.label == LEAK for a in leaked)
    scope = result.scope_statement()
    assert "5 leaked / 6 clean" in scope and "trained-class" in scope
    for audit, reason in result.misses():
        assert audit.name in scope and reason.split(":")[0] in scope
    payload = json.loads(json.dumps(result.to_dict()))
    assert len(payload["splits"]) == 11 and payload["specificity"] == 1.0
    # The report page: the firing rule stated once, the scope statement's bullets as a list (not one flat paragraph).
    document = battery_document(result, config, "digits", "battery")
    rule = definitions_text(config)
    assert document.markdown().count(rule) == 1
    before = html_renderer()
    use_html_renderer(render_audit_html)
    try:
        html = document.html()
    finally:
        use_html_renderer(before)
    assert html.count(escape(rule)) == 1
    assert f"<li>{escape('trained-class: the rule was right on')}" in html


def test_clean_splits_use_a_retrained_head(digits):
    config = fast_config(logit_detectors=("msp",))
    splits = make_battery(digits["train"], digits["test"], digits["head"], classes=[1], config=config)
    leaked, clean = (split.materialize() for split in splits)
    assert leaked.head is digits["head"] and clean.head is not digits["head"]
    assert leaked.fit is digits["train"]  # the leaked fit set is the train set itself, not a copy
    assert clean.head.num_classes == 5 and 1 not in set(clean.fit.labels.tolist())
    assert clean.fit.logits is None and clean.id_test.logits is None  # logits come from the retrained head
    assert len(clean.ood) == int((digits["test"].labels == 1).sum())
    np.testing.assert_array_equal(leaked.ood.features, clean.ood.features)


def test_battery_validation(digits):
    unlabelled = Outputs(digits["train"].features)
    with pytest.raises(AuditError, match="labelled"):
        make_battery(unlabelled, digits["test"])
    with pytest.raises(AuditError, match="not in the training labels"):
        make_battery(digits["train"], digits["test"], classes=[8])
    with pytest.raises(AuditError, match="both"):
        make_battery(digits["train"], digits["test"], classes=[0], extra_train=digits["extra_train"])
    with pytest.raises(AuditError, match="new"):
        make_battery(
            digits["train"], digits["test"], classes=[0], extra_train=digits["train"], extra_test=digits["test"]
        )


def test_automatic_contrast_spares_hard_clean_pairs_on_the_synthetic_battery():
    """Near sets are distinct classes next to a fit class: the rule fires and excluding the neighbour (the automatic
    suspect) recovers detection, yet they are clean. The identity reading against its permutation null tells them
    from leaks, with no threshold tuned on this battery; the designated path needs no such reading."""
    data = synthetic_battery_data(0, classes=4, near_of=(0, 1), n_train=200, n_test=100)
    config = fast_config(pool=("maha", "knn"))
    result = run_battery(
        make_battery(data.train, data.test, None, classes=[0, 1], near=data.near, config=config), config
    )
    by_name = {a.name: a for a in result.audits}
    for name in ("clean/near-near-0", "clean/near-near-1"):
        audit = by_name[name]
        assert audit.fingerprint.fires and audit.contrast.recovered and audit.contrast.suspects_auto
        assert audit.contrast.identity_distinct and audit.verdict.label == HARD_CLEAN, audit.verdict.reasons
        designated = result.designated[name]
        assert designated.suspect == NOT_IN_FIT and designated.contrast.removed_rows == 0
        assert designated.verdict.label == HARD_CLEAN
    for c in (0, 1):
        leak = by_name[f"leaked/trained-class-{c}"]
        assert leak.verdict.label == LEAK and not leak.contrast.identity_distinct
        assert leak.contrast.identity.auroc <= leak.contrast.identity_limit
        assert result.designated[leak.name].verdict.label == LEAK
    assert (result.sensitivity, result.specificity) == (1.0, 1.0)
    assert (result.designated_sensitivity, result.designated_specificity) == (1.0, 1.0)
    payload = json.loads(json.dumps(result.to_dict()))
    assert payload["designated_specificity"] == 1.0 and len(payload["splits"]) == 6
