"""The job every lifecycle of tests/lifecycle/ trains: 64 fixed rows in batches of 8 (8 steps
an epoch), shuffled, a 4-8-2 MLP with Adam, seeded by the run; the CPU, one thread. Its
callbacks: ``Digest`` writes the digest of the model's weights (every tensor's bytes, by
name) to ``RUN_DIR/weights.digest`` at train_end, so a finished run's final weights are
compared exactly with an uninterrupted run's; ``Pace`` slows a job down."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from schedtrain.callbacks import Callback
from schedtrain.training import Task

#: Called before each training forward's loss (set in a forked child by
#: life_faults: a fault planted at a step); never set in the parent.
HOOK: Callable[[], None] | None = None

ROWS, BATCH = 64, 8
STEPS_PER_EPOCH = ROWS // BATCH


def make_task() -> Task:
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(11)  # the data does not depend on the run's seed
    x = torch.randn(ROWS, 4, generator=g)
    y = (x[:, :2].sum(1) > 0).long()
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    train = DataLoader(TensorDataset(x, y), batch_size=BATCH, shuffle=True)
    val = DataLoader(TensorDataset(x[:32], y[:32]), batch_size=32)
    return Task(model, torch.optim.Adam(model.parameters(), lr=1e-2), train, val,
                loss_fn=_loss)


def _loss(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    if HOOK is not None and torch.is_grad_enabled():  # training, not validation
        HOOK()
    return nn.functional.cross_entropy(out, target)

DIGEST_FILE = "weights.digest"


class Digest(Callback):
    def _trigger(self) -> None:
        run_dir = self.trainer.run_dir
        if run_dir is None:
            return
        h = hashlib.sha256()
        for key, value in sorted(self.trainer.model.state_dict().items()):
            h.update(key.encode())
            h.update(value.detach().cpu().contiguous().numpy().tobytes())
        (run_dir / DIGEST_FILE).write_text(h.hexdigest() + "\n")


class Pace(Callback):
    """Sleeps a while at each firing: a job on several processes, killed from outside
    once a checkpoint lands, is still running then."""

    def _trigger(self) -> None:
        time.sleep(0.05)
