"""Tiny random-weight stand-ins for an experiment's models: ``OODBENCH_STAND_INS=1`` in the environment.

With the variable set (to anything but ``0`` or empty), every model that would load hub weights loads instead a
tiny model of the same family and route, with random weights seeded by its name, and 32 px inputs:

* a timm name (classifiers, and the frozen backbones of probes): the same architecture with a few narrow blocks
  (ViT, DeiT III, EVA-02, DINOv2/v3, Swin V2, ConvNeXt (V2), XCiT), or for EfficientNets, ResNets and BiT's ResNetV2,
  whose entry points fix their widths, timm's ``test_efficientnet`` and ``test_resnet`` and a narrow ``ResNetV2``. The pretrained
  config (mean, std, interpolation, crop) is the named tag's, so preprocessing takes the same route;
* an open_clip name: its own config, narrowed (native ViT towers, or the timm tower it names: SigLIP / SigLIP2 /
  PE-Core with their attention-pooling head), with the named tag's mean, std, interpolation and resize mode, and
  open_clip's bundled CLIP tokenizer in place of a hub tokenizer;
* a transformers AIMv2 or CLIP hub id: a tiny model of that class with a CLIP image processor (32 px, the hub
  checkpoint's mean and std are not read) and a character tokenizer.

Nothing else of an experiment changes: the same config, datasets, detectors and stages run, so a rehearsal
exercises the whole pipeline at real layouts and counts in minutes. The checkpoint in a stand-in's provenance is
``stand-in:sha256:<digest of its weights>``, so its store entries are never taken for a real model's. Local checkpoint files are loaded
as usual. Not for results: the scores of random models mean nothing.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import logging
import os
import string
import threading
from collections.abc import Iterator
from functools import partial
from typing import Any

import torch

from ..core.errors import ExtractError

__all__ = ["ENV", "SIZE", "enabled", "seed_of", "checkpoint_of", "timm_model", "open_clip_model", "hf_clip_model"]

ENV = "OODBENCH_STAND_INS"
SIZE = 32  # input resolution of every stand-in
# Every timm stand-in's feature width is at least 128: the widest hyper-parameter a detector of the Fi config
# takes from D is NECO's dim = 100, and a stand-in must run every detector the real model runs.
FEATURES = 128
_VIT = {"patch_size": 8, "embed_dim": FEATURES, "depth": 2, "num_heads": 2}
# Narrowing kwargs per timm family (architecture name prefix), first match wins.
_TIMM_FAMILIES: tuple[tuple[str, dict[str, Any]], ...] = (
    ("swinv2_", {"embed_dim": FEATURES // 2, "depths": (1, 1), "num_heads": (1, 2), "window_size": 4, "patch_size": 4}),
    ("convnext", {"depths": (1, 1, 1, 1), "dims": (8, 16, 32, FEATURES)}),
    ("xcit_", {"embed_dim": FEATURES, "depth": 2, "num_heads": 2}),
    ("vit_", _VIT),
    ("deit3_", _VIT),
    ("eva02_", _VIT),
)


def enabled() -> bool:
    """Whether stand-ins replace hub weights (``OODBENCH_STAND_INS`` set to anything but ``0`` or empty)."""
    return os.environ.get(ENV, "").strip() not in ("", "0")


def seed_of(name: str) -> int:
    """The seed of a name's stand-in: from its name, so two tags of one architecture get different weights."""
    return int.from_bytes(hashlib.sha256(name.encode("utf-8")).digest()[:4], "big")


def checkpoint_of(model: torch.nn.Module) -> str:
    """What a stand-in's provenance records as its checkpoint: the SHA-256 of its weights (names, shapes, bytes), so
    an entry extracted by another stand-in (another oodbench's, or another seed) is never taken for this one's."""
    digest = hashlib.sha256()
    for key, value in model.state_dict().items():
        tensor = value.detach().cpu().contiguous()
        digest.update(f"{key}:{tuple(tensor.shape)}:{tensor.dtype};".encode())
        digest.update(tensor.numpy().tobytes() if tensor.dtype != torch.bfloat16 else tensor.float().numpy().tobytes())
    return f"stand-in:sha256:{digest.hexdigest()}"


# ----------------------------------------------------------------------------------------------- timm
def timm_model(name: str, *, num_classes: int | None = None) -> torch.nn.Module:
    """A tiny random timm model of `name`'s family, 32 px, carrying `name`'s pretrained config."""
    import timm

    arch = name.split(".")[0]
    cfg = timm.models.get_pretrained_cfg(name)
    classes = num_classes if num_classes is not None else int(getattr(cfg, "num_classes", 1000) or 0)
    torch.manual_seed(seed_of(name))
    if arch.startswith(("tf_efficientnet", "efficientnet")):
        same = {"pad_type": "same"} if arch.startswith("tf_") else {}
        model = timm.create_model("test_efficientnet", pretrained=False, num_classes=classes, **same)
    elif arch.startswith("resnet") and not arch.startswith("resnetv2_"):
        # timm's ResNet fixes its stage widths (64 to 2048 channels): 6x slower than its test model at 32 px
        model = timm.create_model("test_resnet", pretrained=False, num_classes=classes, channels=(32, 48, 48, FEATURES))
    elif arch.startswith("resnetv2_"):
        from timm.layers import GroupNormAct, StdConv2d
        from timm.models import ResNetV2

        model = ResNetV2(
            layers=(1, 1, 1, 1),
            channels=(32, 64, 64, 128),  # bottlenecks of a quarter of these, in group norms of 8 groups (BiT: 32)
            stem_chs=16,
            norm_layer=partial(GroupNormAct, num_groups=8),
            stem_type="fixed",
            conv_layer=partial(StdConv2d, eps=1e-8),
            num_classes=classes,
        )
    else:
        kwargs = next((dict(k) for prefix, k in _TIMM_FAMILIES if arch.startswith(prefix)), None)
        if kwargs is None:
            raise ExtractError(f"{ENV}: no stand-in for the timm architecture {arch!r}; unset it or give a checkpoint")
        model = _create_narrow(name, classes, kwargs)
    if cfg is not None:
        model.pretrained_cfg = {**cfg.to_dict(), "input_size": (3, SIZE, SIZE), "num_classes": classes}
    return model


def _create_narrow(name: str, classes: int, kwargs: dict[str, Any]) -> torch.nn.Module:
    import timm

    try:
        return timm.create_model(name, pretrained=False, num_classes=classes, img_size=SIZE, **kwargs)
    except TypeError:  # CNNs take no img_size
        return timm.create_model(name, pretrained=False, num_classes=classes, **kwargs)


# ----------------------------------------------------------------------------------------------- open_clip
_PATCH_LOCK = threading.Lock()


@contextlib.contextmanager
def _narrow_timm_towers(kwargs: dict[str, Any]) -> Iterator[None]:
    """While open_clip builds a timm vision tower, narrow it: open_clip passes no model arguments to timm."""
    import open_clip.timm_model as towers

    real = towers.timm.create_model

    def create(model_name: str, *args: Any, **options: Any) -> Any:
        return real(model_name, *args, **{**options, **kwargs})

    with _PATCH_LOCK:
        towers.timm.create_model = create
        try:
            yield
        finally:
            towers.timm.create_model = real


def open_clip_model(name: str, pretrained: str | None) -> tuple[torch.nn.Module, Any, Any]:
    """(model, eval preprocess, tokenizer) of a tiny random open_clip model built from `name`'s narrowed config."""
    import open_clip

    config = open_clip.get_model_config(name)
    if config is None:
        raise ExtractError(f"{ENV}: open_clip has no config for {name!r} to build a stand-in from")
    vision = copy.deepcopy(config["vision_cfg"])
    vision["image_size"] = SIZE
    timm_tower = "timm_model_name" in vision
    if not timm_tower:
        vision.update(width=32, layers=2, head_width=16, patch_size=8)
    text = {
        key: value
        for key, value in copy.deepcopy(config["text_cfg"]).items()
        if key not in ("hf_tokenizer_name", "tokenizer_kwargs", "hf_model_name", "hf_model_pretrained", "eos_id")
    }
    if text.get("pool_type") == "eos":  # an HF tokenizer's end id; the CLIP tokenizer's end token has the largest id
        text.pop("pool_type")
    text.update(vocab_size=49408, width=32, heads=2, layers=2)
    text.pop("mlp_ratio", None)
    tag = open_clip.get_pretrained_cfg(name, pretrained) if pretrained else {}
    image = {
        "image_mean": tag.get("mean"),
        "image_std": tag.get("std"),
        "image_interpolation": tag.get("interpolation"),
        "image_resize_mode": tag.get("resize_mode"),
    }
    torch.manual_seed(seed_of(f"{name}@{pretrained}"))
    narrow = _narrow_timm_towers({**_VIT, "img_size": SIZE}) if timm_tower else contextlib.nullcontext()
    root = logging.getLogger()
    was = root.disabled
    root.disabled = True  # open_clip logs "no pretrained weights loaded" on the root logger
    try:
        with narrow:
            model, _, preprocess = open_clip.create_model_and_transforms(
                name,
                pretrained=None,
                device="cpu",
                embed_dim=_VIT["embed_dim"],  # towers without a projection (SigLIP) give their width
                vision_cfg=vision,
                text_cfg=text,
                **{k: v for k, v in image.items() if v is not None},
            )
    finally:
        root.disabled = was
    tokenizer = open_clip.tokenizer.SimpleTokenizer(context_length=int(text.get("context_length", 77)))
    return model, preprocess, tokenizer


# ----------------------------------------------------------------------------------------------- transformers
def _char_tokenizer() -> Any:
    """A CLIP tokenizer over single characters (no merges): builds offline, enough for class names."""
    from transformers import CLIPTokenizer

    vocab = {"<|startoftext|>": 0, "<|endoftext|>": 1}
    for char in string.ascii_lowercase + string.digits + ".,'-":
        vocab[char] = len(vocab)
        vocab[char + "</w>"] = len(vocab)
    return CLIPTokenizer(vocab=vocab, merges=[])


def hf_clip_model(name: str) -> tuple[torch.nn.Module, Any]:
    """(model, processor) of a tiny random transformers model of `name`'s class: AIMv2 for an ``aimv2`` id, else
    CLIP; 32 px with a CLIP image processor and a character tokenizer."""
    from transformers import CLIPImageProcessor, CLIPProcessor

    tokenizer = _char_tokenizer()
    vocab = len(tokenizer.get_vocab())
    vision = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2}
    vision.update(image_size=SIZE, patch_size=8)
    text = {"vocab_size": vocab, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2}
    text.update(num_attention_heads=2, max_position_embeddings=32, eos_token_id=1)
    torch.manual_seed(seed_of(name))
    if "aimv2" in name.lower():
        from transformers import Aimv2Config, Aimv2Model

        vision.update(qkv_bias=True, use_head=True)
        model: torch.nn.Module = Aimv2Model(Aimv2Config(vision_config=vision, text_config=text, projection_dim=16))
    else:
        from transformers import CLIPConfig, CLIPModel

        text.update(bos_token_id=0, pad_token_id=1)
        model = CLIPModel(CLIPConfig(text_config=text, vision_config=vision, projection_dim=16))
    processor = CLIPProcessor(
        image_processor=CLIPImageProcessor(size={"shortest_edge": SIZE}, crop_size={"height": SIZE, "width": SIZE}),
        tokenizer=tokenizer,
    )
    return model, processor
