"""The ``hf_clip`` model kind: a CLIP-like image/text model from Hugging Face ``transformers``, scored zero-shot.

Same store contract as ``open_clip`` (ℓ2 image embeddings, template-averaged label embeddings); weights come
from the Hugging Face cache or a ``save_pretrained`` directory (see `oodbench.extract.hf_clip`). Offline, a hub
id can only be checked for its form and for being in the local cache; the plan says which.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError, ExtractError
from .kinds import ModelKind, ModelSpec, register_model_kind
from .schema import PositiveInt, Table

if TYPE_CHECKING:
    from .stages import Context

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

        return HfClipBackbone(load_hf_clip(spec.params["name"], resolve_device(device)))

    def text_model(self, ctx: Context, spec: ModelSpec) -> Callable[[], Any]:
        from ..extract.backbones.base import resolve_device
        from ..extract.hf_clip import load_hf_clip

        device = resolve_device(ctx.device)
        return lambda: load_hf_clip(spec.params["name"], device)


def _config_image_size(name: str, where: str) -> int | None:
    """The vision tower's image size from a local or cached config.json (None when it cannot be read offline)."""
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
    config = json.loads(path.read_text(encoding="utf-8"))
    size = config.get("vision_config", {}).get("image_size", config.get("image_size"))
    return int(size) if isinstance(size, int) else None
