"""Benchmark audit: is a near-OOD benchmark's designated OOD class inside the detectors' ID fit set?

- `fingerprint`: out-of-fold OracleLDA vs the best unsupervised pool AUROC, and the firing rule.
- `exclusion_contrast`: refit the pool without the suspect classes (or the fit rows nearest the OOD images).
- `leave_class_out`: retrain the linear head without the suspect classes on cached features.
- `adjudicate`: leak / hard-clean / clean / inconclusive, with the numbers that decided it.
- `make_battery` + `run_battery`: splits with known answers; sensitivity and specificity of the rule.
- `scan_suites`: published suites' OOD class lists against a training label space (WordNet), no images.
- `overlap_index`: L_k, a cheap pre-check of how mixed two sets are.
"""

from __future__ import annotations

from .adjudicate import CLEAN, HARD_CLEAN, INCONCLUSIVE, LEAK, Verdict, adjudicate
from .battery import BatteryResult, BatterySplit, battery_from_store, make_battery, run_battery
from .config import DEFAULT_POOL, AuditConfig
from .contrast import ContrastResult, exclusion_contrast, find_suspects
from .fingerprint import Fingerprint, OracleLDA, fingerprint, oracle_lda, prepare_pool
from .leave_class_out import LeaveClassOutResult, leave_class_out, logistic_regression_head
from .overlap import OverlapIndex, overlap_index, pair_overlap
from .pool import IsolationForestScorer
from .scan import ClassFinding, SuiteScan, scan_suite, scan_suites, suite_scope
from .split import SplitAudit, audit_split, audit_store
from .suites import SuiteManifest, load_suite, load_suites, shipped_suites
from .wordnet import LabelSpace, label_space, load_wordnet

__all__ = [
    "AuditConfig",
    "DEFAULT_POOL",
    "OracleLDA",
    "oracle_lda",
    "Fingerprint",
    "fingerprint",
    "prepare_pool",
    "IsolationForestScorer",
    "ContrastResult",
    "exclusion_contrast",
    "find_suspects",
    "LeaveClassOutResult",
    "leave_class_out",
    "logistic_regression_head",
    "Verdict",
    "adjudicate",
    "LEAK",
    "HARD_CLEAN",
    "CLEAN",
    "INCONCLUSIVE",
    "SplitAudit",
    "audit_split",
    "audit_store",
    "BatterySplit",
    "BatteryResult",
    "make_battery",
    "run_battery",
    "battery_from_store",
    "OverlapIndex",
    "overlap_index",
    "pair_overlap",
    "SuiteManifest",
    "load_suite",
    "load_suites",
    "shipped_suites",
    "LabelSpace",
    "label_space",
    "load_wordnet",
    "ClassFinding",
    "SuiteScan",
    "scan_suite",
    "scan_suites",
    "suite_scope",
]
