"""timm backbones: penultimate features, logits = features·Wᵀ + b, heads, weights loading and its errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from oodbench.core.errors import ExtractError
from oodbench.extract.backbones.timm_backbone import TimmBackbone, load_timm

from .. import reference


@pytest.mark.parametrize("name", ["test_resnet", "test_vit", "test_efficientnet", "test_convnext"])
def test_features_are_the_input_of_the_last_linear_layer(name):
    backbone = load_timm(name, pretrained=False, image_size=64 if name != "test_vit" else None)
    torch.manual_seed(1)
    pixels = torch.randn(3, *backbone.input_size())
    arrays = backbone.infer(pixels)
    head = backbone.head()
    features, logits = arrays["features"], arrays["logits"]
    assert features.dtype == np.float32 and logits.dtype == np.float32
    assert features.shape == (3, backbone.model.num_features) and logits.shape == (3, 1000)
    # Independent path: timm's own pre-logits output (after any head norm / pre-logits block).
    with torch.no_grad():
        pre_logits = backbone.model.forward_head(backbone.model.forward_features(pixels), pre_logits=True)
        reference_logits = backbone.model(pixels)
    np.testing.assert_array_equal(features, pre_logits.numpy())
    np.testing.assert_array_equal(logits, reference_logits.numpy())
    reference.assert_float32_logits_of_head(logits, features, head)  # float32 rounding of the head's sums only


def test_preprocessing_is_the_resolved_timm_config():
    backbone = load_timm("test_efficientnet", pretrained=False)
    prov = backbone.provenance()
    assert prov["kind"] == "timm" and prov["model"] == "test_efficientnet"
    assert prov["checkpoint"] == "random-init:seed=0"
    assert prov["preprocessing"]["input_size"] == [3, 160, 160]
    assert prov["preprocessing"]["mean"] == [0.485, 0.456, 0.406]
    assert prov["preprocessing"]["interpolation"] == "bicubic"
    assert backbone.default_model_id() == "test_efficientnet"


def test_random_init_is_seeded():
    a = load_timm("test_resnet", pretrained=False, seed=3, image_size=32)
    b = load_timm("test_resnet", pretrained=False, seed=3, image_size=32)
    c = load_timm("test_resnet", pretrained=False, seed=4, image_size=32)
    assert np.array_equal(a.head().weight, b.head().weight)
    assert not np.array_equal(a.head().weight, c.head().weight)


class _ScaledLogits(torch.nn.Module):
    """A model whose output is not its classifier's output (logits doubled after the last linear layer)."""

    def __init__(self):
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 4 * 4, 8))
        self.fc = torch.nn.Linear(8, 5)
        self.num_classes = 5
        self.pretrained_cfg = {"input_size": (3, 4, 4), "mean": (0.5,) * 3, "std": (0.5,) * 3}
        self.default_cfg = self.pretrained_cfg

    def get_classifier(self):
        return self.fc

    def forward(self, x):
        return 2 * self.fc(self.body(x))


def test_refuses_a_head_that_does_not_reproduce_the_logits():
    backbone = TimmBackbone(_ScaledLogits(), name="scaled", checkpoint="random-init:seed=0")
    with pytest.raises(ExtractError, match="logits are not features"):
        backbone.infer(torch.randn(2, 3, 4, 4))


def test_distilled_heads_become_one_linear_map():
    backbone = load_timm("deit_tiny_distilled_patch16_224", pretrained=False, image_size=32)
    pixels = torch.randn(2, *backbone.input_size())
    arrays = backbone.infer(pixels)
    assert arrays["features"].shape == (2, 2 * 192)
    with torch.no_grad():
        np.testing.assert_array_equal(arrays["logits"], backbone.model(pixels).numpy())
    # The two heads' float32 sums (D = 192 each), added and halved: within the bound of one D = 384 sum.
    reference.assert_float32_logits_of_head(arrays["logits"], arrays["features"], backbone.head())
    assert "averaged" in backbone.provenance()["features"]


def test_non_linear_classifier_is_refused():
    model = _ScaledLogits()
    model.get_classifier = lambda: torch.nn.Sequential(model.fc)
    with pytest.raises(ExtractError, match="not a linear layer"):
        TimmBackbone(model, name="odd", checkpoint="x")


def test_feature_extractor_without_classifier_gives_features_only():
    backbone = load_timm("test_vit", pretrained=False, num_classes=0)
    arrays = backbone.infer(torch.randn(2, *backbone.input_size()))
    assert set(arrays) == {"features"} and arrays["features"].shape == (2, 64)
    assert backbone.head() is None
    assert backbone.provenance()["features"].startswith("pre-logits")


def test_missing_weights_offline_say_how_to_provide_them(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "empty-cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ExtractError) as info:
        load_timm("test_resnet", pretrained=True)
    message = str(info.value)
    assert "are not in the cache (" in message and "HF_HUB_OFFLINE=1" in message
    assert "--checkpoint PATH" in message and "HF_HOME" in message


def test_unknown_model_is_named():
    with pytest.raises(ExtractError, match="unknown timm model 'resnet_does_not_exist'"):
        load_timm("resnet_does_not_exist", pretrained=False)


def test_local_checkpoint_loads_exactly_and_hashes_the_file(tmp_path):
    source = load_timm("test_resnet", pretrained=False, seed=7, image_size=32)
    path = tmp_path / "weights.pth"
    torch.save(source.model.state_dict(), path)
    loaded = load_timm("test_resnet", checkpoint=path, image_size=32)
    pixels = torch.randn(2, 3, 32, 32)
    np.testing.assert_array_equal(source.infer(pixels)["logits"], loaded.infer(pixels)["logits"])
    import hashlib

    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    assert loaded.provenance()["checkpoint"] == f"sha256:{digest}"
    assert loaded.default_model_id() == f"test_resnet@{digest[:12]}"


def test_checkpoint_with_other_class_count_sets_the_head(tmp_path):
    import timm

    model = timm.create_model("test_resnet", num_classes=7)
    torch.save({"state_dict": model.state_dict()}, tmp_path / "ft.pth")
    backbone = load_timm("test_resnet", checkpoint=tmp_path / "ft.pth", image_size=32)
    assert backbone.head().num_classes == 7
    with pytest.raises(ExtractError, match="does not fit"):
        load_timm("test_efficientnet", checkpoint=tmp_path / "ft.pth")
    with pytest.raises(ExtractError, match="does not exist"):
        load_timm("test_resnet", checkpoint=tmp_path / "nope.pth")


def test_preprocessing_overrides_are_validated_and_applied():
    from oodbench.extract.backbones.base import check_preprocessing, describe_preprocessing

    assert check_preprocessing({"mean": 0.5, "std": [0.25], "input_size": 64, "crop_pct": 1}) == {
        "mean": [0.5] * 3,
        "std": [0.25] * 3,
        "input_size": [3, 64, 64],
        "crop_pct": 1.0,
    }
    assert check_preprocessing({"input_size": [48, 64]})["input_size"] == [3, 48, 64]
    for bad, message in [
        ({"mean": [0.1, 0.2]}, "one number or three"),
        ({"std": 0}, "std must be positive"),
        ({"input_size": [1, 32, 32]}, "S, \\[H, W\\] or \\[3, H, W\\]"),
        ({"interpolation": "cubic"}, "interpolation must be one of"),
        ({"crop_mode": "centre"}, "crop_mode must be one of"),
        ({"gamma": 2.2}, "unknown preprocessing setting 'gamma'"),
    ]:
        with pytest.raises(ExtractError, match=message):
            check_preprocessing(bad)
    # A ViT is created at the overridden resolution, and the transform produces it.
    backbone = load_timm("test_vit", pretrained=False, preprocessing={"input_size": 64, "mean": 0.5, "std": 0.5})
    assert backbone.input_size() == (3, 64, 64)
    assert backbone.preprocessing["mean"] == [0.5] * 3 and backbone.provenance()["preprocessing_overrides"]["mean"]
    assert backbone.infer(torch.zeros(2, 3, 64, 64))["features"].shape[0] == 2
    line = describe_preprocessing(backbone.preprocessing, backbone.preprocessing_overrides)
    assert "input_size=3x64x64*" in line and "mean=(0.5, 0.5, 0.5)*" in line and "interpolation=" in line
