"""The ``hf_clip`` model kind: a CLIP-like image/text model from Hugging Face ``transformers``, scored zero-shot.

Same store contract as ``open_clip`` (ℓ2 image embeddings, template-averaged label embeddings); weights come
from the Hugging Face cache or a ``save_pretrained`` directory (see `oodbench.extract.hf_clip`). Offline, a hub
id can only be checked for its form and for being in the local cache; the plan says which.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..core.errors import ConfigError, ExtractError
from .kinds import ModelKind, ModelSpec, RunContext, register_model_kind
from .schema import PositiveInt, Table

__all__ = ["HfClip"]


@register_model_kind
class HfClip(ModelKind):
    """A transformers image/text model (``get_image_features``/``get_text_features``), e.g. AIMv2-L LiT."""

    name = "hf_clip"
    classifier = False

    class Table(Table):
        id: str | None = None
        kind: str
        name: str  # hub id (owner/name) or a local save_pretrained directory
        batch_size: PositiveInt | None = None
        patches: bool = False  # value-branch patch embeddings for GL-MCM (AIMv2 towers)
        resolution: PositiveInt | None = None  # checked against a local or cached config; not a setting

    def parse(self, table: Any, key: str, *, seed: int) -> tuple[str, dict[str, Any]]:
        from ..extract.hf_clip import check_hf_id

        try:
            where = check_hf_id(table.name)
        except ExtractError as exc:
            raise ConfigError(f"{key}.name: {exc}") from None
        if table.resolution is not None:
            size = _config_image_size(table.name, where)
            if size is not None and size != table.resolution:
                raise ConfigError(f"{key}.resolution: {table.name} takes {size} px images, not {table.resolution}")
        params: dict[str, Any] = {"name": table.name}
        if table.batch_size is not None:
            params["batch_size"] = table.batch_size
        if table.patches:
            config = _config(table.name, where)
            if config is not None and _aimv2_route(config) is None:
                raise ConfigError(
                    f"{key}.patches: {table.name} is a {config.get('model_type')!r} model; value-branch patch "
                    "embeddings exist for AIMv2 towers with their attention-pooling head (set patches = false)"
                )
            params["patches"] = True
        return table.id or table.name.rstrip("/").replace("/", "-"), params

    def weights(self, spec: ModelSpec) -> str:
        from ..extract.hf_clip import check_hf_id, hf_cached

        name = spec.params["name"]
        if check_hf_id(name) == "local":
            return f"transformers {name} (local directory)"
        cached = hf_cached(name)
        state = "in the local Hugging Face cache" if cached else "not in the local cache: cannot be resolved offline"
        return f"transformers {name} (hub id; {state})"

    def backbone(self, spec: ModelSpec, device: str) -> Any:
        from ..extract.backbones.base import resolve_device
        from ..extract.hf_clip import HfClipBackbone, load_hf_clip

        bundle = load_hf_clip(spec.params["name"], resolve_device(device))
        return HfClipBackbone(bundle, patches=spec.params.get("patches", False))

    def patch_route(self, spec: ModelSpec) -> tuple[str | None, str]:
        from ..extract.hf_clip import check_hf_id
        from ..extract.patches import ROUTES

        if not spec.params.get("patches"):
            return None, "patches = false"
        config = _config(spec.params["name"], check_hf_id(spec.params["name"]))
        if config is None:  # not cached: the kind is checked when the weights load
            return "aimv2", ROUTES["aimv2"] + " (config not in the local cache: checked when the weights load)"
        return _aimv2_route(config), ROUTES["aimv2"]

    def text_model(self, ctx: RunContext, spec: ModelSpec) -> Callable[[], Any]:
        from ..extract.backbones.base import resolve_device
        from ..extract.hf_clip import load_hf_clip

        device = resolve_device(ctx.device)
        return lambda: load_hf_clip(spec.params["name"], device)


def _aimv2_route(config: dict[str, Any]) -> str | None:
    """'aimv2' when a config.json describes an AIMv2 model whose vision tower keeps its attention-pooling head."""
    vision = config.get("vision_config") or {}
    return "aimv2" if config.get("model_type") == "aimv2" and vision.get("use_head", True) else None


def _config(name: str, where: str) -> dict[str, Any] | None:
    """A local or cached config.json (None when it cannot be read offline)."""
    import json
    from pathlib import Path

    if where == "local":
        path: Path | None = Path(name).expanduser() / "config.json"
    else:
        try:
            from huggingface_hub import try_to_load_from_cache
        except ImportError:
            return None
        found = try_to_load_from_cache(name, "config.json")
        path = Path(found) if isinstance(found, str) else None
    if path is None or not path.is_file():
        return None
    return json.loads(path.read_text(encoding="utf-8"))


def _config_image_size(name: str, where: str) -> int | None:
    """The vision tower's image size from a local or cached config.json (None when it cannot be read offline)."""
    config = _config(name, where)
    if config is None:
        return None
    size = config.get("vision_config", {}).get("image_size", config.get("image_size"))
    return int(size) if isinstance(size, int) else None
