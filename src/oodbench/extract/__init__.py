"""Feature extraction: backbones (timm, open_clip, linear probes), datasets, engines (local, Ray) into the store.

Imports are lazy so that `oodbench` commands that never touch a network do not pay for torch/timm/open_clip.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "extract": "pipeline",
    "ExtractionReport": "pipeline",
    "check_model_id": "pipeline",
    "ImageList": "datasets",
    "image_folder": "datasets",
    "file_list": "datasets",
    "imagenet": "datasets",
    "open_dataset": "datasets",
    "load_rgb": "datasets",
    "load_timm": "backbones.timm_backbone",
    "TimmBackbone": "backbones.timm_backbone",
    "load_openclip": "openclip",
    "OpenClipBackbone": "openclip",
    "OpenClipBundle": "openclip",
    "text_embeddings": "openclip",
    "cached_text_embeddings": "openclip",
    "text_dataset_id": "openclip",
    "NacLayer": "nac",
    "train_probe": "probe",
    "fit_probe": "probe",
    "run_probe": "probe",
    "ProbeConfig": "probe",
    "open_registered": "dataset_registry",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
