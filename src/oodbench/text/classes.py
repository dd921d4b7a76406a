"""ID class lists (names in label order, WordNet ids when known) and the one label normaliser of the project.

Specs accepted by `load_classes`:

- ``imagenet1k`` (also spelled ``imagenet-1k``): the 1000 ImageNet-1k classes in the standard synset order, WordNet
  ids from timm's ImageNet metadata and the prompt names curated for CLIP by OpenAI (as shipped by open_clip and
  used by MCM, NegLabel and the Fi-ImageNet-1k paper);
- ``imagenet1k:timm``: the same classes named by the first lemma of timm's WordNet descriptions;
- ``imagenet1k@FILE``: the subset whose WordNet ids FILE lists (e.g. ImageNet-10/20/100 class lists);
- a path: ``.txt`` (one name per line, or ``wnid<TAB or ,>name``) or ``.json`` (a list of names, a
  ``{wnid: name}`` map, or the ``{"0": [wnid, name]}`` ImageNet class index).

The zero-shot scores embed the names; the annotation app shows them and looks up example images in class folders
named by the WordNet ids.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..core.errors import OodbenchError

__all__ = ["ClassList", "ClassListError", "load_classes", "imagenet1k", "imagenet_wnids", "normalize_label"]

_WNID = re.compile(r"^n\d{8}\Z")
_WNID_NAME = re.compile(r"^(n\d{8})\s*[\t,]\s*(.+)$")
_SPACES = re.compile(r"\s+")
# Quotes, bullets and sentence punctuation that LLM replies and word lists leave around a name.
_EDGE = " \t\"'`*_.,;:!?()[]{}<>•·–—-"
IMAGENET_SPECS = ("imagenet1k", "imagenet-1k")


class ClassListError(OodbenchError, ValueError):
    """A class list that cannot be read or is inconsistent (empty, names and ids of different lengths, ...)."""


def normalize_label(text: str) -> str:
    """Canonical form of a label: NFKC, lower case, underscores as spaces, single spaces, no edge punctuation.

    The one key labels, class names and WordNet lemmas are compared by (vocabulary de-duplication, the ID filter,
    lemma look-ups).
    """
    text = unicodedata.normalize("NFKC", str(text)).replace("_", " ")
    text = _SPACES.sub(" ", text).strip(_EDGE)
    return _SPACES.sub(" ", text).lower()


@dataclass(frozen=True)
class ClassList:
    """Names of the ID classes in label order, their WordNet ids when known, and where they came from.

    For a label set that is not WordNet-based, `wnids` may hold the class folder names instead (the annotation app
    looks up example images in folders named by them).
    """

    names: tuple[str, ...]
    wnids: tuple[str | None, ...] | None = None
    source: str = ""

    def __post_init__(self) -> None:
        if not self.names:
            raise ClassListError(f"class list {self.source!r} is empty")
        if any(not isinstance(n, str) or not n.strip() for n in self.names):
            raise ClassListError(f"class list {self.source!r} contains an empty name")
        if self.wnids is not None and len(self.wnids) != len(self.names):
            raise ClassListError(
                f"class list {self.source!r}: {len(self.wnids)} WordNet ids for {len(self.names)} names"
            )

    def __len__(self) -> int:
        return len(self.names)

    def name(self, index: int | None) -> str | None:
        """Display name of a class index (None for None)."""
        if index is None:
            return None
        if not 0 <= index < len(self.names):
            raise ClassListError(f"class index {index} is outside 0..{len(self.names) - 1}")
        return self.names[index]

    @property
    def hash(self) -> str:
        """SHA-256 of the names and ids in order: the identity recorded in vocabulary and run provenance."""
        payload = json.dumps([list(self.names), list(self.wnids) if self.wnids else None], ensure_ascii=False)
        return hashlib.sha256(payload.encode("utf-8")).hexdigest()

    def describe(self) -> dict[str, Any]:
        """Provenance record: source, size, hash."""
        return {"source": self.source, "num_classes": len(self), "hash": self.hash}

    def to_json(self) -> dict[str, Any]:
        """JSON-ready form (see `from_json`)."""
        return {
            "names": list(self.names),
            "wnids": None if self.wnids is None else list(self.wnids),
            "source": self.source,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ClassList:
        """Inverse of `to_json`; also reads the annotation app's earlier form, whose ids were called "folders"."""
        ids = data.get("wnids", data.get("folders"))
        return cls(tuple(data["names"]), None if ids is None else tuple(ids), str(data.get("source", "")))


def _timm_info_dir() -> Path | None:
    """timm's ImageNet metadata folder, located without importing timm (and torch with it)."""
    spec = importlib.util.find_spec("timm")
    info = Path(spec.origin).parent / "data" / "_info" if spec and spec.origin else None
    return info if info is not None and (info / "imagenet_synsets.txt").is_file() else None


def imagenet_wnids() -> tuple[tuple[str, ...], dict[str, str]]:
    """ImageNet-1k WordNet ids in label order and their timm descriptions (comma-separated lemmas)."""
    info = _timm_info_dir()
    if info is not None and (info / "imagenet_synset_to_lemma.txt").is_file():
        wnids = tuple(info.joinpath("imagenet_synsets.txt").read_text(encoding="utf-8").split())
        lines = info.joinpath("imagenet_synset_to_lemma.txt").read_text(encoding="utf-8").splitlines()
        lemmas = dict(line.split("\t", 1) for line in lines if "\t" in line)
    else:  # a timm whose data files moved: ask its API
        from timm.data import ImageNetInfo

        meta = ImageNetInfo("imagenet-1k")
        wnids = tuple(meta.label_names())
        lemmas = {w: meta.index_to_description(i) for i, w in enumerate(wnids)}
    if len(wnids) != 1000:
        raise ClassListError(f"timm's ImageNet-1k metadata lists {len(wnids)} classes, not 1000")
    return wnids, lemmas


def imagenet1k(names: str = "clip") -> ClassList:
    """ImageNet-1k in synset order: WordNet ids from timm, names 'clip' (OpenAI's prompt names) or 'timm'."""
    wnids, lemmas = imagenet_wnids()
    if names == "clip":
        from open_clip.zero_shot_metadata import IMAGENET_CLASSNAMES

        label_names = tuple(IMAGENET_CLASSNAMES)
    elif names == "timm":
        label_names = tuple(lemmas[w].split(",")[0].strip() for w in wnids)
    else:
        raise ClassListError(f"unknown ImageNet naming {names!r}: use 'clip' or 'timm'")
    if len(label_names) != len(wnids):
        raise ClassListError(f"ImageNet metadata disagree: {len(label_names)} names for {len(wnids)} WordNet ids")
    return ClassList(label_names, wnids, f"imagenet1k:{names}")


def _read_file(path: Path) -> ClassList:
    if not path.is_file():
        raise ClassListError(
            f"class list not found: {path} (pass a .txt/.json file, imagenet1k, imagenet1k:timm or imagenet1k@WNIDS)"
        )
    text = path.read_text(encoding="utf-8")
    if path.suffix.lower() == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ClassListError(f"{path} is not valid JSON: {exc}") from None
        if isinstance(data, list) and all(isinstance(x, str) for x in data):
            return ClassList(tuple(data), None, str(path))
        if isinstance(data, dict) and data and all(isinstance(v, list) and len(v) == 2 for v in data.values()):
            try:
                order = sorted(data, key=int)
            except ValueError:
                raise ClassListError(f"{path}: keys must be class indices") from None
            if [int(k) for k in order] != list(range(len(order))):
                raise ClassListError(f"{path}: class indices must be exactly 0..{len(order) - 1}")
            names = tuple(str(data[k][1]).replace("_", " ") for k in order)
            return ClassList(names, tuple(str(data[k][0]) for k in order), str(path))
        if isinstance(data, dict) and all(isinstance(v, str) for v in data.values()):
            return ClassList(tuple(data.values()), tuple(k if _WNID.match(k) else None for k in data), str(path))
        raise ClassListError(
            f"{path}: expected a list of names, a {{wnid: name}} map or an index {{'0': [wnid, name]}}"
        )
    lines = [line for line in (raw.strip() for raw in text.splitlines()) if line and not line.startswith("#")]
    names, wnids = [], []
    for line in lines:
        match = _WNID_NAME.match(line)
        if match:
            wnids.append(match[1])
            names.append(match[2].strip())
        else:
            wnids.append(None)
            names.append(line)
    if names and all(_WNID.match(n) for n in names):
        raise ClassListError(f"{path} lists WordNet ids only; select ImageNet classes with 'imagenet1k@{path}'")
    return ClassList(tuple(names), tuple(wnids) if any(wnids) else None, str(path))


def _subset(base: ClassList, wnid_file: Path) -> ClassList:
    if not wnid_file.is_file():
        raise ClassListError(f"WordNet id list {wnid_file} does not exist")
    wanted = [w.split(",")[0].strip() for w in wnid_file.read_text(encoding="utf-8").split() if w.strip()]
    position = {w: i for i, w in enumerate(base.wnids or ())}
    unknown = [w for w in wanted if w not in position]
    if unknown:
        raise ClassListError(
            f"{wnid_file}: {len(unknown)} WordNet ids are not classes of {base.source} (e.g. {unknown[:3]})"
        )
    rows = [position[w] for w in wanted]
    return ClassList(tuple(base.names[i] for i in rows), tuple(wanted), f"{base.source}@{wnid_file}")


def load_classes(spec: str | os.PathLike[str] | Sequence[str] | ClassList) -> ClassList:
    """A ClassList from a spec ('imagenet1k', 'imagenet1k:timm', 'imagenet1k@wnids.txt', a file) or a list of names."""
    if isinstance(spec, ClassList):
        return spec
    if isinstance(spec, os.PathLike):
        spec = os.fspath(spec)
    if not isinstance(spec, str):
        return ClassList(tuple(spec), None, "inline")
    base, at, subset = spec.partition("@")
    family, _, naming = base.partition(":")
    if family in IMAGENET_SPECS and naming in ("", "clip", "timm"):
        classes = imagenet1k(naming or "clip")
        return _subset(classes, Path(subset)) if at else classes
    if at:
        raise ClassListError(f"subsets ('@FILE') are defined for imagenet1k only; got {spec!r}")
    return _read_file(Path(spec))
