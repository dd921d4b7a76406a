"""Files: atomic writes (a temporary name in the same directory, fsync, then rename) and streamed digests."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

_UMASK = os.umask(0)
os.umask(_UMASK)


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
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(block), b""):
            digest.update(chunk)
    return digest.hexdigest()
