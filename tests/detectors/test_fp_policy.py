"""Scoring runs under one floating-point policy: overflow, division by zero and invalid values raise no numpy
warning; a score they make non-finite ends in one `DetectorError` line, and `oodbench score` prints one line."""

from __future__ import annotations

import json
import shutil
import warnings

import numpy as np
import pytest

from oodbench.core.errors import DetectorError
from oodbench.core.outputs import Outputs
from oodbench.core.store import Store
from oodbench.detectors import create, load, save

from ..cli_once import invoke
from .hostile.cases import PROVENANCE, fit_data

pytestmark = pytest.mark.hostile


def _score_quietly(detector, test):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            outcome = detector.score(test)
        except DetectorError as exc:
            outcome = exc
    numpy_warnings = [w for w in caught if issubclass(w.category, RuntimeWarning)]
    assert numpy_warnings == [], [str(w.message) for w in numpy_warnings]
    return outcome


@pytest.mark.parametrize("temperature", [5e-324, 1e-320, 1e-310, 1e-300])
def test_a_tiny_energy_temperature_is_one_line_without_warnings(temperature):
    fit, head = fit_data()
    outcome = _score_quietly(create("energy", temperature=temperature).fit(fit, head), fit)
    if isinstance(outcome, DetectorError):
        assert "\n" not in str(outcome)
    else:  # a temperature that is tiny but still divides the logits finitely gives finite scores
        assert np.isfinite(outcome).all()


@pytest.mark.parametrize("scale", [1e20, 1e30])
def test_huge_logits_are_one_line_or_finite_without_warnings(scale):
    fit, head = fit_data()
    test = Outputs(fit.features, (fit.logits.astype(np.float64) * scale).astype(np.float32), fit.labels)
    for name in ("energy", "msp", "maxlogit"):
        outcome = _score_quietly(create(name).fit(fit, head), test)
        assert isinstance(outcome, DetectorError) or np.isfinite(outcome).all()


@pytest.mark.parametrize("radius", [1e308, 1.7e308, 1e200])
def test_a_forged_radius_is_one_line_without_warnings(tmp_path, radius):
    fit, head = fit_data()
    save(create("maha").fit(fit, head), tmp_path / "maha", provenance=PROVENANCE)
    meta_path = tmp_path / "maha" / "detector.json"
    meta = json.loads(meta_path.read_text())
    found = []

    def forge(node):
        if isinstance(node, dict):
            for key, value in node.items():
                if key == "radius_":
                    node[key] = radius
                    found.append(key)
                else:
                    forge(value)

    forge(meta["state"])
    assert found, "maha's saved state holds no radius_"
    meta_path.write_text(json.dumps(meta))
    try:
        detector = load(tmp_path / "maha")
    except DetectorError:
        return  # refused on load: one line as well
    outcome = _score_quietly(detector, fit)
    assert isinstance(outcome, DetectorError) or np.isfinite(outcome).all()


def test_score_prints_one_line_for_a_tiny_temperature(tmp_path):
    fit, head = fit_data()
    save(create("energy", temperature=5e-324).fit(fit, head), tmp_path / "energy", provenance=PROVENANCE)
    store = Store(tmp_path / "store")
    store.write_head("tiny", head, provenance=dict(PROVENANCE))
    store.write_outputs("tiny", "new", fit.subset(slice(0, 50)), provenance=dict(PROVENANCE), item_hash="items-new")
    shutil.rmtree(tmp_path / "unused", ignore_errors=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        args = ["score", "--detector", str(tmp_path / "energy"), "--store", str(store.root), "--dataset", "new"]
        result = invoke([*args, "--model", "tiny"])
    assert result.exit_code == 2 and len(result.output.strip().splitlines()) == 1, result.output
    assert not [w for w in caught if issubclass(w.category, RuntimeWarning)]
