"""`oodbench run EXPERIMENT.toml`: one declarative file → extraction, detectors, zero-shot scores, statistics, report.

Every name below is imported from its module on first use (`oodbench.util.lazy`), so that importing the package
(and `oodbench --help`) stays fast.
"""

from __future__ import annotations

from ..util.lazy import lazy_package

_EXPORTS = {
    "ExperimentConfig": ".config",
    "load_config": ".config",
    "parse_config": ".config",
    "RunReport": ".executor",
    "run_experiment": ".executor",
    "STAGES": ".units",
    "Plan": ".plan",
    "Unit": ".units",
    "build_plan": ".plan",
    "format_plan": ".plan",
}

__all__ = list(_EXPORTS)
lazy_package(__name__, _EXPORTS)
