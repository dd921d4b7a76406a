"""Registry of the datasets the Fi-ImageNet-1k paper compares: names, expected image counts, where they are looked for, list formats.

`check(root)` tells what is present under a data root, what is missing and what does not match its expected
count; `open_registered(name, root)` turns a present set into an `ImageList` for extraction. Counts are the
published sizes of the versions the paper uses; where no fixed public count exists (sets built per model,
sets defined by the paper itself) the entry says so and the check reports the count it finds.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import DataError
from .datasets import ImageList, _walk_images, file_list, image_folder, imagenet

__all__ = ["RegisteredDataset", "REGISTRY", "DatasetStatus", "get", "names", "locate", "check", "open_registered"]


@dataclass(frozen=True)
class RegisteredDataset:
    """One dataset of the Fi-ImageNet-1k paper's comparison: where to find it under a root and how many images it must have."""

    name: str
    title: str
    role: str  # "ood" or "id"
    expected_count: int | None
    count_source: str
    folders: tuple[str, ...]
    list_format: str
    reference: str
    notes: str = ""
    imagenet_split: str | None = None  # for the ImageNet-1k ID sets

    def list_files(self) -> tuple[str, ...]:
        """File-list names accepted instead of a folder (`<name>.csv` / `<name>.txt` under the root)."""
        return (f"{self.name}.csv", f"{self.name}.txt")


_FOLDER_FORMAT = "image folder (images anywhere below it, any sub-folder structure), or a file list <name>.csv/.txt"

REGISTRY: dict[str, RegisteredDataset] = {
    entry.name: entry
    for entry in [
        RegisteredDataset(
            "imagenet-1k-val",
            "ImageNet-1k validation",
            "id",
            50_000,
            "ILSVRC 2012 (Russakovsky et al. 2015)",
            ("imagenet/val", "ILSVRC2012/val", "imagenet-1k/val", "val"),
            "synset sub-folders (n01440764/...), or flat ILSVRC2012_val_*.JPEG with LOC_val_solution.csv",
            "https://image-net.org/challenges/LSVRC/2012/",
            imagenet_split="val",
        ),
        RegisteredDataset(
            "imagenet-1k-train",
            "ImageNet-1k train",
            "id",
            1_281_167,
            "ILSVRC 2012 (Russakovsky et al. 2015)",
            ("imagenet/train", "ILSVRC2012/train", "imagenet-1k/train", "train"),
            "synset sub-folders (n01440764/...)",
            "https://image-net.org/challenges/LSVRC/2012/",
            imagenet_split="train",
        ),
        RegisteredDataset(
            "inat-ood-plants",
            "iNaturalist OOD (plants)",
            "ood",
            10_000,
            "MOS (Huang & Li, CVPR 2021)",
            ("iNaturalist", "inaturalist", "iNaturalist/images", "inat-ood-plants", "images_largescale/inaturalist"),
            _FOLDER_FORMAT,
            "https://github.com/deeplearning-wisc/large_scale_ood",
            "110 plant classes not in ImageNet-1k, 10,000 images as distributed by MOS",
        ),
        RegisteredDataset(
            "openimage-o",
            "OpenImage-O",
            "ood",
            17_632,
            "ViM (Wang et al., CVPR 2022)",
            ("openimage_o", "OpenImage-O", "openimage-o", "images_largescale/openimage_o"),
            _FOLDER_FORMAT,
            "https://github.com/haoqiwang/vim",
            "image list published with ViM over the OpenImages-v3 test set; other circulating subsets are smaller",
        ),
        RegisteredDataset(
            "360openset",
            "360OpenSet",
            "ood",
            None,
            "no fixed public count known to oodbench",
            ("360OpenSet", "360openset", "360_open_set"),
            _FOLDER_FORMAT,
            "as cited by the Fi-ImageNet-1k paper",
            "check the count reported here against the Fi-ImageNet-1k paper's table",
        ),
        RegisteredDataset(
            "cood",
            "C-OOD (class-out-of-distribution)",
            "ood",
            None,
            "per-model severity splits (Galil et al., ICLR 2023); no single count",
            ("COOD", "cood", "c-ood"),
            _FOLDER_FORMAT,
            "https://github.com/mdabbah/COOD_benchmarking",
            "drawn from ImageNet-21k per evaluated model and severity level",
        ),
        RegisteredDataset(
            "imagenet-o",
            "ImageNet-O",
            "ood",
            2_000,
            "Hendrycks et al., CVPR 2021",
            ("imagenet-o", "imagenet_o", "ImageNet-O"),
            _FOLDER_FORMAT + " (ships as 200 synset folders)",
            "https://github.com/hendrycks/natural-adv-examples",
        ),
        RegisteredDataset(
            "textures",
            "Textures (DTD)",
            "ood",
            5_640,
            "DTD (Cimpoi et al., CVPR 2014): 47 classes x 120 images",
            ("dtd/images", "textures", "Textures", "dtd", "images_classic/texture"),
            _FOLDER_FORMAT + " (DTD's images/<class>/ folders)",
            "https://www.robots.ox.ac.uk/~vgg/data/dtd/",
        ),
        RegisteredDataset(
            "places",
            "Places (OOD subset)",
            "ood",
            10_000,
            "MOS (Huang & Li, CVPR 2021)",
            ("Places", "places", "places365"),
            _FOLDER_FORMAT,
            "https://github.com/deeplearning-wisc/large_scale_ood",
        ),
        RegisteredDataset(
            "ssb-easy",
            "SSB easy (ImageNet-21k-P)",
            "ood",
            None,
            "no fixed public count known to oodbench",
            ("ssb_easy", "ssb-easy", "SSB/easy"),
            _FOLDER_FORMAT,
            "https://github.com/sgvaze/SSB",
        ),
        RegisteredDataset(
            "ssb-hard",
            "SSB hard (ImageNet-21k-P)",
            "ood",
            49_000,
            "OpenOOD v1.5 image list (Zhang et al. 2023)",
            ("ssb_hard", "ssb-hard", "SSB/hard", "images_largescale/ssb_hard"),
            _FOLDER_FORMAT,
            "https://github.com/sgvaze/SSB",
        ),
        RegisteredDataset(
            "species",
            "Species",
            "ood",
            None,
            "no fixed public count known to oodbench for the OOD subset",
            ("species", "Species"),
            _FOLDER_FORMAT,
            "Hendrycks et al., ICML 2022 (Scaling OOD detection)",
        ),
        RegisteredDataset(
            "in1k-ood",
            "IN1k-OOD",
            "ood",
            None,
            "no fixed public count known to oodbench",
            ("in1k-ood", "IN1k-OOD", "in1k_ood"),
            _FOLDER_FORMAT,
            "as cited by the Fi-ImageNet-1k paper",
        ),
        RegisteredDataset(
            "ninco",
            "NINCO (main OOD classes)",
            "ood",
            5_879,
            "Bitterwolf et al., ICML 2023",
            ("NINCO/NINCO_OOD_classes", "NINCO_OOD_classes", "ninco", "NINCO"),
            _FOLDER_FORMAT + " (64 class folders)",
            "https://github.com/j-cb/NINCO",
            "point at NINCO_OOD_classes; the unit tests and popular-dataset subsets are separate",
        ),
        RegisteredDataset(
            "clean-ood",
            "CLEAN-OOD",
            "ood",
            None,
            "no fixed public count known to oodbench",
            ("clean-ood", "CLEAN-OOD", "clean_ood"),
            _FOLDER_FORMAT,
            "as cited by the Fi-ImageNet-1k paper",
        ),
        RegisteredDataset(
            "imagenet-ood",
            "ImageNet-OOD",
            "ood",
            31_807,
            "Yang et al., ICLR 2024",
            ("imagenet-ood", "ImageNet-OOD", "imagenet_ood"),
            _FOLDER_FORMAT + " (637 synset folders)",
            "https://github.com/princetonvisualai/imagenetood",
        ),
        RegisteredDataset(
            "fi-imagenet-1k",
            "Fi-ImageNet-1k",
            "ood",
            None,
            "the Fi-ImageNet-1k paper's benchmark; its manifest (from `oodbench annotate export`) fixes the count",
            ("fi-imagenet-1k", "Fi-ImageNet-1k", "fi_imagenet_1k"),
            "file list fi-imagenet-1k.csv (path,label) as exported, or an image folder",
            "the Fi-ImageNet-1k paper",
        ),
    ]
}


def names(role: str | None = None) -> list[str]:
    """Registered dataset names, optionally only `ood` or `id` sets."""
    return [name for name, entry in REGISTRY.items() if role is None or entry.role == role]


def get(name: str) -> RegisteredDataset:
    """The registry entry of `name` (case-insensitive)."""
    key = name.lower()
    if key not in REGISTRY:
        raise DataError(f"unknown dataset {name!r}; registered: {', '.join(REGISTRY)}")
    return REGISTRY[key]


def _case_insensitive(root: Path, relative: str) -> Path | None:
    """`root/relative` resolving each component case-insensitively; None when absent."""
    current = root
    for part in Path(relative).parts:
        exact = current / part
        if exact.exists():
            current = exact
            continue
        try:
            match = next((entry.name for entry in os.scandir(current) if entry.name.lower() == part.lower()), None)
        except (FileNotFoundError, NotADirectoryError):
            return None
        if match is None:
            return None
        current = current / match
    return current


def locate(entry: RegisteredDataset, root: str | os.PathLike[str]) -> Path | None:
    """Where `entry` lives under `root`: a file list first, then the first candidate folder present."""
    root = Path(root)
    for name in entry.list_files():
        found = _case_insensitive(root, name)
        if found is not None and found.is_file():
            return found
    for folder in entry.folders:
        found = _case_insensitive(root, folder)
        if found is not None and found.is_dir():
            return found
    return None


def open_registered(name: str, root: str | os.PathLike[str]) -> ImageList:
    """The registered dataset `name` found under `root`, as an ImageList (OOD sets unlabelled)."""
    entry = get(name)
    path = locate(entry, root)
    if path is None:
        looked = ", ".join(list(entry.list_files()) + list(entry.folders))
        raise DataError(f"{entry.title} ({entry.name}) not found under {root}; looked for {looked}")
    if path.is_file():
        dataset = file_list(path)
        if entry.role == "ood":
            dataset = ImageList(dataset.root, dataset.items, None, None, dataset.source)
    elif entry.imagenet_split is not None:
        dataset = imagenet(path, split=entry.imagenet_split)
    else:
        dataset = image_folder(path, labels=False)
    return ImageList(
        dataset.root, dataset.items, dataset.labels, dataset.class_names, {**dataset.source, "registry": entry.name}
    )


@dataclass
class DatasetStatus:
    """Outcome of checking one registered dataset under a root."""

    name: str
    title: str
    status: str  # ok | count mismatch | present (no reference count) | missing | unreadable
    path: str | None
    found: int | None
    expected: int | None
    message: str
    unreadable: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        """JSON-friendly form."""
        return dict(self.__dict__)


def _count(entry: RegisteredDataset, path: Path) -> tuple[int, list[str]]:
    """Image count of a located dataset and its item paths (absolute)."""
    if path.is_file():
        dataset = file_list(path)
        return len(dataset), dataset.paths(range(len(dataset)))
    items = _walk_images(path)
    return len(items), [str(path / item) for item in items]


def check(
    root: str | os.PathLike[str], *, datasets: list[str] | None = None, verify: bool = False
) -> list[DatasetStatus]:
    """Check which registered datasets are under `root`, their image counts, and (with `verify`) that images decode."""
    from .datasets import UnreadableImage, load_rgb

    root = Path(root)
    if not root.is_dir():
        raise DataError(f"data root {root} is not a directory")
    selected = [get(name) for name in datasets] if datasets else list(REGISTRY.values())
    report: list[DatasetStatus] = []
    for entry in selected:
        path = locate(entry, root)
        if path is None:
            report.append(
                DatasetStatus(
                    entry.name,
                    entry.title,
                    "missing",
                    None,
                    None,
                    entry.expected_count,
                    f"looked for {', '.join(entry.folders)} or {entry.list_files()[0]}; expected: {entry.list_format}",
                )
            )
            continue
        try:
            found, paths = _count(entry, path)
        except DataError as exc:
            report.append(
                DatasetStatus(entry.name, entry.title, "unreadable", str(path), None, entry.expected_count, str(exc))
            )
            continue
        unreadable: list[str] = []
        if verify:
            for image_path in paths:
                try:
                    load_rgb(image_path)
                except UnreadableImage as exc:
                    unreadable.append(f"{image_path}: {exc}")
        if entry.expected_count is None:
            status, message = "present (no reference count)", f"{found} images; {entry.count_source}"
        elif found == entry.expected_count:
            status, message = "ok", f"{found} images as expected ({entry.count_source})"
        else:
            status = "count mismatch"
            message = (
                f"{found} images but {entry.expected_count} expected ({entry.count_source}); {entry.notes}".rstrip("; ")
            )
        if unreadable:
            message += f"; {len(unreadable)} unreadable image(s) (skipped at extraction)"
        report.append(
            DatasetStatus(entry.name, entry.title, status, str(path), found, entry.expected_count, message, unreadable)
        )
    return report
