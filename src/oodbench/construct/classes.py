"""The ID class list a project annotates against: display names and, when known, folder ids."""

from __future__ import annotations

import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path

from ..errors import ConstructError


@dataclass(frozen=True)
class ClassList:
    """Class names in class-index order, with optional folder ids (e.g. ImageNet WordNet ids)."""

    names: tuple[str, ...]
    folders: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        if not self.names:
            raise ConstructError("the class list is empty")
        if self.folders is not None and len(self.folders) != len(self.names):
            raise ConstructError("the class list has a different number of names and folder ids")

    def __len__(self) -> int:
        return len(self.names)

    def name(self, index: int | None) -> str | None:
        """Display name of a class index (None for None)."""
        if index is None:
            return None
        if not 0 <= index < len(self.names):
            raise ConstructError(f"class index {index} is outside 0..{len(self.names) - 1}")
        return self.names[index]

    def to_json(self) -> dict:
        """JSON-ready form (see `from_json`)."""
        return {"names": list(self.names), "folders": None if self.folders is None else list(self.folders)}

    @classmethod
    def from_json(cls, data: dict) -> ClassList:
        """Inverse of `to_json`."""
        folders = data.get("folders")
        return cls(tuple(data["names"]), None if folders is None else tuple(folders))


def imagenet_classes() -> ClassList:
    """The 1,000 ImageNet-1k classes (first synonym as name, WordNet id as folder) from timm's metadata."""
    spec = importlib.util.find_spec("timm")  # locates timm without importing it (and torch with it)
    info = Path(spec.origin).parent / "data" / "_info" if spec and spec.origin else None
    if (
        info is not None
        and (info / "imagenet_synsets.txt").is_file()
        and (info / "imagenet_synset_to_lemma.txt").is_file()
    ):
        wnids = tuple(info.joinpath("imagenet_synsets.txt").read_text(encoding="utf-8").split())
        lemma_lines = info.joinpath("imagenet_synset_to_lemma.txt").read_text(encoding="utf-8").splitlines()
        lemmas = dict(line.split("\t", 1) for line in lemma_lines if "\t" in line)
    else:  # a timm whose data files moved: ask its API
        from timm.data import ImageNetInfo

        meta = ImageNetInfo("imagenet-1k")
        wnids = tuple(meta.label_names())
        lemmas = {w: meta.index_to_description(i) for i, w in enumerate(wnids)}
    if len(wnids) != 1000:
        raise ConstructError(f"timm's ImageNet-1k metadata lists {len(wnids)} classes, not 1000")
    return ClassList(tuple(lemmas[w].split(",")[0].strip() for w in wnids), wnids)


def load_classes(spec: str | Path) -> ClassList:
    """A class list from `imagenet-1k`, a text file (one name per line) or a JSON file.

    JSON may be a list of names or Keras' `imagenet_class_index.json` form `{"0": [wnid, name]}`.
    """
    if str(spec) == "imagenet-1k":
        return imagenet_classes()
    path = Path(spec)
    if not path.is_file():
        raise ConstructError(f"class list not found: {path} (pass a file or 'imagenet-1k')")
    if path.suffix == ".json":
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise ConstructError(f"{path}: not valid JSON ({exc})") from None
        if isinstance(data, list) and all(isinstance(x, str) for x in data):
            return ClassList(tuple(data))
        if isinstance(data, dict) and all(isinstance(v, list) and len(v) == 2 for v in data.values()):
            try:
                order = sorted(data, key=int)
            except ValueError:
                raise ConstructError(f"{path}: keys must be class indices") from None
            if [int(k) for k in order] != list(range(len(order))):
                raise ConstructError(f"{path}: class indices must be exactly 0..{len(order) - 1}")
            return ClassList(
                tuple(str(data[k][1]).replace("_", " ") for k in order), tuple(str(data[k][0]) for k in order)
            )
        raise ConstructError(f"{path}: expected a list of names or {{index: [folder, name]}}")
    names = tuple(line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip())
    return ClassList(names)
