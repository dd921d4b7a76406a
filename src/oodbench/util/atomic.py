"""Files: atomic writes (a temporary name in the same directory, fsync, then rename), streamed digests, and
opening a file only when it is a regular file reached without a final symbolic link.

Every file oodbench opens inside a store, a run directory, an annotation project or a saved detector goes
through `open_regular` (or `read_regular`): a link planted there is never followed, and a FIFO or a device
is refused before anything is read from it or written to it.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import io
import json
import os
import stat
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

_UMASK = os.umask(0)
os.umask(_UMASK)


class UnsafeFileError(OSError):
    """A path that is a symbolic link, a FIFO, a device or a directory where a regular file belongs."""


def file_kind(mode: int) -> str:
    """What an st_mode is, in words: 'a directory', 'a FIFO (named pipe)', ... ('not a regular file' otherwise)."""
    for test, name in (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO (named pipe)"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISLNK, "a symbolic link"),
    ):
        if test(mode):
            return name
    return "not a regular file"


def open_regular(
    path: str | os.PathLike[str], flags: int = os.O_RDONLY, mode: int = 0o666, *, dir_fd: int | None = None
) -> int:
    """A descriptor of `path` when it is a regular file; a final symbolic link is never followed.

    The file is opened with ``O_NOFOLLOW`` and ``O_NONBLOCK`` (so that opening a FIFO cannot block) and checked
    with ``fstat`` on the opened descriptor, which no later rename can change; then made blocking again.
    With `dir_fd`, `path` is relative to that open directory (which a later rename of a folder cannot change).
    Raises `UnsafeFileError` (an `OSError` whose ``strerror`` says what the path is) for anything else.
    """
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, mode, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP or (exc.errno == errno.ENXIO and _exists(path, dir_fd)):
            try:
                kind = file_kind(os.stat(path, dir_fd=dir_fd, follow_symlinks=False).st_mode)
            except OSError:
                kind = "not a regular file"
            raise UnsafeFileError(errno.ELOOP, f"{kind}, not followed or opened", str(path)) from None
        raise
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise UnsafeFileError(errno.EINVAL, f"{file_kind(info.st_mode)}, not a regular file", str(path))
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _exists(path: str | os.PathLike[str], dir_fd: int | None) -> bool:
    try:
        os.stat(path, dir_fd=dir_fd)
    except OSError:
        return False
    return True


def open_regular_file(path: str | os.PathLike[str], mode: str = "rb") -> Any:
    """A binary file object of `path` opened through `open_regular` (``rb``, ``r+b`` or ``w+b``: created, truncated)."""
    flags = {"rb": os.O_RDONLY, "r+b": os.O_RDWR, "w+b": os.O_RDWR | os.O_CREAT}[mode]
    fd = open_regular(path, flags)
    if mode == "w+b":
        os.ftruncate(fd, 0)  # truncated only once known to be a regular file, never through a link
    return os.fdopen(fd, "rb" if mode == "rb" else "r+b")


def read_regular(path: str | os.PathLike[str], limit: int) -> bytes:
    """The bytes of a regular file (see `open_regular`) of at most `limit` bytes, the size checked before reading."""
    with open_regular_file(path) as handle:
        size = os.fstat(handle.fileno()).st_size
        if size > limit:
            raise UnsafeFileError(errno.EFBIG, f"{size:,} bytes, more than the {limit:,} allowed", str(path))
        data = handle.read(limit + 1)
    if len(data) > limit:  # grew while read
        raise UnsafeFileError(errno.EFBIG, f"more than the {limit:,} bytes allowed", str(path))
    return data


def read_file_bytes(path: str | os.PathLike[str], limit: int) -> bytes:
    """The bytes of a file a user named (a link is followed), read once; `ValueError` with one phrase when it is
    not a regular file, is larger than `limit`, or changed while it was read (its size or mtime moved)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise ValueError(f"cannot read it ({exc.strerror or exc})") from None
    before = os.fstat(fd)
    if not stat.S_ISREG(before.st_mode) or before.st_size > limit:
        os.close(fd)
        if not stat.S_ISREG(before.st_mode):
            raise ValueError(f"it is {file_kind(before.st_mode)}, not a regular file")
        raise ValueError(f"it is {before.st_size:,} bytes, more than the {limit:,} allowed")
    os.set_blocking(fd, True)
    with os.fdopen(fd, "rb") as handle:
        data = handle.read(limit + 1)
        after = os.fstat(fd)
    if len(data) > limit:
        raise ValueError(f"it grew beyond the {limit:,} bytes allowed while it was read")
    if (after.st_size, after.st_mtime_ns) != (before.st_size, before.st_mtime_ns) or len(data) != after.st_size:
        raise ValueError("it changed while it was read")
    return data


def read_text_file(path: str | os.PathLike[str], limit: int = 256 * 2**20) -> str:
    """A user's text file (a path they named; ``.gz`` decompressed), or `ValueError` with one phrase saying why not.

    The file must be regular (a FIFO or device is refused before reading; a link the user named is followed),
    at most `limit` bytes (decompressed too), and UTF-8 text.
    """
    import gzip
    import zlib

    data = read_file_bytes(path, limit)
    if str(path).lower().endswith(".gz"):
        try:
            with gzip.GzipFile(fileobj=io.BytesIO(data)) as unzipped:
                data = unzipped.read(limit + 1)
        except (OSError, EOFError, zlib.error) as exc:
            raise ValueError(f"it is not a readable gzip file ({exc})") from None
    if len(data) > limit:
        raise ValueError(f"it holds more than the {limit:,} bytes allowed")
    if b"\x00" in data:
        raise ValueError("it is a binary file, not text (it holds NUL bytes)")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"it is not UTF-8 text ({exc.reason} at byte {exc.start})") from None


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary path next to `path`; on success it is fsynced and renamed to `path`, on error removed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    # mkstemp creates 0600 files; give the result the permissions an ordinary open() would (0666 & ~umask).
    os.chmod(tmp, 0o666 & ~_UMASK)
    try:
        yield Path(tmp)
        with open(tmp, "rb+") as handle:
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def remove_stale_temporaries(paths: Sequence[str | os.PathLike[str]], before: float) -> None:
    """Delete the temporaries that killed `atomic_path` writes of these files left, if made before `before`.

    A temporary is never read as the file (its rename never happened); this only keeps folders clean. One made at
    or after `before` may belong to a write in progress elsewhere and is left. One scan per folder.
    """
    by_folder: dict[Path, set[str]] = {}
    for path in map(Path, paths):
        by_folder.setdefault(path.parent, set()).add(path.name)
    for folder, names in by_folder.items():
        try:
            entries = list(os.scandir(folder))
        except FileNotFoundError:
            continue
        for entry in entries:
            # atomic_path's naming: "." + the file's name + "." + mkstemp's random part + ".tmp"
            if not (entry.name.startswith(".") and entry.name.endswith(".tmp")):
                continue
            target = entry.name[1:-4].rpartition(".")[0]
            try:
                if target in names and entry.is_file(follow_symlinks=False) and entry.stat().st_mtime < before:
                    os.unlink(entry.path)
            except FileNotFoundError:  # removed by another writer meanwhile
                pass


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    """Write bytes atomically."""
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)


def atomic_write_text(path: str | os.PathLike[str], text: str) -> None:
    """Write UTF-8 text atomically."""
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | os.PathLike[str], payload: Mapping[str, Any] | list[Any]) -> None:
    """Write JSON (sorted keys, indented) atomically."""
    atomic_write_text(path, json.dumps(payload, indent=2, sort_keys=True, default=str) + "\n")


def atomic_save_npy(path: str | os.PathLike[str], array: np.ndarray) -> int:
    """Write an array as .npy atomically; return the file size in bytes."""
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as handle:
            np.lib.format.write_array(handle, np.ascontiguousarray(array), allow_pickle=False)
    return Path(path).stat().st_size


def unwritable(directory: str | os.PathLike[str]) -> str | None:
    """Why `directory` cannot be created or written to (one phrase), or None when it can; creates nothing.

    The nearest existing ancestor must be a directory in which a file can be made; that is tried for real
    (a temporary directory, removed at once), because permission bits do not tell about read-only or virtual
    filesystems such as /proc.
    """
    path = Path(directory).expanduser().absolute()
    existing = path
    while not existing.exists():
        if existing.is_symlink():
            return f"{existing} is a broken symbolic link"
        existing = existing.parent
    if not existing.is_dir():
        return f"{existing} is not a directory" if existing == path else f"{existing} is a file, not a directory"
    try:
        probe = tempfile.mkdtemp(prefix=".oodbench-write-check-", dir=existing)
    except OSError as exc:
        reason = (exc.strerror or str(exc)).lower()
        return f"cannot create {path} ({existing}: {reason})"
    os.rmdir(probe)
    return None


def sha256_file(path: str | os.PathLike[str], *, block: int = 16 * 2**20) -> str:
    """SHA-256 hex digest of a file, read in blocks (checkpoints and k-NN indexes can be gigabytes)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:  # checkpoints in the Hugging Face cache are links into its blobs
        for chunk in iter(lambda: handle.read(block), b""):
            digest.update(chunk)
    return digest.hexdigest()
