"""Declared fitted state: what a detector learns, as dtypes and shapes in terms of its fit (D, C, N) and parameters.

A detector lists its fitted state in `state` (or returns it from `state_spec(fit)` when it depends on the
parameters), for example::

    state = {
        "classes_": Array("int64", ("K",)),
        "means_": Array("float64", ("K", "D")),
        "threshold_": Scalar(float),
    }
    state_dims = {"K": "C"}      # a free dimension and its upper bound

A shape entry is an integer, ``D`` (features), ``C`` (classes, when the fit had logits or a head), ``N`` (fit
rows), a free dimension named in `state_dims` (bound on first use, then held to that value), or one of these
plus or minus an integer (``"r+1"``). Saving checks the fitted state against the declaration, so a detector
that learns something undeclared is caught by `check_detector`; loading checks a file against it, so a file
holds exactly the declared values with the declared dtypes and shapes, or is refused.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..core.errors import DetectorError

__all__ = [
    "Array",
    "FlatIndex",
    "IVFIndex",
    "Keyed",
    "Object",
    "Optional",
    "Scalar",
    "Spec",
    "Dims",
    "infer_spec",
    "inferred_bounds",
    "inferred_record",
    "read_inferred",
]

_TERM = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*(?:([+-])\s*(\d+))?\s*$")


@dataclass(frozen=True)
class Array:
    """A numeric array of one of `dtype` (a name or a tuple of names) with `shape` (C or Fortran order)."""

    dtype: str | tuple[str, ...]
    shape: tuple[int | str, ...]
    finite: bool = True  # float entries must be finite

    @property
    def dtypes(self) -> tuple[str, ...]:
        """The accepted dtype names."""
        return (self.dtype,) if isinstance(self.dtype, str) else tuple(self.dtype)

    def describe(self) -> str:
        """e.g. 'float64 (K, D)'."""
        return f"{' or '.join(self.dtypes)} ({', '.join(map(str, self.shape))})"


@dataclass(frozen=True)
class Scalar:
    """An int, float or bool (JSON), optionally within [low, high] (bounds may be dimension names)."""

    kind: type
    low: float | str | None = None
    high: float | str | None = None
    finite: bool = True


@dataclass(frozen=True)
class Optional:
    """`spec`, or None."""

    spec: Spec


@dataclass(frozen=True)
class Keyed:
    """A dict with exactly these string keys, each value its own spec (e.g. one array per layer)."""

    specs: Mapping[str, Spec]


@dataclass(frozen=True)
class Object:
    """An object of the class `cls` (fixed by the declaration, never by a file) with exactly these attributes.

    Loading creates it without running its constructor and sets the checked attributes; `check` (if given)
    then tests relations between them (raising DetectorError).
    """

    cls: type
    specs: Mapping[str, Spec]
    check: Callable[[Any, Dims], None] | None = None


@dataclass(frozen=True)
class FlatIndex:
    """An exact faiss inner-product index (IndexFlatIP), saved as its float32 vectors of shape (rows, dim)."""

    rows: int | str
    dim: int | str


@dataclass(frozen=True)
class IVFIndex:
    """A faiss IndexIVFFlat (inner product), saved as its centroids and inverted lists (ids and vectors)."""

    rows: int | str
    dim: int | str
    nlist: int | str
    nprobe: int


Spec = Array | Scalar | Optional | Keyed | Object | FlatIndex | IVFIndex


@dataclass
class Dims:
    """Dimension values: the fit's D, C, N, and free dimensions bound on first use within their bounds."""

    known: dict[str, int]
    bounds: Mapping[str, int | str] = field(default_factory=dict)

    def value(self, term: int | str, what: str, actual: int | None = None) -> int:
        """The value of a shape term; a free dimension not yet bound takes `actual` (checked against its bound)."""
        if isinstance(term, int):
            return term
        match = _TERM.match(term)
        if match is None:
            raise DetectorError(f"{what}: bad dimension {term!r} in the declared state")
        name, sign, amount = match.group(1), match.group(2), int(match.group(3) or 0)
        offset = amount if sign == "+" else -amount
        if name not in self.known:
            if name not in self.bounds:
                if name == "C":
                    raise DetectorError(f"{what}: the declared state needs C, but the fit recorded no classes")
                raise DetectorError(f"{what}: the dimension {name!r} is neither D, C, N nor declared in state_dims")
            if actual is None:
                raise DetectorError(f"{what}: the dimension {name!r} is not known yet")
            bound = self.value(self.bounds[name], what)
            candidate = actual - offset
            if not 0 <= candidate <= bound:
                raise DetectorError(
                    f"{what}: {name}={candidate} is outside [0, {bound}] ({name} <= {self.bounds[name]})"
                )
            self.known[name] = candidate
        return self.known[name] + offset

    def shape(self, shape: tuple[int | str, ...], what: str, actual: tuple[int, ...]) -> tuple[int, ...]:
        """The declared shape with its dimensions resolved (free ones bound from `actual`, when its rank agrees)."""
        if len(actual) != len(shape):
            return tuple(self.value(t, what, None) if isinstance(t, int) or t in self.known else -1 for t in shape)
        return tuple(self.value(term, what, size) for term, size in zip(shape, actual, strict=True))


def check_scalar(spec: Scalar, value: Any, what: str, dims: Dims) -> Any:
    """`value` as the declared scalar kind, or DetectorError."""
    if spec.kind is bool:
        ok = isinstance(value, (bool, np.bool_))
    elif spec.kind is int:
        ok = isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))
    elif spec.kind is float:
        ok = isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, (bool, np.bool_))
    else:
        raise DetectorError(f"{what}: a Scalar is int, float or bool, not {spec.kind!r}")
    if not ok:
        raise DetectorError(f"{what} must be a {spec.kind.__name__}; got {type(value).__name__} {value!r}"[:300])
    value = spec.kind(value)
    if spec.kind is float and spec.finite and not math.isfinite(value):
        raise DetectorError(f"{what} must be finite; got {value!r}")
    for bound, above in ((spec.low, False), (spec.high, True)):
        if bound is None:
            continue
        limit = dims.value(bound, what) if isinstance(bound, str) else bound
        if (value > limit) if above else (value < limit):
            raise DetectorError(f"{what}={value!r} is {'above' if above else 'below'} its bound {bound}={limit}")
    return value


def check_array(spec: Array, dtype: np.dtype, shape: tuple[int, ...], what: str, dims: Dims) -> None:
    """Raise DetectorError unless `dtype` and `shape` are the declared ones (binding free dimensions)."""
    if dtype.name not in spec.dtypes:
        raise DetectorError(f"{what} is {dtype.name}; the detector declares {spec.describe()}")
    expected = dims.shape(spec.shape, what, shape)
    if expected != tuple(shape):
        shown = ", ".join("?" if n < 0 else str(n) for n in expected)
        raise DetectorError(
            f"{what} has shape {tuple(shape)}; the detector declares {spec.describe()} = ({shown}) for this fit"
        )


# ----------------------------------------------------------------------------------------------- inferred state
# A detector that declares no state (no `state`, `state_dims` or `state_spec` of its own) has it inferred when it is
# saved: every fitted attribute (trailing underscore) must be a numeric array or an int/float/bool, and the file
# records each one's dtype and shape. Loading reads the record, never the arrays, to decide what to accept: the
# record must lie within bounds set by the fit's D, C and N, and each array must have exactly its recorded dtype and
# shape. A file cannot make oodbench allocate more than the bounds allow or hand the detector another dtype than
# the one recorded beside the array.
INFERRED_DTYPES = (
    "bool",
    "int8",
    "uint8",
    "int16",
    "uint16",
    "int32",
    "uint32",
    "int64",
    "uint64",
    "float16",
    "float32",
    "float64",
)
INFERRED_MAX_ENTRIES = 64
INFERRED_MAX_RANK = 3
_SCALAR_KINDS = {"bool": bool, "int": int, "float": float}
_RESERVED = ("fit_info_", "fit_provenance_")


def inferred_bounds(num_features: int, num_classes: int | None, num_rows: int | None) -> tuple[int, int, int]:
    """(largest dimension, most values in one array, most values in all) that an inferred state may hold.

    With M = max(D, C, N) and W = max(D, C): a dimension is at most M, an array holds at most M·W values (a fit-set
    bank N×D, a D×D covariance, C×D class means, C×C templates all fit) and the state at most 4·M·W.
    """
    largest = max(num_features, num_classes or 0, num_rows or 0)
    width = max(num_features, num_classes or 0)
    return largest, largest * width, 4 * largest * width


def infer_spec(name: str, value: Any) -> Array | Scalar:
    """The declaration of one fitted attribute of an undeclared state, from its value (DetectorError if none fits)."""
    if isinstance(value, (bool, np.bool_)):
        return Scalar(bool, finite=False)
    if isinstance(value, (int, np.integer)):
        return Scalar(int, finite=False)
    if isinstance(value, (float, np.floating)):
        return Scalar(float, finite=False)
    if isinstance(value, np.ndarray) and value.dtype.name in INFERRED_DTYPES:
        return Array(value.dtype.name, tuple(int(n) for n in value.shape), finite=False)
    kind = f"a {value.dtype.name} array" if isinstance(value, np.ndarray) else f"a {type(value).__name__}"
    raise DetectorError(
        f"fitted attribute {name} is {kind}: an undeclared state holds numeric arrays and int/float/bool values "
        "only (declare it in the class's `state`, see docs/plugins.md)"
    )


def check_inferred(specs: Mapping[str, Array | Scalar], bounds: tuple[int, int, int], what: str) -> None:
    """Raise DetectorError unless the inferred state's names, ranks and sizes lie within `bounds`."""
    largest, per_array, total = bounds
    if len(specs) > INFERRED_MAX_ENTRIES:
        raise DetectorError(
            f"{what}: {len(specs)} fitted values; an undeclared state holds at most {INFERRED_MAX_ENTRIES}"
        )
    values = 0
    for name, spec in specs.items():
        if not (name.isidentifier() and name.endswith("_") and not name.startswith("_") and name not in _RESERVED):
            raise DetectorError(f"{what}: {name[:100]!r} is not a fitted attribute name (a_name_ending_in_underscore)")
        if isinstance(spec, Array):
            shape = spec.shape
            if len(shape) > INFERRED_MAX_RANK or any(not isinstance(n, int) or not 0 <= n <= largest for n in shape):
                raise DetectorError(
                    f"{what}: {name} has shape {shape}; an undeclared state's arrays have at most {INFERRED_MAX_RANK} "
                    f"dimensions of at most max(D, C, N) = {largest} each"
                )
            size = math.prod(shape)
            if size > per_array:
                raise DetectorError(
                    f"{what}: {name} holds {size:,} values; an undeclared state's array holds at most "
                    f"max(D, C, N)·max(D, C) = {per_array:,} (declare `state` for a larger one)"
                )
            values += size
    if values > total:
        raise DetectorError(f"{what}: the state holds {values:,} values; an undeclared state holds at most {total:,}")


def inferred_record(specs: Mapping[str, Array | Scalar]) -> dict[str, dict[str, Any]]:
    """The inferred declaration as saved: {name: {"array": dtype, "shape": [...]}} or {name: {"scalar": kind}}."""
    record: dict[str, dict[str, Any]] = {}
    for name, spec in specs.items():
        if isinstance(spec, Array):
            record[name] = {"array": spec.dtypes[0], "shape": list(spec.shape)}
        else:
            record[name] = {"scalar": spec.kind.__name__}
    return record


def read_inferred(record: Any, bounds: tuple[int, int, int], what: str) -> dict[str, Array | Scalar]:
    """The declaration a saved record of an inferred state stands for, checked against `bounds` (DetectorError)."""
    if not isinstance(record, dict):
        raise DetectorError(f"{what}: inferred_state must be a JSON object")
    if len(record) > INFERRED_MAX_ENTRIES:
        raise DetectorError(
            f"{what}: {len(record)} fitted values; an undeclared state holds at most {INFERRED_MAX_ENTRIES}"
        )
    specs: dict[str, Array | Scalar] = {}
    for name, entry in record.items():
        shown = json_preview(entry)
        if isinstance(entry, dict) and set(entry) == {"scalar"} and entry["scalar"] in _SCALAR_KINDS:
            kind = _SCALAR_KINDS[entry["scalar"]]
            specs[name] = Scalar(kind, finite=False)
        elif (
            isinstance(entry, dict)
            and set(entry) == {"array", "shape"}
            and entry["array"] in INFERRED_DTYPES
            and isinstance(entry["shape"], list)
            and len(entry["shape"]) <= INFERRED_MAX_RANK
            and all(isinstance(n, int) and not isinstance(n, bool) for n in entry["shape"])
        ):
            specs[name] = Array(entry["array"], tuple(entry["shape"]), finite=False)
        else:
            raise DetectorError(
                f"{what}: inferred_state[{name[:60]!r}] must be {{'array': dtype, 'shape': [...]}} (dtype one of "
                f"{', '.join(INFERRED_DTYPES)}) or {{'scalar': 'int' | 'float' | 'bool'}}; got {shown}"
            )
    check_inferred(specs, bounds, what)
    return specs


def json_preview(value: Any) -> str:
    """A short text of a JSON value for an error message."""
    import json

    try:
        return json.dumps(value)[:80]
    except (TypeError, ValueError):
        return type(value).__name__
