"""Rehearsal data roots: every set the Fi-ImageNet-1k experiment reads, at its real layout, names and counts.

`make_root(DIR)` writes what a user's download holds, laid out as ``configs/fi-imagenet-1k.toml`` expects:

```
DIR/imagenet/train/<wnid>/<wnid>_<k>.JPEG            ImageNet-1k train, 1,281,167 files (--scale shrinks it)
DIR/imagenet/val/<wnid>/ILSVRC2012_val_<n>.JPEG      ImageNet-1k val, 50,000 files, each in its real class folder
DIR/fi-imagenet-1k/fi_imagenet_1k_{ood,ambiguous}.txt the two Fi-ImageNet-1k lists (655 and 980 val names)
DIR/imagelists/                                      the official OOD image lists, copied from --lists
DIR/ood/<set folders>                                the 15 OOD sets of Table 3 and NINCO's 11 cleaned sub-samples
DIR/ood/imagenetood.txt                              an ImageNet-OOD list in the authors' layout (31,802 paths)
DIR/rehearsal.json                                   what was written: sets, counts, defects, extras
```

Where an official list exists (NINCO, CLEAN-OOD, iNat-OOD Plants, OpenImage-O, SSB easy / hard), the file names
are its entries, read through the registry (`dataset_registry.official_entries`, checksums verified); the
validation images sit in the class folders of the shipped val index (`data/label-errors`). Names the paper's
sources do not publish (train file numbers and per-class counts, the sets without a list, the Fi-ImageNet-1k and
ImageNet-OOD lists) are made up, deterministically, with the published counts.

Every image is a 32x24 JPEG (PNG where the name ends in ``.png``) of 4x3 uniform 8x8 blocks whose colours are a
hash of its path relative to DIR (`expected_pixels`), so two runs write the same bytes and an image read for the
wrong path is detected (`image_matches`). A few files carry the defects a real download has (`DEFECTS`): a truncated
JPEG, a CMYK JPEG, a greyscale PNG, a 16-bit PNG, an EXIF-rotated JPEG, a zero-byte file, an HTML page saved
under an image name, files that are not images, and images beside a list that it does not name.

``fraction`` (< 1) keeps that share of every test set (val, the Fi lists, the OOD sets), each class or list
keeping its first files; a set with an image list then gets ``DIR/ood/<name>.txt`` naming the files kept, which the
registry reads in place of the official list (the official files stay in DIR/imagelists). Writing is resumable: a
file already there with the size it would be written at is kept.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import shutil
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from ..core.errors import DataError
from ..util.atomic import atomic_write_json, atomic_write_text

__all__ = [
    "DEFECTS",
    "SetPlan",
    "RootPlan",
    "ROOT_SETS",
    "plan_root",
    "make_root",
    "expected_pixels",
    "image_bytes",
    "image_matches",
    "TRAIN_COUNT",
    "IMAGE_SIZE",
]

TRAIN_COUNT = 1_281_167  # ImageNet-1k train (ILSVRC 2012), as the registry gives it
VAL_PER_CLASS = 50
FI_OOD, FI_AMBIGUOUS = 655, 980  # Fi-ImageNet-1k: 50,000 - 48,365 (the ID set) - 655 = 980 ambiguous images
IMAGE_SIZE = (32, 24)  # width, height: 4x3 blocks of 8x8 pixels
_BLOCK = 8
FI_FILES = ("fi_imagenet_1k_ood.txt", "fi_imagenet_1k_ambiguous.txt")
IMAGENET_OOD_LIST = "imagenetood.txt"

# The deliberate defects, by kind: what the file holds and what extraction must say about it.
DEFECTS: dict[str, str] = {
    "truncated-jpeg": "a JPEG cut in half (an interrupted download): unreadable, skipped",
    "cmyk-jpeg": "a CMYK JPEG (ImageNet train has 22): decoded by PIL and converted to RGB",
    "grey-png": "a greyscale PNG: converted to RGB",
    "png16": "a 16-bit greyscale PNG: scaled to 8 bits, then RGB",
    "exif-rotated": "a JPEG with EXIF orientation 6: decoded as stored (no rotation), like timm and torchvision",
    "zero-byte": "an empty file under an image name: unreadable, skipped",
    "html": "an HTML error page saved under an image name: unreadable, skipped",
}
# Files beside the sets that are not part of them: extraction never reads them, the checks count them.
_NON_IMAGES = ("ood/Places/Thumbs.db", "ood/NINCO/README.txt", "imagenet/val/n01440764/.DS_Store")

# The 47 DTD texture classes (Cimpoi et al. 2014), 120 images each: dtd/images/<class>/<class>_<nnnn>.jpg.
_DTD = (
    "banded blotchy braided bubbly bumpy chequered cobwebbed cracked crosshatched crystalline dotted fibrous "
    "flecked freckled frilly gauzy grid grooved honeycombed interlaced knitted lacelike lined marbled matted "
    "meshed paisley perforated pitted pleated polka-dotted porous potholed scaly smeared spiralled sprinkled "
    "stained stratified striped studded swirly veined waffled woven wrinkled zigzagged"
).split()

# Every set the Fi config reads, in the order they are written. The *-clean sets are folders of clean-ood.
ROOT_SETS = (
    "imagenet-1k-val",
    "imagenet-1k-train",
    "inat-ood-plants",
    "openimage-o",
    "360openset",
    "cood",
    "imagenet-o",
    "textures",
    "places",
    "ssb-easy",
    "ssb-hard",
    "species",
    "in1k-ood",
    "ninco",
    "clean-ood",
    "imagenet-ood",
)


# ----------------------------------------------------------------------------------------------- pixels
def expected_pixels(relative: str) -> np.ndarray:
    """The pixels (24, 32, 3) uint8 of the image written at `relative` (POSIX path under the root)."""
    digest = hashlib.blake2b(relative.encode("utf-8"), digest_size=36).digest()
    blocks = np.frombuffer(digest, dtype=np.uint8).reshape(3, 4, 3)
    return np.repeat(np.repeat(blocks, _BLOCK, axis=0), _BLOCK, axis=1)


def _encode(pixels: np.ndarray, fmt: str, **options: Any) -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    image = Image.fromarray(pixels)
    if fmt == "JPEG":
        # 4:4:4 and quality 95: a uniform 8x8 block keeps its colour within a few levels
        image.save(buffer, "JPEG", quality=95, subsampling=0, **options)
    else:
        image.save(buffer, "PNG", compress_level=1, **options)
    return buffer.getvalue()


def image_bytes(relative: str, kind: str = "image") -> bytes:
    """The bytes written at `relative`: its image (JPEG, PNG for ``.png`` names), or the defect `kind`."""
    pixels = expected_pixels(relative)
    fmt = "PNG" if relative.lower().endswith(".png") else "JPEG"
    if kind == "image":
        return _encode(pixels, fmt)
    if kind == "truncated-jpeg":
        whole = _encode(pixels, "JPEG")
        return whole[: len(whole) // 2]
    if kind == "cmyk-jpeg":
        from PIL import Image

        buffer = io.BytesIO()
        Image.fromarray(pixels).convert("CMYK").save(buffer, "JPEG", quality=95)
        return buffer.getvalue()
    if kind == "grey-png":
        return _encode(pixels[..., 0].copy(), "PNG")
    if kind == "png16":
        return _encode(pixels[..., 0].astype(np.uint16) * 257, "PNG")
    if kind == "exif-rotated":
        from PIL import Image

        exif = Image.Exif()
        exif[0x0112] = 6  # orientation: rotate 90 degrees clockwise to display
        return _encode(pixels, "JPEG", exif=exif.tobytes())
    if kind == "zero-byte":
        return b""
    if kind == "html":
        return b"<!DOCTYPE html><html><head><title>404 Not Found</title></head><body>Not Found</body></html>\n"
    if kind == "non-image":
        return f"not an image: {relative}\n".encode()
    raise DataError(f"unknown rehearsal file kind {kind!r}")


def image_matches(path: str | os.PathLike[str], relative: str, *, tolerance: int = 8) -> bool:
    """Whether the image at `path` is the one written for `relative`: each 8x8 block's mean within `tolerance`
    levels of its colour (JPEG at quality 95 keeps a uniform block within about 2)."""
    from .datasets import load_rgb

    pixels = np.asarray(load_rgb(path), dtype=np.float64)
    if pixels.shape != (IMAGE_SIZE[1], IMAGE_SIZE[0], 3):
        return False
    means = pixels.reshape(3, _BLOCK, 4, _BLOCK, 3).mean(axis=(1, 3))
    expected = expected_pixels(relative)[::_BLOCK, ::_BLOCK].astype(np.float64)
    return bool(np.abs(means - expected).max() <= tolerance)


# ----------------------------------------------------------------------------------------------- the plan
@dataclass
class SetPlan:
    """One set as written: its folder under the root, its files (relative to the folder), and what else is there."""

    name: str
    folder: str  # relative to the root
    files: list[str]  # the set's images, relative to `folder`
    listed: int  # files its list names (or the folder holds) at full size
    subset_list: str | None = None  # at fraction < 1: the list naming the files kept (relative to the root)
    shares_files_with: str | None = None  # files written by another set (the *-clean folders, SSB's shared folder)

    def paths(self) -> Iterator[str]:
        """The files' paths relative to the root."""
        prefix = f"{self.folder}/" if self.folder else ""
        return (prefix + file for file in self.files)


@dataclass
class RootPlan:
    """Everything `make_root` writes: per set its files, the defects (path: kind), extra files and list files."""

    sets: list[SetPlan]
    defects: dict[str, str] = field(default_factory=dict)
    extras: dict[str, str] = field(default_factory=dict)  # path: kind ("image" not on a list, or "non-image")
    texts: dict[str, str] = field(default_factory=dict)  # list files written by the rehearsal: path: content
    scale: float = 1.0
    fraction: float = 1.0

    def files(self) -> Iterator[tuple[str, str]]:
        """(path relative to the root, kind) of every file to write, each once."""
        seen: set[str] = set()
        for plan in self.sets:
            if plan.shares_files_with is not None:
                continue
            for path in plan.paths():
                if path not in seen:
                    seen.add(path)
                    yield path, self.defects.get(path, "image")
        for path, kind in self.extras.items():
            if path not in seen:
                yield path, kind

    def count(self) -> int:
        """How many files `files` yields."""
        return sum(1 for _ in self.files())


def _keep(count: int, fraction: float) -> int:
    """Files kept of `count` at `fraction`: at least one of a non-empty group."""
    return count if fraction >= 1 else max(1, round(count * fraction)) if count else 0


def _train_counts(scale: float) -> list[int]:
    """Files per class of ImageNet-1k train: 1,281,167 in all, 1,281 or 1,282 per class (ImageNet's own per-class
    counts are not shipped), then `scale` applied on the running total so the classes keep proportion."""
    full = [TRAIN_COUNT * (c + 1) // 1000 - TRAIN_COUNT * c // 1000 for c in range(1000)]
    if scale >= 1:
        return full
    running = np.concatenate([[0], np.cumsum(full)])
    kept = np.floor(running * scale).astype(np.int64)
    return [int(v) for v in np.diff(kept)]


def _val_index() -> list[str]:
    """The 50,000 validation images as ``val/<wnid>/ILSVRC2012_val_<n>.JPEG`` (the shipped val index)."""
    data = resources.files("oodbench.data").joinpath("label-errors/imagenet_val_set_index_to_filepath.json.gz")
    with data.open("rb") as handle:
        return list(json.loads(gzip.decompress(handle.read())))


def _synsets() -> list[str]:
    """The 1000 ImageNet-1k synsets in class-index order (sorted), from the val index: no timm, hence no torch, is
    imported, which keeps the writer processes small."""
    return sorted({path.split("/")[1] for path in _val_index()})


def _by_group(files: Sequence[str], fraction: float, *, each: bool = False) -> list[str]:
    """The first files of each folder at `fraction`, kept in proportion over the folders (a running total, as for
    train) and at least one file in all (`each`: in every folder); in the given order."""
    if fraction >= 1:
        return list(files)
    groups: dict[str, list[str]] = {}
    for file in files:
        groups.setdefault(file.rsplit("/", 1)[0] if "/" in file else "", []).append(file)
    sizes = np.asarray([len(members) for members in groups.values()])
    running = np.floor(np.concatenate([[0], np.cumsum(sizes)]) * fraction).astype(np.int64)
    kept = [m[: max(n, int(each))] for m, n in zip(groups.values(), np.diff(running), strict=True)]
    chosen = [f for members in kept for f in members]
    return chosen or list(files[:1])


def _fake_synsets(count: int, first: int) -> list[str]:
    """WordNet-like ids that are not ImageNet-1k classes (n1xxxxxxx, n2xxxxxxx): for sets whose classes are made up."""
    return [f"n{first + i:08d}" for i in range(count)]


def _made_up(name: str) -> list[str]:
    """Files of the sets whose authors publish no list (or whose list oodbench does not carry), at their sizes."""
    from . import dataset_registry

    count = dataset_registry.get(name).expected_count or 0
    if name == "360openset":
        return [f"images/360openset_{i:05d}.jpg" for i in range(count)]
    if name == "cood":
        wnids = _fake_synsets(150, 10_000_000)  # 150 classes of 69, the last 0 short: 10,350 = 150 x 69
        per = count // len(wnids)
        return [f"{w}/{w}_{k}.JPEG" for w in wnids for k in range(per)]
    if name == "imagenet-o":
        return [f"{w}/{w}_o{k:03d}.JPEG" for w in _synsets()[:200] for k in range(10)]
    if name == "textures":
        return [f"{c}/{c}_{k:04d}.jpg" for c in _DTD for k in range(1, 121)]
    if name == "places":
        return [f"images/places_{i:05d}.jpg" for i in range(count)]
    if name == "species":
        return [f"species_{c:03d}/{c:03d}_{k:03d}.jpg" for c in range(100) for k in range(100)]
    if name == "in1k-ood":
        return [f"{w}/{w}_{k}.JPEG" for w in _fake_synsets(1000, 11_000_000) for k in range(50)]
    if name == "imagenet-ood":
        wnids = _fake_synsets(637, 12_000_000)  # 637 synset folders, 31,802 paths: 50 each, the last 12 with 49
        short = 637 * 50 - count
        return [f"{w}/{w}_{k}.JPEG" for i, w in enumerate(wnids) for k in range(50 - (i >= 637 - short))]
    raise DataError(f"no made-up layout for {name!r}")


# Where each set lies under DIR/ood: one of the registry's candidate folders (checked by the tests).
_FOLDERS = {
    "inat-ood-plants": ("iNaturalist", "images/"),
    "openimage-o": ("openimage_o", "test/"),
    "360openset": ("360OpenSet", ""),
    "cood": ("COOD", ""),
    "imagenet-o": ("imagenet-o", ""),
    "textures": ("dtd/images", ""),
    "places": ("Places", ""),
    "ssb-easy": ("imagenet21k_val", ""),
    "ssb-hard": ("imagenet21k_val", ""),
    "species": ("species", ""),
    "in1k-ood": ("in1k-ood", ""),
    "ninco": ("NINCO/NINCO_OOD_classes", ""),
    "clean-ood": ("NINCO/NINCO_popular_datasets_subsamples", ""),
    "imagenet-ood": ("imagenet-ood", ""),
}


def _ood_plan(name: str, lists: Path, fraction: float) -> SetPlan:
    from . import dataset_registry

    entry = dataset_registry.get(name)
    folder, sub = _FOLDERS[name]
    if entry.official_list is not None:
        entries = dataset_registry.official_entries(name, lists)
        if entries is None:
            missing = ", ".join(dataset_registry.missing_list_files(name, lists))
            raise DataError(f"{name}: official list {missing} not in {lists}; {dataset_registry.FETCH_HINT}")
        files = [sub + e for e in entries]
    else:
        files = _made_up(name)
    kept = _by_group(files, fraction, each=name == "clean-ood")  # each of NINCO's 11 sub-samples is a set
    # SSB easy and hard both lie in imagenet21k_val, as ImageNet-21K-P ships them; their files do not overlap
    return SetPlan(name, f"ood/{folder}", kept, len(files))


def _clean_plans(clean: SetPlan) -> list[SetPlan]:
    """NINCO's 11 sub-samples: folders of clean-ood, their files written once by it."""
    from .dataset_registry import REGISTRY

    plans = []
    for entry in REGISTRY.values():
        if not entry.name.endswith("-clean"):
            continue
        sub = entry.folders[1].rsplit("/", 1)[-1]
        files = [f[len(sub) + 1 :] for f in clean.files if f.startswith(sub + "/")]
        full = entry.expected_count or 0
        plans.append(SetPlan(entry.name, f"{clean.folder}/{sub}", files, full, shares_files_with="clean-ood"))
    return plans


def plan_root(
    *,
    lists: str | os.PathLike[str],
    sets: Sequence[str] | None = None,
    scale: float = 1.0,
    fraction: float = 1.0,
) -> RootPlan:
    """What `make_root` writes for `sets` (default: every set the Fi config reads), without touching the disk."""
    if not 0 < scale <= 1 or not 0 < fraction <= 1:
        raise DataError(f"--scale and --fraction must lie in (0, 1]; got {scale} and {fraction}")
    from .dataset_registry import lists_folder_problem

    problem = lists_folder_problem(lists)
    if problem is not None:
        raise DataError(problem)
    chosen = list(ROOT_SETS) if not sets else [_root_name(s) for s in sets]
    plans: list[SetPlan] = []
    texts: dict[str, str] = {}
    for name in chosen:
        if name == "imagenet-1k-val":
            index = [f[len("val/") :] for f in _val_index()]
            plans.append(SetPlan(name, "imagenet/val", _by_group(index, fraction), len(index)))
            texts.update(_fi_lists(plans[-1].files, fraction))
        elif name == "imagenet-1k-train":
            counts = _train_counts(scale)
            synsets = _synsets()
            files = [f"{w}/{w}_{k + 1}.JPEG" for w, n in zip(synsets, counts, strict=True) for k in range(n)]
            plans.append(SetPlan(name, "imagenet/train", files, TRAIN_COUNT))
        else:
            plan = _ood_plan(name, Path(lists), fraction)
            plans.append(plan)
            if name == "clean-ood":
                plans.extend(_clean_plans(plan))
            if name == "imagenet-ood":
                texts[f"ood/{IMAGENET_OOD_LIST}"] = "".join(f"{f}\n" for f in plan.files)
    root = RootPlan(plans, texts=texts, scale=scale, fraction=fraction)
    if fraction < 1:
        _subset_lists(root)
    _place_defects(root)
    return root


def _root_name(name: str) -> str:
    aliases = {"imagenet-val": "imagenet-1k-val", "imagenet-train": "imagenet-1k-train"}
    name = aliases.get(name.lower(), name.lower())
    if name not in ROOT_SETS:
        raise DataError(
            f"--sets: no rehearsal set {name!r}; sets: {', '.join(ROOT_SETS)} (the *-clean sets are in clean-ood)"
        )
    return name


def _fi_lists(val_files: Sequence[str], fraction: float) -> dict[str, str]:
    """The two Fi-ImageNet-1k lists: made-up val names (655 OOD, 980 ambiguous; a fraction of each), disjoint."""
    names = sorted(f.rsplit("/", 1)[-1] for f in val_files)
    order = np.random.default_rng(1_000).permutation(len(names))
    ood, ambiguous = _keep(FI_OOD, fraction), _keep(FI_AMBIGUOUS, fraction)
    picked = [names[i] for i in order[: ood + ambiguous]]
    return {
        f"fi-imagenet-1k/{FI_FILES[0]}": "".join(f"{n}\n" for n in sorted(picked[:ood])),
        f"fi-imagenet-1k/{FI_FILES[1]}": "".join(f"{n}\n" for n in sorted(picked[ood:])),
    }


def _subset_lists(root: RootPlan) -> None:
    """At fraction < 1, a list `ood/<name>.txt` per set with an image list, naming the files kept."""
    from .dataset_registry import get

    for plan in root.sets:
        if plan.name.startswith("imagenet-1k"):
            continue
        entry = get(plan.name)
        if entry.official_list is None:
            continue
        path = f"ood/{plan.name}.txt"
        # entries relative to the set's folder: the registry reads <name>.txt under the root that way
        root.texts[path] = "".join(f"{f}\n" for f in plan.files)
        plan.subset_list = path


def _place_defects(root: RootPlan) -> None:
    """Pick the files that carry each defect (from the files planned, so counts stay the published ones), and the
    extra files beside the sets."""
    by_name = {plan.name: plan for plan in root.sets}

    def first(name: str, n: int, suffix: str = "") -> list[str]:
        plan = by_name.get(name)
        if plan is None:
            return []
        return [p for p in plan.paths() if p.lower().endswith(suffix)][:n]

    val = first("imagenet-1k-val", 4)
    for path, kind in zip(val, ("truncated-jpeg", "cmyk-jpeg", "exif-rotated", "zero-byte"), strict=False):
        root.defects[path] = kind
    for path in first("imagenet-1k-train", 1):
        root.defects[path] = "cmyk-jpeg"
    for path, kind in zip(first("ninco", 2, ".png"), ("grey-png", "png16"), strict=False):
        root.defects[path] = kind
    for path in first("openimage-o", 1):
        root.defects[path] = "html"
    if "openimage-o" in by_name:
        for i in range(2):
            root.extras[f"ood/openimage_o/test/not_listed_{i}.jpg"] = "image"
    if "ninco" in by_name:
        klass = by_name["ninco"].files[0].split("/", 1)[0]
        root.extras[f"ood/NINCO/NINCO_OOD_classes/{klass}/not_listed.jpg"] = "image"
    present = {plan.folder.split("/", 2)[1] if plan.folder.startswith("ood/") else plan.folder for plan in root.sets}
    for path in _NON_IMAGES:
        top = path.split("/")[1] if path.startswith("ood/") else path.split("/")[0]
        if top in present or (path.startswith("imagenet/") and "imagenet-1k-val" in by_name):
            root.extras[path] = "non-image"


# ----------------------------------------------------------------------------------------------- writing
def _write_chunk(args: tuple[str, list[tuple[str, str]]]) -> tuple[int, int, int]:
    """Write one chunk of files under `root` (a worker's task): (written, already present, bytes written)."""
    root, files = args
    written = present = size = 0
    for relative, kind in files:
        data = image_bytes(relative, kind)
        path = os.path.join(root, relative)
        try:
            if os.stat(path).st_size == len(data):
                present += 1
                continue
        except FileNotFoundError:
            pass
        with open(path, "wb") as handle:
            handle.write(data)
        written += 1
        size += len(data)
    return written, present, size


@dataclass
class MakeRootReport:
    """What `make_root` did."""

    root: Path
    files: int
    written: int
    present: int
    bytes: int
    seconds: float
    manifest: Path

    @property
    def files_per_second(self) -> float:
        """Files handled (written or found present) per second."""
        return self.files / self.seconds if self.seconds > 0 else 0.0


def make_root(
    root: str | os.PathLike[str],
    *,
    lists: str | os.PathLike[str],
    sets: Sequence[str] | None = None,
    scale: float = 1.0,
    fraction: float = 1.0,
    workers: int | None = None,
    chunk: int = 2000,
    progress: Callable[[str], None] | None = None,
) -> MakeRootReport:
    """Write a rehearsal data root at `root` (module docstring); resumable, `workers` processes (None: the cores)."""
    from ..util.atomic import unwritable
    from ..util.cores import available_cores

    root = Path(root)
    problem = unwritable(root)
    if problem is not None:
        raise DataError(problem)
    plan = plan_root(lists=lists, sets=sets, scale=scale, fraction=fraction)
    say = progress or (lambda line: sys.stderr.write(line + "\n"))
    started = time.perf_counter()
    files = list(plan.files())
    for folder in sorted({os.path.dirname(p) for p, _ in files} | {os.path.dirname(p) for p in plan.texts}):
        (root / folder).mkdir(parents=True, exist_ok=True)
    copied = _copy_lists(Path(lists), root / "imagelists")
    for path, text in plan.texts.items():
        target = root / path
        if not target.is_file() or target.read_text(encoding="utf-8") != text:
            atomic_write_text(target, text)
    total = len(files)
    workers = available_cores() if workers is None else max(1, workers)
    tasks = [(str(root), files[i : i + chunk]) for i in range(0, total, chunk)]
    written = present = size = done = 0
    last = 0.0
    say(
        f"make-root: {total:,} files under {root} ({len(plan.sets)} sets, {len(plan.defects)} defects, "
        f"{len(plan.extras)} extra files), {workers} process(es)"
    )
    for counts in _map(_write_chunk, tasks, workers):
        written, present, size = written + counts[0], present + counts[1], size + counts[2]
        done = written + present
        now = time.perf_counter()
        if now - last >= 5 or done == total:
            rate = done / (now - started) if now > started else 0.0
            say(
                f"make-root: {done:,} / {total:,} files ({written:,} written, {present:,} already there; {rate:,.0f} files/s)"
            )
            last = now
    seconds = time.perf_counter() - started
    manifest = root / "rehearsal.json"
    atomic_write_json(manifest, _manifest(plan, copied))
    return MakeRootReport(root, total, written, present, size, seconds, manifest)


def _map(function: Callable[[Any], Any], tasks: list[Any], workers: int) -> Iterator[Any]:
    """`function` over `tasks`, in order, in `workers` processes (in this one when 1)."""
    if workers <= 1 or len(tasks) <= 1:
        yield from map(function, tasks)
        return
    import multiprocessing

    with multiprocessing.get_context("spawn").Pool(workers) as pool:
        yield from pool.imap(function, tasks)


def _copy_lists(source: Path, target: Path) -> list[str]:
    """Copy the official list files (those the registry knows) from `source` into the root's lists folder."""
    from .imagelists import LIST_SOURCES

    target.mkdir(parents=True, exist_ok=True)
    copied = []
    for file in LIST_SOURCES:
        if (source / file).is_file():
            if not (target / file).is_file() or (target / file).stat().st_size != (source / file).stat().st_size:
                shutil.copyfile(source / file, target / file)
            copied.append(file)
    return copied


def _manifest(plan: RootPlan, lists: list[str]) -> dict[str, Any]:
    return {
        "scale": plan.scale,
        "fraction": plan.fraction,
        "image_size": list(IMAGE_SIZE),
        "lists": lists,
        "sets": {
            p.name: {
                "folder": p.folder,
                "files": len(p.files),
                "full_size": p.listed,
                **({"subset_list": p.subset_list} if p.subset_list else {}),
            }
            for p in plan.sets
        },
        "defects": [{"path": path, "kind": kind, "what": DEFECTS[kind]} for path, kind in sorted(plan.defects.items())],
        "extras": [{"path": path, "kind": kind} for path, kind in sorted(plan.extras.items())],
        "texts": sorted(plan.texts),
    }
