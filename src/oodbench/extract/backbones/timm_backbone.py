"""Supervised (and frozen) timm backbones: penultimate features = the input of the last linear map, logits, head.

The features are captured with a pre-hook on the module timm reports as the classifier, during the model's
own forward pass, so heads with a norm or a pre-logits MLP (ConvNeXt, ViT fc_norm, ...) are handled: the
features are whatever enters the final linear layer. Every batch is checked: logits must equal
features·Wᵀ + b, otherwise extraction stops rather than storing a head that does not reproduce them.
A model without a classifier (num_classes=0, e.g. DINOv2) yields features only, for a linear probe; a distilled
model's two averaged heads become one linear map of their concatenated inputs.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from ...core.errors import ExtractError
from ...core.outputs import Head
from ...util.atomic import sha256_file
from ..hub import cached_file, prefer_cache, require_reachable
from ..nac import NacLayer, capture_outputs, neuron_states
from ..posthoc_net import NetSpec, check_specs, network_arrays
from .base import Backbone, autocast, check_preprocessing, safe_id

__all__ = ["TimmBackbone", "check_timm_name", "load_timm", "MISSING_WEIGHTS_HINT"]

MISSING_WEIGHTS_HINT = (
    "download them once with network access (timm caches them under $HF_HOME, by default ~/.cache/huggingface/hub), "
    "point HF_HOME at a cache that already holds them, or pass --checkpoint PATH with a local state dict "
    "(.pth/.pt/.bin/.safetensors); --no-pretrained gives random weights (tests only)"
)


def _head_tolerance(logits: torch.Tensor, amp: bool) -> float:
    """Allowed |logits - (zWᵀ + b)|: float32 rounding, or half-precision rounding under autocast."""
    scale = max(1.0, float(logits.abs().max()))
    return scale * (2e-2 if amp else 1e-4)


class TimmBackbone(Backbone):
    """A timm image classifier (or feature extractor) with its resolved preprocessing."""

    kind = "timm"

    def __init__(
        self,
        model: torch.nn.Module,
        *,
        name: str,
        checkpoint: str,
        checkpoint_sha256: str | None = None,
        nac_layers: Sequence[NacLayer | str] = (),
        image_size: int | None = None,
        preprocessing: Mapping[str, Any] | None = None,
        checkpoint_format: str | None = None,
        network: Sequence[NetSpec | str] = (),
    ) -> None:
        import timm.data

        overrides = check_preprocessing(preprocessing)
        if image_size is not None:
            overrides.setdefault("input_size", [3, int(image_size), int(image_size)])
        # Defaults come from the architecture's pretrained config; explicit settings win, key by key.
        config = timm.data.resolve_data_config(
            {key: tuple(v) if isinstance(v, list) else v for key, v in overrides.items()}, model=model
        )
        self.preprocessing_overrides = overrides
        self.checkpoint_format = checkpoint_format
        preprocessing = {
            key: list(value) if isinstance(value, tuple) else value for key, value in sorted(config.items())
        }
        super().__init__(
            model,
            name=name,
            checkpoint=checkpoint,
            preprocessing=preprocessing,
            transform=timm.data.create_transform(**config, is_training=False),
        )
        self.checkpoint_sha256 = checkpoint_sha256
        self.nac_layers = tuple(
            layer if isinstance(layer, NacLayer) else NacLayer.parse(str(layer)) for layer in nac_layers
        )
        classifier = model.get_classifier() if hasattr(model, "get_classifier") else None
        # Distilled models (DeiT) have two heads whose logits are averaged: that is one linear map of the
        # concatenated head inputs, W = [W1 W2] / 2, b = (b1 + b2) / 2, which the per-batch check verifies.
        heads = list(classifier) if isinstance(classifier, (tuple, list)) else [classifier]
        if all(isinstance(h, torch.nn.Identity) or h is None for h in heads):
            heads = []
        for head in heads:
            if not isinstance(head, (torch.nn.Linear, torch.nn.Conv2d)):
                raise ExtractError(
                    f"{name}'s classifier is a {type(head).__name__}, not a linear layer; cannot define a linear head"
                )
            if isinstance(head, torch.nn.Conv2d) and head.kernel_size != (1, 1):
                raise ExtractError(f"{name}'s classifier is a {head.kernel_size} convolution, not a linear map")
        self._heads: list[torch.nn.Module] = heads
        if not self._heads and self.nac_layers:
            raise ExtractError(f"{name} has no classifier (num_classes=0): NAC neuron states need logits")
        # Detectors that need the network at test time (ODIN, RankFeat, GRAM, Mahalanobis ensemble): extras.
        self.network = check_specs([s if isinstance(s, NetSpec) else NetSpec.parse(str(s)) for s in network])
        if not self._heads and self.network:
            raise ExtractError(f"{name} has no classifier (num_classes=0): network detectors need logits")

    def _linear_map(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(W, b) of the map from the (concatenated) classifier input(s) to the logits, float32."""
        weights, biases = [], []
        for head in self._heads:
            weight = head.weight.detach().float().reshape(head.weight.shape[0], -1)
            weights.append(weight)
            biases.append(
                torch.zeros(weight.shape[0], device=weight.device) if head.bias is None else head.bias.detach().float()
            )
        if len(self._heads) == 1:
            return weights[0], biases[0]  # views of the parameters: no per-batch copy
        return torch.cat(weights, dim=1) / len(self._heads), torch.stack(biases).mean(dim=0)

    def provenance(self) -> dict[str, Any]:
        """Model, checkpoint, preprocessing, kind, plus what the features are and any NAC layers."""
        info = super().provenance()
        if not self._heads:
            info["features"] = "pre-logits (no classifier)"
        elif len(self._heads) == 1:
            info["features"] = "input of the final linear layer"
        else:
            info["features"] = (
                f"concatenated inputs of the {len(self._heads)} classifier heads whose logits are averaged"
            )
        if self.nac_layers:
            info["nac"] = [layer.as_dict() for layer in self.nac_layers]
        if self.network:
            info["network"] = [spec.as_dict() for spec in self.network]
        if self.preprocessing_overrides:
            info["preprocessing_overrides"] = dict(self.preprocessing_overrides)
        if self.checkpoint_format:
            info["checkpoint_format"] = self.checkpoint_format
        return info

    def default_model_id(self) -> str:
        """The timm name, plus a short checkpoint hash when weights come from a local file."""
        base = safe_id(self.name)
        return f"{base}@{self.checkpoint_sha256[:12]}" if self.checkpoint_sha256 else base

    def head(self) -> Head | None:
        """(W, b) of the final linear layer, as float32 numpy arrays."""
        if not self._heads:
            return None
        weight, bias = self._linear_map()
        return Head(weight.cpu().numpy().astype(np.float32), bias.cpu().numpy().astype(np.float32))

    def infer(self, pixels: torch.Tensor, *, amp: bool = True) -> dict[str, np.ndarray]:
        """Features, logits (checked against the head) and NAC states for one preprocessed batch."""
        pixels = pixels.to(self.device, non_blocking=True)
        if not self._heads:
            with torch.no_grad(), autocast(self.device, amp):
                features = self.model(pixels)
            if features.ndim != 2:
                raise ExtractError(f"{self.name} without classifier returns shape {tuple(features.shape)}, not (B, D)")
            return {"features": features.float().cpu().numpy()}
        captured: dict[int, torch.Tensor] = {}

        def grabber(position: int):
            def grab_input(_module: torch.nn.Module, inputs: tuple[torch.Tensor, ...]) -> None:
                captured[position] = inputs[0]

            return grab_input

        handles = [head.register_forward_pre_hook(grabber(i)) for i, head in enumerate(self._heads)]
        layer_names = [layer.name for layer in self.nac_layers]
        try:
            with capture_outputs(self.model, layer_names) as layer_outputs:
                grad_mode = torch.enable_grad() if self.nac_layers else torch.no_grad()
                with grad_mode, autocast(self.device, amp):
                    if self.nac_layers:
                        # Makes every activation part of the graph even if parameters are frozen.
                        pixels = pixels.requires_grad_(True)
                    logits = self.model(pixels)
        finally:
            for handle in handles:
                handle.remove()
        if len(captured) != len(self._heads):
            raise ExtractError(f"{self.name}'s classifier was not called during forward; cannot capture features")
        parts = [
            captured[i].flatten(1) if captured[i].ndim == 4 and captured[i].shape[2:] == (1, 1) else captured[i]
            for i in range(len(self._heads))
        ]
        if not isinstance(logits, torch.Tensor) or any(part.ndim != 2 for part in parts) or logits.ndim != 2:
            shapes = [tuple(part.shape) for part in parts]
            raise ExtractError(f"{self.name}: classifier input {shapes} / logits are not (B, D) / (B, C)")
        features = parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)
        weight, bias = self._linear_map()
        with torch.no_grad():
            recomputed = F.linear(features.detach().float(), weight, bias)
            error = float((recomputed - logits.detach().float()).abs().max()) if logits.numel() else 0.0
        if error > _head_tolerance(logits.detach().float(), amp and self.device.type == "cuda"):
            raise ExtractError(
                f"{self.name}: logits are not features·Wᵀ + b (max error {error:.3g}); something after the last linear "
                "layer changes the logits, so no linear head reproduces them"
            )
        arrays = {"features": features.detach().float().cpu().numpy(), "logits": logits.detach().float().cpu().numpy()}
        if self.nac_layers:
            arrays.update(
                {f"extra.{k}": v for k, v in neuron_states(layer_outputs, logits, list(self.nac_layers)).items()}
            )
        if self.network:
            arrays.update(network_arrays(self.model, pixels.detach(), self.network, std=self.preprocessing.get("std")))
        return arrays


def check_timm_name(name: str) -> None:
    """Raise one ExtractError for an unknown timm architecture or pretrained tag, with the closest names."""
    import timm

    from ...core.names import suggest

    if name.startswith("hf-hub:"):
        return
    arch, _, tag = name.split("/")[-1].partition(".")
    if not timm.is_model(arch):
        raise ExtractError(f"unknown timm model {arch!r}{suggest(arch, timm.list_models())} (list: timm.list_models())")
    if tag:
        tagged = timm.list_pretrained(f"{arch}.*")
        if f"{arch}.{tag}" not in tagged:
            shown = ", ".join(t.partition(".")[2] for t in tagged[:8]) + (", …" if len(tagged) > 8 else "")
            raise ExtractError(
                f"timm model {arch} has no pretrained tag {tag!r}{suggest(f'{arch}.{tag}', tagged)} "
                f"(its tags: {shown or 'none'})"
            )


# Files timm reads from a hub repo (the safetensors first).
_HUB_FILES = ("model.safetensors", "pytorch_model.bin", "open_clip_model.safetensors", "open_clip_pytorch_model.bin")


def _hub_weights(name: str) -> bool:
    """True when the pretrained weights of `name` are in a local cache; else raise at once if they cannot be
    downloaded (offline, or the hub does not answer), rather than after huggingface_hub's minute of retries."""
    import timm

    if name.startswith("hf-hub:"):
        repo, url, files = name[len("hf-hub:") :].split("@")[0], None, _HUB_FILES
    else:
        cfg = timm.models.get_pretrained_cfg(name)
        if cfg is None:
            return False  # timm itself explains a model without pretrained weights
        repo, url = cfg.hf_hub_id, cfg.url
        files = ((cfg.hf_hub_filename,) if getattr(cfg, "hf_hub_filename", None) else ()) + _HUB_FILES
    if cached_file(repo, files, url) is not None:
        return True
    if repo or url:
        require_reachable(
            f"the pretrained weights of {name}",
            url=None if repo else url,
            fix="or pass --checkpoint PATH with a local state dict",
        )
    return False


def _classifier_key(model_name: str) -> str | None:
    import timm

    try:
        return timm.models.get_pretrained_cfg(model_name).classifier  # type: ignore[union-attr]
    except Exception:
        return None


def _create(name: str, *, pretrained: bool, image_size: int | None, **kwargs: Any) -> torch.nn.Module:
    """timm.create_model, passing img_size to models that take it (ViTs) when an input size is forced."""
    import timm

    if image_size is not None:
        try:
            return timm.create_model(name, pretrained=pretrained, img_size=image_size, **kwargs)
        except TypeError:
            pass  # CNNs take any input size without an img_size argument
    return timm.create_model(name, pretrained=pretrained, **kwargs)


def _architecture_classes(name: str) -> int | None:
    import timm

    try:
        return int(timm.models.get_pretrained_cfg(name).num_classes)  # type: ignore[union-attr]
    except Exception:
        return None


def load_timm(
    name: str,
    *,
    pretrained: bool = True,
    checkpoint: str | os.PathLike[str] | None = None,
    seed: int = 0,
    nac_layers: Sequence[NacLayer | str] = (),
    num_classes: int | None = None,
    image_size: int | None = None,
    preprocessing: Mapping[str, Any] | None = None,
    convert: str = "auto",
    network: Sequence[NetSpec | str] = (),
) -> TimmBackbone:
    """Create a timm backbone: hub weights (cache honoured), a local checkpoint file, or seeded random init.

    `image_size` overrides the model's input resolution (preprocessing, and the position embeddings of ViTs).
    `preprocessing` overrides settings of the architecture's default data config (see `check_preprocessing`).
    `convert` renames a checkpoint's keys first (``auto`` detects the naming; see `oodbench.extract.convert`).
    """
    import timm

    from ..convert import convert_state_dict, detect_format

    check_timm_name(name)
    overrides = check_preprocessing(preprocessing)
    size = overrides.get("input_size")
    if image_size is None and size is not None and size[1] == size[2]:
        image_size = int(size[1])  # ViTs need the resolution at creation (position embeddings)
    kwargs: dict[str, Any] = {} if num_classes is None else {"num_classes": num_classes}
    common = {"nac_layers": nac_layers, "image_size": image_size, "preprocessing": overrides, "network": network}
    if checkpoint is not None:
        path = Path(checkpoint)
        if not path.is_file():
            raise ExtractError(f"checkpoint {path} does not exist")
        try:
            state = timm.models.load_state_dict(str(path))
        except Exception as exc:
            raise ExtractError(f"cannot read checkpoint {path}: {exc}") from exc
        fmt = detect_format(state) if convert == "auto" else convert
        key = "_fc" if fmt == "efficientnet_pytorch" else _classifier_key(name)
        if key and f"{key}.weight" in state:
            rows = int(state[f"{key}.weight"].shape[0])
            expected = _architecture_classes(name)
            if num_classes is None:
                kwargs["num_classes"] = rows
            if expected is not None and rows != expected:
                warnings.warn(
                    f"the classifier of {path.name} has {rows} classes but {name} is a {expected}-class architecture; "
                    "check that the checkpoint belongs to this model (logits and the stored head have "
                    f"{kwargs.get('num_classes', rows)} columns)",
                    UserWarning,
                    stacklevel=2,
                )
        torch.manual_seed(seed)
        model = _create(name, pretrained=False, image_size=image_size, **kwargs)
        state, used = convert_state_dict(state, convert, model)
        if used == "efficientnet_pytorch" and not name.split(".")[0].startswith("tf_"):
            warnings.warn(
                f"efficientnet_pytorch weights use TensorFlow 'same' padding; {name} pads symmetrically, so features "
                f"are shifted: use the tf_ variant (tf_{name.split('.')[0]})",
                UserWarning,
                stacklevel=2,
            )
        try:
            model.load_state_dict(state, strict=True)
        except RuntimeError as exc:
            hint = (
                "" if used != "none" else " (a checkpoint in another naming needs --convert, e.g. efficientnet_pytorch)"
            )
            raise ExtractError(f"checkpoint {path} does not fit {name}{hint}: {str(exc)[:600]}") from exc
        digest = sha256_file(path)
        return TimmBackbone(
            model,
            name=name,
            checkpoint=f"sha256:{digest}",
            checkpoint_sha256=digest,
            checkpoint_format=None if used == "none" else used,
            **common,
        )
    if not pretrained:
        torch.manual_seed(seed)
        model = _create(name, pretrained=False, image_size=image_size, **kwargs)
        return TimmBackbone(model, name=name, checkpoint=f"random-init:seed={seed}", **common)
    from .. import stand_ins

    if stand_ins.enabled():  # OODBENCH_STAND_INS: a tiny random model of the family, never the hub's weights
        model = stand_ins.timm_model(name, num_classes=num_classes)
        small = {k: v for k, v in overrides.items() if k != "input_size"}
        settings = {**common, "image_size": stand_ins.SIZE, "preprocessing": small}
        return TimmBackbone(model, name=name, checkpoint=stand_ins.checkpoint_of(model), **settings)
    cached = _hub_weights(name)
    try:
        with prefer_cache(cached):
            model = _create(name, pretrained=True, image_size=image_size, **kwargs)
    except Exception as exc:
        text = f"{type(exc).__name__}: {exc}"
        offline = os.environ.get("HF_HUB_OFFLINE") == "1" or "LocalEntryNotFound" in text or "offline" in text.lower()
        raise ExtractError(
            f"pretrained weights for {name} are not available{' offline' if offline else ''} ({text[:300]}); "
            + MISSING_WEIGHTS_HINT
        ) from exc
    cfg = getattr(model, "pretrained_cfg", {}) or {}
    tag = cfg.get("hf_hub_id") or cfg.get("url") or name
    return TimmBackbone(model, name=name, checkpoint=f"pretrained:{tag}", **common)
