"""Tiny MNIST-shaped data (1x28x28 images, 10 classes) and a model for the seed examples."""

from __future__ import annotations

import torch
from torch.utils.data import DataLoader, TensorDataset

BATCH = 16
CLASSES = 10


def loaders(n: int = 256, seed: int = 0) -> tuple[DataLoader, DataLoader]:
    """Training and validation loaders of learnable random images (the label is the
    brightest of ten bands)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, 1, 28, 28, generator=g)
    y = torch.randint(0, CLASSES, (n,), generator=g)
    x[torch.arange(n), 0, y * 2 + 4] += 1.0  # make the label visible in one row
    # shuffled by the global generator, which the trainer seeds and checkpoints
    train = DataLoader(TensorDataset(x, y), batch_size=BATCH, shuffle=True)
    return train, DataLoader(TensorDataset(x[: n // 4], y[: n // 4]), batch_size=32)


def model() -> torch.nn.Module:
    """A linear classifier over the flattened image."""
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(28 * 28, CLASSES))
