"""Model names and hub weights: "did you mean" for timm and open_clip, one line at once when weights cannot come."""

from __future__ import annotations

import socket

import pytest

from oodbench.core.errors import ExtractError
from oodbench.extract import hub
from oodbench.extract.backbones.timm_backbone import check_timm_name, load_timm


def test_timm_typos_get_the_closest_names():
    with pytest.raises(ExtractError) as error:
        check_timm_name("resnet50.a1_in1kk")
    assert str(error.value).startswith(
        "timm model resnet50 has no pretrained tag 'a1_in1kk'; did you mean 'resnet50.a1_in1k'"
    )
    assert "(its tags: a1_in1k, " in str(error.value)
    with pytest.raises(ExtractError, match="unknown timm model 'resnt50'; did you mean 'resnet50'"):
        check_timm_name("resnt50")
    check_timm_name("resnet50.a1_in1k")  # known: no error
    check_timm_name("resnet50")


def test_open_clip_typos_get_the_closest_names():
    pytest.importorskip("open_clip")
    from oodbench.extract.openclip import load_openclip

    with pytest.raises(ExtractError, match="unknown open_clip model 'ViT-B-61'; did you mean 'ViT-B-16'"):
        load_openclip("ViT-B-61", "openai")
    with pytest.raises(ExtractError, match="nor an existing checkpoint file; did you mean 'openai'"):
        load_openclip("ViT-B-16", "opena")


def test_offline_and_not_cached_is_one_line_naming_hf_hub_offline_and_the_cache(monkeypatch, tmp_path):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    with pytest.raises(ExtractError) as error:
        load_timm("resnet18.a1_in1k")
    message = str(error.value)
    assert message.startswith("the pretrained weights of resnet18.a1_in1k are not in the cache (")
    assert str(tmp_path / "empty-cache") in message and "HF_HUB_OFFLINE=1" in message and "\n" not in message


def test_unreachable_hub_fails_at_once_without_retries(monkeypatch, tmp_path):
    from huggingface_hub import constants

    attempts = []

    def refuse(address, timeout):
        attempts.append((address, timeout))
        raise OSError(111, "Connection refused")

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    monkeypatch.setattr(socket, "create_connection", refuse)
    with pytest.raises(ExtractError) as error:
        load_timm("resnet18.a1_in1k")
    assert attempts == [(("huggingface.co", 443), hub.CONNECT_TIMEOUT_S)]  # one 3 s try, no retries
    message = str(error.value)
    assert "huggingface.co cannot be reached (Connection refused)" in message
    assert "HF_HUB_OFFLINE=1" in message and str(tmp_path / "empty-cache") in message


def test_cached_weights_are_found_and_loaded_without_hub_requests(monkeypatch, tmp_path):
    """A real hub cache layout (models--org--name/snapshots/<commit>/file, refs/main) is found without a request."""
    from huggingface_hub import constants

    repo = tmp_path / "models--timm--resnet18.a1_in1k"
    commit = "0" * 40
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    (repo / "snapshots" / commit).mkdir(parents=True)
    (repo / "snapshots" / commit / "model.safetensors").write_bytes(b"x")
    found = hub.cached_file("timm/resnet18.a1_in1k", ("model.safetensors",), cache_dir=tmp_path)
    assert found == repo / "snapshots" / commit / "model.safetensors"
    assert hub.cached_file("timm/resnet18.a1_in1k", ("pytorch_model.bin",), cache_dir=tmp_path) is None
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    with hub.prefer_cache(True):
        assert constants.is_offline_mode()
    assert not constants.is_offline_mode()


def test_default_workers_follow_the_cores_available(monkeypatch):
    import os

    from oodbench.extract.engines.local import default_workers

    for cores, expected in ((1, 0), (2, 1), (3, 2), (16, 4)):
        monkeypatch.setattr(os, "sched_getaffinity", lambda pid, n=cores: set(range(n)), raising=False)
        assert default_workers() == expected
