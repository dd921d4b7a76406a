"""`check_detector`: the battery every detector must pass, built-in or plugin (scikit-learn's `check_estimator`).

    from oodbench.detectors.testing import check_detector

    def test_my_detector_passes_the_battery():
        check_detector(MyDetector, params={"k": 5}).raise_if_failed()

Each check has a name and a one-line explanation (`CHECKS`); the report lists every check with what failed
and why. The data is a small synthetic classification problem (`check_data`): features, logits from a
consistent linear head, labels, and an extra for each ``extra.<name>`` the detector declares.
"""

from __future__ import annotations

import tempfile
import traceback
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..core.errors import DetectorError, OodbenchError
from ..core.outputs import Head, Outputs
from . import registry
from .artefact import fitted_state, inferred_spec, load, save
from .base import Detector, Requirements

__all__ = ["CHECKS", "CheckData", "CheckReport", "CheckResult", "check_data", "check_detector"]

# Scoring the same rows in other groupings (chunks, slices, orders) may change float32 BLAS blocking and so the
# rounding of each D-term product: at most about D·2⁻²⁴ relative to the summed magnitudes (≈ 1e-6 for D = 16).
# 1e-5 of the scores' scale leaves a margin of ten; a detector that mixes rows differs by O(scale).
GROUPING_RTOL = 1e-5
# float32 vs float64 inputs hold the same values (float32 → float64 is exact), so only the detector's own
# arithmetic differs: a float32 pipeline rounds each step at 2⁻²⁴ ≈ 6e-8, amplified by the condition of the
# fit (≤ ~1e3 on the check data, whose covariances are well conditioned) and a few dozen steps: ≲ 1e-4 of scale.
DTYPE_RTOL = 1e-4


class CheckFailed(Exception):
    """A check's verdict: the detector does not do what the check requires (the message says what)."""


@dataclass(frozen=True)
class CheckResult:
    """One check: its name, what it checks, whether it passed, and why not."""

    name: str
    explanation: str
    passed: bool
    message: str = ""


@dataclass
class CheckReport:
    """The outcome of `check_detector`: one result per check."""

    detector: str
    results: list[CheckResult]

    @property
    def failed(self) -> list[CheckResult]:
        """The checks that failed."""
        return [r for r in self.results if not r.passed]

    @property
    def ok(self) -> bool:
        """True when every check passed."""
        return not self.failed

    def __str__(self) -> str:
        lines = [f"check_detector({self.detector}): {len(self.results) - len(self.failed)}/{len(self.results)} passed"]
        for r in self.results:
            lines.append(f"  {'ok  ' if r.passed else 'FAIL'} {r.name}: {r.explanation}")
            if not r.passed:
                lines.append(f"         -> {r.message}")
        return "\n".join(lines)

    def raise_if_failed(self) -> None:
        """Raise AssertionError listing the failed checks (for use in a test)."""
        if self.failed:
            raise AssertionError(str(self))


@dataclass(frozen=True)
class CheckData:
    """A fit set (features, logits, labels, extras), its head, and a test set (ID rows, then shifted rows)."""

    fit: Outputs
    head: Head
    test: Outputs


def check_data(requirements: Requirements | None = None, *, seed: int = 0) -> CheckData:
    """The synthetic problem the checks use: 5 post-ReLU Gaussian classes in D=16, 400 fit rows, 200 test rows.

    Every ``extra.<name>`` in `requirements` gets an (N, 8) float32 array of values in (0.05, 0.95).
    """
    rng = np.random.default_rng(seed)
    classes, dim = 5, 16
    centres = rng.normal(size=(classes, dim)) * 1.5 + 1.0
    scales = rng.uniform(0.5, 1.5, size=dim)
    weight = (0.4 * centres + 0.2 * rng.normal(size=(classes, dim))).astype(np.float32)
    head = Head(weight, (0.3 * rng.normal(size=classes)).astype(np.float32))
    extras = sorted(
        name[len("extra.") :]
        for name in (requirements.fit | requirements.score if requirements else ())
        if name.startswith("extra.")
    )

    def draw(rows: int, shifted: bool, labelled: bool) -> Outputs:
        labels = rng.integers(0, classes, rows)
        centre = centres[labels]
        if shifted:  # between two classes: overlapping, so scores are not trivially separable
            centre = (centre + centres[(labels + rng.integers(1, classes, rows)) % classes]) / 2
        features = np.maximum(centre + scales * rng.normal(size=(rows, dim)), 0.0).astype(np.float32)
        logits = head.logits(features).astype(np.float32)
        arrays = {name: rng.uniform(0.05, 0.95, size=(rows, 8)).astype(np.float32) for name in extras}
        return Outputs(features, logits, labels if labelled else None, arrays)

    fit = draw(400, False, True)
    first, second = draw(100, False, True), draw(100, True, True)
    test = Outputs(
        np.concatenate([first.features, second.features]),
        np.concatenate([first.logits, second.logits]),
        np.concatenate([first.labels, second.labels]),
        {k: np.concatenate([first.extras[k], second.extras[k]]) for k in extras},
    )
    return CheckData(fit, head, test)


# ----------------------------------------------------------------------------------------------- context
@dataclass
class _Context:
    cls: type[Detector]
    params: dict[str, Any]
    pristine: CheckData
    _reference: tuple[Detector, np.ndarray] | None = field(default=None, repr=False)

    @property
    def data(self) -> CheckData:
        """A fresh copy of the check data, so a detector that writes into its inputs cannot spoil other checks."""
        head = Head(np.array(self.pristine.head.weight), np.array(self.pristine.head.bias))
        return CheckData(_copy(self.pristine.fit), head, _copy(self.pristine.test))

    def new(self, **overrides: Any) -> Detector:
        detector = self.cls(**{**self.params, **overrides})
        detector.validate_params()
        return detector

    def fitted(self, fit: Outputs | None = None, head: Head | None = None, **overrides: Any) -> Detector:
        """A new detector fitted on `fit` (default: the check data); whatever fit() returns, the detector itself."""
        data = self.data
        detector = self.new(**overrides)
        detector.fit(data.fit if fit is None else fit, data.head if head is None else head)
        return detector

    @property
    def requirements(self) -> Requirements:
        return self.new().requirements()

    def reference(self) -> tuple[Detector, np.ndarray]:
        """A detector fitted on the check data and its scores of the test set (computed once)."""
        if self._reference is None:
            detector = self.fitted()
            self._reference = (detector, detector.score(self.data.test))
        return self._reference


def _scale(scores: np.ndarray) -> float:
    return max(1.0, float(np.abs(scores).max(initial=0.0)))


def _close(name: str, actual: np.ndarray, expected: np.ndarray, rtol: float) -> None:
    actual, expected = np.asarray(actual, dtype=np.float64), np.asarray(expected, dtype=np.float64)
    if actual.shape != expected.shape:
        raise CheckFailed(f"{name}: shape {actual.shape}, expected {expected.shape}")
    error = np.abs(actual - expected)
    bound = rtol * _scale(expected)
    if not (error <= bound).all():
        row = int(np.argmax(error))
        raise CheckFailed(
            f"{name}: row {row} scores {float(actual[row])!r} instead of {float(expected[row])!r} "
            f"(max difference {error.max():.3g} > {bound:.3g} = {rtol:g} x score scale)"
        )


def _identical(name: str, actual: np.ndarray, expected: np.ndarray) -> None:
    if np.shape(actual) != np.shape(expected):
        raise CheckFailed(f"{name}: shape {np.shape(actual)}, expected {np.shape(expected)}")
    if not np.array_equal(np.asarray(actual), np.asarray(expected)):
        difference = np.abs(np.asarray(actual, dtype=np.float64) - expected)
        raise CheckFailed(f"{name}: scores differ (max difference {difference.max():.3g}; expected bit-identical)")


def _with_arrays(outputs: Outputs, drop: str | None = None, **replace: Any) -> Outputs:
    """A copy of `outputs` without array `drop` (features/logits/labels/extra.<k>) and with some replaced."""
    arrays: dict[str, Any] = {
        "features": outputs.features,
        "logits": outputs.logits,
        "labels": outputs.labels,
        "extras": dict(outputs.extras),
    }
    if drop is not None:
        if drop.startswith("extra."):
            del arrays["extras"][drop[len("extra.") :]]
        else:
            arrays[drop] = None
    arrays.update(replace)
    return Outputs(**arrays, check_finite=False)


# ----------------------------------------------------------------------------------------------- tripwires
class UndeclaredRead(Exception):
    """Raised when a detector reads an array it did not declare (deliberately not an OodbenchError)."""


class _Tripwire(np.ndarray):
    """An array whose values raise on access (indexing, ufuncs, numpy functions, casts); filled with poison.

    `np.asarray` on an ndarray subclass returns a plain view without any hook, so the values are poison
    too (NaN, or -1 for integers): computing with them gives non-finite scores or a label error.
    """

    _what: str = "array"
    _log: list[str] | None = None

    @classmethod
    def of(cls, shape: tuple[int, ...], dtype: Any, what: str, log: list[str]) -> _Tripwire:
        poison = np.full(shape, np.nan if np.issubdtype(np.dtype(dtype), np.floating) else -1, dtype=dtype)
        wire = poison.view(cls)
        wire._what, wire._log = what, log
        return wire

    def __array_finalize__(self, obj: Any) -> None:
        self._what = getattr(obj, "_what", "array")
        self._log = getattr(obj, "_log", None)

    def _trip(self, *args: Any, **kwargs: Any) -> Any:
        if self._log is not None:
            self._log.append(self._what)
        raise UndeclaredRead(f"read the undeclared {self._what}")

    def __array_ufunc__(self, *args: Any, **kwargs: Any) -> Any:
        return self._trip()

    def __array_function__(self, *args: Any, **kwargs: Any) -> Any:
        return self._trip()

    __getitem__ = _trip
    __iter__ = _trip
    __float__ = _trip
    __int__ = _trip
    __bool__ = _trip
    astype = _trip
    copy = _trip
    tolist = _trip
    tobytes = _trip
    item = _trip
    __array__ = _trip

    def __repr__(self) -> str:
        return f"<undeclared {self._what}>"

    __str__ = __repr__


def _tripwire_head(head: Head, log: list[str]) -> Head:
    wired = object.__new__(Head)  # Head's own validation would read the values
    object.__setattr__(wired, "weight", _Tripwire.of(head.weight.shape, head.weight.dtype, "head weight", log))
    object.__setattr__(wired, "bias", _Tripwire.of(head.bias.shape, head.bias.dtype, "head bias", log))
    return wired


def _tripwired(outputs: Outputs, declared: frozenset[str], where: str, log: list[str]) -> Outputs:
    """`outputs` with every undeclared array (and an extra nobody declares) replaced by a tripwire."""

    def wire(name: str, array: np.ndarray) -> np.ndarray:
        return array if name in declared else _Tripwire.of(array.shape, array.dtype, f"{name} of the {where}", log)

    extras = {k: wire(f"extra.{k}", v) for k, v in outputs.extras.items()}
    extras["undeclared"] = _Tripwire.of((len(outputs), 3), np.float32, f"extra.undeclared of the {where}", log)
    wired = Outputs(
        wire("features", outputs.features),
        None if outputs.logits is None else wire("logits", outputs.logits),
        None,
        extras,
        check_finite=False,
    )
    if outputs.labels is not None:
        # Outputs turns labels into a plain int64 array; set the tripwire after construction.
        object.__setattr__(wired, "labels", wire("labels", outputs.labels))
    return wired


# ----------------------------------------------------------------------------------------------- the checks
def _fit_returns_self(ctx: _Context) -> None:
    detector, data = ctx.new(), ctx.data
    returned = detector.fit(data.fit, data.head)
    if returned is not detector:
        raise CheckFailed(f"fit returned {type(returned).__name__} {returned!r:.80}, not the detector")


def _equal_params(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    if set(a) != set(b):
        return False
    return all(np.array_equal(a[k], b[k]) if isinstance(a[k], np.ndarray) else a[k] == b[k] for k in a)


def _params_round_trip(ctx: _Context) -> None:
    detector = ctx.new()
    params = detector.get_params()
    if set(params) != set(ctx.cls.param_names()):
        raise CheckFailed(f"get_params() has {sorted(params)}, the constructor takes {ctx.cls.param_names()}")
    for key, value in ctx.params.items():
        if not _equal_params({key: params[key]}, {key: value}):
            raise CheckFailed(f"get_params()[{key!r}] is {params[key]!r} but the detector was created with {value!r}")
    rebuilt = ctx.cls(**params).get_params()
    if not _equal_params(rebuilt, params):
        raise CheckFailed(f"{ctx.cls.__name__}(**get_params()) has parameters {rebuilt}, not {params}")
    name = ctx.cls.name
    if name and registry._REGISTRY.get(name) is ctx.cls:
        created = registry.create(name, **params).get_params()
        if not _equal_params(created, params):
            raise CheckFailed(f"create({name!r}, **get_params()) has parameters {created}, not {params}")
        try:
            registry.create(name, no_such_parameter=1)
        except DetectorError:
            pass
        else:
            raise CheckFailed(f"create({name!r}, no_such_parameter=1) was accepted")
    fitted = ctx.fitted()
    if not _equal_params(fitted.get_params(), params):
        raise CheckFailed(f"fit changed the hyper-parameters: {params} became {fitted.get_params()}")


def _bad_params_refused(ctx: _Context) -> None:
    numeric = [
        k
        for k, v in ctx.cls.default_params().items()
        if isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, (bool, np.bool_))
    ]
    for key in numeric:
        try:
            ctx.new(**{key: "not-a-number"})
        except DetectorError:
            continue
        except Exception as exc:
            raise CheckFailed(
                f"{key}='not-a-number' raised {type(exc).__name__}: {exc} instead of a DetectorError naming it"
            ) from None
        raise CheckFailed(f"{key}='not-a-number' was accepted by validate_params (number parameter)")


def _scores_float64_finite(ctx: _Context) -> None:
    _, scores = ctx.reference()
    if not isinstance(scores, np.ndarray):
        raise CheckFailed(f"score returned a {type(scores).__name__}, not a numpy array")
    if scores.dtype != np.float64 or scores.shape != (len(ctx.data.test),):
        raise CheckFailed(
            f"score returned {scores.dtype} of shape {scores.shape}; expected float64 ({len(ctx.data.test)},)"
        )
    if not np.isfinite(scores).all():
        raise CheckFailed(f"{int((~np.isfinite(scores)).sum())} scores are NaN or inf")
    if np.ptp(scores) == 0:
        raise CheckFailed("every test row gets the same score")


def _chunk_invariance(ctx: _Context) -> None:
    detector, scores = ctx.reference()
    detector.chunk_bytes = 1  # an instance attribute: one row per chunk
    try:
        _close("one row per chunk", detector.score(ctx.data.test), scores, GROUPING_RTOL)
    finally:
        del detector.chunk_bytes
    rows = slice(37, 151)
    _close(
        f"scoring rows {rows.start}:{rows.stop} alone",
        detector.score(ctx.data.test.subset(rows)),
        scores[rows],
        GROUPING_RTOL,
    )


def _permutation_equivariance(ctx: _Context) -> None:
    detector, scores = ctx.reference()
    order = np.random.default_rng(1).permutation(len(ctx.data.test))
    _close("permuted rows", detector.score(ctx.data.test.subset(order)), scores[order], GROUPING_RTOL)


def _memmap_fit(ctx: _Context) -> None:
    _, scores = ctx.reference()
    fit = ctx.data.fit
    with tempfile.TemporaryDirectory(prefix="oodbench-check-") as tmp:

        def mapped(name: str, array: np.ndarray) -> np.ndarray:
            np.save(Path(tmp) / f"{name}.npy", array)
            return np.load(Path(tmp) / f"{name}.npy", mmap_mode="r")

        fit_mapped = Outputs(
            mapped("features", fit.features),
            None if fit.logits is None else mapped("logits", fit.logits),
            None if fit.labels is None else mapped("labels", fit.labels),
            {k: mapped(f"extra.{k}", v) for k, v in fit.extras.items()},
        )
        detector = ctx.fitted(fit_mapped)
        _close("fit from memory-mapped arrays", detector.score(ctx.data.test), scores, GROUPING_RTOL)


def _float32_float64(ctx: _Context) -> None:
    def as64(outputs: Outputs) -> Outputs:
        cast = {
            k: v.astype(np.float64) if np.issubdtype(v.dtype, np.floating) else v for k, v in outputs.extras.items()
        }
        return Outputs(
            outputs.features.astype(np.float64),
            None if outputs.logits is None else outputs.logits.astype(np.float64),
            outputs.labels,
            cast,
        )

    _, scores = ctx.reference()
    data = ctx.data
    head64 = Head(data.head.weight.astype(np.float64), data.head.bias.astype(np.float64))
    detector = ctx.fitted(as64(data.fit), head64)
    scores64 = detector.score(as64(data.test))
    if scores64.dtype != np.float64:
        raise CheckFailed(f"float64 inputs gave {scores64.dtype} scores")
    _close("float64 inputs vs float32 inputs", scores64, scores, DTYPE_RTOL)


def _deterministic(ctx: _Context) -> None:
    _, scores = ctx.reference()
    again = ctx.fitted().score(ctx.data.test)
    _identical("a second fit with the same parameters", again, scores)


def _missing_arrays_named(ctx: _Context) -> None:
    requires = ctx.requirements
    for name in sorted(requires.fit - {"features"}):
        try:
            ctx.fitted(_with_arrays(ctx.data.fit, drop=name))
        except OodbenchError as exc:
            if name not in str(exc):
                raise CheckFailed(f"a fit set without {name} raised {exc!r}, which does not name {name}") from None
        else:
            raise CheckFailed(f"fit accepted a fit set without the declared {name}")
    if requires.head:
        try:
            ctx.new().fit(ctx.data.fit, None)  # the declared head left out
        except OodbenchError as exc:
            if "head" not in str(exc):
                raise CheckFailed(f"fit without a head raised {exc!r}, which does not say 'head'") from None
        else:
            raise CheckFailed("fit accepted head=None although the detector declares it needs the head")
    detector, _ = ctx.reference()
    for name in sorted(requires.score - {"features"}):
        try:
            detector.score(_with_arrays(ctx.data.test, drop=name))
        except OodbenchError as exc:
            if name not in str(exc):
                raise CheckFailed(f"a test set without {name} raised {exc!r}, which does not name {name}") from None
        else:
            raise CheckFailed(f"score accepted a test set without the declared {name}")


def _undeclared_arrays_unread(ctx: _Context) -> None:
    requires = ctx.requirements
    log: list[str] = []
    data = ctx.data
    fit = _tripwired(data.fit, requires.fit, "fit set", log)
    head = data.head if requires.head else _tripwire_head(data.head, log)
    _, scores = ctx.reference()
    try:
        detector = ctx.new()
        detector.fit(fit, head)
        wired_scores = detector.score(_tripwired(data.test, requires.score, "test set", log))
    except Exception as exc:
        if log:
            raise CheckFailed(f"read {', '.join(dict.fromkeys(log))} (declared: {requires.describe()})") from None
        raise CheckFailed(
            f"failed when undeclared arrays were poisoned ({type(exc).__name__}: {exc}); it reads an array "
            f"it does not declare (declared: {requires.describe()})"
        ) from None
    if log:
        raise CheckFailed(f"read {', '.join(dict.fromkeys(log))} (declared: {requires.describe()})")
    _identical("scores with undeclared arrays replaced", wired_scores, scores)


def _replaced(outputs: Outputs, name: str, array: np.ndarray) -> Outputs:
    """An unchecked copy of `outputs` with array `name` (features/logits/extra.<k>) replaced."""
    if name.startswith("extra."):
        return _with_arrays(outputs, extras={**outputs.extras, name[len("extra.") :]: array})
    return _with_arrays(outputs, **{name: array})


def _nan_refused(ctx: _Context) -> None:
    detector, _ = ctx.reference()
    for name in sorted(ctx.requirements.score - {"labels"}):
        poisoned = np.array(_array(ctx.data.test, name))
        if not np.issubdtype(poisoned.dtype, np.floating):
            continue
        poisoned.reshape(len(poisoned), -1)[3, 0] = np.nan
        try:
            scores = detector.score(_replaced(ctx.data.test, name, poisoned))
        except OodbenchError:
            continue
        raise CheckFailed(f"a NaN in the test set's {name} was scored ({float(scores[3])!r}) instead of refused")


def _shape_errors_clear(ctx: _Context) -> None:
    detector, _ = ctx.reference()
    for name in sorted(ctx.requirements.score - {"labels"}):
        array = _array(ctx.data.test, name)
        if array.ndim < 2:
            continue
        wider = np.concatenate([array, array[:, :1]], axis=1)
        try:
            detector.score(_replaced(ctx.data.test, name, wider))
        except OodbenchError:
            continue
        except Exception as exc:
            raise CheckFailed(
                f"a test {name} one column wider raised {type(exc).__name__}: {exc} instead of an OodbenchError"
            ) from None
        raise CheckFailed(f"a test {name} one column wider than at fit was scored instead of refused")


def _unfitted_refuses(ctx: _Context) -> None:
    try:
        ctx.new().score(ctx.data.test)
    except DetectorError as exc:
        if "not fitted" not in str(exc):
            raise CheckFailed(f"an unfitted detector raised {exc!r}, which does not say 'not fitted'") from None
        return
    except Exception as exc:
        raise CheckFailed(f"an unfitted detector raised {type(exc).__name__}: {exc}, not a DetectorError") from None
    raise CheckFailed("an unfitted detector returned scores")


def _state_names(ctx: _Context) -> None:
    detector, data = ctx.new(), ctx.data
    before = set(vars(detector))
    detector.fit(data.fit, data.head)
    unnamed = sorted(k for k in set(vars(detector)) - before if not k.endswith("_"))
    if unnamed:
        raise CheckFailed(
            f"fit set {', '.join(unnamed)}, whose names do not end with '_': save() would lose them "
            "(name learned state with a trailing underscore)"
        )
    if not detector.declares_state():  # inferred at save: each fitted value must be an array or number within bounds
        try:
            inferred_spec(detector, detector.fit_info_, "save")
        except DetectorError as exc:
            raise CheckFailed(f"{exc} (or declare the class's `state`)") from None
        return
    declared = set(detector.state_spec(detector.fit_info_))
    undeclared = sorted(k for k in fitted_state(detector) if k != "fit_info_" and k not in declared)
    if undeclared:
        raise CheckFailed(
            f"fit set {', '.join(undeclared)}, which the class's `state` does not declare: save refuses "
            "undeclared state (declare each with Array(dtype, shape) or Scalar(kind))"
        )


def _save_load(ctx: _Context) -> None:
    detector, scores = ctx.reference()
    with tempfile.TemporaryDirectory(prefix="oodbench-check-") as tmp:
        save(detector, tmp)
        loaded = load(tmp, detector_class=type(detector))
    if type(loaded) is not type(detector):
        raise CheckFailed(f"load gave a {type(loaded).__name__}, saved was a {type(detector).__name__}")
    if not _equal_params(loaded.get_params(), detector.get_params()):
        raise CheckFailed(f"parameters {detector.get_params()} came back as {loaded.get_params()}")
    _identical("the loaded detector", loaded.score(ctx.data.test), scores)


def _inputs_unchanged(ctx: _Context) -> None:
    data, original = ctx.data, ctx.pristine
    ctx.fitted(data.fit, data.head).score(data.test)
    for label, outputs, before in (("fit set", data.fit, original.fit), ("test set", data.test, original.test)):
        for name in sorted(before.array_names()):
            if not np.array_equal(_array(outputs, name), _array(before, name)):
                raise CheckFailed(f"the {label}'s {name} was modified in place")
    if not (
        np.array_equal(data.head.weight, original.head.weight) and np.array_equal(data.head.bias, original.head.bias)
    ):
        raise CheckFailed("the head was modified in place")


def _copy(outputs: Outputs) -> Outputs:
    return Outputs(
        np.array(outputs.features),
        None if outputs.logits is None else np.array(outputs.logits),
        None if outputs.labels is None else np.array(outputs.labels),
        {k: np.array(v) for k, v in outputs.extras.items()},
    )


def _array(outputs: Outputs, name: str) -> np.ndarray:
    return outputs.extras[name[6:]] if name.startswith("extra.") else getattr(outputs, name)


@dataclass(frozen=True)
class Check:
    """A named check with its one-line explanation."""

    name: str
    explanation: str
    run: Callable[[_Context], None]


CHECKS: dict[str, Check] = {
    c.name: c
    for c in (
        Check("fit_returns_self", "fit() returns the detector itself", _fit_returns_self),
        Check(
            "params_round_trip",
            "get_params() holds exactly the constructor's parameters; the class and create() rebuild them; fit "
            "leaves them unchanged",
            _params_round_trip,
        ),
        Check(
            "bad_params_refused",
            "a number parameter given a string raises DetectorError at creation, not a TypeError later",
            _bad_params_refused,
        ),
        Check(
            "scores_float64_finite",
            "score() returns finite float64 scores of shape (N,), not all equal",
            _scores_float64_finite,
        ),
        Check(
            "chunk_invariance",
            "scores do not depend on the chunk size, and scoring a slice gives the slice of the scores",
            _chunk_invariance,
        ),
        Check(
            "permutation_equivariance",
            "scoring the rows in another order gives the same scores in that order",
            _permutation_equivariance,
        ),
        Check(
            "memmap_fit",
            "a fit from a memory-mapped fit set scores like a fit from the same arrays in memory",
            _memmap_fit,
        ),
        Check(
            "float32_float64",
            f"float32 and float64 inputs with the same values give scores within {DTYPE_RTOL:g} of the score scale",
            _float32_float64,
        ),
        Check(
            "deterministic", "two fits with the same parameters (and seed) give bit-identical scores", _deterministic
        ),
        Check(
            "missing_arrays_named",
            "a fit or test set lacking a declared array, or a missing declared head, raises an error naming it",
            _missing_arrays_named,
        ),
        Check(
            "undeclared_arrays_unread",
            "arrays and a head the detector does not declare are never read (they are handed as arrays that raise "
            "on access)",
            _undeclared_arrays_unread,
        ),
        Check(
            "nan_refused", "a NaN in a declared fit or test array raises an error, never a silent score", _nan_refused
        ),
        Check(
            "shape_errors_clear",
            "a test array of another width than at fit raises an OodbenchError, not a numpy error",
            _shape_errors_clear,
        ),
        Check(
            "unfitted_refuses", "score() before fit() raises DetectorError saying it is not fitted", _unfitted_refuses
        ),
        Check(
            "state_names",
            "every attribute fit() sets ends with '_' and is declared in `state`, or (a class declaring none) is a "
            "numeric array or number within the bounds save() and load() apply",
            _state_names,
        ),
        Check(
            "save_load",
            "detectors.save() then detectors.load() gives the same parameters and bit-identical scores",
            _save_load,
        ),
        Check("inputs_unchanged", "fit and score leave their input arrays and the head unchanged", _inputs_unchanged),
    )
}


def check_detector(
    detector: type[Detector] | Detector,
    params: Mapping[str, Any] | None = None,
    *,
    data: CheckData | None = None,
    checks: Iterable[str] | None = None,
) -> CheckReport:
    """Run the battery on a detector class (with `params`) or on an instance's class and parameters."""
    if isinstance(detector, Detector):
        cls, given = type(detector), {**detector.get_params(), **dict(params or {})}
    elif isinstance(detector, type) and issubclass(detector, Detector):
        cls, given = detector, dict(params or {})
    else:
        raise DetectorError(f"check_detector takes a Detector subclass or instance; got {detector!r}")
    names = list(CHECKS) if checks is None else list(checks)
    unknown = [n for n in names if n not in CHECKS]
    if unknown:
        raise DetectorError(f"unknown checks {', '.join(unknown)}; the checks: {', '.join(CHECKS)}")
    label = f"{cls.__name__}({', '.join(f'{k}={v!r}' for k, v in given.items())})"
    try:
        requirements = cls(**given).requirements()
    except Exception as exc:
        message = f"cannot create the detector: {type(exc).__name__}: {exc}"
        return CheckReport(label, [CheckResult(n, CHECKS[n].explanation, False, message) for n in names])
    ctx = _Context(cls, given, data if data is not None else check_data(requirements))
    results = []
    for name in names:
        check = CHECKS[name]
        try:
            check.run(ctx)
        except CheckFailed as failed:
            results.append(CheckResult(name, check.explanation, False, str(failed)))
        except Exception as exc:
            where = traceback.extract_tb(exc.__traceback__)[-1]
            results.append(
                CheckResult(
                    name,
                    check.explanation,
                    False,
                    f"raised {type(exc).__name__}: {exc} (at {Path(where.filename).name}:{where.lineno})",
                )
            )
        else:
            results.append(CheckResult(name, check.explanation, True))
    return CheckReport(label, results)
