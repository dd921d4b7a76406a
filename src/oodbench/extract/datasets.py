"""Image datasets for extraction: an image folder, a file list (CSV/TXT), and the ImageNet-1k layouts.

Every dataset is an `ImageList`: a root, an ordered tuple of item paths relative to it, optional integer
labels and class names. The item order is the row order of the store entry, and the item list (hashed into
the entry's provenance and written to ``items.txt``) traces every row back to its image.
"""

from __future__ import annotations

import csv
import io
import os
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..core.errors import DataError
from ..core.store import hash_items
from ..util.atomic import read_file_bytes

__all__ = [
    "IMAGE_EXTENSIONS",
    "ImageList",
    "UnreadableImage",
    "image_folder",
    "file_list",
    "imagenet",
    "imagenet_synsets",
    "load_rgb",
    "open_dataset",
    "ListMatch",
    "match_list",
]

IMAGE_EXTENSIONS = frozenset(
    {".jpg", ".jpeg", ".jfif", ".png", ".bmp", ".ppm", ".pgm", ".tif", ".tiff", ".webp", ".gif"}
)
_SYNSET = re.compile(r"^n\d{8}\Z")
_VAL_NAME = re.compile(r"ILSVRC2012_val_(\d{8})")


class UnreadableImage(Exception):
    """An image file that cannot be opened or decoded (skipped and reported, never fatal)."""


@dataclass(frozen=True, eq=False)
class ImageList:
    """An ordered list of images under a root, with optional integer labels and class names."""

    root: Path
    items: tuple[str, ...]
    labels: np.ndarray | None = None
    class_names: tuple[str, ...] | None = None
    source: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "root", Path(self.root))
        object.__setattr__(self, "items", tuple(str(item) for item in self.items))
        if self.labels is not None:
            labels = np.asarray(self.labels)
            if labels.shape != (len(self.items),):
                raise DataError(f"labels must have one entry per item ({len(self.items)}); got shape {labels.shape}")
            if not np.issubdtype(labels.dtype, np.integer):
                raise DataError(f"labels must be integers; got dtype {labels.dtype}")
            object.__setattr__(self, "labels", labels.astype(np.int64, copy=False))
        if self.class_names is not None:
            object.__setattr__(self, "class_names", tuple(self.class_names))

    def __len__(self) -> int:
        return len(self.items)

    def path(self, position: int) -> Path:
        """Absolute path of the item at `position`."""
        item = self.items[position]
        return Path(item) if os.path.isabs(item) else self.root / item

    def paths(self, positions: Sequence[int] | np.ndarray) -> list[str]:
        """Absolute paths (as strings) of several items."""
        return [str(self.path(int(p))) for p in positions]

    def item_hash(self) -> str:
        """SHA-256 of the ordered item list (the dataset's identity in the store)."""
        return hash_items(self.items)

    def describe(self) -> dict[str, Any]:
        """JSON-friendly description recorded in the store entry's meta.json."""
        info: dict[str, Any] = {"root": str(self.root), "num_items": len(self), **self.source}
        info["has_labels"] = self.labels is not None
        if self.class_names is not None:
            info["class_names"] = list(self.class_names)
        return info

    def __repr__(self) -> str:
        labelled = "labelled" if self.labels is not None else "unlabelled"
        return f"ImageList({str(self.root)!r}, {len(self)} items, {labelled})"


# The most pixels an image may declare, checked on its header before anything is decoded: PIL's own warning
# threshold (89.5 MP, 0.27 GB as RGB); a PNG or JPEG declaring 50,000 x 50,000 is a decompression bomb.
MAX_IMAGE_PIXELS = 89_478_485
# The largest image file read (its bytes are read once, into memory, then decoded).
MAX_IMAGE_BYTES = 512 * 2**20


def read_image_bytes(path: str | os.PathLike[str]) -> bytes:
    """An image file's bytes, read once: a regular file (no FIFO or device), at most MAX_IMAGE_BYTES, that did not
    change while it was read; UnreadableImage otherwise."""
    try:
        return read_file_bytes(path, MAX_IMAGE_BYTES)
    except ValueError as exc:
        raise UnreadableImage(str(exc)) from None


def check_declared_size(image: Any) -> None:
    """UnreadableImage when an opened (not yet decoded) image declares more than MAX_IMAGE_PIXELS pixels."""
    width, height = image.size
    if width * height > MAX_IMAGE_PIXELS:
        raise UnreadableImage(
            f"it declares {width:,} x {height:,} pixels, more than the {MAX_IMAGE_PIXELS:,} allowed "
            "(a decompression bomb?); not decoded"
        )


def load_rgb(path: str | os.PathLike[str] | io.BytesIO) -> Any:
    """Open and fully decode an image as RGB; raise UnreadableImage with the reason if that fails.

    The bytes are read once (`read_image_bytes`) and the declared size is checked before decoding; a truncated
    file is refused (PIL's LOAD_TRUNCATED_IMAGES stays off).
    """
    import warnings

    from PIL import Image

    data = path if isinstance(path, io.BytesIO) else io.BytesIO(read_image_bytes(path))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)  # judged by check_declared_size
            with Image.open(data) as image:
                check_declared_size(image)
                image.load()
                return to_rgb(image)
    except UnreadableImage:
        raise
    except Image.DecompressionBombError as exc:
        raise UnreadableImage(f"{exc} (a decompression bomb?); not decoded") from None
    except Exception as exc:  # PIL raises many types (OSError, SyntaxError, ValueError, ...)
        # PIL names the file object it read (an in-memory buffer here, whose repr holds an address): the message
        # is recorded in the store's meta.json, so it must be the same on every run.
        message = str(exc).replace(f" {data!r}", "")
        raise UnreadableImage(f"{type(exc).__name__}: {message}") from exc


# PIL's modes of 16-bit greyscale (PNG, TIFF); "I" is how some PIL versions open a 16-bit PNG.
_SIXTEEN_BIT = frozenset({"I;16", "I;16B", "I;16L", "I;16N", "I"})


def to_rgb(image: Any) -> Any:
    """A decoded PIL image as RGB. 16-bit greyscale is scaled to 8 bits first (v / 257, rounded: 65535 → 255):
    PIL's own conversion clips it at 255, which turns all but the darkest pixels white."""
    if image.mode in _SIXTEEN_BIT:
        from PIL import Image

        values = np.clip(np.asarray(image, dtype=np.int64), 0, 65535)
        grey = ((values + 128) // 257).astype(np.uint8)  # round(v / 257) for 0 <= v <= 65535
        return Image.fromarray(grey, "L").convert("RGB")
    return image.convert("RGB")


def _is_image(name: str) -> bool:
    return os.path.splitext(name)[1].lower() in IMAGE_EXTENSIONS


def _walk_images(directory: Path) -> list[str]:
    """Image files under `directory`, recursively, as sorted POSIX paths relative to it."""
    found: list[str] = []
    seen: set[tuple[int, int]] = set()  # folders by (device, inode): a link back up (a loop) is walked once
    for current, dirs, files in os.walk(directory, followlinks=True):
        try:
            info = os.stat(current)
        except OSError:
            dirs[:] = []
            continue
        if (info.st_dev, info.st_ino) in seen:
            dirs[:] = []
            continue
        seen.add((info.st_dev, info.st_ino))
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        rel = os.path.relpath(current, directory)
        for name in sorted(files):
            if _is_image(name) and not name.startswith("."):
                found.append(name if rel == "." else f"{Path(rel).as_posix()}/{name}")
    return found


@dataclass(frozen=True)
class ListMatch:
    """An image list laid over a folder: the listed images found (in list order), those not found, and the rest."""

    root: Path
    present: tuple[str, ...]  # list entries found, as paths relative to `root` (absolute entries stay absolute)
    missing: tuple[str, ...]  # list entries with no file
    extra: tuple[str, ...]  # images under the folder that the list does not name (relative to the folder)
    listed: int

    def image_list(self, source: dict[str, Any]) -> ImageList:
        """The listed images that are present, unlabelled, with `source` plus the counts in the provenance."""
        counts = {"listed": self.listed, "missing": len(self.missing), "ignored": len(self.extra)}
        return ImageList(self.root, self.present, None, None, {**source, **counts})


def match_list(
    entries: Sequence[str], *, folder: Path | None, base: Path, by: str = "path", where: str = "image list"
) -> ListMatch:
    """Lay an image list over the images under `folder`.

    ``by="path"``: an entry is a path relative to `base` (or absolute); ``by="name"``: an entry is a file name,
    found anywhere below `folder` (lists of bare names, such as OpenImage-O's, fit any sub-folder layout).
    """
    if len(set(entries)) != len(entries):
        twice = next(entry for entry, n in Counter(entries).items() if n > 1)
        raise DataError(f"{where} names {twice!r} more than once")
    walked = _walk_images(folder) if folder is not None and folder.is_dir() else []
    if by == "name":
        if folder is None:
            raise DataError(f"{where} names files only; it needs the set's folder to find them in")
        index: dict[str, list[str]] = {}
        for relative in walked:
            index.setdefault(relative.rsplit("/", 1)[-1], []).append(relative)
        present: list[str] = []
        missing: list[str] = []
        for entry in entries:
            hits = index.get(entry.rsplit("/", 1)[-1], [])
            if len(hits) > 1:
                raise DataError(f"{where}: {entry!r} matches {len(hits)} files under {folder} ({hits[0]}, {hits[1]})")
            if hits:
                present.append(hits[0])
            else:
                missing.append(entry)
        chosen = set(present)
        return ListMatch(
            folder, tuple(present), tuple(missing), tuple(w for w in walked if w not in chosen), len(entries)
        )
    if by != "path":
        raise DataError(f"unknown list matching {by!r}; use path or name")
    on_disk = {os.path.normpath(folder / w): w for w in walked} if folder is not None else {}
    present, missing, taken = [], [], set()
    for entry in entries:
        item = _normalise(entry)
        full = os.path.normpath(item if os.path.isabs(item) else base / item)
        if full in on_disk or os.path.isfile(full):
            present.append(item)
            taken.add(full)
        else:
            missing.append(entry)
    extra = tuple(w for full, w in on_disk.items() if full not in taken)
    return ListMatch(base, tuple(present), tuple(missing), extra, len(entries))


def image_folder(root: str | os.PathLike[str], *, labels: bool = True) -> ImageList:
    """Images under a folder; with class sub-folders (and `labels`) each sub-folder is a class, in sorted order."""
    root = Path(root)
    if not root.is_dir():
        raise DataError(f"image folder {root} does not exist or is not a directory")
    top_images = [entry.name for entry in os.scandir(root) if entry.is_file() and _is_image(entry.name)]
    class_dirs = sorted(entry.name for entry in os.scandir(root) if entry.is_dir() and not entry.name.startswith("."))
    if labels and class_dirs and not top_images:
        items: list[str] = []
        label_list: list[int] = []
        for index, name in enumerate(class_dirs):
            members = _walk_images(root / name)
            items.extend(f"{name}/{member}" for member in members)
            label_list.extend([index] * len(members))
        if not items:
            raise DataError(f"no images ({', '.join(sorted(IMAGE_EXTENSIONS))}) found under {root}")
        return ImageList(
            root,
            tuple(items),
            np.asarray(label_list, dtype=np.int64),
            tuple(class_dirs),
            {"format": "folder", "layout": "class sub-folders"},
        )
    items = _walk_images(root)
    if not items:
        raise DataError(f"no images ({', '.join(sorted(IMAGE_EXTENSIONS))}) found under {root}")
    return ImageList(root, tuple(items), None, None, {"format": "folder", "layout": "unlabelled tree"})


def imagenet_synsets() -> tuple[str, ...]:
    """The 1000 ImageNet-1k synset ids in the standard class-index order (timm's ImageNetInfo)."""
    from timm.data import ImageNetInfo

    return tuple(ImageNetInfo("imagenet-1k").label_names())


def _parse_labels(raw: list[str | None], where: str) -> tuple[np.ndarray | None, tuple[str, ...] | None]:
    """Integer labels, or ImageNet synset ids mapped to class indices; None when no row has a label."""
    present = [value for value in raw if value not in (None, "")]
    if not present:
        return None, None
    if len(present) != len(raw):
        missing = next(i for i, value in enumerate(raw) if value in (None, ""))
        raise DataError(f"{where}: item {missing} has no label while others do; give a label for every row or for none")
    if all(re.fullmatch(r"[+-]?\d+", value) for value in present):  # type: ignore[arg-type]
        return np.asarray([int(value) for value in present], dtype=np.int64), None  # type: ignore[arg-type]
    if all(_SYNSET.match(value) for value in present):  # type: ignore[arg-type]
        synsets = imagenet_synsets()
        index = {name: i for i, name in enumerate(synsets)}
        unknown = sorted({value for value in present if value not in index})  # type: ignore[misc]
        if unknown:
            raise DataError(f"{where}: synsets {unknown[:5]} are not ImageNet-1k classes")
        return np.asarray([index[value] for value in present], dtype=np.int64), synsets  # type: ignore[index]
    bad = next(value for value in present if not re.fullmatch(r"[+-]?\d+", value))  # type: ignore[arg-type]
    raise DataError(f"{where}: label {bad!r} is neither an integer class index nor an ImageNet synset id (nXXXXXXXX)")


def _normalise(path: str) -> str:
    """List paths as POSIX strings; relative ones resolve against the root, absolute ones stay absolute."""
    return path if os.path.isabs(path) else Path(path).as_posix()


def file_list(path: str | os.PathLike[str], *, root: str | os.PathLike[str] | None = None) -> ImageList:
    """Images named in a CSV (`path,label` columns, optional header) or TXT (`path [label]` per line) file."""
    list_path = Path(path)
    if not list_path.is_file():
        raise DataError(f"file list {list_path} does not exist")
    base = Path(root) if root is not None else list_path.parent
    try:
        text = list_path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as exc:
        raise DataError(f"file list {list_path} is not UTF-8 text (byte {exc.start}: {exc.reason})") from None
    except OSError as exc:
        raise DataError(f"cannot read file list {list_path}: {exc.strerror or exc}") from None
    rows: list[tuple[str, str | None]] = []
    is_csv = list_path.suffix.lower() == ".csv"
    if is_csv:
        records = [r for r in csv.reader(io.StringIO(text)) if r and any(cell.strip() for cell in r)]
        records = [r for r in records if not r[0].lstrip().startswith("#")]
        if not records:
            raise DataError(f"file list {list_path} is empty")
        header = [cell.strip().lower() for cell in records[0]]
        path_col, label_col = 0, 1 if len(header) > 1 else None
        if "path" in header:
            path_col = header.index("path")
            label_col = header.index("label") if "label" in header else None
            records = records[1:]
        elif len(records[0]) > 1 and not re.fullmatch(r"[+-]?\d+|n\d{8}|", records[0][1].strip()):
            raise DataError(
                f"{list_path}: first row {records[0]!r} is neither data (path,label) nor a header naming a 'path' column"
            )
        for number, record in enumerate(records):
            if path_col >= len(record):
                raise DataError(f"{list_path}: row {number + 1} has no path column")
            label = record[label_col].strip() if label_col is not None and label_col < len(record) else None
            rows.append((record[path_col].strip(), label))
    else:
        for line in text.splitlines():
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            parts = line.rsplit(maxsplit=1)
            if len(parts) == 2 and re.fullmatch(r"[+-]?\d+|n\d{8}", parts[1]):
                rows.append((parts[0], parts[1]))
            else:
                rows.append((line, None))
        if rows and rows[0][0].lower() in ("path", "path label", "path,label"):
            rows = rows[1:]
    if not rows:
        raise DataError(f"file list {list_path} names no images")
    labels, class_names = _parse_labels([label for _, label in rows], str(list_path))
    items = tuple(_normalise(p) for p, _ in rows)
    return ImageList(
        base,
        items,
        labels,
        class_names,
        {"format": "list", "list_file": str(list_path), "list_sha256": hash_items([text])},
    )


def imagenet(root: str | os.PathLike[str], *, split: str = "val") -> ImageList:
    """ImageNet-1k `train` or `val`: synset sub-folders (labels in timm's standard synset order) or a flat val folder
    with Kaggle's ``LOC_val_solution.csv``. Validation images are ordered by their ILSVRC2012_val number."""
    if split not in ("train", "val"):
        raise DataError(f"ImageNet split must be 'train' or 'val'; got {split!r}")
    root = Path(root)
    directory = root / split if (root / split).is_dir() else root
    if not directory.is_dir():
        raise DataError(f"ImageNet {split} folder not found: {directory}")
    synsets = imagenet_synsets()
    index = {name: i for i, name in enumerate(synsets)}
    sub = sorted(entry.name for entry in os.scandir(directory) if entry.is_dir() and _SYNSET.match(entry.name))
    items: list[str] = []
    labels: list[int] = []
    if sub:
        unknown = [name for name in sub if name not in index]
        if unknown:
            raise DataError(f"{directory}: folders {unknown[:5]} are not ImageNet-1k synsets")
        for name in sub:
            for member in _walk_images(directory / name):
                items.append(f"{name}/{member}")
                labels.append(index[name])
        layout = "synset sub-folders"
    else:
        flat = [name for name in _walk_images(directory) if "/" not in name]
        solution = next(
            (
                p
                for p in (
                    directory / "LOC_val_solution.csv",
                    root / "LOC_val_solution.csv",
                    directory.parent / "LOC_val_solution.csv",
                )
                if p.is_file()
            ),
            None,
        )
        if split != "val" or solution is None or not flat:
            raise DataError(
                f"{directory} is not an ImageNet-1k {split} layout: expected one sub-folder per synset (n01440764/ ...)"
                + (
                    " or flat ILSVRC2012_val_*.JPEG files with LOC_val_solution.csv beside them"
                    if split == "val"
                    else ""
                )
                + "; for the official val tarball, sort images into synset folders (e.g. with the widely used valprep.sh)"
            )
        truth: dict[str, str] = {}
        with open(solution, newline="", encoding="utf-8") as handle:
            for record in csv.DictReader(handle):
                truth[record["ImageId"]] = record["PredictionString"].split()[0]
        for name in flat:
            stem = Path(name).stem
            if stem not in truth:
                raise DataError(f"{name} has no entry in {solution}")
            items.append(name)
            labels.append(index[truth[stem]])
        layout = "flat + LOC_val_solution.csv"
    if not items:
        raise DataError(f"no images found in {directory}")
    if split == "val":
        numbers = [_VAL_NAME.search(item) for item in items]
        if all(numbers):
            # Canonical val order (ILSVRC2012_val_00000001 first): row i is val image i+1, matching ReaL and
            # label-error files that are indexed by validation number.
            order = np.argsort(np.asarray([int(m.group(1)) for m in numbers]), kind="stable")  # type: ignore[union-attr]
            items = [items[i] for i in order]
            labels = [labels[i] for i in order]
            layout += ", ordered by validation number"
    return ImageList(
        directory,
        tuple(items),
        np.asarray(labels, dtype=np.int64),
        synsets,
        {"format": "imagenet", "split": split, "layout": layout},
    )


def open_dataset(
    path: str | os.PathLike[str],
    *,
    format: str = "auto",
    split: str = "val",
    labels: bool = True,
    root: str | os.PathLike[str] | None = None,
) -> ImageList:
    """Open a dataset by path: `folder`, `list` (CSV/TXT), `imagenet`; `auto` picks list for files, folder for dirs."""
    target = Path(path)
    if format == "auto":
        format = "list" if target.is_file() else "folder"
    if format == "folder":
        return image_folder(target, labels=labels)
    if format == "list":
        dataset = file_list(target, root=root)
        return dataset if labels else ImageList(dataset.root, dataset.items, None, None, dataset.source)
    if format == "imagenet":
        return imagenet(target, split=split)
    raise DataError(f"unknown dataset format {format!r}; use auto, folder, list or imagenet")
