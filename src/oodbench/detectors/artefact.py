"""Fitted detectors as files: data only. Parameters are plain JSON, fitted state is named arrays and numbers.

A saved detector is a directory::

    <dir>/state.safetensors   the arrays of the fitted state (safetensors: raw numbers and a JSON header)
    <dir>/detector.json       name, parameters, the fit's shape, the state's numbers, versions, provenance

Loading constructs nothing that the file names. The detector class comes from the registry by name (the
built-ins, installed plugins and those given with ``plugins=``/``--plugin``: nothing in the file decides what is
imported). Parameters are plain JSON checked against the constructor's signature and `validate_params`. The
fitted state must be exactly what the class declares (`Detector.state_spec`): each array with the declared
dtype and shape for the recorded fit (D features, C classes, N rows), in C or Fortran order, finite where
declared; each number of the declared kind and range. A class that declares no state has it inferred at save
(`state.infer_spec`): the file records each fitted value's dtype and shape (``inferred_state``), and loading holds
the arrays to that record within bounds derived from D, C and N (`state.read_inferred`). Anything else in either
file is refused with one line.
Arrays keep their dtype and memory order, so a loaded detector scores bit for bit like the one that was saved.

Saving and loading are functions of this module over the detector's declared state, ``save(detector, dir)`` and
``load(dir)`` (both exported by `oodbench.detectors`); the base class does not know this module.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import errno
import hashlib
import json
import math
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from ..core.errors import DetectorError
from ..core.names import check_name
from ..core.store import PROVENANCE_KEYS, Store, library_versions
from ..util.atomic import UnsafeFileError, atomic_path, atomic_write_json, open_regular, read_regular, sha256_file
from . import registry
from .base import Detector, _FitInfo, fit_record, use_saver
from .state import (
    Array,
    Dims,
    FlatIndex,
    IVFIndex,
    Keyed,
    Object,
    Optional,
    Scalar,
    check_array,
    check_inferred,
    check_scalar,
    infer_spec,
    inferred_bounds,
    inferred_record,
    read_inferred,
)

__all__ = [
    "FORMAT_VERSION",
    "check_provenance",
    "fit_provenance",
    "fitted_state",
    "load",
    "read_meta",
    "save",
    "saved_score_key",
]

FORMAT_VERSION = 2
META_FILE = "detector.json"
ARRAYS_FILE = "state.safetensors"
# detector.json holds parameters, provenance and a few numbers; anything near this size is not one.
META_LIMIT_BYTES = 8 << 20
# The largest state.safetensors read (checked before reading): no dimension exceeds 2^40, nor does the file.
ARRAYS_LIMIT_BYTES = 1 << 40
# JSON nesting deeper than this is refused before anything walks it (real files nest 5 levels or so).
MAX_JSON_DEPTH = 32
# A dimension above this cannot be an array held in memory; refusing it keeps products of dimensions exact.
MAX_DIMENSION = 1 << 40
_TOP_KEYS = {
    "format",
    "detector",
    "origin",
    "params",
    "fit",
    "state",
    "arrays_sha256",
    "provenance",
    "versions",
    "saved",
    "inferred_state",
}

# Set on a loaded detector (and kept by a later save): where its fit came from; not part of the learned state.
PROVENANCE_ATTRIBUTE = "fit_provenance_"
FIT_INFO = "fit_info_"

# safetensors' dtype names -> numpy's (the numeric types a detector may declare).
_SAFETENSORS_DTYPES = {
    "BOOL": "bool",
    "U8": "uint8",
    "I8": "int8",
    "U16": "uint16",
    "I16": "int16",
    "U32": "uint32",
    "I32": "int32",
    "U64": "uint64",
    "I64": "int64",
    "F16": "float16",
    "F32": "float32",
    "F64": "float64",
}


def fitted_state(detector: Detector) -> dict[str, Any]:
    """The detector's fitted state: its instance attributes whose names end with an underscore."""
    return {
        k: v
        for k, v in vars(detector).items()
        if k.endswith("_") and not k.startswith("__") and k != PROVENANCE_ATTRIBUTE
    }


def inferred_spec(detector: Detector, info: _FitInfo, what: str) -> dict[str, Array | Scalar]:
    """The state of a detector that declares none, inferred from its fitted attributes and checked against the bounds
    that loading applies (`state.inferred_bounds`); DetectorError naming the attribute that cannot be saved."""
    state = {k: v for k, v in fitted_state(detector).items() if k != FIT_INFO}
    try:
        spec = {name: infer_spec(name, value) for name, value in sorted(state.items())}
        check_inferred(spec, inferred_bounds(info.num_features, info.num_classes, info.num_rows), what)
    except DetectorError as exc:
        message = str(exc)
        raise DetectorError(message if message.startswith(what) else f"{what}: {message}") from None
    return spec


def _fit_dims(detector: Detector, info: _FitInfo) -> Dims:
    known = {"D": info.num_features}
    if info.num_rows is not None:
        known["N"] = info.num_rows
    if info.num_classes is not None:
        known["C"] = info.num_classes
    return Dims(known, dict(type(detector).state_dims))


# ----------------------------------------------------------------------------------------------- encoding
class _Encoder:
    """Checks a fitted state against its declaration while turning it into JSON and named arrays."""

    def __init__(self, dims: Dims) -> None:
        self.dims = dims
        self.arrays: dict[str, np.ndarray] = {}

    def encode(self, spec: Any, value: Any, path: str) -> Any:
        if isinstance(spec, Optional):
            return None if value is None else self.encode(spec.spec, value, path)
        if value is None:
            raise DetectorError(f"cannot save {path}: it is None, but the detector declares it as {_kind(spec)}")
        if isinstance(spec, Scalar):
            return _json_number(check_scalar(spec, value, f"cannot save {path}", self.dims))
        if isinstance(spec, Array):
            return self._array(spec, value, path)
        if isinstance(spec, Keyed):
            if not isinstance(value, Mapping) or set(value) != set(spec.specs):
                keys = sorted(value) if isinstance(value, Mapping) else type(value).__name__
                raise DetectorError(f"cannot save {path}: declared with keys {sorted(spec.specs)}, holds {keys}")
            return {key: self.encode(spec.specs[key], value[key], f"{path}[{key}]") for key in spec.specs}
        if isinstance(spec, Object):
            if type(value) is not spec.cls:
                raise DetectorError(f"cannot save {path}: declared as {spec.cls.__qualname__}, holds {type(value)!r}")
            attributes = vars(value)
            undeclared = sorted(set(attributes) - set(spec.specs))
            if undeclared:
                raise DetectorError(f"cannot save {path}: attributes {undeclared} are not declared")
            encoded = {k: self.encode(s, attributes.get(k), f"{path}.{k}") for k, s in spec.specs.items()}
            if spec.check is not None:
                spec.check(value, self.dims)
            return encoded
        if isinstance(spec, FlatIndex):
            return self._flat_index(spec, value, path)
        if isinstance(spec, IVFIndex):
            return self._ivf_index(spec, value, path)
        raise DetectorError(f"cannot save {path}: {spec!r} is not a state declaration")

    def _put(self, key: str, array: np.ndarray) -> None:
        if key in self.arrays:
            raise DetectorError(f"cannot save {key}: two state values share this name")
        self.arrays[key] = array

    def _array(self, spec: Array, value: Any, path: str) -> dict[str, str]:
        if not isinstance(value, np.ndarray):
            raise DetectorError(f"cannot save {path}: declared as an array, holds a {type(value).__name__}")
        check_array(spec, value.dtype, value.shape, f"cannot save {path}", self.dims)
        _check_finite(spec, value, f"cannot save {path}")
        if value.flags.c_contiguous:
            self._put(path, np.ascontiguousarray(value))
            return {"layout": "C"}
        if value.flags.f_contiguous:
            # Kept in Fortran order (numpy picks BLAS or its own loops, with other rounding, by the operands'
            # layout): saved as the C-ordered transpose, loaded as the transpose of that.
            self._put(path, np.ascontiguousarray(value.T))
            return {"layout": "F"}
        raise DetectorError(
            f"cannot save {path}: a strided view (neither C nor Fortran order); keep np.ascontiguousarray(...) in _fit"
        )

    def _flat_index(self, spec: FlatIndex, value: Any, path: str) -> dict[str, str]:
        import faiss

        if type(value) is not faiss.IndexFlatIP:
            raise DetectorError(f"cannot save {path}: declared as a faiss IndexFlatIP, holds {type(value).__name__}")
        vectors = _flat_vectors(value)
        check_array(
            Array("float32", (spec.rows, spec.dim)), vectors.dtype, vectors.shape, f"cannot save {path}", self.dims
        )
        self._put(path, vectors)
        return {"faiss": "IndexFlatIP"}

    def _ivf_index(self, spec: IVFIndex, value: Any, path: str) -> dict[str, str]:
        import faiss

        if type(value) is not faiss.IndexIVFFlat or value.metric_type != faiss.METRIC_INNER_PRODUCT:
            raise DetectorError(f"cannot save {path}: declared as an inner-product IndexIVFFlat, holds {value!r}")
        quantizer = faiss.downcast_index(value.quantizer)
        lists = value.invlists
        sizes = np.array([lists.list_size(i) for i in range(value.nlist)], dtype=np.int64)
        ids = [faiss.rev_swig_ptr(lists.get_ids(i), int(n)).copy() for i, n in enumerate(sizes) if n]
        codes = [
            faiss.rev_swig_ptr(lists.get_codes(i), int(n) * value.code_size).copy() for i, n in enumerate(sizes) if n
        ]
        dim = value.d
        parts = {
            "centroids": (Array("float32", (spec.nlist, spec.dim)), _flat_vectors(quantizer)),
            "list_sizes": (Array("int64", (spec.nlist,)), sizes),
            "ids": (Array("int64", (spec.rows,)), np.concatenate(ids) if ids else np.zeros(0, np.int64)),
            "vectors": (
                Array("float32", (spec.rows, spec.dim)),
                np.concatenate(codes).view(np.float32).reshape(-1, dim) if codes else np.zeros((0, dim), np.float32),
            ),
        }
        for name, (part_spec, array) in parts.items():
            check_array(part_spec, array.dtype, array.shape, f"cannot save {path}.{name}", self.dims)
            self._put(f"{path}.{name}", np.ascontiguousarray(array))
        return {"faiss": "IndexIVFFlat"}


def _flat_vectors(index: Any) -> np.ndarray:
    import faiss

    return faiss.rev_swig_ptr(index.get_xb(), index.ntotal * index.d).reshape(index.ntotal, index.d).copy()


def _kind(spec: Any) -> str:
    if isinstance(spec, Array):
        return f"an array {spec.describe()}"
    if isinstance(spec, Scalar):
        return f"a {spec.kind.__name__}"
    if isinstance(spec, Keyed):
        return f"a dict with keys {sorted(spec.specs)}"
    if isinstance(spec, Object):
        return f"a {spec.cls.__qualname__}"
    if isinstance(spec, (FlatIndex, IVFIndex)):
        return f"a faiss {type(spec).__name__}"
    return repr(spec)


def _json_number(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return {"float": repr(value)}  # JSON has no NaN or infinity
    return value


def _check_finite(spec: Array, array: np.ndarray, what: str) -> None:
    if spec.finite and array.dtype.kind == "f" and array.size and not np.isfinite(array).all():
        raise DetectorError(f"{what} holds {int((~np.isfinite(array)).sum())} non-finite values")


def _json_params(detector: Detector) -> dict[str, Any]:
    def plain(value: Any, where: str) -> Any:
        if value is None or isinstance(value, (bool, str)):
            return value
        if isinstance(value, (int, np.integer)):
            return int(value)
        if isinstance(value, (float, np.floating)):
            if not math.isfinite(value):
                raise DetectorError(f"cannot save parameter {where}={value!r}: not a finite number")
            return float(value)
        if isinstance(value, (list, tuple)):
            return [plain(v, f"{where}[{i}]") for i, v in enumerate(value)]
        if isinstance(value, Mapping) and all(isinstance(k, str) for k in value):
            return {k: plain(v, f"{where}.{k}") for k, v in value.items()}
        raise DetectorError(
            f"cannot save parameter {where}: a {type(value).__name__} is not plain JSON (number, string, bool, None, "
            "list or dict with string keys)"
        )

    return {name: plain(value, name) for name, value in detector.get_params().items()}


# ----------------------------------------------------------------------------------------------- decoding
class _Decoder:
    """Walks the declaration (never the file) and takes from the file exactly the declared values, checked."""

    def __init__(self, handle: Any, dims: Dims, origin: str) -> None:
        self.handle, self.dims, self.origin = handle, dims, origin
        self.available = set(handle.keys())
        self.used: set[str] = set()
        for key in sorted(self.available):
            dtype = handle.get_slice(key).get_dtype()
            if dtype not in _SAFETENSORS_DTYPES:
                raise self.fail(f"{ARRAYS_FILE}: {key[:100]} has dtype {dtype}, which no detector declares")

    def fail(self, message: str) -> DetectorError:
        return DetectorError(f"{self.origin}: {message}")

    def decode(self, spec: Any, value: Any, path: str) -> Any:
        if isinstance(spec, Optional):
            return None if value is None else self.decode(spec.spec, value, path)
        if value is None:
            raise self.fail(f"{path} is null; the detector declares {_kind(spec)}")
        if isinstance(spec, Scalar):
            if isinstance(value, dict) and set(value) == {"float"} and value["float"] in ("nan", "inf", "-inf"):
                value = float(value["float"])
            if isinstance(value, (dict, list, str)):
                raise self.fail(f"{path} must be a {spec.kind.__name__}; got {json.dumps(value)[:80]}")
            return check_scalar(spec, value, f"{self.origin}: {path}", self.dims)
        if isinstance(spec, Array):
            layout = self._marker(value, "layout", ("C", "F"), path)
            return self._array(spec, path, layout)
        if isinstance(spec, Keyed):
            if not isinstance(value, dict) or set(value) != set(spec.specs):
                keys = sorted(value) if isinstance(value, dict) else type(value).__name__
                raise self.fail(f"{path} must have exactly the keys {sorted(spec.specs)}; got {keys}"[:300])
            return {key: self.decode(spec.specs[key], value[key], f"{path}[{key}]") for key in spec.specs}
        if isinstance(spec, Object):
            if not isinstance(value, dict) or set(value) != set(spec.specs):
                keys = sorted(value) if isinstance(value, dict) else type(value).__name__
                raise self.fail(f"{path} must have exactly the attributes {sorted(spec.specs)}; got {keys}"[:300])
            # The class is the declaration's; no constructor runs: the object gets exactly the checked attributes.
            obj = object.__new__(spec.cls)
            for key, item_spec in spec.specs.items():
                object.__setattr__(obj, key, self.decode(item_spec, value[key], f"{path}.{key}"))
            if spec.check is not None:
                try:
                    spec.check(obj, self.dims)
                except DetectorError as exc:
                    raise self.fail(f"{path}: {exc}") from None
            return obj
        if isinstance(spec, FlatIndex):
            self._marker(value, "faiss", ("IndexFlatIP",), path)
            return self._flat_index(spec, path)
        if isinstance(spec, IVFIndex):
            self._marker(value, "faiss", ("IndexIVFFlat",), path)
            return self._ivf_index(spec, path)
        raise self.fail(f"{path}: {spec!r} is not a state declaration")

    def _marker(self, value: Any, key: str, allowed: tuple[str, ...], path: str) -> str:
        if not isinstance(value, dict) or set(value) != {key} or value[key] not in allowed:
            shown = json.dumps(value)[:80]
            raise self.fail(f"{path} must be {{{key!r}: one of {list(allowed)}}}; got {shown}")
        return value[key]

    def _array(self, spec: Array, key: str, layout: str = "C") -> np.ndarray:
        if key not in self.available:
            raise self.fail(f"{ARRAYS_FILE} lacks the array {key!r}")
        self.used.add(key)
        view = self.handle.get_slice(key)
        dtype_name = _SAFETENSORS_DTYPES[view.get_dtype()]
        shape = tuple(int(n) for n in view.get_shape())
        if any(n > MAX_DIMENSION for n in shape):
            raise self.fail(f"{key} has shape {shape}")
        logical = shape[::-1] if layout == "F" else shape
        check_array(spec, np.dtype(dtype_name), logical, f"{self.origin}: {key}", self.dims)
        # An owned, aligned, writeable copy (the file's buffer is not ours to keep).
        array = np.array(self.handle.get_tensor(key), dtype=dtype_name, order="C")
        if array.shape != shape:
            raise self.fail(f"{key}: the array read has shape {array.shape}, its header says {shape}")
        if layout == "F":
            array = array.T
        _check_finite(spec, array, f"{self.origin}: {key}")
        return array

    def _flat_index(self, spec: FlatIndex, path: str) -> Any:
        import faiss

        vectors = self._array(Array("float32", (spec.rows, spec.dim)), path)
        index = faiss.IndexFlatIP(vectors.shape[1])
        index.add(vectors)  # a flat index stores the vectors verbatim: the same index as saved
        return index

    def _ivf_index(self, spec: IVFIndex, path: str) -> Any:
        import faiss

        centroids = self._array(Array("float32", (spec.nlist, spec.dim)), f"{path}.centroids")
        sizes = self._array(Array("int64", (spec.nlist,)), f"{path}.list_sizes")
        ids = self._array(Array("int64", (spec.rows,)), f"{path}.ids")
        vectors = self._array(Array("float32", (spec.rows, spec.dim)), f"{path}.vectors")
        nlist, dim = centroids.shape
        if nlist < 1 or (sizes < 0).any() or int(sizes.sum()) != len(ids):
            raise self.fail(f"{path}.list_sizes must be non-negative and sum to the {len(ids)} ids")
        if not np.array_equal(np.sort(ids), np.arange(len(ids))):
            raise self.fail(f"{path}.ids must number the rows 0..{len(ids) - 1}, each once")
        quantizer = faiss.IndexFlatIP(dim)
        quantizer.add(centroids)
        index = faiss.IndexIVFFlat(quantizer, dim, nlist, faiss.METRIC_INNER_PRODUCT)
        index.is_trained = True
        starts = np.concatenate([[0], np.cumsum(sizes)])
        for number in np.flatnonzero(sizes):
            part = slice(int(starts[number]), int(starts[number + 1]))
            list_ids = np.ascontiguousarray(ids[part])
            list_codes = np.ascontiguousarray(vectors[part]).view(np.uint8)
            index.invlists.add_entries(
                int(number), int(sizes[number]), faiss.swig_ptr(list_ids), faiss.swig_ptr(list_codes)
            )
        index.ntotal = len(ids)
        index.nprobe = spec.nprobe  # faiss's wrapper keeps the quantizer alive with the index
        return index


def _depth(value: Any) -> int:
    """Nesting depth of a parsed JSON value, without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        deepest = max(deepest, level)
        if isinstance(item, dict):
            stack.extend((v, level + 1) for v in item.values())
        elif isinstance(item, list):
            stack.extend((v, level + 1) for v in item)
    return deepest


def _refuse_constant(token: str) -> None:
    raise ValueError(f"{token} is not JSON")


# ----------------------------------------------------------------------------------------------- provenance
def fit_provenance(store: Store, model_id: str, dataset_id: str) -> dict[str, Any]:
    """What a fit on a store entry came from: model id, checkpoint, preprocessing, entry, item hash, head."""
    return fit_record(store.entry_provenance(model_id, dataset_id))


NO_PROVENANCE_FLAG = "--no-provenance-check"


def check_provenance(
    saved: Mapping[str, Any] | None, store: Store, model_id: str, dataset_id: str, *, allow_missing: bool = False
) -> list[str]:
    """Raise DetectorError unless the entry comes from the checkpoint and preprocessing the detector was fit on.

    Both sides must record them: a detector or an entry without provenance cannot be checked, and is refused
    unless `allow_missing` (the user's explicit `--no-provenance-check`); then the returned lines say what went
    unchecked. Provenance that disagrees is always refused.
    """
    unchecked = []
    if not saved or not any(saved.get(key) is not None for key in PROVENANCE_KEYS):
        if allow_missing:
            unchecked.append("the detector records no fit provenance")
        else:
            raise DetectorError(
                "the saved detector records no fit provenance (model, checkpoint, preprocessing), so its inputs cannot "
                "be checked; save it with provenance (evaluate --save-detectors does, and so does save after "
                f"a fit on outputs read from a store), or pass {NO_PROVENANCE_FLAG} to score anyway"
            )
    entry = store.meta(model_id, dataset_id).get("provenance") or {}
    if not any(entry.get(key) is not None for key in PROVENANCE_KEYS):
        if not allow_missing:
            raise DetectorError(
                f"{model_id}/{dataset_id} records no provenance (model, checkpoint, preprocessing), so it cannot be "
                f"checked against the detector's fit; pass {NO_PROVENANCE_FLAG} to score anyway"
            )
        unchecked.append(f"{model_id}/{dataset_id} records no provenance")
    if unchecked:
        return unchecked
    for key in PROVENANCE_KEYS:
        if saved.get(key) != entry.get(key):
            raise DetectorError(
                f"provenance mismatch: the detector was fit on {saved.get('model_id')}/{saved.get('fit_dataset')} "
                f"with {key}={saved.get(key)!r} but {model_id}/{dataset_id} has {key}={entry.get(key)!r}; "
                "scores of another checkpoint or preprocessing would be meaningless"
            )
    return []


# ----------------------------------------------------------------------------------------------- save / load
def _origin_record(detector: Detector) -> dict[str, Any]:
    cls = type(detector)
    try:
        registered = registry.get_class(detector.name) is cls
    except DetectorError:
        registered = False
    where = registry.origin(detector.name) if registered else registry._derive_origin(cls)
    return {
        "class": f"{cls.__module__}:{cls.__qualname__}",
        "registered": registered,
        **dataclasses.asdict(where),
    }


def save(detector: Detector, directory: str | os.PathLike[str], *, provenance: Mapping[str, Any] | None = None) -> Path:
    """Write a fitted detector to `directory` (created; an earlier save there is replaced).

    The fitted state must match the detector's declaration (`state_spec`); what loading would refuse is refused here.
    """
    info = getattr(detector, FIT_INFO, None)
    if not isinstance(info, _FitInfo):
        raise DetectorError(f"{detector.name or type(detector).__name__} is not fitted: nothing to save")
    from safetensors.numpy import save_file

    if provenance is None:
        provenance = getattr(detector, PROVENANCE_ATTRIBUTE, None)
    path = Path(directory)
    dims = _fit_dims(detector, info)
    state = {k: v for k, v in fitted_state(detector).items() if k != FIT_INFO}
    label = detector.name or type(detector).__name__
    inferred = None
    if detector.declares_state():
        spec = dict(detector.state_spec(info))
    else:
        spec = inferred_spec(detector, info, f"cannot save {label}")
        inferred = inferred_record(spec)
    undeclared = sorted(set(state) - set(spec))
    if undeclared:
        raise DetectorError(
            f"cannot save {label}: fitted state {', '.join(undeclared)} is not declared in its `state` "
            "(declare each learned attribute with its dtype and shape; see docs/plugins.md)"
        )
    missing = sorted(k for k, s in spec.items() if k not in state and not isinstance(s, Optional))
    if missing:
        raise DetectorError(f"cannot save {label}: declared state {', '.join(missing)} was not set by fit")
    encoder = _Encoder(dims)
    encoded = {key: encoder.encode(item, state.get(key), key) for key, item in spec.items()}
    params = _json_params(detector)
    provenance_json = None if provenance is None else json.loads(json.dumps(dict(provenance), default=str))
    path.mkdir(parents=True, exist_ok=True)
    if (path / META_FILE).exists():
        (path / META_FILE).unlink()  # a half-replaced directory must not look like a saved detector
    with atomic_path(path / ARRAYS_FILE) as tmp:
        save_file(encoder.arrays, str(tmp))
    meta = {
        "format": FORMAT_VERSION,
        "detector": detector.name or type(detector).__name__,  # an unregistered class: loadable by naming it
        "origin": _origin_record(detector),
        "params": params,
        "fit": {
            "num_features": info.num_features,
            "num_classes": info.num_classes,
            "num_rows": info.num_rows,
            "extras": {k: list(v) for k, v in info.extras.items()},
        },
        "state": encoded,
        "arrays_sha256": sha256_file(path / ARRAYS_FILE),
        "provenance": provenance_json,
        "versions": library_versions(),
        "saved": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
    }
    if inferred:  # a class without declarations: the record that loading checks the arrays against
        meta["inferred_state"] = inferred
    atomic_write_json(path / META_FILE, meta)
    return path


def _sha256_fd(fd: int, block: int = 16 * 2**20) -> str:
    """SHA-256 of an open file from its start (the descriptor's offset is left at its end)."""
    digest = hashlib.sha256()
    os.lseek(fd, 0, os.SEEK_SET)
    while chunk := os.read(fd, block):
        digest.update(chunk)
    return digest.hexdigest()


def read_meta(directory: str | os.PathLike[str]) -> dict[str, Any]:
    """The saved detector's detector.json (name, parameters, fit, versions, provenance), checked for form."""
    path = Path(directory)
    meta_path = path / META_FILE
    if not os.path.lexists(meta_path):
        raise DetectorError(
            f"{path} is not a saved detector (no {META_FILE}); save one with detectors.save(detector, dir)"
        )
    try:
        # A regular file inside the folder only (no link, FIFO or device), its size checked before reading.
        data = read_regular(meta_path, META_LIMIT_BYTES)
        meta = json.loads(data.decode("utf-8"), parse_constant=_refuse_constant)
    except UnsafeFileError as exc:
        if exc.errno == errno.EFBIG:
            raise DetectorError(f"{meta_path} is {exc.strerror}; a saved detector's is far smaller") from None
        raise DetectorError(f"cannot read {meta_path}: {exc.strerror}") from None
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:
        reason = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)
        raise DetectorError(f"cannot read {meta_path}: {reason}"[:400]) from None
    if not isinstance(meta, dict):
        raise DetectorError(f"{meta_path} is not a JSON object")
    if meta.get("format") != FORMAT_VERSION:
        older = " (older saves named code to run on load; refit and save again)" if meta.get("format") == 1 else ""
        raise DetectorError(
            f"{path}: saved detector format {meta.get('format')!r}; this oodbench reads format {FORMAT_VERSION}{older}"[
                :400
            ]
        )
    if _depth(meta) > MAX_JSON_DEPTH:
        raise DetectorError(f"{meta_path} nests deeper than {MAX_JSON_DEPTH} levels; a saved detector does not")
    unknown = sorted(set(meta) - _TOP_KEYS)
    missing = sorted(k for k in ("detector", "origin", "params", "fit", "state", "arrays_sha256") if k not in meta)
    if unknown or missing:
        raise DetectorError(f"{meta_path}: unknown fields {unknown}, missing fields {missing}"[:400])
    check_name(meta["detector"], f"{meta_path}: detector", error=DetectorError)
    for key in ("origin", "params", "state", "fit"):
        if not isinstance(meta[key], dict):
            raise DetectorError(f"{meta_path}: {key} must be a JSON object")
    if meta.get("provenance") is not None and not isinstance(meta["provenance"], dict):
        raise DetectorError(f"{meta_path}: provenance must be a JSON object or null")
    return meta


def saved_score_key(directory: str | os.PathLike[str]) -> str | None:
    """The evaluation cache key recorded in a saved detector's provenance, or None (no detector saved there)."""
    try:
        key = (read_meta(directory).get("provenance") or {}).get("score_key")
    except DetectorError:
        return None
    return key if isinstance(key, str) else None


def _read_fit(meta: Mapping[str, Any], origin: str) -> _FitInfo:
    fit = meta["fit"]
    if set(fit) != {"num_features", "num_classes", "num_rows", "extras"}:
        raise DetectorError(f"{origin}: fit must hold num_features, num_classes, num_rows and extras")

    def count(value: Any, what: str, minimum: int = 1) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= MAX_DIMENSION:
            raise DetectorError(f"{origin}: fit {what} must be an integer in [{minimum}, 2^40]; got {value!r}"[:300])
        return value

    extras = fit["extras"]
    if not isinstance(extras, dict) or not all(isinstance(v, list) for v in extras.values()):
        raise DetectorError(f"{origin}: fit extras must map names to shapes (lists of integers)")
    return _FitInfo(
        num_features=count(fit["num_features"], "num_features"),
        num_classes=None if fit["num_classes"] is None else count(fit["num_classes"], "num_classes"),
        extras={k: tuple(count(n, f"extras.{k}", 0) for n in v) for k, v in extras.items()},
        num_rows=None if fit["num_rows"] is None else count(fit["num_rows"], "num_rows"),
    )


def _read_params(cls: type[Detector], params: Mapping[str, Any], origin: str) -> dict[str, Any]:
    """The saved parameters as constructor arguments: only the signature's names; lists back to tuples where the
    default is a tuple."""
    allowed = cls.param_names()
    unknown = sorted(set(params) - set(allowed))
    if unknown:
        raise DetectorError(f"{cls.name} has no parameter {', '.join(unknown)}; its parameters: {allowed}"[:300])
    defaults = cls.default_params()
    return {
        key: tuple(value) if isinstance(value, list) and isinstance(defaults.get(key), tuple) else value
        for key, value in params.items()
    }


def load(
    directory: str | os.PathLike[str],
    *,
    plugins: Iterable[str] = (),
    check_versions: bool = True,
    detector_class: type[Detector] | None = None,
) -> Detector:
    """A fitted detector saved with `save`; refuses anything but the declared data, and another code version
    unless check_versions=False.

    The class is the registered one of the saved name (built-ins, installed plugins, and `plugins`), or
    `detector_class` when the caller names it; the file never decides what is imported.
    """
    from safetensors import SafetensorError, safe_open

    path = Path(directory)
    meta = read_meta(path)
    name, recorded = meta["detector"], meta["origin"]
    if detector_class is not None:
        cls = detector_class
        current = dataclasses.asdict(registry._derive_origin(cls))
    else:
        registry.load_plugins(plugins)
        if name not in registry.available():
            where = recorded.get("path") or recorded.get("distribution") or recorded.get("module")
            version = f" {recorded['version']}" if isinstance(recorded.get("version"), str) else ""
            source = f" (saved from {where}{version})" if isinstance(where, str) else ""
            hint = " (is it installed?)" if not plugins else ""
            raise DetectorError(
                f"{path}: detector {name!r}{source} is not registered{hint}; install its plugin or name it with "
                "--plugin (a saved detector never imports code itself)"[:400]
            )
        cls = registry.get_class(name)
        current = dataclasses.asdict(registry.origin(name))
    if f"{cls.__module__}:{cls.__qualname__}" != recorded.get("class"):
        raise DetectorError(
            f"{path}: saved by {str(recorded.get('class'))[:100]} but {name!r} is now {cls.__module__}:{cls.__qualname__}"
        )
    if check_versions and (current["distribution"], current["version"]) != (
        recorded.get("distribution"),
        recorded.get("version"),
    ):
        raise DetectorError(
            f"{path}: {name} was saved with {recorded.get('distribution')} {recorded.get('version')} but "
            f"{current['distribution']} {current['version']} is installed; its fitted state may not mean the same "
            "(load with check_versions=False, or score --ignore-versions, to accept)"[:400]
        )
    try:
        detector = cls(**_read_params(cls, meta["params"], str(path)))
        detector.validate_params()
    except DetectorError as exc:
        raise DetectorError(f"{path}: {exc}"[:400]) from None
    except (TypeError, ValueError, KeyError, AttributeError, OverflowError) as exc:
        raise DetectorError(f"{path}: invalid parameters for {name}: {type(exc).__name__}: {exc}"[:400]) from None
    info = _read_fit(meta, str(path))
    try:
        if detector.declares_state():
            if "inferred_state" in meta:
                raise DetectorError(f"{name} declares its state; the file's inferred_state is not its")
            spec = dict(detector.state_spec(info))
        else:
            bounds = inferred_bounds(info.num_features, info.num_classes, info.num_rows)
            spec = dict(read_inferred(meta.get("inferred_state", {}), bounds, META_FILE))
            taken = sorted(key for key in spec if hasattr(cls, key))
            if taken:
                raise DetectorError(f"the state names {', '.join(taken)[:100]}, which {name} has as class attributes")
    except DetectorError as exc:
        raise DetectorError(f"{path}: {exc}"[:400]) from None
    state = meta["state"]
    unknown = sorted(set(state) - set(spec))
    if unknown:
        raise DetectorError(f"{path}: the state holds {', '.join(unknown)[:200]}, which {name} does not declare")
    # An optional value may be absent (a file saved before the detector declared it): it loads as None.
    missing = sorted(k for k in set(spec) - set(state) if not isinstance(spec[k], Optional))
    if missing:
        raise DetectorError(f"{path}: the state lacks {', '.join(missing)}, which {name} declares")
    arrays_path = path / ARRAYS_FILE
    try:
        fd = open_regular(arrays_path)  # a regular file inside the folder: no link, FIFO or device
    except OSError as exc:
        raise DetectorError(f"cannot read {arrays_path}: {exc.strerror or exc}") from None
    try:
        size = os.fstat(fd).st_size
        if size > ARRAYS_LIMIT_BYTES:
            raise DetectorError(f"{arrays_path} is {size:,} bytes, more than the {ARRAYS_LIMIT_BYTES:,} allowed")
        if _sha256_fd(fd) != meta.get("arrays_sha256"):
            raise DetectorError(f"{arrays_path} does not match {META_FILE} (modified or from another save)")
        # The arrays are read from the very file just hashed and checked, not whatever the name points to now.
        opened = f"/proc/self/fd/{fd}" if os.path.isdir("/proc/self/fd") else str(arrays_path)
        with safe_open(opened, framework="numpy") as handle:
            decoder = _Decoder(handle, _fit_dims(detector, info), str(path))
            values = {key: decoder.decode(item, state.get(key), key) for key, item in spec.items()}
            extra = sorted(decoder.available - decoder.used)
    except (OSError, SafetensorError, ValueError, TypeError, MemoryError, OverflowError) as exc:
        raise DetectorError(f"cannot read {arrays_path}: {type(exc).__name__}: {exc}"[:400]) from None
    finally:
        os.close(fd)
    if extra:
        raise DetectorError(f"{path}: {ARRAYS_FILE} holds arrays no declared state uses: {', '.join(extra)[:200]}")
    if cls.name and cls.name != name:
        detector.name = name
    for key, value in values.items():
        setattr(detector, key, value)
    detector.fit_info_ = info
    setattr(detector, PROVENANCE_ATTRIBUTE, meta.get("provenance"))
    return detector


use_saver(save)  # the deprecated Detector.save(dir) calls save(detector, dir)
