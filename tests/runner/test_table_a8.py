"""configs/fi-imagenet-1k.toml is Table A8 of the Fi-ImageNet-1k paper, and the keys that encode it are checked.

`TABLE_A8` is an independent transcription of the table (display name → checkpoint), so an edit of the config that
drifts from the paper fails here. The per-kind keys (`display`, timm `preprocessing`/`convert`, `resolution`, the
`hf_clip` kind) are exercised on a small experiment.
"""

from __future__ import annotations

import copy
import json
import tomllib
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from oodbench.core.errors import ConfigError
from oodbench.runner.config import load_config, parse_config

from .helpers import CONFIGS

FI = CONFIGS / "fi-imagenet-1k.toml"

# Table A8 (supervised: timm checkpoints; † probes on frozen backbones; VLMs: open_clip pairs, resolution).
TABLE_A8_TIMM = {
    "ViT-B-384-l2b-12k": "vit_base_patch16_clip_384.laion2b_ft_in12k_in1k",
    "ViT-B-384-oai-12k": "vit_base_patch16_clip_384.openai_ft_in12k_in1k",
    "ViT-B-384-l2b": "vit_base_patch16_clip_384.laion2b_ft_in1k",
    "ViT-B-384-oai": "vit_base_patch16_clip_384.openai_ft_in1k",
    "ViT-B-384-21k": "vit_base_patch16_384.augreg_in21k_ft_in1k",
    "ViT-B-224-21k": "vit_base_patch16_224.augreg_in21k_ft_in1k",
    "SwinV2-B-256-21k": "swinv2_base_window12to16_192to256.ms_in22k_ft_in1k",
    "DeiT3-B-384-21k": "deit3_base_patch16_384.fb_in22k_ft_in1k",
    "DeiT3-B-224-21k": "deit3_base_patch16_224.fb_in22k_ft_in1k",
    "ConvNeXt-B-21k": "convnext_base.fb_in22k_ft_in1k",
    "ConvNeXt-T-21k": "convnext_tiny.fb_in22k_ft_in1k_384",
    "BiT-m": "resnetv2_101x1_bit.goog_in21k_ft_in1k",
    "EffNetV2-M-21k": "tf_efficientnetv2_m.in21k_ft_in1k",
    "ConvNeXtV2-L": "convnextv2_large.fcmae_ft_in22k_in1k_384",
    "EVA02-L-448": "eva02_large_patch14_448.mim_m38m_ft_in22k_in1k",
    "EffNet-b7-ns": "tf_efficientnet_b7.ns_jft_in1k",
    "ViT-B-384": "vit_base_patch16_384.augreg_in1k",
    "SwinV2-B-256": "swinv2_base_window16_256.ms_in1k",
    "DeiT3-B-384": "deit3_base_patch16_384.fb_in1k",
    "DeiT3-B-224": "deit3_base_patch16_224.fb_in1k",
    "XCiT-M-224": "xcit_medium_24_p16_224.fb_in1k",
    "XCiT-M-224-d": "xcit_medium_24_p16_224.fb_dist_in1k",
    "ConvNeXt-B": "convnext_base.fb_in1k",
    "BiT-s": "resnetv2_101x1_bit",
    "EffNetV2-M": "tf_efficientnetv2_m.in1k",
    "EffNet-b7": "tf_efficientnet_b7.ra_in1k",
    "EffNet-B0": "efficientnet_b0.ra_in1k",
    "ResNet50": "resnet50.a1_in1k",
}
TABLE_A8_PROBES = {"DINOv2-g/14": "vit_giant_patch14_dinov2.lvd142m", "DINOv3-7B": "vit_7b_patch16_dinov3.lvd1689m"}
TABLE_A8_VLMS = {
    "MetaCLIP2-H/14": ("ViT-H-14-worldwide-378", "metaclip2_worldwide", 378),
    "OpenCLIP-H/14": ("ViT-H-14-378-quickgelu", "dfn5b", 378),
    "SigLIP-SO400M": ("ViT-SO400M-14-SigLIP-384", "webli", 384),
    "SigLIP2-g": ("ViT-gopt-16-SigLIP2-384", "webli", 384),
    "CLIP-B/16": ("ViT-B-16-quickgelu", "openai", 224),
    "CLIP-L/14": ("ViT-L-14-336-quickgelu", "openai", 336),
    "PE-Core-L/14": ("PE-Core-L-14-336", "meta", 336),
}


@pytest.fixture(scope="module")
def fi(tmp_path_factory):
    return load_config(FI, workdir=tmp_path_factory.mktemp("fi") / "run")


def test_config_is_table_a8(fi) -> None:
    declared = [*fi.models.values(), *(m for m, _ in fi.skipped_models)]  # BiT-s waits for its checkpoint
    by_display = {m.display_name: m for m in declared}
    assert len(by_display) == len(declared) == 38
    assert {d: m.params["name"] for d, m in by_display.items() if m.kind == "timm"} == TABLE_A8_TIMM
    assert {d: m.params["backbone"] for d, m in by_display.items() if m.kind == "probe"} == TABLE_A8_PROBES
    open_clip = {d: (m.params["name"], m.params["pretrained"]) for d, m in by_display.items() if m.kind == "open_clip"}
    assert open_clip == {d: pair[:2] for d, pair in TABLE_A8_VLMS.items()}
    (aimv2,) = [m for m in fi.models.values() if m.kind == "hf_clip"]
    assert (aimv2.display_name, aimv2.params["name"]) == ("AIMv2-L", "apple/aimv2-large-patch14-224-lit")
    assert len(fi.classifiers) == 29 and len(fi.zeroshot.models) == 8
    # Store ids are the display names made path-safe.
    assert all(m.id == m.display_name.replace("/", "-") for m in fi.models.values())


def test_open_clip_resolutions_are_those_printed() -> None:
    raw = tomllib.loads(FI.read_text(encoding="utf-8"))
    printed = {m["display"]: m.get("resolution") for m in raw["models"] if m["kind"] in ("open_clip", "hf_clip")}
    assert printed == {**{d: pair[2] for d, pair in TABLE_A8_VLMS.items()}, "AIMv2-L": 224}


def test_dry_run_names_every_model_as_the_paper(tmp_path: Path) -> None:
    from oodbench.cli.main import app

    result = CliRunner().invoke(app, ["run", str(FI), "--dry-run", "--summary", "--out", str(tmp_path / "w")])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    for display, tag in [*TABLE_A8_TIMM.items(), *TABLE_A8_PROBES.items()]:
        assert any(line.startswith(display + " ") and tag in line for line in lines), display
    for display, (name, pretrained, size) in TABLE_A8_VLMS.items():
        assert any(line.startswith(display + " ") and f"{name} / {pretrained}, {size} px" in line for line in lines)
    assert any(line.startswith("BiT-s ") and "needs checkpoint = PATH" in line for line in lines)
    assert "apple/aimv2-large-patch14-224-lit (hub id;" in result.output
    as_json = CliRunner().invoke(app, ["run", str(FI), "--dry-run", "--json", "--out", str(tmp_path / "w")])
    models = json.loads(as_json.output)["models"]
    skipped = json.loads(as_json.output)["skipped_models"]
    assert {m["display"] for m in models + skipped} == {*TABLE_A8_TIMM, *TABLE_A8_PROBES, *TABLE_A8_VLMS, "AIMv2-L"}


@pytest.mark.parametrize(
    "index, key, value, message",
    [
        (0, "name", "vit_base_patch16_clip_384.laion2b_ft_in13k_in1k", "timm has no pretrained weights"),
        (28, "backbone", "vit_giant_patch14_dinov2.lvd143m", "timm has no pretrained weights"),
        (30, "pretrained", "metaclip3_worldwide", "open_clip has no weights 'metaclip3_worldwide'"),
        (30, "resolution", 336, "takes 378 px images, not 336"),
        (37, "name", "apple aimv2", "neither a Hugging Face hub id"),
        (0, "display", "", "expected a non-empty string"),
        (1, "display", "ViT-B-384-l2b-12k", "is already the name of models[0]"),
    ],
)
def test_a_tag_that_does_not_resolve_is_named(index: int, key: str, value: Any, message: str) -> None:
    data = tomllib.loads(FI.read_text(encoding="utf-8"))
    data = copy.deepcopy(data)
    data["models"][index][key] = value
    with pytest.raises(ConfigError) as info:
        parse_config(data, path=FI)
    assert str(info.value).startswith(f"models[{index}].{key}:") and message in str(info.value), str(info.value)


def small_experiment(tmp_path: Path, model: dict[str, Any]) -> dict[str, Any]:
    return {
        "experiment": {"name": "t", "workdir": str(tmp_path / "w")},
        "models": [model],
        "datasets": {
            "fit": {"kind": "folder", "root": str(tmp_path / "fit"), "labels": True},
            "val": {"kind": "folder", "root": str(tmp_path / "val"), "labels": True},
            "ood": {"kind": "folder", "root": str(tmp_path / "ood")},
        },
        "id": {"fit": "fit", "test": "val"},
        "ood": {"datasets": ["ood"]},
        "detectors": {"include": ["msp"]},
    }


def test_timm_preprocessing_and_convert_keys(tmp_path: Path) -> None:
    model = {
        "kind": "timm",
        "name": "tf_efficientnet_lite0",
        "checkpoint": str(tmp_path / "lite0.pth"),
        "convert": "efficientnet_pytorch",
        "preprocessing": {"mean": 0.5, "std": [0.5, 0.5, 0.5], "crop_pct": 0.875, "interpolation": "bicubic"},
    }
    (spec,) = parse_config(small_experiment(tmp_path, model)).models.values()
    assert spec.params["convert"] == "efficientnet_pytorch"
    assert spec.params["preprocessing"] == {
        "mean": [0.5] * 3,
        "std": [0.5] * 3,
        "crop_pct": 0.875,
        "interpolation": "bicubic",
    }
    assert "preprocessing" in spec.identity()  # another preprocessing is another extraction
    bad = {**model, "preprocessing": {"crop_pct": 2}}
    with pytest.raises(ConfigError, match=r"^models\[0\]\.preprocessing: .*crop_pct must be in \(0, 1\]"):
        parse_config(small_experiment(tmp_path, bad))
    with pytest.raises(ConfigError, match=r"^models\[0\]\.convert: applies to a checkpoint file only"):
        parse_config(small_experiment(tmp_path, {"kind": "timm", "name": "resnet50.a1_in1k", "convert": "auto"}))


def test_hf_clip_kind_is_a_vlm_with_a_display_name(tmp_path: Path) -> None:
    model = {"kind": "hf_clip", "name": "apple/aimv2-large-patch14-224-lit", "display": "AIMv2-L"}
    data = small_experiment(tmp_path, model)
    data["zeroshot"] = {"scores": ["mcm"]}
    config = parse_config(data)
    (spec,) = config.models.values()
    assert spec.id == "apple-aimv2-large-patch14-224-lit" and spec.display_name == "AIMv2-L"
    assert not spec.is_classifier and list(config.zeroshot.models) == [spec.id]
    assert "display" not in spec.identity()  # renaming a model for tables does not invalidate its results
