"""Shared fixtures for extraction tests: offline hubs, generated images, a tiny open_clip config."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from extract_helpers import TINY_CLIP, TINY_CLIP_CONFIG, write_images


@pytest.fixture(autouse=True)
def offline_hubs(monkeypatch):
    """Never touch the network: Hugging Face hubs offline."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")


@pytest.fixture(autouse=True)
def one_thread():
    """One intra-op thread: on a shared, oversubscribed 2-core machine spinning OpenMP threads slow small ops ~20x."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture
def image_dir(tmp_path) -> Path:
    """Two classes of generated images with one corrupt file."""
    return write_images(tmp_path / "images", {"cat": 5, "dog": 4}, corrupt=["dog/broken.png"])


@pytest.fixture(scope="session")
def tiny_clip(tmp_path_factory) -> str:
    """Register a tiny open_clip architecture (32 px, width 32) and return its name."""
    import open_clip

    folder = tmp_path_factory.mktemp("clip_config")
    (folder / f"{TINY_CLIP}.json").write_text(json.dumps(TINY_CLIP_CONFIG))
    if TINY_CLIP not in open_clip.list_models():
        open_clip.add_model_config(folder / f"{TINY_CLIP}.json")
    return TINY_CLIP
