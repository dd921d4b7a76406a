"""Pytest plugin: the constant-score mutant, every detector scores every row 0.0 (`-p tests.fakes.constant_scores`).

An end-to-end test that still passes under it checks only plumbing (exit codes, names echoed from its own
arguments), not the numbers; `tests/test_mutant.py` runs the end-to-end tests with this plugin and requires each
to fail.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def _zeros(self: Any, test: Any) -> np.ndarray:
    """The mutant's score: one 0.0 per test row, the shape and dtype the real one returns."""
    return np.zeros(len(test), dtype=np.float64)


def _patch(cls: type) -> None:
    """Replace `score` on `cls` and on every subclass that defines its own (none may escape the mutant)."""
    if "score" in vars(cls):
        cls.score = _zeros  # type: ignore[method-assign]
    for sub in cls.__subclasses__():
        _patch(sub)


def pytest_configure(config: Any) -> None:
    """Patch before any test module is imported; later subclasses (plugins defined by a test) too."""
    from oodbench.detectors.base import Detector

    _patch(Detector)
    original = Detector.__dict__.get("__init_subclass__")

    def init_subclass(cls: type, **kwargs: Any) -> None:
        if original is not None:
            original.__func__(cls, **kwargs)
        else:
            super(Detector, cls).__init_subclass__(**kwargs)
        if "score" in vars(cls):
            cls.score = _zeros  # type: ignore[method-assign]

    Detector.__init_subclass__ = classmethod(init_subclass)  # type: ignore[assignment]
