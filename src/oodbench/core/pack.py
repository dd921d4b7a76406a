"""Feature packs: chosen entries of a store as plain tensor files a lab publishes and anyone evaluates against.

Layout (a folder; the same layout as a Hugging Face dataset repository)::

    <pack>/manifest.json                          the contract: format, oodbench version, entries, SHA-256 per file
    <pack>/README.md                              dataset card generated from the manifest (YAML front matter)
    <pack>/<model-id>/<dataset-id>/arrays.safetensors   features, logits, labels, index, extra.<name>
    <pack>/<model-id>/<dataset-id>/meta.json            the store entry's meta.json, byte for byte
    <pack>/<model-id>/<dataset-id>/items.txt            the image list (when the store entry has one)
    <pack>/<model-id>/head/arrays.safetensors            weight, bias
    <pack>/<model-id>/head/meta.json                     the store head's meta.json, byte for byte

Tensors are safetensors files (an 8-byte header length, a JSON header, then each tensor's C-order bytes): chosen
over Parquet and Arrow IPC because they memory-map as one contiguous array per tensor (3.0 GB/s against 0.15 GB/s
for Parquet, ``benchmarks/pack_formats.py``), stream out with a header known before the data, and open without
oodbench in NumPy, PyTorch and JAX (``safetensors.numpy.load_file``) and hence pandas and polars.

A pack is data. Every path is derived from the model and dataset ids (one safe path component each), never read
from the pack; files are opened component by component with ``O_NOFOLLOW`` and must be regular files (no link,
no pipe, no device); every size is checked against the manifest before a byte is read, JSON is bounded, and a
file's SHA-256 is checked before its arrays are used (`PackStore`) or written (`import_pack`).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import datetime as _dt
import hashlib
import json
import os
import shutil
import stat
import struct
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..util.atomic import atomic_write_bytes, atomic_write_text
from .errors import StoreError
from .names import check_name, is_name
from .outputs import Head, Outputs
from .store import (
    _EXTRA,
    Store,
    Verification,
    _check_array_name,
    _check_meta,
    _locked,
)

__all__ = [
    "PACK_FORMAT",
    "Pack",
    "PackStore",
    "PackSummary",
    "check_comparable",
    "dataset_card",
    "export_pack",
    "import_pack",
    "is_pack",
    "pack_differences",
]

PACK_FORMAT = "oodbench-pack"
PACK_VERSION = 1
MANIFEST = "manifest.json"
CARD = "README.md"
ARRAYS_FILE = "arrays.safetensors"
META_FILE = "meta.json"
ITEMS_FILE = "items.txt"
HEAD = "head"
# Bounds checked before reading: JSON files and the safetensors header (safetensors' own limit is 100 MB).
MAX_JSON_BYTES = 64 * 2**20
MAX_HEADER_BYTES = 100 * 2**20
# Bytes copied (and hashed) per step when streaming.
CHUNK_BYTES = 64 * 2**20
# The dtypes a pack holds, by their safetensors names (little-endian, plain numbers only).
_ST_NAMES = {
    "float16": "F16",
    "float32": "F32",
    "float64": "F64",
    "int8": "I8",
    "int16": "I16",
    "int32": "I32",
    "int64": "I64",
    "uint8": "U8",
    "uint16": "U16",
    "uint32": "U32",
    "uint64": "U64",
    "bool": "BOOL",
}
_ST_DTYPES = {code: np.dtype(name) for name, code in _ST_NAMES.items()}
_HEX = frozenset("0123456789abcdef")


# ----------------------------------------------------------------------------------------------- paths and files
def entry_files(model_id: str, dataset_id: str, *, items: bool) -> list[str]:
    """The pack-relative files of one entry (``dataset_id`` ``head`` for the model's head)."""
    files = [f"{model_id}/{dataset_id}/{ARRAYS_FILE}", f"{model_id}/{dataset_id}/{META_FILE}"]
    if items and dataset_id != HEAD:
        files.append(f"{model_id}/{dataset_id}/{ITEMS_FILE}")
    return files


def _open_regular(root: Path, relative: str) -> tuple[int, int]:
    """(fd, size) of `root/relative`, opened without following any link below `root`; must be a regular file."""
    parts = relative.split("/")
    if any(not is_name(part) for part in parts):  # never happens for derived paths; a second line of defence
        raise StoreError(f"{root}: refusing the path {relative!r} (not a plain relative path)")
    flags = os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW
    try:
        directory = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise StoreError(f"cannot open the pack {root}: {exc.strerror or exc}") from None
    try:
        for part in parts[:-1]:
            try:
                inner = os.open(part, flags | os.O_DIRECTORY, dir_fd=directory)
            except OSError as exc:
                raise StoreError(f"{root}/{relative}: {_why(exc, part)}") from None
            os.close(directory)
            directory = inner
        try:
            # O_NONBLOCK: opening a FIFO must not wait for a writer; it is refused just below.
            fd = os.open(parts[-1], flags | os.O_NONBLOCK, dir_fd=directory)
        except OSError as exc:
            raise StoreError(f"{root}/{relative}: {_why(exc, parts[-1])}") from None
    finally:
        os.close(directory)
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise StoreError(f"{root}/{relative}: not a regular file (a pack holds plain files only)")
    os.set_blocking(fd, True)
    return fd, info.st_size


def _why(exc: OSError, part: str) -> str:
    import errno

    if exc.errno == errno.ELOOP:
        return f"{part!r} is a symbolic link (a pack's files are followed by no link)"
    if exc.errno == errno.ENOTDIR:
        return f"{part!r} is not a directory"
    if exc.errno == errno.ENOENT:
        return "missing"
    return exc.strerror or str(exc)


def _read_bounded(root: Path, relative: str, size: int | None, limit: int = MAX_JSON_BYTES) -> bytes:
    """The bytes of a small file, its size checked (against `size` when known, and `limit`) before reading."""
    fd, actual = _open_regular(root, relative)
    with open(fd, "rb", closefd=True) as handle:
        if size is not None and actual != size:
            raise StoreError(f"{root}/{relative}: {actual:,} bytes but the manifest records {size:,}")
        if actual > limit:
            raise StoreError(f"{root}/{relative}: {actual:,} bytes, more than the {limit:,} a pack allows for it")
        data = handle.read(actual + 1)
    if len(data) != actual:
        raise StoreError(f"{root}/{relative}: changed size while it was read")
    return data


def _parse_json(data: bytes, where: str) -> dict[str, Any]:
    """A JSON object from bytes; StoreError naming the problem (not UTF-8, NaN tokens, not an object)."""

    def refuse(token: str) -> None:
        raise ValueError(f"{token} is not JSON")

    try:
        value = json.loads(data.decode("utf-8"), parse_constant=refuse)
    except UnicodeDecodeError as exc:
        raise StoreError(f"{where}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except (ValueError, RecursionError) as exc:
        raise StoreError(f"{where}: not valid JSON ({exc})") from None
    if not isinstance(value, dict):
        raise StoreError(f"{where}: must hold a JSON object, not a {type(value).__name__}")
    return value


def _sha256_range(fd: int, start: int, length: int, advance: Callable[[int], None] | None = None) -> str:
    """SHA-256 of `length` bytes of an open file from `start` (read in 16 MiB steps; the GIL is released)."""
    digest, buffer = hashlib.sha256(), bytearray(min(16 * 2**20, max(length, 1)))
    view, done = memoryview(buffer), 0
    while done < length:
        got = os.preadv(fd, [view[: min(len(view), length - done)]], start + done)
        if not got:
            raise StoreError("the file became shorter while it was read")
        digest.update(view[:got])
        done += got
        if advance is not None:
            advance(got)
    return digest.hexdigest()


# ----------------------------------------------------------------------------------------------- safetensors
@dataclass(frozen=True)
class TensorSpec:
    """One tensor of a safetensors file: dtype, shape and byte range in the data section."""

    dtype: np.dtype
    shape: tuple[int, ...]
    start: int
    end: int


def _st_dtype_name(dtype: np.dtype, where: str) -> str:
    dtype = np.dtype(dtype)
    if dtype.byteorder == ">" or (dtype.byteorder == "=" and sys.byteorder != "little") or dtype.name not in _ST_NAMES:
        raise StoreError(f"{where}: dtype {dtype.str} cannot go into a pack (little-endian numbers only)")
    return _ST_NAMES[dtype.name]


def _st_layout(
    arrays: Mapping[str, tuple[np.dtype, tuple[int, ...]]], metadata: Mapping[str, str], where: str
) -> tuple[bytes, dict[str, TensorSpec]]:
    """The header bytes (length prefix included) and tensor ranges of a safetensors file holding `arrays`.

    Tensors are laid out by decreasing item size, then name, so every tensor starts aligned to its item size
    (the header is padded to 8 bytes), as safetensors itself writes them.
    """
    order = sorted(arrays, key=lambda name: (-np.dtype(arrays[name][0]).itemsize, name))
    header: dict[str, Any] = {"__metadata__": dict(metadata)}
    specs: dict[str, TensorSpec] = {}
    offset = 0
    for name in order:
        dtype, shape = np.dtype(arrays[name][0]), tuple(int(n) for n in arrays[name][1])
        nbytes = dtype.itemsize * int(np.prod(shape, dtype=np.int64))
        header[name] = {"dtype": _st_dtype_name(dtype, f"{where}: {name}"), "shape": list(shape)}
        header[name]["data_offsets"] = [offset, offset + nbytes]
        specs[name] = TensorSpec(dtype, shape, offset, offset + nbytes)
        offset += nbytes
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * (-(8 + len(text)) % 8)
    return struct.pack("<Q", len(text)) + text, specs


def _st_parse(fd: int, size: int, where: str) -> tuple[int, dict[str, TensorSpec], dict[str, str]]:
    """(data offset, tensors, metadata) of an open safetensors file; StoreError unless it is well formed.

    The header length is bounded before it is read, the header is checked to be JSON of plain tensors, and the
    tensors must tile the data section exactly (no gap, no overlap, nothing after the last one).
    """
    if size < 8:
        raise StoreError(f"{where}: {size} bytes, too short for a safetensors file")
    (length,) = struct.unpack("<Q", os.pread(fd, 8, 0))
    if length > min(MAX_HEADER_BYTES, size - 8):
        raise StoreError(
            f"{where}: its header claims {length:,} bytes (file {size:,} bytes, limit {MAX_HEADER_BYTES:,})"
        )
    raw = os.pread(fd, length, 8)
    if len(raw) != length:
        raise StoreError(f"{where}: truncated header")
    header = _parse_json(raw, where)
    metadata = header.pop("__metadata__", {})
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise StoreError(f"{where}: __metadata__ must map names to strings")
    tensors: dict[str, TensorSpec] = {}
    for name, info in header.items():
        if not isinstance(info, dict) or set(info) != {"dtype", "shape", "data_offsets"}:
            raise StoreError(f"{where}: tensor {name!r} is not described by dtype, shape and data_offsets only")
        dtype = _ST_DTYPES.get(info["dtype"]) if isinstance(info["dtype"], str) else None
        shape, offsets = info["shape"], info["data_offsets"]
        if dtype is None:
            raise StoreError(f"{where}: tensor {name!r} has an unsupported dtype {info['dtype']!r}")
        if not (isinstance(shape, list) and all(_natural(n) and n < 2**40 for n in shape)):
            raise StoreError(f"{where}: tensor {name!r} has an invalid shape {shape!r}")
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(_natural(n) for n in offsets)):
            raise StoreError(f"{where}: tensor {name!r} has invalid data_offsets {offsets!r}")
        nbytes = dtype.itemsize * int(np.prod(shape, dtype=np.int64)) if shape else dtype.itemsize
        if offsets[1] - offsets[0] != nbytes:
            raise StoreError(
                f"{where}: tensor {name!r} spans {offsets[1] - offsets[0]:,} bytes, its shape needs {nbytes:,}"
            )
        tensors[name] = TensorSpec(dtype, tuple(shape), offsets[0], offsets[1])
    position = 0
    for spec in sorted(tensors.values(), key=lambda s: (s.start, s.end)):
        if spec.start != position:
            raise StoreError(f"{where}: its tensors overlap or leave a gap at byte {position:,}")
        position = spec.end
    if 8 + length + position != size:
        raise StoreError(
            f"{where}: {size:,} bytes but its header describes {8 + length + position:,} (truncated or padded)"
        )
    return 8 + length, tensors, metadata


def _natural(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _map(fd: int, offset: int, spec: TensorSpec, mmap: bool) -> np.ndarray:
    """A read-only memory map (or a copy) of one tensor of an open file."""
    if 0 in spec.shape or spec.end == spec.start:
        return np.zeros(spec.shape, spec.dtype)
    with open(os.dup(fd), "rb", closefd=True) as handle:
        mapped = np.memmap(handle, spec.dtype, "r", offset=offset + spec.start, shape=spec.shape)
    return np.array(mapped) if not mmap else mapped


# ----------------------------------------------------------------------------------------------- the manifest
def is_pack(root: str | os.PathLike[str]) -> bool:
    """True when `root` is a directory with a pack manifest (cheap: the manifest is checked on opening)."""
    path = Path(root) / MANIFEST
    return path.is_file() and not path.is_symlink()


def _check_sha(value: object) -> bool:
    return isinstance(value, str) and len(value) == 64 and set(value) <= _HEX


def _check_array_specs(specs: object, where: str, *, head: bool) -> dict[str, dict[str, Any]]:
    if not isinstance(specs, dict) or not specs:
        raise StoreError(f"{where}: arrays must be a non-empty object")
    for name, spec in specs.items():
        if head:
            if name not in ("weight", "bias"):
                raise StoreError(f"{where}: a head holds weight and bias, not {name!r}")
        else:
            _check_array_name(name, where)
        if not isinstance(spec, dict):
            raise StoreError(f"{where}: the record of array {name!r} is not an object")
        for key in ("dtype", "stored"):
            if spec.get(key) not in _ST_NAMES:
                raise StoreError(f"{where}: array {name!r} has an invalid {key} {spec.get(key)!r}")
        shape = spec.get("shape")
        if not (isinstance(shape, list) and shape and all(_natural(n) and n < 2**40 for n in shape)):
            raise StoreError(f"{where}: array {name!r} has an invalid shape {shape!r}")
    return specs


def _check_chunks(record: dict[str, Any], where: str, rows: int) -> None:
    """A record's chunk checksums: checksum_rows summing to `rows`, one SHA-256 per chunk per array, the header's."""
    chunks = record.get("checksum_rows")
    if not (isinstance(chunks, list) and chunks and all(_natural(n) for n in chunks) and sum(chunks) == rows):
        raise StoreError(f"{where}: checksum_rows must be row counts summing to {rows}")
    if not _check_sha(record.get("header_sha256")):
        raise StoreError(f"{where}: header_sha256 must be a SHA-256 (64 hex digits)")
    for name, spec in record["arrays"].items():
        digests = spec.get("sha256")
        if not (isinstance(digests, list) and len(digests) == len(chunks) and all(_check_sha(d) for d in digests)):
            raise StoreError(f"{where}: array {name!r} needs one SHA-256 per chunk of checksum_rows")
        if spec["shape"][0] != rows:
            raise StoreError(f"{where}: array {name!r} has {spec['shape'][0]} rows, not {rows}")


def _check_manifest(manifest: dict[str, Any], where: str) -> dict[str, Any]:
    """The manifest checked for everything read from it; StoreError naming the first problem."""
    if manifest.get("format") != PACK_FORMAT:
        raise StoreError(f"{where}: not an oodbench pack manifest (format {manifest.get('format')!r})")
    version = manifest.get("format_version")
    if version != PACK_VERSION:
        if _natural(version) and version > PACK_VERSION:
            raise StoreError(f"{where}: written by a newer oodbench (pack format {version}); upgrade oodbench")
        raise StoreError(f"{where}: unknown pack format version {version!r}")
    if not isinstance(manifest.get("float16"), bool):
        raise StoreError(f"{where}: float16 must be true or false")
    models, files = manifest.get("models"), manifest.get("files")
    if not isinstance(models, dict) or not isinstance(files, dict):
        raise StoreError(f"{where}: models and files must be objects")
    expected: set[str] = set()
    for model_id, model in models.items():
        check_name(model_id, f"{where}: model id", error=StoreError)
        if not isinstance(model, dict) or not isinstance(model.get("datasets"), dict):
            raise StoreError(f"{where}: model {model_id!r} must be an object with datasets")
        head = model.get("head")
        if head is not None:
            _check_array_specs(
                head.get("arrays") if isinstance(head, dict) else None, f"{where}: {model_id}/head", head=True
            )
            if set(head["arrays"]) != {"weight", "bias"}:
                raise StoreError(f"{where}: {model_id}/head must hold weight and bias")
            _check_chunks(head, f"{where}: {model_id}/head", head["arrays"]["weight"]["shape"][0])
            expected.update(entry_files(model_id, HEAD, items=False))
        for dataset_id, entry in model["datasets"].items():
            check_name(dataset_id, f"{where}: dataset id", error=StoreError)
            if dataset_id == HEAD:
                raise StoreError(f"{where}: {model_id}/head is reserved for the model's head")
            key = f"{where}: {model_id}/{dataset_id}"
            if (
                not isinstance(entry, dict)
                or not _natural(entry.get("rows"))
                or not isinstance(entry.get("items"), bool)
            ):
                raise StoreError(f"{key}: rows (a count) and items (true or false) are required")
            specs = _check_array_specs(entry.get("arrays"), key, head=False)
            if "features" not in specs or any(spec["shape"][0] != entry["rows"] for spec in specs.values()):
                raise StoreError(f"{key}: every array needs {entry['rows']} rows, and features must be present")
            _check_chunks(entry, key, entry["rows"])
            expected.update(entry_files(model_id, dataset_id, items=entry["items"]))
    if set(files) != expected:
        extra, missing = sorted(set(files) - expected), sorted(expected - set(files))
        raise StoreError(
            f"{where}: files must list exactly the entries' files"
            + (f"; unexpected: {extra[:3]}" if extra else "")
            + (f"; missing: {missing[:3]}" if missing else "")
        )
    for name, record in files.items():
        if not (isinstance(record, dict) and _check_sha(record.get("sha256")) and _natural(record.get("size"))):
            raise StoreError(f"{where}: the record of {name} needs a sha256 (64 hex digits) and a size")
    return manifest


# ----------------------------------------------------------------------------------------------- reading a pack
@dataclass
class _Opened:
    """One verified-shape safetensors file of the pack, open for memory-mapping."""

    fd: int
    offset: int
    tensors: dict[str, TensorSpec]


class Pack:
    """A pack directory with its checked manifest; files are opened without following links, sizes checked first."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        if not self.root.is_dir():
            raise StoreError(f"the pack {self.root} {'is not a directory' if self.root.exists() else 'does not exist'}")
        where = str(self.root / MANIFEST)
        self.manifest = _check_manifest(_parse_json(_read_bounded(self.root, MANIFEST, None), where), where)
        self.models: dict[str, Any] = self.manifest["models"]
        self.files: dict[str, dict[str, Any]] = self.manifest["files"]

    def __repr__(self) -> str:
        return f"Pack({str(self.root)!r})"

    @property
    def float16(self) -> bool:
        """True when the pack stores floating arrays as float16 (an opt-in, smaller, not byte-exact pack)."""
        return bool(self.manifest["float16"])

    def entries(self) -> list[tuple[str, str]]:
        """Every (model id, dataset id) the manifest lists (pulled or not)."""
        return [(m, d) for m, model in sorted(self.models.items()) for d in sorted(model["datasets"])]

    def files_of(self, model_id: str, dataset_id: str) -> list[str]:
        """The files of one entry (`dataset_id` ``head`` for the head)."""
        model = self._model(model_id)
        if dataset_id == HEAD:
            if model.get("head") is None:
                raise StoreError(f"the pack {self.root} holds no head for {model_id}")
            return entry_files(model_id, HEAD, items=False)
        entry = self._entry(model_id, dataset_id)
        return entry_files(model_id, dataset_id, items=entry["items"])

    def present(self, model_id: str, dataset_id: str) -> bool:
        """True when every file of the entry is in the folder (a partial pull leaves the others out)."""
        return all(
            (self.root / name).exists() or (self.root / name).is_symlink()
            for name in self.files_of(model_id, dataset_id)
        )

    def _model(self, model_id: str) -> dict[str, Any]:
        if model_id not in self.models:
            raise StoreError(
                f"the pack {self.root} holds no model {model_id!r} (models: {', '.join(sorted(self.models)) or 'none'})"
            )
        return self.models[model_id]

    def _entry(self, model_id: str, dataset_id: str) -> dict[str, Any]:
        datasets = self._model(model_id)["datasets"]
        if dataset_id not in datasets:
            raise StoreError(
                f"the pack {self.root} holds no entry {model_id}/{dataset_id} (datasets: {', '.join(sorted(datasets)) or 'none'})"
            )
        return datasets[dataset_id]

    def open_file(self, relative: str) -> tuple[int, int]:
        """(fd, size) of a manifest file, its size checked against the manifest before anything is read."""
        fd, size = _open_regular(self.root, relative)
        if size != self.files[relative]["size"]:
            os.close(fd)
            raise StoreError(
                f"{self.root}/{relative}: {size:,} bytes but the manifest records {self.files[relative]['size']:,} "
                "(truncated, padded or an interrupted pull; pull it again)"
            )
        return fd, size

    def read_small(self, relative: str) -> bytes:
        """A manifest file's bytes (JSON and image lists), size checked first."""
        return _read_bounded(self.root, relative, self.files[relative]["size"], limit=max(MAX_JSON_BYTES, 2**31))

    def open_arrays(self, model_id: str, dataset_id: str) -> _Opened:
        """The entry's safetensors file, open, its header checked against the manifest's arrays."""
        relative = f"{model_id}/{dataset_id}/{ARRAYS_FILE}"
        fd, size = self.open_file(relative)
        try:
            offset, tensors, _ = _st_parse(fd, size, f"{self.root}/{relative}")
            record = self.models[model_id]["head"] if dataset_id == HEAD else self._entry(model_id, dataset_id)
            wanted = record["arrays"]
            if set(tensors) != set(wanted):
                raise StoreError(
                    f"{self.root}/{relative}: holds {sorted(tensors)} but the manifest lists {sorted(wanted)}"
                )
            for name, spec in wanted.items():
                if tensors[name].dtype != np.dtype(spec["stored"]) or list(tensors[name].shape) != spec["shape"]:
                    raise StoreError(
                        f"{self.root}/{relative}: {name} is {tensors[name].dtype} {tensors[name].shape} but the "
                        f"manifest records {spec['stored']} {tuple(spec['shape'])}"
                    )
        except BaseException:
            os.close(fd)
            raise
        return _Opened(fd, offset, tensors)

    def verify_entries(
        self,
        keys: Sequence[tuple[str, str]],
        *,
        advance: Callable[[int], None] | None = None,
        threads: int | None = None,
    ) -> list[str]:
        """Problems found hashing every byte of the entries `keys` (empty: intact), on all cores.

        The arrays file is checked as its header (against ``header_sha256``) and each array's chunks of rows
        (against the manifest's per-chunk SHA-256s, the store's own row checksums for a float32 pack), which are
        independent, so they are hashed in parallel; meta.json and items.txt against their file SHA-256.
        """
        problems: list[str] = []
        tasks: list[tuple[int, int, int, str, str]] = []  # fd, offset, length, expected digest, what
        fds: list[int] = []
        try:
            for model_id, dataset_id in keys:
                record = self.models[model_id]["head"] if dataset_id == HEAD else self._entry(model_id, dataset_id)
                for name in self.files_of(model_id, dataset_id):
                    try:
                        fd, size = self.open_file(name)
                    except StoreError as exc:
                        problems.append(str(exc))
                        continue
                    fds.append(fd)
                    where = f"{self.root}/{name}"
                    if not name.endswith(ARRAYS_FILE):
                        tasks.append((fd, 0, size, self.files[name]["sha256"], where))
                        continue
                    try:
                        offset, tensors, _ = _st_parse(fd, size, where)
                    except StoreError as exc:
                        problems.append(str(exc))
                        continue
                    tasks.append((fd, 0, offset, record["header_sha256"], f"{where}: header"))
                    for array, spec in sorted(record["arrays"].items()):
                        tensor = tensors.get(array)
                        if (
                            tensor is None
                            or list(tensor.shape) != spec["shape"]
                            or tensor.dtype != np.dtype(spec["stored"])
                        ):
                            problems.append(f"{where}: {array} is not stored as the manifest records")
                            continue
                        row_bytes = tensor.dtype.itemsize * int(np.prod(tensor.shape[1:], dtype=np.int64))
                        first = 0
                        for rows, digest in zip(record["checksum_rows"], spec["sha256"], strict=True):
                            start = offset + tensor.start + first * row_bytes
                            what = f"{where}: rows {first:,}-{first + rows - 1:,} of {array}"
                            tasks.append((fd, start, rows * row_bytes, digest, what))
                            first += rows

            def check(task: tuple[int, int, int, str, str]) -> str | None:
                fd, start, length, expected, what = task
                try:
                    digest = _sha256_range(fd, start, length, advance)
                except (OSError, StoreError) as exc:
                    return f"{what}: {exc}"
                return (
                    None if digest == expected else f"{what}: SHA-256 differs from the manifest's (damaged or changed)"
                )

            # Largest first, so the long hashes start early and the pool ends together.
            tasks.sort(key=lambda task: -task[2])
            workers = max(1, min(len(tasks), threads or os.cpu_count() or 1))
            with concurrent.futures.ThreadPoolExecutor(workers) as pool:
                problems += [problem for problem in pool.map(check, tasks) if problem]
        finally:
            for fd in fds:
                os.close(fd)
        return problems


class PackStore(Store):
    """A read-only `Store` over a pack directory: entries are memory-mapped from their safetensors files.

    Anything that takes a `Store` takes it (``Store(path)`` of a pack directory returns one). Each file's SHA-256
    is checked the first time this process reads it (pass ``verify=False`` after ``oodbench pack verify`` to skip).
    """

    def __init__(self, root: str | os.PathLike[str], *, verify: bool = True) -> None:
        super().__init__(root)
        self.pack = Pack(root)
        self.check_files = verify
        self._verified: set[tuple[Any, ...]] = set()
        self._metas: dict[tuple[str, str], dict[str, Any]] = {}

    def __repr__(self) -> str:
        return f"PackStore({str(self.root)!r})"

    def _read_only(self, *args: Any, **kwargs: Any) -> Any:
        raise StoreError(f"{self.root} is a pack (read-only); import it into a store to write (`oodbench pack import`)")

    writer = write_outputs = delete = write_head = lock_path = _read_only  # type: ignore[assignment]
    damage_remedy = "pull or export the pack again (`oodbench pack verify` lists every damaged file)"

    def models(self) -> list[str]:
        """Model ids with at least one entry (or head) present in the folder."""
        return sorted(
            m
            for m, model in self.pack.models.items()
            if any(self.pack.present(m, d) for d in model["datasets"])
            or (model.get("head") is not None and self.pack.present(m, HEAD))
        )

    def datasets(self, model_id: str) -> list[str]:
        """Dataset ids of the model present in the folder."""
        model = self.pack.models.get(check_name(model_id, "invalid model id", error=StoreError))
        return [] if model is None else sorted(d for d in model["datasets"] if self.pack.present(model_id, d))

    def exists(self, model_id: str, dataset_id: str) -> bool:
        """True when the entry is in the pack and its files are here."""
        return dataset_id in self.pack.models.get(model_id, {}).get("datasets", {}) and self.pack.present(
            model_id, dataset_id
        )

    def describe_incomplete(self, model_id: str, dataset_id: str) -> str:
        """Pack entries are complete by construction."""
        return "a pack entry is always complete"

    def _require(self, model_id: str, dataset_id: str) -> None:
        self.pack.files_of(model_id, dataset_id)  # names the missing model or entry
        if not self.pack.present(model_id, dataset_id):
            raise StoreError(
                f"{model_id}/{dataset_id} is listed in the pack {self.root} but its files are not here (not pulled: "
                f"`oodbench pack pull REPO --to {self.root} --model {model_id} --dataset {dataset_id}`)"
            )

    def _identity(self, model_id: str, dataset_id: str) -> tuple[Any, ...]:
        """The entry's files as they are now (device, inode, size, change time): a verification holds while equal."""
        stats = [os.stat(self.root / n, follow_symlinks=False) for n in self.pack.files_of(model_id, dataset_id)]
        return (model_id, dataset_id, *[(i.st_dev, i.st_ino, i.st_size, i.st_mtime_ns, i.st_ctime_ns) for i in stats])

    def _checked(self, model_id: str, dataset_id: str) -> None:
        """Hash the entry's files once per process before first use (when verification is on)."""
        if not self.check_files or self._identity(model_id, dataset_id) in self._verified:
            return
        result = self.verify(model_id, dataset_id)
        if result.problems:
            raise StoreError(
                f"pack entry {model_id}/{dataset_id} is damaged: {result.problems[0]}; {self.damage_remedy}"
            )

    def meta(self, model_id: str, dataset_id: str) -> dict[str, Any]:
        """The entry's store meta.json (as the pack carries it), checked; a float16 pack's arrays as stored."""
        key = (model_id, dataset_id)
        if key in self._metas:
            return json.loads(json.dumps(self._metas[key]))
        self._require(model_id, dataset_id)
        relative = f"{model_id}/{dataset_id}/{META_FILE}"
        meta = _check_meta(_parse_json(self.pack.read_small(relative), relative), self.root / relative)
        if meta.get("model_id") != model_id or meta.get("dataset_id") != dataset_id or not meta.get("complete"):
            raise StoreError(f"{self.root}/{relative}: does not describe the complete entry {model_id}/{dataset_id}")
        wanted = self.pack.models[model_id]["datasets"][dataset_id]["arrays"]
        if {n: (s["dtype"], s["shape"]) for n, s in meta["arrays"].items()} != {
            n: (s["dtype"], s["shape"]) for n, s in wanted.items()
        }:
            raise StoreError(f"{self.root}/{relative}: its arrays disagree with the manifest's")
        if self.pack.float16:
            meta.pop("checksum_rows", None)
            meta["arrays"] = {n: {"shape": s["shape"], "dtype": s["stored"]} for n, s in wanted.items()}
            meta["pack_float16"] = True
        self._metas[key] = meta
        return json.loads(json.dumps(meta))

    def entry_path(self, model_id: str, dataset_id: str) -> Path:
        """The entry's folder in the pack (its items.txt lies where a store keeps it)."""
        return (
            self.root
            / check_name(model_id, "invalid model id", error=StoreError)
            / check_name(dataset_id, "invalid dataset id", error=StoreError)
        )

    def read(
        self, model_id: str, dataset_id: str, *, mmap: bool = True, check_finite: bool = True, verify: bool = False
    ) -> Outputs:
        """The entry as `Outputs`, memory-mapped from the pack (float16 packs' arrays as stored)."""
        meta = self.meta(model_id, dataset_id)
        if verify:
            self._raise_damage(self.verify(model_id, dataset_id))
        arrays = self._arrays(model_id, dataset_id, mmap)
        extras = {name[len(_EXTRA) :]: value for name, value in arrays.items() if name.startswith(_EXTRA)}
        try:
            return Outputs(
                features=arrays["features"],
                logits=arrays.get("logits"),
                labels=arrays.get("labels"),
                extras=extras,
                check_finite=check_finite,
                provenance=self.entry_provenance(model_id, dataset_id, meta),
            )
        except ValueError as exc:
            raise StoreError(f"pack entry {model_id}/{dataset_id} holds invalid arrays: {exc}") from exc

    def read_array(self, model_id: str, dataset_id: str, name: str, *, mmap: bool = True) -> np.ndarray:
        """One named array of an entry."""
        arrays = self._arrays(model_id, dataset_id, mmap)
        if name not in arrays:
            raise StoreError(f"pack entry {model_id}/{dataset_id} has no array {name!r}; it has {sorted(arrays)}")
        return arrays[name]

    def _arrays(self, model_id: str, dataset_id: str, mmap: bool) -> dict[str, np.ndarray]:
        self._require(model_id, dataset_id)
        self._checked(model_id, dataset_id)
        opened = self.pack.open_arrays(model_id, dataset_id)
        try:
            return {name: _map(opened.fd, opened.offset, spec, mmap) for name, spec in sorted(opened.tensors.items())}
        finally:
            os.close(opened.fd)

    def verify(self, model_id: str, dataset_id: str, *, advance: Callable[[int], None] | None = None) -> Verification:
        """Hash every file of the entry against the manifest."""
        self._require(model_id, dataset_id)
        names = self.pack.files_of(model_id, dataset_id)
        result = Verification(f"{model_id}/{dataset_id}")
        identity = self._identity(model_id, dataset_id)
        result.problems = self.pack.verify_entries([(model_id, dataset_id)], advance=advance)
        result.nbytes = sum(self.pack.files[name]["size"] for name in names)
        if not result.problems:
            self._verified.add(identity)
        return result

    def verify_head(self, model_id: str, *, advance: Callable[[int], None] | None = None) -> Verification:
        """Hash the head's files against the manifest."""
        return self.verify(model_id, HEAD, advance=advance)

    def has_head(self, model_id: str) -> bool:
        """True when the pack holds the model's head and its files are here."""
        model = self.pack.models.get(model_id)
        return model is not None and model.get("head") is not None and self.pack.present(model_id, HEAD)

    def head_meta(self, model_id: str) -> dict[str, Any]:
        """The head's store meta.json as the pack carries it."""
        self._require(model_id, HEAD)
        relative = f"{model_id}/{HEAD}/{META_FILE}"
        meta = _parse_json(self.pack.read_small(relative), relative)
        if meta.get("model_id") != model_id:
            raise StoreError(f"{self.root}/{relative}: holds the head of {meta.get('model_id')!r}, not {model_id!r}")
        return meta

    def read_head(self, model_id: str, *, verify: bool = False) -> Head:
        """The model's head from the pack."""
        if verify:
            self._raise_damage(self.verify_head(model_id))
        arrays = self._arrays(model_id, HEAD, mmap=False)
        try:
            return Head(arrays["weight"], arrays["bias"])
        except ValueError as exc:
            raise StoreError(f"the head of {model_id} in the pack {self.root} is invalid: {exc}") from exc


# ----------------------------------------------------------------------------------------------- export
@dataclass
class PackSummary:
    """What an export, import or verification did: entries, bytes, seconds, problems."""

    entries: list[str] = field(default_factory=list)
    nbytes: int = 0
    seconds: float = 0.0
    skipped: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def _stored_dtype(name: str, dtype: np.dtype, float16: bool) -> np.dtype:
    """The dtype an array is stored with: float16 for floating arrays of a float16 pack (labels, index exact)."""
    if float16 and np.issubdtype(dtype, np.floating) and dtype.itemsize > 2 and name not in ("labels", "index"):
        return np.dtype("float16")
    return np.dtype(dtype)


class _HashingWriter:
    """Writes to a file while computing its SHA-256 (in a helper thread, so hashing overlaps the next read)."""

    def __init__(self, path: Path) -> None:
        self.handle = open(path, "wb")
        self.digest = hashlib.sha256()
        self.size = 0
        self._pool = concurrent.futures.ThreadPoolExecutor(1)
        self._pending: concurrent.futures.Future[None] | None = None

    def write(self, data: bytes | memoryview) -> None:
        if self._pending is not None:
            self._pending.result()
        self._pending = self._pool.submit(self._write, data)

    def _write(self, data: bytes | memoryview) -> None:
        self.digest.update(data)
        self.handle.write(data)
        self.size += len(data)

    def close(self) -> str:
        if self._pending is not None:
            self._pending.result()
        self._pool.shutdown()
        self.handle.flush()
        os.fsync(self.handle.fileno())
        self.handle.close()
        return self.digest.hexdigest()

    def abort(self) -> None:
        self._pool.shutdown(cancel_futures=True)
        self.handle.close()


def _write_file_atomic(final: Path, produce: Callable[[_HashingWriter], None]) -> dict[str, Any]:
    """Write a pack file under a temporary name, rename it, and return its size and SHA-256."""
    final.parent.mkdir(parents=True, exist_ok=True)
    temporary = final.parent / f".{final.name}.partial"
    writer = _HashingWriter(temporary)
    try:
        produce(writer)
        digest = writer.close()
    except BaseException:
        writer.abort()
        temporary.unlink(missing_ok=True)
        raise
    os.replace(temporary, final)
    return {"sha256": digest, "size": writer.size}


def _rows_per_chunk(row_bytes: int) -> int:
    return max(1, CHUNK_BYTES // max(1, row_bytes))


def _export_arrays(
    writer: _HashingWriter,
    sources: Mapping[str, np.ndarray],
    stored: Mapping[str, np.dtype],
    metadata: Mapping[str, str],
    where: str,
    checks: Mapping[str, list[str]],
    chunk_rows: list[int],
    advance: Callable[[int], None] | None,
    out: dict[str, Any],
) -> None:
    """Stream `sources` into one safetensors file, checking each chunk of rows against the store's checksum as it
    is read; `out` receives the header's SHA-256 and each array's chunk SHA-256s as stored (the store's own for
    arrays stored unchanged, those of the float16 bytes otherwise)."""
    header, layout = _st_layout({n: (stored[n], sources[n].shape) for n in sources}, metadata, where)
    writer.write(header)
    out["header_sha256"] = hashlib.sha256(header).hexdigest()
    out["sha256"] = {}
    bounds = [int(b) for b in np.cumsum([0, *chunk_rows])]
    for name in sorted(layout, key=lambda n: layout[n].start):
        source = sources[name]
        row_bytes = source.dtype.itemsize * int(np.prod(source.shape[1:], dtype=np.int64))
        step = _rows_per_chunk(row_bytes)
        converted = source.dtype != stored[name]
        digests: list[str] = []
        for part, (first, stop) in enumerate(zip(bounds[:-1], bounds[1:], strict=True)):
            check, kept = hashlib.sha256(), hashlib.sha256()
            for start in range(first, stop, step):
                block = np.ascontiguousarray(source[start : min(stop, start + step)])
                check.update(memoryview(block).cast("B"))
                if converted:
                    block = block.astype(stored[name])
                    kept.update(memoryview(block).cast("B"))
                writer.write(memoryview(block).cast("B"))
                if advance is not None:
                    advance(block.nbytes)
            if check.hexdigest() != checks[name][part]:
                raise StoreError(
                    f"{where}: rows {first:,}-{stop - 1:,} of {name} changed since they were written "
                    "(checksum mismatch); nothing exported; `oodbench store verify` lists the damage"
                )
            digests.append(kept.hexdigest() if converted else checks[name][part])
        out["sha256"][name] = digests


def _array_record(spec: Mapping[str, Any], stored: np.dtype) -> dict[str, Any]:
    return {"dtype": np.dtype(spec["dtype"]).name, "stored": stored.name, "shape": list(spec["shape"])}


def export_pack(
    store: Store,
    dest: str | os.PathLike[str],
    entries: Iterable[tuple[str, str]],
    *,
    heads: bool = True,
    float16: bool = False,
    title: str | None = None,
    license: str = "other",
    advance: Callable[[int], None] | None = None,
) -> PackSummary:
    """Write the store entries `entries` (and each model's head) as a pack at `dest` (streamed; bounded memory).

    Every source byte is checked against the store's recorded row checksums as it is read. The pack is written
    into a hidden sibling folder that takes `dest`'s place only once complete (manifest and dataset card last)
    and is removed on any failure, so a failed export leaves nothing at `dest`. `dest` must be new or empty.
    """
    import time

    from .. import __version__

    dest = Path(dest)
    if (dest / MANIFEST).exists():
        raise StoreError(f"{dest} already holds a pack; choose another destination or delete it")
    if (dest.exists() or dest.is_symlink()) and not dest.is_dir():
        raise StoreError(f"{dest} exists and is not a directory")
    if dest.is_dir() and any(os.scandir(dest)):
        raise StoreError(f"{dest} is not empty; a pack is written to a new or empty folder")
    selected = sorted(dict.fromkeys(entries))
    if not selected:
        raise StoreError("nothing to export: name at least one entry")
    models: dict[str, dict[str, Any]] = {}
    metas: dict[tuple[str, str], dict[str, Any]] = {}
    for model_id, dataset_id in selected:  # every check before the first byte is written
        meta = store.meta(model_id, dataset_id)
        if not meta.get("complete"):
            raise StoreError(
                f"{model_id}/{dataset_id} is incomplete: {store.describe_incomplete(model_id, dataset_id)}"
            )
        if not meta.get("num_rows"):
            raise StoreError(f"{model_id}/{dataset_id} holds no rows; a pack needs rows")
        if meta.get("checksum_rows") is None:
            raise StoreError(
                f"{model_id}/{dataset_id} records no checksums (an older store); extract it again to export it"
            )
        for name, spec in meta["arrays"].items():
            _st_dtype_name(np.dtype(spec["dtype"]), f"{model_id}/{dataset_id}: {name}")
        metas[(model_id, dataset_id)] = meta
        provenance = meta.get("provenance") or {}
        model = models.setdefault(
            model_id,
            {
                "model": provenance.get("model"),
                "weights": provenance.get("checkpoint"),
                "preprocessing": provenance.get("preprocessing"),
                "head": None,
                "datasets": {},
            },
        )
        for key, field_name in (("weights", "checkpoint"), ("preprocessing", "preprocessing"), ("model", "model")):
            if model[key] != provenance.get(field_name):
                raise StoreError(
                    f"{model_id}: its entries disagree on {field_name} ({model[key]!r} vs {provenance.get(field_name)!r}); "
                    "a pack holds one network per model id"
                )
    # Nothing is written at `dest` until the whole pack is: a checksum that fails midway leaves no file there.
    missing = [p for p in (dest.parent, *dest.parent.parents) if not p.exists()]
    place = Path(os.path.realpath(dest))  # the folder named may be a link: build beside its target (one file system)
    building = place.parent / f".{place.name}.{os.getpid()}.partial"
    try:
        place.parent.mkdir(parents=True, exist_ok=True)
        _discard(building)
        building.mkdir()
    except OSError as exc:
        raise StoreError(f"cannot write the pack {dest}: {exc.strerror or exc}") from None
    try:
        started = time.perf_counter()
        summary = PackSummary()
        files: dict[str, dict[str, Any]] = {}
        for model_id, dataset_id in selected:
            meta = metas[(model_id, dataset_id)]
            source_dir = store.entry_path(model_id, dataset_id)
            sources = {name: store.read_array(model_id, dataset_id, name) for name in meta["arrays"]}
            stored = {name: _stored_dtype(name, sources[name].dtype, float16) for name in sources}
            items = (source_dir / ITEMS_FILE).is_file()
            base = f"{model_id}/{dataset_id}"
            digests: dict[str, Any] = {}
            files[f"{base}/{ARRAYS_FILE}"] = _write_file_atomic(
                building / base / ARRAYS_FILE,
                lambda w, s=sources, t=stored, b=base, m=meta, o=digests: _export_arrays(
                    w,
                    s,
                    t,
                    {"format": PACK_FORMAT, "entry": b},
                    b,
                    {n: spec["sha256"] for n, spec in m["arrays"].items()},
                    m["checksum_rows"],
                    advance,
                    o,
                ),
            )
            for name in [META_FILE, *([ITEMS_FILE] if items else [])]:
                files[f"{base}/{name}"] = _copy_file(source_dir / name, building / base / name)
            models[model_id]["datasets"][dataset_id] = {
                "rows": meta["num_rows"],
                "image_list_sha256": meta.get("item_hash"),
                "items": items,
                "checksum_rows": list(meta["checksum_rows"]),
                "header_sha256": digests["header_sha256"],
                "arrays": {
                    n: {**_array_record(spec, stored[n]), "sha256": digests["sha256"][n]}
                    for n, spec in meta["arrays"].items()
                },
            }
            summary.entries.append(base)
        if heads:
            for model_id in sorted(models):
                if not store.has_head(model_id):
                    continue
                head_meta = store.head_meta(model_id)
                specs = Store._head_specs(model_id, head_meta)
                if specs is None:
                    raise StoreError(f"the head of {model_id} records no checksums; extract it again to export it")
                head = store.read_head(model_id)
                sources = {"weight": np.asarray(head.weight), "bias": np.asarray(head.bias)}
                base = f"{model_id}/{HEAD}"
                digests = {}
                # Its recorded checksums (one per array) are checked as it is copied, as an entry's rows are.
                files[f"{base}/{ARRAYS_FILE}"] = _write_file_atomic(
                    building / base / ARRAYS_FILE,
                    lambda w, s=sources, b=base, o=digests, c=specs: _export_arrays(
                        w,
                        s,
                        {n: a.dtype for n, a in s.items()},
                        {"format": PACK_FORMAT, "entry": b},
                        b,
                        {n: c[n]["sha256"] for n in s},
                        [int(s["weight"].shape[0])],
                        advance,
                        o,
                    ),
                )
                files[f"{base}/{META_FILE}"] = _copy_file(
                    store.root / model_id / HEAD / META_FILE, building / base / META_FILE
                )
                models[model_id]["head"] = {
                    "checksum_rows": [int(sources["weight"].shape[0])],
                    "header_sha256": digests["header_sha256"],
                    "arrays": {
                        n: {**_array_record(specs[n], np.dtype(specs[n]["dtype"])), "sha256": digests["sha256"][n]}
                        for n in specs
                    },
                }
                summary.entries.append(base)
        manifest = {
            "format": PACK_FORMAT,
            "format_version": PACK_VERSION,
            "oodbench_version": __version__,
            "created": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
            "float16": float16,
            "title": title or f"oodbench feature pack: {', '.join(sorted(models))}",
            "license": license,
            "models": models,
            "files": dict(sorted(files.items())),
        }
        _check_manifest(json.loads(json.dumps(manifest)), "the manifest being written")
        atomic_write_text(building / CARD, dataset_card(manifest))
        atomic_write_text(building / MANIFEST, json.dumps(manifest, indent=2, sort_keys=True) + "\n")
        moved: list[str] = []
        try:
            if dest.is_dir():  # an empty folder named (even the current one) stays: the files move in, manifest last
                for name in sorted(os.listdir(building), key=lambda name: name == MANIFEST):
                    os.replace(building / name, dest / name)
                    moved.append(name)
                building.rmdir()
            else:
                os.replace(building, dest)
        except OSError as exc:
            for name in moved:
                _discard(dest / name)
            raise StoreError(f"cannot write the pack {dest}: {exc.strerror or exc}; nothing exported") from None
    except BaseException:
        shutil.rmtree(building, ignore_errors=True)
        for parent in missing:  # deepest first; only folders this export created, and only when empty
            with contextlib.suppress(OSError):
                parent.rmdir()
        raise
    summary.nbytes = sum(record["size"] for record in files.values())
    summary.seconds = time.perf_counter() - started
    return summary


def _copy_file(source: Path, target: Path) -> dict[str, Any]:
    """Copy a store file (JSON, image list) into the pack, not following links; its size and SHA-256."""
    fd, size = _open_regular(source.parent, source.name)

    def produce(writer: _HashingWriter) -> None:
        offset = 0
        while offset < size:
            data = os.pread(fd, min(CHUNK_BYTES, size - offset), offset)
            if not data:
                raise StoreError(f"{source}: became shorter while it was copied")
            writer.write(data)
            offset += len(data)

    try:
        return _write_file_atomic(target, produce)
    finally:
        os.close(fd)


# ----------------------------------------------------------------------------------------------- the dataset card
def _size_category(rows: int) -> str:
    for limit, label in ((10**3, "n<1K"), (10**4, "1K<n<10K"), (10**5, "10K<n<100K"), (10**6, "100K<n<1M")):
        if rows < limit:
            return label
    return "1M<n<10M" if rows < 10**7 else "10M<n<100M"


def dataset_card(manifest: Mapping[str, Any]) -> str:
    """The pack's README.md in the layout of a Hugging Face dataset repository (YAML front matter, then Markdown)."""
    models = manifest["models"]
    rows = sum(entry["rows"] for model in models.values() for entry in model["datasets"].values())
    title = str(manifest.get("title") or "oodbench feature pack")
    front = [
        "---",
        f"license: {json.dumps(str(manifest.get('license') or 'other'))}",
        f"pretty_name: {json.dumps(title)}",
        "tags:",
        "  - oodbench",
        "  - out-of-distribution-detection",
        "  - feature-pack",
        "  - safetensors",
        "size_categories:",
        f"  - {_size_category(rows)}",
        "viewer: false",
        "---",
        "",
    ]
    body = [
        f"# {title}",
        "",
        f"Pre-extracted outputs of {len(models)} model(s) in the oodbench pack format {manifest['format_version']} "
        f"(written by oodbench {manifest['oodbench_version']}"
        + (", floating arrays stored as float16" if manifest["float16"] else "")
        + "). `manifest.json` is the contract: each model's weights tag and preprocessing, each set's image list "
        "SHA-256, every file's SHA-256 and size.",
        "",
    ]
    for model_id, model in sorted(models.items()):
        body += [
            f"## {model_id}",
            "",
            f"- model: `{model.get('model')}`",
            f"- weights: `{model.get('weights')}`",
            f"- preprocessing: `{json.dumps(model.get('preprocessing'), sort_keys=True)}`",
            f"- head: {'yes' if model.get('head') else 'no'}",
            "",
            "| dataset | rows | arrays | image list SHA-256 |",
            "|---|---:|---|---|",
        ]
        for dataset_id, entry in sorted(model["datasets"].items()):
            arrays = ", ".join(f"{n} {tuple(s['shape'][1:])} {s['stored']}" for n, s in sorted(entry["arrays"].items()))
            body.append(f"| {dataset_id} | {entry['rows']:,} | {arrays} | `{entry.get('image_list_sha256')}` |")
        body.append("")
    example = next(iter(sorted(models)), "MODEL")
    dataset = next(iter(sorted(models[example]["datasets"])), "DATASET") if models else "DATASET"
    body += [
        "## Reading it",
        "",
        "Without oodbench (NumPy; `safetensors.torch` for PyTorch; `pandas.DataFrame(arrays['logits'])` for pandas):",
        "",
        "```python",
        "from safetensors.numpy import load_file",
        f'arrays = load_file("{example}/{dataset}/arrays.safetensors")',
        'features, labels = arrays["features"], arrays.get("labels")',
        "```",
        "",
        "With oodbench (memory-mapped, checksums checked before use):",
        "",
        "```bash",
        f"oodbench evaluate --pack . --model {example} --fit FIT --id ID --ood OOD",
        "oodbench pack verify .",
        "```",
        "",
    ]
    return "\n".join(front + body)


# ----------------------------------------------------------------------------------------------- comparisons
def pack_differences(pack: Pack, store: Store, model_id: str) -> list[str]:
    """How the pack's model differs from the store's entries of the same model id: weights, preprocessing, images.

    Empty when the store holds nothing of the model, or holds the same network, preprocessing and image lists.
    """
    model = pack._model(model_id)
    differences: list[str] = []
    for dataset_id in store.datasets(model_id):
        try:
            other = store.meta(model_id, dataset_id)
        except StoreError:
            continue
        provenance = other.get("provenance") or {}
        for key, field_name in (("weights", "checkpoint"), ("preprocessing", "preprocessing")):
            if model.get(key) != provenance.get(field_name):
                differences.append(
                    f"{model_id}: the pack's {key} {json.dumps(model.get(key), sort_keys=True)} differ from "
                    f"{store.root}'s {json.dumps(provenance.get(field_name), sort_keys=True)} ({model_id}/{dataset_id})"
                )
        entry = model["datasets"].get(dataset_id)
        if entry is not None and entry.get("image_list_sha256") != other.get("item_hash"):
            differences.append(
                f"{model_id}/{dataset_id}: the pack's image list (SHA-256 {entry.get('image_list_sha256')}) differs "
                f"from {store.root}'s ({other.get('item_hash')})"
            )
        if differences:
            break
    return differences


def check_comparable(pack: Pack, store: Store, model_ids: Iterable[str], *, allow: bool = False) -> list[str]:
    """Raise StoreError with the first difference (see `pack_differences`) unless `allow`; the differences."""
    found = [line for model_id in model_ids for line in pack_differences(pack, store, model_id)]
    if found and not allow:
        raise StoreError(f"{found[0]}; results would not be comparable (pass --allow-different to go on anyway)")
    return found


# ----------------------------------------------------------------------------------------------- import
_STAGING = ".pack-import"


def _npy_header(dtype: np.dtype, shape: tuple[int, ...]) -> bytes:
    """The .npy header the store writes for an array (format 1.0, as `EntryWriter.finalize` and heads write it)."""
    import io

    buffer = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        buffer, {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False, "shape": shape}
    )
    return buffer.getvalue()


def _selection(pack: Pack, models: Sequence[str], datasets: Sequence[str]) -> list[tuple[str, str]]:
    """The entries named by --model/--dataset (all when none is named); StoreError naming an unknown one."""
    chosen = list(models) or sorted(pack.models)
    for model_id in chosen:
        pack._model(model_id)
    selected = []
    for model_id in chosen:
        known = pack.models[model_id]["datasets"]
        for dataset_id in datasets:
            if dataset_id not in known and len(chosen) == 1:
                pack._entry(model_id, dataset_id)
        selected += [(model_id, d) for d in (datasets or sorted(known)) if d in known]
    if not selected:
        raise StoreError(f"the pack {pack.root} holds none of the entries asked for")
    return selected


@dataclass(frozen=True)
class _EntryPlan:
    """One pack entry (or head) as the store will hold it: its meta.json bytes, arrays and row checksums."""

    meta_bytes: bytes
    specs: dict[str, Any]
    checks: dict[str, list[str]]
    rows: list[int]
    files: list[str]
    where: str


def _entry_plan(pack: Pack, model_id: str, dataset_id: str) -> _EntryPlan:
    """The entry's carried meta.json checked against the manifest (SHA-256, ids, row checksums, arrays)."""
    head = dataset_id == HEAD
    meta_bytes = pack.read_small(f"{model_id}/{dataset_id}/{META_FILE}")
    if hashlib.sha256(meta_bytes).hexdigest() != pack.files[f"{model_id}/{dataset_id}/{META_FILE}"]["sha256"]:
        raise StoreError(f"{pack.root}/{model_id}/{dataset_id}/{META_FILE}: its SHA-256 differs from the manifest's")
    where = f"{pack.root}/{model_id}/{dataset_id}/{META_FILE}"
    meta = _parse_json(meta_bytes, where)
    if head:
        specs = Store._head_specs(model_id, meta)
        if specs is None or meta.get("model_id") != model_id:
            raise StoreError(f"{where}: not the checksummed head of {model_id}")
        checks = {name: spec["sha256"] for name, spec in specs.items()}
        chunk_rows = None
    else:
        meta = _check_meta(meta, Path(where))
        if meta.get("model_id") != model_id or meta.get("dataset_id") != dataset_id or not meta.get("complete"):
            raise StoreError(f"{where}: does not describe the complete entry {model_id}/{dataset_id}")
        specs = meta["arrays"]
        if meta.get("checksum_rows") is None or any("sha256" not in s for s in specs.values()):
            raise StoreError(f"{where}: records no checksums")
        checks = {name: spec["sha256"] for name, spec in specs.items()}
        chunk_rows = meta["checksum_rows"]
    record = pack.models[model_id]["head"] if head else pack.models[model_id]["datasets"][dataset_id]
    rows_of = chunk_rows if chunk_rows is not None else [int(specs["weight"]["shape"][0])]
    # The manifest's chunk checksums must be the entry's own row checksums: one hash of each byte checks both.
    if record["checksum_rows"] != rows_of or any(record["arrays"][n]["sha256"] != checks[n] for n in checks):
        raise StoreError(f"{where}: its row checksums disagree with the manifest's")
    if set(record["arrays"]) != set(specs):
        raise StoreError(f"{where}: lists {sorted(specs)} but the manifest lists {sorted(record['arrays'])}")
    for name, spec in specs.items():
        wanted = record["arrays"][name]
        if np.dtype(spec["dtype"]) != np.dtype(wanted["stored"]) or list(spec["shape"]) != list(wanted["shape"]):
            raise StoreError(f"{where}: {name} is recorded as {spec['dtype']} {spec['shape']} but stored otherwise")
        header = _npy_header(np.dtype(spec["dtype"]), tuple(spec["shape"]))
        if spec.get("header_sha256") is not None and hashlib.sha256(header).hexdigest() != spec["header_sha256"]:
            raise StoreError(f"{where}: the .npy header of {name} cannot be rebuilt byte for byte")
    items = not head and pack.models[model_id]["datasets"][dataset_id]["items"]
    files = [META_FILE, *([ITEMS_FILE] if items else [])]
    return _EntryPlan(meta_bytes, specs, checks, list(rows_of), files, where)


def _real_directory(path: Path) -> None:
    """Make `path` a real directory of its own: anything else there (a link, a file) is removed, never followed."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        info = None
    if info is not None and not stat.S_ISDIR(info.st_mode):
        os.unlink(path)  # a link is removed itself, its target untouched
        info = None
    if info is None:
        os.mkdir(path)


def _discard(path: Path) -> None:
    """Remove a staged entry: a directory with everything in it (links inside removed, never followed), or a link."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(info.st_mode):
        shutil.rmtree(path)  # fd-based on Linux: removes links found inside without following them
    else:
        os.unlink(path)


def _staged_matches(
    pack: Pack, model_id: str, dataset_id: str, staged: Path, advance: Callable[[int], None] | None
) -> bool:
    """True when `staged` is a real directory holding exactly the entry the pack's manifest describes, byte for byte.

    A staged folder is left by an interrupted import, of this pack or of another: it is kept only when its file
    names are exactly the entry's, each file is a regular file, meta.json and items.txt have the manifest's
    SHA-256, and each .npy file is the rebuilt header followed by rows whose chunks have the manifest's SHA-256s.
    """
    plan = _entry_plan(pack, model_id, dataset_id)
    try:
        if not stat.S_ISDIR(os.lstat(staged).st_mode):
            return False
        names = set(os.listdir(staged))
    except OSError:
        return False
    if names != {*plan.files, *(f"{name}.npy" for name in plan.specs)}:
        return False
    tasks: list[tuple[int, int, int, str]] = []  # fd, offset, length, expected digest
    fds: list[int] = []
    try:
        for name in plan.files:
            relative = f"{model_id}/{dataset_id}/{name}"
            data = _read_bounded(staged, name, pack.files[relative]["size"], limit=max(MAX_JSON_BYTES, 2**31))
            if hashlib.sha256(data).hexdigest() != pack.files[relative]["sha256"]:
                return False
        for name, spec in plan.specs.items():
            dtype, shape = np.dtype(spec["dtype"]), tuple(int(n) for n in spec["shape"])
            header = _npy_header(dtype, shape)
            row_bytes = dtype.itemsize * int(np.prod(shape[1:], dtype=np.int64))
            fd, size = _open_regular(staged, f"{name}.npy")
            fds.append(fd)
            if size != len(header) + row_bytes * shape[0] or os.pread(fd, len(header), 0) != header:
                return False
            first = 0
            for count, expected in zip(plan.rows, plan.checks[name], strict=True):
                tasks.append((fd, len(header) + first * row_bytes, count * row_bytes, expected))
                first += count

        def check(task: tuple[int, int, int, str]) -> bool:
            fd, start, length, expected = task
            try:
                return _sha256_range(fd, start, length, advance) == expected
            except (OSError, StoreError):
                return False

        tasks.sort(key=lambda task: -task[2])
        with concurrent.futures.ThreadPoolExecutor(max(1, min(len(tasks), os.cpu_count() or 1))) as pool:
            return all(pool.map(check, tasks))
    except (OSError, StoreError):
        return False
    finally:
        for fd in fds:
            os.close(fd)


def _stage_entry(
    pack: Pack, model_id: str, dataset_id: str, target: Path, advance: Callable[[int], None] | None
) -> None:
    """Copy one entry (or head) from the pack into `target` as store files, hashing every pack byte on the way.

    Each chunk of rows is hashed as it is copied (chunks in parallel, on all cores) against the manifest's
    SHA-256, which must be the entry's own row checksum in its meta.json. Writes under `target`'s temporary twin
    and renames it once everything matched; `target` must not exist (the caller discards a stale one).
    """
    temporary = target.parent / f".{target.name}.partial"
    _discard(temporary)
    temporary.mkdir()
    plan = _entry_plan(pack, model_id, dataset_id)
    meta_bytes, specs, checks, rows_of, where = plan.meta_bytes, plan.specs, plan.checks, plan.rows, plan.where
    record = pack.models[model_id]["head"] if dataset_id == HEAD else pack.models[model_id]["datasets"][dataset_id]
    opened = pack.open_arrays(model_id, dataset_id)
    relative = f"{model_id}/{dataset_id}/{ARRAYS_FILE}"
    tasks: list[tuple[str, int, int, int, str]] = []  # array, pack offset, length, .npy offset, expected digest
    try:
        if set(opened.tensors) != set(specs):
            raise StoreError(f"{where}: lists {sorted(specs)} but the arrays file holds {sorted(opened.tensors)}")
        if hashlib.sha256(os.pread(opened.fd, opened.offset, 0)).hexdigest() != record["header_sha256"]:
            raise StoreError(f"{pack.root}/{relative}: its header's SHA-256 differs from the manifest's")
        for name, tensor in sorted(opened.tensors.items(), key=lambda item: item[1].start):
            spec = specs[name]
            if tensor.dtype != np.dtype(spec["dtype"]) or list(tensor.shape) != list(spec["shape"]):
                raise StoreError(f"{where}: {name} is recorded as {spec['dtype']} {spec['shape']} but stored otherwise")
            header = _npy_header(tensor.dtype, tensor.shape)
            with open(temporary / f"{name}.npy", "wb") as out:
                out.write(header)
                out.truncate(len(header) + tensor.end - tensor.start)
            row_bytes = tensor.dtype.itemsize * int(np.prod(tensor.shape[1:], dtype=np.int64))
            first = 0
            for count, expected in zip(rows_of, checks[name], strict=True):
                start = first * row_bytes
                tasks.append(
                    (name, opened.offset + tensor.start + start, count * row_bytes, len(header) + start, expected)
                )
                first += count

        def copy(task: tuple[str, int, int, int, str]) -> str | None:
            """Copy one chunk of rows into its .npy file while hashing it (chunks run in parallel)."""
            name, source, length, target, expected = task
            digest, done = hashlib.sha256(), 0
            out = os.open(temporary / f"{name}.npy", os.O_WRONLY | os.O_CLOEXEC)
            try:
                while done < length:
                    data = os.pread(opened.fd, min(16 * 2**20, length - done), source + done)
                    if not data:
                        return f"{pack.root}/{relative}: became shorter while it was read"
                    digest.update(data)
                    os.pwrite(out, data, target + done)
                    done += len(data)
                    if advance is not None:
                        advance(len(data))
            finally:
                os.close(out)
            if digest.hexdigest() != expected:
                return f"{pack.root}/{relative}: rows of {name} differ from their SHA-256 in the manifest (damaged or changed)"
            return None

        tasks.sort(key=lambda task: -task[2])
        with concurrent.futures.ThreadPoolExecutor(max(1, min(len(tasks), os.cpu_count() or 1))) as pool:
            problems = [problem for problem in pool.map(copy, tasks) if problem]
        if problems:
            raise StoreError(problems[0])
        for name in opened.tensors:
            fd = os.open(temporary / f"{name}.npy", os.O_RDONLY | os.O_CLOEXEC)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
    finally:
        os.close(opened.fd)
    for name in plan.files:
        data = meta_bytes if name == META_FILE else pack.read_small(f"{model_id}/{dataset_id}/{name}")
        if hashlib.sha256(data).hexdigest() != pack.files[f"{model_id}/{dataset_id}/{name}"]["sha256"]:
            raise StoreError(f"{pack.root}/{model_id}/{dataset_id}/{name}: its SHA-256 differs from the manifest's")
        atomic_write_bytes(temporary / name, data)
    os.replace(temporary, target)


def import_pack(
    pack_root: str | os.PathLike[str],
    store_root: str | os.PathLike[str],
    *,
    models: Sequence[str] = (),
    datasets: Sequence[str] = (),
    allow_different: bool = False,
    advance: Callable[[int], None] | None = None,
) -> PackSummary:
    """Copy pack entries into a store; nothing enters the store before every byte of every entry is verified.

    Steps: check the manifest, the selection, each file's size and safetensors header, and the store (an entry
    already there must be this very entry; a model whose weights, preprocessing or image lists differ is
    refused unless `allow_different`); then copy every entry into a hidden staging folder of the store while
    hashing it against the manifest and the entry's own row checksums; then move the entries in, each under its
    write lock; staging and moving hold the store's import lock. A rerun after an interruption keeps a staged
    entry only when it is byte for byte the entry this manifest describes (others are discarded and staged
    again), and skips the imported ones.
    """
    import time

    pack = Pack(pack_root)
    if pack.float16:
        raise StoreError(
            f"{pack.root} is a float16 pack: evaluate it directly (`--pack`); a store keeps the exact arrays, so "
            "import needs a float32 pack"
        )
    store = Store(store_root)
    if isinstance(store, PackStore):
        raise StoreError(f"{store_root} is a pack, not a store")
    selected = _selection(pack, models, datasets)
    targets: list[tuple[str, str]] = list(selected)
    for model_id in sorted({m for m, _ in selected}):
        if pack.models[model_id].get("head") is not None:
            targets.append((model_id, HEAD))
    started, summary = time.perf_counter(), PackSummary()
    check_comparable(pack, store, sorted({m for m, _ in selected}), allow=allow_different)
    todo: list[tuple[str, str]] = []
    for model_id, dataset_id in targets:  # cheap checks of everything first
        if not pack.present(model_id, dataset_id):
            raise StoreError(f"{model_id}/{dataset_id}: its files are not in {pack.root} (pull them first)")
        for name in pack.files_of(model_id, dataset_id):
            os.close(pack.open_file(name)[0])
        os.close(pack.open_arrays(model_id, dataset_id).fd)
        target = store.root / model_id / dataset_id
        if target.exists():
            meta_name = f"{model_id}/{dataset_id}/{META_FILE}"
            same = (target / META_FILE).is_file() and hashlib.sha256(
                (target / META_FILE).read_bytes()
            ).hexdigest() == pack.files[meta_name]["sha256"]
            if not same:
                raise StoreError(
                    f"{store.root} already holds {model_id}/{dataset_id} with other data; delete it first "
                    "(nothing was imported)"
                )
            summary.skipped.append(f"{model_id}/{dataset_id}")
            continue
        todo.append((model_id, dataset_id))
    staging = store.root / _STAGING
    try:
        store.root.mkdir(parents=True, exist_ok=True)
        _real_directory(staging)
    except OSError as exc:
        raise StoreError(f"cannot create the staging folder {staging}: {exc.strerror or exc}") from None
    # One import at a time stages into a store: another cannot discard or move what this one verified.
    with _locked(staging / ".lock", f"the import staging folder {staging}", 0.0):
        for model_id, dataset_id in todo:  # copy while verifying, into the hidden staging folder
            staged = staging / model_id / dataset_id
            try:
                _real_directory(staging / model_id)
                # A staged folder may come from an interrupted import of another pack: kept only when it is
                # byte for byte this entry, otherwise discarded and staged again.
                if not _staged_matches(pack, model_id, dataset_id, staged, advance):
                    _discard(staged)
                    _stage_entry(pack, model_id, dataset_id, staged, advance)
            except OSError as exc:
                raise StoreError(f"cannot stage {model_id}/{dataset_id} in {staging}: {exc.strerror or exc}") from None
            summary.nbytes += sum(pack.files[name]["size"] for name in pack.files_of(model_id, dataset_id))
        for model_id, dataset_id in todo:  # everything verified: move the entries in
            target = store.root / model_id / dataset_id
            lock = store.root / model_id / (".head.lock" if dataset_id == HEAD else f".{dataset_id}.lock")
            with _locked(lock, f"store entry {model_id}/{dataset_id}", 0.0):
                if target.exists():
                    raise StoreError(
                        f"{store.root} gained {model_id}/{dataset_id} during the import; delete it and rerun"
                    )
                os.replace(staging / model_id / dataset_id, target)
            summary.entries.append(f"{model_id}/{dataset_id}")
        shutil.rmtree(staging, ignore_errors=True)
    summary.seconds = time.perf_counter() - started
    return summary


def verify_pack(
    root: str | os.PathLike[str], *, advance: Callable[[int], None] | None = None
) -> tuple[Pack, PackSummary, list[str]]:
    """Hash every present file of a pack against its manifest; (pack, summary, entries not pulled)."""
    import time

    pack = Pack(root)
    started, summary, absent = time.perf_counter(), PackSummary(), []
    names: list[str] = []
    present: list[tuple[str, str]] = []
    keys = [*pack.entries(), *[(m, HEAD) for m, model in sorted(pack.models.items()) if model.get("head") is not None]]
    for model_id, dataset_id in keys:
        if not pack.present(model_id, dataset_id):
            absent.append(f"{model_id}/{dataset_id}")
            continue
        names += pack.files_of(model_id, dataset_id)
        present.append((model_id, dataset_id))
        summary.entries.append(f"{model_id}/{dataset_id}")
    summary.problems += pack.verify_entries(present, advance=advance)
    summary.nbytes = sum(pack.files[name]["size"] for name in names)
    summary.seconds = time.perf_counter() - started
    return pack, summary, absent
