"""ID class lists for zero-shot scoring: names to embed, optional WordNet ids (for synonym filtering), a content hash.

``imagenet1k``: the 1000 classes in the standard synset order, WordNet ids from timm's ImageNet metadata and
the prompt names curated for CLIP by OpenAI (as shipped by open_clip and used by MCM, NegLabel and the seed).
``imagenet1k:timm``: the same classes named by the first lemma of timm's WordNet descriptions.
``imagenet1k@FILE``: the subset whose WordNet ids FILE lists (e.g. ImageNet-10/20/100 class lists).
A path: ``.txt`` (one name per line, or ``wnid<TAB or ,>name``) or ``.json`` (a list of names, a
``{wnid: name}`` map, or the ``{"0": [wnid, name]}`` ImageNet class index).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import ZeroShotError

__all__ = ["ClassList", "load_classes", "imagenet1k"]

_WNID = re.compile(r"^n\d{8}$")
_WNID_NAME = re.compile(r"^(n\d{8})\s*[\t,]\s*(.+)$")


@dataclass(frozen=True)
class ClassList:
    """Names of the ID classes in label order, their WordNet ids when known, and where they came from."""

    names: tuple[str, ...]
    wnids: tuple[str | None, ...] | None = None
    source: str = ""

    def __post_init__(self) -> None:
        if not self.names:
            raise ZeroShotError(f"class list {self.source!r} is empty")
        if any(not isinstance(n, str) or not n.strip() for n in self.names):
            raise ZeroShotError(f"class list {self.source!r} contains an empty name")
        if self.wnids is not None and len(self.wnids) != len(self.names):
            raise ZeroShotError(
                f"class list {self.source!r}: {len(self.wnids)} WordNet ids for {len(self.names)} names"
            )

    def __len__(self) -> int:
        return len(self.names)

    @property
    def hash(self) -> str:
        """SHA-256 of the names and ids in order: the identity recorded in vocabulary and run provenance."""
        payload = json.dumps([list(self.names), list(self.wnids) if self.wnids else None], ensure_ascii=False)
        return hashlib.sha256(payload.encode("utf-8")).hexdigest()

    def describe(self) -> dict[str, Any]:
        """Provenance record: source, size, hash."""
        return {"source": self.source, "num_classes": len(self), "hash": self.hash}


def imagenet1k(names: str = "clip") -> ClassList:
    """ImageNet-1k in synset order: WordNet ids from timm, names 'clip' (OpenAI's prompt names) or 'timm'."""
    from timm.data import ImageNetInfo

    info = ImageNetInfo()
    wnids = tuple(info.label_names())
    if names == "clip":
        from open_clip.zero_shot_metadata import IMAGENET_CLASSNAMES

        label_names = tuple(IMAGENET_CLASSNAMES)
    elif names == "timm":
        label_names = tuple(d.split(",")[0].strip() for d in info.label_descriptions())
    else:
        raise ZeroShotError(f"unknown ImageNet naming {names!r}: use 'clip' or 'timm'")
    if len(label_names) != len(wnids):
        raise ZeroShotError(f"ImageNet metadata disagree: {len(label_names)} names for {len(wnids)} WordNet ids")
    return ClassList(label_names, wnids, f"imagenet1k:{names}")


def read_list_file(path: str | os.PathLike[str], what: str) -> tuple[Any, bool]:
    """(parsed value, True) for a `.json` file; (stripped lines without blanks and '#' comments, False) otherwise."""
    path = Path(path)
    if not path.is_file():
        raise ZeroShotError(f"{what} {path} does not exist")
    text = path.read_text(encoding="utf-8")
    if path.suffix.lower() != ".json":
        return [line for line in (raw.strip() for raw in text.splitlines()) if line and not line.startswith("#")], False
    try:
        return json.loads(text), True
    except json.JSONDecodeError as exc:
        raise ZeroShotError(f"{path} is not valid JSON: {exc}") from None


def _read_file(path: Path) -> ClassList:
    data, from_json = read_list_file(path, "class list file")
    if from_json:
        if isinstance(data, list) and all(isinstance(x, str) for x in data):
            return ClassList(tuple(data), None, str(path))
        if isinstance(data, dict) and all(isinstance(v, list) and len(v) == 2 for v in data.values()):
            items = sorted(data.items(), key=lambda kv: int(kv[0]))
            return ClassList(tuple(v[1].replace("_", " ") for _, v in items), tuple(v[0] for _, v in items), str(path))
        if isinstance(data, dict) and all(isinstance(v, str) for v in data.values()):
            return ClassList(tuple(data.values()), tuple(k if _WNID.match(k) else None for k in data), str(path))
        raise ZeroShotError(f"{path}: expected a list of names, a {{wnid: name}} map or an index {{'0': [wnid, name]}}")
    names, wnids = [], []
    for line in data:
        match = _WNID_NAME.match(line)
        if match:
            wnids.append(match[1])
            names.append(match[2].strip())
        else:
            wnids.append(None)
            names.append(line)
    if names and all(_WNID.match(n) for n in names):
        raise ZeroShotError(f"{path} lists WordNet ids only; select ImageNet classes with 'imagenet1k@{path}'")
    return ClassList(tuple(names), tuple(wnids) if any(wnids) else None, str(path))


def _subset(base: ClassList, wnid_file: Path) -> ClassList:
    if not wnid_file.is_file():
        raise ZeroShotError(f"WordNet id list {wnid_file} does not exist")
    wanted = [w.split(",")[0].strip() for w in wnid_file.read_text(encoding="utf-8").split() if w.strip()]
    position = {w: i for i, w in enumerate(base.wnids or ())}
    unknown = [w for w in wanted if w not in position]
    if unknown:
        raise ZeroShotError(
            f"{wnid_file}: {len(unknown)} WordNet ids are not classes of {base.source} (e.g. {unknown[:3]})"
        )
    rows = [position[w] for w in wanted]
    return ClassList(tuple(base.names[i] for i in rows), tuple(wanted), f"{base.source}@{wnid_file}")


def load_classes(spec: str | Sequence[str] | ClassList) -> ClassList:
    """A ClassList from a spec ('imagenet1k', 'imagenet1k:timm', 'imagenet1k@wnids.txt', a file) or a list of names."""
    if isinstance(spec, ClassList):
        return spec
    if not isinstance(spec, str):
        return ClassList(tuple(spec), None, "inline")
    base, at, subset = spec.partition("@")
    if base in ("imagenet1k", "imagenet1k:clip", "imagenet1k:timm"):
        classes = imagenet1k(base.partition(":")[2] or "clip")
        return _subset(classes, Path(subset)) if at else classes
    if at:
        raise ZeroShotError(f"subsets ('@FILE') are defined for imagenet1k only; got {spec!r}")
    return _read_file(Path(spec))
