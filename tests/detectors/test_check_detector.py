"""check_detector passes on every built-in and names the right check for each deliberately broken detector."""

from __future__ import annotations

from typing import Annotated, Literal

import numpy as np
import pytest

from oodbench.core.errors import DetectorError
from oodbench.core.outputs import Head, Outputs
from oodbench.detectors import Array, Detector, Paper, Range, Requirements, available, get_class
from oodbench.detectors.base import _FitInfo
from oodbench.detectors.testing import CHECKS, GROUPING_RTOL, check_data, check_detector


@pytest.mark.parametrize("name", available())
def test_every_builtin_passes_the_battery(name, small_params):
    report = check_detector(get_class(name), small_params.get(name, {}))
    assert report.ok, str(report)
    assert [r.name for r in report.results] == list(CHECKS)


def test_knn_with_an_ivf_index_passes_too():
    # The IVF index is a different faiss object (trained quantiser, nprobe) that save/load must carry.
    report = check_detector(get_class("knn"), {"k": 5, "index": "ivf", "nlist": 4, "nprobe": 4})
    assert report.ok, str(report)


# ----------------------------------------------------------------------------------------------- broken ones
class MeanDistance(Detector):
    """A correct detector: minus the distance to the fit set's mean feature."""

    name = "test-mean-distance"
    requires = Requirements.of(fit=("features",), score=("features",))
    paper = Paper("Nobody, A test detector", "tests 2026", "https://example.org")
    state = {"mean_": Array("float64", ("D",))}

    def __init__(self, scale: float = 1.0) -> None:
        self.scale = scale

    def _validate_params(self) -> None:
        self._check_positive(scale=self.scale)

    def _fit(self, fit_set, head):
        self.mean_ = np.asarray(fit_set.features, dtype=np.float64).mean(axis=0)

    def _score_chunk(self, chunk):
        return -self.scale * np.linalg.norm(np.asarray(chunk.features, dtype=np.float64) - self.mean_, axis=1)


class NotSelf(MeanDistance):
    def fit(self, fit_set, head=None):
        super().fit(fit_set, head)
        return None


class ChangesParams(MeanDistance):
    def __init__(self, scale: float = 1.0) -> None:
        self.scale = 2 * scale


class NoValidation(MeanDistance):
    def __init__(self, scale=1.0) -> None:  # no annotation, no _validate_params: nothing checks the type
        self.scale = scale

    def _validate_params(self) -> None:
        pass


class UndeclaredState(MeanDistance):
    def _fit(self, fit_set, head):
        super()._fit(fit_set, head)
        self.spread_ = np.asarray(fit_set.features, dtype=np.float64).std(axis=0)  # learned, not in `state`


class Float32Scores(MeanDistance):
    def score(self, test):
        return super().score(test).astype(np.float32)


class ChunkDependent(MeanDistance):
    def _score_chunk(self, chunk):
        distance = super()._score_chunk(chunk)
        return distance - distance.mean()  # standardised per chunk: depends on the company a row keeps


class OrderDependent(MeanDistance):
    def score(self, test):
        scores = super().score(test)
        smoothed = np.empty_like(scores)
        smoothed[0] = scores[0]
        for i in range(1, len(scores)):  # running smoothing: row i depends on rows before it
            smoothed[i] = 0.5 * smoothed[i - 1] + 0.5 * scores[i]
        return smoothed


class WritesIntoFitSet(MeanDistance):
    def _fit(self, fit_set, head):
        fit_set.features[:] = np.maximum(fit_set.features, 0.5)  # "clipping" in place: fails on a read-only map
        super()._fit(fit_set, head)


class WritesIntoTestChunk(MeanDistance):
    def _score_chunk(self, chunk):
        chunk.features[:] -= self.mean_.astype(chunk.features.dtype)  # the chunk is a view of the caller's array
        return -np.linalg.norm(np.asarray(chunk.features, dtype=np.float64), axis=1)


class InputPrecision(MeanDistance):
    def _score_chunk(self, chunk):
        # Computed in the input's dtype after a large offset: float32 cancels most digits.
        shifted = chunk.features + chunk.features.dtype.type(1e5)
        centre = (self.mean_ + 1e5).astype(chunk.features.dtype)
        return (np.einsum("nd,nd->n", shifted, shifted) - centre @ centre).astype(np.float64)


class Unseeded(MeanDistance):
    def _fit(self, fit_set, head):
        super()._fit(fit_set, head)
        self.direction_ = np.random.default_rng().normal(size=fit_set.num_features)

    def _score_chunk(self, chunk):
        return super()._score_chunk(chunk) + np.asarray(chunk.features, dtype=np.float64) @ self.direction_


class SkipsRequirementChecks(MeanDistance):
    requires = Requirements.of(fit=("features", "labels"), score=("features",))

    def fit(self, fit_set, head=None):
        self._fit(fit_set, head)  # bypasses the base class's checks
        self.fit_info_ = _FitInfo(fit_set.num_features, None)
        return self

    def _fit(self, fit_set, head):
        labels = fit_set.labels
        self.mean_ = np.asarray(fit_set.features, dtype=np.float64)[labels == labels.max()].mean(axis=0)


class ReadsUndeclaredByIndex(MeanDistance):
    def _fit(self, fit_set, head):  # declares features only, reads labels
        self.mean_ = np.asarray(fit_set.features, dtype=np.float64)[fit_set.labels[:] == 0].mean(axis=0)


class ReadsUndeclaredByAsarray(MeanDistance):
    def _fit(self, fit_set, head):  # np.asarray on the wire gives its poison (-1 labels): class 0 is empty
        labels = np.asarray(fit_set.labels)
        self.mean_ = np.asarray(fit_set.features, dtype=np.float64)[labels == 0].mean(axis=0)


class IgnoresNaN(MeanDistance):
    def score(self, test):
        if not hasattr(self, "mean_"):
            raise DetectorError(f"{self.name} is not fitted")
        features = np.nan_to_num(np.asarray(test.features, dtype=np.float64))
        return -np.linalg.norm(features - self.mean_, axis=1)


class OwnScoreNoShapeCheck(MeanDistance):
    def score(self, test):
        if not hasattr(self, "mean_"):
            raise DetectorError(f"{self.name} is not fitted")
        features = np.asarray(test.features, dtype=np.float64)[:, : self.mean_.shape[0]]
        if not np.isfinite(features).all():
            raise DetectorError("NaN in features")
        return -np.linalg.norm(features - self.mean_, axis=1)


class ScoresUnfitted(MeanDistance):
    def score(self, test):
        mean = getattr(self, "mean_", np.zeros(test.num_features))
        return -np.linalg.norm(np.asarray(test.features, dtype=np.float64) - mean, axis=1)


class LosesStateOnSave(MeanDistance):
    def _fit(self, fit_set, head):
        self._mean = np.asarray(fit_set.features, dtype=np.float64).mean(axis=0)  # no trailing underscore

    def _score_chunk(self, chunk):
        return -np.linalg.norm(np.asarray(chunk.features, dtype=np.float64) - self._mean, axis=1)


BROKEN = {
    NotSelf: "fit_returns_self",
    ChangesParams: "params_round_trip",
    NoValidation: "bad_params_refused",
    Float32Scores: "scores_float64_finite",
    ChunkDependent: "chunk_invariance",
    OrderDependent: "permutation_equivariance",
    WritesIntoFitSet: "memmap_fit",
    InputPrecision: "float32_float64",
    Unseeded: "deterministic",
    SkipsRequirementChecks: "missing_arrays_named",
    ReadsUndeclaredByIndex: "undeclared_arrays_unread",
    ReadsUndeclaredByAsarray: "undeclared_arrays_unread",
    IgnoresNaN: "nan_refused",
    OwnScoreNoShapeCheck: "shape_errors_clear",
    ScoresUnfitted: "unfitted_refuses",
    LosesStateOnSave: "save_load",
    UndeclaredState: "state_names",
    WritesIntoTestChunk: "inputs_unchanged",
}


def test_the_correct_detector_passes():
    report = check_detector(MeanDistance)
    assert report.ok, str(report)


def test_every_check_has_a_broken_detector():
    assert set(BROKEN.values()) == set(CHECKS)


@pytest.mark.parametrize("cls", list(BROKEN), ids=lambda c: c.__name__)
def test_each_broken_detector_fails_its_check(cls):
    report = check_detector(cls)
    failed = {r.name: r.message for r in report.failed}
    assert BROKEN[cls] in failed, str(report)
    assert failed[BROKEN[cls]]  # a reason is given
    assert f"FAIL {BROKEN[cls]}" in str(report)
    with pytest.raises(AssertionError, match=BROKEN[cls]):
        report.raise_if_failed()


def test_reasons_say_what_went_wrong():
    def reason(cls, check):
        return {r.name: r.message for r in check_detector(cls, checks=[check]).results}[check]

    assert "_mean" in reason(LosesStateOnSave, "state_names")
    assert "spread_, which the class's `state` does not declare" in reason(UndeclaredState, "state_names")
    assert "labels of the fit set" in reason(ReadsUndeclaredByIndex, "undeclared_arrays_unread")
    assert "one row per chunk" in reason(ChunkDependent, "chunk_invariance")
    assert "scale='not-a-number' was accepted" in reason(NoValidation, "bad_params_refused")
    assert "scale" in reason(ChangesParams, "params_round_trip")
    assert "read-only" in reason(WritesIntoFitSet, "memmap_fit")


def test_grouping_tolerance_catches_a_tiny_chunk_effect():
    # The tolerance is not so loose that a chunk effect of 10x the bound slips through (|scores| > 1 here).
    class Nudged(MeanDistance):
        def _score_chunk(self, chunk):
            base = super()._score_chunk(chunk)
            return base * (1 + 10 * GROUPING_RTOL) if len(base) == 1 else base

    assert not check_detector(Nudged, checks=["chunk_invariance"]).ok


def test_instances_and_unknown_checks():
    report = check_detector(MeanDistance(scale=2.0), checks=["fit_returns_self"])
    assert report.ok and report.detector == "MeanDistance(scale=2.0)" and len(report.results) == 1
    with pytest.raises(DetectorError, match="unknown checks nope"):
        check_detector(MeanDistance, checks=["nope"])
    with pytest.raises(DetectorError, match="Detector subclass"):
        check_detector(int)
    failed = check_detector(MeanDistance, {"no_such": 1})
    assert not failed.ok and "cannot create the detector" in failed.failed[0].message


def test_check_data_has_the_declared_extras_and_a_consistent_head():
    data = check_data(Requirements.of(fit=("extra.nac.layer3",), score=("features",)))
    assert set(data.fit.extras) == {"nac.layer3"} and data.fit.extras["nac.layer3"].shape == (400, 8)
    assert data.test.labels is not None and len(data.test) == 200
    data.head.check_outputs(data.fit)
    assert isinstance(data.head, Head) and isinstance(data.fit, Outputs)


# ----------------------------------------------------------------------------------------------- typed parameters
class Typed(Detector):
    """A minimal plugin: typed parameters, declared state, and no hand-written parameter checks."""

    name = "test-typed"
    requires = Requirements.of(fit=("features",), score=("features",))
    state = {"mean_": Array("float64", ("D",))}

    def __init__(
        self,
        scale: float = 1.0,
        power: Annotated[int, Range(1, 4)] = 2,
        centred: bool = True,
        norm: Literal["l1", "l2"] = "l2",
        shift: Annotated[float, Range(0, 1, open_low=True)] = 0.5,
        label: str = "x",
        cap: int | None = None,
    ) -> None:
        self.scale = scale
        self.power = power
        self.centred = centred
        self.norm = norm
        self.shift = shift
        self.label = label
        self.cap = cap

    def _fit(self, fit_set, head):
        self.mean_ = np.asarray(fit_set.features, dtype=np.float64).mean(axis=0)

    def _score_chunk(self, chunk):
        x = np.asarray(chunk.features, dtype=np.float64) - (self.mean_ if self.centred else 0.0)
        order = 1 if self.norm == "l1" else 2
        return -self.scale * np.linalg.norm(x, ord=order, axis=1) ** self.power + self.shift


def test_a_minimal_typed_plugin_passes_with_no_hand_written_validation():
    assert "_validate_params" not in vars(Typed)
    report = check_detector(Typed)
    assert report.ok, str(report)


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"scale": "x"}, "scale must be a finite number; got 'x'"),
        ({"scale": float("nan")}, "scale must be a finite number"),
        ({"scale": True}, "scale must be a finite number"),
        ({"power": 2.0}, "power must be an integer; got 2.0"),
        ({"power": 5}, r"power must be a number in \[1, 4\]; got 5"),
        ({"centred": 1}, "centred must be True or False"),
        ({"norm": "l3"}, "norm must be one of 'l1', 'l2'; got 'l3'"),
        ({"shift": 0}, r"shift must be a number in \(0, 1\]; got 0"),
        ({"label": 3}, "label must be a string"),
        ({"cap": "none"}, "cap must be an integer or None"),
    ],
)
def test_annotated_parameter_types_and_ranges_are_checked_at_creation(params, message):
    with pytest.raises(DetectorError, match=message):
        Typed(**params).validate_params()
    Typed(scale=3, power=4, centred=False, norm="l1", shift=1.0, cap=7).validate_params()  # ints pass as floats
