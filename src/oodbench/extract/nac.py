"""NAC neuron states (Liu et al., ICLR 2024): sigmoid(α · o · g) per unit of a named layer.

o is the layer output and g its gradient of KL(u ‖ softmax(logits)), u the uniform distribution over classes,
both sum-pooled over spatial positions (or tokens) before the product, as the reference implementation
(github.com/BierOne/ood_coverage, `kl_grad` and `StatePooling`) does; for a ViT's final norm the reference
keeps the class token instead ("first"). The states are stored as ``extra.nac.<layer>`` (N, units) float32
for the `nac` detector, which builds its coverage histograms from them.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

import numpy as np
import torch

from ..core.errors import ExtractError

__all__ = ["NacLayer", "capture_outputs", "kl_to_uniform", "pool_units", "neuron_states"]

POOLINGS = ("auto", "sum", "tokens", "first", "nhwc", "none")


@dataclass(frozen=True)
class NacLayer:
    """A layer whose neuron states are extracted: module path, sigmoid steepness α and pooling."""

    name: str
    alpha: float = 1.0
    pooling: str = "auto"

    def __post_init__(self) -> None:
        if not self.name:
            raise ExtractError("NAC layer name is empty")
        if not (math.isfinite(self.alpha) and self.alpha > 0):
            raise ExtractError(f"NAC alpha for {self.name!r} must be a positive number; got {self.alpha}")
        if self.pooling not in POOLINGS:
            raise ExtractError(
                f"NAC pooling for {self.name!r} must be one of {', '.join(POOLINGS)}; got {self.pooling!r}"
            )

    @classmethod
    def parse(cls, spec: str) -> NacLayer:
        """Parse ``LAYER[:ALPHA[:POOLING]]``, e.g. ``layer3:300`` or ``blocks.11.norm2:1:tokens``."""
        parts = spec.split(":")
        if len(parts) > 3 or not parts[0]:
            raise ExtractError(f"bad NAC layer spec {spec!r}: use LAYER[:ALPHA[:POOLING]], e.g. layer3:300")
        try:
            alpha = float(parts[1]) if len(parts) > 1 and parts[1] else 1.0
        except ValueError:
            raise ExtractError(f"bad NAC alpha in {spec!r}: {parts[1]!r} is not a number") from None
        return cls(parts[0], alpha, parts[2] if len(parts) > 2 else "auto")

    @property
    def extra_name(self) -> str:
        """Name of the extra array in the store (``nac.<layer>``)."""
        return f"nac.{self.name}"

    def as_dict(self) -> dict[str, object]:
        """JSON-friendly form (recorded in provenance)."""
        return {"layer": self.name, "alpha": self.alpha, "pooling": self.pooling}


@contextlib.contextmanager
def layer_hooks(
    model: torch.nn.Module, hooks: Mapping[str, Callable[[torch.Tensor], object]]
) -> Iterator[dict[str, int]]:
    """Forward hooks on named sub-modules for one forward pass, counting their calls.

    Each hook gets the module's output tensor; what it returns, unless None, replaces that output. Every layer must
    run exactly once per pass (a module called twice, e.g. a shared activation, is refused after the pass).
    """
    modules = dict(model.named_modules())
    missing = [name for name in hooks if name not in modules]
    if missing:
        candidates = [n for n in modules if n and n.count(".") <= 1][:40]
        raise ExtractError(f"model has no module {missing[0]!r}; top-level modules include: {', '.join(candidates)}")
    calls = {name: 0 for name in hooks}

    def counted(name: str, function: Callable[[torch.Tensor], object]) -> Callable[..., object]:
        def hook(_module: torch.nn.Module, _inputs: object, output: object) -> object:
            if not isinstance(output, torch.Tensor):
                raise ExtractError(f"module {name!r} returns {type(output).__name__}, not a tensor; pick another layer")
            calls[name] += 1
            return function(output)

        return hook

    handles = [modules[name].register_forward_hook(counted(name, fn)) for name, fn in hooks.items()]
    try:
        yield calls
    finally:
        for handle in handles:
            handle.remove()
    repeated = [name for name, count in calls.items() if count > 1]
    if repeated:
        raise ExtractError(
            f"module {repeated[0]!r} runs {calls[repeated[0]]} times per forward pass; pick a layer that runs once"
        )


@contextlib.contextmanager
def capture_outputs(model: torch.nn.Module, names: list[str]) -> Iterator[dict[str, torch.Tensor]]:
    """Forward hooks recording the outputs of the named sub-modules during one forward pass."""
    captured: dict[str, torch.Tensor] = {}

    def keep(name: str) -> Callable[[torch.Tensor], None]:
        def store(output: torch.Tensor) -> None:
            captured[name] = output

        return store

    with layer_hooks(model, {name: keep(name) for name in names}):
        yield captured


def kl_to_uniform(logits: torch.Tensor) -> torch.Tensor:
    """Sum over the batch of KL(u ‖ softmax(logits)), u uniform over the classes."""
    log_probs = torch.log_softmax(logits.float(), dim=-1)
    num_classes = logits.shape[-1]
    return (-log_probs.mean(dim=-1) - math.log(num_classes)).sum()


def pool_units(tensor: torch.Tensor, pooling: str) -> torch.Tensor:
    """(B, units) from a layer tensor: sum over positions (NCHW or NHWC), over tokens, the first token, or as is."""
    if pooling == "auto":
        pooling = {2: "none", 3: "tokens", 4: "sum"}.get(tensor.ndim, "invalid")
    if pooling == "none":
        if tensor.ndim != 2:
            raise ExtractError(f"layer output has shape {tuple(tensor.shape)}; pooling 'none' needs (B, units)")
        return tensor
    if pooling == "sum":
        if tensor.ndim < 3:
            raise ExtractError(f"pooling 'sum' needs (B, C, ...) outputs; got {tuple(tensor.shape)}")
        return tensor.flatten(2).sum(dim=2)
    if pooling == "nhwc":
        if tensor.ndim != 4:
            raise ExtractError(f"pooling 'nhwc' needs (B, H, W, C) outputs; got {tuple(tensor.shape)}")
        return tensor.sum(dim=(1, 2))
    if pooling in ("tokens", "first"):
        if tensor.ndim != 3:
            raise ExtractError(f"pooling {pooling!r} needs (B, tokens, units) outputs; got {tuple(tensor.shape)}")
        return tensor.sum(dim=1) if pooling == "tokens" else tensor[:, 0]
    raise ExtractError(f"cannot pool a layer output of shape {tuple(tensor.shape)}; give the pooling explicitly")


def neuron_states(
    outputs: dict[str, torch.Tensor], logits: torch.Tensor, layers: list[NacLayer]
) -> dict[str, np.ndarray]:
    """sigmoid(α · pool(o) · pool(∂KL/∂o)) per layer, as float32 numpy arrays keyed by ``nac.<layer>``."""
    tensors = [outputs[layer.name] for layer in layers]
    if not all(t.requires_grad for t in tensors):
        raise ExtractError("NAC layer outputs carry no gradient; run the forward pass with gradients enabled")
    try:
        grads = torch.autograd.grad(kl_to_uniform(logits), tensors)
    except RuntimeError as exc:
        raise ExtractError(
            f"cannot differentiate through the NAC layers ({exc}); an in-place operation after the layer "
            "(e.g. ReLU(inplace=True)) can cause this: choose the module after it"
        ) from exc
    states: dict[str, np.ndarray] = {}
    for layer, output, grad in zip(layers, tensors, grads, strict=True):
        o = pool_units(output.detach().float(), layer.pooling)
        g = pool_units(grad.float(), layer.pooling)
        states[layer.extra_name] = torch.sigmoid(layer.alpha * o * g).cpu().numpy().astype(np.float32, copy=False)
    return states
