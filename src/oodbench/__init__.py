"""oodbench: out-of-distribution detection research at ImageNet scale."""

__version__ = "0.1.0"

from . import detectors, metrics  # noqa: E402
from .outputs import Head, Outputs  # noqa: E402
from .store import Store  # noqa: E402

__all__ = ["Head", "Outputs", "Store", "detectors", "metrics", "__version__"]
