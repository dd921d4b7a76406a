"""Statistics on evaluation results: subsampling, confidence intervals, DeLong's test, spread versus noise."""

from .delong import DeLongResult, delong_covariance, delong_interval, delong_test, structural_components
from .intervals import (
    BootstrapResult,
    Interval,
    bootstrap,
    bootstrap_replicates,
    clopper_pearson_interval,
    fpr_interval,
    wilson_interval,
)
from .roc import roc_curve
from .rundata import RunData, load_run, load_runs
from .runs import IntervalRecord, compare_in_run, intervals_for_run
from .spread import SpreadSummary, spread_vs_noise
from .subsample import (
    PAPER_N,
    SubsampleStudy,
    SubsampleSummary,
    closed_form_se,
    rank_correlation,
    resolve_n,
    subsample_curve,
    subsample_fpr,
    subsample_run,
)

__all__ = [
    "BootstrapResult",
    "DeLongResult",
    "Interval",
    "IntervalRecord",
    "RunData",
    "PAPER_N",
    "SpreadSummary",
    "SubsampleStudy",
    "SubsampleSummary",
    "bootstrap",
    "bootstrap_replicates",
    "clopper_pearson_interval",
    "closed_form_se",
    "compare_in_run",
    "delong_covariance",
    "delong_interval",
    "delong_test",
    "fpr_interval",
    "intervals_for_run",
    "load_run",
    "load_runs",
    "rank_correlation",
    "resolve_n",
    "roc_curve",
    "spread_vs_noise",
    "structural_components",
    "subsample_curve",
    "subsample_fpr",
    "subsample_run",
    "wilson_interval",
]
