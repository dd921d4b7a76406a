"""Value-branch patch embeddings (GL-MCM's local features) for every vision-language image tower oodbench loads.

GL-MCM needs one joint-space embedding per image patch. Following the Fi-ImageNet-1k paper (Appendix F, "Zero-shot
scoring"), they come from a second pass through the tower's **last block with its attention output replaced by its
value branch**: out-projection of the value projection of each token itself (attention under a diagonal mask),
keeping everything else the block does (pre-norms, layer scales, residuals, MLP). The blocks before it are the ordinary
forward's, so the second pass re-runs the last block only, on the input the ordinary forward gave it.

How the resulting tokens reach the joint space depends on the tower (`ROUTES`, shown in provenance and the dry run):

- ``open_clip-vit`` (CLIP, MetaCLIP 2, DFN OpenCLIP): the class token is dropped, each patch token goes through
  ``ln_post`` and the projection matrix ``proj``, as the class token does for the image embedding.
- ``timm-attention-pool`` (SigLIP, SigLIP 2, PE-Core: open_clip towers whose trunk is a timm ViT/EVA with a
  multi-head attention-pooling head, "map"): the trunk's final norm, the prefix (class/register) tokens dropped, then
  the pooling head applied to **each patch token alone** — a one-token sequence, so the latent query's softmax is 1
  and the head computes out-proj(v(token)) followed by its own norm + MLP residual — then the trunk's ``fc_norm`` and
  ``head`` and open_clip's adapter head, exactly the layers the pooled image embedding passes through.
- ``aimv2`` (transformers AIMv2 LiT): the vision model's final RMS norm, the attention-pooling head applied to each
  patch token alone (out-proj(v(token)); AIMv2 has no class token), then ``visual_projection``.

The pooled image embedding is always the ordinary forward's, unchanged. Any other tower is refused with one line
(`unsupported_reason`), never approximated.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from ..core.errors import ExtractError
from .backbones.base import Backbone, autocast

__all__ = [
    "ROUTES",
    "patch_route",
    "unsupported_reason",
    "image_and_patch_embeddings",
    "value_branch_block",
    "open_clip_config_route",
    "VisionLanguageBackbone",
]

ROUTES: dict[str, str] = {
    "open_clip-vit": "last block with value-branch attention; patch tokens (class token dropped) -> ln_post -> proj",
    "timm-attention-pool": (
        "last block with value-branch attention; trunk norm; patch tokens (prefix tokens dropped) each pooled alone "
        "by the attention-pool head (out-proj(v) + norm/MLP residual) -> fc_norm -> head -> open_clip head"
    ),
    "aimv2": (
        "last block with value-branch attention; final RMS norm; patch tokens each pooled alone by the "
        "attention-pool head (out-proj(v)) -> visual_projection"
    ),
}


# ----------------------------------------------------------------------------------------------- which tower
def _timm_attention_types() -> tuple[type, ...]:
    from timm.layers import Attention
    from timm.layers.attention import AttentionRope
    from timm.models.eva import EvaAttention

    return Attention, AttentionRope, EvaAttention


def unsupported_reason(model: torch.nn.Module) -> str | None:
    """None when `model`'s image tower has value-branch patch embeddings here; else why not, in one line."""
    visual = getattr(model, "visual", None)
    if visual is not None:
        from open_clip.timm_model import TimmModel
        from open_clip.transformer import VisionTransformer

        if isinstance(visual, VisionTransformer):
            if visual.attn_pool is not None:
                return (
                    "an open_clip ViT with an attentional pooler (CoCa-style) has no per-patch route to the joint space"
                )
            if visual.proj is None:
                return "an open_clip ViT without a projection matrix has no joint space"
            return None
        if isinstance(visual, TimmModel):
            trunk = visual.trunk
            pool = getattr(trunk, "attn_pool", None)
            if pool is None:
                return f"the timm trunk {type(trunk).__name__} has no attention-pooling head (only 'map' towers are supported)"
            if getattr(pool, "pos_embed", None) is not None or getattr(pool, "latent_len", 1) != 1:
                return "the trunk's attention pool has position embeddings or several latents; a token cannot be pooled alone"
            blocks = getattr(trunk, "blocks", None)
            if not blocks or not isinstance(getattr(blocks[-1], "attn", None), _timm_attention_types()):
                return f"the last block of {type(trunk).__name__} has no timm Attention, AttentionRope or EvaAttention module"
            return None
        return f"image tower {type(visual).__name__} has no patch tokens"
    vision = getattr(model, "vision_model", None)
    if vision is not None and type(model).__name__ == "Aimv2Model":
        if not getattr(vision, "use_head", False):
            return "an AIMv2 vision model without its attention-pooling head has no joint-space route for patches"
        return None
    return (
        f"{type(model).__name__} is not a tower with value-branch patch embeddings (open_clip ViT, timm 'map', AIMv2)"
    )


def patch_route(model: torch.nn.Module) -> str | None:
    """The `ROUTES` key of the model's image tower, or None when it has no patch embeddings here."""
    if unsupported_reason(model) is not None:
        return None
    visual = getattr(model, "visual", None)
    if visual is None:
        return "aimv2"
    from open_clip.timm_model import TimmModel

    return "timm-attention-pool" if isinstance(visual, TimmModel) else "open_clip-vit"


def open_clip_config_route(model_name: str) -> tuple[str | None, str]:
    """(route, reason) of an open_clip architecture from its config alone (no weights): for the plan."""
    import open_clip

    config = open_clip.get_model_config(model_name) or {}
    vision = config.get("vision_cfg", {})
    if vision.get("timm_model_name"):
        if vision.get("timm_pool") == "map":
            return "timm-attention-pool", ROUTES["timm-attention-pool"]
        return None, f"timm trunk {vision['timm_model_name']} pools with {vision.get('timm_pool')!r}, not 'map'"
    if vision.get("attentional_pool") or vision.get("layers") is None:
        return None, f"{model_name}'s image tower is not a plain ViT"
    return "open_clip-vit", ROUTES["open_clip-vit"]


# ----------------------------------------------------------------------------------------------- value branches
def value_branch_block(block: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """One open_clip residual block with attention replaced by its value path (≡ attention under a diagonal mask)."""
    from open_clip.transformer import Attention

    y = block.ln_1(x)
    attention = block.attn
    if isinstance(attention, torch.nn.MultiheadAttention):
        if attention._qkv_same_embed_dim:
            # The full in-projection then a slice, exactly as attention computes v (so results match bit for bit).
            value = F.linear(y, attention.in_proj_weight, attention.in_proj_bias).chunk(3, dim=-1)[2]
        else:
            bias = None if attention.in_proj_bias is None else attention.in_proj_bias.chunk(3)[2]
            value = F.linear(y, attention.v_proj_weight, bias)
        mixed = attention.out_proj(value)
    elif isinstance(attention, Attention):
        value = F.linear(y, attention.in_proj_weight, attention.in_proj_bias).chunk(3, dim=-1)[2]
        if attention.head_scale is not None:
            shape = value.shape
            value = value.reshape(*shape[:-1], attention.num_heads, -1).transpose(-2, -3) * attention.head_scale
            value = value.transpose(-2, -3).reshape(shape)
        mixed = attention.out_drop(attention.out_proj(attention.ln_inner(value)))
        mixed = getattr(block, "ln_attn", torch.nn.Identity())(mixed)
    else:
        raise ExtractError(f"unsupported attention module {type(attention).__name__} for value-branch patches")
    x = x + block.ls_1(mixed)
    return x + block.ls_2(block.mlp(block.ln_2(x)))


def _timm_value(attention: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """timm Attention / AttentionRope / EvaAttention output with the attention weights replaced by the identity."""
    batch, tokens, _ = x.shape
    if getattr(attention, "qkv", None) is not None:
        bias = None
        if getattr(attention, "q_bias", None) is not None:  # EVA keeps q/v biases apart and a zero k bias
            bias = torch.cat((attention.q_bias, attention.k_bias, attention.v_bias))
        if bias is not None and getattr(attention, "qkv_bias_separate", False):
            qkv = attention.qkv(x) + bias
        elif bias is not None:
            qkv = F.linear(x, attention.qkv.weight, bias)
        else:
            qkv = attention.qkv(x)
        value = qkv.reshape(batch, tokens, 3, -1)[:, :, 2]  # the layout attention splits q, k, v from
    else:
        value = attention.v_proj(x)
        groups = getattr(attention, "num_kv_groups", 1)
        if groups > 1:  # grouped-query attention: each value head serves `groups` query heads, as attention expands it
            value = value.reshape(batch, tokens, -1, attention.head_dim).repeat_interleave(groups, dim=2)
            value = value.reshape(batch, tokens, -1)
    value = attention.norm(value)
    gate = getattr(attention, "gate", None)
    if gate is not None:
        value = value * gate(x).sigmoid()
    return attention.proj_drop(attention.proj(value))


def _aimv2_value(attention: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """Aimv2Attention output with the attention weights replaced by the identity."""
    return attention.out_proj(attention.v_proj(x))


def _capture_input(block: torch.nn.Module) -> tuple[dict[str, Any], Any]:
    """Record the positional and keyword inputs of the block's next call (a forward pre-hook; remove the handle)."""
    captured: dict[str, Any] = {}

    def hook(_module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        captured["args"], captured["kwargs"] = args, dict(kwargs)

    return captured, block.register_forward_pre_hook(hook, with_kwargs=True)


def _rerun_with_value_branch(
    block: torch.nn.Module,
    attention: torch.nn.Module,
    value: Callable[[torch.nn.Module, torch.Tensor], torch.Tensor],
    captured: dict[str, Any],
) -> torch.Tensor:
    """The block's own forward on its recorded input, its attention module's output replaced by the value branch."""

    def hook(module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any) -> Any:
        x = args[0] if args else kwargs["hidden_states"]
        replaced = value(module, x)
        return (replaced, *output[1:]) if isinstance(output, tuple) else replaced

    handle = attention.register_forward_hook(hook, with_kwargs=True)
    try:
        out = block(*captured["args"], **captured["kwargs"])
    finally:
        handle.remove()
    return out[0] if isinstance(out, tuple) else out


def _pool_each(pool: torch.nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    """The pooling head applied to every token as a one-token sequence: (B, P, C) -> (B·P, C')."""
    batch, count, width = tokens.shape
    return pool(tokens.reshape(batch * count, 1, width))


# ----------------------------------------------------------------------------------------------- the two passes
def image_and_patch_embeddings(
    model: torch.nn.Module,
    pixels: torch.Tensor,
    *,
    patches: bool = True,
    encode: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """ℓ2-normalised image embeddings (N, D) and value-branch patch embeddings (N, P, D), both float32.

    `encode` is the tower's ordinary image forward (default ``model.encode_image``; transformers bundles pass theirs).
    """
    encode = encode or model.encode_image
    if not patches:
        return F.normalize(encode(pixels).float(), dim=-1), None
    reason = unsupported_reason(model)
    if reason is not None:
        raise ExtractError(f"no patch embeddings: {reason}")
    route = patch_route(model)
    if route == "open_clip-vit":
        last = model.visual.transformer.resblocks[-1]
    elif route == "timm-attention-pool":
        last = model.visual.trunk.blocks[-1]
    else:
        last = model.vision_model.encoder.layers[-1]
    captured, handle = _capture_input(last)
    try:
        image = encode(pixels)
    finally:
        handle.remove()
    if route == "open_clip-vit":
        visual = model.visual
        tokens = value_branch_block(last, captured["args"][0])
        if not visual.transformer.batch_first:
            tokens = tokens.transpose(0, 1)
        local = visual.ln_post(tokens[:, 1:]) @ visual.proj  # drop the class token
    elif route == "timm-attention-pool":
        visual = model.visual
        trunk = visual.trunk
        tokens = _rerun_with_value_branch(last, last.attn, _timm_value, captured)
        tokens = trunk.norm(tokens)[:, trunk.num_prefix_tokens :]
        pooled = trunk.head(trunk.head_drop(trunk.fc_norm(_pool_each(trunk.attn_pool, tokens))))
        local = visual.head(pooled).reshape(tokens.shape[0], tokens.shape[1], -1)
    else:
        vision = model.vision_model
        tokens = _rerun_with_value_branch(last, last.attention, _aimv2_value, captured)
        tokens = vision.rms_norm(tokens)
        pooled = model.visual_projection(_pool_each(vision.head, tokens))
        local = pooled.reshape(tokens.shape[0], tokens.shape[1], -1)
    return F.normalize(image.float(), dim=-1), F.normalize(local.float(), dim=-1)


# ----------------------------------------------------------------------------------------------- as a backbone
class VisionLanguageBackbone(Backbone):
    """A VLM image tower (an open_clip or transformers bundle): ℓ2-normalised image embeddings, and fp16 value-branch
    patch embeddings (``extra.patch_embeddings``) where the tower has them.

    `patches`: None takes them when the tower has them, True requires them (refused with one line otherwise), False
    skips them. `encode` is the bundle's ordinary image forward (default ``model.encode_image``).
    """

    def __init__(
        self,
        bundle: Any,
        *,
        transform: Callable[[Any], torch.Tensor],
        patches: bool | None = None,
        encode: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ) -> None:
        super().__init__(
            bundle.model,
            name=bundle.model_name,
            checkpoint=bundle.checkpoint,
            preprocessing=bundle.preprocessing(),
            transform=transform,
        )
        self.bundle = bundle
        self.device = bundle.device
        self._encode = encode
        reason = unsupported_reason(bundle.model)
        if patches and reason is not None:
            raise ExtractError(f"{bundle.model_name} has no patch embeddings ({reason}); run without --patches")
        self.patches = reason is None if patches is None else patches

    def to(self, device: str | torch.device | None) -> Backbone:
        """Move the network (and the bundle's record of its device, which the text side uses) to a device."""
        super().to(device)
        self.bundle.device = self.device
        return self

    def provenance(self) -> dict[str, Any]:
        """Model, checkpoint, preprocessing, kind and what the arrays hold (with the patches' route)."""
        info = super().provenance()
        info["features"] = "l2-normalised image embeddings"
        if self.patches:
            info["patch_embeddings"] = "fp16 l2-normalised value-branch patch embeddings (last block), joint space"
            info["patch_route"] = patch_route(self.model)
        return info

    def default_model_id(self) -> str:
        """The bundle's store id."""
        return self.bundle.default_model_id()

    def infer(self, pixels: torch.Tensor, *, amp: bool = True) -> dict[str, np.ndarray]:
        """Image (and patch) embeddings of one preprocessed batch."""
        pixels = pixels.to(self.device, non_blocking=True)
        with torch.no_grad(), autocast(self.device, amp):
            image, local = image_and_patch_embeddings(self.model, pixels, patches=self.patches, encode=self._encode)
        arrays = {"features": image.cpu().numpy().astype(np.float32, copy=False)}
        if local is not None:
            arrays["extra.patch_embeddings"] = local.cpu().numpy().astype(np.float16)
        return arrays
