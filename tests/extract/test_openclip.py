"""open_clip: image embeddings, value-branch patch embeddings (= diagonal attention mask), text templates, caching."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F
import typer
from typer.testing import CliRunner

from oodbench import Store
from oodbench.core.errors import ExtractError
from oodbench.extract.cli import register
from oodbench.extract.openclip import (
    OpenClipBackbone,
    TextEmbeddingsMissing,
    cached_text_embeddings,
    image_and_patch_embeddings,
    load_openclip,
    quickgelu_mismatch,
    text_dataset_id,
    text_embeddings,
)
from oodbench.text.templates import SEED_TEMPLATES


@pytest.fixture(scope="module")
def bundle(tiny_clip):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return load_openclip(tiny_clip, None, seed=0)


def _diagonal_mask_patches(model, pixels):
    """Independent formulation: run every block, the last one with attention restricted to each token itself."""
    visual = model.visual
    x = visual._embeds(pixels)
    blocks = visual.transformer.resblocks
    for block in blocks[:-1]:
        x = block(x)
    length = x.shape[1]
    mask = torch.full((length, length), float("-inf"))
    mask.fill_diagonal_(0.0)
    x = blocks[-1](x, attn_mask=mask)
    return F.normalize((visual.ln_post(x[:, 1:]) @ visual.proj).float(), dim=-1)


def test_value_branch_equals_diagonal_attention_exactly(bundle):
    torch.manual_seed(0)
    pixels = torch.randn(3, 3, 32, 32)
    with torch.no_grad():
        image, patches = image_and_patch_embeddings(bundle.model, pixels)
        reference = _diagonal_mask_patches(bundle.model, pixels)
        encoded = F.normalize(bundle.model.encode_image(pixels).float(), dim=-1)
    assert patches.shape == (3, 16, 16)  # (32 / 8)² patches, embed_dim 16
    assert torch.equal(patches, reference)
    assert torch.equal(image, encoded)
    # Not the same as the ordinary last block: the value path is a different computation.
    with torch.no_grad():
        x = bundle.model.visual._embeds(pixels)
        ordinary = bundle.model.visual.transformer(x)
        ordinary = F.normalize(bundle.model.visual.ln_post(ordinary[:, 1:]) @ bundle.model.visual.proj, dim=-1)
    assert not torch.allclose(ordinary, patches)


def test_backbone_stores_normalised_fp32_images_and_fp16_patches(bundle):
    backbone = OpenClipBackbone(bundle)
    arrays = backbone.infer(torch.randn(2, 3, 32, 32))
    assert arrays["features"].dtype == np.float32 and arrays["features"].shape == (2, 16)
    # A float32 unit row of D = 16, its norm recomputed: ≤ (D + 3)·eps32/2 ≈ 1.1e-6.
    np.testing.assert_allclose(np.linalg.norm(arrays["features"], axis=1), 1.0, rtol=2e-6)
    patches = arrays["extra.patch_embeddings"]
    assert patches.dtype == np.float16 and patches.shape == (2, 16, 16)
    # Unit rows stored as float16: each entry rounds by ≤ 2^-11 relative, so the norm by ≤ 2^-11 ≈ 4.9e-4 (+ the
    # float32 recomputation); 2e-3 is 4 times that.
    np.testing.assert_allclose(np.linalg.norm(patches.astype(np.float32), axis=2), 1.0, atol=2e-3)
    prov = backbone.provenance()
    assert prov["kind"] == "open_clip" and prov["checkpoint"] == "random-init:seed=0"
    assert prov["preprocessing"]["size"] == [32, 32]
    assert "fp16" in prov["patch_embeddings"]
    assert backbone.head() is None
    assert set(OpenClipBackbone(bundle, patches=False).infer(torch.randn(1, 3, 32, 32))) == {"features"}


def test_text_embeddings_average_normalised_templates(bundle):
    labels = ["goldfish", "great white shark", "tree frog"]
    embeddings = text_embeddings(bundle, labels, batch_size=5)  # forces several forward passes
    assert embeddings.shape == (3, 16) and embeddings.dtype == np.float32
    tokenizer, model = bundle.tokenizer, bundle.model
    for row, label in enumerate(labels):
        with torch.no_grad():
            per_template = [
                F.normalize(model.encode_text(tokenizer([t.format(label)])).float(), dim=-1)[0] for t in SEED_TEMPLATES
            ]
        mean = torch.stack(per_template).mean(dim=0)
        # Same float32 text tower, batched (5 prompts) vs one prompt: other summation orders in D = 16-wide layers,
        # ≲ 1e-6 on unit vectors; the mean of 7 and its normalisation add a few eps32.
        np.testing.assert_allclose(embeddings[row], (mean / mean.norm()).numpy(), rtol=1e-5, atol=1e-6)
    single = text_embeddings(bundle, labels, templates=["a photo of a {}."])
    assert not np.allclose(single, embeddings)
    with pytest.raises(ExtractError, match="exactly once"):
        text_embeddings(bundle, labels, templates=["no slot"])


def test_text_embeddings_are_cached_per_labels_and_templates(bundle, tmp_path):
    store = Store(tmp_path / "store")
    labels = ["cat", "dog"]
    first = cached_text_embeddings(store, "tiny", labels, model_bundle=bundle)
    dataset_id = text_dataset_id(labels, SEED_TEMPLATES)
    assert dataset_id.startswith("text-") and len(dataset_id) == 21
    meta = store.meta("tiny", dataset_id)
    assert meta["labels"] == labels and meta["templates"] == list(SEED_TEMPLATES)
    assert meta["provenance"]["model"] == bundle.model_name
    again = cached_text_embeddings(store, "tiny", labels)  # no model needed any more
    np.testing.assert_array_equal(first, again)
    assert text_dataset_id(["dog", "cat"]) != dataset_id
    with pytest.raises(TextEmbeddingsMissing, match="no cached text embeddings") as info:
        cached_text_embeddings(store, "tiny", ["dog", "cat"])
    assert isinstance(info.value, ExtractError)


def test_a_long_label_list_is_cached_in_shards_and_an_interrupted_call_resumes(bundle, tmp_path, monkeypatch):
    import oodbench.extract.openclip as openclip

    monkeypatch.setattr(openclip, "TEXT_SHARD", 4)  # 4 labels a shard (4,096 in use): 11 labels are 3 shards
    labels = [f"thing {i}" for i in range(11)]
    whole = cached_text_embeddings(Store(tmp_path / "a"), "tiny", labels, model_bundle=bundle, batch_size=16)

    encoded: list[list[str]] = []
    original = openclip.text_embeddings

    def killed_after_one_shard(model_bundle, block, *args, **kwargs):
        if encoded:
            raise KeyboardInterrupt  # as a kill would stop it: the first shard is on disk, the rest is not
        encoded.append(list(block))
        return original(model_bundle, block, *args, **kwargs)

    store = Store(tmp_path / "b")
    monkeypatch.setattr(openclip, "text_embeddings", killed_after_one_shard)
    with pytest.raises(KeyboardInterrupt):
        cached_text_embeddings(store, "tiny", labels, model_bundle=bundle, batch_size=16)
    assert encoded == [labels[:4]] and not store.exists("tiny", text_dataset_id(labels))

    def counted(model_bundle, block, *args, **kwargs):
        encoded.append(list(block))
        return original(model_bundle, block, *args, **kwargs)

    monkeypatch.setattr(openclip, "text_embeddings", counted)
    lines: list[str] = []
    resumed = cached_text_embeddings(store, "tiny", labels, model_bundle=bundle, batch_size=16, report=lines.append)
    assert encoded[1:] == [labels[4:8], labels[8:]]  # the first shard was kept, not encoded again
    assert lines[-1].startswith("text embeddings tiny/text-") and "11 / 11 labels (2 of 2 shards this run" in lines[-1]
    # 16 texts a forward pass are 2 labels × 8 templates: shards of 4 labels hold whole passes, so the bytes agree
    assert resumed.tobytes() == whole.tobytes()
    assert store.meta("tiny", text_dataset_id(labels))["num_shards"] == 3


def test_quickgelu_mismatch_is_detected(tiny_clip):
    assert "QuickGELU mismatch" in quickgelu_mismatch("ViT-B-16", "openai")
    assert "ViT-B-16-quickgelu" in quickgelu_mismatch("ViT-B-16", "openai")
    assert quickgelu_mismatch("ViT-B-16-quickgelu", "openai") is None
    assert quickgelu_mismatch(tiny_clip, None) is None


def test_unknown_model_and_tag(tiny_clip):
    with pytest.raises(ExtractError, match="unknown open_clip model"):
        load_openclip("ViT-Nope-1", None)
    with pytest.raises(ExtractError, match="neither a pretrained tag"):
        load_openclip(tiny_clip, "no_such_tag")


def test_cli_extracts_images_and_text(tiny_clip, image_dir, tmp_path):
    labels = tmp_path / "labels.txt"
    labels.write_text("cat\ndog\n")
    app = typer.Typer()
    register(app)
    result = CliRunner().invoke(
        app,
        [
            "extract",
            "--model",
            tiny_clip,
            "--no-pretrained",
            "--store",
            str(tmp_path / "store"),
            "--data",
            str(image_dir),
            "--dataset-id",
            "pets",
            "--workers",
            "0",
            "--batch-size",
            "4",
            "--no-progress",
            "--text-labels",
            str(labels),
        ],
    )
    assert result.exit_code == 0, result.output
    store = Store(tmp_path / "store")
    out = store.read(tiny_clip, "pets")
    assert out.features.shape == (9, 16) and out.logits is None
    assert out.extras["patch_embeddings"].shape == (9, 16, 16)
    assert out.labels.tolist() == [0] * 5 + [1] * 4
    assert [s["path"] for s in store.meta(tiny_clip, "pets")["skipped"]] == ["dog/broken.png"]
    text = cached_text_embeddings(store, tiny_clip, ["cat", "dog"])
    assert text.shape == (2, 16)
    store.check_compatible((tiny_clip, "pets"), (tiny_clip, text_dataset_id(["cat", "dog"])))
