"""A job whose training targets are the samples' indices, so a run on several processes
can record every sample each rank sees (tests/test_resume_world_size.py)."""

from __future__ import annotations

import json
from typing import Any

import torch
from torch.utils.data import DataLoader, TensorDataset

from schedtrain.callbacks import Callback
from schedtrain.callbacks.payloads import StepOutputs
from schedtrain.training import Task

SIZE = 96
_TARGETS = torch.randn(SIZE, generator=torch.Generator().manual_seed(1))


def _loss(out: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.mse_loss(out.squeeze(-1), _TARGETS[index])


def make_task(batch_size: int = 4) -> Task:
    """96 samples of 4 features, batches of 4; a batch's second part is its indices."""
    x = torch.randn(SIZE, 4, generator=torch.Generator().manual_seed(0))
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    data = DataLoader(TensorDataset(x, torch.arange(SIZE)), batch_size=batch_size,
                      shuffle=True)
    return Task(model=model, optimizer=optimizer, train_data=data, loss_fn=_loss)


class SeenIndices(Callback):
    """Records the indices of every batch this rank trains on, with the step and epoch;
    at its trigger writes them to ``RUN_DIR/../seen-{world}-rank{rank}.json``."""

    may_stop_alone = False

    def __init__(self) -> None:
        self.seen: list[list[Any]] = []

    def _after_step(self, step: int, outputs: StepOutputs) -> None:
        self.seen.append([step, self.now.epoch, outputs.batch[1].tolist()])

    def _trigger(self) -> None:
        assert self.trainer.run_dir is not None
        world = torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1
        out = self.trainer.run_dir.parent / f"seen-{world}-rank{self.rank}.json"
        out.write_text(json.dumps(self.seen))


class Tick(Callback):
    """Does nothing; its firings are what the test compares."""

    may_stop_alone = False
