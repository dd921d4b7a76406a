"""Post-hoc OOD detectors: `create(name, **params).fit(fit_set, head).score(test)`; higher = more ID."""

# Importing the detector modules registers them, in documentation order (so the import sorter must keep off).
# isort: off
from . import logit  # noqa: F401
from . import activation  # noqa: F401
from . import feature  # noqa: F401
from . import nac  # noqa: F401
from . import hybrid  # noqa: F401
from . import confidence  # noqa: F401
from . import shaping  # noqa: F401
from . import subspace  # noqa: F401
from . import patterns  # noqa: F401
from . import network  # noqa: F401

# isort: on
from .artefact import check_provenance, fit_provenance, load, read_meta, save, saved_score_key
from .base import Detector, Paper, Range, Requirements
from .registry import (
    Origin,
    available,
    create,
    detector_fingerprint,
    get_class,
    load_plugins,
    origin,
    plugin_failures,
    plugin_versions,
    register,
)
from .state import Array, FlatIndex, IVFIndex, Keyed, Object, Optional, Scalar
from .tune import TunePoint, TuneResult, tune  # noqa: E402

__all__ = [
    "Array",
    "Detector",
    "FlatIndex",
    "IVFIndex",
    "Keyed",
    "Object",
    "Optional",
    "Range",
    "Scalar",
    "Origin",
    "Paper",
    "Requirements",
    "TunePoint",
    "TuneResult",
    "available",
    "check_provenance",
    "create",
    "detector_fingerprint",
    "fit_provenance",
    "get_class",
    "load",
    "load_plugins",
    "origin",
    "plugin_failures",
    "plugin_versions",
    "read_meta",
    "register",
    "save",
    "saved_score_key",
    "tune",
]
