"""Fitted detectors as files: parameters and fitted state as JSON, arrays as safetensors, versions and provenance.

A saved detector is a directory::

    <dir>/state.safetensors   every array of the fitted state (no pickle: loading runs no code from the file)
    <dir>/detector.json       name, parameters, the rest of the state, versions, fit provenance (written last)

The fitted state is every instance attribute whose name ends with an underscore (scikit-learn's convention),
so a detector that learns something new is saved without a change here. Values may be arrays, numbers,
strings, None, lists, tuples, sets, dicts, faiss indexes (serialised by faiss to bytes) and objects of
classes from oodbench or from the detector's own package (their attributes are saved the same way). Arrays
keep their dtype and memory layout (strides), so a loaded detector runs the same numerical code paths and
scores bit for bit like the one that was saved.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import importlib
import json
import math
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from ..atomic import atomic_path, atomic_write_json, sha256_file
from ..errors import DetectorError
from ..store import PROVENANCE_KEYS, Store, library_versions
from .base import Detector

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

FORMAT_VERSION = 1
META_FILE = "detector.json"
ARRAYS_FILE = "state.safetensors"


# Set on a loaded detector (and kept by a later save): where its fit came from; not part of the learned state.
PROVENANCE_ATTRIBUTE = "fit_provenance_"


def fitted_state(detector: Detector) -> dict[str, Any]:
    """The detector's fitted state: its instance attributes whose names end with an underscore."""
    return {
        k: v
        for k, v in vars(detector).items()
        if k.endswith("_") and not k.startswith("__") and k != PROVENANCE_ATTRIBUTE
    }


# ----------------------------------------------------------------------------------------------- encoding
def _allowed_module(module: str, home: str) -> bool:
    """Classes whose objects a saved state may hold: oodbench's and the detector's own top-level package's."""
    return any(module == root or module.startswith(root + ".") for root in ("oodbench", home))


def _is_faiss_index(value: Any) -> bool:
    return type(value).__module__.split(".")[0] == "faiss" and hasattr(value, "ntotal")


class _Encoder:
    """Turns a state value into JSON, moving arrays (and serialised faiss indexes) into `arrays`."""

    def __init__(self, home: str) -> None:
        self.home = home
        self.arrays: dict[str, np.ndarray] = {}
        self._open: set[int] = set()  # containers and objects being encoded: a cycle would recurse forever

    def _array_key(self, path: str) -> str:
        key, n = path, 1
        while key in self.arrays:
            n += 1
            key = f"{path}#{n}"
        return key

    def encode(self, value: Any, path: str) -> Any:
        if value is None or isinstance(value, (bool, str, int, float, np.generic, np.ndarray, np.dtype)):
            return self._encode_value(value, path)
        if id(value) in self._open:
            raise DetectorError(f"cannot save {path}: it refers back to itself (a cycle in the fitted state)")
        self._open.add(id(value))
        try:
            return self._encode_value(value, path)
        finally:
            self._open.discard(id(value))

    def _encode_value(self, value: Any, path: str) -> Any:
        if value is None or isinstance(value, (bool, str)):
            return value
        if isinstance(value, np.generic):
            # Exact: the scalar's bytes (hex) and dtype, so float32 scalars stay float32 and bits stay bits.
            return {"$scalar": value.dtype.str, "hex": value.tobytes().hex()}
        if isinstance(value, int):
            return value
        if isinstance(value, float):
            return value if math.isfinite(value) else {"$float": repr(value)}
        if isinstance(value, np.ndarray):
            return self._encode_array(value, path)
        if isinstance(value, np.dtype):
            return {"$dtype": value.str}
        if isinstance(value, list):
            return [self.encode(v, f"{path}[{i}]") for i, v in enumerate(value)]
        if isinstance(value, tuple):
            return {"$tuple": [self.encode(v, f"{path}[{i}]") for i, v in enumerate(value)]}
        if isinstance(value, (set, frozenset)):
            tag = "$frozenset" if isinstance(value, frozenset) else "$set"
            return {tag: [self.encode(v, f"{path}{{}}") for v in sorted(value, key=repr)]}
        if isinstance(value, dict):
            if all(isinstance(k, str) and not k.startswith("$") for k in value):
                return {k: self.encode(v, f"{path}.{k}") for k, v in value.items()}
            return {"$dict": [[self.encode(k, path), self.encode(v, f"{path}.{k}")] for k, v in value.items()]}
        if _is_faiss_index(value):
            import faiss

            key = self._array_key(path)
            self.arrays[key] = np.asarray(faiss.serialize_index(value), dtype=np.uint8)
            return {"$faiss": key}
        cls = type(value)
        if _allowed_module(cls.__module__, self.home) and "<locals>" not in cls.__qualname__:
            attributes = self._attributes(value, path)
            return {
                "$object": f"{cls.__module__}:{cls.__qualname__}",
                "state": {k: self.encode(v, f"{path}.{k}") for k, v in attributes.items()},
            }
        raise DetectorError(
            f"cannot save {path}: a {cls.__module__}.{cls.__qualname__} is not an array, number, string, container, "
            f"faiss index or object of a class from oodbench or {self.home}"
        )

    @staticmethod
    def _attributes(value: Any, path: str) -> dict[str, Any]:
        attributes = dict(vars(value)) if hasattr(value, "__dict__") else {}
        for klass in type(value).__mro__:
            for slot in getattr(klass, "__slots__", ()):
                if slot not in ("__dict__", "__weakref__") and hasattr(value, slot):
                    attributes[slot] = getattr(value, slot)
        if not attributes and not dataclasses.is_dataclass(value):
            raise DetectorError(f"cannot save {path}: {type(value).__qualname__} has no attributes to save")
        return attributes

    def _encode_array(self, array: np.ndarray, path: str) -> dict[str, Any]:
        if array.dtype.kind not in "biuf" or array.dtype.byteorder == ">":
            raise DetectorError(f"cannot save {path}: arrays of dtype {array.dtype} are not supported (numbers only)")
        key = self._array_key(path)
        self.arrays[key] = np.ascontiguousarray(array)
        encoded: dict[str, Any] = {"$array": key}
        if array.size > 1 and not array.flags.c_contiguous:
            # Keep the layout: numpy picks BLAS or its own loops (different rounding) by the operands' strides.
            encoded["strides"] = list(array.strides)
        return encoded


class _Decoder:
    """The inverse of _Encoder; only arrays, JSON values and objects of the allowed classes come back."""

    def __init__(self, arrays: Mapping[str, np.ndarray], home: str, origin: str) -> None:
        self.arrays, self.home, self.origin = arrays, home, origin

    def decode(self, value: Any) -> Any:
        if isinstance(value, list):
            return [self.decode(v) for v in value]
        if not isinstance(value, dict):
            return value
        if "$array" in value:
            return self._decode_array(value)
        if "$scalar" in value:
            return np.frombuffer(bytes.fromhex(value["hex"]), dtype=np.dtype(value["$scalar"]))[0]
        if "$float" in value:
            return float(value["$float"])
        if "$dtype" in value:
            return np.dtype(value["$dtype"])
        if "$tuple" in value:
            return tuple(self.decode(v) for v in value["$tuple"])
        if "$set" in value:
            return {self.decode(v) for v in value["$set"]}
        if "$frozenset" in value:
            return frozenset(self.decode(v) for v in value["$frozenset"])
        if "$dict" in value:
            return {self.decode(k): self.decode(v) for k, v in value["$dict"]}
        if "$faiss" in value:
            import faiss

            return faiss.deserialize_index(np.array(self._array(value["$faiss"]), dtype=np.uint8))
        if "$object" in value:
            return self._decode_object(value["$object"], value.get("state", {}))
        return {k: self.decode(v) for k, v in value.items()}

    def _array(self, key: str) -> np.ndarray:
        try:
            return self.arrays[key]
        except KeyError:
            raise DetectorError(f"{self.origin}: {ARRAYS_FILE} lacks the array {key!r}") from None

    def _decode_array(self, value: Mapping[str, Any]) -> np.ndarray:
        data = self._array(value["$array"])
        strides = value.get("strides")
        if strides is None:
            return np.array(data)  # an owned, aligned, writeable copy
        # Rebuild the saved strides over a fresh buffer: the span the view covers, offset for negative strides.
        low = sum(s * (n - 1) for s, n in zip(strides, data.shape, strict=True) if s < 0)
        high = sum(s * (n - 1) for s, n in zip(strides, data.shape, strict=True) if s > 0)
        buffer = np.zeros(high - low + data.dtype.itemsize, dtype=np.uint8)
        view = np.ndarray(data.shape, dtype=data.dtype, buffer=buffer, offset=-low, strides=tuple(strides))
        view[...] = data
        return view

    def _decode_object(self, qualified: str, state: Mapping[str, Any]) -> Any:
        module_name, _, qualname = qualified.partition(":")
        if not _allowed_module(module_name, self.home) or "<" in qualname or not qualname:
            allowed = "oodbench" if self.home == "oodbench" else f"oodbench or {self.home}"
            raise DetectorError(
                f"{self.origin}: the state holds an object of {qualified}; only classes from {allowed} are loaded"
            )
        try:
            cls: Any = importlib.import_module(module_name)
            for part in qualname.split("."):
                cls = getattr(cls, part)
        except (ImportError, AttributeError) as exc:
            raise DetectorError(f"{self.origin}: cannot find the class {qualified} of the saved state: {exc}") from exc
        if not isinstance(cls, type):
            raise DetectorError(f"{self.origin}: {qualified} is not a class")
        # No constructor runs: the object gets exactly the saved attributes (frozen dataclasses included).
        obj = object.__new__(cls)
        for key, item in state.items():
            object.__setattr__(obj, key, self.decode(item))
        return obj


# ----------------------------------------------------------------------------------------------- provenance
def fit_provenance(store: Store, model_id: str, dataset_id: str) -> dict[str, Any]:
    """What a fit on a store entry came from: model id, checkpoint, preprocessing, entry, item hash, head."""
    meta = store.meta(model_id, dataset_id)
    entry = dict(meta.get("provenance") or {})
    provenance: dict[str, Any] = {key: entry.get(key) for key in PROVENANCE_KEYS}
    provenance.update(
        {
            "model_id": model_id,
            "fit_dataset": dataset_id,
            "store": str(store.root.resolve()),
            "item_hash": meta.get("item_hash"),
            "num_rows": meta.get("num_rows"),
            "entry_finished": meta.get("finished"),
            "entry_provenance": entry,
            "head": store.head_meta(model_id).get("provenance") if store.has_head(model_id) else None,
        }
    )
    return json.loads(json.dumps(provenance, default=str))


def check_provenance(saved: Mapping[str, Any] | None, store: Store, model_id: str, dataset_id: str) -> None:
    """Raise DetectorError unless the entry comes from the checkpoint and preprocessing the detector was fit on."""
    if not saved:
        raise DetectorError(
            "the saved detector records no fit provenance, so its inputs cannot be checked; save it with "
            "provenance=fit_provenance(store, model_id, fit_dataset) (evaluate --save-detectors does)"
        )
    entry = store.meta(model_id, dataset_id).get("provenance") or {}
    for key in PROVENANCE_KEYS:
        if saved.get(key) != entry.get(key):
            raise DetectorError(
                f"provenance mismatch: the detector was fit on {saved.get('model_id')}/{saved.get('fit_dataset')} "
                f"with {key}={saved.get(key)!r} but {model_id}/{dataset_id} has {key}={entry.get(key)!r}; "
                "scores of another checkpoint or preprocessing would be meaningless"
            )


# ----------------------------------------------------------------------------------------------- save / load
def _origin_record(detector: Detector) -> dict[str, Any]:
    from . import registry

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
    """Write a fitted detector to `directory` (created; an earlier save there is replaced)."""
    if not hasattr(detector, "fit_info_"):
        raise DetectorError(f"{detector.name or type(detector).__name__} is not fitted: nothing to save")
    from safetensors.numpy import save_file

    if provenance is None:
        provenance = getattr(detector, PROVENANCE_ATTRIBUTE, None)
    path = Path(directory)
    home = type(detector).__module__.split(".")[0]
    encoder = _Encoder(home)
    params = encoder.encode(detector.get_params(), "params")
    state = {k: encoder.encode(v, k) for k, v in fitted_state(detector).items()}
    path.mkdir(parents=True, exist_ok=True)
    if (path / META_FILE).exists():
        (path / META_FILE).unlink()  # a half-replaced directory must not look like a saved detector
    with atomic_path(path / ARRAYS_FILE) as tmp:
        save_file(encoder.arrays, str(tmp))
    meta = {
        "format": FORMAT_VERSION,
        "detector": detector.name,
        "origin": _origin_record(detector),
        "params": params,
        "state": state,
        "arrays_sha256": sha256_file(path / ARRAYS_FILE),
        "provenance": None if provenance is None else json.loads(json.dumps(dict(provenance), default=str)),
        "versions": library_versions(),
        "saved": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
    }
    atomic_write_json(path / META_FILE, meta)
    return path


def read_meta(directory: str | os.PathLike[str]) -> dict[str, Any]:
    """The saved detector's detector.json (name, parameters, versions, provenance), checked for format."""
    path = Path(directory)
    meta_path = path / META_FILE
    if not meta_path.is_file():
        raise DetectorError(f"{path} is not a saved detector (no {META_FILE}); save one with detector.save(dir)")
    try:
        meta = json.loads(meta_path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise DetectorError(f"cannot read {meta_path}: {exc}") from exc
    if meta.get("format") != FORMAT_VERSION:
        raise DetectorError(
            f"{path}: saved detector format {meta.get('format')!r}; this oodbench reads format {FORMAT_VERSION}"
        )
    return meta


def saved_score_key(directory: str | os.PathLike[str]) -> str | None:
    """The evaluation cache key recorded in a saved detector's provenance, or None (no detector saved there)."""
    try:
        return (read_meta(directory).get("provenance") or {}).get("score_key")
    except DetectorError:
        return None


def load(directory: str | os.PathLike[str], *, plugins: Iterable[str] = (), check_versions: bool = True) -> Detector:
    """A fitted detector saved with `save`; refuses another version of its code unless check_versions=False."""
    from safetensors import SafetensorError
    from safetensors.numpy import load_file

    from . import registry

    path = Path(directory)
    meta = read_meta(path)
    registry.load_plugins(plugins)
    name, recorded = meta["detector"], meta["origin"]
    if recorded.get("registered"):
        cls = registry.get_class(name)
        current = dataclasses.asdict(registry.origin(name))
    else:
        cls = _unregistered_class(recorded["class"], path)
        current = dataclasses.asdict(registry._derive_origin(cls))
    if f"{cls.__module__}:{cls.__qualname__}" != recorded["class"]:
        raise DetectorError(
            f"{path}: saved by {recorded['class']} but {name!r} is now {cls.__module__}:{cls.__qualname__}"
        )
    if check_versions and (current["distribution"], current["version"]) != (
        recorded["distribution"],
        recorded["version"],
    ):
        raise DetectorError(
            f"{path}: {name} was saved with {recorded['distribution']} {recorded['version']} but "
            f"{current['distribution']} {current['version']} is installed; its fitted state may not mean the same "
            "(load with check_versions=False to accept)"
        )
    arrays_path = path / ARRAYS_FILE
    try:
        if sha256_file(arrays_path) != meta.get("arrays_sha256"):
            raise DetectorError(f"{arrays_path} does not match {META_FILE} (modified or from another save)")
        arrays = load_file(str(arrays_path))
    except (OSError, SafetensorError) as exc:
        raise DetectorError(f"cannot read {arrays_path}: {exc}") from exc
    decoder = _Decoder(arrays, cls.__module__.split(".")[0], str(path))
    detector = cls(**decoder.decode(meta["params"]))
    detector.validate_params()
    if cls.name != name:
        detector.name = name
    for key, value in meta["state"].items():
        setattr(detector, key, decoder.decode(value))
    setattr(detector, PROVENANCE_ATTRIBUTE, meta.get("provenance"))
    return detector


def _unregistered_class(qualified: str, path: Path) -> type[Detector]:
    module_name, _, qualname = qualified.partition(":")
    try:
        cls: Any = importlib.import_module(module_name)
        for part in qualname.split("."):
            cls = getattr(cls, part)
    except (ImportError, AttributeError) as exc:
        raise DetectorError(f"{path}: cannot import the detector class {qualified}: {exc}") from exc
    if not (isinstance(cls, type) and issubclass(cls, Detector)):
        raise DetectorError(f"{path}: {qualified} is not a Detector")
    return cls
