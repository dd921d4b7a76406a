"""Per-image detector scores of an evaluation run: `<run_dir>/scores/<model>/<dataset>.npz`, one array per detector.

A run directory can come from someone else (a tar archive keeps links and FIFOs), so the folders ``scores/`` and
``scores/<model>/`` are opened without following a link (a linked folder is refused before anything is written
or read through it), the score file is opened with ``O_NOFOLLOW | O_NONBLOCK`` and must be a regular file, and
every member's ``.npy`` header (a 1-D array of a plain numeric dtype) is checked against the member's size in the
zip directory and the file's real size before any array is allocated. A refusal is one `RunDirError` line.
"""

from __future__ import annotations

import errno
import os
import secrets
import stat
import struct
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from ..util.atomic import UnsafeFileError, open_regular
from .errors import RunDirError, StoreError
from .store import npy_header

__all__ = ["save_scores", "load_scores", "score_path", "list_scores"]

SCORES = "scores"
_LIMIT = 2**40  # bytes of one score file, checked before it is read (as for a saved detector's state)
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
# What np.load's failures on a damaged or hostile zip look like (zipfile raises all of these on bad input).
_ZIP_ERRORS = (
    OSError,
    ValueError,
    EOFError,
    RuntimeError,
    NotImplementedError,
    OverflowError,
    struct.error,
    zipfile.BadZipFile,
)


def score_path(run_dir: str | os.PathLike[str], model: str, dataset: str) -> Path:
    """Where the scores of one (model, dataset) live."""
    return Path(run_dir) / SCORES / model / f"{dataset}.npz"


def _component(name: str, what: str) -> str:
    """`name` when it is one path component (it becomes a folder or file name), else a RunDirError."""
    if not name or name in (".", "..") or "/" in name or "\x00" in name:
        raise RunDirError(f"{what} {name!r} cannot name a folder or file of a run directory")
    return name


def _open_folder(parent: int, name: str, shown: Path, *, create: bool) -> int | None:
    """A descriptor of the real directory `name` in `parent` (created when `create`); None when it is absent."""
    if create:
        try:
            os.mkdir(name, dir_fd=parent)
        except FileExistsError:
            pass  # judged below: a link or a file there is refused
        except OSError as exc:
            raise RunDirError(f"cannot create {shown}: {(exc.strerror or str(exc)).lower()}") from None
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=parent)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            try:
                kind = "a symbolic link" if stat.S_ISLNK(os.lstat(name, dir_fd=parent).st_mode) else "not a directory"
            except OSError:
                kind = "not a directory"
            # A linked folder would let a planted link send the run's scores anywhere (or read them from there).
            raise RunDirError(f"{shown} is {kind}; the folders of a run directory must be real directories") from None
        raise RunDirError(f"cannot open {shown}: {(exc.strerror or str(exc)).lower()}") from None


def _model_folder(run_dir: str | os.PathLike[str], model: str, *, create: bool) -> int | None:
    """A descriptor of `<run_dir>/scores/<model>/`, each folder below the run directory a real one; None if absent."""
    root = Path(run_dir)
    _component(model, "model")
    if create:
        try:
            root.mkdir(parents=True, exist_ok=True)  # the folder named by the user may itself be a link
        except OSError as exc:
            raise RunDirError(f"cannot create {root}: {(exc.strerror or str(exc)).lower()}") from None
    try:
        fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise RunDirError(f"cannot open run directory {root}: {(exc.strerror or str(exc)).lower()}") from None
    shown = root
    for name in (SCORES, model):
        shown = shown / name
        try:
            child = _open_folder(fd, name, shown, create=create)
        finally:
            os.close(fd)
        if child is None:
            return None
        fd = child
    return fd


def _open_score_file(folder: int, name: str, shown: Path) -> int | None:
    """A descriptor of the regular file `name` in `folder` (never through a link, never blocking); None if absent."""
    try:
        return open_regular(name, dir_fd=folder)
    except FileNotFoundError:
        return None
    except UnsafeFileError as exc:
        raise RunDirError(f"{shown} is {exc.strerror}; refused") from None
    except OSError as exc:
        raise RunDirError(f"cannot read {shown}: {(exc.strerror or str(exc)).lower()}") from None


def _member_array(archive: zipfile.ZipFile, info: zipfile.ZipInfo, size: int, shown: Path) -> np.ndarray:
    """One member's scores, its header checked against its recorded size before anything is allocated."""
    name = info.filename
    if info.flag_bits & 0x1 or info.compress_type != zipfile.ZIP_STORED:
        # np.savez stores members uncompressed: then a member's size is bounded by the file's real size.
        raise RunDirError(f"{shown}: member {name!r} is compressed or encrypted, which oodbench never writes")
    if info.file_size != info.compress_size or info.header_offset + info.compress_size > size:
        raise RunDirError(f"{shown}: member {name!r} declares more bytes than the file holds")
    with archive.open(info) as member:
        try:
            shape, _fortran, dtype, header = npy_header(member, f"{shown}: member {name!r}")
        except StoreError as exc:
            raise RunDirError(
                f"{shown}: member {name!r} is not a readable .npy array ({exc.__cause__})"[:500]
            ) from None
        if dtype.kind not in "fiu" or dtype.fields is not None or dtype.subdtype is not None:
            raise RunDirError(f"{shown}: member {name!r} has dtype {dtype}; scores are plain numbers")
        if len(shape) != 1 or shape[0] < 0:
            raise RunDirError(f"{shown}: member {name!r} has shape {tuple(shape)}; scores are one value per image")
        nbytes = shape[0] * dtype.itemsize
        if header + nbytes != info.file_size:
            raise RunDirError(
                f"{shown}: member {name!r} declares {shape[0]:,} scores ({nbytes:,} bytes) "
                f"but holds {info.file_size - header:,} bytes"
            )
        data = member.read(nbytes)  # at most the file's size (checked above); the CRC is checked at its end
    if len(data) != nbytes:
        raise RunDirError(f"{shown}: member {name!r} is truncated")
    return np.frombuffer(data, dtype=dtype, count=shape[0]).astype(np.float64)


def _read_scores(fd: int, shown: Path) -> dict[str, np.ndarray]:
    """{detector: scores} of an opened score file (the descriptor is closed)."""
    with os.fdopen(fd, "rb") as handle:
        size = os.fstat(handle.fileno()).st_size
        if size > _LIMIT:
            raise RunDirError(f"{shown} is {size:,} bytes, more than the {_LIMIT:,} allowed")
        try:
            with zipfile.ZipFile(handle) as archive:
                infos = archive.infolist()
                if sum(info.file_size for info in infos) > size:
                    raise RunDirError(f"{shown}: its members declare more bytes than the file holds")
                scores: dict[str, np.ndarray] = {}
                for info in infos:
                    detector = info.filename[: -len(".npy")]
                    if not info.filename.endswith(".npy") or not detector or "/" in detector:
                        raise RunDirError(f"{shown}: member {info.filename!r} is not a score array")
                    if detector in scores:
                        raise RunDirError(f"{shown}: member {info.filename!r} occurs twice")
                    scores[detector] = _member_array(archive, info, size, shown)
        except RunDirError:
            raise  # a ValueError too, already one line
        except _ZIP_ERRORS as exc:
            raise RunDirError(f"corrupt score file {shown}: {exc}"[:500]) from None
    lengths = {len(values) for values in scores.values()}
    if len(lengths) > 1:
        raise RunDirError(f"{shown}: its detectors' scores differ in length ({sorted(lengths)})")
    return scores


def _load(folder: int, dataset: str, shown: Path) -> dict[str, np.ndarray] | None:
    """The scores saved in `folder` for `dataset`, or None when there are none."""
    fd = _open_score_file(folder, f"{dataset}.npz", shown)
    return None if fd is None else _read_scores(fd, shown)


def save_scores(
    run_dir: str | os.PathLike[str],
    model: str,
    dataset: str,
    scores: Mapping[str, np.ndarray],
    *,
    replace: bool = False,
) -> Path:
    """Write {detector: scores (N,)} atomically, merged with the scores already saved (or replacing them)."""
    path = score_path(run_dir, model, _component(dataset, "dataset"))
    folder = _model_folder(run_dir, model, create=True)
    assert folder is not None
    try:
        merged = {} if replace else (_load(folder, dataset, path) or {})
        merged.update({name: np.asarray(values, dtype=np.float64) for name, values in scores.items()})
        lengths = {name: v.shape for name, v in merged.items()}
        if len({shape for shape in lengths.values()}) > 1:
            raise RunDirError(f"scores for {model}/{dataset} disagree in length: {lengths}")
        _write_atomic(folder, path.name, merged, path)
    finally:
        os.close(folder)
    return path


def _write_atomic(folder: int, name: str, arrays: Mapping[str, Any], shown: Path) -> None:
    """Write an .npz in `folder` through a new temporary file (never an existing one) and a rename."""
    # atomic_path's naming (".NAME.RANDOM.tmp"), so that remove_stale_temporaries recognises one a crash left.
    tmp = f".{name}.{secrets.token_hex(4)}.tmp"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666, dir_fd=folder)
    except OSError as exc:
        raise RunDirError(f"cannot write {shown}: {(exc.strerror or str(exc)).lower()}") from None
    try:
        with os.fdopen(fd, "wb") as handle:
            np.savez(handle, **arrays)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, name, src_dir_fd=folder, dst_dir_fd=folder)
    except BaseException as exc:
        try:
            os.unlink(tmp, dir_fd=folder)
        except OSError:
            pass
        if isinstance(exc, OSError):
            raise RunDirError(f"cannot write {shown}: {(exc.strerror or str(exc)).lower()}") from None
        raise


def load_scores(run_dir: str | os.PathLike[str], model: str, dataset: str) -> dict[str, np.ndarray]:
    """{detector: scores} of one (model, dataset) of a run."""
    path = score_path(run_dir, model, _component(dataset, "dataset"))
    folder = _model_folder(run_dir, model, create=False)
    scores = None
    if folder is not None:
        try:
            scores = _load(folder, dataset, path)
        finally:
            os.close(folder)
    if scores is None:
        raise RunDirError(f"no scores for {model}/{dataset} in {run_dir} (expected {path})")
    return scores


def list_scores(run_dir: str | os.PathLike[str]) -> list[tuple[str, str]]:
    """(model, dataset) pairs with saved scores (a planted link among them is listed, and refused when loaded)."""
    root = Path(run_dir) / SCORES
    if not root.is_dir():
        return []
    return sorted((p.parent.name, p.stem) for p in root.glob("*/*.npz"))
