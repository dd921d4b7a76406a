"""The built-in model kinds of the experiment file: ``demo-digits``, ``timm``, ``probe`` and ``open_clip``.

Names are checked against the timm and open_clip registries (no weights are touched), so a typo fails at
``oodbench run --dry-run`` with the closest names, not hours into a run.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..core.errors import ConfigError, ExtractError
from ..core.names import check_name
from .kinds import DatasetSpec, ModelKind, ModelSpec, RunContext, register_model_kind
from .schema import PositiveInt, Seed, StrList, Table, suggest

if TYPE_CHECKING:
    from ..core.store import Store

__all__ = ["DemoDigits", "Timm", "Probe", "OpenClip", "register_open_clip_config"]


def _checkpoint(value: str | None) -> dict[str, Any]:
    return {"checkpoint": str(Path(value).expanduser())} if value else {}


def _batch_size(value: int | None) -> dict[str, Any]:
    return {"batch_size": value} if value is not None else {}


# ----------------------------------------------------------------------------------------------- demo-digits
@register_model_kind
class DemoDigits(ModelKind):
    """The demo's small CNN on scikit-learn's digits: its "extraction" trains it and fills its store."""

    name = "demo-digits"
    fills_store = True

    class Table(Table):
        id: str = "digits-cnn"
        kind: str
        epochs: PositiveInt = 40
        seed: Seed | None = None

    def parse(self, table: Any, key: str, *, seed: int) -> tuple[str, dict[str, Any]]:
        if table.id != "digits-cnn":
            raise ConfigError(f"{key}.id: the demo model is stored as 'digits-cnn'; got {table.id!r}")
        return table.id, {"epochs": table.epochs, "seed": table.seed if table.seed is not None else seed}

    def check(
        self, spec: ModelSpec, datasets: Mapping[str, DatasetSpec], used: list[tuple[str, str]], store: Path
    ) -> None:
        for key, name in used:
            if datasets[name].kind != "demo":
                raise ConfigError(
                    f"{key}: the demo-digits model sees only its own digits; {name!r} is a {datasets[name].kind} dataset"
                )
        if store.name != "store":
            raise ConfigError(f"experiment.store: the demo writes its store to <dir>/store; got {store}")

    def adoptable(self, spec: ModelSpec, store: Store, meta: Mapping[str, Any]) -> bool:
        if not store.has_head(spec.id):
            return False
        recorded = store.head_meta(spec.id).get("provenance", {})
        return recorded.get("seed") == spec.params["seed"] and recorded.get("epochs") == spec.params["epochs"]

    def extract(self, ctx: RunContext, spec: ModelSpec, dataset: DatasetSpec) -> None:
        from ..demo import prepare

        prepare(Path(ctx.config.store).parent, spec.params["seed"], epochs=spec.params["epochs"], verbose=ctx.progress)


# ----------------------------------------------------------------------------------------------- timm
@functools.lru_cache(maxsize=1)
def _timm_pretrained() -> frozenset[str]:
    import timm

    return frozenset(timm.list_pretrained())


def _check_timm_name(name: str, key: str, *, with_checkpoint: bool) -> None:
    """The name must be a timm architecture and, unless weights come from a local file, a pretrained tag timm knows."""
    import timm
    from timm.models import split_model_name_tag

    arch, tag = split_model_name_tag(name)
    if not timm.is_model(arch):
        raise ConfigError(f"{key}: timm does not know the model {name!r}{suggest(arch, timm.list_models())}")
    if tag and not with_checkpoint:
        pretrained = _timm_pretrained()
        if name not in pretrained:
            tags = sorted(p for p in pretrained if p.startswith(arch + "."))
            raise ConfigError(
                f"{key}: timm has no pretrained weights {name!r}; tags for {arch}: {', '.join(tags) or 'none'}"
            )
    if not tag and not with_checkpoint and not any(p.startswith(arch + ".") for p in _timm_pretrained()):
        raise ConfigError(f"{key}: timm has no pretrained weights for {arch!r}; give a checkpoint = PATH")


def _default_tag_note(name: str) -> str:
    """For an untagged timm name, which pretrained tag timm will load (it picks a default silently)."""
    import timm
    from timm.models import split_model_name_tag

    if split_model_name_tag(name)[1]:
        return ""
    cfg = timm.models.get_pretrained_cfg(name)
    return f" (no tag: timm loads its default {name}.{cfg.tag})" if cfg is not None and cfg.tag else " (no tag)"


def _check_nac_layers(layers: list[str], key: str) -> list[str]:
    """NAC layer specs (LAYER[:ALPHA[:POOLING]]), checked by the extractor's parser."""
    from ..extract.nac import NacLayer

    for i, spec in enumerate(layers):
        try:
            NacLayer.parse(spec)
        except (ExtractError, ValueError) as exc:
            raise ConfigError(f"{key}[{i}]: {exc}") from None
    return layers


def _check_network(specs: list[str], key: str) -> list[str]:
    """Network-time detector specs (METHOD[:KEY=VALUE,...]), checked by the extractor's parser; they enter the
    model's identity, hence the extraction key: each setting of a sweep is its own cached extraction."""
    from ..extract.posthoc_net import parse_specs

    try:
        parse_specs(specs)
    except (ExtractError, ValueError) as exc:
        raise ConfigError(f"{key}: {exc}") from None
    return specs


def _load_timm(name: str, params: Mapping[str, Any]) -> Any:
    from ..extract.backbones.timm_backbone import load_timm

    kwargs: dict[str, Any] = {
        "checkpoint": params.get("checkpoint"),
        "preprocessing": params.get("preprocessing"),
        "convert": params.get("convert", "auto"),
    }
    if params.get("nac_layers"):
        from ..extract.nac import NacLayer

        kwargs["nac_layers"] = [NacLayer.parse(spec) for spec in params["nac_layers"]]
    if params.get("network"):
        kwargs["network"] = list(params["network"])
    return load_timm(name, pretrained=not params.get("checkpoint"), **kwargs)


@functools.lru_cache(maxsize=256)
def _timm_shape(name: str, input_size: tuple[int, ...] | None) -> tuple[int, tuple[int, int, int]] | None:
    """(parameters, input size) of a timm architecture, built on the meta device (no weights, no memory)."""
    import timm
    import torch

    from ..extract.passes import count_parameters

    kwargs: dict[str, Any] = {}
    if input_size is not None and input_size[1] == input_size[2]:
        kwargs["img_size"] = input_size[1]
    try:
        with torch.device("meta"):
            try:
                model = timm.create_model(name, pretrained=False, **kwargs)
            except TypeError:
                model = timm.create_model(name, pretrained=False)
    except Exception:  # an architecture this timm cannot build: size unknown, the model runs alone
        return None
    size = input_size or tuple(model.pretrained_cfg.get("input_size", (3, 224, 224)))
    return count_parameters(model), (int(size[0]), int(size[1]), int(size[2]))


def _timm_footprint(name: str, params: Mapping[str, Any]) -> Any:
    from ..extract.passes import Footprint

    size = (params.get("preprocessing") or {}).get("input_size")
    shape = _timm_shape(name, tuple(size) if size else None)
    if shape is None:
        return None
    # NAC's layer gradients and ODIN's input gradient keep the activations for a backward pass.
    gradients = bool(params.get("nac_layers")) or any(
        spec.split(":")[0] == "odin" for spec in params.get("network", ())
    )
    return Footprint(shape[0], shape[1], int(params.get("batch_size", 64)), gradients=gradients)


def _weights_options(table: Any, key: str) -> dict[str, Any]:
    """The `preprocessing` overrides and checkpoint `convert` of a timm-backed table, checked by the extractor."""
    from ..extract.backbones.base import check_preprocessing
    from ..extract.convert import CONVERTERS

    options: dict[str, Any] = {}
    if table.preprocessing:
        try:
            options["preprocessing"] = check_preprocessing(table.preprocessing)
        except ExtractError as exc:
            raise ConfigError(f"{key}.preprocessing: {exc}") from None
    if table.convert is not None:
        if table.convert not in CONVERTERS:
            raise ConfigError(f"{key}.convert: unknown converter {table.convert!r}; use one of {', '.join(CONVERTERS)}")
        if not table.checkpoint:
            raise ConfigError(f"{key}.convert: applies to a checkpoint file only")
        options["convert"] = table.convert
    return options


@register_model_kind
class Timm(ModelKind):
    """A timm classifier (pretrained weights by tag, or a local checkpoint)."""

    name = "timm"

    class Table(Table):
        id: str | None = None
        kind: str
        name: str
        checkpoint: str | None = None
        checkpoint_required: str | None = None  # why the named weights need a file: skipped until checkpoint is set
        convert: str | None = None
        preprocessing: dict[str, Any] = {}
        batch_size: PositiveInt | None = None
        nac_layers: StrList = []
        network: StrList = []

    def parse(self, table: Any, key: str, *, seed: int) -> tuple[str, dict[str, Any]]:
        _check_timm_name(table.name, f"{key}.name", with_checkpoint=bool(table.checkpoint))
        params = {**_checkpoint(table.checkpoint), **_batch_size(table.batch_size), "name": table.name}
        if table.checkpoint_required is not None and not table.checkpoint:
            # Never the hub's weights under this name: the model is skipped (`unavailable`) until a file is given.
            params["needs_checkpoint"] = table.checkpoint_required.strip() or "its weights are not in timm"
        params.update(_weights_options(table, key))
        if table.nac_layers:
            params["nac_layers"] = _check_nac_layers(list(table.nac_layers), f"{key}.nac_layers")
        if table.network:
            params["network"] = _check_network(list(table.network), f"{key}.network")
        return table.id or table.name, params

    def weights(self, spec: ModelSpec) -> str:
        name = spec.params["name"]
        if "needs_checkpoint" in spec.params:
            return f"timm {name}: needs checkpoint = PATH ({spec.params['needs_checkpoint']})"
        if "checkpoint" in spec.params:
            return f"timm {name} + {spec.params['checkpoint']}"
        return f"timm {name}" + _default_tag_note(name)

    def backbone(self, spec: ModelSpec, device: str) -> Any:
        return _load_timm(spec.params["name"], spec.params)

    def footprint(self, spec: ModelSpec) -> Any:
        return _timm_footprint(spec.params["name"], spec.params)


# ----------------------------------------------------------------------------------------------- probe
def _check_probe(params: Mapping[str, Any], key: str) -> dict[str, Any]:
    """Linear-probe hyper-parameters, checked against the extractor's ProbeConfig."""
    from dataclasses import fields

    from ..extract.probe import ProbeConfig

    allowed = [f.name for f in fields(ProbeConfig)]
    for name in params:
        if name not in allowed:
            raise ConfigError(
                f"{key}.{name}: unknown probe parameter{suggest(name, allowed)} (parameters: {', '.join(allowed)})"
            )
    try:
        ProbeConfig(**params)
    except (ExtractError, TypeError) as exc:
        raise ConfigError(f"{key}: {exc}") from None
    return dict(params)


@register_model_kind
class Probe(ModelKind):
    """A linear probe trained on a frozen timm backbone's features (the backbone is extracted once, shared)."""

    name = "probe"
    trains_head = True

    class Table(Table):
        id: str | None = None
        kind: str
        backbone: str
        backbone_id: str | None = None
        checkpoint: str | None = None
        convert: str | None = None
        preprocessing: dict[str, Any] = {}
        batch_size: PositiveInt | None = None
        probe: dict[str, Any] = {}

    def parse(self, table: Any, key: str, *, seed: int) -> tuple[str, dict[str, Any]]:
        _check_timm_name(table.backbone, f"{key}.backbone", with_checkpoint=bool(table.checkpoint))
        params = {
            **_checkpoint(table.checkpoint),
            **_batch_size(table.batch_size),
            "backbone": table.backbone,
            "backbone_id": check_name(table.backbone_id or table.backbone, f"{key}.backbone_id", error=ConfigError),
            "probe": _check_probe(table.probe, f"{key}.probe"),
            **_weights_options(table, key),
        }
        return table.id or f"{table.backbone}+probe", params

    def weights(self, spec: ModelSpec) -> str:
        return f"timm {spec.params['backbone']} (frozen) + linear probe"

    def store_id(self, spec: ModelSpec) -> str:
        return spec.params["backbone_id"]

    def extract_identity(self, spec: ModelSpec) -> dict[str, Any]:
        identity = {k: v for k, v in self.identity(spec).items() if k not in ("id", "probe")}
        identity["kind"] = "timm-backbone"
        return identity

    def adoptable(self, spec: ModelSpec, store: Store, meta: Mapping[str, Any]) -> bool:
        provenance = meta.get("provenance", {})
        return provenance.get("model") == spec.params["backbone"] and not spec.params.get("checkpoint")

    def backbone(self, spec: ModelSpec, device: str) -> Any:
        return _load_timm(spec.params["backbone"], spec.params)

    def footprint(self, spec: ModelSpec) -> Any:
        return _timm_footprint(spec.params["backbone"], spec.params)

    def train_head(self, ctx: RunContext, spec: ModelSpec, stale: bool) -> dict[str, Any]:
        from ..extract.probe import ProbeConfig, run_probe

        config, store = ctx.config, ctx.store
        datasets = config.datasets_of(spec)
        if stale:
            for dataset in datasets:
                store.delete(spec.id, dataset)
            store.delete_head(spec.id)
        run_probe(
            store,
            spec.store_id,
            config.fit,
            apply_to=[d for d in datasets if d != config.fit],
            probe_id=spec.id,
            config=ProbeConfig(**spec.params.get("probe", {})),
            device="cpu" if ctx.device == "auto" else ctx.device,
        )
        return {"head": store.head_meta(spec.id).get("provenance", {}).get("checkpoint")}


# ----------------------------------------------------------------------------------------------- open_clip
@functools.lru_cache(maxsize=1)
def _open_clip_registry() -> tuple[frozenset[str], dict[str, tuple[str, ...]]]:
    """open_clip's model configs and pretrained tags per model (no weights are touched)."""
    import open_clip

    tags: dict[str, list[str]] = {}
    for model, tag in open_clip.list_pretrained():
        tags.setdefault(model, []).append(tag)
    return frozenset(open_clip.list_models()), {k: tuple(v) for k, v in tags.items()}


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
        raise ConfigError(f"{key}.name: open_clip does not know the model {name!r}{suggest(name, models)}")
    if pretrained is not None:
        tags = all_tags.get(name, ())
        if pretrained not in tags:
            raise ConfigError(
                f"{key}.pretrained: open_clip has no weights {pretrained!r} for {name!r}; "
                f"available: {', '.join(tags) or 'none'}"
            )


def _check_open_clip_resolution(name: str, resolution: int, key: str) -> None:
    """The declared input resolution must be the architecture's (open_clip configs fix it)."""
    import open_clip

    size = (open_clip.get_model_config(name) or {}).get("vision_cfg", {}).get("image_size")
    size = size[0] if isinstance(size, (list, tuple)) else size
    if size is not None and int(size) != resolution:
        raise ConfigError(f"{key}: {name} takes {size} px images, not {resolution}")


@functools.lru_cache(maxsize=64)
def _open_clip_shape(name: str) -> tuple[int, tuple[int, int, int]] | None:
    """(parameters of the whole model, which extraction loads, input size) of an open_clip architecture, on meta."""
    import logging

    import open_clip
    import torch

    from ..extract.passes import count_parameters

    size = (open_clip.get_model_config(name) or {}).get("vision_cfg", {}).get("image_size", 224)
    h, w = (size, size) if isinstance(size, int) else size
    root = logging.getLogger()
    was = root.disabled
    root.disabled = True  # open_clip logs "no pretrained weights loaded" on the root logger
    try:
        with torch.device("meta"):
            model = open_clip.create_model(name, pretrained=None, device="meta")
    except Exception:
        return None
    finally:
        root.disabled = was
    return count_parameters(model), (3, int(h), int(w))


@register_model_kind
class OpenClip(ModelKind):
    """An open_clip VLM, scored zero-shot (image embeddings, optionally patch embeddings)."""

    name = "open_clip"
    classifier = False

    class Table(Table):
        id: str | None = None
        kind: str
        name: str
        pretrained: str | None = None
        checkpoint: str | None = None
        config_file: str | None = None
        batch_size: PositiveInt | None = None
        patches: bool = False
        resolution: PositiveInt | None = None  # checked against the architecture's input size; not a setting

    def parse(self, table: Any, key: str, *, seed: int) -> tuple[str, dict[str, Any]]:
        params = {**_checkpoint(table.checkpoint), **_batch_size(table.batch_size)}
        if table.config_file:
            params["config_file"] = register_open_clip_config(table.config_file, table.name, f"{key}.config_file")
        if table.pretrained is None and not table.checkpoint:
            raise ConfigError(
                f"{key}.pretrained: missing; name the open_clip weights (e.g. 'openai') or give a checkpoint"
            )
        _check_open_clip(table.name, table.pretrained, key)
        if table.resolution is not None:
            _check_open_clip_resolution(table.name, table.resolution, f"{key}.resolution")
        if table.patches and not table.config_file:
            from ..extract.patches import open_clip_config_route

            route, reason = open_clip_config_route(table.name)
            if route is None:
                raise ConfigError(f"{key}.patches: {reason}; GL-MCM needs patch embeddings (set patches = false)")
        params.update(name=table.name, pretrained=table.pretrained, patches=table.patches)
        # The default id is the one `oodbench extract` gives.
        return table.id or (f"{table.name}@{table.pretrained}" if table.pretrained else table.name), params

    def weights(self, spec: ModelSpec) -> str:
        import open_clip

        tag = spec.params.get("checkpoint") or spec.params.get("pretrained")
        size = (open_clip.get_model_config(spec.params["name"]) or {}).get("vision_cfg", {}).get("image_size")
        return f"open_clip {spec.params['name']} / {tag}" + (f", {size} px" if size else "")

    def patch_route(self, spec: ModelSpec) -> tuple[str | None, str]:
        if not spec.params.get("patches"):
            return None, "patches = false"
        from ..extract.patches import open_clip_config_route

        return open_clip_config_route(spec.params["name"])

    def text_model(self, ctx: RunContext, spec: ModelSpec) -> Callable[[], Any]:
        from ..extract.backbones.base import resolve_device
        from ..extract.label_embedder import bundle_loader

        pretrained = spec.params.get("checkpoint") or spec.params.get("pretrained")
        device = str(resolve_device(ctx.device))
        return bundle_loader(ctx.store, spec.store_id, ctx.config.id_test, pretrained=pretrained, device=device)

    def footprint(self, spec: ModelSpec) -> Any:
        from ..extract.passes import Footprint

        shape = _open_clip_shape(spec.params["name"])
        return None if shape is None else Footprint(shape[0], shape[1], int(spec.params.get("batch_size", 64)))

    def backbone(self, spec: ModelSpec, device: str) -> Any:
        from ..extract.backbones.base import resolve_device
        from ..extract.openclip import OpenClipBackbone, load_openclip

        params = spec.params
        if params.get("config_file"):  # a Ray worker has not seen the driver's registration
            register_open_clip_config(params["config_file"], params["name"], f"{spec.key_path}.config_file")
        bundle = load_openclip(
            params["name"], params.get("checkpoint") or params.get("pretrained"), resolve_device(device)
        )
        return OpenClipBackbone(bundle, patches=params.get("patches", False))
