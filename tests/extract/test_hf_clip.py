"""The transformers image/text kind (hf_clip): same store contract as open_clip, on a tiny local CLIPModel."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from oodbench.cli.main import app
from oodbench.core.errors import ExtractError
from oodbench.core.store import Store
from oodbench.extract.hf_clip import check_hf_id, load_hf_clip
from oodbench.text.templates import SEED_TEMPLATES

from .helpers import write_images, write_tiny_hf_clip

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def tiny_hf(tmp_path_factory):
    return write_tiny_hf_clip(tmp_path_factory.mktemp("hf") / "tiny-clip")


def test_hub_ids_and_directories_are_told_apart(tiny_hf, tmp_path):
    assert check_hf_id("apple/aimv2-large-patch14-224-lit") == "hub"
    assert check_hf_id(str(tiny_hf)) == "local"
    with pytest.raises(ExtractError, match="neither a Hugging Face hub id"):
        check_hf_id("not a model id")
    with pytest.raises(ExtractError, match="without config.json"):
        check_hf_id(str(tmp_path))


def test_extract_stores_normalised_image_embeddings_and_text_embeddings(tiny_hf, tmp_path):
    from PIL import Image
    from transformers import AutoProcessor, CLIPModel

    images = write_images(tmp_path / "images", {"a": 3, "b": 2}, size=(40, 36))
    labels = tmp_path / "labels.txt"
    labels.write_text("cat\ntabby cat\nespresso\n")
    args = ["extract", "--model", str(tiny_hf), "--store", str(tmp_path / "store"), "--data", str(images)]
    result = CliRunner().invoke(app, [*args, "--text-labels", str(labels), "--workers", "0", "--no-progress"])
    assert result.exit_code == 0, result.output
    store = Store(tmp_path / "store")
    (model_id,) = store.models()
    assert model_id == "tiny-clip"
    outputs = store.read(model_id, "images")
    meta = store.meta(model_id, "images")
    assert meta["provenance"]["kind"] == "hf_clip"
    # Independent path: the full CLIPModel forward (image_embeds / text_embeds are its normalised projections).
    model = CLIPModel.from_pretrained(tiny_hf).eval()
    processor = AutoProcessor.from_pretrained(tiny_hf)
    pil = [Image.open(images / item).convert("RGB") for item in meta["items"]]
    texts = [template.format(name) for name in ("cat", "tabby cat", "espresso") for template in SEED_TEMPLATES]
    tokens = processor.tokenizer(texts, padding="max_length", max_length=32, truncation=True, return_tensors="pt")
    with torch.no_grad():
        pixels = processor.image_processor(images=pil, return_tensors="pt")["pixel_values"]
        forward = model(pixel_values=pixels, **tokens)
    # float32 throughout on CPU, same inputs; batch layout may change summation order: 1e-5 ≫ 100 · 1.2e-7.
    np.testing.assert_allclose(outputs.features, forward.image_embeds.numpy(), atol=1e-5)
    # A float32 row scaled to unit norm, its norm recomputed: ≤ (D + 3)·eps32/2 for the tiny model's D ≤ 16: ~1.1e-6.
    np.testing.assert_allclose(np.linalg.norm(outputs.features, axis=1), 1.0, atol=2e-6)
    per_template = forward.text_embeds.numpy().reshape(3, len(SEED_TEMPLATES), -1).mean(axis=1)
    expected_text = per_template / np.linalg.norm(per_template, axis=1, keepdims=True)
    (text_id,) = [d for d in store.datasets(model_id) if d.startswith("text-")]
    np.testing.assert_allclose(store.read(model_id, text_id).features, expected_text, atol=1e-5)  # as the images


def test_zero_shot_top1_from_the_cached_embeddings(tiny_hf, tmp_path):
    """`oodbench accuracy --zero-shot` predicts the class whose cached text embedding is closest."""
    from oodbench.evaluation.accuracy import read_accuracy

    images = write_images(tmp_path / "images", {"a": 3, "b": 3}, size=(40, 36))
    classes = tmp_path / "classes.txt"
    classes.write_text("apple\nbanana\n")
    store_dir = tmp_path / "store"
    args = ["extract", "--model", str(tiny_hf), "--store", str(store_dir), "--data", str(images)]
    result = CliRunner().invoke(app, [*args, "--text-labels", str(classes), "--workers", "0", "--no-progress"])
    assert result.exit_code == 0, result.output
    run = tmp_path / "run"
    args = ["accuracy", "--store", str(store_dir), "--model-id", "tiny-clip", "--dataset", "images", "--no-real"]
    result = CliRunner().invoke(app, [*args, "--zero-shot", "--classes", str(classes), "--run-dir", str(run)])
    assert result.exit_code == 0, result.output
    store = Store(store_dir)
    outputs = store.read("tiny-clip", "images")
    (text_id,) = [d for d in store.datasets("tiny-clip") if d.startswith("text-")]
    predicted = (outputs.features @ store.read("tiny-clip", text_id).features.T).argmax(axis=1)
    (row,) = read_accuracy(run)["rows"]
    assert row["labels"] == "original" and row["n"] == 6
    assert row["top1"] == pytest.approx(float((predicted == outputs.labels).mean()), abs=1e-12)


def test_missing_hub_model_offline_is_one_line(tmp_path):
    result = CliRunner().invoke(
        app,
        ["extract", "--model", "apple/not-a-cached-model", "--store", str(tmp_path), "--data", str(tmp_path)],
    )
    assert result.exit_code == 2
    assert "cannot load apple/not-a-cached-model with transformers offline" in " ".join(result.output.split())
    assert "Traceback" not in result.output


def test_random_init_is_seeded(tiny_hf):
    a, b = load_hf_clip(str(tiny_hf), pretrained=False, seed=1), load_hf_clip(str(tiny_hf), pretrained=False, seed=1)
    trained = load_hf_clip(str(tiny_hf))
    weight = "text_projection.weight"
    assert torch.equal(a.model.state_dict()[weight], b.model.state_dict()[weight])
    assert not torch.equal(a.model.state_dict()[weight], trained.model.state_dict()[weight])
    assert a.checkpoint == "random-init:seed=1" and trained.checkpoint.startswith("hf-dir:")
