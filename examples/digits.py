"""A real task: a small MLP on scikit-learn's bundled digits (8x8 images, 1797 samples).

Used by ``specs/digits.toml`` as ``task = "examples.digits:make_task"``; run from
the repository root::

    schedtrain train specs/digits.toml

The run directory (``runs/digits``) then holds the run, so the same command again is
refused: add ``--overwrite`` to start over, or ``--resume auto`` to continue it.
``python examples/digits.py`` only imports the module (it runs nothing).

No download: ``load_digits`` ships with scikit-learn (the ``examples`` extra).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from schedtrain.training import Task


def make_task(batch_size: int = 32, hidden: int = 128, val_fraction: float = 0.2) -> Task:
    """The digits MLP, Adam, a shuffled training loader and a fixed validation split."""
    try:
        from sklearn.datasets import load_digits
    except ImportError as exc:
        raise ImportError("examples.digits needs scikit-learn: "
                          "pip install 'schedtrain[examples]'") from exc
    data = load_digits()
    x = torch.tensor(data.data, dtype=torch.float32) / 16.0  # pixels are 0..16
    y = torch.tensor(data.target, dtype=torch.long)
    g = torch.Generator().manual_seed(1234)  # the split does not depend on the run's seed
    order = torch.randperm(len(x), generator=g)
    n_val = int(len(x) * val_fraction)
    val_idx, train_idx = order[:n_val], order[n_val:]
    model = nn.Sequential(
        nn.Linear(64, hidden), nn.ReLU(), nn.Dropout(0.1),
        nn.Linear(hidden, hidden), nn.ReLU(),
        nn.Linear(hidden, 10),
    )
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    train = DataLoader(TensorDataset(x[train_idx], y[train_idx]), batch_size=batch_size,
                       shuffle=True)
    val = DataLoader(TensorDataset(x[val_idx], y[val_idx]), batch_size=256)
    return Task(model, optimizer, train, val, loss_fn=nn.functional.cross_entropy)
