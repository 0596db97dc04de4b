"""A small, deterministic job for crash and preemption tests: shuffled data, workers,
dropout and Adam, so an inexact resume shows in the weights."""

from __future__ import annotations

import os
import time
from collections.abc import Callable

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from schedtrain.training import Task


def make_task() -> Task:
    """A 2-class MLP on 512 fixed samples; batches of 8, shuffled, optionally by workers."""
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(7)  # the data does not depend on the run's seed
    x = torch.randn(512, 16, generator=g)
    y = (x[:, :4].sum(1) > 0).long()
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Dropout(0.2), nn.Linear(64, 2))
    workers = int(os.environ.get("CRASH_JOB_WORKERS", "0"))
    train = DataLoader(TensorDataset(x, y), batch_size=8, shuffle=True, num_workers=workers)
    val = DataLoader(TensorDataset(x[:128], y[:128]), batch_size=64)
    pause = float(os.environ.get("CRASH_JOB_STEP_SECONDS", "0"))
    return Task(model, torch.optim.Adam(model.parameters(), lr=1e-3), train, val,
                loss_fn=_paced(pause) if pause else nn.functional.cross_entropy)


def _paced(seconds: float) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """The loss, each step at least ``seconds`` long: a test that must reach a running job
    (a live retime) finds it running on an idle machine too; the numbers are unchanged."""
    def loss(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        time.sleep(seconds)
        return nn.functional.cross_entropy(out, target)
    return loss
