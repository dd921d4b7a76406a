"""Model kinds and dataset kinds of the experiment file: one class per kind, registered by name like detectors.

A kind owns everything the runner needs to know about it: the keys its table allows (a `schema.Table`),
how those become the spec's parameters (`parse`), what identifies its outputs (`identity`, hashed into unit
keys), how many images it has (`count`), and how its work is done (`open` for datasets, `backbone`/`extract`
for models). The planner and the stages never branch on a kind's name; they ask the kind.

Adding a kind is one class: subclass `ModelKind` or `DatasetKind`, set ``name`` and ``Table``, decorate it with
`register_model_kind` / `register_dataset_kind` (from `runner/registry.py`, re-exported here). The built-in kinds
live in `runner/models.py`, `runner/hf.py` and `runner/datasets.py`; a kind defined elsewhere is available once its
module is imported. Kinds sit below the config and the stages: what they read of those is the `Experiment` and
`RunContext` protocols.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from ..core.errors import ConfigError
from .registry import KINDS, KindRegistry, register_dataset_kind, register_model_kind
from .schema import Table

if TYPE_CHECKING:
    from ..core.store import Store

__all__ = [
    "ModelSpec",
    "DatasetSpec",
    "ModelKind",
    "DatasetKind",
    "Experiment",
    "RunContext",
    "register_model_kind",
    "register_dataset_kind",
    "model_kind",
    "dataset_kind",
    "model_kinds",
    "dataset_kinds",
]


# ----------------------------------------------------------------------------------------------- what kinds read
class Experiment(Protocol):
    """What a kind reads of the experiment (`runner.config.ExperimentConfig` is one; kinds sit below it)."""

    @property
    def store(self) -> Path: ...

    @property
    def fit(self) -> str: ...

    @property
    def id_test(self) -> str: ...

    @property
    def models(self) -> Mapping[str, ModelSpec]: ...

    @property
    def engine(self) -> Mapping[str, Any]: ...

    def datasets_of(self, model: ModelSpec) -> list[str]:
        """Dataset ids a model needs features of."""
        ...


class RunContext(Protocol):
    """What a kind's work reads of the run (`runner.stages.Context` is one; kinds sit below it)."""

    @property
    def config(self) -> Experiment: ...

    @property
    def device(self) -> str: ...

    @property
    def progress(self) -> bool: ...

    @property
    def store(self) -> Store: ...

    def backbone(self, model: ModelSpec) -> Any:
        """The model's extraction backbone, loaded."""
        ...


# ----------------------------------------------------------------------------------------------- specs
@dataclass(frozen=True)
class ModelSpec:
    """One model of the experiment: its store id, kind and kind-specific settings."""

    id: str
    kind: str
    params: dict[str, Any]
    key_path: str  # where it was declared, for error messages (e.g. "models[2]")
    display: str | None = None  # the name tables show (e.g. the paper's "DINOv2-g/14"); the id when unset
    kinds: KindRegistry | None = field(default=None, compare=False, repr=False)  # where `kind` is looked up

    @property
    def display_name(self) -> str:
        """The name tables and the plan show: `display` when given, else the id."""
        return self.display or self.id

    @property
    def kind_of(self) -> ModelKind:
        """The registered kind object."""
        kind: ModelKind = (self.kinds or KINDS).model(self.kind)
        return kind

    @property
    def is_classifier(self) -> bool:
        """True for models evaluated with the supervised post-hoc detectors."""
        return self.kind_of.classifier

    @property
    def store_id(self) -> str:
        """Model id of the extracted entries (a probe's frozen backbone is stored under the backbone's id)."""
        return self.kind_of.store_id(self)

    def identity(self) -> dict[str, Any]:
        """What determines the model's outputs (hashed into every downstream unit key)."""
        return self.kind_of.identity(self)

    def extract_identity(self) -> dict[str, Any]:
        """What determines the extracted arrays (for a probe: the backbone only, so probes can share it)."""
        return self.kind_of.extract_identity(self)


@dataclass(frozen=True)
class DatasetSpec:
    """One dataset: how its images are found (or, for a derived kind, which rows of another entry it keeps)."""

    id: str
    kind: str
    params: dict[str, Any]
    key_path: str
    kinds: KindRegistry | None = field(default=None, compare=False, repr=False)  # where `kind` is looked up

    @property
    def kind_of(self) -> DatasetKind:
        """The registered kind object."""
        kind: DatasetKind = (self.kinds or KINDS).dataset(self.kind)
        return kind

    @property
    def root(self) -> Path | None:
        """The dataset's root directory or list file, when it has one."""
        value = self.params.get("root")
        return Path(value) if value else None

    @property
    def parent(self) -> str | None:
        """The dataset this one is derived from (a store entry of the same model), or None."""
        return self.kind_of.parent(self)

    def identity(self) -> dict[str, Any]:
        """What determines the dataset's items (hashed into unit keys)."""
        return self.kind_of.identity(self)


# ----------------------------------------------------------------------------------------------- model kinds
class ModelKind:
    """A kind of model: its table's keys, how it is parsed and identified, and how its arrays are extracted."""

    name: ClassVar[str]
    Table: ClassVar[type[Table]]
    classifier: ClassVar[bool] = True  # scored with the post-hoc detectors (else: a VLM scored zero-shot)
    trains_head: ClassVar[bool] = False  # extraction is followed by a unit that trains the model's head (probes)
    fills_store: ClassVar[bool] = False  # one call fills every entry of the model (one task; never reset)

    def parse(self, table: Any, key: str, *, seed: int) -> tuple[str, dict[str, Any]]:
        """(model id, params) from the validated table; `key` is where it was declared (``models[2]``)."""
        raise NotImplementedError

    def check(
        self, spec: ModelSpec, datasets: Mapping[str, DatasetSpec], used: list[tuple[str, str]], store: Path
    ) -> None:
        """Checks that involve other tables (the datasets in use as (config key, id), the store); ConfigError if not."""

    def store_id(self, spec: ModelSpec) -> str:
        """The model id of its store entries."""
        return spec.id

    def unavailable(self, spec: ModelSpec) -> str | None:
        """Why the model cannot run as declared (its weights need a file that is not given), else None; it is skipped."""
        return spec.params.get("needs_checkpoint")

    def identity(self, spec: ModelSpec) -> dict[str, Any]:
        """What determines the model's outputs."""
        identity: dict[str, Any] = {"id": spec.id, "kind": spec.kind, **spec.params}
        checkpoint = spec.params.get("checkpoint")
        if checkpoint:
            # A local file: its size and modification time stand in for its bytes (hashing GBs per plan is too slow).
            path = Path(checkpoint)
            if path.is_file():
                stat = path.stat()
                identity["checkpoint_file"] = {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns}
        return identity

    def extract_identity(self, spec: ModelSpec) -> dict[str, Any]:
        """What determines the extracted arrays (defaults to the model's identity)."""
        return self.identity(spec)

    def weights(self, spec: ModelSpec) -> str:
        """What the weights resolve to offline, for the plan (e.g. ``timm vit_base_patch16_384.augreg_in1k``)."""
        return spec.params.get("checkpoint") or spec.params.get("name", "")

    def adoptable(self, spec: ModelSpec, store: Store, meta: Mapping[str, Any]) -> bool:
        """Whether a store entry made outside the runner is what this spec would produce."""
        return meta.get("provenance", {}).get("model") == spec.params.get("name") and not spec.params.get("checkpoint")

    def backbone(self, spec: ModelSpec, device: str) -> Any:
        """The extraction backbone (an `oodbench.extract` Backbone), loaded."""
        raise ConfigError(f"{spec.key_path}: model kind {spec.kind!r} has no extraction backbone")

    def extract(self, ctx: RunContext, spec: ModelSpec, dataset: DatasetSpec) -> None:
        """Fill the model's store entry of one dataset (default: the extraction pipeline on its backbone)."""
        from ..extract.pipeline import extract

        extract(
            ctx.store,
            ctx.backbone(spec),
            dataset.kind_of.open(dataset),
            dataset_id=dataset.id,
            model_id=spec.store_id,
            batch_size=spec.params.get("batch_size", 64),
            num_workers=ctx.config.engine["workers"],
            device=ctx.device,
            progress=ctx.progress,
        )

    def shares_decode(self, spec: ModelSpec) -> bool:
        """Whether the model's extraction can join a shared-decode pass: it runs the default pipeline on a backbone."""
        return not self.fills_store and type(self).extract is ModelKind.extract

    def footprint(self, spec: ModelSpec) -> Any:
        """Its `oodbench.extract.passes.Footprint` (parameters counted without weights), or None when unknown.

        A model of unknown footprint runs alone in its extraction pass.
        """
        return None

    def patch_route(self, spec: ModelSpec) -> tuple[str | None, str]:
        """VLM kinds: (route, description) of the patch embeddings GL-MCM needs, or (None, why there are none)."""
        return None, f"model kind {spec.kind!r} has no patch embeddings"

    def text_model(self, ctx: RunContext, spec: ModelSpec) -> Callable[[], Any]:
        """VLM kinds: a loader of the model's text side (a bundle with ``encode_texts``), called on first need."""
        raise ConfigError(f"{spec.key_path}: model kind {spec.kind!r} has no text encoder")

    def train_head(self, ctx: RunContext, spec: ModelSpec, stale: bool) -> dict[str, Any]:
        """Train the head on the extracted arrays (kinds with `trains_head`); returns details for the ledger."""
        raise NotImplementedError


# ----------------------------------------------------------------------------------------------- dataset kinds
class DatasetKind:
    """A kind of dataset: its table's keys, how it is parsed, identified and counted, and how its images open."""

    name: ClassVar[str]
    Table: ClassVar[type[Table]]

    def parse(self, table: Any, name: str, key: str) -> dict[str, Any]:
        """The spec's params from the validated table (paths expanded); `name` is the dataset id."""
        return {k: v for k, v in table.model_dump(exclude_none=True).items() if k != "kind"}

    def check(
        self,
        spec: DatasetSpec,
        datasets: Mapping[str, DatasetSpec],
        models: Mapping[str, ModelSpec],
        used: list[tuple[str, str]],
    ) -> None:
        """Checks that involve other tables (a parent dataset, a model that provides the images).

        `used` lists (config key, dataset id) of the datasets the experiment evaluates (``id.fit``, ``ood.datasets[0]``).
        """

    def parent(self, spec: DatasetSpec) -> str | None:
        """The dataset this one is derived from, or None for a dataset with images of its own."""
        return None

    def identity(self, spec: DatasetSpec) -> dict[str, Any]:
        """What determines the dataset's items (an expected count does not)."""
        return {"id": spec.id, "kind": spec.kind, **{k: v for k, v in spec.params.items() if k != "count"}}

    def count(self, spec: DatasetSpec, config: Experiment) -> int | None:
        """The number of images, when known without reading them (the declared ``count`` first)."""
        return int(spec.params["count"]) if "count" in spec.params else None

    def describe(self, spec: DatasetSpec) -> str:
        """What defines the dataset's images, in a few words, for the plan."""
        if spec.parent is not None:
            return f"rows of {spec.parent}"
        return str(spec.root) if spec.root is not None else ""

    def missing(self, spec: DatasetSpec) -> dict[str, str]:
        """{key: problem} for the files and directories the dataset reads that do not exist."""
        root = spec.root
        return {f"{spec.key_path}.root": f"{root} does not exist"} if root is not None and not root.exists() else {}

    def open(self, spec: DatasetSpec) -> Any:
        """The dataset's images as an extraction ImageList."""
        raise ConfigError(f"{spec.key_path}: datasets of kind {spec.kind!r} have no images to extract")


# ----------------------------------------------------------------------------------------------- lookups
def model_kinds() -> dict[str, ModelKind]:
    """Registered model kinds by name (`registry.KINDS`)."""
    return KINDS.model_kinds()


def dataset_kinds() -> dict[str, DatasetKind]:
    """Registered dataset kinds by name (`registry.KINDS`)."""
    return KINDS.dataset_kinds()


def model_kind(name: str, key: str = "kind") -> ModelKind:
    """The model kind called `name`; ConfigError (with the closest names) when there is none."""
    kind: ModelKind = KINDS.model(name, key)
    return kind


def dataset_kind(name: str, key: str = "kind") -> DatasetKind:
    """The dataset kind called `name`; ConfigError (with the closest names) when there is none."""
    kind: DatasetKind = KINDS.dataset(name, key)
    return kind
