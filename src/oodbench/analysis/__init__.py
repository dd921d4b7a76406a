"""Statistics on evaluation results: subsampling, confidence intervals, DeLong's test, spread versus noise.

Every name below is imported from its module on first use (`oodbench.util.lazy`), so that importing the package
(and `oodbench --help`) stays fast.
"""

from __future__ import annotations

from ..util.lazy import lazy_package

_EXPORTS = {
    "BootstrapResult": ".intervals",
    "DeLongResult": ".delong",
    "Interval": ".intervals",
    "IntervalRecord": ".runs",
    "RunData": ".rundata",
    "PAPER_N": ".subsample",
    "SpreadSummary": ".spread",
    "SubsampleStudy": ".subsample",
    "SubsampleSummary": ".subsample",
    "bootstrap": ".intervals",
    "bootstrap_many": ".intervals",
    "bootstrap_replicates": ".intervals",
    "bootstrap_replicates_many": ".intervals",
    "clopper_pearson_interval": ".intervals",
    "closed_form_se": ".subsample",
    "compare_in_run": ".runs",
    "delong_covariance": ".delong",
    "delong_interval": ".delong",
    "delong_test": ".delong",
    "fpr_interval": ".intervals",
    "interval_records": ".runs",
    "intervals_for_run": ".runs",
    "load_run": ".rundata",
    "load_runs": ".rundata",
    "rank_correlation": ".subsample",
    "resolve_n": ".subsample",
    "roc_curve": ".roc",
    "spread_vs_noise": ".spread",
    "structural_components": ".delong",
    "subsample_curve": ".subsample",
    "subsample_fpr": ".subsample",
    "subsample_run": ".subsample",
    "wilson_interval": ".intervals",
}

__all__ = list(_EXPORTS)
lazy_package(__name__, _EXPORTS)
