"""OODBENCH_STAND_INS=1: every model of configs/fi-imagenet-1k.toml (Table A8) loads as a tiny random model of its own
family and route through the runner's model kinds, with the named tag's preprocessing; nothing else changes."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from oodbench.extract import stand_ins
from oodbench.runner.config import load_config

from ..extract.helpers import single_torch_thread
from .helpers import CONFIGS

FI = load_config(CONFIGS / "fi-imagenet-1k.toml")
MODELS = list(FI.models)


@pytest.fixture(autouse=True)
def stand_ins_on(monkeypatch):
    monkeypatch.setenv(stand_ins.ENV, "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with single_torch_thread():
        yield


def test_the_option_is_one_environment_variable(monkeypatch) -> None:
    for value, on in (("1", True), ("yes", True), ("0", False), ("", False), (" 0 ", False)):
        monkeypatch.setenv(stand_ins.ENV, value)
        assert stand_ins.enabled() is on
    monkeypatch.delenv(stand_ins.ENV)
    assert not stand_ins.enabled()


def _real_class(spec) -> type:
    """The class the real weights would load into, built on the meta device (no memory, no weights)."""
    import timm

    name = spec.params.get("name") or spec.params["backbone"]
    with torch.device("meta"):
        return type(timm.create_model(name, pretrained=False))


@pytest.mark.parametrize("model_id", MODELS)
def test_every_table_a8_model_has_a_stand_in_of_its_family_and_route(model_id) -> None:
    spec = FI.models[model_id]
    backbone = spec.kind_of.backbone(spec, "cpu")
    provenance = backbone.provenance()
    assert provenance["checkpoint"].startswith("stand-in:sha256:")
    image = Image.fromarray(np.random.default_rng(0).integers(0, 256, (24, 32, 3), dtype=np.uint8))
    pixels = torch.stack([backbone.transform(image)] * 2)
    assert pixels.shape[-2:] == (stand_ins.SIZE, stand_ins.SIZE)
    arrays = backbone.infer(pixels, amp=False)
    assert all(np.isfinite(value.astype(np.float64)).all() for value in arrays.values())
    if spec.kind in ("timm", "probe"):
        import timm

        name = spec.params.get("name") or spec.params["backbone"]
        family = _real_class(spec)
        if family.__name__ == "EfficientNet" or family.__name__ == "ResNetV2":  # entry points fix their widths
            assert type(backbone.model).__name__ == family.__name__
        else:
            assert type(backbone.model) is family
        real = timm.models.get_pretrained_cfg(name)
        for key in ("mean", "std", "interpolation", "crop_pct"):
            assert backbone.model.pretrained_cfg[key] == getattr(real, key), key
        assert ("logits" in arrays) is (spec.kind == "timm")
        from oodbench.detectors.registry import create

        # every detector of the config runs on a stand-in's features: NECO's dim is the widest default taken from D
        assert arrays["features"].shape[1] >= create("neco").dim
    else:
        route, _ = spec.kind_of.patch_route(spec)
        assert provenance.get("patch_route") == route  # the same GL-MCM route as the real architecture
        assert arrays["extra.patch_embeddings"].shape[:2] == (2, (stand_ins.SIZE // 8) ** 2)
        text = backbone.bundle.encode_texts(["a photo of a tench.", "goldfish"])
        assert text.shape == (2, arrays["features"].shape[1]) and torch.isfinite(text).all()


def test_two_tags_of_one_architecture_get_different_weights() -> None:
    a, b = (FI.models[m] for m in ("ViT-B-384-l2b-12k", "ViT-B-384-oai-12k"))
    first, second = (spec.kind_of.backbone(spec, "cpu") for spec in (a, b))
    assert first.provenance()["checkpoint"] != second.provenance()["checkpoint"]
    assert not torch.equal(first.model.head.weight, second.model.head.weight)
    again = a.kind_of.backbone(a, "cpu")
    assert torch.equal(first.model.head.weight, again.model.head.weight)  # seeded by the name: reproducible


def test_the_checkpoint_is_the_digest_of_the_weights(monkeypatch) -> None:
    """A stand-in whose architecture changes (here: one block more) records another checkpoint, so the runner
    re-extracts its entries instead of adopting ones another stand-in made."""
    from oodbench.extract.backbones.timm_backbone import load_timm

    first = load_timm("vit_base_patch16_224.augreg_in1k").provenance()["checkpoint"]
    assert first == load_timm("vit_base_patch16_224.augreg_in1k").provenance()["checkpoint"]
    families = tuple(
        (prefix, {**kw, "depth": 3} if prefix == "vit_" else kw) for prefix, kw in stand_ins._TIMM_FAMILIES
    )
    monkeypatch.setattr(stand_ins, "_TIMM_FAMILIES", families)
    assert load_timm("vit_base_patch16_224.augreg_in1k").provenance()["checkpoint"] != first
