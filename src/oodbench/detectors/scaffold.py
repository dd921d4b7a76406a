"""`oodbench detectors new NAME`: a plugin package with one detector, its entry point, and a check_detector test.

The package works after ``pip install -e`` with no edit: the detector (a Gaussian-mixture log-likelihood at
the class means, to be replaced by the author's method) passes `check_detector`, and the entry point
``oodbench.detectors`` registers it under NAME for every oodbench command.
"""

from __future__ import annotations

import keyword
import re
from pathlib import Path

from ..core.errors import DetectorError

__all__ = ["scaffold", "identifiers"]

_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_+.-]*\Z")


def identifiers(name: str) -> dict[str, str]:
    """The names derived from a detector name: distribution, package (module), class."""
    if not _NAME.match(name):
        raise DetectorError(
            f"invalid detector name {name!r}: start with a letter; use letters, digits and _ + . - (e.g. my_detector)"
        )
    words = [w for w in re.split(r"[^A-Za-z0-9]+", name) if w]
    ident = "_".join(w.lower() for w in words)
    package = f"oodbench_{ident}"
    cls = "".join(w[:1].upper() + w[1:] for w in words)
    if keyword.iskeyword(cls) or not cls.isidentifier():
        cls = f"Detector{cls}"
    return {
        "name": name,
        "distribution": "oodbench-" + "-".join(w.lower() for w in words),
        "package": package,
        "ident": ident,
        "cls": cls,
    }


_PYPROJECT = """\
[build-system]
requires = ["setuptools>=64"]
build-backend = "setuptools.build_meta"

[project]
name = "{distribution}"
version = "0.1.0"
description = "The {name} out-of-distribution detector, as an oodbench plugin"
readme = "README.md"
requires-python = ">=3.10"
dependencies = ["oodbench", "numpy", "scipy"]

# oodbench finds detectors through this entry-point group: NAME = "module:Class".
[project.entry-points."oodbench.detectors"]
"{name}" = "{package}.detector:{cls}"

[project.optional-dependencies]
test = ["pytest"]

[tool.setuptools.packages.find]
where = ["src"]
"""

_DETECTOR = '''\
"""{name}: an oodbench detector (replace the method below with yours; keep the structure)."""

from __future__ import annotations

from typing import Annotated

import numpy as np
from scipy.special import logsumexp

from oodbench.detectors import Array, Detector, Paper, Range, Requirements
from oodbench.core.outputs import Head, Outputs


class {cls}(Detector):
    """Log-likelihood of a feature under an isotropic Gaussian mixture at the class means (higher = more ID)."""

    # The arrays fit() and score() read; anything else is never handed to the detector.
    requires = Requirements.of(fit=("features", "labels"), score=("features",))
    # What fit() learns, with dtype and shape (D features, N fit rows, K declared below): save() writes exactly
    # this and load() accepts nothing else, so a saved detector file is data, never code.
    state = {{
        "classes_": Array("int64", ("K",)),
        "means_": Array("float64", ("K", "D")),
        "mean_norms_": Array("float64", ("K",)),
    }}
    state_dims = {{"K": "N"}}  # K, the classes present in the fit set, is at most N
    paper = Paper(
        "Your Name et al., The title of your paper",
        "Venue 2027",
        "https://arxiv.org/abs/0000.00000",
        "sigma=1.0: the paper's default bandwidth (say where each default comes from)",
    )

    # Hyper-parameters only, stored as given. The annotations are checked when the detector is created: a
    # float, here above 0 (Range); int, bool, str and Literal[...] work the same way. No hand-written checks.
    def __init__(self, sigma: Annotated[float, Range(0, None, open_low=True)] = 1.0) -> None:
        self.sigma = sigma

    def _fit(self, fit_set: Outputs, head: Head | None) -> None:
        # Learned state: attributes whose names end with "_", declared in `state` above.
        # The fit set may be memory-mapped and large: one vectorised pass, no loop over rows.
        features = np.asarray(fit_set.features, dtype=np.float64)
        classes, inverse = np.unique(np.asarray(fit_set.labels, dtype=np.int64), return_inverse=True)
        sums = np.zeros((len(classes), features.shape[1]))
        np.add.at(sums, inverse, features)
        self.classes_ = classes
        self.means_ = sums / np.bincount(inverse)[:, None]
        self.mean_norms_ = np.einsum("cd,cd->c", self.means_, self.means_)

    def _score_chunk(self, chunk: Outputs) -> np.ndarray:
        # Called on row chunks of the test set (in memory); return float64 scores, one per row.
        x = np.asarray(chunk.features, dtype=np.float64)
        squared = np.einsum("nd,nd->n", x, x)[:, None] - 2.0 * (x @ self.means_.T) + self.mean_norms_
        return logsumexp(-np.maximum(squared, 0.0) / (2.0 * self.sigma**2), axis=1)
'''

_INIT = '''\
"""The {name} detector for oodbench (registered through the entry point in pyproject.toml)."""

from .detector import {cls}

__all__ = ["{cls}"]
'''

_TEST = '''\
"""{name} passes oodbench's detector battery and is registered once installed."""

from oodbench.detectors import available, get_class
from oodbench.detectors.testing import check_detector

from {package}.detector import {cls}


def test_{ident}_passes_check_detector():
    check_detector({cls}).raise_if_failed()


def test_{ident}_is_registered_by_its_entry_point():
    assert "{name}" in available()
    assert get_class("{name}") is {cls}
'''

_README = """\
# {distribution}

The `{name}` out-of-distribution detector as an oodbench plugin.

    python -m pip install -e '.[test]'   # registers "{name}" (entry point oodbench.detectors), installs pytest
    oodbench detectors                   # lists it, with this distribution and version
    python -m pytest tests               # runs oodbench.detectors.testing.check_detector on it

`python` is the interpreter of the environment oodbench is installed in (after `make demo` in oodbench's
checkout: `.venv/bin/python`), so that pytest runs where oodbench is importable.
    oodbench evaluate --store STORE --model MODEL --fit FIT --id ID --ood OOD -d {name},energy

Edit `src/{package}/detector.py`: the parameters in `__init__` (with their types), what `fit` learns in
`_fit` (attributes ending with `_`, declared in `state`), the score of a chunk of rows in `_score_chunk`,
the arrays it needs in `requires`, and the paper in `paper`.
"""


def scaffold(name: str, directory: str | Path | None = None, *, force: bool = False) -> Path:
    """Write a plugin package for detector `name` into `directory` (default ./oodbench-NAME); returns it."""
    ids = identifiers(name)
    root = Path(directory) if directory is not None else Path(ids["distribution"])
    if root.exists() and any(root.iterdir()) and not force:
        raise DetectorError(f"{root} exists and is not empty; choose another --out or pass --force")
    files = {
        "pyproject.toml": _PYPROJECT,
        "README.md": _README,
        f"src/{ids['package']}/__init__.py": _INIT,
        f"src/{ids['package']}/detector.py": _DETECTOR,
        f"tests/test_{ids['ident']}.py": _TEST,
    }
    for relative, template in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(template.format(**ids))
    return root
