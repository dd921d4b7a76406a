"""On-disk cache of `Outputs` per (model, dataset): sharded, atomic, resumable, locked, checksummed, memory-mapped.

Layout::

    <root>/<model-id>/head/{weight.npy, bias.npy, meta.json}
    <root>/<model-id>/<dataset-id>/meta.json                 provenance, shapes, dtypes, checksums, skipped items
    <root>/<model-id>/<dataset-id>/shards/<array>.<k>.npy     while writing: one file per array per shard
    <root>/<model-id>/<dataset-id>/shards/<k>.done.json       marks shard k complete (written last)
    <root>/<model-id>/<dataset-id>/<array>.npy                after finalize: one contiguous file per array
    <root>/<model-id>/.<dataset-id>.lock                      the entry's write lock (``.head.lock`` for the head)

Shards are the unit of resumable writing: every file is written under a temporary name and renamed, and a
shard counts only once its ``done`` marker exists and every file it lists has the recorded size, so a
killed writer never leaves a shard a reader accepts. ``finalize`` appends the shards of each array to
one contiguous ``.npy`` (bounded memory), deleting each shard once it is copied, so that readers memory-map
a single file even for 1.28 M rows and the entry never needs much more disk than its own size plus one shard;
``shards/merge.json`` records the merge's progress so that a killed ``finalize`` resumes where it stopped.
Array names: ``features``, ``logits``, ``labels``, ``index`` (the item position of each row, so skipped
unreadable items leave no silent hole) and ``extra.<name>`` for extras.

One writer at a time: an `EntryWriter` holds an OS lock (``flock``) on the entry's lock file from its creation
to the end of ``finalize`` (or ``close``); the kernel releases it when the process exits or is killed. A writer
in another process waits for it or fails with one line naming the holder. Inside one process the newest writer
of an entry supersedes the older ones, which then refuse to write.

Checksums: each shard's done marker records the SHA-256 of every array's rows as the writer handed them in;
``finalize`` checks each shard against it while copying, and ``meta.json`` keeps the list per array (one digest
per shard's rows) with the digest of the ``.npy`` header. Reads check what is cheap (file size, header, shape,
dtype); `Store.verify` (``oodbench store verify``) and ``read(verify=True)`` hash every byte.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import hashlib
import json
import math
import os
import platform
import shlex
import shutil
import socket
import stat
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..util.atomic import atomic_save_npy, atomic_write_json, open_regular, open_regular_file, read_regular
from ..util.schema import Int, ListOf, MapOf, Record, SchemaError, Str, validate
from .errors import StoreError
from .names import check_name, is_name
from .outputs import Head, Outputs

__all__ = ["Store", "EntryWriter", "Verification", "PROVENANCE_KEYS", "hash_items", "library_versions"]

# 2: per-array checksums (meta.json "checksum_rows", arrays' "sha256" and "header_sha256"). Format 1 entries
# (no checksums) are still read; `verify` says that only their sizes, headers and shapes could be checked.
FORMAT_VERSION = 2
_READABLE_FORMATS = (1, 2)
# Provenance fields that must agree between the datasets of one evaluation (same network, same inputs).
PROVENANCE_KEYS = ("model", "checkpoint", "preprocessing")
_EXTRA = "extra."
_ARRAYS = ("features", "logits", "labels", "index")
# Bytes hashed per read while verifying (one buffer, reused).
_VERIFY_BLOCK = 16 * 2**20
# The largest JSON file a store reads back (meta.json of a 1.28 M-row entry is well under 1 MiB).
_JSON_LIMIT = 64 * 2**20


# The JSON files a writer reads back, by schema: a shard's done marker and the merge's progress record.
_SHAPE = ListOf(Int(0, 2**40), min_len=1, max_len=32)
_SHARD_RECORD = Record(
    {
        "rows": Int(0, 2**40),
        "arrays": MapOf(
            Record({"shape": _SHAPE, "dtype": Str(max_len=64), "nbytes": Int(0)}, {"sha256": Str("[0-9a-f]{64}")}),
            key=Str(max_len=256),
            max_len=4096,
        ),
    },
    {"skipped": ListOf(object)},
)
_MERGE_RECORD = Record(
    {
        "plan": MapOf(_SHARD_RECORD, key=Str("[0-9]{1,9}")),
        "arrays": MapOf(Record({"shape": _SHAPE, "dtype": Str(max_len=64), "copied": Int(0)}), max_len=4096),
    },
    {"extra_meta": dict},
)


def _check_name(kind: str, name: str) -> str:
    return check_name(name, f"invalid {kind}", error=StoreError)


def _check_array_name(name: object, where: str) -> str:
    """An array name that is safe as a file name: features, logits, labels, index or extra.<name>."""
    if isinstance(name, str) and (name in _ARRAYS or (name.startswith(_EXTRA) and is_name(name[len(_EXTRA) :]))):
        return name
    raise StoreError(f"{where}: invalid array name {name!r} (features, logits, labels, index or extra.<name>)")


def hash_items(items: Iterable[str]) -> str:
    """SHA-256 of an ordered item list (e.g. relative image paths), the dataset's identity in provenance."""
    digest = hashlib.sha256()
    for item in items:
        digest.update(str(item).encode("utf-8"))
        digest.update(b"\n")
    return digest.hexdigest()


def library_versions() -> dict[str, str]:
    """Versions of Python and of the numerical libraries already imported (recorded in meta.json)."""
    versions = {"python": platform.python_version(), "numpy": np.__version__}
    from .. import __version__

    versions["oodbench"] = __version__
    for module in ("torch", "torchvision", "timm", "open_clip", "faiss", "sklearn", "scipy"):
        loaded = sys.modules.get(module)
        if loaded is not None and hasattr(loaded, "__version__"):
            versions[module] = str(loaded.__version__)
    return versions


def _read_json(path: Path) -> dict[str, Any]:
    """A JSON object from `path`; one-line StoreError when it is missing, not UTF-8, not JSON or not an object."""
    try:
        value = json.loads(read_regular(path, _JSON_LIMIT).decode("utf-8"))
    except FileNotFoundError:
        raise StoreError(f"missing {path}") from None
    except UnicodeDecodeError as exc:
        raise StoreError(f"corrupt {path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except json.JSONDecodeError as exc:
        raise StoreError(f"corrupt JSON in {path}: {exc}") from None
    except OSError as exc:
        raise StoreError(f"cannot read {path}: {exc.strerror or exc}") from None
    if not isinstance(value, dict):
        raise StoreError(f"corrupt {path}: it must hold a JSON object, not a {type(value).__name__}")
    return value


# ----------------------------------------------------------------------------------------------- folders
def _real_folder(root: Path, names: Iterable[str]) -> Path:
    """`root`/`names`, each of its folders below `root` checked (lstat, no link followed) to be a real directory.

    The root itself may be reached through links (where the user keeps the store is their choice); below it,
    a symbolic link or a file in a folder's place is refused with a StoreError naming it. Missing folders pass.
    """
    path = root
    checking = True
    for name in names:
        path = path / name
        if not checking:
            continue
        try:
            mode = os.lstat(path).st_mode
        except (FileNotFoundError, NotADirectoryError):
            checking = False  # nothing below a missing folder exists
            continue
        except OSError as exc:
            raise StoreError(f"cannot read the store folder {path} ({exc.strerror or exc})") from None
        if stat.S_ISLNK(mode):
            raise StoreError(f"{path} is a symbolic link; no link inside a store is followed (make it a real folder)")
        if not stat.S_ISDIR(mode):
            raise StoreError(f"{path} is not a directory, where a store keeps a folder")
    return path


def _remove_folder(parent: Path, name: str) -> None:
    """Delete the folder `parent`/`name` and all it holds, following no link; a link in its place is refused.

    `parent` is opened without following a link and the folder is removed relative to that descriptor, so a folder
    swapped for a link after it was checked is not followed either; links inside are removed, never followed.
    """
    try:
        fd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise StoreError(
            f"cannot delete {parent / name}: cannot open {parent} as a real directory ({exc.strerror or exc})"
        ) from None
    try:
        try:
            mode = os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode
        except FileNotFoundError:
            return
        if stat.S_ISLNK(mode):
            raise StoreError(f"{parent / name} is a symbolic link; not deleted (no link inside a store is followed)")
        if not stat.S_ISDIR(mode):
            raise StoreError(f"{parent / name} is not a directory; not deleted")
        shutil.rmtree(name, dir_fd=fd)  # fd-based on Linux: never follows a link inside the tree
    except OSError as exc:
        raise StoreError(f"cannot delete {parent / name} ({exc.strerror or exc})") from None
    finally:
        os.close(fd)


def _now() -> str:
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")


def _command_line() -> str | None:
    """The command that runs this process, as a user would type it again (recorded to say how to resume)."""
    argv = list(sys.argv)
    if not argv or argv[0] in ("", "-c", "-"):
        return None
    program = Path(argv[0]).name
    if program == "oodbench":
        return shlex.join(["oodbench", *argv[1:]])
    if program == "__main__.py":
        return shlex.join(["python", "-m", Path(argv[0]).parent.name, *argv[1:]])
    return shlex.join(["python", *argv])


# ----------------------------------------------------------------------------------------------- checksums
def _row_bytes(spec: Mapping[str, Any]) -> int:
    # Python integers: a forged shape such as (2**33, 2**31) must not wrap around to a small size
    return np.dtype(spec["dtype"]).itemsize * math.prod(spec["shape"][1:])


def _data_digest(array: np.ndarray) -> str:
    """SHA-256 of an array's data in C order (what its .npy file holds after the header)."""
    contiguous = np.ascontiguousarray(array)
    return hashlib.sha256(contiguous.reshape(-1).view(np.uint8)).hexdigest()


def _content_digest(arrays: Mapping[str, np.ndarray]) -> str:
    """One digest of named arrays (names, dtypes, shapes and data): the identity of a writer's input."""
    digest = hashlib.sha256()
    for name in sorted(arrays):
        array = np.asarray(arrays[name])
        digest.update(json.dumps([name, str(array.dtype), list(array.shape)]).encode())
        digest.update(_data_digest(array).encode())
    return digest.hexdigest()


def _plain_dtype(dtype: np.dtype) -> bool:
    """True for what a store holds: booleans, integers and floats of at most 8 bytes, in native byte order."""
    return dtype.kind in "biuf" and dtype.itemsize <= 8 and dtype.isnative and dtype.names is None


def _storable(array: np.ndarray, name: str) -> np.ndarray:
    """`array` as the store writes it (C order, native byte order); StoreError for a dtype it does not keep."""
    if array.dtype.kind in "biuf" and not array.dtype.isnative:
        array = array.astype(array.dtype.newbyteorder("="))
    if not _plain_dtype(array.dtype):
        raise StoreError(
            f"array {name!r} has dtype {str(array.dtype)[:60]}; the store keeps booleans, integers and floats only"
        )
    return np.ascontiguousarray(array)


def _layout_problem(shape: tuple[int, ...], fortran: bool, dtype: np.dtype, offset: int, size: int) -> str | None:
    """Why an .npy header does not describe a plain array filling this file exactly (None when it does)."""
    if not _plain_dtype(dtype):
        return f"its dtype {str(dtype)[:60]} is not a boolean, integer or float type in native byte order"
    if fortran and len(shape) > 1:
        return f"it holds a Fortran-ordered array of shape {shape}; a store writes C order"
    expected = offset + dtype.itemsize * math.prod(shape)  # Python integers: no overflow on forged shapes
    if size != expected:
        return (
            f"{size:,} bytes on disk but its header's shape {shape} and dtype need {expected:,} (truncated or forged)"
        )
    return None


def npy_header(handle: Any, path: Path | str) -> tuple[tuple[int, ...], bool, np.dtype, int]:
    """(shape, fortran_order, dtype, data offset) of an open .npy file; StoreError when it is not one."""
    try:
        version = np.lib.format.read_magic(handle)
        if version == (1, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(handle)
        elif version == (2, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(handle)
        else:
            raise ValueError(f"unsupported .npy version {version}")
    except Exception as exc:  # numpy parses the header with tokenize and literal_eval: any of their errors
        raise StoreError(f"{path} is not a readable .npy file: {exc}") from exc
    return tuple(shape), bool(fortran), dtype, handle.tell()


def _check_npy(
    path: Path,
    spec: Mapping[str, Any],
    chunk_rows: list[int] | None,
    *,
    full: bool,
    advance: Callable[[int], None] | None = None,
) -> list[str]:
    """Problems of one stored array file (empty: intact).

    Always: the file exists, its header parses and is the recorded one (digest), shape and dtype are as recorded,
    C order, and the size is exactly header + data. With `full` and recorded checksums, the SHA-256 of each
    shard's rows (calling `advance` with the bytes read, for progress).
    """
    try:
        handle = open_regular_file(path)
    except OSError as exc:
        return [f"{path.name}: cannot open ({exc.strerror or exc})"]
    with handle:
        try:
            shape, fortran, dtype, offset = npy_header(handle, path)
        except StoreError as exc:
            return [f"{path.name}: no readable .npy header ({exc.__cause__ or exc})"]
        want_shape, want_dtype = tuple(spec["shape"]), np.dtype(spec["dtype"])
        if shape != want_shape or dtype != want_dtype or (fortran and len(shape) > 1):
            order = ", Fortran order" if fortran and len(shape) > 1 else ""
            return [
                f"{path.name}: holds shape {shape} dtype {dtype}{order} but meta.json records {want_shape} {want_dtype}"
            ]
        handle.seek(0)
        header = handle.read(offset)
        recorded = spec.get("header_sha256")
        if recorded is not None and hashlib.sha256(header).hexdigest() != recorded:
            return [f"{path.name}: the .npy header changed since it was written (checksum mismatch)"]
        expected = offset + _row_bytes(spec) * int(want_shape[0])
        size = os.fstat(handle.fileno()).st_size
        if size != expected:
            return [
                f"{path.name}: {size:,} bytes on disk but its shape and dtype need {expected:,} (truncated or padded)"
            ]
        digests = spec.get("sha256")
        if not full or digests is None or chunk_rows is None:
            return []
        problems: list[str] = []
        row_bytes, first = _row_bytes(spec), 0
        view = memoryview(bytearray(min(_VERIFY_BLOCK, max(chunk_rows, default=0) * row_bytes)))
        for rows, recorded_digest in zip(chunk_rows, digests, strict=True):
            digest, left = hashlib.sha256(), rows * row_bytes
            while left:
                got = handle.readinto(view[: min(left, len(view))])
                if not got:
                    break
                digest.update(view[:got])
                left -= got
                if advance is not None:
                    advance(got)
            if digest.hexdigest() != recorded_digest:
                problems.append(f"{path.name}: rows {first:,}-{first + rows - 1:,} changed since they were written")
            first += rows
        return problems


# ----------------------------------------------------------------------------------------------- metadata checks
def _check_spec(name: str, spec: object, where: str, chunks: int | None) -> dict[str, Any]:
    """One array's record in meta.json: shape (non-negative ints), a plain numeric dtype, optional checksums."""
    if not isinstance(spec, dict):
        raise StoreError(f"{where}: the record of array {name!r} is not a JSON object")
    shape = spec.get("shape")
    if not (
        isinstance(shape, list)
        and shape
        and all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in shape)
    ):
        raise StoreError(f"{where}: array {name!r} has an invalid shape {shape!r}")
    text = spec.get("dtype")
    try:
        dtype = np.dtype(text) if isinstance(text, str) else None
    except Exception:  # numpy parses dtype strings with its own grammar: any of its errors
        dtype = None
    if dtype is None or not _plain_dtype(dtype):
        raise StoreError(
            f"{where}: array {name!r} has an invalid dtype {str(text)[:60]!r} (a store holds booleans, integers and "
            "floats in native byte order)"
        )
    digests = spec.get("sha256")
    if digests is not None and not (
        isinstance(digests, list) and len(digests) == chunks and all(isinstance(d, str) for d in digests)
    ):
        raise StoreError(f"{where}: array {name!r} has a malformed checksum list")
    return spec


def _check_meta(meta: dict[str, Any], path: Path) -> dict[str, Any]:
    """A store entry's meta.json, checked for everything the store reads from it; StoreError naming the problem."""
    where = str(path)
    fmt = meta.get("format")
    if fmt not in _READABLE_FORMATS:
        if isinstance(fmt, int) and fmt > FORMAT_VERSION:
            raise StoreError(f"{where}: written by a newer oodbench (store format {fmt}); upgrade oodbench to read it")
        raise StoreError(f"{where}: not a store entry's meta.json (format {fmt!r})")
    for key in ("model_id", "dataset_id"):
        if not isinstance(meta.get(key), str):
            raise StoreError(f"{where}: {key} is missing or not a string")
    for key in ("num_items", "shard_size", "num_shards"):
        value = meta.get(key)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise StoreError(f"{where}: {key} is missing or not a non-negative integer ({value!r})")
    if not isinstance(meta.get("complete", False), bool):
        raise StoreError(f"{where}: complete must be true or false")
    if not meta.get("complete"):
        return meta
    arrays, rows = meta.get("arrays"), meta.get("num_rows")
    if not isinstance(arrays, dict):
        raise StoreError(f"{where}: the entry is marked complete but lists no arrays")
    if not isinstance(rows, int) or isinstance(rows, bool) or rows < 0:
        raise StoreError(f"{where}: num_rows is missing or not a non-negative integer ({rows!r})")
    chunk_rows = meta.get("checksum_rows")
    if chunk_rows is not None and not (
        isinstance(chunk_rows, list)
        and all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in chunk_rows)
        and sum(chunk_rows) == rows
    ):
        raise StoreError(f"{where}: checksum_rows is malformed")
    chunks = None if chunk_rows is None else len(chunk_rows)
    for name, spec in arrays.items():
        _check_array_name(name, where)
        spec = _check_spec(name, spec, where, chunks)
        if spec["shape"][0] != rows:
            raise StoreError(f"{where}: array {name!r} has {spec['shape'][0]} rows but num_rows is {rows}")
    if rows and "features" not in arrays:
        raise StoreError(f"{where}: the entry has {rows} rows but no features array")
    if "features" in arrays and (len(arrays["features"]["shape"]) != 2 or arrays["features"]["shape"][1] < 1):
        raise StoreError(
            f"{where}: features must be 2-D (N, D) with D >= 1; meta.json records {arrays['features']['shape']}"
        )
    return meta


# ----------------------------------------------------------------------------------------------- write locks
class _HeldLock:
    """The flock on one lock file, shared by the writers of its entry in this process (only the newest writes)."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path, self.fd, self.token = path, fd, 0
        self.mutex = threading.RLock()  # held by each write operation, so a newer writer waits for it to end


_HELD: dict[Path, _HeldLock] = {}
# Re-entrant: a writer collected by the garbage collector releases its lock from whatever code runs at that moment,
# which may be this module holding the guard.
_HELD_GUARD = threading.RLock()


def _forget_inherited_locks() -> None:
    """In a forked child (e.g. a data-loader worker): drop the parent's lock files, so its death releases them."""
    global _HELD_GUARD
    _HELD_GUARD = threading.RLock()
    for held in _HELD.values():
        with contextlib.suppress(OSError):
            os.close(held.fd)
        held.fd = -1
    _HELD.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_inherited_locks)


def _holder(path: Path) -> dict[str, Any] | None:
    """The holder record a writer left in a lock file (pid, host, since, command), or None."""
    try:
        record = json.loads(read_regular(path, 2**16).decode("utf-8") or "null")
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def _describe_holder(record: dict[str, Any] | None) -> str:
    if record is None:
        return "another process (its lock file names no holder)"
    if record.get("pid") == os.getpid() and record.get("host") == socket.gethostname():
        return "this process"
    text = f"pid {record.get('pid')} on {record.get('host')} since {record.get('since')}"
    if record.get("command"):
        text += f" ({record['command']})"
    return text


def _live_holder(path: Path) -> dict[str, Any] | None:
    """The holder record when its process still runs (on this host; elsewhere we cannot tell, so assume it does)."""
    record = _holder(path)
    if record is None or not isinstance(record.get("pid"), int):
        return None
    if record.get("host") != socket.gethostname():
        return record
    try:
        os.kill(record["pid"], 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        return record
    return record


def _flock(path: Path, what: str, wait: float | None) -> int:
    """An fd of `path` holding an exclusive flock; waits up to `wait` seconds (None: for ever), then StoreError."""
    deadline = None if wait is None else time.monotonic() + max(0.0, wait)
    while True:
        # The lock file is opened in its folder's descriptor, taken without following a link: a model folder
        # planted as a link to a folder elsewhere never gets a lock file created in it.
        _real_folder(path.parent.parent, (path.parent.name,))
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            folder = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as exc:  # ELOOP: a link put in the folder's place after the check
            raise StoreError(f"cannot write {what}: cannot open its lock file {path} ({exc.strerror or exc})") from None
        try:
            fd = _try_flock(path, folder, what)
        finally:
            os.close(folder)
        if fd is not None:
            return fd
        if deadline is not None and time.monotonic() >= deadline:
            holder = _describe_holder(_holder(path))
            if holder == "this process":
                holder += " (in another thread)"
            waited = f" (waited {wait:g} s)" if wait else ""
            raise StoreError(
                f"{what} is being written by {holder}{waited}; wait for it to finish or stop it, then rerun"
            )
        time.sleep(0.05)


def _try_flock(path: Path, folder: int, what: str) -> int | None:
    """One try of `_flock` in the open folder `folder`: the fd holding the lock, or None when another holds it."""
    import fcntl

    while True:
        try:
            fd = open_regular(path.name, os.O_RDWR | os.O_CREAT, 0o666, dir_fd=folder)  # a link is never truncated
        except OSError as exc:
            raise StoreError(f"cannot write {what}: cannot open its lock file {path} ({exc.strerror or exc})") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        except OSError as exc:  # e.g. a network filesystem without locks (ENOLCK)
            os.close(fd)
            raise StoreError(f"cannot write {what}: cannot lock {path} ({exc.strerror or exc})") from None
        # The lock file could have been deleted by hand between open and flock: lock the file now at `path`.
        try:
            same = os.path.samestat(os.fstat(fd), os.stat(path.name, dir_fd=folder, follow_symlinks=False))
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)
    record = {"pid": os.getpid(), "host": socket.gethostname(), "since": _now(), "command": _command_line()}
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps(record).encode(), 0)
    return fd


def _acquire(path: Path, what: str, wait: float | None) -> tuple[_HeldLock, int]:
    """The lock of `path` and this writer's token; a writer of the same entry in this process is superseded."""
    with _HELD_GUARD:
        held = _HELD.get(path)
        if held is not None:
            with held.mutex:  # an operation of the older writer in progress ends first
                held.token += 1
                return held, held.token
    fd = _flock(path, what, wait)
    with _HELD_GUARD:
        held = _HELD[path] = _HeldLock(path, fd)
        held.token = 1
        return held, 1


def _release(held: _HeldLock, token: int) -> None:
    """Release the lock if `token` is its current holder (a superseded writer's release does nothing)."""
    import fcntl

    with _HELD_GUARD, held.mutex:
        if held.token != token or held.fd < 0:
            return
        with contextlib.suppress(OSError):
            os.ftruncate(held.fd, 0)  # no stale holder record once released
            fcntl.flock(held.fd, fcntl.LOCK_UN)
        with contextlib.suppress(OSError):
            os.close(held.fd)
        held.fd = -1
        if _HELD.get(held.path) is held:
            del _HELD[held.path]


@contextlib.contextmanager
def _locked(path: Path, what: str, wait: float | None) -> Iterator[None]:
    """Hold an entry's write lock for a short operation (delete, head write)."""
    held, token = _acquire(path, what, wait)
    try:
        yield
    finally:
        _release(held, token)


@dataclass
class Verification:
    """What `Store.verify` found for one entry (or head): bytes read, problems, whether checksums were recorded."""

    entry: str
    nbytes: int = 0
    problems: list[str] = field(default_factory=list)
    checksums: bool = True

    @property
    def ok(self) -> bool:
        """True when nothing is damaged."""
        return not self.problems


@dataclass(frozen=True)
class EntryKey:
    """A (model-id, dataset-id) pair naming one store entry."""

    model_id: str
    dataset_id: str

    def __str__(self) -> str:
        return f"{self.model_id}/{self.dataset_id}"


class Store:
    """A feature store rooted at a directory; one entry per (model-id, dataset-id).

    ``Store(path)`` of a pack directory (a folder with a pack's ``manifest.json``) is a read-only `PackStore`
    over it (`oodbench.core.pack`), so whatever reads a store reads a pack without importing it.
    """

    # What to do about a damaged entry: a pack's says how to get its files again.
    damage_remedy = "extract it again (`oodbench store verify` lists every damaged array)"

    def __new__(cls, root: str | os.PathLike[str] | None = None, *args: Any, **kwargs: Any) -> Store:
        if cls is Store and root is not None:
            from .pack import PackStore, is_pack

            if is_pack(root):
                return super().__new__(PackStore)
        return super().__new__(cls)

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)

    def __repr__(self) -> str:
        return f"Store({str(self.root)!r})"

    # ----------------------------------------------------------------- paths and listing
    def entry_path(self, model_id: str, dataset_id: str) -> Path:
        """Directory of one (model, dataset) entry; StoreError when it or its model folder is a link, not a folder."""
        return _real_folder(self.root, (_check_name("model id", model_id), _check_name("dataset id", dataset_id)))

    def lock_path(self, model_id: str, dataset_id: str) -> Path:
        """The entry's lock file: beside the entry, so deleting the entry never deletes a held lock."""
        return self._model_path(model_id) / f".{_check_name('dataset id', dataset_id)}.lock"

    def _model_path(self, model_id: str) -> Path:
        """The model's folder, refused when it is a link or not a folder (see `_real_folder`)."""
        return _real_folder(self.root, (_check_name("model id", model_id),))

    def _head_path(self, model_id: str) -> Path:
        """The model's head folder, refused when it or the model's folder is a link or not a folder."""
        return _real_folder(self.root, (_check_name("model id", model_id), "head"))

    def models(self) -> list[str]:
        """Model ids present in the store (a link among them is listed, and refused when it is read)."""
        if not self.root.is_dir():
            return []
        return sorted(p.name for p in self.root.iterdir() if p.is_dir() and not p.name.startswith("."))

    def datasets(self, model_id: str) -> list[str]:
        """Dataset ids with a meta.json under a model (complete or not); StoreError for a linked model folder."""
        model_dir = self._model_path(model_id)
        if not model_dir.is_dir():
            return []
        return sorted(p.name for p in model_dir.iterdir() if (p / "meta.json").is_file() and p.name != "head")

    def exists(self, model_id: str, dataset_id: str) -> bool:
        """True when the entry is complete (finalized) and readable."""
        if not (self.entry_path(model_id, dataset_id) / "meta.json").is_file():
            return False
        return bool(self.meta(model_id, dataset_id).get("complete"))

    def meta(self, model_id: str, dataset_id: str) -> dict[str, Any]:
        """The entry's meta.json, checked to be well formed and to belong to this (model, dataset)."""
        path = self.entry_path(model_id, dataset_id)
        if not (path / "meta.json").is_file():
            if not self.root.is_dir():
                what = "is not a directory" if self.root.exists() else "does not exist"
                raise StoreError(f"the store {self.root} {what} (no store entry {model_id}/{dataset_id})")
            known = self.datasets(model_id)
            hint = (
                f"; datasets stored for {model_id!r}: {', '.join(known)}"
                if known
                else f"; models in store: {', '.join(self.models()) or 'none'}"
            )
            raise StoreError(f"no store entry {model_id}/{dataset_id} under {self.root}{hint}")
        meta = _check_meta(_read_json(path / "meta.json"), path / "meta.json")
        if meta.get("model_id") != model_id or meta.get("dataset_id") != dataset_id:
            raise StoreError(
                f"{path} holds {meta.get('model_id')}/{meta.get('dataset_id')}, not {model_id}/{dataset_id}: "
                "the directory was copied or renamed from another model/dataset; re-extract it"
            )
        return meta

    def describe_incomplete(self, model_id: str, dataset_id: str) -> str:
        """What an unfinished entry holds, whether it is being written now, and how to finish it (one line)."""
        meta = self.meta(model_id, dataset_id)
        shard_dir = _real_folder(self.entry_path(model_id, dataset_id), ("shards",))
        num_shards, num_items = meta["num_shards"], meta["num_items"]
        merge = shard_dir / _MERGE_STATE
        if merge.is_file():
            try:
                state = validate(_MERGE_RECORD, _read_json(merge))
                merged = sum(spec["copied"] == num_shards for spec in state["arrays"].values())
                text = (
                    f"interrupted while finalizing: all {num_shards} shards written, {merged} of "
                    f"{len(state['arrays'])} arrays merged into their final files"
                )
            except (StoreError, SchemaError):
                text = f"interrupted while finalizing (its progress record {merge} is unreadable)"
        else:
            done = EntryWriter._done_shards(shard_dir)
            rows = sum(record["rows"] for record in done.values())
            text = f"{len(done)} of {num_shards} shards written ({rows:,} rows of {num_items:,} items)"
            if num_shards and len(done) == num_shards:
                text += ", not yet finalized"
        holder = _live_holder(self.lock_path(model_id, dataset_id))
        if holder is not None:
            return f"{text}; being written now by {_describe_holder(holder)}"
        command = meta.get("command")
        redo = "nothing is recomputed" if merge.is_file() else "only the missing shards are computed"
        how = f"rerun `{command}`" if isinstance(command, str) and command else "rerun the command that started it"
        return f"{text}; to finish it, {how} ({redo})"

    # ----------------------------------------------------------------- writing
    def writer(
        self,
        model_id: str,
        dataset_id: str,
        *,
        provenance: Mapping[str, Any],
        num_items: int,
        shard_size: int,
        item_hash: str | None = None,
        content: str | None = None,
        wait: float | None = 0.0,
    ) -> EntryWriter:
        """Open (or resume) an entry for sharded writing under its write lock; refuses to mix different inputs.

        `content` identifies the writer's data when it is known up front (`write_outputs` passes a digest of
        its arrays); a resume with another content is refused. `wait`: seconds to wait for another process
        writing the entry (None: as long as it takes); after that, a StoreError names the holder.
        """
        return EntryWriter(
            self,
            model_id,
            dataset_id,
            provenance=provenance,
            num_items=num_items,
            shard_size=shard_size,
            item_hash=item_hash,
            content=content,
            wait=wait,
        )

    def write_outputs(
        self,
        model_id: str,
        dataset_id: str,
        outputs: Outputs,
        *,
        provenance: Mapping[str, Any],
        shard_size: int = 65536,
        item_hash: str | None = None,
        overwrite: bool = False,
        wait: float | None = 0.0,
    ) -> Path:
        """Write a whole in-memory `Outputs` as a complete entry (sharded, atomic, locked).

        Rerunning with the same data resumes or does nothing; with other data it is refused unless `overwrite`.
        """
        if len(outputs) == 0:
            # Checked before anything touches the disk: a zero-row entry would have no shard to define its arrays.
            raise StoreError(f"{model_id}/{dataset_id}: the outputs have no rows; an entry needs at least one")
        n = len(outputs)
        arrays: dict[str, np.ndarray] = {"features": outputs.features, "index": np.arange(n)}
        if outputs.logits is not None:
            arrays["logits"] = outputs.logits
        if outputs.labels is not None:
            arrays["labels"] = outputs.labels
        for name, value in outputs.extras.items():
            arrays[_EXTRA + name] = value
        writer = EntryWriter(
            self,
            model_id,
            dataset_id,
            provenance=provenance,
            num_items=n,
            shard_size=shard_size,
            item_hash=item_hash,
            content=_content_digest(arrays),
            wait=wait,
            replace=overwrite,
        )
        with writer:
            for shard in writer.pending_shards():
                rows = writer.shard_rows(shard)
                writer.write_shard(shard, {name: value[rows] for name, value in arrays.items()})
            writer.finalize()
        return self.entry_path(model_id, dataset_id)

    def delete(self, model_id: str, dataset_id: str, *, wait: float | None = 0.0) -> None:
        """Remove an entry if present (under its write lock: never while another process writes it; no link followed)."""
        path = self.entry_path(model_id, dataset_id)
        if not os.path.lexists(path):
            return
        with _locked(self.lock_path(model_id, dataset_id), f"store entry {model_id}/{dataset_id}", wait):
            _remove_folder(self.entry_path(model_id, dataset_id).parent, dataset_id)  # checked again, under the lock

    def delete_head(self, model_id: str) -> None:
        """Remove the model's head if present (under the head's lock; no link followed)."""
        model_dir = self._model_path(model_id)
        if not os.path.lexists(model_dir / "head"):
            return
        with _locked(model_dir / ".head.lock", f"the head of {model_id}", 600.0):
            _remove_folder(self._model_path(model_id), "head")  # checked again, under the lock

    def delete_model(self, model_id: str) -> None:
        """Remove every entry and the head of a model, each under its lock, then its folder (no link followed)."""
        for dataset_id in self.datasets(model_id):
            self.delete(model_id, dataset_id)
        self.delete_head(model_id)
        _remove_folder(self.root, _check_name("model id", model_id))

    # ----------------------------------------------------------------- reading
    def read(
        self, model_id: str, dataset_id: str, *, mmap: bool = True, check_finite: bool = True, verify: bool = False
    ) -> Outputs:
        """The entry as `Outputs`, memory-mapped; raises StoreError if incomplete or damaged.

        Every read checks each file's size, header, shape and dtype; `verify` also hashes every byte against the
        checksums recorded when the entry was written.
        """
        key = f"{model_id}/{dataset_id}"
        meta, arrays = self._consistent_read(model_id, dataset_id, mmap, verify)
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
            raise StoreError(f"store entry {key} holds invalid arrays: {exc}") from exc

    def _consistent_read(
        self, model_id: str, dataset_id: str, mmap: bool, verify: bool
    ) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        """meta.json and every array of one generation of the entry, even while a writer overwrites it.

        The metadata and each file's (size, mtime, inode) are taken before and after the arrays are opened; when
        either moved (a writer replaced the entry meanwhile), the read starts again, so the arrays never mix two
        writers' data, nor one writer's arrays with another's metadata.
        """
        key = f"{model_id}/{dataset_id}"
        for _ in range(_READ_ATTEMPTS):
            stamps = self.file_stamps(model_id, dataset_id)
            meta = self.meta(model_id, dataset_id)
            if not meta.get("complete"):
                raise StoreError(f"store entry {key} is incomplete: {self.describe_incomplete(model_id, dataset_id)}")
            try:
                if verify:
                    self._raise_damage(self.verify(model_id, dataset_id))
                arrays = {name: self._load(model_id, dataset_id, name, meta, mmap) for name in meta["arrays"]}
                problem = None
            except StoreError as exc:
                problem = exc
            try:
                same = self.file_stamps(model_id, dataset_id) == stamps and self.meta(model_id, dataset_id) == meta
            except StoreError:
                same = False
            if same:
                if problem is not None:
                    raise problem
                return meta, arrays
        raise StoreError(
            f"store entry {key} changed while it was read, {_READ_ATTEMPTS} times (is it being overwritten?); "
            "read it again once its writer has finished"
        )

    def entry_provenance(self, model_id: str, dataset_id: str, meta: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Where an entry's outputs come from (plain JSON): model id, dataset, checkpoint, preprocessing, store,
        item hash, rows, the entry's provenance and the head's. A detector fitted on them records it."""
        meta = self.meta(model_id, dataset_id) if meta is None else meta
        entry = dict(meta.get("provenance") or {})
        provenance: dict[str, Any] = {key: entry.get(key) for key in PROVENANCE_KEYS}
        provenance.update(
            {
                "model_id": model_id,
                "dataset": dataset_id,
                "store": str(self.root.resolve()),
                "item_hash": meta.get("item_hash"),
                "num_rows": meta.get("num_rows"),
                "entry_finished": meta.get("finished"),
                "entry_provenance": entry,
                "head": self.head_meta(model_id).get("provenance") if self.has_head(model_id) else None,
            }
        )
        return json.loads(json.dumps(provenance, default=str))

    def read_array(self, model_id: str, dataset_id: str, name: str, *, mmap: bool = True) -> np.ndarray:
        """One named array of a complete entry (e.g. ``index``)."""
        meta = self.meta(model_id, dataset_id)
        if not meta.get("complete"):
            raise StoreError(
                f"store entry {model_id}/{dataset_id} is incomplete: {self.describe_incomplete(model_id, dataset_id)}"
            )
        if name not in meta["arrays"]:
            raise StoreError(
                f"store entry {model_id}/{dataset_id} has no array {name!r}; it has {sorted(meta['arrays'])}"
            )
        return self._load(model_id, dataset_id, name, meta, mmap)

    def _load(self, model_id: str, dataset_id: str, name: str, meta: Mapping[str, Any], mmap: bool) -> np.ndarray:
        path = self.entry_path(model_id, dataset_id) / f"{name}.npy"
        problems = _check_npy(path, meta["arrays"][name], meta.get("checksum_rows"), full=False)
        if problems:
            raise StoreError(f"store entry {model_id}/{dataset_id} is damaged: {problems[0]}")
        return _load_npy(path, mmap)

    @classmethod
    def _raise_damage(cls, result: Verification) -> None:
        if result.problems:
            more = f" (and {len(result.problems) - 1} more)" if len(result.problems) > 1 else ""
            raise StoreError(f"store entry {result.entry} is damaged: {result.problems[0]}{more}; {cls.damage_remedy}")

    # ----------------------------------------------------------------- verification
    def verify(self, model_id: str, dataset_id: str, *, advance: Callable[[int], None] | None = None) -> Verification:
        """Check every byte of a complete entry against the checksums recorded when it was written.

        `advance` is called with the number of bytes hashed as the check goes (for a progress bar).
        """
        meta = self.meta(model_id, dataset_id)
        result = Verification(f"{model_id}/{dataset_id}")
        if not meta.get("complete"):
            raise StoreError(
                f"store entry {result.entry} is incomplete: {self.describe_incomplete(model_id, dataset_id)}"
            )
        result.checksums = meta.get("checksum_rows") is not None and all(
            "sha256" in spec for spec in meta["arrays"].values()
        )
        for name, spec in meta["arrays"].items():
            path = self.entry_path(model_id, dataset_id) / f"{name}.npy"
            result.problems += _check_npy(path, spec, meta.get("checksum_rows"), full=True, advance=advance)
            result.nbytes += _file_size(path)
        return result

    def file_stamps(self, model_id: str, dataset_id: str) -> list[list[Any]]:
        """(name, size, mtime in ns, inode) of each array file of an entry (``dataset_id="head"``: the head's).

        Cheap to take: a run directory records them with a verification, so that a file changed since (a flipped
        byte changes the modification time) is verified again.
        """
        folder = _real_folder(self.root, (_check_name("model id", model_id), _check_name("dataset id", dataset_id)))
        stamps: list[list[Any]] = []
        for path in sorted(folder.glob("*.npy")):
            try:
                info = os.lstat(path)
            except FileNotFoundError:  # removed meanwhile (an overwrite): a different set of stamps
                stamps.append([path.name, None, None, None])
                continue
            stamps.append([path.name, info.st_size, info.st_mtime_ns, info.st_ino])
        return stamps

    def verify_head(self, model_id: str, *, advance: Callable[[int], None] | None = None) -> Verification:
        """Check every byte of the model's stored head against its recorded checksums (`advance` as in `verify`)."""
        path = self._head_path(model_id)
        meta = _read_json(path / "meta.json")
        result = Verification(f"{model_id}/head")
        specs = self._head_specs(model_id, meta)
        result.checksums = specs is not None
        for name in ("weight", "bias"):
            file = path / f"{name}.npy"
            if specs is None:
                try:
                    _load_npy(file, True)
                except (OSError, ValueError, StoreError) as exc:
                    result.problems.append(f"{file.name}: {exc}")
            else:
                result.problems += _check_npy(file, specs[name], [specs[name]["shape"][0]], full=True, advance=advance)
            result.nbytes += _file_size(file)
        return result

    # ----------------------------------------------------------------- heads
    def write_head(self, model_id: str, head: Head, *, provenance: Mapping[str, Any]) -> Path:
        """Store the model's linear head (weight, bias) with its provenance and checksums (under the head's lock)."""
        path = self._head_path(model_id)
        arrays: dict[str, Any] = {}
        # Head writes take milliseconds: wait for another writer of the same head rather than fail.
        with _locked(path.parent / ".head.lock", f"the head of {model_id}", 600.0):
            path = self._head_path(model_id)  # checked again under the lock: a link put there meanwhile is refused
            for name, value in (("weight", head.weight), ("bias", head.bias)):
                array = _storable(np.asarray(value), name)
                atomic_save_npy(path / f"{name}.npy", array)
                arrays[name] = {
                    "shape": list(array.shape),
                    "dtype": str(array.dtype),
                    "header_sha256": _header_digest(path / f"{name}.npy"),
                    "sha256": [_data_digest(array)],
                }
            atomic_write_json(
                path / "meta.json",
                {
                    "format": FORMAT_VERSION,
                    "model_id": model_id,
                    "provenance": dict(provenance),
                    "num_classes": head.num_classes,
                    "num_features": head.num_features,
                    "arrays": arrays,
                    "written": _now(),
                    "versions": library_versions(),
                },
            )
        return path

    def has_head(self, model_id: str) -> bool:
        """True when a head is stored for the model (a head folder that is a link counts: reading it is refused)."""
        head = self._model_path(model_id) / "head"
        return head.is_symlink() or (head / "meta.json").is_file()

    def read_head(self, model_id: str, *, verify: bool = False) -> Head:
        """The model's stored head (sizes, headers, shapes and dtypes checked; every byte with `verify`)."""
        path = self._head_path(model_id)
        meta = _read_json(path / "meta.json")
        if meta.get("model_id") != model_id:
            raise StoreError(f"{path} holds the head of {meta.get('model_id')!r}, not {model_id!r}")
        specs = self._head_specs(model_id, meta)
        if verify:
            self._raise_damage(self.verify_head(model_id))
        elif specs is not None:
            for name in ("weight", "bias"):
                problems = _check_npy(path / f"{name}.npy", specs[name], None, full=False)
                if problems:
                    raise StoreError(f"the head of {model_id} is damaged: {problems[0]}")
        try:
            return Head(_load_npy(path / "weight.npy", False), _load_npy(path / "bias.npy", False))
        except (OSError, ValueError, StoreError) as exc:
            raise StoreError(f"cannot read head of {model_id}: {exc}") from exc

    @staticmethod
    def _head_specs(model_id: str, meta: Mapping[str, Any]) -> dict[str, dict[str, Any]] | None:
        """The head's recorded array specs (None for heads written without checksums), checked."""
        arrays = meta.get("arrays")
        if arrays is None:
            return None
        where = f"the head meta.json of {model_id}"
        if not isinstance(arrays, dict) or set(arrays) != {"weight", "bias"}:
            raise StoreError(f"{where}: arrays must list weight and bias")
        specs = {name: _check_spec(name, arrays[name], where, 1) for name in ("weight", "bias")}
        if len(specs["weight"]["shape"]) != 2 or specs["bias"]["shape"] != specs["weight"]["shape"][:1]:
            raise StoreError(f"{where}: weight (C, D) and bias (C,) shapes disagree")
        return specs

    def head_meta(self, model_id: str) -> dict[str, Any]:
        """The stored head's meta.json."""
        return _read_json(self._head_path(model_id) / "meta.json")

    # ----------------------------------------------------------------- provenance
    def check_compatible(self, *entries: tuple[str, str]) -> None:
        """Raise StoreError unless all (model-id, dataset-id) entries come from the same checkpoint and preprocessing."""
        if len(entries) < 2:
            return
        reference_key = entries[0]
        reference = self.meta(*reference_key).get("provenance", {})
        for key in entries[1:]:
            other = self.meta(*key).get("provenance", {})
            for field_name in PROVENANCE_KEYS:
                if _get(reference, field_name) != _get(other, field_name):
                    raise StoreError(
                        f"mismatched model provenance: {reference_key[0]}/{reference_key[1]} has "
                        f"{field_name}={_get(reference, field_name)!r} but {key[0]}/{key[1]} has "
                        f"{field_name}={_get(other, field_name)!r}; ID and OOD sets of one evaluation must come "
                        "from the same checkpoint and preprocessing (re-extract one of them)"
                    )


def _get(mapping: object, key: str) -> Any:
    """mapping[key] when `mapping` is a dict (a malformed provenance reads as missing fields)."""
    return mapping.get(key) if isinstance(mapping, dict) else None


def _load_npy(path: Path, mmap: bool) -> np.ndarray:
    """An .npy array of a regular file reached without a link (memory-mapped read-only with `mmap`), no pickles.

    The header is checked against the opened file before anything is allocated or mapped (plain numeric dtype,
    C order, a size of exactly header + data), so a header declaring terabytes in a small file is one StoreError.
    """
    try:
        with open_regular_file(path) as handle:
            shape, fortran, dtype, offset = npy_header(handle, path)
            problem = _layout_problem(shape, fortran, dtype, offset, os.fstat(handle.fileno()).st_size)
            if problem is not None:
                raise StoreError(f"cannot read {path}: {problem}")
            if mmap and shape and 0 not in shape:  # mmap cannot map zero bytes
                return np.memmap(handle, dtype=dtype, mode="r", offset=offset, shape=shape)
            array = np.empty(shape, dtype)  # no larger than the file, checked above
            view = memoryview(array.reshape(-1).view(np.uint8))
            handle.seek(offset)
            filled = 0
            while filled < len(view):
                got = handle.readinto(view[filled:])
                if not got:
                    raise StoreError(f"cannot read {path}: it was truncated while it was read")
                filled += got
            return array
    except (OSError, ValueError) as exc:
        raise StoreError(f"cannot read {path}: {exc.strerror if isinstance(exc, OSError) else exc}") from exc


def _file_size(path: Path) -> int:
    """The size of a regular file (0 for anything else: a link is not followed)."""
    try:
        info = os.lstat(path)
    except OSError:
        return 0
    return info.st_size if stat.S_ISREG(info.st_mode) else 0


def _header_digest(path: Path) -> str:
    """SHA-256 of an .npy file's header (magic, version, shape and dtype record, padding)."""
    with open_regular_file(path) as handle:
        *_, offset = npy_header(handle, path)
        handle.seek(0)
        return hashlib.sha256(handle.read(offset)).hexdigest()


class EntryWriter:
    """Writes one entry shard by shard under the entry's write lock; rerunning skips complete shards.

    The lock is taken on creation and released by `finalize` or `close` (or when the process ends); use the
    writer as a context manager to release it on an error too.
    """

    def __init__(
        self,
        store: Store,
        model_id: str,
        dataset_id: str,
        *,
        provenance: Mapping[str, Any],
        num_items: int,
        shard_size: int,
        item_hash: str | None,
        content: str | None = None,
        wait: float | None = 0.0,
        replace: bool = False,
    ) -> None:
        if num_items < 0:
            raise StoreError(f"num_items must be >= 0; got {num_items}")
        if shard_size <= 0:
            raise StoreError(f"shard_size must be positive; got {shard_size}")
        self._held: _HeldLock | None = None
        self.store, self.model_id, self.dataset_id = store, model_id, dataset_id
        self.path = store.entry_path(model_id, dataset_id)
        self.shard_dir = self.path / "shards"
        self.num_items, self.shard_size = int(num_items), int(shard_size)
        self.num_shards = max(1, -(-self.num_items // self.shard_size)) if self.num_items else 0
        self.meta: dict[str, Any] = {
            "format": FORMAT_VERSION,
            "model_id": model_id,
            "dataset_id": dataset_id,
            "provenance": json.loads(json.dumps(dict(provenance), default=str)),
            "item_hash": item_hash,
            "content": content,
            "num_items": self.num_items,
            "shard_size": self.shard_size,
            "num_shards": self.num_shards,
            "complete": False,
        }
        self._held, self._token = _acquire(store.lock_path(model_id, dataset_id), f"store entry {self}", wait)
        try:
            self._check_folders()
            if replace:
                _remove_folder(self.path.parent, dataset_id)
            meta_path = self.path / "meta.json"
            if meta_path.is_file():
                existing = store.meta(model_id, dataset_id)
                for key in ("provenance", "item_hash", "content", "num_items", "shard_size"):
                    if existing.get(key) != self.meta[key]:
                        differs = (
                            "from other data (its arrays' digest differs from these arrays')"
                            if key == "content"
                            else f"with a different {key} ({existing.get(key)!r} vs {self.meta[key]!r})"
                        )
                        raise StoreError(
                            f"store entry {self} was started {differs}; delete it, overwrite it or use another "
                            "dataset id"
                        )
                self.meta = existing
            else:
                self.meta["started"] = _now()
                self.meta["command"] = _command_line()
                atomic_write_json(meta_path, self.meta)
        except BaseException:
            self.close()
            raise

    def __str__(self) -> str:
        return f"{self.model_id}/{self.dataset_id}"

    # ----------------------------------------------------------------- the lock
    def close(self) -> None:
        """Release the entry's write lock (finalize does it too); the writer cannot write afterwards."""
        held, self._held = self._held, None
        if held is not None:
            _release(held, self._token)

    def __enter__(self) -> EntryWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()

    @contextlib.contextmanager
    def _holding(self) -> Iterator[None]:
        """Hold the lock's in-process mutex for one write operation, refusing if this writer no longer holds it."""
        held = self._held
        if held is None:
            raise StoreError(f"this writer of store entry {self} is closed; open a new one to write")
        with held.mutex:
            if held.token != self._token or held.fd < 0:
                raise StoreError(
                    f"this writer of store entry {self} was superseded by a newer writer of the entry in this "
                    "process; write through that one"
                )
            yield

    def _check_folders(self) -> None:
        """Refuse (StoreError) when the model, entry or shard folder is a link or not a folder: none is followed.

        Called under the entry's lock before each act that reads or writes in them.
        """
        _real_folder(self.store.root, (self.model_id, self.dataset_id, "shards"))

    # ----------------------------------------------------------------- shards
    @property
    def complete(self) -> bool:
        """True once finalized."""
        return bool(self.meta.get("complete"))

    def shard_rows(self, shard: int) -> slice:
        """Item positions covered by a shard."""
        if not 0 <= shard < self.num_shards:
            raise StoreError(f"shard {shard} out of range [0, {self.num_shards})")
        return slice(shard * self.shard_size, min(self.num_items, (shard + 1) * self.shard_size))

    @staticmethod
    def _done_shards(shard_dir: Path) -> dict[int, dict[str, Any]]:
        done: dict[int, dict[str, Any]] = {}
        if not shard_dir.is_dir():
            return done
        for marker in shard_dir.glob("*.done.json"):
            try:
                record = validate(_SHARD_RECORD, json.loads(read_regular(marker, _JSON_LIMIT).decode("utf-8")))
                shard = int(marker.name.split(".")[0])
                arrays = record["arrays"]
                for name, spec in arrays.items():
                    _check_array_name(name, str(marker))
                    int(spec["nbytes"])
                int(record["rows"])
            except (OSError, ValueError, KeyError, TypeError, AttributeError, UnicodeDecodeError, StoreError):
                continue  # a damaged marker counts as absent: the shard is written again
            files_ok = all(
                (shard_dir / f"{name}.{shard:05d}.npy").is_file()
                and (shard_dir / f"{name}.{shard:05d}.npy").stat().st_size == spec["nbytes"]
                for name, spec in arrays.items()
            )
            if files_ok:
                done[shard] = record
        return done

    def completed_shards(self) -> set[int]:
        """Shards whose marker and files are all present and of the recorded size."""
        self._check_folders()
        if self.complete or self._merge_file.is_file():
            # Once finalize has drawn up its plan every shard is written (and may already be released).
            return set(range(self.num_shards))
        return set(self._done_shards(self.shard_dir))

    def pending_shards(self) -> list[int]:
        """Shards still to write, in order."""
        done = self.completed_shards()
        return [k for k in range(self.num_shards) if k not in done]

    def write_shard(
        self, shard: int, arrays: Mapping[str, np.ndarray], *, skipped: Iterable[Mapping[str, Any]] = ()
    ) -> None:
        """Atomically write one shard (each array's checksum recorded): every array file first, the marker last."""
        with self._holding():
            self._check_folders()
            if self.complete or self._merge_file.is_file():
                raise StoreError(f"store entry {self} is already finalized (or finalizing)")
            rows = self.shard_rows(shard)
            if "features" not in arrays:
                raise StoreError("a shard needs a 'features' array")
            n = int(np.asarray(arrays["features"]).shape[0])
            if n > rows.stop - rows.start:
                raise StoreError(f"shard {shard} covers {rows.stop - rows.start} items but got {n} rows")
            record: dict[str, Any] = {"rows": n, "arrays": {}, "skipped": list(skipped)}
            checked: dict[str, np.ndarray] = {}
            for name, value in arrays.items():  # every array checked before the first file is written
                if name != "features" and not name.startswith(_EXTRA) and name not in ("logits", "labels", "index"):
                    raise StoreError(
                        f"unknown array name {name!r}: use features, logits, labels, index or extra.<name>"
                    )
                _check_array_name(name, f"store entry {self}")
                checked[name] = _storable(np.asarray(value), name)
                if checked[name].shape[:1] != (n,):
                    raise StoreError(f"array {name!r} has {checked[name].shape[:1]} rows but features has {n}")
            for name, array in checked.items():
                nbytes = atomic_save_npy(self.shard_dir / f"{name}.{shard:05d}.npy", array)
                record["arrays"][name] = {
                    "shape": list(array.shape),
                    "dtype": str(array.dtype),
                    "nbytes": nbytes,
                    "sha256": _data_digest(array),
                }
            atomic_write_json(self.shard_dir / f"{shard:05d}.done.json", record)

    # ----------------------------------------------------------------- finalize
    def finalize(self, *, extra_meta: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Merge complete shards into one memory-mappable file per array, mark the entry complete, release the lock.

        Disk: each shard file is deleted as soon as it is copied, so the entry never needs much more than its own
        size plus one shard. Kill-safe: ``shards/merge.json`` records the plan and how many shards of each array
        are copied (written after the copy is on disk, before the shard is deleted); a rerun resumes from it.
        Each shard's rows are checked against the checksum recorded when it was written as they are copied.
        """
        with self._holding():
            self._check_folders()
            if self.complete:
                with contextlib.suppress(StoreError):  # what a finalize killed after completing left
                    _remove_folder(self.path, "shards")
            else:
                self._finalize(extra_meta)
        self.close()
        return self.meta

    def _finalize(self, extra_meta: Mapping[str, Any] | None) -> None:
        state = self._merge_state(extra_meta)
        _merge_step("planned")
        for name, spec in state["arrays"].items():
            self._merge(name, spec, state)
        plan = state["plan"]
        skipped = [item for k in range(self.num_shards) for item in plan[str(k)].get("skipped", [])]
        chunk_rows = [plan[str(k)]["rows"] for k in range(self.num_shards)]
        arrays: dict[str, Any] = {}
        for name, spec in state["arrays"].items():
            digests = [plan[str(k)]["arrays"][name].get("sha256") for k in range(self.num_shards)]
            arrays[name] = {"shape": spec["shape"], "dtype": spec["dtype"]}
            if all(digests):  # shards written before checksums were recorded leave the entry without them
                arrays[name]["sha256"] = digests
                arrays[name]["header_sha256"] = _header_digest(self.path / f"{name}.npy")
        self.meta.update(
            {
                "format": FORMAT_VERSION if all("sha256" in spec for spec in arrays.values()) else 1,
                "arrays": arrays,
                "num_rows": sum(chunk_rows),
                "skipped": skipped,
                "complete": True,
                "finished": _now(),
                "versions": library_versions(),
            }
        )
        if self.meta["format"] == FORMAT_VERSION:
            self.meta["checksum_rows"] = chunk_rows
        saved = state.get("extra_meta")
        extra = extra_meta if extra_meta is not None else saved
        if extra:
            self.meta.update(dict(extra))
        _merge_step("merged")
        atomic_write_json(self.path / "meta.json", self.meta)
        _merge_step("completed")
        with contextlib.suppress(StoreError):
            _remove_folder(self.path, "shards")

    @property
    def _merge_file(self) -> Path:
        return self.shard_dir / _MERGE_STATE

    def _merge_state(self, extra_meta: Mapping[str, Any] | None) -> dict[str, Any]:
        """The merge plan and progress: resumed from merge.json, or drawn up from the complete shards."""
        if os.path.lexists(self._merge_file):
            return self._checked_merge_state(_read_json(self._merge_file))
        done = self._done_shards(self.shard_dir)
        missing = [k for k in range(self.num_shards) if k not in done]
        if missing:
            raise StoreError(f"cannot finalize {self}: shards {missing[:10]} are not written")
        names = sorted({name for record in done.values() for name in record["arrays"]})
        total_rows = sum(record["rows"] for record in done.values())
        arrays: dict[str, Any] = {}
        for name in names:
            shapes = [done[k]["arrays"].get(name) for k in range(self.num_shards)]
            if any(spec is None for spec in shapes):
                raise StoreError(f"array {name!r} is missing from some shards of {self}")
            tails = {tuple(spec["shape"][1:]) for spec in shapes}
            dtypes = {spec["dtype"] for spec in shapes}
            if len(tails) != 1 or len(dtypes) != 1:
                raise StoreError(f"array {name!r} changes shape or dtype across shards: {tails} {dtypes}")
            arrays[name] = {"shape": [total_rows, *tails.pop()], "dtype": dtypes.pop(), "copied": 0}
        # The caller's extra metadata is kept with the plan, so that a rerun that resumes this merge keeps it.
        state = {"plan": {str(k): record for k, record in done.items()}, "arrays": arrays}
        if extra_meta:
            state["extra_meta"] = json.loads(json.dumps(dict(extra_meta), default=str))
        atomic_write_json(self._merge_file, state)
        return state

    def _checked_merge_state(self, state: dict[str, Any]) -> dict[str, Any]:
        """merge.json checked against its schema and against this entry (shards, rows, arrays) before use."""
        where = f"{self._merge_file}"
        try:
            validate(_MERGE_RECORD, state)
            plan, arrays = state["plan"], state["arrays"]
            if set(plan) != {str(k) for k in range(self.num_shards)}:
                raise SchemaError(f"plan: expected shards 0 to {self.num_shards - 1}, got {sorted(plan)[:5]}")
            rows = sum(record["rows"] for record in plan.values())
            for name, spec in arrays.items():
                _check_array_name(name, where)
                _check_spec(name, spec, where, None)
                if spec["copied"] > self.num_shards or spec["shape"][0] != rows:
                    raise SchemaError(f"arrays.{name}: copied or rows do not fit the plan")
                for k, record in plan.items():
                    part = record["arrays"].get(name)
                    if part is None or part["dtype"] != spec["dtype"] or part["shape"][1:] != spec["shape"][1:]:
                        raise SchemaError(f"plan.{k}: array {name!r} missing or of another shape or dtype")
        except (SchemaError, StoreError) as exc:
            raise StoreError(
                f"finalizing {self}: {where} is damaged ({exc}); delete the entry and extract it again"[:500]
            ) from None
        return state

    def _merge(self, name: str, spec: dict[str, Any], state: dict[str, Any]) -> None:
        """Append the shards of one array to `.<name>.npy.partial`, releasing each; rename it when complete.

        Steps per shard: copy its rows (truncating first whatever an interrupted copy left) while checking their
        checksum, fsync, record the count in merge.json, delete the shard file. A kill between any two steps
        leaves a state that the next run recognises: the file beyond the recorded count is cut off and copied again.
        """
        final, partial = self.path / f"{name}.npy", self.path / f".{name}.npy.partial"
        if spec["copied"] == self.num_shards and final.is_file() and not partial.exists():
            return
        dtype, shape = np.dtype(spec["dtype"]), tuple(spec["shape"])
        row_bytes = dtype.itemsize * int(np.prod(shape[1:], dtype=np.int64))
        plan = state["plan"]
        if spec["copied"] and not partial.exists():
            raise StoreError(
                f"finalizing {self}: {partial.name} is gone but {spec['copied']} of its "
                "shards were already released; delete the entry and extract it again"
            )
        for shard in range(spec["copied"]):  # copied and recorded, but a kill came before their release
            (self.shard_dir / f"{name}.{shard:05d}.npy").unlink(missing_ok=True)
        try:
            opened = open_regular_file(partial, "r+b" if os.path.lexists(partial) else "w+b")
        except OSError as exc:
            raise StoreError(f"finalizing {self}: cannot open {partial} ({exc.strerror or exc})") from None
        with opened as handle:
            handle.seek(0)
            np.lib.format.write_array_header_1_0(
                handle, {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False, "shape": shape}
            )
            header = handle.tell()
            rows_done = sum(plan[str(k)]["rows"] for k in range(spec["copied"]))
            handle.truncate(header + rows_done * row_bytes)
            for shard in range(spec["copied"], self.num_shards):
                source = self.shard_dir / f"{name}.{shard:05d}.npy"
                part = _load_npy(source, True)
                handle.seek(header + rows_done * row_bytes)
                step = max(1, _COPY_BYTES // max(1, row_bytes))
                digest = hashlib.sha256()
                for start in range(0, part.shape[0], step):
                    block = memoryview(np.ascontiguousarray(part[start : start + step])).cast("B")
                    digest.update(block)
                    handle.write(block)
                del part
                recorded = plan[str(shard)]["arrays"][name].get("sha256")
                if recorded is not None and digest.hexdigest() != recorded:
                    raise StoreError(
                        f"finalizing {self}: shard {shard} of {name} changed on disk after it was written (checksum "
                        "mismatch); delete the entry and extract it again"
                    )
                handle.flush()
                os.fsync(handle.fileno())
                rows_done += plan[str(shard)]["rows"]
                _merge_step(f"copied {name} {shard}")
                spec["copied"] = shard + 1
                atomic_write_json(self._merge_file, state)
                _merge_step(f"recorded {name} {shard}")
                source.unlink(missing_ok=True)
                _merge_step(f"released {name} {shard}")
        os.replace(partial, final)
        _merge_step(f"renamed {name}")


# Reads of an entry that a writer keeps replacing start again at most this many times.
_READ_ATTEMPTS = 5
# The merge's progress record inside the shard directory, and the bytes copied per write.
_MERGE_STATE = "merge.json"
_COPY_BYTES = 64 * 2**20


def _merge_step(step: str) -> None:
    """Hook between the merge's durable steps (tests inject failures here to check every interruption resumes)."""
