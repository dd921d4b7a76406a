"""The registry holds the paper's 21 detectors and the peer libraries' post-hoc ones in documentation order, each with
paper metadata and documented defaults."""

from __future__ import annotations

import numpy as np
import pytest

from oodbench.core.errors import DataError, DetectorError
from oodbench.core.outputs import Outputs
from oodbench.detectors import available, create, get_class

NAMES = (
    "msp maxlogit kl_matching energy gen react ash_s scale dice maha rmaha maha++ rmaha++ knn cosine mcm fdbd "
    "neco nac vim nnguide"
).split()
# Post-hoc detectors of pytorch-ood and OpenOOD beyond the paper's 21, registered after them.
PEER_NAMES = "tempscale entropy gradnorm ash_p ash_b residual she openmax relation".split()
# Detectors whose arrays come from extraction (tests/detectors/test_network.py), registered last.
NETWORK = ["odin", "rankfeat", "gram", "mds_ensemble"]


def test_available_is_the_21_then_the_peer_then_the_network_detectors_in_order():
    # A new built-in module registers after these (tests/detectors/test_catalog.py); none is pinned here.
    assert available()[: len(NAMES + PEER_NAMES + NETWORK)] == NAMES + PEER_NAMES + NETWORK


@pytest.mark.parametrize("name", NAMES + PEER_NAMES)
def test_every_detector_has_paper_and_defaults(name):
    cls = get_class(name)
    assert cls.paper is not None and cls.paper.url.startswith("https://") and cls.paper.venue
    detector = create(name)
    assert detector.get_params() == cls.default_params()
    assert repr(detector).startswith(cls.__name__ + "(")
    if cls.default_params() and name in NAMES[5:] + PEER_NAMES:  # each default's source is documented
        assert cls.paper.notes, f"{name}: each default needs its source in the paper notes"


@pytest.mark.parametrize("name", NAMES + PEER_NAMES)
def test_unfitted_detector_refuses_to_score(name):
    with pytest.raises(DetectorError, match="not fitted"):
        create(name).score(Outputs(np.ones((1, 2))))


@pytest.mark.parametrize("name", NAMES + PEER_NAMES)
def test_every_detector_fits_and_scores_end_to_end(problem, small_params, name):
    detector = create(name, **small_params.get(name, {})).fit(problem.fit, problem.head)
    scores = detector.score(problem.test)
    assert scores.shape == (len(problem.test),) and scores.dtype == np.float64
    assert np.isfinite(scores).all() and np.ptp(scores) > 0
    # Scoring row by row gives the same numbers as scoring the whole set (no cross-row leakage in a chunk).
    single = np.concatenate(
        [detector.score(problem.test.subset(slice(i, i + 1))) for i in range(0, len(problem.test), 37)]
    )
    # float32 BLAS products may round differently for one row than for a block: 1e-6, far below any leakage.
    np.testing.assert_allclose(single, scores[::37], rtol=1e-6, atol=1e-9)


def test_unmet_lists_every_missing_array_and_the_head(problem):
    maha = create("maha")  # fit: features, labels; score: features
    assert maha.unmet(problem.fit, {"test": problem.test}, has_head=False) == []
    assert maha.unmet({"features"}, {"a": {"features"}, "b": set()}, has_head=False) == [
        "fit set lacks labels",
        "b lacks features",
    ]
    react = create("react")  # fit: features and the head
    assert react.unmet({"features"}, has_head=False) == ["no head stored for the model"]
    assert react.unmet({"features"}, has_head=True) == []


def test_unmet_honours_parameter_dependent_requirements():
    arrays = {"features", "labels"}
    assert create("neco").unmet(arrays, {"ood": arrays}, has_head=False) == []
    # use_maxlogit adds logits to what scoring needs; the class's `requires` alone would miss it.
    assert create("neco", use_maxlogit=True).unmet(arrays, {"ood": arrays}, has_head=False) == ["ood lacks logits"]
    nac = create("nac", layers=("layer4",))
    assert nac.unmet({"features", "logits"}, has_head=True) == ["fit set lacks extra.nac.layer4"]


def test_scoring_hands_the_detector_only_its_declared_arrays(problem):
    # msp declares logits only: NaN features (unchecked) must not matter, NaN logits must be refused by name.
    detector = create("msp").fit(problem.fit)
    nan_features = np.full(problem.test.features.shape, np.nan, dtype=np.float32)
    unchecked = Outputs(nan_features, problem.test.logits, check_finite=False)
    np.testing.assert_array_equal(detector.score(unchecked), detector.score(problem.test))
    logits = np.array(problem.test.logits)
    logits[7, 2] = np.nan
    with pytest.raises(DataError, match="logits contains NaN or inf values \\(first at row 7\\)"):
        detector.score(Outputs(problem.test.features, logits, check_finite=False))
