"""Post-hoc OOD detectors: `create(name, **params).fit(fit_set, head).score(test)`; higher = more ID."""

import importlib as _importlib
import re as _re
from pathlib import Path as _Path

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
from .tune import TunePoint, TuneResult, tune

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


# The built-in detector modules: every module of this package that registers a class with ``@register`` at the
# start of a line is imported here, so a new detector is one new file. Registration order is the documentation
# order: these modules first, in this order, then any other detector module by name.
_DOCUMENTED_ORDER = (
    "logit",
    "activation",
    "feature",
    "nac",
    "hybrid",
    "confidence",
    "shaping",
    "subspace",
    "patterns",
    "network",
)
_REGISTERS = _re.compile(r"^@register\(", _re.MULTILINE)


def _detector_modules(folder: _Path = _Path(__file__).parent) -> list[str]:
    """Names of the modules in `folder` (this package) that register detectors, in registration order."""
    found = {
        path.stem
        for path in folder.glob("*.py")
        if not path.stem.startswith("_") and _REGISTERS.search(path.read_text(encoding="utf-8"))
    }
    return [m for m in _DOCUMENTED_ORDER if m in found] + sorted(found - set(_DOCUMENTED_ORDER))


for _module in _detector_modules():
    _importlib.import_module(f"{__name__}.{_module}")
