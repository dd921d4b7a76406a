"""Reading images once for several models: a shared PIL decode, JPEG decoding on the device, tensor preprocessing.

Two ways to turn a file into each model's input:

* ``pil`` (the default, and the only one on CPU unless asked): the file is decoded once with PIL exactly as
  single-model extraction does (`load_rgb`), then every model's own timm/open_clip/transformers transform runs on
  that one decoded image. The pixels each model sees are the ones it sees alone, so the arrays are byte-identical.
* ``device``: worker processes only read the file's bytes; the main process decodes the JPEGs of a batch with
  ``torchvision.io.decode_jpeg`` on the model device (nvJPEG on CUDA) and resizes, crops and normalises them there
  (`TensorPreprocess`). Files it cannot decode (PNG and other formats, CMYK or other non-RGB/grey JPEGs, corrupt
  data) go through the PIL path instead. Resizing on tensors is not PIL's resampling, so features differ slightly
  from the ``pil`` path; the size of that difference on a GPU is not measured here (docs/extract.md).
"""

from __future__ import annotations

import io
import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..core.errors import ExtractError
from .datasets import ImageList, UnreadableImage, check_declared_size, load_rgb, read_image_bytes

__all__ = [
    "DECODERS",
    "Decoded",
    "GroupLoader",
    "TensorPreprocess",
    "decode_on_device",
    "jpeg_components",
    "resolve_decode",
]

DECODERS = ("auto", "pil", "device")
# Components of the JPEGs nvJPEG decodes to RGB: grey and YCbCr. CMYK/YCCK (4) go through PIL.
_DEVICE_COMPONENTS = (1, 3)
# Start-of-frame markers: baseline, extended, progressive, lossless (Huffman); arithmetic ones are rare and go
# through PIL (their component count is read just the same).
_SOF = frozenset({0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF})
_DEVICE_SOF = frozenset({0xC0, 0xC1, 0xC2})


def resolve_decode(decode: str, device: torch.device) -> str:
    """``auto`` is ``device`` on CUDA and ``pil`` elsewhere; the others pass through (validated)."""
    if decode not in DECODERS:
        raise ExtractError(f"--decode must be one of {', '.join(DECODERS)}; got {decode!r}")
    if decode == "auto":
        return "device" if device.type == "cuda" else "pil"
    return decode


def jpeg_components(data: bytes) -> int | None:
    """Colour components of a baseline/progressive JPEG read from its frame header; None if it is not one."""
    if len(data) < 4 or data[0] != 0xFF or data[1] != 0xD8:
        return None
    at = 2
    while at + 4 <= len(data):
        if data[at] != 0xFF:
            return None
        marker = data[at + 1]
        if marker == 0xFF:  # fill byte
            at += 1
            continue
        if marker in (0xD8, 0x01) or 0xD0 <= marker <= 0xD7:  # markers without a length
            at += 2
            continue
        length = int.from_bytes(data[at + 2 : at + 4], "big")
        if marker in _SOF:
            if marker not in _DEVICE_SOF or at + 10 > len(data):
                return None
            return int(data[at + 9])
        if marker == 0xDA or length < 2:  # start of scan before any frame header: malformed
            return None
        at += 2 + length
    return None


@dataclass
class Decoded:
    """One item as the worker hands it over: raw JPEG bytes for the device, or pixels PIL already decoded."""

    jpeg: torch.Tensor | None = None  # uint8 (L,) file bytes, for decode_jpeg
    pixels: torch.Tensor | None = None  # uint8 (3, H, W), decoded by PIL (the fallback)


def _pil_pixels(image: Any) -> torch.Tensor:
    return torch.from_numpy(np.asarray(image, dtype=np.uint8).copy()).permute(2, 0, 1).contiguous()


def read_for_device(path: str | os.PathLike[str]) -> Decoded:
    """The file's bytes when the device can decode it, else PIL's pixels; UnreadableImage when neither can."""
    data = read_image_bytes(path)  # read once: a file changing meanwhile is refused, not half-decoded
    if jpeg_components(data) in _DEVICE_COMPONENTS:
        _check_jpeg_size(data)  # before the device allocates the declared frame
        return Decoded(jpeg=torch.frombuffer(bytearray(data), dtype=torch.uint8))
    return Decoded(pixels=_pil_pixels(load_rgb(io.BytesIO(data))))


def _check_jpeg_size(data: bytes) -> None:
    """UnreadableImage when a JPEG's header declares more pixels than MAX_IMAGE_PIXELS (read from the header only)."""
    import warnings

    from PIL import Image

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(data)) as image:
                check_declared_size(image)
    except UnreadableImage:
        raise
    except Image.DecompressionBombError as exc:
        raise UnreadableImage(f"{exc} (a decompression bomb?); not decoded") from None
    except Exception as exc:  # a header PIL cannot read: the device decoder would fail too
        raise UnreadableImage(f"{type(exc).__name__}: {exc}") from exc


def _default_decoder(blobs: list[torch.Tensor], device: torch.device) -> list[torch.Tensor]:
    from torchvision.io import ImageReadMode, decode_jpeg

    return list(decode_jpeg(blobs, mode=ImageReadMode.RGB, device=device))


def decode_on_device(
    items: Sequence[Decoded],
    device: torch.device,
    *,
    decoder: Callable[[list[torch.Tensor], torch.device], list[torch.Tensor]] | None = None,
) -> tuple[list[torch.Tensor | UnreadableImage], list[str]]:
    """Pixels (uint8 (3, H, W) on `device`) of every item, and for each the route taken: ``device`` or ``pil``.

    The JPEG bytes are decoded in one batched call; if that call fails, each file is retried alone, and a file the
    device decoder refuses is decoded by PIL from the same bytes (an UnreadableImage when PIL cannot either).
    """
    decode = decoder or _default_decoder
    out: list[torch.Tensor | UnreadableImage | None] = [None] * len(items)
    routes = ["pil"] * len(items)
    jpegs = [i for i, item in enumerate(items) if item.jpeg is not None]
    for i, item in enumerate(items):
        if item.pixels is not None:
            out[i] = item.pixels.to(device)
    if jpegs:
        try:
            decoded = decode([items[i].jpeg for i in jpegs], device)  # type: ignore[misc]
            for i, pixels in zip(jpegs, decoded, strict=True):
                out[i], routes[i] = pixels, "device"
        except Exception:
            for i in jpegs:
                try:
                    out[i], routes[i] = decode([items[i].jpeg], device)[0], "device"  # type: ignore[list-item]
                except Exception:
                    data = bytes(items[i].jpeg.numpy())  # type: ignore[union-attr]
                    try:
                        out[i] = _pil_pixels(load_rgb(io.BytesIO(data))).to(device)
                    except UnreadableImage as exc:
                        out[i] = exc
    return out, routes  # type: ignore[return-value]


_INTERPOLATIONS = {"bilinear": "BILINEAR", "bicubic": "BICUBIC", "nearest": "NEAREST_EXACT"}


class TensorPreprocess:
    """A model's resize / centre crop / normalisation applied to a decoded uint8 tensor (on any device).

    Built from the resolved preprocessing of a timm model (``crop_pct``, ``crop_mode`` center or squash) or an
    open_clip model (``resize_mode`` shortest or squash); `of` returns None for anything else (lanczos, box or
    hamming filters, border crops, transformers processors), which then runs its own PIL transform.
    """

    def __init__(
        self,
        size: tuple[int, int],
        scale: int | tuple[int, int],
        interpolation: str,
        mean: Sequence[float],
        std: Sequence[float],
    ) -> None:
        from torchvision.transforms import InterpolationMode

        self.size, self.scale = size, scale
        self.interpolation = getattr(InterpolationMode, _INTERPOLATIONS[interpolation])
        self.mean = torch.tensor([float(v) for v in mean]).view(3, 1, 1)
        self.std = torch.tensor([float(v) for v in std]).view(3, 1, 1)

    @classmethod
    def of(cls, preprocessing: Mapping[str, Any]) -> TensorPreprocess | None:
        """The tensor form of a resolved preprocessing config, or None when it has none."""
        interpolation = preprocessing.get("interpolation")
        if interpolation not in _INTERPOLATIONS:
            return None
        if "crop_pct" in preprocessing:  # timm
            _, h, w = (int(v) for v in preprocessing["input_size"])
            crop_pct = float(preprocessing.get("crop_pct") or 1.0)
            mode = preprocessing.get("crop_mode", "center")
            if mode == "center":
                # timm's eval transform: shorter side to floor(size / crop_pct), then the centre crop
                scale: int | tuple[int, int] = (
                    math.floor(h / crop_pct) if h == w else (math.floor(h / crop_pct), math.floor(w / crop_pct))
                )
            elif mode == "squash":
                scale = (math.floor(h / crop_pct), math.floor(w / crop_pct))
            else:
                return None
            return cls((h, w), scale, interpolation, preprocessing["mean"], preprocessing["std"])
        if "resize_mode" in preprocessing:  # open_clip
            size = preprocessing["size"]
            h, w = (int(size), int(size)) if isinstance(size, int) else (int(size[0]), int(size[1]))
            mode = preprocessing["resize_mode"]
            if mode == "shortest" and h == w:
                return cls((h, w), h, interpolation, preprocessing["mean"], preprocessing["std"])
            if mode == "squash":
                return cls((h, w), (h, w), interpolation, preprocessing["mean"], preprocessing["std"])
        return None

    def __call__(self, pixels: torch.Tensor) -> torch.Tensor:
        """uint8 (3, H, W) → normalised float32 (3, h, w), on the tensor's device."""
        from torchvision.transforms.v2 import functional as tvf

        scale = [self.scale] if isinstance(self.scale, int) else list(self.scale)
        resized = tvf.resize(pixels, scale, interpolation=self.interpolation, antialias=True)
        cropped = tvf.center_crop(resized, list(self.size))
        image = cropped.float().div_(255)
        return (image - self.mean.to(image.device)) / self.std.to(image.device)


_TRANSFORM_LIBRARIES = ("torchvision.", "timm.", "open_clip.")


def transform_key(transform: Any) -> str:
    """Equal for two transforms only when they are the same computation: the same object, or torchvision Composes
    of timm/torchvision/open_clip steps whose reprs (every step with all its parameters) are equal."""
    from torchvision.transforms import Compose

    if isinstance(transform, Compose) and all(
        type(step).__module__.startswith(_TRANSFORM_LIBRARIES)
        or getattr(step, "__module__", "").startswith(_TRANSFORM_LIBRARIES)
        for step in transform.transforms
    ):
        return "compose:" + repr(transform)
    return f"object:{id(transform)}"


class GroupLoader:
    """Loads an item once and prepares it for every model of a group (picklable, for worker processes).

    Models whose transforms are the same computation (`transform_key`, e.g. two timm models with one data config)
    share its output too: the tensor is computed once and given to each of them.
    """

    def __init__(self, dataset: ImageList, transforms: Sequence[Callable[[Any], torch.Tensor]], mode: str) -> None:
        if mode not in ("pil", "device"):
            raise ExtractError(f"unknown decode mode {mode!r}")
        self.dataset, self.transforms, self.mode = dataset, list(transforms), mode
        keys = [transform_key(t) for t in self.transforms]
        # For each member, the first member with the same transform (itself when it is the first).
        self.same_as = [keys.index(key) for key in keys]

    def describe(self, position: int) -> str:
        """The item's path as recorded in the store (relative to the dataset root)."""
        return self.dataset.items[position]

    def read(self, position: int) -> Decoded | Any:
        """``pil``: the decoded RGB image; ``device``: bytes or fallback pixels (`read_for_device`)."""
        path = self.dataset.path(position)
        return load_rgb(path) if self.mode == "pil" else read_for_device(path)

    def prepare(self, image: Any, member: int) -> torch.Tensor:
        """Model `member`'s input from a decoded PIL image (its own transform)."""
        try:
            return self.transforms[member](image)
        except Exception as exc:  # the same wording as single-model extraction (ItemLoader)
            raise UnreadableImage(f"preprocessing failed: {type(exc).__name__}: {exc}") from exc
