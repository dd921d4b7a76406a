"""Post-hoc OOD detectors: `create(name, **params).fit(fit_set, head).score(test)`; higher = more ID."""

# Importing the detector modules registers them, in documentation order.
from . import (
    activation,  # noqa: E402,F401
    feature,  # noqa: E402,F401
    hybrid,  # noqa: E402,F401
    logit,  # noqa: E402,F401
    nac,  # noqa: E402,F401
)
from .base import Detector, Paper, Requirements
from .registry import available, create, get_class, register
from .tune import TunePoint, TuneResult, tune  # noqa: E402

__all__ = [
    "Detector",
    "Paper",
    "Requirements",
    "TunePoint",
    "TuneResult",
    "available",
    "create",
    "get_class",
    "register",
    "tune",
]
