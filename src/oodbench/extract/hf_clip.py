"""CLIP-like image/text models from Hugging Face ``transformers`` (e.g. AIMv2-L LiT, CLIP, SigLIP checkpoints).

The store contract is the open_clip one (`oodbench.extract.openclip`): image entries hold ``features`` =
ℓ2-normalised image embeddings (N, D) float32; label embeddings average the ℓ2-normalised embeddings of every
template and renormalise, cached in the store per (model, labels, templates). Any model whose class offers
``get_image_features`` and ``get_text_features`` (``CLIPModel``, ``SiglipModel``, ``Aimv2Model``, …) loads
through ``AutoModel``/``AutoProcessor``; the image preprocessing is the checkpoint's own image processor.
AIMv2 towers also give value-branch patch embeddings for GL-MCM (``extra.patch_embeddings``, fp16; see
`oodbench.extract.patches`); other transformers towers give image embeddings only.

Needs the optional extra ``hf`` (``transformers``). Weights come from the Hugging Face cache (``$HF_HOME``) or a
local directory written by ``save_pretrained``; offline (``HF_HUB_OFFLINE=1``) nothing is downloaded.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..core.errors import ExtractError
from .backbones.base import resolve_device, safe_id
from .patches import VisionLanguageBackbone

__all__ = ["HfClipBundle", "HfClipBackbone", "load_hf_clip", "check_hf_id", "hf_cached"]

# A hub repository id: owner/name, letters, digits, '-', '_', '.' (what the hub accepts).
_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*\Z")


def check_hf_id(name: str) -> str:
    """'local' for an existing model directory, 'hub' for a well-formed hub id; ExtractError otherwise."""
    if Path(name).expanduser().is_dir():
        if not (Path(name).expanduser() / "config.json").is_file():
            raise ExtractError(f"{name} is a directory without config.json (not a save_pretrained model)")
        return "local"
    if _HUB_ID.match(name) and ".." not in name:
        return "hub"
    raise ExtractError(f"{name!r} is neither a Hugging Face hub id (owner/name) nor a local model directory")


def hf_cached(name: str) -> bool | None:
    """Whether the hub id's config is in the local Hugging Face cache (None when huggingface_hub is missing)."""
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return None
    found = try_to_load_from_cache(name, "config.json")
    return isinstance(found, str)


class _ImageTransform:
    """PIL image → (3, H, W) tensor with the checkpoint's image processor (picklable for loader workers)."""

    def __init__(self, image_processor: Any) -> None:
        self.image_processor = image_processor

    def __call__(self, image: Any) -> torch.Tensor:
        return self.image_processor(images=image, return_tensors="pt")["pixel_values"][0]


def _embedding(output: Any) -> torch.Tensor:
    """The projected embedding from get_*_features (a tensor, or an output object's pooler_output in transformers 5)."""
    if isinstance(output, torch.Tensor):
        return output
    pooled = getattr(output, "pooler_output", None)
    if pooled is None:
        raise ExtractError(f"get_*_features returned {type(output).__name__} without pooler_output")
    return pooled


@dataclass
class HfClipBundle:
    """A loaded transformers image/text model with its processor, names and device."""

    model: torch.nn.Module
    processor: Any
    model_name: str
    checkpoint: str
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))

    @property
    def transform(self) -> _ImageTransform:
        """Image preprocessing of the checkpoint."""
        return _ImageTransform(self.processor.image_processor)

    def preprocessing(self) -> dict[str, Any]:
        """The image processor's settings that shape the pixels (JSON-friendly)."""
        config = self.processor.image_processor.to_dict()
        keep = ("size", "crop_size", "do_center_crop", "do_resize", "image_mean", "image_std", "resample", "do_rescale")
        # As stored in meta.json (lists, sorted keys), so provenance compares equal after a round trip.
        return json.loads(json.dumps({key: config[key] for key in sorted(keep) if key in config}, default=str))

    def provenance(self) -> dict[str, Any]:
        """Model name, checkpoint, preprocessing and kind."""
        return {
            "model": self.model_name,
            "checkpoint": self.checkpoint,
            "preprocessing": self.preprocessing(),
            "kind": "hf_clip",
        }

    def default_model_id(self) -> str:
        """Store id: the hub id (owner-name) or the local directory's name."""
        path = Path(self.model_name).expanduser()
        return safe_id(path.name if path.is_dir() else self.model_name.replace("/", "-"))

    def encode_texts(self, texts: list[str]) -> torch.Tensor:
        """Text embeddings (N, D) of raw strings (not normalised)."""
        tokenizer = self.processor.tokenizer
        limit = getattr(getattr(self.model.config, "text_config", None), "max_position_embeddings", None)
        length = min(int(tokenizer.model_max_length), int(limit)) if limit else int(tokenizer.model_max_length)
        # Fixed-length padding: models such as SigLIP were trained on max-length padded text.
        tokens = tokenizer(texts, padding="max_length", max_length=length, truncation=True, return_tensors="pt")
        tokens = {key: value.to(self.device) for key, value in tokens.items()}
        return _embedding(self.model.get_text_features(**tokens))

    def encode_images(self, pixels: torch.Tensor) -> torch.Tensor:
        """Image embeddings (N, D) of preprocessed pixels (not normalised)."""
        return _embedding(self.model.get_image_features(pixel_values=pixels))


def load_hf_clip(
    name: str, device: str | torch.device = "cpu", *, pretrained: bool = True, seed: int = 0
) -> HfClipBundle:
    """Load a transformers CLIP-like model and its processor (hub id from the cache, or a local directory).

    `pretrained=False` keeps the architecture and processor but re-initialises the weights (seeded; tests only).
    """
    where = check_hf_id(name)
    try:
        from transformers import AutoModel, AutoProcessor
    except ImportError:
        raise ExtractError("the hf_clip kind needs transformers: pip install 'oodbench[hf]'") from None
    source = str(Path(name).expanduser()) if where == "local" else name
    from . import stand_ins

    if stand_ins.enabled() and where == "hub":  # OODBENCH_STAND_INS: a tiny random model of the class
        model, processor = stand_ins.hf_clip_model(name)
        dev = resolve_device(device)
        return HfClipBundle(model.to(dev).eval(), processor, name, stand_ins.checkpoint_of(model), dev)
    try:
        processor = AutoProcessor.from_pretrained(source)
        model = AutoModel.from_pretrained(source)
    except Exception as exc:
        offline = os.environ.get("HF_HUB_OFFLINE") == "1"
        raise ExtractError(
            f"cannot load {name} with transformers{' offline' if offline else ''} ({type(exc).__name__}: "
            f"{str(exc)[:300]}); download it once with network access into $HF_HOME, or pass a local directory"
        ) from exc
    for method in ("get_image_features", "get_text_features"):
        if not hasattr(model, method):
            raise ExtractError(f"{name} ({type(model).__name__}) has no {method}: not a CLIP-like image/text model")
    if not hasattr(processor, "image_processor") or not hasattr(processor, "tokenizer"):
        raise ExtractError(f"{name}'s processor ({type(processor).__name__}) lacks an image processor or a tokenizer")
    if pretrained:
        checkpoint = f"hf:{name}" if where == "hub" else f"hf-dir:{_directory_digest(Path(source))}"
    else:
        torch.manual_seed(seed)
        for module in model.modules():
            if hasattr(module, "reset_parameters"):
                module.reset_parameters()
        checkpoint = f"random-init:seed={seed}"
    dev = resolve_device(device)
    return HfClipBundle(model.to(dev).eval(), processor, name, checkpoint, dev)


def _directory_digest(path: Path) -> str:
    """SHA-256 over a model directory's weight files' names and sizes (cheap identity for provenance)."""
    digest = hashlib.sha256()
    for file in sorted(path.glob("*")):
        if file.is_file():
            digest.update(f"{file.name}:{file.stat().st_size}\n".encode())
    return digest.hexdigest()


class HfClipBackbone(VisionLanguageBackbone):
    """The image tower of a transformers CLIP-like model: ℓ2-normalised image embeddings (and AIMv2's patches)."""

    kind = "hf_clip"

    def __init__(self, bundle: HfClipBundle, *, patches: bool | None = None) -> None:
        super().__init__(bundle, transform=bundle.transform, patches=patches, encode=bundle.encode_images)
