"""What every backbone offers the extraction engines: preprocessing, a batched forward to numpy arrays, provenance."""

from __future__ import annotations

import abc
import contextlib
import contextvars
import re
from collections.abc import Callable, Iterator, Mapping
from typing import Any, ClassVar

import numpy as np
import torch

from ...core.errors import ExtractError
from ...core.outputs import Head

__all__ = [
    "Backbone",
    "safe_id",
    "autocast",
    "autocast_dtype",
    "AMP_DTYPES",
    "resolve_device",
    "PREPROCESSING_KEYS",
    "INTERPOLATIONS",
    "check_preprocessing",
    "describe_preprocessing",
]

# Image preprocessing settings a user may override (timm's data-config names).
PREPROCESSING_KEYS = ("input_size", "mean", "std", "interpolation", "crop_pct", "crop_mode")
INTERPOLATIONS = ("bicubic", "bilinear", "nearest", "lanczos", "box", "hamming")
_CROP_MODES = ("center", "squash", "border")

_UNSAFE = re.compile(r"[^A-Za-z0-9._+@=,-]+")


def safe_id(text: str) -> str:
    """A store-safe id from a model name (e.g. 'hf-hub:timm/x' -> 'hf-hub-timm-x')."""
    cleaned = _UNSAFE.sub("-", text).strip("-._+@=,")
    return cleaned or "model"


def resolve_device(device: str | torch.device | None) -> torch.device:
    """'auto' (or None) picks CUDA when available, else CPU; a named device must exist (ExtractError otherwise)."""
    if device in (None, "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        resolved = torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        raise ExtractError(f"--device {str(device)[:40]!r} is not a device (auto, cpu, cuda or cuda:N)") from None
    if resolved.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise ExtractError(f"--device {device}: no CUDA device is available here (use cpu)")
        if resolved.index is not None and resolved.index >= count:
            raise ExtractError(
                f"--device {device}: no such device ({count} CUDA device(s): cuda:0 to cuda:{count - 1})"
            )
    return resolved


def _triple(key: str, value: Any, *, positive: bool) -> list[float]:
    values = [value] * 3 if isinstance(value, (int, float)) and not isinstance(value, bool) else value
    if not isinstance(values, (list, tuple)) or len(values) not in (1, 3):
        raise ExtractError(f"preprocessing {key} must be one number or three (R, G, B); got {value!r}")
    try:
        numbers = [float(v) for v in values] * (3 if len(values) == 1 else 1)
    except (TypeError, ValueError):
        raise ExtractError(f"preprocessing {key} must be numbers; got {value!r}") from None
    if positive and any(v <= 0 for v in numbers):
        raise ExtractError(f"preprocessing {key} must be positive; got {value!r}")
    return numbers


def check_preprocessing(overrides: Mapping[str, Any] | None) -> dict[str, Any]:
    """Validate user preprocessing overrides; returns them normalised (3-vectors, (3, H, W) input size).

    `input_size` takes an int (square), [H, W] or [3, H, W]; `mean`/`std` one number or three; `crop_pct` in
    (0, 1]; `interpolation` one of `INTERPOLATIONS`; `crop_mode` center, squash or border.
    """
    result: dict[str, Any] = {}
    for key, value in dict(overrides or {}).items():
        if value is None:
            continue
        if key not in PREPROCESSING_KEYS:
            raise ExtractError(f"unknown preprocessing setting {key!r}; use {', '.join(PREPROCESSING_KEYS)}")
        if key == "input_size":
            size = [value] if isinstance(value, int) and not isinstance(value, bool) else value
            if not isinstance(size, (list, tuple)) or not all(isinstance(v, int) and v > 0 for v in size):
                raise ExtractError(f"preprocessing input_size must be positive integers; got {value!r}")
            if len(size) == 1:
                size = [3, size[0], size[0]]
            elif len(size) == 2:
                size = [3, *size]
            if len(size) != 3 or size[0] != 3:
                raise ExtractError(f"preprocessing input_size must be S, [H, W] or [3, H, W]; got {value!r}")
            result[key] = list(size)
        elif key in ("mean", "std"):
            result[key] = _triple(key, value, positive=key == "std")
        elif key == "crop_pct":
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < float(value) <= 1:
                raise ExtractError(f"preprocessing crop_pct must be in (0, 1]; got {value!r}")
            result[key] = float(value)
        elif key == "interpolation":
            if value not in INTERPOLATIONS:
                raise ExtractError(
                    f"preprocessing interpolation must be one of {', '.join(INTERPOLATIONS)}; got {value!r}"
                )
            result[key] = value
        else:
            if value not in _CROP_MODES:
                raise ExtractError(f"preprocessing crop_mode must be one of {', '.join(_CROP_MODES)}; got {value!r}")
            result[key] = value
    return result


def describe_preprocessing(preprocessing: Mapping[str, Any], overrides: Mapping[str, Any] | None = None) -> str:
    """One line naming the resolved preprocessing, with the overridden settings marked ``*``."""

    def fmt(key: str) -> str:
        value = preprocessing.get(key)
        if isinstance(value, (list, tuple)) and key != "input_size":
            value = "(" + ", ".join(f"{float(v):.4g}" for v in value) + ")"
        elif isinstance(value, (list, tuple)):
            value = "x".join(str(v) for v in value)
        return f"{key}={value}" + ("*" if overrides and key in overrides else "")

    parts = [fmt(key) for key in PREPROCESSING_KEYS if key in preprocessing]
    parts += [f"{key}={value}" for key, value in sorted(preprocessing.items()) if key not in PREPROCESSING_KEYS]
    return ", ".join(parts) + (" (* = overridden)" if overrides else "")


AMP_DTYPES = ("auto", "bfloat16", "float16")
# The half-precision type of GPU autocast, set by the extraction engines around a batch (`autocast_dtype`), so every
# backbone's `infer` honours it without a parameter of its own.
_AMP_DTYPE: contextvars.ContextVar[str] = contextvars.ContextVar("oodbench_amp_dtype", default="auto")


@contextlib.contextmanager
def autocast_dtype(dtype: str) -> Iterator[None]:
    """Within this block, GPU autocast uses `dtype` (auto = bfloat16 where supported, else float16)."""
    if dtype not in AMP_DTYPES:
        raise ExtractError(f"autocast dtype must be one of {', '.join(AMP_DTYPES)}; got {dtype!r}")
    token = _AMP_DTYPE.set(dtype)
    try:
        yield
    finally:
        _AMP_DTYPE.reset(token)


def resolved_amp_dtype(device: torch.device, enabled: bool) -> str | None:
    """The dtype autocast runs in on `device` (None: no autocast, i.e. float32 or a CPU device)."""
    if not enabled or device.type != "cuda":
        return None
    chosen = _AMP_DTYPE.get()
    if chosen == "auto":
        return "bfloat16" if torch.cuda.is_bf16_supported() else "float16"
    return chosen


@contextlib.contextmanager
def autocast(device: torch.device, enabled: bool) -> Iterator[None]:
    """Mixed precision on GPU (bfloat16 where supported, else float16, or `autocast_dtype`); a no-op on CPU."""
    dtype = resolved_amp_dtype(device, enabled)
    if dtype is not None:
        with torch.autocast("cuda", dtype=getattr(torch, dtype)):
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
