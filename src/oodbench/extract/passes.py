"""Which models share one decode pass: a memory estimate per model and first-fit packing into the device's memory.

The estimate is deliberately simple and conservative: float32 weights (4 bytes per parameter, plus 20 % for
buffers and allocator slack) and activations of ``ACTIVATION_FACTOR`` float32 values per input value of a batch
(``batch × C × H × W``), three times that for models whose forward keeps a graph (NAC states need gradients).
No model is built with weights to estimate it: parameters are counted on PyTorch's ``meta`` device.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

__all__ = [
    "Footprint",
    "ACTIVATION_FACTOR",
    "BUDGET_FRACTION",
    "device_memory",
    "pack_passes",
    "count_parameters",
    "footprint_of",
]

# Peak live activations of an inference forward, in float32 values per input value. Measured peaks of CNNs and ViTs
# without gradients are ~10–25 (ResNet-50 at 224 px: its largest stage outputs); 32 leaves room for attention maps.
ACTIVATION_FACTOR = 32
# Share of the free device memory the models of one pass may take (the rest: decode buffers, fragmentation).
BUDGET_FRACTION = 0.8


@dataclass(frozen=True)
class Footprint:
    """What a model's device memory depends on: parameter count, input size (C, H, W), batch size, gradients."""

    parameters: int
    input_size: tuple[int, int, int]
    batch_size: int
    gradients: bool = False

    @property
    def nbytes(self) -> int:
        """Estimated peak device memory of the model running one batch, in bytes."""
        weights = 4 * self.parameters * 1.2
        activations = 4 * ACTIVATION_FACTOR * self.batch_size * math.prod(self.input_size)
        return int(weights + activations * (3 if self.gradients else 1))


def count_parameters(module: torch.nn.Module) -> int:
    """Number of parameters (works on meta-device modules)."""
    return sum(p.numel() for p in module.parameters())


def device_memory(device: str | torch.device) -> int:
    """Free memory of the device in bytes: CUDA's free memory, or the host's available memory for CPU."""
    device = torch.device(device)
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free)
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))


def pack_passes(sizes: Sequence[int | None], budget: int) -> list[list[int]]:
    """Indices of models packed first-fit, in order, into passes whose estimated sizes add up to at most `budget`.

    A model whose size is unknown (None) or alone exceeds the budget runs alone in its own pass.
    """
    passes: list[list[int]] = []
    room: list[int] = []
    for index, size in enumerate(sizes):
        if size is None or size > budget:
            passes.append([index])
            room.append(-1)
            continue
        for number, left in enumerate(room):
            if left >= size:
                passes[number].append(index)
                room[number] -= size
                break
        else:
            passes.append([index])
            room.append(budget - size)
    return passes


def footprint_of(backbone: Any, batch_size: int) -> Footprint:
    """The footprint of a loaded backbone (its whole module: an open_clip model keeps its text tower on the device)."""
    return Footprint(
        count_parameters(backbone.model),
        tuple(int(v) for v in backbone.input_size()),  # type: ignore[arg-type]
        batch_size,
        gradients=bool(getattr(backbone, "nac_layers", ())),
    )
