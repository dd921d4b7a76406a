"""Registry of the datasets the Fi-ImageNet-1k paper compares: names, published sizes, official image lists, layouts.

Every OOD set carries the size the paper gives it (Table 3; the 11 cleaned NINCO sub-samples: Table A3). Where a
set's authors publish its image list, the registry records where (``imagelists.LIST_SOURCES``: repository, commit,
path, licence, size, SHA-256), never the file: a user fetches the files into a lists folder (`oodbench datasets
lists fetch --to DIR`) and names it (`--lists DIR`, ``lists = PATH``). A set whose list is there, its checksum
verified, is exactly the listed images, whatever else lies in its folder; a set whose list is absent is every image
under its folder, its count checked, and `check` says the list is missing. A user may also give a list file
(`<name>.txt`/`.csv` under the root, or `--list`). `check(root)` reports per set the listed, present, missing and
extra images; `open_registered(name, root)` turns a present set into an `ImageList`.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..core.errors import DataError
from .datasets import ImageList, ListMatch, _walk_images, file_list, image_folder, imagenet, match_list
from .imagelists import LIST_SOURCES, ListSource, list_path, read_list

__all__ = [
    "OfficialList",
    "RegisteredDataset",
    "REGISTRY",
    "DatasetStatus",
    "get",
    "names",
    "locate",
    "check",
    "open_registered",
    "official_entries",
    "missing_list_files",
    "FETCH_HINT",
    "lists_folder_problem",
    "list_problem",
]

FETCH_HINT = "`oodbench datasets lists fetch --to DIR`, then --lists DIR"


def lists_folder_problem(lists: str | os.PathLike[str]) -> str | None:
    """What is wrong with a lists folder given by the user (absent, or a file), or None when it is a folder."""
    path = Path(lists)
    if path.is_dir():
        return None
    if path.exists():
        return f"lists folder {lists} is a file, not a folder; give a folder filled by `oodbench datasets lists fetch`"
    return f"lists folder {lists} does not exist; fill it with `oodbench datasets lists fetch --to {lists}`"


@dataclass(frozen=True)
class OfficialList:
    """How a set reads its authors' published image list: which files (``imagelists.LIST_SOURCES``) and which part."""

    files: tuple[str, ...]  # file names in the lists folder; the first holds the entries
    reader: str  # "csv" (column image_location), "lines" (one entry per line) or "ssb" (SSB's split JSON files)
    select: str | None = None  # csv: rows of this `class` value; ssb: "Easy" or "Hard"
    prefix: str = ""  # leading path of every entry that the set's own folder stands for
    match: str = "path"  # "path": relative to the set's folder; "name": a file name anywhere below it

    @property
    def sources(self) -> tuple[ListSource, ...]:
        """The upstream files, with their provenance."""
        return tuple(LIST_SOURCES[file] for file in self.files)

    @property
    def licence(self) -> str:
        """The licence of the first file (all files of a set come from one repository)."""
        return self.sources[0].licence

    def describe(self) -> str:
        """One line: where the list comes from and under which licence."""
        picked = f" (rows of {self.select})" if self.select and self.reader == "csv" else ""
        picked = f" ({self.select} classes)" if self.reader == "ssb" else picked
        return " + ".join(source.describe() for source in self.sources) + picked


@dataclass(frozen=True)
class RegisteredDataset:
    """One dataset of the Fi-ImageNet-1k paper's comparison: where to find it, its published size and its image list."""

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
    official_list: OfficialList | None = None
    list_sha256: str | None = None  # the authors' list, given by the user as a file: recognised by its SHA-256
    table: str = ""  # where the paper gives the set: "Table 3" or "Table A3"

    def list_files(self) -> tuple[str, ...]:
        """Image-list names looked for under the root (`<name>.csv` / `<name>.txt`)."""
        return (f"{self.name}.csv", f"{self.name}.txt")

    def image_list(self, *, short: bool = False) -> str:
        """Which image list defines the set, in words (`short`: a few words for a table)."""
        if self.official_list is not None:
            spec = self.official_list
            if short:
                return (
                    f"official ({spec.sources[0].repo.split('/')[-1]}, {spec.licence.split(',')[0]}): {spec.files[0]}"
                )
            return f"official, from the lists folder: {spec.describe()}"
        if self.list_sha256 is not None:
            return "your copy of the authors' list" + ("" if short else " (no licence stated; known by its SHA-256)")
        if self.imagenet_split is not None:
            return "the ImageNet-1k layout"
        return "none: the folder" if short else "none published: every image under the folder, or a list you give"


_FOLDER_FORMAT = "image folder (images anywhere below it), plus a list file <name>.csv/.txt where one is published"
_TABLE3 = "Fi-ImageNet-1k paper, Table 3"
_TABLEA3 = "Fi-ImageNet-1k paper, Table A3 (clean sub-sample by NINCO)"
_NINCO_LAYOUT = "NINCO_popular_datasets_subsamples"


def _table3(
    name: str,
    title: str,
    count: int,
    folders: tuple[str, ...],
    reference: str,
    notes: str = "",
    official: OfficialList | None = None,
    list_sha256: str | None = None,
) -> RegisteredDataset:
    return RegisteredDataset(
        name,
        title,
        "ood",
        count,
        _TABLE3,
        folders,
        _FOLDER_FORMAT,
        reference,
        notes,
        official_list=official,
        list_sha256=list_sha256,
        table="Table 3",
    )


_SSB_FILES = ("imagenet_21k_val_files.json", "imagenet_ssb_splits.json")


def _ssb(group: str) -> OfficialList:
    return OfficialList(_SSB_FILES, "ssb", select=group, match="name")


# The 11 cleaned sub-samples NINCO released (Table A3): registry name suffix, NINCO's folder/class name, size.
_CLEAN = (
    ("inat-ood-plants", "iNaturalist_OOD_Plants", "iNat-OOD Plants", 383),
    ("openimage-o", "OpenImage_O", "OpenImage-O", 368),
    ("360openset", "360OpenSet", "360OpenSet", 236),
    ("cood", "COOD", "COOD", 212),
    ("imagenet-o", "ImageNet_O", "ImageNet-O", 309),
    ("textures", "Textures", "Textures", 288),
    ("places", "Places", "Places", 153),
    ("ssb-easy", "SSB_easy", "SSB easy", 151),
    ("ssb-hard", "SSB_hard", "SSB hard", 208),
    ("species", "Species", "Species", 172),
    ("in1k-ood", "ImageNet_1k_OOD_400_ood", "IN1k-OOD", 235),
)


def _clean(suffix: str, folder: str, printed: str, count: int) -> RegisteredDataset:
    return RegisteredDataset(
        f"{suffix}-clean",
        f"{printed}, clean sub-sample (NINCO)",
        "ood",
        count,
        _TABLEA3,
        (f"NINCO/{_NINCO_LAYOUT}/{folder}", f"{_NINCO_LAYOUT}/{folder}"),
        f"NINCO's release: {_NINCO_LAYOUT}/{folder}/",
        "https://github.com/j-cb/NINCO",
        f"400 images of {printed} drawn by NINCO, those with an ImageNet-1k object removed; part of CLEAN-OOD",
        official_list=OfficialList(
            ("NINCO_popular_datasets_subsamples.csv",), "csv", select=folder, prefix=f"{_NINCO_LAYOUT}/{folder}/"
        ),
        table="Table A3",
    )


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
        _table3(
            "inat-ood-plants",
            "iNat-OOD Plants (MOS)",
            10_000,
            ("iNaturalist", "inaturalist", "iNaturalist/images", "inat-ood-plants", "images_largescale/inaturalist"),
            "https://github.com/deeplearning-wisc/large_scale_ood",
            "110 plant classes not in ImageNet-1k, as distributed by MOS; the list is NINCO's record of it",
            OfficialList(("OOD_iNaturalist_MOS_labels.csv",), "csv", match="name"),
        ),
        _table3(
            "openimage-o",
            "OpenImage-O",
            17_632,
            ("openimage_o", "OpenImage-O", "openimage-o", "images_largescale/openimage_o", "openimages/test"),
            "https://github.com/haoqiwang/vim",
            "ViM's list of OpenImages-v3 test images; the folder may hold the whole test set",
            OfficialList(("openimage_o.txt",), "lines", match="name"),
        ),
        _table3(
            "360openset",
            "360OpenSet",
            11_800,
            ("360OpenSet", "360openset", "360_open_set"),
            "Bendale & Boult, CVPR 2016 (as cited by the Fi-ImageNet-1k paper)",
            "no image list is published with a redistributable licence; give one with --list to take exact images",
        ),
        _table3(
            "cood",
            "COOD (class-out-of-distribution)",
            10_350,
            ("COOD", "cood", "c-ood"),
            "https://github.com/mdabbah/COOD_benchmarking",
            "drawn from ImageNet-21k (Galil et al., ICLR 2023); no image list is published with oodbench",
        ),
        _table3(
            "imagenet-o",
            "ImageNet-O",
            2_000,
            ("imagenet-o", "imagenet_o", "ImageNet-O"),
            "https://github.com/hendrycks/natural-adv-examples",
            "ships as 200 synset folders holding exactly its images",
        ),
        _table3(
            "textures",
            "Textures (DTD)",
            5_640,
            ("dtd/images", "textures", "Textures", "dtd", "images_classic/texture"),
            "https://www.robots.ox.ac.uk/~vgg/data/dtd/",
            "all of DTD: 47 classes x 120 images in images/<class>/",
        ),
        _table3(
            "places",
            "Places (MOS)",
            10_000,
            ("Places", "places", "places365"),
            "https://github.com/deeplearning-wisc/large_scale_ood",
            "as distributed by MOS; no image list is published",
        ),
        _table3(
            "ssb-easy",
            "SSB easy (ImageNet-21K-P)",
            50_000,
            ("ssb_easy", "ssb-easy", "SSB/easy", "imagenet21k_val", "imagenet_21k/imagenet21k_val"),
            "https://github.com/sgvaze/SSB",
            "the 50 ImageNet-21K-P validation images of each of the 1,000 Easy classes",
            _ssb("Easy"),
        ),
        _table3(
            "ssb-hard",
            "SSB hard (ImageNet-21K-P)",
            49_000,
            (
                "ssb_hard",
                "ssb-hard",
                "SSB/hard",
                "images_largescale/ssb_hard",
                "imagenet21k_val",
                "imagenet_21k/imagenet21k_val",
            ),
            "https://github.com/sgvaze/SSB",
            "the 50 ImageNet-21K-P validation images of each of the 980 Hard classes",
            _ssb("Hard"),
        ),
        _table3(
            "species",
            "Species",
            10_000,
            ("species", "Species"),
            "Hendrycks et al., ICML 2022 (Scaling OOD detection)",
            "no image list of the 10,000-image OOD set is published",
        ),
        _table3(
            "in1k-ood",
            "IN1k-OOD (ImageNet-1k-OOD of ImageNet-LT)",
            50_000,
            ("in1k-ood", "IN1k-OOD", "in1k_ood", "imagenet_1k_ood"),
            "https://github.com/amazon-science/long-tailed-ood-detection",
            "50 images of each of 1,000 ImageNet-22k classes; only the class list is published",
        ),
        RegisteredDataset(
            "clean-ood",
            "CLEAN-OOD",
            "ood",
            2_715,
            _TABLE3,
            (f"NINCO/{_NINCO_LAYOUT}", _NINCO_LAYOUT, "clean-ood", "CLEAN-OOD", "clean_ood"),
            f"NINCO's release: {_NINCO_LAYOUT}/ (11 folders)",
            "https://github.com/j-cb/NINCO",
            "the union of the 11 cleaned sub-samples (*-clean) as NINCO releases them",
            official_list=OfficialList(("NINCO_popular_datasets_subsamples.csv",), "csv", prefix=f"{_NINCO_LAYOUT}/"),
            table="Table 3",
        ),
        _table3(
            "ninco",
            "NINCO (main OOD classes)",
            5_879,
            ("NINCO/NINCO_OOD_classes", "NINCO_OOD_classes", "ninco", "NINCO"),
            "https://github.com/j-cb/NINCO",
            "NINCO_OOD_classes (64 classes); its unit tests and popular-dataset sub-samples are separate sets",
            OfficialList(("NINCO_OOD_classes.csv",), "csv", prefix="NINCO_OOD_classes/"),
        ),
        _table3(
            "imagenet-ood",
            "ImageNet-OOD",
            31_802,
            ("imagenet-ood", "ImageNet-OOD", "imagenet_ood"),
            "https://github.com/princetonvisualai/imagenetood",
            "the authors' imagenetood.txt (637 synset folders) has no licence: give it as imagenet-ood.txt",
            list_sha256="80192c520a1789778b56d9342346a61c4cde3a2c3db12abc8512839145f886a0",
        ),
        RegisteredDataset(
            "fi-imagenet-1k",
            "Fi-ImageNet-1k",
            "ood",
            655,
            _TABLE3,
            ("fi-imagenet-1k", "Fi-ImageNet-1k", "fi_imagenet_1k"),
            "file list fi-imagenet-1k.csv (path,label) as exported by `oodbench annotate export`, or an image folder",
            "the Fi-ImageNet-1k paper",
            table="Table 3",
        ),
        *[_clean(*row) for row in _CLEAN],
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


# ----------------------------------------------------------------------------------------------- official lists
def missing_list_files(name: str, lists: str | os.PathLike[str] | None) -> list[str]:
    """The files of a set's official list that are not in the lists folder (all of them when none is given)."""
    spec = get(name).official_list
    if spec is None:
        return []
    return [file for file in spec.files if list_path(file, lists) is None]


def list_problem(name: str, lists: str | os.PathLike[str] | None) -> str | None:
    """Why a set's official list files in the lists folder cannot be used (a SHA-256 that is not the pinned one), or
    None; absent files are no problem here (the set is then every image under its folder). Checked before any work."""
    spec = get(name).official_list
    if spec is None or lists is None or lists_folder_problem(lists) is not None:
        return None
    for file in spec.files:
        try:
            read_list(file, lists)
        except DataError as exc:
            return str(exc)
    return None


def official_entries(name: str, lists: str | os.PathLike[str] | None) -> tuple[str, ...] | None:
    """The entries of a set's official image list read from the lists folder, relative to the set's folder (file
    names where the list matches by name); None when a file of it is not there. A file whose SHA-256 is not the
    pinned one is refused."""
    entry = get(name)
    spec = entry.official_list
    if spec is None:
        raise DataError(f"{entry.name}: its authors publish no image list; give one with --list")
    texts = [read_list(file, lists) for file in spec.files]
    if any(text is None for text in texts):
        return None
    try:
        entries = _parse(spec, [text for text in texts if text is not None])
    except (ValueError, KeyError, IndexError, TypeError) as exc:  # only a file with a registered checksum gets here
        raise DataError(
            f"{entry.name}: {spec.files[0]} is not in its upstream format ({type(exc).__name__}: {exc})"
        ) from None
    if spec.prefix:
        stray = next((e for e in entries if not e.startswith(spec.prefix)), None)
        if stray is not None:
            raise DataError(f"{entry.name}: list entry {stray!r} lies outside {spec.prefix}")
        entries = [e[len(spec.prefix) :] for e in entries]
    return tuple(entries)


def _parse(spec: OfficialList, texts: list[str]) -> list[str]:
    """The entries of an upstream list in its own format (NINCO's CSVs, ViM's lines, SSB's two JSON files)."""
    if spec.reader == "lines":
        return [line.strip() for line in texts[0].splitlines() if line.strip()]
    if spec.reader == "csv":
        rows = [row for row in csv.reader(io.StringIO(texts[0])) if row]
        header = rows[0]
        path_col = header.index("image_location")
        if spec.select is None:
            return [row[path_col] for row in rows[1:]]
        class_col = header.index("class")
        return [row[path_col] for row in rows[1:] if row[class_col] == spec.select]
    if spec.reader == "ssb":
        files, splits = json.loads(texts[0]), json.loads(texts[1])
        return [f"{wnid}/{file}" for wnid in splits["unknown_classes"][spec.select] for file in files[wnid]]
    # a registry entry names a reader this module lacks: a programming error, caught by the tests
    raise DataError(f"unknown list reader {spec.reader!r}")


# ----------------------------------------------------------------------------------------------- finding a set
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


def _folder(entry: RegisteredDataset, root: Path) -> Path | None:
    """The first of the set's candidate folders present under `root`."""
    for folder in entry.folders:
        found = _case_insensitive(root, folder)
        if found is not None and found.is_dir():
            return found
    return None


def _list_file(entry: RegisteredDataset, root: Path) -> Path | None:
    """A user's image list `<name>.csv` / `<name>.txt` under `root`."""
    for name in entry.list_files():
        found = _case_insensitive(root, name)
        if found is not None and found.is_file():
            return found
    return None


def locate(entry: RegisteredDataset, root: str | os.PathLike[str]) -> Path | None:
    """Where `entry` lives under `root`: a list file first, then the first candidate folder present."""
    root = Path(root)
    return _list_file(entry, root) or _folder(entry, root)


@dataclass(frozen=True)
class _Resolved:
    """A set as found under a root: its folder, its image list (where one applies) and how the two meet."""

    folder: Path | None
    list_path: Path | None  # a user's list file
    image_list: str  # what defines the set, in words
    match: ListMatch | None  # None: no list, every image under the folder
    list_sha256: str | None = None
    absent_list: str | None = None  # the official list is not in the lists folder: why, and how to get it

    @property
    def path(self) -> Path | None:
        return self.list_path or self.folder


def _absent(entry: RegisteredDataset, lists: str | os.PathLike[str] | None) -> str:
    """Why a set's official list is not read, and how to get it, in one phrase."""
    assert entry.official_list is not None
    missing = ", ".join(missing_list_files(entry.name, lists))
    where = f"not in {lists}" if lists is not None else "no lists folder given"
    return f"official list {missing} missing ({where}): get it with {FETCH_HINT}"


def _resolve(
    entry: RegisteredDataset,
    root: Path,
    list_file: str | os.PathLike[str] | None,
    lists: str | os.PathLike[str] | None,
) -> _Resolved | None:
    """Find a set under `root` and lay its image list (given, official or `<name>.txt`) over its folder."""
    folder = _folder(entry, root)
    given = Path(list_file) if list_file is not None else None
    if given is not None and not given.is_file():
        raise DataError(f"image list {given} of {entry.name} does not exist")
    user_list = given or _list_file(entry, root)
    if user_list is not None:
        images = file_list(user_list, root=folder)  # entries relative to the set's folder, else to the list's
        entries = list(images.items)
        where = f"image list {user_list}"
        digest = hashlib.sha256(user_list.read_bytes()).hexdigest()
        words = f"given: {user_list}"
        if entry.list_sha256 is not None:
            words += " (the authors' list)" if digest == entry.list_sha256 else " (differs from the authors' list)"
        found = match_list(entries, folder=folder, base=images.root, where=where)
        return _Resolved(folder, user_list, words, found, digest)
    if folder is None:
        return None
    if entry.official_list is not None:
        spec = entry.official_list
        official = official_entries(entry.name, lists)
        if official is None:  # the folder stands for the set, as for a set without a published list
            absent = _absent(entry, lists)
            return _Resolved(folder, None, f"every image under the folder; {absent}", None, absent_list=absent)
        found = match_list(official, folder=folder, base=folder, by=spec.match, where=f"{entry.name}'s list")
        return _Resolved(folder, None, f"official, checksum verified: {spec.describe()}", found)
    return _Resolved(folder, None, "none: every image under the folder", None)


def open_registered(
    name: str,
    root: str | os.PathLike[str],
    *,
    list_file: str | os.PathLike[str] | None = None,
    lists: str | os.PathLike[str] | None = None,
) -> ImageList:
    """The registered dataset `name` under `root` as an ImageList (OOD sets unlabelled): exactly its listed images.

    A set with an image list (its official list in the folder `lists`, `list_file`, or `<name>.txt` under the root)
    is the listed images, in list order; files beside them are ignored (the count is in ``source["ignored"]``); a
    listed image that is absent is an error. A set without a list, or whose official list is not in `lists`
    (``source["absent_list"]`` says so), is every image under its folder.
    """
    entry = get(name)
    root = Path(root)
    problem = None if lists is None else lists_folder_problem(lists)
    if problem is not None:
        raise DataError(problem)
    resolved = _resolve(entry, root, list_file, lists)
    if resolved is None:
        looked = ", ".join(list(entry.list_files()) + list(entry.folders))
        raise DataError(f"{entry.title} ({entry.name}) not found under {root}; looked for {looked}")
    source: dict[str, Any] = {"registry": entry.name, "image_list": resolved.image_list}
    if resolved.match is not None:
        found = resolved.match
        if found.missing:
            raise DataError(
                f"{entry.name}: {len(found.missing):,} of the {found.listed:,} listed images are not under "
                f"{resolved.folder or resolved.list_path} (first: {found.missing[0]}); "
                f"`oodbench datasets check --root {root} --only {entry.name}` lists them"
            )
        if not found.present:
            raise DataError(f"{entry.name}: its image list names no image")
        return found.image_list(source)
    assert resolved.folder is not None
    if resolved.absent_list is not None:
        source["absent_list"] = resolved.absent_list
    if entry.imagenet_split is not None:
        dataset = imagenet(resolved.folder, split=entry.imagenet_split)
    else:
        dataset = image_folder(resolved.folder, labels=False)
    return ImageList(dataset.root, dataset.items, dataset.labels, dataset.class_names, {**dataset.source, **source})


# ----------------------------------------------------------------------------------------------- checking
@dataclass
class DatasetStatus:
    """Outcome of checking one registered dataset under a root."""

    name: str
    title: str
    status: str  # ok | count mismatch | images missing | present (no reference count) | missing | unreadable
    path: str | None
    found: int | None  # images the set would take
    expected: int | None  # the published size
    message: str
    unreadable: list[str] = field(default_factory=list)
    image_list: str = ""
    listed: int | None = None
    present: int | None = None
    missing_images: int | None = None
    extra: int | None = None
    missing_examples: list[str] = field(default_factory=list)
    extra_examples: list[str] = field(default_factory=list)
    official_list: str | None = None  # used | missing (not in the lists folder) | not used (a given list) | None

    def as_dict(self) -> dict[str, Any]:
        """JSON-friendly form."""
        return dict(self.__dict__)


_EXAMPLES = 5


def _official_state(
    entry: RegisteredDataset, resolved: _Resolved | None, lists: str | os.PathLike[str] | None
) -> str | None:
    if entry.official_list is None:
        return None
    if resolved is not None and resolved.list_path is not None:
        return "not used"
    return "missing" if missing_list_files(entry.name, lists) else "used"


def _check_one(
    entry: RegisteredDataset,
    root: Path,
    list_file: str | os.PathLike[str] | None,
    lists: str | os.PathLike[str] | None,
) -> DatasetStatus:
    resolved = _resolve(entry, root, list_file, lists)
    expected = entry.expected_count
    official = _official_state(entry, resolved, lists)
    if resolved is None:
        message = f"looked for {', '.join(entry.folders)} or {entry.list_files()[0]}; expected: {entry.list_format}"
        if official == "missing":
            message += f"; {_absent(entry, lists)}"
        return DatasetStatus(
            entry.name,
            entry.title,
            "missing",
            None,
            None,
            expected,
            message,
            image_list=entry.image_list(),
            official_list=official,
        )
    published = f"{expected:,} published ({entry.count_source})" if expected is not None else entry.count_source
    path = str(resolved.path)
    if resolved.match is None:
        assert resolved.folder is not None
        found = len(_walk_images(resolved.folder))
        if expected is None:
            status, message = "present (no reference count)", f"{found:,} images; {published}"
        elif found == expected:
            status, message = "ok", f"{found:,} images under the folder, as {published}"
        else:
            status, message = "count mismatch", f"{found:,} images under the folder but {published}"
        if resolved.absent_list is not None:
            message += f"; {resolved.absent_list}"
        elif entry.notes and status != "ok":
            message += f"; {entry.notes}"
        return DatasetStatus(
            entry.name,
            entry.title,
            status,
            path,
            found,
            expected,
            message,
            image_list=resolved.image_list,
            official_list=official,
        )
    match = resolved.match
    parts = [f"{match.listed:,} listed, {len(match.present):,} present"]
    if match.missing:
        parts.append(f"{len(match.missing):,} missing (e.g. {match.missing[0]})")
    if match.extra:
        parts.append(f"{len(match.extra):,} other file(s) under {resolved.folder} not in the list, ignored")
    if match.missing:
        status = "images missing"
    elif expected is not None and match.listed != expected:
        status = "count mismatch"
        parts.append(f"the list names {match.listed:,} images but {published}")
    else:
        status = "ok"
        parts.append(published)
    return DatasetStatus(
        entry.name,
        entry.title,
        status,
        path,
        len(match.present),
        expected,
        "; ".join(parts),
        image_list=resolved.image_list,
        listed=match.listed,
        present=len(match.present),
        missing_images=len(match.missing),
        extra=len(match.extra),
        missing_examples=list(match.missing[:_EXAMPLES]),
        extra_examples=list(match.extra[:_EXAMPLES]),
        official_list=official,
    )


def check(
    root: str | os.PathLike[str],
    *,
    datasets: list[str] | None = None,
    verify: bool = False,
    list_files: dict[str, str | os.PathLike[str]] | None = None,
    lists: str | os.PathLike[str] | None = None,
) -> list[DatasetStatus]:
    """Check which registered datasets are under `root`: listed / present / missing / extra images against the
    published size, and (with `verify`) that the images decode. `list_files` maps a set to a user's image list
    file; `lists` is the folder holding the official lists (`oodbench datasets lists fetch`)."""
    from .datasets import UnreadableImage, load_rgb

    root = Path(root)
    if not root.is_dir():
        raise DataError(f"data root {root} is not a directory")
    problem = None if lists is None else lists_folder_problem(lists)
    if problem is not None:
        raise DataError(problem)
    given = {get(name).name: path for name, path in (list_files or {}).items()}
    selected = [get(name) for name in datasets] if datasets else list(REGISTRY.values())
    report: list[DatasetStatus] = []
    for entry in selected:
        try:
            status = _check_one(entry, root, given.get(entry.name), lists)
        except DataError as exc:
            status = DatasetStatus(entry.name, entry.title, "unreadable", None, None, entry.expected_count, str(exc))
        if verify and status.path is not None and status.status not in ("missing", "unreadable"):
            try:
                images = open_registered(entry.name, root, list_file=given.get(entry.name), lists=lists)
            except DataError:
                images = None  # missing listed images: already reported above
            for image_path in images.paths(range(len(images))) if images is not None else []:
                try:
                    load_rgb(image_path)
                except UnreadableImage as exc:
                    status.unreadable.append(f"{image_path}: {exc}")
            if status.unreadable:
                status.message += f"; {len(status.unreadable)} unreadable image(s) (skipped at extraction)"
        report.append(status)
    return report
