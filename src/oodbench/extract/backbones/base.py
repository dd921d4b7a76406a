"""What every backbone offers the extraction engines: preprocessing, a batched forward to numpy arrays, provenance."""

from __future__ import annotations

import abc
import contextlib
import hashlib
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch

from ...outputs import Head

__all__ = ["Backbone", "sha256_file", "safe_id", "autocast", "resolve_device"]

_UNSAFE = re.compile(r"[^A-Za-z0-9._+@=,-]+")


def sha256_file(path: str | Path, *, block: int = 8 * 2**20) -> str:
    """SHA-256 hex digest of a file, streamed."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(block), b""):
            digest.update(chunk)
    return digest.hexdigest()


def safe_id(text: str) -> str:
    """A store-safe id from a model name (e.g. 'hf-hub:timm/x' -> 'hf-hub-timm-x')."""
    cleaned = _UNSAFE.sub("-", text).strip("-._+@=,")
    return cleaned or "model"


def resolve_device(device: str | torch.device | None) -> torch.device:
    """'auto' (or None) picks CUDA when available, else CPU."""
    if device in (None, "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


@contextlib.contextmanager
def autocast(device: torch.device, enabled: bool) -> Iterator[None]:
    """Mixed precision on GPU (bfloat16 where supported, else float16); a no-op on CPU or when disabled."""
    if enabled and device.type == "cuda":
        dtype = torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        with torch.autocast("cuda", dtype=dtype):
            yield
    else:
        yield


class Backbone(abc.ABC):
    """A frozen network turning preprocessed image batches into per-image arrays (features, logits, extras)."""

    kind: ClassVar[str] = ""

    def __init__(
        self,
        model: torch.nn.Module,
        *,
        name: str,
        checkpoint: str,
        preprocessing: dict[str, Any],
        transform: Callable[[Any], torch.Tensor],
    ) -> None:
        self.model = model.eval()
        self.name = name
        self.checkpoint = checkpoint
        self.preprocessing = preprocessing
        self.transform = transform
        self.device = torch.device("cpu")

    def to(self, device: str | torch.device | None) -> Backbone:
        """Move the network to a device ('auto' picks CUDA when available)."""
        self.device = resolve_device(device)
        self.model.to(self.device)
        return self

    def provenance(self) -> dict[str, Any]:
        """Where the arrays come from: model name, checkpoint (sha256 or tag), resolved preprocessing, kind."""
        return {
            "model": self.name,
            "checkpoint": self.checkpoint,
            "preprocessing": self.preprocessing,
            "kind": self.kind,
        }

    def default_model_id(self) -> str:
        """Store model id derived from the model name (and checkpoint) when none is given."""
        return safe_id(self.name)

    def head(self) -> Head | None:
        """The final linear map (W, b) when the network has one."""
        return None

    def input_size(self) -> tuple[int, int, int]:
        """(C, H, W) of one preprocessed image."""
        size = self.preprocessing.get("input_size")
        if size is not None:
            return tuple(int(v) for v in size)  # type: ignore[return-value]
        from PIL import Image

        return tuple(self.transform(Image.new("RGB", (256, 256))).shape)  # type: ignore[return-value]

    @abc.abstractmethod
    def infer(self, pixels: torch.Tensor, *, amp: bool = True) -> dict[str, np.ndarray]:
        """Arrays for a batch: ``features`` and optionally ``logits`` and ``extra.<name>``, one row per image."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r}, checkpoint={self.checkpoint!r})"
