"""oodbench: out-of-distribution detection research at ImageNet scale.

The public names are imported on first use (`oodbench.util.lazy`), so that ``import oodbench`` and ``oodbench --help``
do not load scipy, scikit-learn, faiss, pyarrow or torch.
"""

__version__ = "0.1.0"

from .util.lazy import lazy_package  # noqa: E402

_EXPORTS = {
    "Head": ".core.outputs",
    "Outputs": ".core.outputs",
    "Store": ".core.store",
    "RunDir": ".core.rundir",
    "detectors": ".detectors:module",
    "evaluate_model": ".runner.quick",
    "metrics": ".core.metrics:module",
}
__all__ = [*_EXPORTS, "__version__"]
lazy_package(__name__, _EXPORTS)

from ._compat import install as _install_old_paths  # noqa: E402

_install_old_paths()
