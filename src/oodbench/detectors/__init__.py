"""Post-hoc OOD detectors: `create(name, **params).fit(fit_set, head).score(test)`; higher = more ID."""
from .base import Detector, Paper, Requirements
from .registry import available, create, get_class, register

# Importing the detector modules registers them, in documentation order.
from . import logit  # noqa: E402,F401
from . import activation  # noqa: E402,F401
from . import feature  # noqa: E402,F401
from . import nac  # noqa: E402,F401
from . import hybrid  # noqa: E402,F401
from .tune import TunePoint, TuneResult, tune  # noqa: E402

__all__ = ["Detector", "Paper", "Requirements", "TunePoint", "TuneResult", "available", "create", "get_class",
           "register", "tune"]
