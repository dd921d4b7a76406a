"""Arrays of the detectors that need the network at test time: ODIN, RankFeat, GRAM and the Mahalanobis ensemble.

Each runs during extraction, on the batch the backbone has just preprocessed, and stores per-image arrays as
extras of the store entry; its hyper-parameters go into the entry's provenance (``network`` list) and, through
the model's parameters, into the runner's extraction key. The detectors of the same names
(`oodbench.detectors.network`) fit and score those arrays.

- ``odin`` (Liang et al., ICLR 2018): x̃ = x − ε · sign(∇ₓ CE(f(x)/T, ŷ)) / σ, ŷ the predicted class and σ the
  per-channel std of the preprocessing (the reference code divides the signed gradient by the normalisation std,
  so ε is a step in [0, 1] pixel units). Stored: ``extra.odin`` = f(x̃)/T, (N, C).
- ``rankfeat`` (Song et al., NeurIPS 2022): at a layer with output X (per image a C × HW matrix, or tokens × D
  for a transformer), X − s₁u₁v₁ᵀ (exact SVD, ``torch.linalg.svd``) replaces X and the forward pass continues.
  Stored: ``extra.rankfeat.<layer>`` = the logits of that pass, (N, C).
- ``gram`` (Sastry & Oore, ICML 2020): per layer, the row sums of the p-th order Gram matrices
  (F^p)(F^p)ᵀ of the feature map F (channels × positions), sign-preserving p-th root, for p = 1…P.
  Stored: ``extra.gram.<layer>``, (N, P · channels), p-major.
- ``mds`` (Lee et al., NeurIPS 2018): per layer, the feature map averaged over positions (the paper's pooled
  intermediate features). Stored: ``extra.mds.<layer>``, (N, channels).

All passes run in float32 without autocast: an ODIN step of 0.0014/σ ≈ 0.006 is below bfloat16's resolution
of normalised pixels (about 0.016 at 2), and the SVD and the Gram powers need float32 at least.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from ..core.errors import ExtractError
from .nac import layer_hooks

__all__ = [
    "NetSpec",
    "METHODS",
    "network_arrays",
    "odin_logits",
    "parse_specs",
    "rankfeat_logits",
    "remove_rank1",
    "gram_rows",
    "pooled_map",
    "channel_map",
]

METHODS = ("odin", "rankfeat", "gram", "mds")
_DEFAULTS: dict[str, dict[str, object]] = {
    # ODIN: T = 1000 and ε = 0.0014, the reference code's DenseNet/CIFAR-10 setting; OpenOOD's and pytorch-ood's default.
    "odin": {"temperature": 1000.0, "epsilon": 0.0014},
    # RankFeat: the last stage (Block 4 of a ResNet), the paper's main setting.
    "rankfeat": {"layers": ("layer4",)},
    # GRAM: orders p = 1..10 as the paper; layers: the ends of a ResNet's four stages.
    "gram": {"layers": ("layer1", "layer2", "layer3", "layer4"), "powers": 10},
    # Mahalanobis ensemble: the ends of the four stages, as the paper's ResNet features.
    "mds": {"layers": ("layer1", "layer2", "layer3", "layer4")},
}
_KEYS = {"odin": ("temperature", "epsilon"), "rankfeat": ("layers",), "gram": ("layers", "powers"), "mds": ("layers",)}


@dataclass(frozen=True)
class NetSpec:
    """One network-time detector to extract for: its method and hyper-parameters (defaults as published)."""

    method: str
    layers: tuple[str, ...] = ()
    temperature: float = 1000.0
    epsilon: float = 0.0014
    powers: int = 10

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ExtractError(f"unknown network detector {self.method!r}; use one of {', '.join(METHODS)}")
        if self.method == "odin":
            if not (math.isfinite(self.temperature) and self.temperature > 0):
                raise ExtractError(f"odin temperature must be a positive number; got {self.temperature}")
            if not (math.isfinite(self.epsilon) and self.epsilon >= 0):
                raise ExtractError(f"odin epsilon must be a number >= 0; got {self.epsilon}")
        else:
            if not self.layers or not all(self.layers) or len(set(self.layers)) != len(self.layers):
                raise ExtractError(f"{self.method} needs distinct non-empty layer names; got {list(self.layers)}")
        if self.method == "gram" and (isinstance(self.powers, bool) or not 1 <= int(self.powers) <= 20):
            raise ExtractError(f"gram powers must be an integer in [1, 20]; got {self.powers}")

    @classmethod
    def of(cls, method: str, **params: object) -> NetSpec:
        """A spec with the method's published defaults, overridden by `params`."""
        if method not in METHODS:
            raise ExtractError(f"unknown network detector {method!r}; use one of {', '.join(METHODS)}")
        unknown = sorted(set(params) - set(_KEYS[method]))
        if unknown:
            raise ExtractError(f"{method} has no parameter {unknown[0]!r}; its parameters: {', '.join(_KEYS[method])}")
        values = {**_DEFAULTS[method], **params}
        if "layers" in values:
            layers = values["layers"]
            values["layers"] = (layers,) if isinstance(layers, str) else tuple(str(v) for v in layers)  # type: ignore[union-attr]
        return cls(method, **values)  # type: ignore[arg-type]

    @classmethod
    def parse(cls, spec: str) -> NetSpec:
        """Parse ``METHOD[:KEY=VALUE,...]``; layer lists are joined by ``+`` (``gram:layers=layer3+layer4,powers=5``)."""
        method, _, rest = spec.partition(":")
        params: dict[str, object] = {}
        for item in filter(None, rest.split(",")):
            key, sep, value = item.partition("=")
            if not sep or not key or not value:
                raise ExtractError(
                    f"bad network detector spec {spec!r}: use METHOD[:KEY=VALUE,...], e.g. odin:epsilon=0.002"
                )
            try:
                if key == "layers":
                    params[key] = tuple(value.split("+"))
                elif key == "powers":
                    params[key] = int(value)
                else:
                    params[key] = float(value)
            except ValueError:
                raise ExtractError(f"bad value for {key} in {spec!r}: {value!r} is not a number") from None
        return cls.of(method, **params)

    def extra_names(self) -> list[str]:
        """Names of the extras this spec stores (without the ``extra.`` prefix)."""
        if self.method == "odin":
            return ["odin"]
        return [f"{self.method}.{layer}" for layer in self.layers]

    def as_dict(self) -> dict[str, object]:
        """JSON-friendly form (recorded in the entry's provenance)."""
        if self.method == "odin":
            return {
                "method": "odin",
                "temperature": self.temperature,
                "epsilon": self.epsilon,
                "perturbation": "epsilon * sign(gradient) / preprocessing std, per channel",
            }
        info: dict[str, object] = {"method": self.method, "layers": list(self.layers)}
        if self.method == "gram":
            info["powers"] = int(self.powers)
        if self.method == "rankfeat":
            info["svd"] = "exact (torch.linalg.svd)"
        return info


# ----------------------------------------------------------------------------------------------- layouts
def channel_map(output: torch.Tensor) -> torch.Tensor:
    """(B, channels, positions) of a layer output: NCHW convolutional maps, or (B, tokens, D) transformer blocks."""
    if output.ndim == 4:
        return output.flatten(2)
    if output.ndim == 3:
        return output.transpose(1, 2)
    raise ExtractError(
        f"a layer output of shape {tuple(output.shape)} is no feature map; pick a (B, C, H, W) or (B, tokens, D) layer"
    )


def pooled_map(output: torch.Tensor) -> torch.Tensor:
    """(B, channels): the feature map averaged over positions (spatial positions or tokens)."""
    return channel_map(output).mean(dim=2)


def gram_rows(output: torch.Tensor, powers: int) -> torch.Tensor:
    """(B, powers · channels) float64: for p = 1…P, sign(g)|g|^(1/p) with g = (F^p)(F^p)ᵀ·1, F = channel_map.

    The row sums of the Gram matrix need no channels × channels product: (F^p)(F^p)ᵀ·1 = F^p ((F^p)ᵀ·1).
    """
    fmap = channel_map(output.detach()).double()
    rows = []
    for p in range(1, powers + 1):
        fp = fmap**p
        sums = torch.einsum("bcn,bn->bc", fp, fp.sum(dim=1))
        rows.append(sums.sign() * sums.abs() ** (1.0 / p))
    return torch.cat(rows, dim=1)


def remove_rank1(output: torch.Tensor) -> torch.Tensor:
    """The layer output with its per-image rank-1 component s₁u₁v₁ᵀ removed (exact SVD), same shape and layout."""
    if output.ndim not in (3, 4):
        raise ExtractError(f"rankfeat needs a (B, C, H, W) or (B, tokens, D) layer output; got {tuple(output.shape)}")
    matrix = output.reshape(output.shape[0], output.shape[1], -1)
    u, s, vh = torch.linalg.svd(matrix, full_matrices=False)
    rank1 = s[:, :1, None] * (u[:, :, :1] @ vh[:, :1, :])
    return (matrix - rank1).reshape(output.shape)


# ----------------------------------------------------------------------------------------------- passes
def _logits(model: torch.nn.Module, pixels: torch.Tensor) -> torch.Tensor:
    logits = model(pixels)
    if not isinstance(logits, torch.Tensor) or logits.ndim != 2:
        raise ExtractError("the network's output is not (B, classes) logits; network detectors need a classifier")
    return logits


def odin_logits(
    model: torch.nn.Module, pixels: torch.Tensor, temperature: float, epsilon: float, std: Sequence[float]
) -> torch.Tensor:
    """f(x̃)/T with x̃ = x − ε · sign(∇ₓ CE(f(x)/T, argmax f(x))) / std (per channel), in the pixels' dtype."""
    with torch.enable_grad():
        x = pixels.detach().clone().requires_grad_(True)
        scaled = _logits(model, x) / temperature
        loss = torch.nn.functional.cross_entropy(scaled, scaled.argmax(dim=1), reduction="sum")
        (gradient,) = torch.autograd.grad(loss, x)
    scale = torch.as_tensor(list(std), dtype=pixels.dtype, device=pixels.device).view(1, -1, *([1] * (pixels.ndim - 2)))
    if scale.shape[1] != pixels.shape[1]:
        raise ExtractError(f"odin: {scale.shape[1]} preprocessing std values for {pixels.shape[1]} input channels")
    perturbed = pixels.detach() - epsilon * gradient.sign() / scale
    with torch.no_grad():
        return _logits(model, perturbed) / temperature


def rankfeat_logits(model: torch.nn.Module, pixels: torch.Tensor, layer: str) -> torch.Tensor:
    """The logits of a forward pass in which `layer`'s output loses its rank-1 component."""
    with torch.no_grad(), layer_hooks(model, {layer: remove_rank1}) as calls:
        logits = _logits(model, pixels)
    if calls[layer] == 0:
        raise ExtractError(f"module {layer!r} is not called in the forward pass; pick another layer")
    return logits


def network_arrays(
    model: torch.nn.Module, pixels: torch.Tensor, specs: Sequence[NetSpec], *, std: Sequence[float] | None = None
) -> dict[str, np.ndarray]:
    """The extras of every spec for one preprocessed batch, as float32 numpy arrays keyed ``extra.<name>``.

    GRAM and the Mahalanobis ensemble share one plain forward pass; ODIN takes a forward and backward pass and a
    second forward pass; RankFeat one pass per layer. The pixels' dtype is kept (float32 in extraction; the tests
    run the same code in float64).
    """
    arrays: dict[str, torch.Tensor] = {}
    reducers: dict[str, list[tuple[str, object]]] = {}
    for spec in specs:
        if spec.method in ("gram", "mds"):
            for layer in spec.layers:
                reduce = pooled_map if spec.method == "mds" else (lambda out, p=int(spec.powers): gram_rows(out, p))
                reducers.setdefault(layer, []).append((f"{spec.method}.{layer}", reduce))
    if reducers:

        def collect(layer: str):  # noqa: ANN202
            def reduce_all(output: torch.Tensor) -> None:
                for name, reduce in reducers[layer]:
                    arrays[name] = reduce(output.detach())  # type: ignore[operator]

            return reduce_all

        with torch.no_grad(), layer_hooks(model, {layer: collect(layer) for layer in reducers}) as calls:
            _logits(model, pixels)
        silent = [layer for layer, count in calls.items() if count == 0]
        if silent:
            raise ExtractError(f"module {silent[0]!r} is not called in the forward pass; pick another layer")
    for spec in specs:
        if spec.method == "odin":
            if std is None:
                raise ExtractError("odin needs the preprocessing std of the input channels")
            arrays["odin"] = odin_logits(model, pixels, spec.temperature, spec.epsilon, std)
        elif spec.method == "rankfeat":
            for layer in spec.layers:
                arrays[f"rankfeat.{layer}"] = rankfeat_logits(model, pixels, layer)
    return {f"extra.{name}": value.detach().float().cpu().numpy() for name, value in arrays.items()}


def parse_specs(texts: Sequence[str]) -> tuple[NetSpec, ...]:
    """The ``--net METHOD[:KEY=VALUE,...]`` values of a command or an experiment file, parsed and checked together
    (`NetSpec.parse`, `check_specs`): the one reading of them, before any model loads."""
    return check_specs([NetSpec.parse(text) for text in texts])


def check_specs(specs: Sequence[NetSpec]) -> tuple[NetSpec, ...]:
    """The specs, refused when two store the same extra (e.g. odin twice: one setting per entry)."""
    seen: dict[str, str] = {}
    for spec in specs:
        for name in spec.extra_names():
            if name in seen:
                raise ExtractError(
                    f"two network detector settings store extra.{name}; extract each setting as its own model id"
                )
            seen[name] = spec.method
    return tuple(specs)
