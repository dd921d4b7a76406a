"""A small CNN for 8x8 digits, trained on the CPU, whose penultimate features and head feed the store."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence

import numpy as np
import torch
from torch import nn

from ..core.outputs import Head


class DigitsCNN(nn.Module):
    """Three conv blocks, global average pooling to a 64-d feature, one linear head."""

    def __init__(self, num_classes: int, width: int = 64) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(1, 32, 3, padding=1),
            nn.BatchNorm2d(32),
            nn.ReLU(),
            nn.Conv2d(32, 64, 3, padding=1),
            nn.BatchNorm2d(64),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(64, width, 3, padding=1),
            nn.BatchNorm2d(width),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
        )
        self.fc = nn.Linear(width, num_classes)

    def features(self, images: torch.Tensor) -> torch.Tensor:
        """Penultimate features (input of the final linear layer)."""
        return self.body(images)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.fc(self.features(images))


def train_cnn(
    images: np.ndarray,
    labels: np.ndarray,
    num_classes: int,
    *,
    epochs: int = 40,
    seed: int = 0,
    batch_size: int = 64,
    lr: float = 3e-3,
    on_epoch: Callable[[int, float], None] | None = None,
) -> DigitsCNN:
    """Train the CNN with Adam and light shift augmentation; deterministic for a given seed (and thread count).

    `on_epoch(epoch, mean_loss)` is called after every epoch (1-based), e.g. to advance a progress bar.
    """
    torch.manual_seed(seed)
    generator = torch.Generator().manual_seed(seed)
    model = DigitsCNN(num_classes)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr, weight_decay=1e-4)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, epochs)
    inputs = torch.from_numpy(images)
    targets = torch.from_numpy(labels)
    model.train()
    for epoch in range(1, epochs + 1):
        order = torch.randperm(len(inputs), generator=generator)
        total = 0.0
        for start in range(0, len(inputs), batch_size):
            batch = order[start : start + batch_size]
            x = inputs[batch]
            # Random 1-pixel shifts: the 8x8 digits are tiny, so this is the augmentation that matters.
            shift = torch.randint(-1, 2, (2,), generator=generator).tolist()
            x = torch.roll(x, shifts=shift, dims=(2, 3))
            loss = nn.functional.cross_entropy(model(x), targets[batch])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            total += float(loss.detach()) * len(batch)
        schedule.step()
        if on_epoch is not None:
            on_epoch(epoch, total / len(inputs))
    model.eval()
    return model


@torch.no_grad()
def forward_arrays(model: DigitsCNN, images: np.ndarray, batch_size: int = 512) -> tuple[np.ndarray, np.ndarray]:
    """(features, logits) as float32 arrays."""
    model.eval()
    features, logits = [], []
    for start in range(0, len(images), batch_size):
        z = model.features(torch.from_numpy(images[start : start + batch_size]))
        features.append(z.numpy())
        logits.append(model.fc(z).numpy())
    return np.concatenate(features).astype(np.float32), np.concatenate(logits).astype(np.float32)


def network_extras(
    model: DigitsCNN, images: np.ndarray, specs: Sequence[str], batch_size: int = 512
) -> dict[str, np.ndarray]:
    """The network-time detectors' arrays (`oodbench.extract.posthoc_net`), keyed by extra name (no ``extra.``)."""
    from ..extract.posthoc_net import NetSpec, network_arrays

    parsed = [NetSpec.parse(spec) for spec in specs]
    model.eval()
    parts: dict[str, list[np.ndarray]] = {}
    for start in range(0, len(images), batch_size):
        # Pixels are grey levels in [0, 1] without normalisation: ODIN's std is 1.
        arrays = network_arrays(model, torch.from_numpy(images[start : start + batch_size]), parsed, std=[1.0])
        for name, values in arrays.items():
            parts.setdefault(name[len("extra.") :], []).append(values)
    return {name: np.concatenate(values) for name, values in parts.items()}


def head_of(model: DigitsCNN) -> Head:
    """The model's final linear layer as a Head."""
    return Head(model.fc.weight.detach().numpy().astype(np.float32), model.fc.bias.detach().numpy().astype(np.float32))


def checkpoint_sha256(model: nn.Module) -> str:
    """SHA-256 over the state dict's names and tensor bytes (stable across pickling details)."""
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()
