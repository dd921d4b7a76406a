"""The experiment file (TOML) of `oodbench run`: schema, path variables, overrides and validation.

Every problem is a `ConfigError` whose message starts with the offending key (``datasets.ninco.root``,
``models[3].name``, ``detectors.params.knn.kk``), so a user can jump to the line. Validation is static and
needs no weights, images or network: model names are resolved against the timm and open_clip registries,
detector names and hyper-parameters against the detector registry. Whether dataset roots exist is checked
by `missing_roots`, which `oodbench run` calls before any work and `--dry-run` reports.

Relative paths resolve against the current directory. String values may use ``${name}`` for an entry of the
``[paths]`` table (itself possibly ``${env:VAR}``), so one edit (or ``--set paths.data=/mnt/ood``) moves every
dataset root.
"""

from __future__ import annotations

import copy
import difflib
import functools
import json
import os
import re
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ConfigError

__all__ = [
    "ExperimentConfig",
    "ModelSpec",
    "DatasetSpec",
    "ZeroShotSpec",
    "MODEL_KINDS",
    "DATASET_KINDS",
    "CLASSIFIER_KINDS",
    "load_config",
    "parse_config",
    "apply_overrides",
    "missing_roots",
]

# What each model kind is: a supervised classifier (fit → score with the post-hoc detectors) or a VLM (zero-shot).
CLASSIFIER_KINDS = ("demo-digits", "timm", "probe")
VLM_KINDS = ("open_clip",)
MODEL_KINDS = CLASSIFIER_KINDS + VLM_KINDS
DATASET_KINDS = ("demo", "registry", "folder", "list", "imagenet", "subset")
DEMO_DATASETS = ("digits-fit", "digits-id-test", "digits-6to9", "lfw-faces", "noise", "digits-6to9-train")
_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+@=,-]*$")
_VAR = re.compile(r"\$\{([^}]*)\}")


# ----------------------------------------------------------------------------------------------- specs
@dataclass(frozen=True)
class ModelSpec:
    """One model of the experiment: its store id, kind and kind-specific settings."""

    id: str
    kind: str
    params: dict[str, Any]
    key_path: str  # where it was declared, for error messages (e.g. "models[2]")

    @property
    def is_classifier(self) -> bool:
        """True for models evaluated with the supervised post-hoc detectors."""
        return self.kind in CLASSIFIER_KINDS

    @property
    def store_id(self) -> str:
        """Model id of the extracted entries (a probe's frozen backbone is stored under the backbone's id)."""
        return self.params["backbone_id"] if self.kind == "probe" else self.id

    def extract_identity(self) -> dict[str, Any]:
        """What determines the extracted arrays (for a probe: the backbone only, so probes can share it)."""
        identity = self.identity()
        if self.kind == "probe":
            identity = {k: v for k, v in identity.items() if k not in ("id", "probe")}
            identity["kind"] = "timm-backbone"
        return identity

    def identity(self) -> dict[str, Any]:
        """What determines the model's outputs (hashed into every downstream unit key)."""
        identity: dict[str, Any] = {"id": self.id, "kind": self.kind, **self.params}
        checkpoint = self.params.get("checkpoint")
        if checkpoint:
            # A local file: its size and modification time stand in for its bytes (hashing GBs per plan is too slow).
            path = Path(checkpoint)
            if path.is_file():
                stat = path.stat()
                identity["checkpoint_file"] = {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns}
        return identity


@dataclass(frozen=True)
class DatasetSpec:
    """One dataset: how its images are found (or, for `subset`, which rows of another entry it keeps)."""

    id: str
    kind: str
    params: dict[str, Any]
    key_path: str

    @property
    def root(self) -> Path | None:
        """The dataset's root directory or list file, when it has one."""
        value = self.params.get("root")
        return Path(value) if value else None

    def identity(self) -> dict[str, Any]:
        """What determines the dataset's items (hashed into unit keys; a subset's lists enter by content, elsewhere)."""
        ignored = ("count", "include", "exclude")
        return {"id": self.id, "kind": self.kind, **{k: v for k, v in self.params.items() if k not in ignored}}


@dataclass(frozen=True)
class ZeroShotSpec:
    """Zero-shot scoring of the VLMs: scores and parameters, ID classes, vocabularies, sweeps."""

    models: tuple[str, ...]
    scores: tuple[str, ...]
    params: dict[str, dict[str, Any]]
    classes: str
    templates: str
    vocab_store: str | None  # where `ref` vocabularies are looked up (default: <workdir>/vocab)
    vocabularies: dict[str, dict[str, Any]]  # name -> {"ref": ...} or {"build": "wordnet"|"union", ...}
    sweep_k: tuple[int, ...]
    sweep_m: tuple[int, ...]


@dataclass(frozen=True)
class ExperimentConfig:
    """A validated experiment."""

    path: Path | None
    name: str
    workdir: Path
    store: Path
    seed: int
    tpr: float
    models: dict[str, ModelSpec]
    datasets: dict[str, DatasetSpec]
    fit: str
    id_test: str
    ood: tuple[str, ...]
    detectors: dict[str, dict[str, Any]]
    zeroshot: ZeroShotSpec | None
    analysis: dict[str, dict[str, Any]]
    report: dict[str, Any]
    engine: dict[str, Any]
    raw: dict[str, Any] = field(repr=False, default_factory=dict)

    @property
    def classifiers(self) -> list[ModelSpec]:
        """Models evaluated with the post-hoc detectors, in file order."""
        return [m for m in self.models.values() if m.is_classifier]

    @property
    def vlms(self) -> list[ModelSpec]:
        """Models scored zero-shot, in file order."""
        return [m for m in self.models.values() if not m.is_classifier]

    def datasets_of(self, model: ModelSpec) -> list[str]:
        """Dataset ids a model needs features of (fit set only for classifiers)."""
        names = [self.fit] if model.is_classifier else []
        return names + [self.id_test, *self.ood]


# ----------------------------------------------------------------------------------------------- helpers
def _suggest(name: str, options: Iterable[str]) -> str:
    by_lower: dict[str, str] = {}
    for option in options:
        by_lower.setdefault(option.lower(), option)
    close = [by_lower[c] for c in difflib.get_close_matches(name.lower(), list(by_lower), n=3, cutoff=0.6)]
    return f"; did you mean {', '.join(repr(c) for c in close)}?" if close else ""


class _Table:
    """A TOML table being read: typed access by key with the full key path in every error."""

    def __init__(self, data: Any, path: str, *, allowed: Sequence[str] | None = None) -> None:
        if not isinstance(data, Mapping):
            raise ConfigError(f"{path or 'the file'}: expected a table, got {type(data).__name__} {data!r}")
        self.data, self.path = dict(data), path
        if allowed is not None:
            for key in self.data:
                if key not in allowed:
                    raise ConfigError(
                        f"{self.key(key)}: unknown key{_suggest(key, allowed)} (allowed: {', '.join(allowed)})"
                    )

    def key(self, name: str) -> str:
        return f"{self.path}.{name}" if self.path else name

    def get(self, name: str, kind: type | tuple[type, ...], default: Any = None, *, required: bool = False) -> Any:
        if name not in self.data:
            if required:
                raise ConfigError(f"{self.key(name)}: missing (required)")
            return default
        value = self.data[name]
        kinds = kind if isinstance(kind, tuple) else (kind,)
        # TOML booleans are ints in Python; never accept one where a number is meant, or vice versa.
        if isinstance(value, bool) and bool not in kinds:
            raise ConfigError(f"{self.key(name)}: expected {' or '.join(k.__name__ for k in kinds)}, got a boolean")
        if float in kinds and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if not isinstance(value, kinds):
            raise ConfigError(
                f"{self.key(name)}: expected {' or '.join(k.__name__ for k in kinds)}, got {type(value).__name__} {value!r}"
            )
        return value

    def string_list(self, name: str, default: Sequence[str] = ()) -> list[str]:
        value = self.get(name, (list, str), list(default))
        if isinstance(value, str):
            value = [value]
        for i, item in enumerate(value):
            if not isinstance(item, str) or not item:
                raise ConfigError(f"{self.key(name)}[{i}]: expected a non-empty string, got {item!r}")
        return list(value)

    def table(self, name: str, *, allowed: Sequence[str] | None = None) -> _Table:
        return _Table(self.data.get(name, {}), self.key(name), allowed=allowed)


def _positive_int(table: _Table, name: str, default: int | None = None) -> int | None:
    """An integer >= 1 (`default` when the key is absent)."""
    value = table.get(name, int, default)
    if value is not None and value < 1:
        raise ConfigError(f"{table.key(name)}: must be >= 1; got {value}")
    return value


def _check_id(value: str, key: str) -> str:
    if not _ID.match(value) or ".." in value:
        raise ConfigError(f"{key}: {value!r} is not a valid id (letters, digits and . _ + @ = , -; no slashes)")
    return value


def _expand(value: str, variables: Mapping[str, str], key: str) -> str:
    """Substitute ${name} (from [paths]) and ${env:VAR} in a string value."""

    def replace(match: re.Match[str]) -> str:
        name = match.group(1)
        if name.startswith("env:"):
            env = name[4:]
            if env not in os.environ:
                raise ConfigError(f"{key}: environment variable {env!r} (used as ${{{name}}}) is not set")
            return os.environ[env]
        if name not in variables:
            raise ConfigError(
                f"{key}: unknown path variable ${{{name}}}; define it under [paths]{_suggest(name, variables)}"
            )
        return variables[name]

    return _VAR.sub(replace, value)


def _expand_tree(value: Any, variables: Mapping[str, str], key: str) -> Any:
    if isinstance(value, str):
        return _expand(value, variables, key)
    if isinstance(value, list):
        return [_expand_tree(v, variables, f"{key}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, dict):
        return {k: _expand_tree(v, variables, f"{key}.{k}") for k, v in value.items()}
    return value


def _path_variables(raw: Mapping[str, Any]) -> dict[str, str]:
    table = _Table(raw.get("paths", {}), "paths")
    resolved: dict[str, str] = {}
    for name, value in table.data.items():
        if not isinstance(value, str):
            raise ConfigError(f"paths.{name}: expected a string path, got {value!r}")
        # Path variables may use the environment and earlier variables.
        resolved[name] = _expand(value, resolved, f"paths.{name}")
    return resolved


# ----------------------------------------------------------------------------------------------- overrides
def apply_overrides(raw: dict[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """Apply ``dotted.key=value`` overrides (value parsed as a TOML value, else taken as a string)."""
    data = copy.deepcopy(raw)
    for item in overrides:
        target, sep, text = item.partition("=")
        if not sep or not target.strip():
            raise ConfigError(
                f"--set {item!r}: expected KEY=VALUE, e.g. paths.data=/mnt/ood or detectors.params.knn.k=50"
            )
        try:
            value = tomllib.loads(f"v = {text}")["v"]
        except tomllib.TOMLDecodeError:
            value = text
        node: Any = data
        parts = re.sub(r"\[(\d+)\]", r".\1", target.strip()).split(".")
        for depth, part in enumerate(parts):
            where = ".".join(parts[: depth + 1])
            last = depth == len(parts) - 1
            if isinstance(node, list):
                if not part.isdigit() or int(part) >= len(node):
                    raise ConfigError(f"--set {item!r}: {where} is not an entry of a list of {len(node)}")
                if last:
                    node[int(part)] = value
                else:
                    node = node[int(part)]
                continue
            if not isinstance(node, dict):
                raise ConfigError(f"--set {item!r}: {'.'.join(parts[:depth])} is not a table")
            if last:
                node[part] = value
            else:
                node = node.setdefault(part, {})
    return data


# ----------------------------------------------------------------------------------------------- models
@functools.lru_cache(maxsize=1)
def _timm_pretrained() -> frozenset[str]:
    import timm

    return frozenset(timm.list_pretrained())


@functools.lru_cache(maxsize=1)
def _open_clip_registry() -> tuple[frozenset[str], dict[str, tuple[str, ...]]]:
    """open_clip's model configs and pretrained tags per model (no weights are touched)."""
    import open_clip

    tags: dict[str, list[str]] = {}
    for model, tag in open_clip.list_pretrained():
        tags.setdefault(model, []).append(tag)
    return frozenset(open_clip.list_models()), {k: tuple(v) for k, v in tags.items()}


def _check_timm_name(name: str, key: str, *, with_checkpoint: bool) -> None:
    """The name must be a timm architecture and, unless weights come from a local file, a pretrained tag timm knows."""
    import timm
    from timm.models import split_model_name_tag

    arch, tag = split_model_name_tag(name)
    if not timm.is_model(arch):
        raise ConfigError(f"{key}: timm does not know the model {name!r}{_suggest(arch, timm.list_models())}")
    if tag and not with_checkpoint:
        pretrained = _timm_pretrained()
        if name not in pretrained:
            tags = sorted(p for p in pretrained if p.startswith(arch + "."))
            raise ConfigError(
                f"{key}: timm has no pretrained weights {name!r}; tags for {arch}: {', '.join(tags) or 'none'}"
            )
    if not tag and not with_checkpoint and not any(p.startswith(arch + ".") for p in _timm_pretrained()):
        raise ConfigError(f"{key}: timm has no pretrained weights for {arch!r}; give a checkpoint = PATH")


def register_open_clip_config(path: str, name: str, key: str) -> str:
    """Make a custom open_clip architecture (a JSON model config named <name>.json) known to open_clip."""
    import open_clip

    file = Path(path).expanduser()
    if not file.is_file():
        raise ConfigError(f"{key}: {file} does not exist")
    if file.stem != name:
        raise ConfigError(
            f"{key}: open_clip names a config by its file name; {file.name} defines {file.stem!r}, not {name!r}"
        )
    if name not in open_clip.list_models():
        try:
            open_clip.add_model_config(file)
        except Exception as exc:  # open_clip raises plain errors for unreadable configs
            raise ConfigError(f"{key}: open_clip cannot read {file}: {exc}") from None
        _open_clip_registry.cache_clear()
    return str(file)


def _check_open_clip(name: str, pretrained: str | None, key: str) -> None:
    models, all_tags = _open_clip_registry()
    if name not in models:  # registered since the registry was cached (open_clip.add_model_config)?
        _open_clip_registry.cache_clear()
        models, all_tags = _open_clip_registry()
    if name not in models:
        raise ConfigError(f"{key}.name: open_clip does not know the model {name!r}{_suggest(name, models)}")
    if pretrained is not None:
        tags = all_tags.get(name, ())
        if pretrained not in tags:
            raise ConfigError(
                f"{key}.pretrained: open_clip has no weights {pretrained!r} for {name!r}; "
                f"available: {', '.join(tags) or 'none'}"
            )


def _check_nac_layers(layers: list[str], key: str) -> list[str]:
    """NAC layer specs (LAYER[:ALPHA[:POOLING]]) checked by the extractor's parser when it is available."""
    try:
        from ..errors import ExtractError
        from ..extract.nac import NacLayer
    except ImportError:
        return layers
    for i, spec in enumerate(layers):
        try:
            NacLayer.parse(spec)
        except (ExtractError, ValueError) as exc:
            raise ConfigError(f"{key}[{i}]: {exc}") from None
    return layers


def _check_probe(params: Mapping[str, Any], key: str) -> dict[str, Any]:
    """Linear-probe hyper-parameters, checked against the extractor's ProbeConfig when it is available."""
    try:
        from dataclasses import fields

        from ..errors import ExtractError
        from ..extract.probe import ProbeConfig
    except ImportError:
        return dict(params)
    allowed = [f.name for f in fields(ProbeConfig)]
    for name in params:
        if name not in allowed:
            raise ConfigError(
                f"{key}.{name}: unknown probe parameter{_suggest(name, allowed)} (parameters: {', '.join(allowed)})"
            )
    try:
        ProbeConfig(**params)
    except (ExtractError, TypeError) as exc:
        raise ConfigError(f"{key}: {exc}") from None
    return dict(params)


_MODEL_KEYS = {
    "demo-digits": ("id", "kind", "epochs", "seed"),
    "timm": ("id", "kind", "name", "checkpoint", "batch_size", "nac_layers"),
    "probe": ("id", "kind", "backbone", "backbone_id", "checkpoint", "batch_size", "probe"),
    "open_clip": ("id", "kind", "name", "pretrained", "checkpoint", "config_file", "batch_size", "patches"),
}


def _parse_model(entry: Any, key: str, variables: Mapping[str, str], seed: int) -> ModelSpec:
    base = _Table(entry, key)
    kind = base.get("kind", str, required=True)
    if kind not in MODEL_KINDS:
        raise ConfigError(
            f"{key}.kind: unknown model kind {kind!r}{_suggest(kind, MODEL_KINDS)} (kinds: {', '.join(MODEL_KINDS)})"
        )
    table = _Table(_expand_tree(dict(base.data), variables, key), key, allowed=_MODEL_KEYS[kind])
    params: dict[str, Any] = {}
    checkpoint = table.get("checkpoint", str)
    if checkpoint:
        params["checkpoint"] = str(Path(checkpoint).expanduser())
    batch_size = _positive_int(table, "batch_size")
    if batch_size is not None:
        params["batch_size"] = batch_size
    if kind == "demo-digits":
        params.update(epochs=_positive_int(table, "epochs", 40), seed=table.get("seed", int, seed))
        model_id = table.get("id", str, "digits-cnn")
        if model_id != "digits-cnn":
            raise ConfigError(f"{key}.id: the demo model is stored as 'digits-cnn'; got {model_id!r}")
    elif kind == "timm":
        name = table.get("name", str, required=True)
        _check_timm_name(name, f"{key}.name", with_checkpoint=bool(checkpoint))
        params["name"] = name
        layers = table.string_list("nac_layers")
        if layers:
            params["nac_layers"] = _check_nac_layers(layers, f"{key}.nac_layers")
        model_id = table.get("id", str, name)
    elif kind == "probe":
        backbone = table.get("backbone", str, required=True)
        _check_timm_name(backbone, f"{key}.backbone", with_checkpoint=bool(checkpoint))
        params["backbone"] = backbone
        params["backbone_id"] = _check_id(table.get("backbone_id", str, backbone), f"{key}.backbone_id")
        params["probe"] = _check_probe(table.get("probe", dict, {}), f"{key}.probe")
        model_id = table.get("id", str, f"{backbone}+probe")
    else:
        name = table.get("name", str, required=True)
        config_file = table.get("config_file", str)
        if config_file:
            params["config_file"] = register_open_clip_config(config_file, name, f"{key}.config_file")
        pretrained = table.get("pretrained", str)
        if pretrained is None and not checkpoint:
            raise ConfigError(
                f"{key}.pretrained: missing; name the open_clip weights (e.g. 'openai') or give a checkpoint"
            )
        _check_open_clip(name, pretrained, key)
        params.update(name=name, pretrained=pretrained)
        params["patches"] = table.get("patches", bool, False)
        model_id = table.get(
            "id", str, f"{name}@{pretrained}" if pretrained else name
        )  # as `oodbench extract` names it
    return ModelSpec(_check_id(model_id, f"{key}.id"), kind, params, key)


# ----------------------------------------------------------------------------------------------- datasets
_DATASET_KEYS = {
    "demo": ("kind", "count"),
    "registry": ("kind", "name", "root", "count"),
    "folder": ("kind", "root", "labels", "count"),
    "list": ("kind", "root", "images", "count"),
    "imagenet": ("kind", "root", "split", "count"),
    "subset": ("kind", "of", "include", "exclude", "count"),
}


def _parse_dataset(name: str, entry: Any, variables: Mapping[str, str]) -> DatasetSpec:
    key = f"datasets.{name}"
    _check_id(name, key)
    base = _Table(entry, key)
    kind = base.get("kind", str, required=True)
    if kind not in DATASET_KINDS:
        raise ConfigError(
            f"{key}.kind: unknown dataset kind {kind!r}{_suggest(kind, DATASET_KINDS)} (kinds: {', '.join(DATASET_KINDS)})"
        )
    table = _Table(_expand_tree(dict(base.data), variables, key), key, allowed=_DATASET_KEYS[kind])
    params: dict[str, Any] = {}
    count = _positive_int(table, "count")
    if count is not None:
        params["count"] = count
    if kind == "demo":
        if name not in DEMO_DATASETS:
            raise ConfigError(
                f"{key}: the demo has no dataset {name!r}{_suggest(name, DEMO_DATASETS)} (it has {', '.join(DEMO_DATASETS)})"
            )
    elif kind == "subset":
        params["of"] = table.get("of", str, required=True)
        for which in ("include", "exclude"):
            files = table.string_list(which)
            if files:
                params[which] = [str(Path(f).expanduser()) for f in files]
        if "include" not in params and "exclude" not in params:
            raise ConfigError(f"{key}: a subset needs include = [LIST FILES] or exclude = [LIST FILES]")
    else:
        params["root"] = str(Path(table.get("root", str, required=True)).expanduser())
        if kind == "registry":
            registry_name = table.get("name", str, name)
            _check_registry_name(registry_name, f"{key}.name")
            params["name"] = registry_name
        elif kind == "folder":
            params["labels"] = table.get("labels", bool, False)
        elif kind == "list":
            images = table.get("images", str)
            if images:
                params["images"] = str(Path(images).expanduser())
        elif kind == "imagenet":
            split = table.get("split", str, "val")
            if split not in ("val", "train"):
                raise ConfigError(f"{key}.split: expected 'val' or 'train'; got {split!r}")
            params["split"] = split
    return DatasetSpec(name, kind, params, key)


def _check_registry_name(name: str, key: str) -> None:
    try:
        from ..extract import dataset_registry
    except ImportError:
        return  # checked when the extract stage runs (which then reports extraction as not available)
    if name.lower() not in dataset_registry.REGISTRY:
        raise ConfigError(
            f"{key}: no registered dataset {name!r}{_suggest(name, dataset_registry.REGISTRY)} "
            f"(registered: {', '.join(dataset_registry.REGISTRY)})"
        )


# ----------------------------------------------------------------------------------------------- detectors
def _parse_detectors(raw: Any) -> dict[str, dict[str, Any]]:
    from .. import detectors as registry
    from ..errors import DetectorError

    table = _Table(raw, "detectors", allowed=("include", "exclude", "params"))
    available = registry.available()
    include = table.get("include", (str, list), "all")
    if include == "all":
        names = list(available)
    elif isinstance(include, str):
        raise ConfigError(f'detectors.include: expected "all" or a list of detector names; got {include!r}')
    else:
        names = table.string_list("include")
    exclude = table.string_list("exclude")
    for field_name, listed in (("include", names), ("exclude", exclude)):
        for i, name in enumerate(listed):
            if name not in available:
                raise ConfigError(
                    f"detectors.{field_name}[{i}]: unknown detector {name!r}{_suggest(name, available)} "
                    f"(registered: {', '.join(available)})"
                )
    if len(set(names)) != len(names):
        raise ConfigError(f"detectors.include: lists a detector twice: {names}")
    chosen = [n for n in names if n not in exclude]
    params_table = table.table("params")
    resolved: dict[str, dict[str, Any]] = {}
    for name, params in params_table.data.items():
        key = f"detectors.params.{name}"
        if name not in available:
            raise ConfigError(f"{key}: unknown detector {name!r}{_suggest(name, available)}")
        if name not in chosen:
            raise ConfigError(f"{key}: parameters for {name!r}, which is not evaluated (not included, or excluded)")
        params = _Table(params, key).data
        allowed = registry.get_class(name).param_names()
        for param in params:
            if param not in allowed:
                raise ConfigError(
                    f"{key}.{param}: {name} has no parameter {param!r}{_suggest(param, allowed)} "
                    f"(its parameters: {', '.join(allowed) or 'none'})"
                )
    for name in chosen:
        params = dict(params_table.data.get(name, {}))
        try:
            detector = registry.create(name, **params)
        except DetectorError as exc:
            raise ConfigError(f"detectors.params.{name}: {exc}") from None
        # The resolved parameters (defaults filled in) are what the unit keys hash, so a changed default recomputes.
        resolved[name] = json.loads(json.dumps(detector.get_params(), default=str))
    if not resolved:
        raise ConfigError("detectors: no detector left to evaluate (include/exclude remove them all)")
    return resolved


# ----------------------------------------------------------------------------------------------- zero-shot
def _zeroshot_scores() -> dict[str, Any] | None:
    """The zero-shot score registry when the zeroshot package provides it."""
    try:
        from ..zeroshot.scores import SCORES
    except ImportError:
        return None
    return dict(SCORES)


_VOCAB_KEYS = {"ref": ("ref", "kind"), "wordnet": ("build", "m", "percentile"), "union": ("build", "of")}
VOCAB_KINDS = ("wordnet", "siblings", "union", "oracle", "eoe", "custom")


def _parse_vocabulary(name: str, entry: Any, variables: Mapping[str, str]) -> dict[str, Any]:
    key = f"zeroshot.vocabularies.{name}"
    if not re.match(r"^[A-Za-z0-9][A-Za-z0-9._+=,-]*$", name):
        raise ConfigError(f"{key}: {name!r} is not a valid vocabulary name (letters, digits and . _ + = , -)")
    base = _Table(_expand_tree(entry, variables, key), key)
    if "ref" in base.data and "build" in base.data:
        raise ConfigError(f"{key}: give either ref (a stored vocabulary) or build (made by the runner), not both")
    if "ref" in base.data:
        table = _Table(base.data, key, allowed=_VOCAB_KEYS["ref"])
        entry = {"ref": table.get("ref", str, required=True)}
        kind = table.get("kind", str)
        if kind is not None:
            if kind not in VOCAB_KINDS:
                raise ConfigError(
                    f"{key}.kind: unknown vocabulary kind {kind!r}{_suggest(kind, VOCAB_KINDS)} "
                    f"(kinds: {', '.join(VOCAB_KINDS)})"
                )
            entry["kind"] = kind
        return entry
    build = base.get("build", str)
    if build is None:
        raise ConfigError(f'{key}: missing ref = "NAME[@vN]" (a stored vocabulary) or build = "wordnet"|"union"')
    if build not in ("wordnet", "union"):
        raise ConfigError(
            f"{key}.build: the runner builds 'wordnet' (NegMining) and 'union' vocabularies; got {build!r}. "
            "Build LLM siblings, EOE and oracle lists with `oodbench zeroshot vocab` and give ref = NAME"
        )
    table = _Table(base.data, key, allowed=_VOCAB_KEYS[build])
    if build == "wordnet":
        m = _positive_int(table, "m", 5000)
        percentile = table.get("percentile", float, 95.0)
        if not 0.0 < percentile <= 100.0:
            raise ConfigError(f"{key}.percentile: must lie in (0, 100]; got {percentile}")
        return {"build": "wordnet", "m": m, "percentile": percentile}
    parts = table.string_list("of")
    if len(parts) != 2:
        raise ConfigError(f"{key}.of: a union joins two vocabularies [WORDNET, SIBLINGS]; got {parts}")
    return {"build": "union", "of": parts}


def _parse_zeroshot(raw: Any, models: Mapping[str, ModelSpec], variables: Mapping[str, str]) -> ZeroShotSpec | None:
    if raw is None:
        return None
    table = _Table(
        raw,
        "zeroshot",
        allowed=(
            "models",
            "scores",
            "params",
            "classes",
            "templates",
            "vocab_store",
            "vocabularies",
            "sweep_k",
            "sweep_m",
        ),
    )
    vlms = [m.id for m in models.values() if not m.is_classifier]
    model_ids = table.string_list("models", vlms)
    for i, model_id in enumerate(model_ids):
        if model_id not in models:
            raise ConfigError(f"zeroshot.models[{i}]: no model with id {model_id!r}{_suggest(model_id, models)}")
        if models[model_id].is_classifier:
            raise ConfigError(f"zeroshot.models[{i}]: {model_id!r} is a {models[model_id].kind} classifier, not a VLM")
    if not model_ids:
        raise ConfigError("zeroshot.models: no VLM to score (declare an open_clip model under [[models]])")
    scores = table.string_list("scores")
    if not scores:
        raise ConfigError('zeroshot.scores: missing; list the zero-shot scores, e.g. ["mcm", "neglabel"]')
    registry = _zeroshot_scores()
    if registry is not None:
        for i, name in enumerate(scores):
            if name not in registry:
                raise ConfigError(
                    f"zeroshot.scores[{i}]: unknown zero-shot score {name!r}{_suggest(name, registry)} "
                    f"(known: {', '.join(registry)})"
                )
    params: dict[str, dict[str, Any]] = {}
    for name, entry in table.table("params").data.items():
        key = f"zeroshot.params.{name}"
        if name not in scores:
            raise ConfigError(f"{key}: parameters for {name!r}, which is not in zeroshot.scores")
        given = dict(_Table(entry, key).data)
        if registry is not None:
            allowed = list(registry[name].defaults)
            for param in given:
                if param not in allowed:
                    raise ConfigError(
                        f"{key}.{param}: {name} has no parameter {param!r}{_suggest(param, allowed)} "
                        f"(its parameters: {', '.join(allowed)})"
                    )
        params[name] = given
    vocabularies = {
        name: _parse_vocabulary(name, entry, variables) for name, entry in table.table("vocabularies").data.items()
    }
    for name, vocab in vocabularies.items():
        for i, part in enumerate(vocab.get("of", [])):
            if part not in vocabularies or part == name:
                raise ConfigError(
                    f"zeroshot.vocabularies.{name}.of[{i}]: no other vocabulary {part!r}{_suggest(part, vocabularies)}"
                )
    sweeps = {}
    for which in ("sweep_k", "sweep_m"):
        values = table.get(which, list, [])
        for i, value in enumerate(values):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"zeroshot.{which}[{i}]: expected a positive integer; got {value!r}")
        sweeps[which] = tuple(values)
    templates = table.get("templates", str, "seed")
    if templates != "seed":
        raise ConfigError(
            f'zeroshot.templates: only "seed" (the bare name plus seven OpenAI templates) is supported; got {templates!r}'
        )
    vocab_store = table.get("vocab_store", str)
    return ZeroShotSpec(
        models=tuple(model_ids),
        scores=tuple(scores),
        params=params,
        classes=_expand(table.get("classes", str, "imagenet1k"), variables, "zeroshot.classes"),
        templates=templates,
        vocab_store=_expand(vocab_store, variables, "zeroshot.vocab_store") if vocab_store else None,
        vocabularies=vocabularies,
        sweep_k=sweeps["sweep_k"],
        sweep_m=sweeps["sweep_m"],
    )


# ----------------------------------------------------------------------------------------------- analysis & report
_ANALYSES = {
    "subsample": ("n", "draws", "seed"),
    "intervals": ("methods", "resamples", "confidence", "seed"),
}
_INTERVAL_METHODS = ("wilson", "clopper-pearson", "delong", "percentile", "bca")


def _parse_analysis(raw: Any) -> dict[str, dict[str, Any]]:
    table = _Table(raw, "analysis", allowed=tuple(_ANALYSES))
    analyses: dict[str, dict[str, Any]] = {}
    for name in table.data:
        entry = table.table(name, allowed=_ANALYSES[name])
        params: dict[str, Any] = {"seed": entry.get("seed", int, 0)}
        if name == "subsample":
            params["draws"] = _positive_int(entry, "draws", 1000)
            n = entry.data.get("n", "auto")
            for i, value in enumerate(n if isinstance(n, list) else [n]):
                if not (value == "auto" or (isinstance(value, int) and not isinstance(value, bool) and value >= 1)):
                    where = f"analysis.subsample.n[{i}]" if isinstance(n, list) else "analysis.subsample.n"
                    raise ConfigError(f'{where}: expected "auto" or a positive integer; got {value!r}')
            params["n"] = n
        else:
            params["resamples"] = _positive_int(entry, "resamples", 2000)
            confidence = entry.get("confidence", float, 0.95)
            if not 0.0 < confidence < 1.0:
                raise ConfigError(f"analysis.intervals.confidence: must lie in (0, 1); got {confidence}")
            params["confidence"] = confidence
            methods = entry.string_list("methods", _INTERVAL_METHODS)
            for i, method in enumerate(methods):
                if method not in _INTERVAL_METHODS:
                    raise ConfigError(
                        f"analysis.intervals.methods[{i}]: unknown method {method!r}"
                        f"{_suggest(method, _INTERVAL_METHODS)} (methods: {', '.join(_INTERVAL_METHODS)})"
                    )
            params["methods"] = methods
        analyses[name] = params
    return analyses


_REPORT_KEYS = ("formats", "figure_formats", "title", "curve_draws", "resamples", "score_figures")


def _parse_report(raw: Any) -> dict[str, Any]:
    table = _Table(raw, "report", allowed=_REPORT_KEYS)
    report: dict[str, Any] = {
        "formats": table.string_list("formats", ["markdown", "html"]),
        "figure_formats": table.string_list("figure_formats", ["png"]),
        "title": table.get("title", str, ""),
        "curve_draws": _positive_int(table, "curve_draws", 300),
        "resamples": _positive_int(table, "resamples", 1000),
        "score_figures": table.get("score_figures", bool, True),
    }
    for i, fmt in enumerate(report["formats"]):
        if fmt not in ("markdown", "latex", "html"):
            raise ConfigError(
                f"report.formats[{i}]: unknown format {fmt!r}{_suggest(fmt, ('markdown', 'latex', 'html'))} "
                "(markdown, latex, html)"
            )
    if not report["formats"]:
        raise ConfigError("report.formats: empty; give at least one of markdown, latex, html")
    for i, fmt in enumerate(report["figure_formats"]):
        if fmt not in ("png", "pdf", "svg"):
            raise ConfigError(f"report.figure_formats[{i}]: unknown format {fmt!r} (png, pdf, svg)")
    return report


# ----------------------------------------------------------------------------------------------- top level
_TOP = (
    "experiment",
    "paths",
    "models",
    "datasets",
    "id",
    "ood",
    "detectors",
    "zeroshot",
    "analysis",
    "report",
    "engine",
)


def parse_config(
    raw: Mapping[str, Any], *, path: Path | None = None, workdir: str | os.PathLike[str] | None = None
) -> ExperimentConfig:
    """Validate a parsed TOML document; `workdir` overrides ``experiment.workdir``."""
    top = _Table(raw, "", allowed=_TOP)
    variables = _path_variables(raw)
    experiment = _Table(
        _expand_tree(top.data.get("experiment", {}), variables, "experiment"),
        "experiment",
        allowed=("name", "workdir", "store", "seed", "tpr"),
    )
    name = experiment.get("name", str, path.stem if path else "experiment")
    chosen_workdir = Path(workdir) if workdir is not None else Path(experiment.get("workdir", str, f"oodbench-{name}"))
    store = Path(experiment.get("store", str, str(chosen_workdir / "store")))
    seed = experiment.get("seed", int, 0)
    tpr = experiment.get("tpr", float, 0.95)
    if not 0.0 < tpr < 1.0:
        raise ConfigError(f"experiment.tpr: must lie in (0, 1); got {tpr}")

    raw_models = top.get("models", list, required=True)
    if not raw_models:
        raise ConfigError("models: empty; declare at least one [[models]] entry")
    models: dict[str, ModelSpec] = {}
    for i, entry in enumerate(raw_models):
        spec = _parse_model(entry, f"models[{i}]", variables, seed)
        if spec.id in models:
            raise ConfigError(f"models[{i}].id: {spec.id!r} is already used by {models[spec.id].key_path}")
        models[spec.id] = spec

    datasets_table = top.table("datasets")
    if not datasets_table.data:
        raise ConfigError("datasets: missing; declare each dataset under [datasets.<id>]")
    datasets = {name: _parse_dataset(name, entry, variables) for name, entry in datasets_table.data.items()}
    for spec in datasets.values():
        if spec.kind == "subset":
            parent = spec.params["of"]
            if parent not in datasets:
                raise ConfigError(f"{spec.key_path}.of: no dataset {parent!r}{_suggest(parent, datasets)}")
            if datasets[parent].kind == "subset":
                raise ConfigError(f"{spec.key_path}.of: {parent!r} is itself a subset; derive from the full dataset")

    id_table = top.table("id", allowed=("fit", "test"))
    fit = id_table.get("fit", str, required=True)
    id_test = id_table.get("test", str, required=True)
    ood_table = top.table("ood", allowed=("datasets",))
    ood = ood_table.string_list("datasets")
    if not ood:
        raise ConfigError("ood.datasets: missing or empty; list the OOD dataset ids")
    for key, name_ in [("id.fit", fit), ("id.test", id_test), *[(f"ood.datasets[{i}]", n) for i, n in enumerate(ood)]]:
        if name_ not in datasets:
            raise ConfigError(f"{key}: no dataset {name_!r} under [datasets]{_suggest(name_, datasets)}")
    used = [fit, id_test, *ood]
    if len(set(used)) != len(used):
        duplicates = sorted({n for n in used if used.count(n) > 1})
        raise ConfigError(
            f"ood.datasets: {', '.join(duplicates)} used twice (ID fit, ID test and OOD sets must differ)"
        )

    demo_models = [m for m in models.values() if m.kind == "demo-digits"]
    for spec in datasets.values():
        if spec.kind == "demo" and not demo_models and spec.id in used:
            raise ConfigError(
                f"{spec.key_path}.kind: 'demo' datasets come from a model of kind 'demo-digits'; declare one"
            )
    if demo_models:
        for key, name_ in [
            ("id.fit", fit),
            ("id.test", id_test),
            *[(f"ood.datasets[{i}]", n) for i, n in enumerate(ood)],
        ]:
            if datasets[name_].kind != "demo":
                raise ConfigError(
                    f"{key}: the demo-digits model sees only its own digits; {name_!r} is a "
                    f"{datasets[name_].kind} dataset"
                )
        if store.name != "store":
            raise ConfigError(f"experiment.store: the demo writes its store to <dir>/store; got {store}")

    detectors = _parse_detectors(top.get("detectors", dict, {"include": "all"}))
    zeroshot = _parse_zeroshot(top.data.get("zeroshot"), models, variables)
    if any(not m.is_classifier for m in models.values()) and zeroshot is None:
        vlm = next(m for m in models.values() if not m.is_classifier)
        raise ConfigError(f"{vlm.key_path}: an open_clip model is scored zero-shot; add a [zeroshot] table")
    analysis = _parse_analysis(top.get("analysis", dict, {}))
    report = _parse_report(top.get("report", dict, {}))
    engine_table = top.table("engine", allowed=("ray_address", "gpus_per_extract", "cpus_per_score", "workers"))
    engine = {
        "workers": engine_table.get("workers", int, 4),
        "ray_address": engine_table.get("ray_address", str),
        "gpus_per_extract": engine_table.get("gpus_per_extract", float, 0.0),
        "cpus_per_score": engine_table.get("cpus_per_score", float, 1.0),
    }
    return ExperimentConfig(
        path=path,
        name=name,
        workdir=chosen_workdir,
        store=store,
        seed=seed,
        tpr=tpr,
        models=models,
        datasets=datasets,
        fit=fit,
        id_test=id_test,
        ood=tuple(ood),
        detectors=detectors,
        zeroshot=zeroshot,
        analysis=analysis,
        report=report,
        engine=engine,
        raw=dict(raw),
    )


def load_config(
    path: str | os.PathLike[str], *, overrides: Sequence[str] = (), workdir: str | os.PathLike[str] | None = None
) -> ExperimentConfig:
    """Read, override and validate an experiment file."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such experiment file") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc}") from None
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    return parse_config(apply_overrides(raw, overrides), path=path, workdir=workdir)


def missing_roots(config: ExperimentConfig, dataset_ids: Iterable[str] | None = None) -> dict[str, str]:
    """{key: problem} for dataset roots and list files that do not exist (e.g. ``datasets.ninco.root``)."""
    problems: dict[str, str] = {}
    for name in dataset_ids if dataset_ids is not None else config.datasets:
        spec = config.datasets[name]
        if spec.kind == "subset":
            for which in ("include", "exclude"):
                for i, file in enumerate(spec.params.get(which, [])):
                    if not Path(file).is_file():
                        problems[f"{spec.key_path}.{which}[{i}]"] = f"list file {file} does not exist"
            continue
        root = spec.root
        if root is not None and not root.exists():
            problems[f"{spec.key_path}.root"] = f"{root} does not exist"
        images = spec.params.get("images")
        if images and not Path(images).is_dir():
            problems[f"{spec.key_path}.images"] = f"{images} is not a directory"
    return problems
