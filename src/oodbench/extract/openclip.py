"""open_clip vision-language models: image embeddings, value-branch patch embeddings, template-averaged text embeddings.

Image entries hold ``features`` = ℓ2-normalised image embeddings (N, D) float32 and, for towers with patch tokens,
``extra.patch_embeddings`` = (N, P, D) ℓ2-normalised patch embeddings in the joint space. **We store fp16 patch
embeddings** (not per-image local similarities), so GL-MCM can be scored against any label list later. They come
from a second pass through the last block with its attention output replaced by its value branch, for plain ViT
towers and timm trunks with an attention-pooling head alike (`oodbench.extract.patches`, which says per tower how
the local tokens reach the joint space). Text embeddings average the ℓ2-normalised embeddings of every template
(the Fi-ImageNet-1k paper's eight, `SEED_TEMPLATES`) per label and renormalise; they are cached in the store per
(model, label list, templates).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.nn.functional as F

from ..core.errors import ExtractError
from ..core.names import suggest
from ..core.store import Store
from ..text.templates import SEED_TEMPLATES
from ..util.atomic import sha256_file
from .backbones.base import autocast, resolve_device, safe_id
from .hub import cached_file, prefer_cache, require_reachable
from .patches import VisionLanguageBackbone, image_and_patch_embeddings, unsupported_reason, value_branch_block

if TYPE_CHECKING:
    from .hf_clip import HfClipBundle

__all__ = [
    "OpenClipBundle",
    "OpenClipBackbone",
    "TextEmbeddingsMissing",
    "load_openclip",
    "quickgelu_mismatch",
    "text_embeddings",
    "text_dataset_id",
    "cached_text_embeddings",
    "value_branch_block",
    "image_and_patch_embeddings",
    "supports_patches",
]

# Labels per shard of a cached text-embedding entry (see `cached_text_embeddings`).
TEXT_SHARD = 4096


class TextEmbeddingsMissing(ExtractError):
    """Text embeddings are not cached in the store and no model was given to compute them."""


@dataclass
class OpenClipBundle:
    """A loaded open_clip model with its image preprocessing, tokenizer and names."""

    model: torch.nn.Module
    preprocess: Callable[[Any], torch.Tensor]
    tokenizer: Callable[..., torch.Tensor]
    model_name: str
    pretrained: str | None
    checkpoint: str
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))

    @property
    def names(self) -> tuple[str, str | None]:
        """(model name, pretrained tag or path)."""
        return self.model_name, self.pretrained

    def preprocessing(self) -> dict[str, Any]:
        """The model's resolved image preprocessing configuration (JSON-friendly)."""
        from open_clip.model import get_model_preprocess_cfg

        cfg = get_model_preprocess_cfg(self.model)
        return {key: list(value) if isinstance(value, tuple) else value for key, value in sorted(cfg.items())}

    def provenance(self) -> dict[str, Any]:
        """Model name, checkpoint (tag or sha256), preprocessing and kind."""
        return {
            "model": self.model_name,
            "checkpoint": self.checkpoint,
            "preprocessing": self.preprocessing(),
            "kind": "open_clip",
        }

    def encode_texts(self, texts: list[str]) -> torch.Tensor:
        """Text embeddings (N, D) of raw strings (not normalised)."""
        return self.model.encode_text(self.tokenizer(texts).to(self.device))

    def default_model_id(self) -> str:
        """Store id: the model name plus the pretrained tag (or a short hash of a local checkpoint)."""
        base = safe_id(self.model_name)
        if self.checkpoint.startswith("sha256:"):
            return f"{base}@{self.checkpoint[7:19]}"
        if self.pretrained:
            return f"{base}@{safe_id(self.pretrained)}"
        return base


def quickgelu_mismatch(model_name: str, pretrained: str | None) -> str | None:
    """A warning text when the weights of tag `pretrained` were trained with a different GELU than the config uses."""
    import open_clip

    if not pretrained or os.path.isfile(str(pretrained)):
        return None
    tag_cfg = open_clip.get_pretrained_cfg(model_name, pretrained) or {}
    model_cfg = open_clip.get_model_config(model_name) or {}
    if not tag_cfg:
        return None
    tag_quick, model_quick = bool(tag_cfg.get("quick_gelu", False)), bool(model_cfg.get("quick_gelu", False))
    if tag_quick == model_quick:
        return None
    fix = f"{model_name}-quickgelu" if tag_quick else model_name.replace("-quickgelu", "")
    return (
        f"QuickGELU mismatch: weights '{pretrained}' were trained with "
        f"{'QuickGELU' if tag_quick else 'GELU'} but config '{model_name}' uses {'QuickGELU' if model_quick else 'GELU'}; "
        f"embeddings will be degraded. Use --model {fix} --pretrained {pretrained}"
    )


# Files open_clip reads from a hub repo.
_HUB_FILES = ("open_clip_model.safetensors", "open_clip_pytorch_model.bin")


def _weights_cached(model_name: str, tag: str, tag_cfg: dict[str, Any], cache_dir: str | None) -> bool:
    """True when the weights of `tag` are cached; else raise at once when they cannot be downloaded (see hub)."""
    hub = str(tag_cfg.get("hf_hub") or (model_name[len("hf-hub:") :] if model_name.startswith("hf-hub:") else ""))
    parts = [part for part in hub.split("/") if part]
    repo = "/".join(parts[:2]) or None
    files = tuple(parts[2:3]) + _HUB_FILES
    url = tag_cfg.get("url") or None
    url_dir = Path(cache_dir or os.path.expanduser("~/.cache/clip"))
    if cached_file(repo, files, url, cache_dir=cache_dir, url_dir=url_dir) is not None:
        return True
    if repo or url:
        require_reachable(
            f"the weights '{tag}' of {model_name}",
            url=None if repo else url,
            cache=None if repo else url_dir,
            fix="or pass --pretrained PATH to a local checkpoint",
        )
    return False


def load_openclip(
    model_name: str,
    pretrained: str | None = None,
    device: str | torch.device = "cpu",
    *,
    seed: int = 0,
    cache_dir: str | None = None,
) -> OpenClipBundle:
    """Load an open_clip model (pretrained tag, local checkpoint file, or seeded random init when `pretrained` is None)."""
    import open_clip

    if model_name not in open_clip.list_models() and not model_name.startswith(("hf-hub:", "local-dir:")):
        known = open_clip.list_models()
        raise ExtractError(
            f"unknown open_clip model {model_name!r}{suggest(model_name, known)} (open_clip.list_models())"
        )
    message = quickgelu_mismatch(model_name, pretrained)
    if message:
        warnings.warn(message, UserWarning, stacklevel=2)
    checkpoint: str
    cached = False
    from . import stand_ins

    if stand_ins.enabled() and not (pretrained is not None and os.path.isfile(str(pretrained))):
        # OODBENCH_STAND_INS: a tiny random model built from this architecture's config, never the hub's weights
        model, preprocess, tokenizer = stand_ins.open_clip_model(model_name, pretrained)
        dev = resolve_device(device)
        checkpoint = stand_ins.checkpoint_of(model)
        return OpenClipBundle(model.to(dev).eval(), preprocess, tokenizer, model_name, pretrained, checkpoint, dev)
    if pretrained is None:
        checkpoint = f"random-init:seed={seed}"
    elif os.path.isfile(str(pretrained)):
        checkpoint = f"sha256:{sha256_file(pretrained)}"
    else:
        tag_cfg = open_clip.get_pretrained_cfg(model_name, pretrained) or {}
        if not tag_cfg and not model_name.startswith(("hf-hub:", "local-dir:")):
            known = open_clip.list_pretrained_tags_by_model(model_name)
            raise ExtractError(
                f"{pretrained!r} is neither a pretrained tag of {model_name} (its tags: {', '.join(known) or 'none'}) "
                f"nor an existing checkpoint file{suggest(str(pretrained), known)}"
            )
        cached = _weights_cached(model_name, pretrained, tag_cfg, cache_dir)
        checkpoint = f"open_clip:{pretrained}"
    torch.manual_seed(seed)
    try:
        with warnings.catch_warnings():
            # Our own QuickGELU warning (above) says what to do; silence open_clip's duplicate and its random-init note.
            warnings.filterwarnings("ignore", message="QuickGELU mismatch")
            with prefer_cache(cached):
                model, _, preprocess = open_clip.create_model_and_transforms(
                    model_name, pretrained=pretrained, device="cpu", cache_dir=cache_dir
                )
    except Exception as exc:
        raise ExtractError(
            f"cannot load open_clip {model_name} with pretrained={pretrained!r}: {str(exc)[:400]}. Weights come from the "
            "Hugging Face cache ($HF_HOME) or ~/.cache/clip; offline, pass a local checkpoint file as --pretrained PATH"
        ) from exc
    tokenizer = open_clip.get_tokenizer(model_name)
    dev = resolve_device(device)
    model = model.to(dev).eval()
    return OpenClipBundle(model, preprocess, tokenizer, model_name, pretrained, checkpoint, dev)


# ----------------------------------------------------------------------------------------------- image side
def supports_patches(model: torch.nn.Module) -> bool:
    """True for the towers with value-branch patch embeddings: open_clip ViTs and timm 'map' trunks (`patches`)."""
    return unsupported_reason(model) is None


class OpenClipBackbone(VisionLanguageBackbone):
    """The image tower of an open_clip model: normalised image embeddings and fp16 patch embeddings."""

    kind = "open_clip"

    def __init__(self, bundle: OpenClipBundle, *, patches: bool | None = None) -> None:
        super().__init__(bundle, transform=bundle.preprocess, patches=patches)

    def input_size(self) -> tuple[int, int, int]:
        """(3, H, W) of the preprocessed image."""
        size = self.preprocessing.get("size", 224)
        h, w = (size, size) if isinstance(size, int) else size
        return 3, int(h), int(w)


# ----------------------------------------------------------------------------------------------- text side
def _check_labels(labels: Sequence[str], templates: Sequence[str]) -> tuple[list[str], list[str]]:
    labels = list(labels)
    templates = list(templates)
    if not labels:
        raise ExtractError("no labels to embed")
    bad = [label for label in labels if not isinstance(label, str) or not label.strip()]
    if bad:
        raise ExtractError(f"labels must be non-empty strings; got {bad[0]!r}")
    if not templates:
        raise ExtractError("no templates given")
    wrong = [t for t in templates if not isinstance(t, str) or t.count("{}") != 1]
    if wrong:
        raise ExtractError(f"each template must contain '{{}}' exactly once; got {wrong[0]!r}")
    return labels, templates


def text_embeddings(
    model_bundle: OpenClipBundle | HfClipBundle,
    labels: Sequence[str],
    templates: Sequence[str] = SEED_TEMPLATES,
    batch_size: int = 256,
) -> np.ndarray:
    """(L, D) float32 label embeddings: each template embedding ℓ2-normalised, averaged over templates, renormalised.

    Any bundle with ``encode_texts`` and ``device`` works (open_clip, or the transformers kind `HfClipBundle`).
    """
    labels, templates = _check_labels(labels, templates)
    if batch_size <= 0:
        raise ExtractError(f"batch_size must be positive; got {batch_size}")
    per_step = max(1, batch_size // len(templates))  # labels per forward pass
    chunks: list[np.ndarray] = []
    with torch.no_grad(), autocast(model_bundle.device, True):
        for start in range(0, len(labels), per_step):
            block = labels[start : start + per_step]
            texts = [template.format(label) for label in block for template in templates]
            encoded = model_bundle.encode_texts(texts).float()
            encoded = F.normalize(encoded, dim=-1).reshape(len(block), len(templates), -1).mean(dim=1)
            chunks.append(F.normalize(encoded, dim=-1).cpu().numpy().astype(np.float32))
    return np.concatenate(chunks, axis=0)


def text_dataset_id(labels: Sequence[str], templates: Sequence[str] = SEED_TEMPLATES) -> str:
    """Store dataset id of cached text embeddings: ``text-`` + first 16 hex of sha256 over labels and templates."""
    payload = json.dumps(
        {"labels": list(labels), "templates": list(templates)}, ensure_ascii=False, separators=(",", ":")
    )
    return "text-" + hashlib.sha256(payload.encode("utf-8")).hexdigest()[:16]


def cached_text_embeddings(
    store: Store,
    model_id: str,
    labels: Sequence[str],
    templates: Sequence[str] = SEED_TEMPLATES,
    model_bundle: OpenClipBundle | HfClipBundle | None = None,
    *,
    batch_size: int = 256,
    report: Callable[[str], None] | None = None,
) -> np.ndarray:
    """Template-averaged label embeddings from the store, computing and caching them when a model is given.

    They are written in shards of `TEXT_SHARD` labels as they are encoded, so an interrupted call resumes where it
    stopped; `report` gets one line per shard when there are several."""
    from .pipeline import check_model_id  # local import: pipeline imports this module's neighbours

    labels, templates = _check_labels(labels, templates)
    dataset_id = text_dataset_id(labels, templates)
    if store.exists(model_id, dataset_id):
        meta = store.meta(model_id, dataset_id)
        if meta.get("labels") != labels or meta.get("templates") != templates:
            raise ExtractError(
                f"store entry {model_id}/{dataset_id} holds embeddings of other labels/templates "
                "(hash collision or edited meta.json); delete it and recompute"
            )
        return np.asarray(store.read(model_id, dataset_id).features, dtype=np.float32)
    if model_bundle is None:
        raise TextEmbeddingsMissing(
            f"no cached text embeddings for {len(labels)} labels x {len(templates)} templates under model {model_id!r} "
            f"(dataset id {dataset_id}) in {store.root}; load the model (load_openclip) and pass it as model_bundle, "
            "or cache them once with `oodbench extract --model M --pretrained TAG --text-labels FILE --model-id ID`"
        )
    provenance = model_bundle.provenance()
    check_model_id(store, model_id, provenance)
    # Shards of TEXT_SHARD labels, each written as it is encoded: a killed run keeps what it encoded (a WordNet pool
    # of 79,403 labels × 8 templates is hours on a CPU). 4,096 is a multiple of the labels per forward pass at the
    # default batch (256 texts / 8 templates), so a resumed entry's batches, and bytes, are an uninterrupted one's.
    writer = store.writer(
        model_id, dataset_id, provenance=provenance, num_items=len(labels), shard_size=TEXT_SHARD, item_hash=dataset_id
    )
    pending = writer.pending_shards()
    started = time.monotonic()
    for done, shard in enumerate(pending, start=1):
        rows = writer.shard_rows(shard)
        block = text_embeddings(model_bundle, labels[rows], templates, batch_size=batch_size)
        writer.write_shard(shard, {"features": block, "index": np.arange(rows.start, rows.stop, dtype=np.int64)})
        if report is not None and len(pending) > 1:
            report(
                f"text embeddings {model_id}/{dataset_id}: {rows.stop:,} / {len(labels):,} labels "
                f"({done} of {len(pending)} shards this run, {time.monotonic() - started:.0f} s)"
            )
    writer.finalize(
        extra_meta={
            "labels": labels,
            "templates": templates,
            "text_embeddings": "per-template l2-normalised, averaged, renormalised",
        }
    )
    return np.asarray(store.read(model_id, dataset_id).features, dtype=np.float32)
