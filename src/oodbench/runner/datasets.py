"""The built-in dataset kinds of the experiment file: ``demo``, ``registry``, ``folder``, ``list``, ``imagenet``, ``subset``.

Adding a kind is one class here (or in any imported module): a `DatasetKind` subclass with its ``name``, its
``Table`` of allowed keys, and `open` returning the images as an `oodbench.extract.datasets.ImageList`.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from ..core.errors import ConfigError
from .kinds import DatasetKind, DatasetSpec, Experiment, ModelSpec, register_dataset_kind
from .schema import PositiveInt, StrList, Table, suggest

__all__ = ["Demo", "Registry", "Folder", "FileList", "ImageNet", "Subset", "DEMO_DATASETS"]

DEMO_DATASETS = ("digits-fit", "digits-id-test", "digits-6to9", "lfw-faces", "noise", "digits-6to9-train")


def _path(value: str) -> str:
    return str(Path(value).expanduser())


@register_dataset_kind
class Demo(DatasetKind):
    """One of the demo's datasets; its images come with the ``demo-digits`` model."""

    name = "demo"

    class Table(Table):
        kind: str
        count: PositiveInt | None = None

    def parse(self, table: Any, name: str, key: str) -> dict[str, Any]:
        if name not in DEMO_DATASETS:
            raise ConfigError(
                f"{key}: the demo has no dataset {name!r}{suggest(name, DEMO_DATASETS)} "
                f"(it has {', '.join(DEMO_DATASETS)})"
            )
        return super().parse(table, name, key)

    def check(
        self,
        spec: DatasetSpec,
        datasets: Mapping[str, DatasetSpec],
        models: Mapping[str, ModelSpec],
        used: list[tuple[str, str]],
    ) -> None:
        if spec.id in {name for _, name in used} and not any(m.kind == "demo-digits" for m in models.values()):
            raise ConfigError(
                f"{spec.key_path}.kind: 'demo' datasets come from a model of kind 'demo-digits'; declare one"
            )

    def count(self, spec: DatasetSpec, config: Experiment) -> int | None:
        declared = super().count(spec, config)
        if declared is not None:
            return declared
        seeds = [m.params["seed"] for m in config.models.values() if m.kind == "demo-digits"]
        return _demo_counts(seeds[0]).get(spec.id) if seeds else None


def _demo_counts(seed: int) -> dict[str, int]:
    """Image counts of the demo's datasets (its data are small and bundled, so they are counted, not guessed)."""
    from ..demo.data import digits_splits, lfw_faces, uniform_noise

    counts = {name: len(images.labels) for name, images in digits_splits(seed).items()}
    counts["lfw-faces"] = len(lfw_faces().labels)
    counts["noise"] = len(uniform_noise(seed=seed).labels)
    return counts


@register_dataset_kind
class Registry(DatasetKind):
    """A dataset of the registry (`oodbench datasets list`), laid out as its authors publish it under ``root``.

    A set with an image list (its official list in the folder ``lists = PATH``, filled by `oodbench datasets lists
    fetch`, or ``list = PATH``: entries relative to the set's folder) is exactly the listed images; other files in
    its folder are ignored and counted. A set whose official list is not in ``lists`` is every image under its
    folder, and the run says so.
    """

    name = "registry"

    class Table(Table):
        kind: str
        name: str | None = None
        root: str
        list: str | None = None
        lists: str | None = None
        count: PositiveInt | None = None

    def parse(self, table: Any, name: str, key: str) -> dict[str, Any]:
        from ..extract import dataset_registry

        registered = table.name or name
        if registered.lower() not in dataset_registry.REGISTRY:
            raise ConfigError(
                f"{key}.name: no registered dataset {registered!r}{suggest(registered, dataset_registry.REGISTRY)} "
                f"(registered: {', '.join(dataset_registry.REGISTRY)})"
            )
        params = {"root": _path(table.root), "name": registered}
        if table.list is not None:
            params["list"] = _path(table.list)
        if table.lists is not None:
            params["lists"] = _path(table.lists)
        return params | ({"count": table.count} if table.count is not None else {})

    def identity(self, spec: DatasetSpec) -> dict[str, Any]:
        # A list enters a unit key by its content, not its path; an official list by its pinned checksum when it is
        # in the lists folder (a modified file is refused when the set is opened), by its absence otherwise.
        import hashlib

        from ..extract import dataset_registry

        identity = {k: v for k, v in super().identity(spec).items() if k not in ("list", "lists")}
        given = spec.params.get("list")
        if given is not None:
            path = Path(given)
            identity["list_sha256"] = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None
        official = dataset_registry.get(spec.params["name"]).official_list
        if official is not None and given is None:
            absent = dataset_registry.missing_list_files(spec.params["name"], spec.params.get("lists"))
            identity["official_list_sha256"] = None if absent else [source.sha256 for source in official.sources]
        return identity

    def count(self, spec: DatasetSpec, config: Experiment) -> int | None:
        declared = super().count(spec, config)
        if declared is not None:
            return declared
        from ..extract import dataset_registry

        entry = dataset_registry.REGISTRY.get(spec.params["name"].lower())
        return entry.expected_count if entry is not None else None

    def describe(self, spec: DatasetSpec) -> str:
        from ..extract import dataset_registry

        entry = dataset_registry.get(spec.params["name"])
        given = spec.params.get("list")
        listed = f"list {given}" if given else f"image list: {entry.image_list(short=True)}"
        if not given and entry.official_list is not None:
            lists = spec.params.get("lists")
            if dataset_registry.missing_list_files(entry.name, lists):
                where = f"not in {lists}" if lists else "no lists folder given"
                listed = f"official list missing ({where}): every image under the folder"
        return f"{entry.name} under {spec.params['root']}" + (f", {entry.table}" if entry.table else "") + f"; {listed}"

    def missing(self, spec: DatasetSpec) -> dict[str, str]:
        problems = super().missing(spec)
        given = spec.params.get("list")
        if given is not None and not Path(given).is_file():
            problems[f"{spec.key_path}.list"] = f"image list {given} does not exist"
        lists = spec.params.get("lists")
        if lists is not None:
            from ..extract.dataset_registry import lists_folder_problem

            problem = lists_folder_problem(lists)
            if problem is not None:
                problems[f"{spec.key_path}.lists"] = problem
            elif given is None:  # a modified official list stops the run before any work, not when its set is read
                from ..extract.dataset_registry import list_problem

                problem = list_problem(spec.params["name"], lists)
                if problem is not None:
                    problems[f"{spec.key_path}.lists"] = problem
        return problems

    def open(self, spec: DatasetSpec) -> Any:
        from ..extract import dataset_registry

        images = dataset_registry.open_registered(
            spec.params["name"], spec.params["root"], list_file=spec.params.get("list"), lists=spec.params.get("lists")
        )
        if "absent_list" in images.source:
            sys.stderr.write(
                f"{spec.key_path}: every image under the folder taken ({len(images):,}); "
                f"{images.source['absent_list']}\n"
            )
        if images.source.get("ignored"):
            sys.stderr.write(
                f"{spec.key_path}: {len(images):,} listed images taken; "
                f"ignored {images.source['ignored']:,} other file(s) beside them\n"
            )
        return images


@register_dataset_kind
class Folder(DatasetKind):
    """Every image under ``root``; with ``labels = true`` the first folder level is the class."""

    name = "folder"

    class Table(Table):
        kind: str
        root: str
        labels: bool = False
        count: PositiveInt | None = None

    def parse(self, table: Any, name: str, key: str) -> dict[str, Any]:
        return super().parse(table, name, key) | {"root": _path(table.root)}

    def open(self, spec: DatasetSpec) -> Any:
        from ..extract.datasets import image_folder

        return image_folder(spec.params["root"], labels=spec.params.get("labels", False))


@register_dataset_kind
class FileList(DatasetKind):
    """The images a list file names (``root`` is the file; ``images`` the folder its relative paths start from)."""

    name = "list"

    class Table(Table):
        kind: str
        root: str
        images: str | None = None
        count: PositiveInt | None = None

    def parse(self, table: Any, name: str, key: str) -> dict[str, Any]:
        params = super().parse(table, name, key) | {"root": _path(table.root)}
        return params | ({"images": _path(table.images)} if table.images else {})

    def missing(self, spec: DatasetSpec) -> dict[str, str]:
        problems = super().missing(spec)
        images = spec.params.get("images")
        if images and not Path(images).is_dir():
            problems[f"{spec.key_path}.images"] = f"{images} is not a directory"
        return problems

    def open(self, spec: DatasetSpec) -> Any:
        from ..extract.datasets import file_list

        return file_list(spec.params["root"], root=spec.params.get("images"))


@register_dataset_kind
class ImageNet(DatasetKind):
    """An ImageNet-1k split in its usual layout (``split = "val"`` or ``"train"``)."""

    name = "imagenet"
    SIZES = {"val": 50_000, "train": 1_281_167}

    class Table(Table):
        kind: str
        root: str
        split: Literal["val", "train"] = "val"
        count: PositiveInt | None = None

    def parse(self, table: Any, name: str, key: str) -> dict[str, Any]:
        return super().parse(table, name, key) | {"root": _path(table.root)}

    def count(self, spec: DatasetSpec, config: Experiment) -> int | None:
        declared = super().count(spec, config)
        return declared if declared is not None else self.SIZES[spec.params.get("split", "val")]

    def open(self, spec: DatasetSpec) -> Any:
        from ..extract.datasets import imagenet

        return imagenet(spec.params["root"], split=spec.params.get("split", "val"))


@register_dataset_kind
class Subset(DatasetKind):
    """Rows of another dataset's store entry kept (``include``) or dropped (``exclude``) by list files."""

    name = "subset"

    class Table(Table):
        kind: str
        of: str
        include: StrList = []
        exclude: StrList = []
        count: PositiveInt | None = None

    def parse(self, table: Any, name: str, key: str) -> dict[str, Any]:
        if not table.include and not table.exclude:
            raise ConfigError(f"{key}: a subset needs include = [LIST FILES] or exclude = [LIST FILES]")
        params: dict[str, Any] = {"of": table.of}
        for which in ("include", "exclude"):
            files = getattr(table, which)
            if files:
                params[which] = [_path(f) for f in files]
        return params | ({"count": table.count} if table.count is not None else {})

    def check(
        self,
        spec: DatasetSpec,
        datasets: Mapping[str, DatasetSpec],
        models: Mapping[str, ModelSpec],
        used: list[tuple[str, str]],
    ) -> None:
        parent = spec.params["of"]
        if parent not in datasets:
            raise ConfigError(f"{spec.key_path}.of: no dataset {parent!r}{suggest(parent, datasets)}")
        if datasets[parent].parent is not None:
            raise ConfigError(f"{spec.key_path}.of: {parent!r} is itself a subset; derive from the full dataset")

    def parent(self, spec: DatasetSpec) -> str | None:
        return spec.params["of"]

    def identity(self, spec: DatasetSpec) -> dict[str, Any]:
        # The lists enter a unit key by their content (the planner hashes the files), not by their paths.
        ignored = ("count", "include", "exclude")
        return {"id": spec.id, "kind": spec.kind, **{k: v for k, v in spec.params.items() if k not in ignored}}

    def missing(self, spec: DatasetSpec) -> dict[str, str]:
        problems: dict[str, str] = {}
        for which in ("include", "exclude"):
            for i, file in enumerate(spec.params.get(which, [])):
                if not Path(file).is_file():
                    problems[f"{spec.key_path}.{which}[{i}]"] = f"list file {file} does not exist"
        return problems
