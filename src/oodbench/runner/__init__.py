"""`oodbench run EXPERIMENT.toml`: one declarative file → extraction, detectors, zero-shot scores, statistics, report."""

from .config import ExperimentConfig, load_config, parse_config
from .engine import RunReport, run_experiment
from .plan import STAGES, Plan, Unit, build_plan, format_plan

__all__ = [
    "ExperimentConfig",
    "load_config",
    "parse_config",
    "RunReport",
    "run_experiment",
    "STAGES",
    "Plan",
    "Unit",
    "build_plan",
    "format_plan",
]
