"""oodbench: out-of-distribution detection research at ImageNet scale.

The public names are imported on first use (`oodbench.lazy`), so that ``import oodbench`` and ``oodbench --help``
do not load scipy, scikit-learn, faiss, pyarrow or torch.
"""

__version__ = "0.1.0"

from .lazy import lazy_package  # noqa: E402

_EXPORTS = {
    "Head": ".outputs",
    "Outputs": ".outputs",
    "Store": ".store",
    "RunDir": ".rundir",
    "detectors": ".detectors:module",
    "metrics": ".metrics:module",
}
__all__ = [*_EXPORTS, "__version__"]
lazy_package(__name__, _EXPORTS)
