"""Shared fixtures for extraction tests: offline hubs, generated images, a tiny open_clip config."""

from __future__ import annotations

from pathlib import Path

import pytest

from .helpers import register_tiny_clip, single_torch_thread, write_images


@pytest.fixture(autouse=True)
def offline_hubs(monkeypatch):
    """Never touch the network: Hugging Face hubs offline."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")


@pytest.fixture(autouse=True)
def one_thread():
    """One intra-op thread (see `single_torch_thread`)."""
    with single_torch_thread():
        yield


@pytest.fixture
def image_dir(tmp_path) -> Path:
    """Two classes of generated images with one corrupt file."""
    return write_images(tmp_path / "images", {"cat": 5, "dog": 4}, corrupt=["dog/broken.png"])


@pytest.fixture(scope="session")
def tiny_clip(tmp_path_factory) -> str:
    """Register a tiny open_clip architecture (32 px, width 32) and return its name."""
    return register_tiny_clip(tmp_path_factory.mktemp("clip_config")).stem
