"""Value-branch patch embeddings for each tower type, against an independent re-implementation of the second pass.

Each tower is a tiny random-weight model of the kind the Fi-ImageNet-1k VLMs use (Table A8): a SigLIP-like open_clip
tower on a timm ViT trunk with an attention-pooling ("map") head, a PE-Core-like one on a timm EVA trunk with rotary
attention, a class token and layer scales, and a transformers AIMv2 model. Every parameter is perturbed away from its
initialisation (zero biases and unit norms would hide a missed term). The references below compute the last block
with its attention output replaced by its value branch, and the route to the joint space, from the weights with plain
tensor operations; they share with the code under test only the ordinary forward of the blocks before the last.

Tolerances: every value is a float32 chain of a few layers of width ≤ 128 on unit-scale inputs; each dot product has
relative error ≤ n·u ≈ 128 · 6e-8 < 1e-5, so unit-norm outputs agree to 1e-5 per layer, 1e-4 over the chain.
"""

from __future__ import annotations

import json
from functools import partial

import pytest
import torch
import torch.nn.functional as F

from oodbench.core.errors import ExtractError
from oodbench.extract.patches import (
    ROUTES,
    image_and_patch_embeddings,
    open_clip_config_route,
    patch_route,
    unsupported_reason,
)

open_clip = pytest.importorskip("open_clip")
timm = pytest.importorskip("timm")

ATOL = 1e-4
TEXT_CFG = {"context_length": 77, "vocab_size": 49408, "width": 32, "heads": 2, "layers": 1}


def _tiny_siglip_trunk(pretrained: bool = False, **kwargs):
    from timm.models.vision_transformer import VisionTransformer

    args = dict(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, class_token=False, global_pool="map")
    kwargs = {k: v for k, v in kwargs.items() if k not in ("pretrained_cfg", "pretrained_cfg_overlay", "cache_dir")}
    return VisionTransformer(**{**args, **kwargs})


def _tiny_pe_trunk(pretrained: bool = False, **kwargs):
    from timm.layers import LayerNorm
    from timm.models.eva import Eva

    args = dict(
        img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, mlp_ratio=4.0, global_pool="map",
        attn_type="rope", use_pre_transformer_norm=True, use_rot_pos_emb=True, ref_feat_shape=(4, 4),
        rope_grid_offset=1.0, rope_grid_indexing="xy", attn_pool_num_heads=2, attn_pool_mlp_ratio=4.0,
        norm_layer=partial(LayerNorm, eps=1e-5), init_values=0.5,
    )  # fmt: skip
    kwargs = {k: v for k, v in kwargs.items() if k not in ("pretrained_cfg", "pretrained_cfg_overlay", "cache_dir")}
    return Eva(**{**args, **kwargs})


def _register(tmp_path_factory, name: str, trunk, vision: dict) -> str:
    from timm.models import register_model

    if not timm.is_model(trunk.__name__):
        register_model(trunk)
    embed_dim = vision.pop("embed_dim")
    if name not in open_clip.list_models():
        folder = tmp_path_factory.mktemp(name)
        config = {"vision_cfg": {"image_size": 32, "timm_model_name": trunk.__name__, **vision}, "text_cfg": TEXT_CFG}
        (folder / f"{name}.json").write_text(json.dumps({"embed_dim": embed_dim, **config}))
        open_clip.add_model_config(folder / f"{name}.json")
    return name


def _perturbed(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.2 * torch.randn(parameter.shape, generator=generator))
    return model.eval()


@pytest.fixture(scope="module")
def siglip(tmp_path_factory):
    _tiny_siglip_trunk.__name__ = "oodbench_tiny_siglip_trunk"
    name = _register(
        tmp_path_factory,
        "oodbench-tiny-siglip",
        _tiny_siglip_trunk,
        {"embed_dim": 32, "timm_model_pretrained": False, "timm_pool": "map", "timm_proj": "none"},
    )
    torch.manual_seed(0)
    return _perturbed(open_clip.create_model(name), 1)


@pytest.fixture(scope="module")
def pe_core(tmp_path_factory):
    _tiny_pe_trunk.__name__ = "oodbench_tiny_pe_trunk"
    name = _register(
        tmp_path_factory,
        "oodbench-tiny-pe",
        _tiny_pe_trunk,
        {"embed_dim": 16, "timm_model_pretrained": False, "timm_pool": "map", "timm_proj": None},
    )
    torch.manual_seed(0)
    return _perturbed(open_clip.create_model(name), 2)


@pytest.fixture(scope="module")
def aimv2():
    transformers = pytest.importorskip("transformers")
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2)
    vision.update(image_size=32, patch_size=8, qkv_bias=True, use_head=True)
    text = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2)
    text.update(max_position_embeddings=16, eos_token_id=1)
    config = transformers.Aimv2Config(vision_config=vision, text_config=text, projection_dim=16)
    torch.manual_seed(0)
    return _perturbed(transformers.Aimv2Model(config), 3)


def _pixels(seed: int = 0) -> torch.Tensor:
    return torch.randn(3, 3, 32, 32, generator=torch.Generator().manual_seed(seed))


# ----------------------------------------------------------------------------------------------- references
def _ln(x, module):
    return F.layer_norm(x, (x.shape[-1],), module.weight, module.bias, module.eps)


def _rms(x, module):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + module.variance_epsilon) * module.weight


def _gelu_mlp(x, mlp):
    assert isinstance(mlp.act, torch.nn.GELU) and mlp.act.approximate == "none"
    return F.linear(F.gelu(F.linear(x, mlp.fc1.weight, mlp.fc1.bias)), mlp.fc2.weight, mlp.fc2.bias)


def _pool_one(tokens, pool):
    """timm's attention pool over one token: softmax of one key is 1, so the latent query drops out."""
    width = tokens.shape[-1]
    value = F.linear(tokens, pool.kv.weight[width:], pool.kv.bias[width:])  # kv splits [k | v]
    out = F.linear(value, pool.proj.weight, pool.proj.bias)
    return out + _gelu_mlp(_ln(out, pool.norm), pool.mlp)


def _pool_all(tokens, pool):
    """timm's attention pool over all tokens with its latent query (to check the reference reads the weights right)."""
    batch, count, width = tokens.shape
    heads, dim = pool.num_heads, width // pool.num_heads
    query = F.linear(pool.latent, pool.q.weight, pool.q.bias).reshape(1, heads, dim)
    kv = F.linear(tokens, pool.kv.weight, pool.kv.bias).reshape(batch, count, 2, heads, dim)
    weights = torch.einsum("hd,bnhd->bhn", query[0], kv[:, :, 0]) / dim**0.5
    mixed = torch.einsum("bhn,bnhd->bhd", weights.softmax(-1), kv[:, :, 1]).reshape(batch, width)
    out = F.linear(mixed, pool.proj.weight, pool.proj.bias)
    return out + _gelu_mlp(_ln(out, pool.norm), pool.mlp)


def _timm_reference(model, pixels):
    """Second pass of a timm 'map' tower from its weights: value-branch last block, norm, each patch pooled alone."""
    visual = model.visual
    trunk = visual.trunk
    x = trunk.patch_embed(pixels)
    rope = None
    if hasattr(trunk, "rope"):  # EVA: rotary embeddings for the blocks before the last
        x, rope = trunk._pos_embed(x)
    else:
        x = trunk._pos_embed(x)
    x = trunk.norm_pre(x)
    for block in trunk.blocks[:-1]:
        x = block(x, rope=rope) if rope is not None else block(x)
    last = trunk.blocks[-1]
    width = x.shape[-1]
    qkv = last.attn.qkv
    value = F.linear(_ln(x, last.norm1), qkv.weight[2 * width :], None if qkv.bias is None else qkv.bias[2 * width :])
    mixed = F.linear(value, last.attn.proj.weight, last.attn.proj.bias)
    gamma_1 = getattr(last, "gamma_1", None)
    x = x + (mixed if gamma_1 is None else gamma_1 * mixed)
    mlp = _gelu_mlp(_ln(x, last.norm2), last.mlp)
    gamma_2 = getattr(last, "gamma_2", None)
    x = x + (mlp if gamma_2 is None else gamma_2 * mlp)
    tokens = _ln(x, trunk.norm)[:, trunk.num_prefix_tokens :]
    pooled = _pool_one(tokens, trunk.attn_pool)
    if isinstance(trunk.head, torch.nn.Linear):
        pooled = F.linear(pooled, trunk.head.weight, trunk.head.bias)
    return F.normalize(pooled, dim=-1)


def _timm_image_reference(model, pixels):
    trunk = model.visual.trunk
    pooled = _pool_all(trunk.forward_features(pixels), trunk.attn_pool)
    if isinstance(trunk.head, torch.nn.Linear):
        pooled = F.linear(pooled, trunk.head.weight, trunk.head.bias)
    return F.normalize(pooled, dim=-1)


def _aimv2_reference(model, pixels):
    """Second pass of AIMv2 from its weights: value-branch last layer, final RMS norm, each patch pooled alone."""
    vision = model.vision_model
    x = vision.embeddings(pixels)
    for layer in vision.encoder.layers[:-1]:
        x = layer(x, None)
    last = vision.encoder.layers[-1]
    attention = last.attention
    value = F.linear(_rms(x, last.rms_norm1), attention.v_proj.weight, attention.v_proj.bias)
    x = x + F.linear(value, attention.out_proj.weight, attention.out_proj.bias)
    h = _rms(x, last.rms_norm2)
    ffn = last.ffn
    x = x + F.linear(F.silu(F.linear(h, ffn.gate_proj.weight)) * F.linear(h, ffn.up_proj.weight), ffn.down_proj.weight)
    tokens = _rms(x, vision.rms_norm)
    head = vision.head
    pooled = F.linear(
        F.linear(tokens, head.v_proj.weight, head.v_proj.bias), head.output_proj.weight, head.output_proj.bias
    )
    return F.normalize(F.linear(pooled, model.visual_projection.weight), dim=-1)


def _aimv2_image(model, pixels):
    from oodbench.extract.hf_clip import _embedding

    return _embedding(model.get_image_features(pixel_values=pixels))


# ----------------------------------------------------------------------------------------------- tests
def test_siglip_like_timm_tower_matches_the_reference(siglip):
    pixels = _pixels()
    assert patch_route(siglip) == "timm-attention-pool"
    with torch.no_grad():
        image, local = image_and_patch_embeddings(siglip, pixels)
        assert local.shape == (3, 16, 32)  # (32 / 8)² patches, no prefix token, joint width 32
        torch.testing.assert_close(local, _timm_reference(siglip, pixels), atol=ATOL, rtol=0)
        # The pooled image embedding is the ordinary one, and the reference reads the pooling head's weights right.
        torch.testing.assert_close(image, F.normalize(siglip.encode_image(pixels), dim=-1), atol=0, rtol=0)
        torch.testing.assert_close(image, _timm_image_reference(siglip, pixels), atol=ATOL, rtol=0)


def test_siglip_like_value_branch_equals_a_diagonal_attention_mask(siglip):
    """The library's own last block under a diagonal mask gives the same tokens: the value branch is that attention."""
    trunk = siglip.visual.trunk
    pixels = _pixels(1)
    with torch.no_grad():
        _, local = image_and_patch_embeddings(siglip, pixels)
        x = trunk.norm_pre(trunk._pos_embed(trunk.patch_embed(pixels)))
        for block in trunk.blocks[:-1]:
            x = block(x)
        mask = torch.full((x.shape[1], x.shape[1]), float("-inf"))
        mask.fill_diagonal_(0.0)
        tokens = trunk.norm(trunk.blocks[-1](x, attn_mask=mask))
        pooled = trunk.attn_pool(tokens.reshape(-1, 1, tokens.shape[-1])).reshape(3, 16, -1)
        torch.testing.assert_close(local, F.normalize(pooled, dim=-1), atol=ATOL, rtol=0)
        # ... and differs from the ordinary last block's tokens pooled one by one.
        ordinary = trunk.norm(trunk.blocks[-1](x))
        ordinary = F.normalize(trunk.attn_pool(ordinary.reshape(-1, 1, ordinary.shape[-1])).reshape(3, 16, -1), dim=-1)
        assert (ordinary - local).abs().max() > 0.05


def test_pe_core_like_rope_tower_with_class_token_and_layer_scale(pe_core):
    pixels = _pixels(2)
    trunk = pe_core.visual.trunk
    assert trunk.num_prefix_tokens == 1 and type(trunk.blocks[-1].attn).__name__ == "AttentionRope"
    with torch.no_grad():
        image, local = image_and_patch_embeddings(pe_core, pixels)
        assert local.shape == (3, 16, 16)  # class token dropped; trunk head 32 -> 16
        torch.testing.assert_close(local, _timm_reference(pe_core, pixels), atol=ATOL, rtol=0)
        torch.testing.assert_close(image, F.normalize(pe_core.encode_image(pixels), dim=-1), atol=0, rtol=0)
        torch.testing.assert_close(image, _timm_image_reference(pe_core, pixels), atol=ATOL, rtol=0)


def test_aimv2_tower_matches_the_reference(aimv2):
    pixels = _pixels(3)
    assert patch_route(aimv2) == "aimv2"
    with torch.no_grad():
        image, local = image_and_patch_embeddings(aimv2, pixels, encode=lambda p: _aimv2_image(aimv2, p))
        assert local.shape == (3, 16, 16)
        torch.testing.assert_close(local, _aimv2_reference(aimv2, pixels), atol=ATOL, rtol=0)
        torch.testing.assert_close(image, F.normalize(_aimv2_image(aimv2, pixels), dim=-1), atol=0, rtol=0)


def test_routes_from_the_configs_of_the_paper_towers():
    """Without weights, the plan knows each Table A8 open_clip architecture's route from its config."""
    expected = {
        "ViT-H-14-worldwide-378": "open_clip-vit",
        "ViT-H-14-378-quickgelu": "open_clip-vit",
        "ViT-B-16-quickgelu": "open_clip-vit",
        "ViT-L-14-336-quickgelu": "open_clip-vit",
        "ViT-SO400M-14-SigLIP-384": "timm-attention-pool",
        "ViT-gopt-16-SigLIP2-384": "timm-attention-pool",
        "PE-Core-L-14-336": "timm-attention-pool",
    }
    for name, route in expected.items():
        assert open_clip_config_route(name) == (route, ROUTES[route]), name
    assert open_clip_config_route("coca_ViT-B-32")[0] is None


def test_other_towers_are_refused_in_one_line(tmp_path):
    model = open_clip.create_model("RN50")
    reason = unsupported_reason(model)
    assert reason is not None and "\n" not in reason
    with pytest.raises(ExtractError, match="no patch embeddings"):
        image_and_patch_embeddings(model, torch.randn(1, 3, 224, 224))


def test_aimv2_directory_extracts_patch_embeddings_end_to_end(tmp_path):
    """`oodbench extract` on a saved AIMv2 stores fp16 patch embeddings equal to the second pass on its pixels."""
    pytest.importorskip("transformers")
    import numpy as np
    from typer.testing import CliRunner

    from oodbench.cli.main import app
    from oodbench.core.store import Store
    from oodbench.extract.hf_clip import load_hf_clip

    from .helpers import write_images, write_tiny_aimv2

    folder = write_tiny_aimv2(tmp_path / "tiny-aimv2")
    images = write_images(tmp_path / "images", {"a": 3, "b": 2}, size=(40, 36))
    args = ["extract", "--model", str(folder), "--store", str(tmp_path / "store"), "--data", str(images)]
    result = CliRunner().invoke(app, [*args, "--patches", "--workers", "0", "--no-progress", "--no-amp"])
    assert result.exit_code == 0, result.output
    store = Store(tmp_path / "store")
    outputs = store.read("tiny-aimv2", "images")
    meta = store.meta("tiny-aimv2", "images")
    assert meta["provenance"]["patch_route"] == "aimv2"
    local = outputs.extras["patch_embeddings"]
    assert local.dtype == np.float16 and local.shape == (5, 16, 16)
    bundle = load_hf_clip(str(folder))
    from PIL import Image

    pil = [Image.open(images / item).convert("RGB") for item in meta["items"]]
    pixels = bundle.processor.image_processor(images=pil, return_tensors="pt")["pixel_values"]
    with torch.no_grad():
        reference = _aimv2_reference(bundle.model, pixels).numpy()
    # fp16 storage of unit vectors: rounding a value ≤ 1 moves it by at most half of fp16's spacing below 1 (2⁻¹¹),
    # 2⁻¹² ≈ 2.4e-4.
    np.testing.assert_allclose(local.astype(np.float32), reference, atol=2.5e-4 + ATOL)


def test_open_clip_backbone_stores_timm_route_patches_in_fp16(siglip):
    """The extraction backbone of a SigLIP-like tower stores its patches (fp16) and names the route in provenance."""
    import numpy as np

    from oodbench.extract.openclip import OpenClipBackbone, OpenClipBundle

    bundle = OpenClipBundle(siglip, lambda image: image, lambda texts: texts, "oodbench-tiny-siglip", None, "random")
    backbone = OpenClipBackbone(bundle)
    assert backbone.patches and backbone.provenance()["patch_route"] == "timm-attention-pool"
    pixels = _pixels(4)
    arrays = backbone.infer(pixels, amp=False)
    with torch.no_grad():
        expected = _timm_reference(siglip, pixels).numpy()
    assert arrays["extra.patch_embeddings"].dtype == np.float16
    # fp16 storage of unit vectors: rounding a value ≤ 1 moves it by at most half of fp16's spacing below 1 (2⁻¹¹),
    # 2⁻¹² ≈ 2.4e-4.
    np.testing.assert_allclose(arrays["extra.patch_embeddings"].astype(np.float32), expected, atol=2.5e-4 + ATOL)
    assert not OpenClipBackbone(bundle, patches=False).provenance().get("patch_route")
