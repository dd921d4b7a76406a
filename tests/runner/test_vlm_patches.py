"""The experiment's `patches` key: checked against the tower offline, and each VLM kind's patch route for the plan."""

from __future__ import annotations

from pathlib import Path

import pytest

from oodbench.core.errors import ConfigError
from oodbench.runner.config import parse_config

from ..extract.helpers import write_tiny_aimv2, write_tiny_hf_clip
from .test_table_a8 import small_experiment


def _vlm(tmp_path: Path, model: dict) -> dict:
    data = small_experiment(tmp_path, model)
    data["zeroshot"] = {"scores": ["mcm", "glmcm"]}
    return data


def test_open_clip_patches_are_checked_against_the_architecture(tmp_path: Path) -> None:
    siglip = {"kind": "open_clip", "name": "ViT-SO400M-14-SigLIP-384", "pretrained": "webli", "patches": True}
    (spec,) = parse_config(_vlm(tmp_path, siglip)).models.values()
    assert spec.kind_of.patch_route(spec)[0] == "timm-attention-pool"
    (plain,) = parse_config(_vlm(tmp_path, {**siglip, "patches": False})).models.values()
    assert plain.kind_of.patch_route(plain) == (None, "patches = false")
    convnext = {"kind": "open_clip", "name": "convnext_base_w", "pretrained": "laion2b_s13b_b82k", "patches": True}
    with pytest.raises(ConfigError, match=r"^models\[0\]\.patches: timm trunk convnext_base pools with '', not 'map'"):
        parse_config(_vlm(tmp_path, convnext))


def test_hf_clip_patches_need_an_aimv2_tower(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    aimv2 = write_tiny_aimv2(tmp_path / "aimv2")
    (spec,) = parse_config(
        _vlm(tmp_path, {"kind": "hf_clip", "id": "aimv2", "name": str(aimv2), "patches": True})
    ).models.values()
    assert spec.params["patches"] is True and spec.kind_of.patch_route(spec)[0] == "aimv2"
    clip = write_tiny_hf_clip(tmp_path / "clip")
    with pytest.raises(ConfigError, match=r"^models\[0\]\.patches: .* is a 'clip' model"):
        parse_config(_vlm(tmp_path, {"kind": "hf_clip", "id": "clip", "name": str(clip), "patches": True}))
    (unset,) = parse_config(_vlm(tmp_path, {"kind": "hf_clip", "id": "clip", "name": str(clip)})).models.values()
    assert "patches" not in unset.params  # ids and unit keys of existing experiments stay as they were
