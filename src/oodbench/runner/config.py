"""The experiment file (TOML) of `oodbench run`: schema, path variables, overrides and validation.

Every problem is a `ConfigError` whose message starts with the offending key (``datasets.ninco.root``,
``models[3].name``, ``detectors.params.knn.kk``), so a user can jump to the line. Each table has a declarative
schema (`schema.Table`, pydantic); models and datasets are validated by their kind, looked up in a
`registry.KindRegistry` given as data (`registry.KINDS` by default; the kinds' modules are not imported here), which
also resolves names against the timm and open_clip registries. Detector names and hyper-parameters are checked
against the detector registry. Validation is static and needs no weights, images or network; whether dataset
roots exist is checked by `missing_roots`, which `oodbench run` calls before any work and `--dry-run` reports.

Relative paths resolve against the current directory. String values may use ``${name}`` for an entry of the
``[paths]`` table (itself possibly ``${env:VAR}``), so one edit (or ``--set paths.data=/mnt/ood``) moves every
dataset root.
"""

from __future__ import annotations

import copy
import json
import os
import re
import tomllib
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field

from ..core.errors import ConfigError
from ..core.names import check_name, unknown_parameter
from ..evaluation.spec import EvaluationSpec
from .kinds import DatasetSpec, ModelSpec
from .registry import KINDS, KindRegistry
from .schema import PositiveInt, Seed, StrList, Table, as_mapping, suggest, validate

__all__ = [
    "ExperimentConfig",
    "ModelSpec",
    "DatasetSpec",
    "ZeroShotSpec",
    "load_config",
    "parse_config",
    "apply_overrides",
    "missing_roots",
    "check_id",
]

_VAR = re.compile(r"\$\{([^}]*)\}")


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
    plugins: tuple[str, ...] = ()
    save_detectors: bool = False
    gram_dtype: str = "float64"
    raw: dict[str, Any] = field(repr=False, default_factory=dict)
    skipped_models: tuple[tuple[ModelSpec, str], ...] = ()  # declared but not run (a needed checkpoint), with why
    # Detectors the file gives parameters for that the selection leaves out: their parameters do not apply.
    unused_params: tuple[str, ...] = ()
    # What each classifier's evaluation computes, built once from the file (`evaluation.spec`): the detectors as
    # given and resolved, fit / ID / covariate-shifted ID / OOD sets, tpr, convention, groups, AUPR, precision.
    evaluation: EvaluationSpec = field(repr=False, default=None)  # type: ignore[assignment]

    @property
    def csid(self) -> tuple[str, ...]:
        """Covariate-shifted ID sets: scored, and counted as ID in the full-spectrum table."""
        return self.evaluation.csid if self.evaluation is not None else ()

    @property
    def scored(self) -> list[str]:
        """The datasets every detector of a classifier scores: ID test, covariate-shifted ID, OOD."""
        return [self.id_test, *self.csid, *self.ood]

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
        if model.is_classifier:
            return [self.fit, *self.scored]
        return [self.id_test, *self.ood]


# ----------------------------------------------------------------------------------------------- schema
class _File(Table):
    """The top level of an experiment file; each table is validated by its own schema below."""

    plugins: StrList = []  # modules (or .py files, relative to the file) registering more detectors
    experiment: dict[str, Any] = {}
    paths: dict[str, str] = {}
    models: list[dict[str, Any]]
    datasets: dict[str, dict[str, Any]] = {}
    id: dict[str, Any] = {}
    ood: dict[str, Any] = {}
    detectors: dict[str, Any] = {"include": "all"}
    zeroshot: dict[str, Any] | None = None
    analysis: dict[str, Any] = {}
    report: dict[str, Any] = {}
    engine: dict[str, Any] = {}
    evaluation: dict[str, Any] = {}


class _Experiment(Table):
    name: str | None = None
    workdir: str | None = None
    store: str | None = None
    seed: Seed = 0
    tpr: Annotated[float, Field(gt=0.0, le=1.0)] = 0.95  # (0, 1], as `oodbench evaluate --tpr` (EvaluationSpec)


class _Id(Table):
    fit: str
    test: str
    csid: StrList = []  # covariate-shifted ID sets (e.g. imagenet-v2): scored, counted as ID in a full-spectrum table


class _Evaluation(Table):
    """The options of `oodbench evaluate` that are not datasets or detectors (the same names, the same values)."""

    convention: Literal["oodbench", "openood"] = "oodbench"  # the table's metric convention
    aupr: bool = False  # AUPR-In and AUPR-Out in the table's cells
    groups: str | None = None  # OOD groups: a groups TOML file or a shipped name (openood: OpenOOD's near / far)
    small_fit_set: Literal["fail", "adapt"] = "fail"  # what a fit set too small for a default does
    strict: bool = False  # fail (instead of skip) when a detector's requirements are not met
    verify: bool = False  # check every byte of the store entries against their checksums when they are read


class _Ood(Table):
    datasets: StrList = []


class _Detectors(Table):
    include: Any = "all"  # "all" or a list of names (checked below, against the registry)
    exclude: StrList = []
    params: dict[str, dict[str, Any]] = {}
    save: bool = False  # keep each fitted detector under <workdir>/detectors/<model>/<detector>
    gram_dtype: Literal["float64", "float32"] = "float64"  # precision of the shared Gram matrices


class _Subsample(Table):
    n: Any = "auto"  # "auto", a positive integer, or a list of them (checked below)
    draws: PositiveInt = 1000
    seed: Seed = 0


INTERVAL_METHODS = ("wilson", "clopper-pearson", "delong", "percentile", "bca")


class _Intervals(Table):
    methods: Annotated[
        list[Literal["wilson", "clopper-pearson", "delong", "percentile", "bca"]],
        BeforeValidator(lambda v: [v] if isinstance(v, str) else v),
    ] = list(INTERVAL_METHODS)
    resamples: PositiveInt = 2000
    confidence: Annotated[float, Field(gt=0.0, lt=1.0)] = 0.95
    seed: Seed = 0


class _Analysis(Table):
    subsample: _Subsample | None = None
    intervals: _Intervals | None = None


class _Report(Table):
    formats: Annotated[
        list[Literal["markdown", "latex", "html"]],
        BeforeValidator(lambda v: [v] if isinstance(v, str) else v),
        Field(min_length=1),
    ] = ["markdown", "html"]
    figure_formats: Annotated[
        list[Literal["png", "pdf", "svg"]], BeforeValidator(lambda v: [v] if isinstance(v, str) else v)
    ] = ["png"]
    title: str = ""
    curve_draws: PositiveInt = 300
    resamples: PositiveInt = 1000
    score_figures: bool = True


class _Engine(Table):
    # DataLoader workers (0: load in the main process; None: one less than the cores available, at most 4)
    workers: Annotated[int, Field(ge=0)] | None = None
    ray_address: str | None = None
    gpus_per_extract: Annotated[float, Field(ge=0.0)] = 0.0
    cpus_per_score: Annotated[float, Field(ge=0.0)] = 1.0
    # Memory the models of one shared-decode extraction pass may take (GiB); default: 80 % of the device's free memory.
    pass_memory_gb: Annotated[float, Field(gt=0.0)] | None = None


VOCAB_KINDS = ("wordnet", "siblings", "union", "oracle", "eoe", "custom")


class _RefVocabulary(Table):
    ref: str
    kind: Literal["wordnet", "siblings", "union", "oracle", "eoe", "custom"] | None = None


class _WordnetVocabulary(Table):
    build: str
    m: PositiveInt = 5000
    percentile: Annotated[float, Field(gt=0.0, le=100.0)] = 95.0
    pool: Literal["all", "neglabel"] = "all"  # the paper's 79,403 head lemmas, or NegLabel's corpus (70,794)


class _UnionVocabulary(Table):
    build: str
    of: Annotated[list[str], Field(min_length=2, max_length=2)]


class _ZeroShot(Table):
    models: StrList | None = None
    scores: StrList = []
    params: dict[str, dict[str, Any]] = {}
    classes: str = "imagenet1k"
    templates: Literal["seed"] = "seed"  # the bare name plus seven OpenAI templates
    vocab_store: str | None = None
    vocabularies: dict[str, dict[str, Any]] = {}
    sweep_k: list[PositiveInt] = []
    sweep_m: list[PositiveInt] = []


# ----------------------------------------------------------------------------------------------- helpers
def check_id(value: str, key: str) -> str:
    """A model or dataset id that is safe as a store folder name; ConfigError naming the key otherwise."""
    return check_name(value, key, error=ConfigError)


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
                f"{key}: unknown path variable ${{{name}}}; define it under [paths]{suggest(name, variables)}"
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


def _path_variables(paths: Mapping[str, str]) -> dict[str, str]:
    resolved: dict[str, str] = {}
    for name, value in paths.items():
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
        except RecursionError:  # tomllib recurses once per nesting level
            raise ConfigError(f"--set {item!r}: the value is nested too deeply") from None
        except ValueError as exc:  # e.g. an integer of more than 4300 digits (Python's conversion limit)
            raise ConfigError(f"--set {item[:60]!r}…: {str(exc).split(';')[0]}"[:300]) from None
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


# ----------------------------------------------------------------------------------------------- models, datasets
def _parse_model(
    entry: Mapping[str, Any], key: str, variables: Mapping[str, str], seed: int, kinds: KindRegistry
) -> ModelSpec:
    kind_name = entry.get("kind")
    if kind_name is None:
        raise ConfigError(f"{key}.kind: missing (required)")
    if not isinstance(kind_name, str):
        raise ConfigError(f"{key}.kind: expected a string, got {type(kind_name).__name__} {kind_name!r}")
    kind = kinds.model(kind_name, f"{key}.kind")
    entry = dict(entry)
    # Every kind takes `display`: the name tables show (free text, e.g. "DINOv2-g/14"); not part of any identity.
    display = entry.pop("display", None)
    if display is not None and (not isinstance(display, str) or not display.strip()):
        raise ConfigError(f"{key}.display: expected a non-empty string, got {display!r}")
    table = validate(kind.Table, _expand_tree(entry, variables, key), key)
    model_id, params = kind.parse(table, key, seed=seed)
    return ModelSpec(check_id(model_id, f"{key}.id"), kind.name, params, key, display, kinds=kinds)


def _parse_dataset(
    name: str, entry: Mapping[str, Any], variables: Mapping[str, str], kinds: KindRegistry
) -> DatasetSpec:
    key = f"datasets.{name}"
    check_id(name, key)
    kind_name = entry.get("kind")
    if kind_name is None:
        raise ConfigError(f"{key}.kind: missing (required)")
    if not isinstance(kind_name, str):
        raise ConfigError(f"{key}.kind: expected a string, got {type(kind_name).__name__} {kind_name!r}")
    kind = kinds.dataset(kind_name, f"{key}.kind")
    table = validate(kind.Table, _expand_tree(dict(entry), variables, key), key)
    return DatasetSpec(name, kind.name, kind.parse(table, name, key), key, kinds=kinds)


# ----------------------------------------------------------------------------------------------- detectors
def _load_plugins(plugins: Sequence[str], path: Path | None) -> tuple[str, ...]:
    """Import the detector plugins the file names (a .py file is relative to the file); detectors use them."""
    from .. import detectors as registry
    from ..core.errors import DetectorError

    resolved = []
    for i, plugin in enumerate(plugins):
        if plugin.endswith(".py") and path is not None and not Path(plugin).is_absolute():
            plugin = str((path.parent / plugin).resolve())
        try:
            registry.load_plugins([plugin])
        except DetectorError as exc:
            raise ConfigError(f"plugins[{i}]: {exc}") from None
        resolved.append(plugin)
    return tuple(resolved)


def _parse_detectors(
    raw: Mapping[str, Any], overridden: Collection[str] = ()
) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]], tuple[str, ...]]:
    """({detector: resolved parameters}, {detector: parameters as given}) of the detectors evaluated, and the
    detectors whose parameters do not apply because the selection leaves them out; `overridden` names the
    detectors whose parameters were given on the command line (an error when not selected, as in `evaluate`)."""
    from .. import detectors as registry
    from ..core.errors import DetectorError

    table = validate(_Detectors, raw, "detectors")
    available = registry.available()
    include = table.include
    if include == "all":
        names = list(available)
    elif isinstance(include, str) and include.strip():
        from ..evaluation.spec import select_detectors

        try:  # a selection: "all,-she,-openmax"
            names = select_detectors(include, option="detectors.include")
        except DetectorError as exc:
            raise ConfigError(str(exc)) from None
    elif not isinstance(include, list) or not all(isinstance(n, str) and n for n in include):
        raise ConfigError(
            f'detectors.include: expected "all", a selection such as "all,-she" or a list of detector names; '
            f"got {include!r}"
        )
    else:
        names = list(include)
    for field_name, listed in (("include", names), ("exclude", table.exclude)):
        for i, name in enumerate(listed):
            if name not in available:
                raise ConfigError(
                    f"detectors.{field_name}[{i}]: unknown detector {name!r}{suggest(name, available)} "
                    f"(registered: {', '.join(available)})"
                )
    if len(set(names)) != len(names):
        raise ConfigError(f"detectors.include: lists a detector twice: {names}")
    chosen = [n for n in names if n not in table.exclude]
    unused: list[str] = []
    for name, params in table.params.items():
        key = f"detectors.params.{name}"
        if name not in available:
            raise ConfigError(f"{key}: unknown detector {name!r}{suggest(name, available)}")
        if name not in chosen and name in overridden:
            raise ConfigError(f"{key}: parameters for {name!r}, which {_selection(table)} leaves out")
        unknown_param = unknown_parameter(name, params, registry.get_class(name).param_names())
        if unknown_param is not None:
            raise ConfigError(f"{key}.{unknown_param[0]}: {unknown_param[1]}")
        if name not in chosen:
            # A file's parameters are how a detector runs when it runs: a narrower selection (-d, or an edited
            # include) just leaves them unused, without deleting settings the next selection may need.
            unused.append(name)
    resolved: dict[str, dict[str, Any]] = {}
    for name in chosen:
        try:
            detector = registry.create(name, **table.params.get(name, {}))
        except DetectorError as exc:
            raise ConfigError(f"detectors.params.{name}: {exc}") from None
        # The resolved parameters (defaults filled in) are what the unit keys hash, so a changed default recomputes.
        resolved[name] = json.loads(json.dumps(detector.get_params(), default=str))
    if not resolved:
        raise ConfigError("detectors: no detector left to evaluate (include/exclude remove them all)")
    return resolved, {name: dict(table.params.get(name, {})) for name in chosen}, tuple(unused)


def _selection(table: _Detectors) -> str:
    """The detector selection as written (e.g. ``detectors.include = "msp"``), for an error message."""
    text = f"the selection detectors.include = {json.dumps(table.include)}"
    return text + (f", exclude = {json.dumps(table.exclude)}" if table.exclude else "")


def _overridden_params(raw: Mapping[str, Any], overrides: Sequence[str]) -> set[str]:
    """The detectors whose parameters `overrides` set (``detectors.params.knn.k=5``, or the whole table)."""
    names: set[str] = set()
    detectors = raw.get("detectors")
    params = detectors.get("params") if isinstance(detectors, Mapping) else None
    for item in overrides:
        parts = re.sub(r"\[(\d+)\]", r".\1", item.partition("=")[0].strip()).split(".")
        if parts[:2] == ["detectors", "params"] and len(parts) > 2:
            names.add(parts[2])
        elif parts in (["detectors"], ["detectors", "params"]) and isinstance(params, Mapping):
            names.update(params)
    return names


# ----------------------------------------------------------------------------------------------- zero-shot
_VOCAB_TABLES: dict[str, type[Table]] = {"wordnet": _WordnetVocabulary, "union": _UnionVocabulary}


def _parse_vocabulary(name: str, entry: Mapping[str, Any], variables: Mapping[str, str]) -> dict[str, Any]:
    key = f"zeroshot.vocabularies.{name}"
    check_name(name, key, error=ConfigError, allow_at=False)
    data = _expand_tree(as_mapping(entry, key), variables, key)
    if "ref" in data and "build" in data:
        raise ConfigError(f"{key}: give either ref (a stored vocabulary) or build (made by the runner), not both")
    if "ref" in data:
        return validate(_RefVocabulary, data, key).model_dump(exclude_none=True)
    build = data.get("build")
    if build is None:
        raise ConfigError(f'{key}: missing ref = "NAME[@vN]" (a stored vocabulary) or build = "wordnet"|"union"')
    if build not in _VOCAB_TABLES:
        raise ConfigError(
            f"{key}.build: the runner builds 'wordnet' (NegMining) and 'union' vocabularies; got {build!r}. "
            "Build LLM siblings, EOE and oracle lists with `oodbench zeroshot vocab` and give ref = NAME"
        )
    return validate(_VOCAB_TABLES[build], data, key).model_dump()


def _parse_zeroshot(
    raw: Mapping[str, Any] | None, models: Mapping[str, ModelSpec], variables: Mapping[str, str]
) -> ZeroShotSpec | None:
    if raw is None:
        return None
    from ..zeroshot.scores import SCORES

    table = validate(_ZeroShot, raw, "zeroshot")
    model_ids = (
        list(table.models) if table.models is not None else [m.id for m in models.values() if not m.is_classifier]
    )
    for i, model_id in enumerate(model_ids):
        if model_id not in models:
            raise ConfigError(f"zeroshot.models[{i}]: no model with id {model_id!r}{suggest(model_id, models)}")
        if models[model_id].is_classifier:
            raise ConfigError(f"zeroshot.models[{i}]: {model_id!r} is a {models[model_id].kind} classifier, not a VLM")
    if not model_ids:
        raise ConfigError("zeroshot.models: no VLM to score (declare an open_clip model under [[models]])")
    scores = list(table.scores)
    if not scores:
        raise ConfigError('zeroshot.scores: missing; list the zero-shot scores, e.g. ["mcm", "neglabel"]')
    for i, name in enumerate(scores):
        if name not in SCORES:
            raise ConfigError(
                f"zeroshot.scores[{i}]: unknown zero-shot score {name!r}{suggest(name, SCORES)} "
                f"(known: {', '.join(SCORES)})"
            )
    for name, given in table.params.items():
        key = f"zeroshot.params.{name}"
        if name not in scores:
            raise ConfigError(f"{key}: parameters for {name!r}, which is not in zeroshot.scores")
        unknown_param = unknown_parameter(name, given, list(SCORES[name].defaults))
        if unknown_param is not None:
            raise ConfigError(f"{key}.{unknown_param[0]}: {unknown_param[1]}")
    vocabularies = {name: _parse_vocabulary(name, entry, variables) for name, entry in table.vocabularies.items()}
    for name, vocab in vocabularies.items():
        for i, part in enumerate(vocab.get("of", [])):
            if part not in vocabularies or part == name:
                raise ConfigError(
                    f"zeroshot.vocabularies.{name}.of[{i}]: no other vocabulary {part!r}{suggest(part, vocabularies)}"
                )
    return ZeroShotSpec(
        models=tuple(model_ids),
        scores=tuple(scores),
        params={name: dict(given) for name, given in table.params.items()},
        classes=_expand(table.classes, variables, "zeroshot.classes"),
        templates=table.templates,
        vocab_store=_expand(table.vocab_store, variables, "zeroshot.vocab_store") if table.vocab_store else None,
        vocabularies=vocabularies,
        sweep_k=tuple(table.sweep_k),
        sweep_m=tuple(table.sweep_m),
    )


# ----------------------------------------------------------------------------------------------- analysis
def _parse_analysis(raw: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    analyses = validate(_Analysis, raw, "analysis").model_dump(exclude_none=True)
    if "subsample" in analyses:
        n = analyses["subsample"]["n"]
        for i, value in enumerate(n if isinstance(n, list) else [n]):
            if not (value == "auto" or (isinstance(value, int) and not isinstance(value, bool) and value >= 1)):
                where = f"analysis.subsample.n[{i}]" if isinstance(n, list) else "analysis.subsample.n"
                raise ConfigError(f'{where}: expected "auto" or a positive integer; got {value!r}')
    return analyses


# ----------------------------------------------------------------------------------------------- top level
def _parse_models(
    entries: Sequence[Mapping[str, Any]], variables: Mapping[str, str], seed: int, kinds: KindRegistry
) -> tuple[dict[str, ModelSpec], tuple[tuple[ModelSpec, str], ...]]:
    """(the models that run, by id; the declared models skipped with why): ids and display names unique."""
    if not entries:
        raise ConfigError("models: empty; declare at least one [[models]] entry")
    models: dict[str, ModelSpec] = {}
    for i, entry in enumerate(entries):
        spec = _parse_model(entry, f"models[{i}]", variables, seed, kinds)
        if spec.id in models:
            raise ConfigError(f"models[{i}].id: {spec.id!r} is already used by {models[spec.id].key_path}")
        shown = {m.display_name: m for m in models.values()}
        if spec.display_name in shown:
            raise ConfigError(
                f"models[{i}].display: {spec.display_name!r} is already the name of {shown[spec.display_name].key_path}"
            )
        models[spec.id] = spec
    # A model whose weights need a file that is not given is skipped, never run on other weights under its name.
    skipped = tuple((m, reason) for m in models.values() if (reason := m.kind_of.unavailable(m)) is not None)
    models = {k: m for k, m in models.items() if m.kind_of.unavailable(m) is None}
    if not models:
        raise ConfigError(f"models: every model is skipped ({skipped[0][0].key_path}: {skipped[0][1]})")
    return models, skipped


def _parse_splits(top: _File, datasets: Mapping[str, DatasetSpec]) -> tuple[_Id, list[str], list[tuple[str, str]]]:
    """(the ID table, the OOD ids, (config key, id) of every dataset evaluated): each declared, none twice."""
    id_table = validate(_Id, top.id, "id")
    ood = list(validate(_Ood, top.ood, "ood").datasets)
    if not ood:
        raise ConfigError("ood.datasets: missing or empty; list the OOD dataset ids")
    used = [
        ("id.fit", id_table.fit),
        ("id.test", id_table.test),
        *[(f"id.csid[{i}]", n) for i, n in enumerate(id_table.csid)],
        *[(f"ood.datasets[{i}]", n) for i, n in enumerate(ood)],
    ]
    for key, name_ in used:
        if name_ not in datasets:
            raise ConfigError(f"{key}: no dataset {name_!r} under [datasets]{suggest(name_, datasets)}")
    names = [n for _, n in used]
    if len(set(names)) != len(names):
        duplicates = sorted({n for n in names if names.count(n) > 1})
        raise ConfigError(
            f"ood.datasets: {', '.join(duplicates)} used twice (ID fit, ID test, covariate-shifted ID and OOD sets "
            "must differ)"
        )
    return id_table, ood, used


def _parse_datasets(
    top: _File, variables: Mapping[str, str], models: Mapping[str, ModelSpec], store: Path, kinds: KindRegistry
) -> tuple[dict[str, DatasetSpec], _Id, list[str]]:
    """(the datasets by id, the ID table, the OOD ids), each checked by its kind against the others and the models."""
    if not top.datasets:
        raise ConfigError("datasets: missing; declare each dataset under [datasets.<id>]")
    datasets = {name_: _parse_dataset(name_, entry, variables, kinds) for name_, entry in top.datasets.items()}
    for spec in datasets.values():
        if spec.parent is not None:
            spec.kind_of.check(spec, datasets, models, [])
    id_table, ood, used = _parse_splits(top, datasets)
    for spec in datasets.values():
        if spec.parent is None:
            spec.kind_of.check(spec, datasets, models, used)
    for model in models.values():
        model.kind_of.check(model, datasets, used, store)
    return datasets, id_table, ood


def parse_config(
    raw: Mapping[str, Any],
    *,
    path: Path | None = None,
    workdir: str | os.PathLike[str] | None = None,
    kinds: KindRegistry | None = None,
    overridden_params: Collection[str] = (),
) -> ExperimentConfig:
    """Validate a parsed TOML document; `workdir` overrides ``experiment.workdir``; `kinds` defaults to `KINDS`;
    `overridden_params` names the detectors whose parameters come from the command line (`load_config`)."""
    kinds = KINDS if kinds is None else kinds
    top = validate(_File, raw, "")
    variables = _path_variables(top.paths)
    experiment = validate(_Experiment, _expand_tree(top.experiment, variables, "experiment"), "experiment")
    name = experiment.name or (path.stem if path else "experiment")
    chosen_workdir = Path(workdir) if workdir is not None else Path(experiment.workdir or f"oodbench-{name}")
    store = Path(experiment.store or str(chosen_workdir / "store"))
    models, skipped = _parse_models(top.models, variables, experiment.seed, kinds)
    datasets, id_table, ood = _parse_datasets(top, variables, models, store, kinds)
    plugins = _load_plugins(top.plugins, path)
    detectors, given, unused_params = _parse_detectors(top.detectors, overridden_params)
    detector_table = validate(_Detectors, top.detectors, "detectors")
    evaluation = _parse_evaluation(top, variables, given, id_table, ood, experiment.tpr, detector_table.gram_dtype)
    zeroshot = _parse_zeroshot(top.zeroshot, models, variables)
    if any(not m.is_classifier for m in models.values()) and zeroshot is None:
        vlm = next(m for m in models.values() if not m.is_classifier)
        raise ConfigError(f"{vlm.key_path}: {vlm.kind} models are scored zero-shot; add a [zeroshot] table")
    return ExperimentConfig(
        path=path,
        name=name,
        workdir=chosen_workdir,
        store=store,
        seed=experiment.seed,
        tpr=experiment.tpr,
        models=models,
        datasets=datasets,
        fit=id_table.fit,
        id_test=id_table.test,
        ood=tuple(ood),
        detectors=detectors,
        zeroshot=zeroshot,
        analysis=_parse_analysis(top.analysis),
        report=validate(_Report, top.report, "report").model_dump(),
        engine=validate(_Engine, top.engine, "engine").model_dump(),
        plugins=plugins,
        save_detectors=detector_table.save,
        gram_dtype=detector_table.gram_dtype,
        raw=dict(raw),
        skipped_models=skipped,
        unused_params=unused_params,
        evaluation=evaluation,
    )


def _parse_evaluation(
    top: _File,
    variables: Mapping[str, str],
    given: Mapping[str, Mapping[str, Any]],
    id_table: _Id,
    ood: Sequence[str],
    tpr: float,
    gram_dtype: str,
) -> EvaluationSpec:
    """The classifiers' `EvaluationSpec`: the [evaluation] table's options over the file's datasets and detectors."""
    from ..core.errors import OodbenchError

    table = validate(_Evaluation, _expand_tree(top.evaluation, variables, "evaluation"), "evaluation")
    try:
        return EvaluationSpec.build(
            dict(given),
            fit=id_table.fit,
            id=id_table.test,
            ood=ood,
            csid=id_table.csid,
            tpr=tpr,
            convention=table.convention,
            aupr=table.aupr,
            groups=table.groups,
            small_fit_set=table.small_fit_set,
            gram_dtype=gram_dtype,
            strict=table.strict,
            verify=table.verify,
        )
    except OodbenchError as exc:
        raise ConfigError(f"evaluation: {exc}") from None


def load_config(
    path: str | os.PathLike[str],
    *,
    overrides: Sequence[str] = (),
    workdir: str | os.PathLike[str] | None = None,
    kinds: KindRegistry | None = None,
    plugins: Sequence[str] = (),
) -> ExperimentConfig:
    """Read, override and validate an experiment file (kinds looked up in `kinds`, default `registry.KINDS`);
    `plugins` are detector plugins imported besides the file's own (``oodbench run --plugin``)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such experiment file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read: {exc}") from None
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    except RecursionError:  # tomllib recurses once per nesting level: a 5,000-deep array exhausts the stack
        raise ConfigError(f"{path}: not valid TOML: arrays or tables nested too deeply") from None
    raw = apply_overrides(raw, overrides)
    if plugins:
        listed = raw.get("plugins", [])
        raw["plugins"] = [*(listed if isinstance(listed, list) else [listed]), *plugins]
    overridden = _overridden_params(raw, overrides)
    return parse_config(raw, path=path, workdir=workdir, kinds=kinds, overridden_params=overridden)


def missing_roots(config: ExperimentConfig, dataset_ids: Iterable[str] | None = None) -> dict[str, str]:
    """{key: problem} for dataset roots and list files that do not exist (e.g. ``datasets.ninco.root``)."""
    problems: dict[str, str] = {}
    for name in dataset_ids if dataset_ids is not None else config.datasets:
        spec = config.datasets[name]
        problems.update(spec.kind_of.missing(spec))
    return problems
