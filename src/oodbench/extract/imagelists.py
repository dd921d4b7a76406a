"""The official OOD image lists: where their authors publish them, the checksum that pins each, and fetching them.

oodbench carries no list file, only its provenance (repository, commit, path, licence, size, SHA-256). The files
live in a lists folder the user names (`--lists DIR` on the command line, ``lists = PATH`` in a runner config):
`oodbench datasets lists fetch --to DIR` downloads each from its authors' repository at the pinned commit, or the
user puts them there by hand under their upstream file names. A file is used only when its SHA-256 is the pinned
one, so every run reads the same bytes as the paper's authors published.
"""

from __future__ import annotations

import hashlib
import os
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..core.errors import DataError
from ..util.atomic import atomic_write_bytes

__all__ = ["ListSource", "LIST_SOURCES", "RAW_BASE", "list_path", "read_list", "fetch_lists", "FetchResult"]

# Raw file contents of a GitHub repository at a commit: <RAW_BASE>/<owner>/<name>/<commit>/<path>.
RAW_BASE = "https://raw.githubusercontent.com"


@dataclass(frozen=True)
class ListSource:
    """One upstream image-list file: where its authors publish it and the SHA-256 that pins its bytes."""

    file: str  # its name in the lists folder: the upstream file name
    repo: str  # GitHub owner/name
    commit: str  # the pinned commit (40 hex digits)
    path: str  # the file's path in the repository
    licence: str
    entries: int  # how many entries the file holds, counted in `unit`
    unit: str
    sha256: str  # of the upstream bytes

    @property
    def url(self) -> str:
        """The raw file at the pinned commit."""
        return f"{RAW_BASE}/{self.repo}/{self.commit}/{urllib.parse.quote(self.path)}"

    def describe(self) -> str:
        """One line: repository, commit, path and licence."""
        return f"github.com/{self.repo} @ {self.commit[:12]} {self.path} ({self.licence})"


_NINCO = ("j-cb/NINCO", "8f42ce7b7cccf4304421e551dcbbfe64ce090a9a")
_VIM = ("haoqiwang/vim", "dabf9e5b242dbd31c15e09ff12af3d11f009f79c")
_SSB = ("sgvaze/SSB", "615320bebdcc355914680bce820bbd48347c74bb")

# The files the registry's official lists read. Facts checked against each repository at its commit.
LIST_SOURCES: dict[str, ListSource] = {
    source.file: source
    for source in (
        ListSource(
            "NINCO_OOD_classes.csv",
            *_NINCO,
            "data/NINCO_OOD_classes.csv",
            "MIT",
            5_879,
            "rows (64 classes)",
            "1da2b2965a35b04632462acc2a2aec05db3f2fe0ce0576e35fbc5f5a6b3b201a",
        ),
        ListSource(
            "NINCO_popular_datasets_subsamples.csv",
            *_NINCO,
            "data/NINCO_popular_datasets_subsamples.csv",
            "MIT",
            2_715,
            "rows (11 sub-samples)",
            "97c44ff7f79604987d81243a2d6d8ca7ff8ee89bed15605ac34d7801898c05dd",
        ),
        ListSource(
            "OOD_iNaturalist_MOS_labels.csv",
            *_NINCO,
            "data/labels_of_other_datasets/OOD_iNaturalist_MOS_labels.csv",
            "MIT",
            10_000,
            "rows",
            "e543af9e7175441c4c1867c89fac15ea0518d07f42a8370ff46aec1e0d0b0126",
        ),
        ListSource(
            "openimage_o.txt",
            *_VIM,
            "datalists/openimage_o.txt",
            "Apache-2.0",
            17_632,
            "lines",
            "f1ef7273bb91063c87b11f04afdc609cbc04621129abe9966dc2e513a2a86935",
        ),
        ListSource(
            "imagenet_21k_val_files.json",
            *_SSB,
            "SSB/splits/imagenet_21k_val_files.json",
            "MIT, declared in setup.py",
            99_000,
            "files (1,980 classes x 50)",
            "19d9f6a9aef5555bbe1793accf62280b9e2f38ee260a70b738246cb92cfdfad7",
        ),
        ListSource(
            "imagenet_ssb_splits.json",
            *_SSB,
            "SSB/splits/imagenet_ssb_splits.json",
            "MIT, declared in setup.py",
            1_980,
            "unknown classes (Easy 1,000, Hard 980)",
            "90644c5a2c267800e22bf660cc56fd58e4683fac42f27923dc10189e8a08666d",
        ),
    )
}


def list_path(file: str, lists: str | os.PathLike[str] | None) -> Path | None:
    """Where `file` lies in the lists folder, or None when no folder is given or the file is not in it."""
    if lists is None:
        return None
    path = Path(lists) / file
    return path if path.is_file() else None


def read_list(file: str, lists: str | os.PathLike[str] | None) -> str | None:
    """The text of an official list file from the lists folder, its SHA-256 verified; None when it is absent."""
    source = LIST_SOURCES[file]
    path = list_path(file, lists)
    if path is None:
        return None
    data = path.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    if digest != source.sha256:
        raise DataError(
            f"{path} is not {source.describe()}: SHA-256 {digest[:16]}…, pinned {source.sha256[:16]}…; "
            f"fetch it again with `oodbench datasets lists fetch --to {Path(lists or '.')}`"
        )
    return data.decode("utf-8-sig")


@dataclass(frozen=True)
class FetchResult:
    """What fetching did with one list file."""

    source: ListSource
    path: Path
    action: str  # "downloaded" or "already present"
    size: int


def _download(source: ListSource, timeout: float, folder: Path) -> bytes:
    """The bytes at the source's URL; one DataError line when the host cannot be reached or refuses."""
    request = urllib.request.Request(source.url, headers={"User-Agent": "oodbench"})
    host = urllib.parse.urlsplit(source.url).netloc
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.read()
    except urllib.error.HTTPError as exc:
        raise DataError(
            f"{source.url} answered HTTP {exc.code} ({exc.reason}); nothing written for {source.file}"
        ) from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise DataError(
            f"cannot reach {host} ({reason}); no list fetched from here on. Download {source.url} (and the other "
            f"files `oodbench datasets lists show` names) by hand into {folder}"
        ) from None


def fetch_lists(
    to: str | os.PathLike[str],
    *,
    files: Sequence[str] | None = None,
    timeout: float = 60.0,
    progress: Callable[[FetchResult], None] | None = None,
) -> list[FetchResult]:
    """Download the official list files into `to` from their authors' repositories at the pinned commits.

    Each file is verified against its pinned SHA-256 before it is written (atomically); a file already there with
    that checksum is kept. The first file that cannot be fetched or does not match stops the fetch with one
    DataError line; the files fetched before it stay.
    """
    selected = list(LIST_SOURCES) if files is None else list(files)
    unknown = [file for file in selected if file not in LIST_SOURCES]
    if unknown:
        raise DataError(f"no official list file {unknown[0]!r}; known: {', '.join(LIST_SOURCES)}")
    folder = Path(to)
    if folder.exists() and not folder.is_dir():
        raise DataError(f"--to {folder} is a file, not a folder")
    results: list[FetchResult] = []
    for file in selected:
        source = LIST_SOURCES[file]
        target = folder / file
        if target.is_file() and hashlib.sha256(target.read_bytes()).hexdigest() == source.sha256:
            result = FetchResult(source, target, "already present", target.stat().st_size)
        else:
            data = _download(source, timeout, folder)
            digest = hashlib.sha256(data).hexdigest()
            if digest != source.sha256:
                raise DataError(
                    f"{source.url} gave {len(data):,} bytes with SHA-256 {digest[:16]}…, not the pinned "
                    f"{source.sha256[:16]}…; nothing written for {file}"
                )
            folder.mkdir(parents=True, exist_ok=True)
            atomic_write_bytes(target, data)
            result = FetchResult(source, target, "downloaded", len(data))
        results.append(result)
        if progress is not None:
            progress(result)
    return results
