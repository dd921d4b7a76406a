"""Evaluation: post-hoc detectors fitted and scored on a store's outputs, and classification accuracy beside them.

`evaluate_store` and friends live in `oodbench.evaluation.evaluate`; they are re-exported here and imported on first
use, so that ``oodbench --help`` stays fast.
"""

from __future__ import annotations

from ..util.lazy import lazy_package

_EXPORTS = {
    name: ".evaluate"
    for name in (
        "EvaluationResult",
        "FitSetTooSmall",
        "NothingEvaluated",
        "check_fit_size",
        "evaluate_store",
        "evaluate_outputs",
        "normalize_detectors",
        "run_description",
    )
}
__all__ = list(_EXPORTS)
lazy_package(__name__, _EXPORTS)
