"""Detector base class: hyper-parameters in `__init__`, learning in `fit`, scoring in `score` (higher = more ID)."""

from __future__ import annotations

import inspect
import math
import types
import typing
import warnings
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from typing import TYPE_CHECKING, Any, ClassVar, Literal, get_args, get_origin

import numpy as np

from ..core.errors import DetectorError
from ..core.outputs import Head, Outputs, check_class_labels, require_finite
from ..core.papers import Paper  # noqa: F401  (re-exported: detectors name their papers through base)
from ..util.chunking import DEFAULT_CHUNK_BYTES, iter_chunks, rows_per_chunk
from ._blas import SMALL_WORK, threads_for
from .state import Spec

# The saved-file format (`artefact.save`) plugs itself in here when imported, so the deprecated `Detector.save`
# still works while this module imports nothing of the artefact layer.
_SAVER: Callable[..., Any] | None = None


def use_saver(saver: Callable[..., Any]) -> None:
    """Called by `detectors.artefact`: the function behind the deprecated `Detector.save`."""
    global _SAVER
    _SAVER = saver


if TYPE_CHECKING:
    from .fitsize import FitSize

__all__ = ["Detector", "Requirements", "Paper", "Range", "Summary"]

# The largest integer parameter a detector accepts (as no array dimension exceeds 2^40), and the largest seed.
INT_PARAM_MAX = 2**40
SEED_MAX = 2**31 - 1


@dataclass(frozen=True)
class Requirements:
    """What a detector needs: arrays of the fit set, of the test set, and whether a head is needed at fit."""

    fit: frozenset[str] = frozenset()
    score: frozenset[str] = frozenset()
    head: bool = False

    @staticmethod
    def of(fit: tuple[str, ...] = (), score: tuple[str, ...] = (), head: bool = False) -> Requirements:
        """Build from tuples of array names: features, logits, labels, or extra.<name>."""
        return Requirements(frozenset(fit), frozenset(score), head)

    def describe(self) -> str:
        """Human-readable summary, e.g. 'fit: features, labels; score: features'."""
        parts = []
        if self.fit:
            parts.append("fit: " + ", ".join(sorted(self.fit)))
        if self.head:
            parts.append("head")
        if self.score:
            parts.append("score: " + ", ".join(sorted(self.score)))
        return "; ".join(parts)


@dataclass(frozen=True)
class Summary:
    """What the detector tables say beside the paper, the requirements and the defaults (`detectors.catalog`).

    method: the score in the tables' notation; defaults: where the defaults come from; needs: a note on the
    arrays (where extras come from); also_in: the peer libraries with the method; agreement: the largest measured
    difference from a peer on the same arrays, or what a peer's user sees differently.
    """

    method: str
    defaults: str = ""
    needs: str = ""
    also_in: str = ""
    agreement: str = ""


@dataclass
class _FitInfo:
    """The shape of the fit: D features, C classes (None without logits or head), N rows, extras' row shapes."""

    num_features: int
    num_classes: int | None
    extras: dict[str, tuple[int, ...]] = field(default_factory=dict)
    num_rows: int | None = None


@dataclass(frozen=True)
class Range:
    """Bounds of a number parameter, declared with its type: ``alpha: Annotated[float, Range(0, 1, open_low=True)]``.

    Inclusive unless `open_low`/`open_high`; None leaves that side unbounded.
    """

    low: float | None = None
    high: float | None = None
    open_low: bool = False
    open_high: bool = False

    def contains(self, value: float) -> bool:
        """Whether `value` lies within the bounds."""
        if self.low is not None and (value <= self.low if self.open_low else value < self.low):
            return False
        return not (self.high is not None and (value >= self.high if self.open_high else value > self.high))

    def describe(self) -> str:
        """e.g. '(0, 1]' or '>= 1'."""
        if self.low is not None and self.high is not None:
            return f"in {'(' if self.open_low else '['}{self.low:g}, {self.high:g}{')' if self.open_high else ']'}"
        if self.low is not None:
            return f"{'>' if self.open_low else '>='} {self.low:g}"
        if self.high is not None:
            return f"{'<' if self.open_high else '<='} {self.high:g}"
        return "any value"


def fit_record(provenance: Mapping[str, Any]) -> dict[str, Any]:
    """An entry's provenance (`Store.entry_provenance`) as a fit's: its dataset named fit_dataset."""
    return {("fit_dataset" if key == "dataset" else key): value for key, value in provenance.items()}


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, (bool, np.bool_))


def _type_problem(value: Any, hint: Any) -> str | None:
    """What `value` should be, by the annotation `hint` (None when it fits, or the hint is not one we check)."""
    origin, args = get_origin(hint), get_args(hint)
    if origin is typing.Annotated:
        problem = _type_problem(value, args[0])
        if problem is not None:
            return problem
        for bound in args[1:]:
            if isinstance(bound, Range) and _is_number(value) and not bound.contains(float(value)):
                return f"a number {bound.describe()}"
        return None
    if origin is typing.Union or origin is types.UnionType:
        problems = [_type_problem(value, arg) for arg in args]
        if any(p is None for p in problems):
            return None
        return " or ".join(p for p in problems if p)
    if origin is Literal:
        if any(value == choice and type(value) is type(choice) for choice in args):
            return None
        return "one of " + ", ".join(repr(choice) for choice in args)
    if hint is type(None):
        return None if value is None else "None"
    if hint is bool:
        return None if isinstance(value, (bool, np.bool_)) else "True or False"
    if hint is int:
        ok = isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))
        return None if ok else "an integer"
    if hint is float:
        return None if _is_number(value) and math.isfinite(float(value)) else "a finite number"
    if hint is str:
        return None if isinstance(value, str) else "a string"
    if origin in (tuple, list, Sequence, typing.Sequence) and args:
        if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)):
            return "a sequence"
        element = args[0]
        for item in value:
            problem = _type_problem(item, element)
            if problem is not None:
                return f"a sequence of {problem.removeprefix('a ').removeprefix('an ')}s"
        return None
    if origin in (dict, Mapping, typing.Mapping) and len(args) == 2:
        if not isinstance(value, Mapping):
            return "a mapping"
        for key, item in value.items():
            problem = _type_problem(key, args[0]) or _type_problem(item, args[1])
            if problem is not None:
                return f"a mapping whose entry {key!r} is not {problem}"
        return None
    return None  # Any, a class, or a form this check does not know: the detector's _validate_params decides


@cache
def _param_hints(cls: type) -> dict[str, Any]:
    try:
        return typing.get_type_hints(cls.__init__, include_extras=True)
    except Exception:  # an annotation that does not resolve: nothing to check by type
        return {}


@cache
def _init_params(init: Callable[..., None]) -> dict[str, Any]:
    """A constructor's hyper-parameters and their defaults, read once per constructor."""
    # inspect.signature takes 0.1-0.25 ms (a constructor inherited from `object` is parsed from its text signature),
    # and create, fit and get_params each ask: at a first study's size, more than `maxlogit`'s whole work.
    kinds = (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    parameters = inspect.signature(init).parameters.values()
    return {p.name: p.default for p in parameters if p.name != "self" and p.kind in kinds}


_EXTRA = "extra."


def _array_names(arrays: Outputs | Collection[str]) -> set[str]:
    return arrays.array_names() if isinstance(arrays, Outputs) else set(arrays)


def _per_row(shape: tuple[int, ...]) -> str:
    return f"{shape[0]} units" if len(shape) == 1 else f"shape {shape}"


def _declared_rows(test: Outputs, rows: slice, declared: frozenset[str]) -> Outputs:
    """The chunk `rows` of the test set holding only the declared arrays (in memory), checked finite when unchecked.

    Undeclared arrays are never read: a detector sees no logits, labels or extras it did not declare, and
    features it did not declare are a NaN placeholder of the right shape (a broadcast view, no memory).
    """
    num_rows = rows.stop - rows.start

    def take(name: str, array: np.ndarray) -> np.ndarray:
        block = np.asarray(array[rows])
        # Outputs built with check_finite=True were checked whole at construction; others are checked here, per
        # chunk, so a NaN reaches no detector (some would turn it into a plausible finite score).
        if not test.check_finite and np.issubdtype(block.dtype, np.floating):
            require_finite(f"test set {name}", block, offset=rows.start)
        return block

    if "features" in declared:
        features = take("features", test.features)
    else:
        features = np.broadcast_to(np.float32(np.nan), (num_rows, test.num_features))
    return Outputs(
        features,
        take("logits", test.logits) if "logits" in declared and test.logits is not None else None,
        take("labels", test.labels) if "labels" in declared and test.labels is not None else None,
        {k: take(f"extra.{k}", v) for k, v in test.extras.items() if _EXTRA + k in declared},
        check_finite=False,
    )


class Detector:
    """Base class of every post-hoc detector. Subclasses set `name`, `requires`, `paper`, and implement `_fit`/`_score_chunk`."""

    name: ClassVar[str] = ""
    requires: ClassVar[Requirements] = Requirements()
    paper: ClassVar[Paper | None] = None
    # The detector tables' row (README, docs/detectors.md and `oodbench detectors`), generated from the class.
    summary: ClassVar[Summary | None] = None
    # Bytes of working memory per chunk of test rows; subclasses with wide per-row work keep it bounded.
    chunk_bytes: ClassVar[int] = DEFAULT_CHUNK_BYTES
    # The fitted state, declared (see oodbench.detectors.state): artefact.save writes and load accepts exactly this.
    # A class that declares none has it inferred from its fitted attributes when saved (`declares_state`).
    state: ClassVar[Mapping[str, Spec]] = {}
    # Free dimensions of `state`'s shapes and their upper bounds, e.g. {"K": "C"} (at most C present classes).
    state_dims: ClassVar[Mapping[str, int | str]] = {}

    # ----------------------------------------------------------------- parameters (scikit-learn style)
    @classmethod
    def param_names(cls) -> list[str]:
        """Names of the constructor's hyper-parameters."""
        return list(_init_params(cls.__init__))

    @classmethod
    def default_params(cls) -> dict[str, Any]:
        """Documented default hyper-parameters."""
        return dict(_init_params(cls.__init__))

    def get_params(self) -> dict[str, Any]:
        """Hyper-parameters as given."""
        return {name: getattr(self, name) for name in self.param_names()}

    def validate_params(self) -> None:
        """Raise DetectorError for invalid hyper-parameters: first by the constructor's annotations (int, float,
        bool, str, Literal, X | None, sequences, `Annotated[float, Range(...)]`), then `_validate_params`."""
        hints = _param_hints(type(self))
        for name in self.param_names():
            if name in hints:
                value = getattr(self, name, None)
                problem = _type_problem(value, hints[name])
                if problem is not None:
                    label = self.name or type(self).__name__
                    raise DetectorError(f"{label}: {name} must be {problem}; got {value!r}"[:300])
        self._validate_params()

    @classmethod
    def declares_state(cls) -> bool:
        """Whether the class (or a parent below `Detector`) declares its fitted state: sets `state` or `state_dims`, or
        overrides `state_spec`. A class that does not has its state inferred from its fitted attributes on save."""
        for klass in cls.__mro__:
            if klass is Detector:
                return False
            if any(key in vars(klass) for key in ("state", "state_dims", "state_spec")):
                return True
        return False

    def state_spec(self, fit: _FitInfo) -> Mapping[str, Spec]:
        """The fitted state this instance keeps for a fit of this shape: the class's `state`, unless a detector
        whose state depends on its parameters overrides this."""
        return self.state

    def _validate_params(self) -> None:
        """Hook: check hyper-parameter values."""

    def __repr__(self) -> str:
        params = ", ".join(f"{k}={v!r}" for k, v in self.get_params().items())
        return f"{type(self).__name__}({params})"

    def requirements(self) -> Requirements:
        """What this instance needs: the class's `requires`, extended by detectors whose needs depend on parameters."""
        return self.requires

    def unmet(
        self,
        fit: Outputs | Collection[str],
        tests: Mapping[str, Outputs | Collection[str]] | None = None,
        *,
        has_head: bool,
    ) -> list[str]:
        """What this instance needs that the fit set, the test sets and the head do not provide (empty: it can run).

        `fit` and each test set are an `Outputs` or the names of its arrays (features, logits, labels, extra.<name>);
        `tests` maps a dataset name to its arrays. Each item is one line such as "fit set lacks labels".
        """
        requires = self.requirements()
        reasons = []
        missing_fit = sorted(requires.fit - _array_names(fit))
        if missing_fit:
            reasons.append(f"fit set lacks {', '.join(missing_fit)}")
        if requires.head and not has_head:
            reasons.append("no head stored for the model")
        for dataset, arrays in (tests or {}).items():
            missing = sorted(requires.score - _array_names(arrays))
            if missing:
                reasons.append(f"{dataset} lacks {', '.join(missing)}")
        return reasons

    def size_problems(self, size: FitSize) -> list[str]:
        """Parameters this fit set cannot support, one line each naming the parameter (empty: none)."""
        return []

    def adapted_to(self, size: FitSize) -> dict[str, Any]:
        """Parameter values scaled to a fit set too small for the current ones (empty: no automatic choice)."""
        return {}

    # ----------------------------------------------------------------- the protocol
    def fit(self, fit_set: Outputs, head: Head | None = None, *, stats: object | None = None) -> Detector:
        """Learn from the ID fit set (and the model's head where needed); returns self.

        `stats` is a provider of fit statistics shared among detectors fitted on this fit set. The base class only
        keeps it on the instance while `_fit` runs; `shared.statistics_for` reads and checks it (`shared.fit_all`).
        """
        self.validate_params()
        if not isinstance(fit_set, Outputs):
            raise DetectorError(f"{self.name}: fit_set must be an Outputs, got {type(fit_set).__name__}")
        requires = self.requirements()
        self._check_arrays(fit_set, requires.fit, "fit set")
        if len(fit_set) == 0 and requires.fit:
            raise DetectorError(f"{self.name}: the fit set is empty")
        from .fitsize import FitSize, raise_size_problems

        raise_size_problems(self.name, self.size_problems(FitSize.of(fit_set)))
        if requires.head:
            if head is None:
                raise DetectorError(f"{self.name} needs the model's head (weight, bias) at fit; pass head=Head(W, b)")
            if head.num_features != fit_set.num_features:
                raise DetectorError(
                    f"{self.name}: head expects D={head.num_features} features but the fit set has D={fit_set.num_features}"
                )
        if head is not None and fit_set.logits is not None and fit_set.num_classes != head.num_classes:
            raise DetectorError(
                f"{self.name}: fit-set logits have C={fit_set.num_classes} classes but the head has C={head.num_classes}"
            )
        if "labels" in requires.fit and fit_set.labels is not None:  # a label outside the head's classes: refused
            classes = head.num_classes if head is not None else fit_set.num_classes
            check_class_labels(fit_set.labels, classes, what=f"{self.name}: fit set", error=DetectorError)
        self._shared_stats = stats  # read by shared.statistics_for during _fit only
        width = max(fit_set.num_features, fit_set.num_classes or 0, head.num_classes if head is not None else 0)
        try:
            # A small fit runs its BLAS on one thread (`_blas.SMALL_WORK`); scoring keeps the BLAS's threads, so a
            # row's score never depends on how many rows are scored with it.
            with threads_for(len(fit_set) * fit_set.num_features * width if requires.fit else SMALL_WORK):
                self._fit(fit_set, head)
        finally:
            del self._shared_stats
        if fit_set.provenance is not None:
            self.fit_provenance_ = fit_record(fit_set.provenance)  # kept by artefact.save, checked by `oodbench score`
        elif hasattr(self, "fit_provenance_"):
            del self.fit_provenance_  # a refit on other outputs must not keep the earlier fit's provenance
        self.fit_info_ = _FitInfo(
            num_features=fit_set.num_features,
            num_classes=head.num_classes if head is not None else fit_set.num_classes,
            extras={k: tuple(v.shape[1:]) for k, v in fit_set.extras.items()},
            num_rows=len(fit_set),
        )
        return self

    def score(self, test: Outputs) -> np.ndarray:
        """Scores of the test set, shape (N,), float64, higher = more in-distribution."""
        if not hasattr(self, "fit_info_"):
            raise DetectorError(f"{self.name} is not fitted: call .fit(fit_set, head) first")
        if not isinstance(test, Outputs):
            raise DetectorError(f"{self.name}: test must be an Outputs, got {type(test).__name__}")
        requires = self.requirements()
        self._check_arrays(test, requires.score, "test set")
        info = self.fit_info_
        if "features" in requires.score and test.num_features != info.num_features:
            raise DetectorError(
                f"{self.name}: test features have D={test.num_features} but the detector was fit on D={info.num_features}"
            )
        if "logits" in requires.score and info.num_classes is not None and test.num_classes != info.num_classes:
            raise DetectorError(
                f"{self.name}: test logits have C={test.num_classes} classes but the detector was fit with C={info.num_classes}"
            )
        for key in sorted(name[len(_EXTRA) :] for name in requires.score if name.startswith(_EXTRA)):
            fitted, given = info.extras.get(key), tuple(test.extras[key].shape[1:])
            if fitted is not None and given != fitted:
                raise DetectorError(
                    f"{self.name}: test extra.{key} has {_per_row(given)} per row but the detector was fit on "
                    f"{_per_row(fitted)}"
                )
        scores = np.empty(len(test), dtype=np.float64)
        # The floating-point policy of scoring: no numpy warning on overflow, division by zero or invalid values
        # (a temperature of 5e-324, a forged radius of 1e308); what they produce is judged below, in one line.
        with np.errstate(all="ignore"):
            for rows in self._score_chunks(test):
                scores[rows] = self._score_chunk(_declared_rows(test, rows, requires.score))
        if not np.isfinite(scores).all():
            raise DetectorError(
                f"{self.name} produced {int((~np.isfinite(scores)).sum())} non-finite scores; check the inputs' scale"
            )
        return scores

    def save(self, directory: Any, *, provenance: Mapping[str, Any] | None = None) -> Any:
        """Deprecated spelling of `oodbench.detectors.save(detector, directory)`; removed in oodbench 0.2."""
        warnings.warn(
            "Detector.save(dir) is deprecated: use oodbench.detectors.save(detector, dir); removed in oodbench 0.2",
            DeprecationWarning,
            stacklevel=2,
        )
        if _SAVER is None:  # only reachable by importing this module alone, outside the package
            raise DetectorError("saving needs oodbench.detectors: call oodbench.detectors.save(detector, dir)")
        return _SAVER(self, directory, provenance=provenance)

    # ----------------------------------------------------------------- hooks
    def _fit(self, fit_set: Outputs, head: Head | None) -> None:
        """Hook: learn state (attributes with a trailing underscore). Default: nothing to learn."""

    def _score_chunk(self, chunk: Outputs) -> np.ndarray:
        """Hook: scores of a chunk of test rows (materialised in memory)."""
        raise NotImplementedError

    def _row_width(self, test: Outputs) -> int:
        """Float64 values of working memory per test row (sets the chunk size)."""
        width = test.num_features
        if test.num_classes is not None:
            width = max(width, test.num_classes)
        return 4 * width

    def _score_chunks(self, test: Outputs) -> Iterator[slice]:
        return iter_chunks(len(test), rows_per_chunk(self._row_width(test), budget_bytes=self.chunk_bytes))

    # ----------------------------------------------------------------- helpers
    def _check_arrays(self, outputs: Outputs, needed: frozenset[str], where: str) -> None:
        missing = sorted(needed - outputs.array_names())
        if missing:
            raise DetectorError(
                f"{self.name} needs {', '.join(missing)} in the {where}, which has only "
                f"{', '.join(sorted(outputs.array_names()))}"
            )

    def _check_positive(self, **values: float) -> None:
        for key, value in values.items():
            if not isinstance(value, (int, float, np.integer, np.floating)) or not np.isfinite(value) or value <= 0:
                raise DetectorError(f"{self.name}: {key} must be a positive number; got {value!r}")

    def _check_percentile(self, **values: float) -> None:
        for key, value in values.items():
            if not isinstance(value, (int, float, np.integer, np.floating)) or not 0 <= value < 100:
                raise DetectorError(f"{self.name}: {key} must be a percentile in [0, 100); got {value!r}")

    def _check_int(self, minimum: int = 1, maximum: int = INT_PARAM_MAX, **values: int) -> None:
        # Integers reach faiss, numpy shapes and torch: bounded, so that native code never sees an overflow
        # (seeds: 32-bit, as faiss and scikit-learn take them).
        for key, value in values.items():
            top = min(maximum, SEED_MAX) if key == "seed" else maximum
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not minimum <= value <= top:
                raise DetectorError(f"{self.name}: {key} must be an integer in [{minimum}, {top}]; got {value!r}"[:300])
