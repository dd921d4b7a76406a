"""Benchmark audit: is a near-OOD benchmark's designated OOD class inside the detectors' ID fit set?

- `fingerprint`: out-of-fold OracleLDA vs the best unsupervised pool AUROC, and the firing rule.
- `exclusion_contrast`: refit the pool without the suspect classes (or the fit rows nearest the OOD images).
- `leave_class_out`: retrain the linear head without the suspect classes on cached features.
- `adjudicate`: leak / hard-clean / clean / inconclusive, with the numbers that decided it.
- `make_battery` + `run_battery`: splits with known answers; sensitivity and specificity of the rule.
- `scan_suites`: published suites' OOD class lists against a training label space (WordNet), no images.
- `overlap_index`: L_k, a cheap pre-check of how mixed two sets are.

Every name below is imported from its module on first use (`oodbench.util.lazy`), so that importing the package
(and `oodbench --help`) stays fast.
"""

from __future__ import annotations

from ..util.lazy import lazy_package

_EXPORTS = {
    "AuditConfig": ".config",
    "DEFAULT_POOL": ".config",
    "OracleLDA": ".fingerprint",
    "oracle_lda": ".fingerprint",
    "Fingerprint": ".fingerprint",
    "fingerprint": ".fingerprint",
    "prepare_pool": ".fingerprint",
    "IsolationForestScorer": ".pool",
    "ContrastResult": ".contrast",
    "exclusion_contrast": ".contrast",
    "find_suspects": ".contrast",
    "LeaveClassOutResult": ".leave_class_out",
    "leave_class_out": ".leave_class_out",
    "logistic_regression_head": ".leave_class_out",
    "Verdict": ".adjudicate",
    "adjudicate": ".adjudicate",
    "LEAK": ".adjudicate",
    "HARD_CLEAN": ".adjudicate",
    "CLEAN": ".adjudicate",
    "INCONCLUSIVE": ".adjudicate",
    "SplitAudit": ".split",
    "audit_split": ".split",
    "audit_store": ".split",
    "BatterySplit": ".battery",
    "BatteryResult": ".battery",
    "make_battery": ".battery",
    "run_battery": ".battery",
    "battery_from_store": ".battery",
    "OverlapIndex": ".overlap",
    "overlap_index": ".overlap",
    "pair_overlap": ".overlap",
    "SuiteManifest": ".suites",
    "load_suite": ".suites",
    "load_suites": ".suites",
    "shipped_suites": ".suites",
    "LabelSpace": ".wordnet",
    "label_space": ".wordnet",
    "load_wordnet": ".wordnet",
    "ClassFinding": ".scan",
    "SuiteScan": ".scan",
    "scan_suite": ".scan",
    "scan_suites": ".scan",
    "suite_scope": ".scan",
}

__all__ = list(_EXPORTS)
lazy_package(__name__, _EXPORTS)
