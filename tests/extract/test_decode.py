"""Device decoding without a GPU: JPEG header routing, the PIL fallback, tensor preprocessing, option plumbing.

`torchvision.io.decode_jpeg` runs on CPU as well, so the whole ``--decode device`` path runs here with
``device="cpu"``; only nvJPEG itself (and how close its pixels come to PIL's) needs a GPU.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from typer.testing import CliRunner

from oodbench.core.store import Store
from oodbench.extract.backbones.base import autocast_dtype, resolved_amp_dtype
from oodbench.extract.backbones.timm_backbone import load_timm
from oodbench.extract.datasets import UnreadableImage, image_folder, load_rgb
from oodbench.extract.decode import (
    Decoded,
    TensorPreprocess,
    decode_on_device,
    jpeg_components,
    read_for_device,
    resolve_decode,
)
from oodbench.extract.pipeline import GroupMember, extract_group, runtime_provenance

from .test_group import write_photos

CPU = torch.device("cpu")


def pil_pixels(path: Path) -> torch.Tensor:
    return torch.from_numpy(np.array(load_rgb(path))).permute(2, 0, 1)


@pytest.fixture
def photos(tmp_path) -> Path:
    folder = write_photos(tmp_path) / "photos"
    Image.open(folder / "coffee.jpg").save(folder / "coffee_progressive.jpg", progressive=True, quality=85)
    return folder


def test_jpeg_header_routes_files(photos):
    def components(name: str) -> int | None:
        return jpeg_components((photos / name).read_bytes())

    assert components("chelsea.jpg") == 3 and components("coffee_progressive.jpg") == 3
    assert components("camera.jpg") == 1  # greyscale
    assert components("chelsea_cmyk.jpg") == 4  # CMYK: PIL's path
    assert components("coffee.png") is None and jpeg_components(b"\xff\xd8") is None and jpeg_components(b"") is None
    assert read_for_device(photos / "chelsea.jpg").jpeg is not None
    for name in ("chelsea_cmyk.jpg", "coffee.png"):
        fallback = read_for_device(photos / name)
        assert fallback.jpeg is None and torch.equal(fallback.pixels, pil_pixels(photos / name))
    with pytest.raises(UnreadableImage):
        read_for_device(photos / "missing.jpg")


def test_device_decode_gives_pil_pixels_on_cpu_and_falls_back(photos):
    names = ["chelsea.jpg", "camera.jpg", "coffee_progressive.jpg", "chelsea_cmyk.jpg", "coffee.png"]
    items = [read_for_device(photos / name) for name in names]
    pixels, routes = decode_on_device(items, CPU)
    assert routes == ["device", "device", "device", "pil", "pil"]
    for name, value in zip(names, pixels, strict=True):
        # libjpeg-turbo behind both decoders on CPU: exactly PIL's pixels (nvJPEG's are not measured here)
        assert torch.equal(value, pil_pixels(photos / name)), name

    calls: list[int] = []

    def flaky(blobs: list[torch.Tensor], device: torch.device) -> list[torch.Tensor]:
        """A device decoder that refuses batches holding the greyscale file, and that file alone."""
        calls.append(len(blobs))
        if any(len(b) == len(items[1].jpeg) for b in blobs):
            raise RuntimeError("nvjpeg: unsupported")
        from torchvision.io import ImageReadMode, decode_jpeg

        return list(decode_jpeg(blobs, mode=ImageReadMode.RGB, device=device))

    pixels, routes = decode_on_device(items, CPU, decoder=flaky)
    assert calls == [3, 1, 1, 1] and routes == ["device", "pil", "device", "pil", "pil"]
    assert all(torch.equal(v, pil_pixels(photos / n)) for n, v in zip(names, pixels, strict=True))
    truncated = Decoded(jpeg=torch.frombuffer(bytearray((photos / "truncated.jpg").read_bytes()), dtype=torch.uint8))
    pixels, routes = decode_on_device([truncated], CPU, decoder=flaky)
    assert isinstance(pixels[0], UnreadableImage) and routes == ["pil"]


@pytest.mark.parametrize(
    "model, overrides",
    [
        ("test_resnet", {}),
        ("test_efficientnet", {}),
        ("test_resnet", {"interpolation": "bicubic", "crop_pct": 0.875}),
        ("test_resnet", {"crop_mode": "squash"}),
    ],
)
def test_tensor_preprocessing_is_within_one_grey_level_of_pil(photos, model, overrides):
    backbone = load_timm(model, pretrained=False, image_size=48, preprocessing=overrides)
    step = TensorPreprocess.of(backbone.preprocessing)
    assert step is not None
    # Both resample uint8 images with the same antialiased filters and round to uint8; they may differ by one level.
    bound = 1 / 255 / min(backbone.preprocessing["std"]) + 1e-6
    for name in ("chelsea.jpg", "camera.jpg", "astronaut.jpg"):
        image = load_rgb(photos / name)
        ours, reference = step(pil_pixels(photos / name)), backbone.transform(image)
        assert ours.shape == reference.shape == (3, 48, 48)
        assert float((ours - reference).abs().max()) <= bound


def test_tensor_preprocessing_refuses_what_it_cannot_express():
    base = {"input_size": [3, 32, 32], "mean": [0.5] * 3, "std": [0.5] * 3, "crop_pct": 0.9}
    assert TensorPreprocess.of({**base, "interpolation": "lanczos", "crop_mode": "center"}) is None
    assert TensorPreprocess.of({**base, "interpolation": "bicubic", "crop_mode": "border"}) is None
    clip = {"size": 32, "mean": [0.5] * 3, "std": [0.5] * 3, "interpolation": "bicubic"}
    assert TensorPreprocess.of({**clip, "resize_mode": "longest"}) is None
    assert TensorPreprocess.of({**clip, "resize_mode": "shortest"}) is not None
    assert TensorPreprocess.of({"size": {"shortest_edge": 224}, "resample": 3}) is None  # a transformers processor


def test_group_with_device_decode_on_cpu(photos, tmp_path, tiny_clip):
    from oodbench.extract.openclip import OpenClipBackbone, load_openclip

    dataset = image_folder(photos, labels=False)
    resnet = load_timm("test_resnet", pretrained=False, image_size=40)
    lanczos = load_timm(
        "test_efficientnet", pretrained=False, image_size=32, preprocessing={"interpolation": "lanczos"}
    )
    clip = OpenClipBackbone(load_openclip(tiny_clip, None, seed=2), patches=False)
    members = [GroupMember(resnet, None, 3), GroupMember(lanczos, None, 4), GroupMember(clip, None, 2)]
    device_store, pil_store = Store(tmp_path / "device"), Store(tmp_path / "pil")
    reports = extract_group(
        device_store, members, dataset, dataset_id="p", decode="device", num_workers=2, progress=False
    )
    extract_group(pil_store, members, dataset, dataset_id="p", decode="pil", num_workers=0, progress=False)
    # 7 JPEGs decode on the "device" (RGB, grey, progressive), CMYK and PNG through PIL, the truncated file nowhere
    assert reports[0].decode == {"device": 7, "pil": 2, "unreadable": 1}
    for report in reports:
        meta = device_store.meta(report.model_id, "p")
        assert meta["provenance"]["runtime"]["decode"].startswith("torchvision.io.decode_jpeg on cpu")
        assert [s["path"] for s in meta["skipped"]] == ["truncated.jpg"]
        assert "runtime" not in pil_store.meta(report.model_id, "p")["provenance"]
    # The lanczos model has no tensor form: it ran its own PIL transform on the same pixels, so it equals the PIL path
    a, b = device_store.read("test_efficientnet", "p"), pil_store.read("test_efficientnet", "p")
    np.testing.assert_array_equal(a.features, b.features)
    a, b = device_store.read("test_resnet", "p"), pil_store.read("test_resnet", "p")
    assert a.features.shape == b.features.shape and not np.array_equal(a.features, b.features)


def test_runtime_options_are_recorded_and_checked(tmp_path):
    assert runtime_provenance(CPU, amp=True) == {}
    assert runtime_provenance(CPU, amp=True, channels_last=True) == {"channels_last": True}
    assert resolved_amp_dtype(CPU, True) is None  # autocast is a GPU option: nothing runs in half precision on CPU
    with autocast_dtype("float16"):
        assert resolved_amp_dtype(torch.device("cuda"), True) == "float16"
        assert resolved_amp_dtype(torch.device("cuda"), False) is None
    assert resolve_decode("auto", CPU) == "pil" and resolve_decode("auto", torch.device("cuda")) == "device"
    from oodbench.cli.main import app

    images = tmp_path / "imgs"
    images.mkdir()
    for i in range(3):
        Image.fromarray(np.full((20, 24, 3), 40 * i, np.uint8)).save(images / f"{i}.jpg")
    common = ["extract", "--model", "test_resnet", "--no-pretrained", "--image-size", "32", "--data", str(images)]
    common += ["--workers", "0", "--no-progress", "--device", "cpu"]
    runner = CliRunner()
    for bad, message in (
        ("--decode=gpu", "--decode must be one of"),
        ("--amp-dtype=fp8", "--amp-dtype must be one of"),
    ):
        result = runner.invoke(app, [*common, "--store", str(tmp_path / "bad"), bad])
        assert result.exit_code == 2 and message in result.output, result.output
        assert not (tmp_path / "bad").exists()
    result = runner.invoke(app, [*common, "--store", str(tmp_path / "s"), "--channels-last", "--amp-dtype", "float16"])
    assert result.exit_code == 0, result.output
    provenance = json.loads((tmp_path / "s" / "test_resnet" / "imgs" / "meta.json").read_text())["provenance"]
    assert provenance["runtime"] == {"channels_last": True}
    result = runner.invoke(app, [*common, "--store", str(tmp_path / "r"), "--decode", "device", "--engine", "ray"])
    assert result.exit_code == 2 and "need --engine local" in result.output
