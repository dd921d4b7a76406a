"""Post-hoc OOD detectors: `create(name, **params).fit(fit_set, head).score(test)`; higher = more ID."""
from .base import Detector, Paper, Requirements
from .registry import available, create, get_class, register

# Importing the detector modules registers them, in documentation order.
from . import logit  # noqa: E402,F401

__all__ = ["Detector", "Paper", "Requirements", "available", "create", "get_class", "register"]
