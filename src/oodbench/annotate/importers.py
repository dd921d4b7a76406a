"""Candidate pools from re-annotations: ReaL, Northcutt et al.'s MTurk votes, generic tables.

Each importer returns an `Import`: the candidate images (each with its source flag) and the
(original label, re-assigned label) pairs of the whole re-annotation, from which evidence (E),
the classes most often confused with an image's original label, is counted.
"""

from __future__ import annotations

import csv
import gzip
import importlib.resources
import importlib.util
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import chain
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np

from ..core.errors import AnnotateError

REAL_FLAG = "real:no-label"
MTURK_FLAG = "mturk:neither"
_VAL_NAME = re.compile(r"ILSVRC2012_val_(\d{8})\.JPEG$")


@dataclass(frozen=True)
class Candidate:
    """An image proposed for review, with where the proposal came from."""

    key: str  # unique name of the image within the project (the file name by default)
    path: str  # path relative to the image root (a bare file name is looked up anywhere below it)
    original_label: int | None = None
    flags: tuple[str, ...] = ()
    url: str | None = None  # a public URL of the image, for reverse-image search
    details: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Import:
    """What an importer read: candidates plus the label pairs of the whole re-annotation."""

    candidates: list[Candidate]
    confusion_pairs: np.ndarray  # (M, 2) int64: original label -> re-assigned label
    source: str


BUILTIN = "builtin"  # a source argument naming the copy that ships with oodbench (or timm, for ReaL)
_BUILTIN_FILES = {
    "mturk": "imagenet_mturk.json.gz",
    "val-index": "imagenet_val_set_index_to_filepath.json.gz",
}


def builtin_file(kind: str) -> Path:
    """The shipped copy of a re-annotation file: 'real' (from timm), 'mturk' or 'val-index' (Northcutt et al.).

    Northcutt et al.'s files ship in `oodbench/data/label-errors/` (Apache-2.0, see its SOURCE);
    Beyer et al.'s ReaL labels ship in timm (`timm/data/_info/imagenet_real_labels.json`).
    """
    if kind == "real":
        spec = importlib.util.find_spec("timm")  # finds the package without importing it (and torch)
        if spec is None or not spec.submodule_search_locations:
            raise AnnotateError("the built-in ReaL labels come with timm, which is not installed: pip install timm")
        path = Path(spec.submodule_search_locations[0]) / "data" / "_info" / "imagenet_real_labels.json"
        if not path.is_file():
            raise AnnotateError(f"this timm has no ReaL labels ({path}); upgrade it: pip install -U timm")
        return path
    if kind not in _BUILTIN_FILES:
        raise AnnotateError(f"no built-in file {kind!r}; choose among ['real', {', '.join(map(repr, _BUILTIN_FILES))}]")
    return Path(str(importlib.resources.files("oodbench") / "data" / "label-errors" / _BUILTIN_FILES[kind]))


def _source(path: Path | str, kind: str) -> Path:
    """A reader's path argument: a file, or BUILTIN for the shipped copy."""
    return builtin_file(kind) if str(path) == BUILTIN else Path(path)


def imagenet_val_name(number: int) -> str:
    """File name of the ImageNet-1k validation image with the given 1-based number."""
    return f"ILSVRC2012_val_{number:08d}.JPEG"


def _read_json(path: Path | str, what: str) -> Any:
    path = Path(path)
    if not path.is_file():
        raise AnnotateError(f"{what} file not found: {path}")
    try:
        if path.suffix == ".gz":
            with gzip.open(path, "rt", encoding="utf-8") as handle:
                return json.load(handle)
        return json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, gzip.BadGzipFile, EOFError) as exc:
        raise AnnotateError(f"{what} file {path} is not valid JSON: {exc}") from None


def load_original_labels(path: Path | str) -> np.ndarray:
    """Original labels of a dataset's images, in image order, as int64.

    Accepts a `.npy` array, a text file with one integer per line, a JSON list of integers, or
    Northcutt et al.'s `imagenet_val_set_index_to_filepath.json` (paths `val/<wnid>/<file>`,
    classes in sorted-WordNet-id order, images ordered by their validation number; BUILTIN: the
    shipped copy). JSON files may be gzip-compressed (`.json.gz`).
    """
    path = _source(path, "val-index")
    if not path.is_file():
        raise AnnotateError(f"original-labels file not found: {path}")
    if path.suffix == ".npy":
        labels = np.load(path, allow_pickle=False)
    elif path.name.endswith((".json", ".json.gz")):
        data = _read_json(path, "original-labels")
        if isinstance(data, list) and data and all(isinstance(x, str) for x in data):
            return _labels_from_val_paths(data, path)
        labels = np.asarray(data)
    else:
        lines = [ln.strip() for ln in path.read_text(encoding="utf-8").splitlines() if ln.strip()]
        try:
            labels = np.asarray([int(ln) for ln in lines])
        except ValueError:
            raise AnnotateError(f"{path}: expected one integer class index per line") from None
    if labels.ndim != 1 or labels.size == 0 or not np.issubdtype(labels.dtype, np.integer):
        raise AnnotateError(f"{path}: original labels must be a non-empty 1-D list of integers")
    if labels.min() < 0:
        raise AnnotateError(f"{path}: original labels must be non-negative class indices")
    return labels.astype(np.int64)


def _labels_from_val_paths(paths: list[str], source: Path) -> np.ndarray:
    wnids = []
    numbers = []
    for entry in paths:
        parts = entry.split("/")
        match = _VAL_NAME.search(entry)
        if len(parts) < 2 or match is None:
            raise AnnotateError(f"{source}: {entry!r} is not of the form val/<wnid>/ILSVRC2012_val_<n>.JPEG")
        wnids.append(parts[-2])
        numbers.append(int(match.group(1)))
    numbers_arr = np.asarray(numbers)
    if not np.array_equal(np.sort(numbers_arr), np.arange(1, len(numbers) + 1)):
        raise AnnotateError(f"{source}: validation numbers are not exactly 1..{len(numbers)}")
    _, codes = np.unique(np.asarray(wnids), return_inverse=True)  # sorted WordNet ids = class order
    labels = np.empty(len(numbers), dtype=np.int64)
    labels[numbers_arr - 1] = codes
    return labels


def _pairs(original: np.ndarray, reassigned: Sequence[Sequence[int]]) -> np.ndarray:
    """(original, new) pairs for every re-assigned label that differs from the original."""
    lengths = np.fromiter((len(r) for r in reassigned), dtype=np.int64, count=len(reassigned))
    new = np.fromiter(chain.from_iterable(reassigned), dtype=np.int64, count=int(lengths.sum()))
    old = np.repeat(original, lengths)
    keep = old != new
    return np.stack([old[keep], new[keep]], axis=1)


def read_real(
    path: Path | str,
    original_labels: np.ndarray | Sequence[int] | None = None,
    *,
    flag: str = REAL_FLAG,
) -> Import:
    """Images whose ReaL label list is empty ("no class fits"), from Beyer et al.'s `real.json`.

    Entry i of `real.json` belongs to `ILSVRC2012_val_{i+1:08d}.JPEG`. Without `original_labels`
    (one per entry) the candidates carry no original label and no confusion pairs are counted.
    BUILTIN reads the copy that ships with timm.
    """
    path = _source(path, "real")
    data = _read_json(path, "ReaL")
    if not isinstance(data, list) or not all(isinstance(x, list) for x in data):
        raise AnnotateError(f"{path}: expected a JSON list of label lists (ReaL's real.json)")
    original = None
    if original_labels is not None:
        original = np.asarray(original_labels, dtype=np.int64)
        if original.shape != (len(data),):
            raise AnnotateError(f"{path} has {len(data)} entries but {original.shape[0]} original labels were given")
    candidates = [
        Candidate(
            key=imagenet_val_name(i + 1),
            path=imagenet_val_name(i + 1),
            original_label=None if original is None else int(original[i]),
            flags=(flag,),
            details={flag: {"real_labels": []}},
        )
        for i, labels in enumerate(data)
        if not labels
    ]
    pairs = np.zeros((0, 2), np.int64) if original is None else _pairs(original, data)
    return Import(candidates, pairs, "real")


def read_mturk(path: Path | str, *, min_neither: int | None = None, flag: str = MTURK_FLAG) -> Import:
    """Images where the MTurk majority chose "neither" label, from Northcutt et al.'s `imagenet_mturk.json`.

    `min_neither` defaults to a strict majority of each image's votes. Confusion pairs are the
    (given, guessed) labels of images whose majority said the guessed label fits ("guessed" or "both").
    BUILTIN reads the copy that ships with oodbench.
    """
    path = _source(path, "mturk")
    data = _read_json(path, "MTurk")
    if not isinstance(data, list):
        raise AnnotateError(f"{path}: expected a JSON list of dicts (imagenet_mturk.json)")
    candidates: list[Candidate] = []
    pairs: list[tuple[int, int]] = []
    for row in data:
        try:
            votes = {k: int(v) for k, v in row["mturk"].items()}
            number = int(row["id"])
            given = int(row["given_original_label"])
            guessed = int(row["our_guessed_label"])
        except (KeyError, TypeError, ValueError, AttributeError):
            raise AnnotateError(
                f"{path}: every entry needs id, given_original_label, our_guessed_label and mturk votes"
            ) from None
        total = sum(votes.values())
        needed = total // 2 + 1 if min_neither is None else min_neither
        if votes.get("neither", 0) >= needed:
            name = imagenet_val_name(number)
            url = row.get("url")
            # The file's folder in the URL (val/<wnid>/<file>) is the layout of many ImageNet copies.
            relpath = "/".join(url.split("/")[-3:]) if isinstance(url, str) and url.count("/") >= 3 else name
            candidates.append(
                Candidate(
                    key=name,
                    path=relpath,
                    original_label=given,
                    flags=(flag,),
                    url=url,
                    details={flag: {"votes": votes, "guessed_label": guessed}},
                )
            )
        if votes.get("guessed", 0) + votes.get("both", 0) > total / 2 and guessed != given:
            pairs.append((given, guessed))
    return Import(candidates, np.asarray(pairs, dtype=np.int64).reshape(-1, 2), "mturk")


_TRUE = {"1", "true", "yes", "y", "t", "x"}


@dataclass(frozen=True)
class TableMapping:
    """How the columns of a generic JSONL/CSV re-annotation map onto candidates.

    `flags` maps a flag name (e.g. "uncertain", "no-class") to the column holding it; a row is a
    candidate when any flag is truthy (1/true/yes), or always with `include_all`. `reassigned`
    names a column of re-assigned labels (a list, or text separated by `;` or `|`), used for (E).
    Labels may be class indices or, with `class_names`, class names.
    """

    path: str = "path"
    key: str | None = None
    original_label: str | None = None
    flags: Mapping[str, str] = field(default_factory=dict)
    reassigned: str | None = None
    url: str | None = None
    include_all: bool = False
    flag_prefix: str = ""

    @classmethod
    def from_json(cls, path: Path | str) -> TableMapping:
        """Read a mapping from a JSON object with the field names of this class."""
        data = _read_json(path, "table mapping")
        if not isinstance(data, dict):
            raise AnnotateError(f"{path}: a table mapping must be a JSON object")
        unknown = set(data) - set(cls.__dataclass_fields__)
        if unknown:
            raise AnnotateError(
                f"{path}: unknown mapping keys {sorted(unknown)}; allowed: {sorted(cls.__dataclass_fields__)}"
            )
        if not isinstance(data.get("flags", {}), dict):
            raise AnnotateError(f"{path}: 'flags' must map flag names to column names")
        return cls(**data)


def _read_rows(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        raise AnnotateError(f"table file not found: {path}")
    text = path.read_text(encoding="utf-8")
    if path.suffix in {".jsonl", ".ndjson"}:
        rows = []
        for number, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as exc:
                    raise AnnotateError(f"{path}:{number}: not valid JSON ({exc})") from None
        return rows
    if path.suffix == ".json":
        rows = json.loads(text)
        if not isinstance(rows, list):
            raise AnnotateError(f"{path}: expected a JSON list of objects")
        return rows
    if path.suffix in {".csv", ".tsv"}:
        return list(csv.DictReader(text.splitlines(), delimiter="\t" if path.suffix == ".tsv" else ","))
    raise AnnotateError(f"{path}: unsupported table format {path.suffix!r} (use .jsonl, .json, .csv or .tsv)")


def _truthy(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)):
        return value != 0
    return isinstance(value, str) and value.strip().casefold() in _TRUE


def _label(value: Any, names: Mapping[str, int] | None, where: str) -> int | None:
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    if isinstance(value, bool):
        raise AnnotateError(f"{where}: {value!r} is not a class")
    if isinstance(value, int):
        return value
    text = str(value).strip()
    if re.fullmatch(r"\d+", text):
        return int(text)
    if names is not None and text.casefold() in names:
        return names[text.casefold()]
    raise AnnotateError(f"{where}: {text!r} is neither a class index nor a known class name")


def read_table(
    path: Path | str,
    mapping: TableMapping,
    *,
    class_names: Sequence[str] | None = None,
) -> Import:
    """Candidates from a JSONL/JSON/CSV/TSV re-annotation with per-image flags."""
    path = Path(path)
    rows = _read_rows(path)
    names = {n.casefold(): i for i, n in enumerate(class_names)} if class_names else None
    if not mapping.flags and not mapping.include_all:
        raise AnnotateError("a table mapping needs at least one flag column, or include_all")
    candidates: list[Candidate] = []
    pairs: list[tuple[int, int]] = []
    for number, row in enumerate(rows, 1):
        where = f"{path}, row {number}"
        if not isinstance(row, dict):
            raise AnnotateError(f"{where}: expected an object")
        if mapping.path not in row or not str(row[mapping.path]).strip():
            raise AnnotateError(f"{where}: missing the path column {mapping.path!r}")
        for column in mapping.flags.values():
            if column not in row:
                raise AnnotateError(f"{where}: missing the flag column {column!r}")
        relpath = str(row[mapping.path]).strip().replace("\\", "/")
        key = str(row[mapping.key]).strip() if mapping.key else PurePosixPath(relpath).name
        original = _label(row.get(mapping.original_label), names, where) if mapping.original_label else None
        if mapping.reassigned and original is not None:
            raw = row.get(mapping.reassigned)
            items = raw if isinstance(raw, list) else re.split(r"[;|]", str(raw or ""))
            for item in items:
                new = _label(item, names, where)
                if new is not None and new != original:
                    pairs.append((original, new))
        flags = tuple(mapping.flag_prefix + f for f, column in mapping.flags.items() if _truthy(row[column]))
        if flags or mapping.include_all:
            url = row.get(mapping.url) if mapping.url else None
            candidates.append(
                Candidate(
                    key=key,
                    path=relpath,
                    original_label=original,
                    flags=flags or (mapping.flag_prefix + "listed",),
                    url=str(url) if url else None,
                    details={"row": {k: row[k] for k in row if isinstance(row[k], (str, int, float, bool))}},
                )
            )
    return Import(candidates, np.asarray(pairs, dtype=np.int64).reshape(-1, 2), path.stem)


def merge_candidates(groups: Iterable[Iterable[Candidate]]) -> list[Candidate]:
    """One candidate per key, with the union of flags; conflicting original labels are an error."""
    merged: dict[str, Candidate] = {}
    for group in groups:
        for cand in group:
            old = merged.get(cand.key)
            if old is None:
                merged[cand.key] = cand
                continue
            if None not in (old.original_label, cand.original_label) and old.original_label != cand.original_label:
                raise AnnotateError(
                    f"image {cand.key}: sources disagree on its original label "
                    f"({old.original_label} vs {cand.original_label})"
                )
            merged[cand.key] = Candidate(
                key=old.key,
                path=old.path if "/" in old.path or "/" not in cand.path else cand.path,
                original_label=old.original_label if old.original_label is not None else cand.original_label,
                flags=tuple(dict.fromkeys(old.flags + cand.flags)),
                url=old.url or cand.url,
                details={**old.details, **cand.details},
            )
    return list(merged.values())
