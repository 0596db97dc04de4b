"""tensorpack's ResNet callback list, on a tiny CNN and scikit-learn's digits.

The seed (tensorpack's docs) trains a ResNet with ModelSaver, MinSaver on
``val-error-top1``, an InferenceRunner with top-1 and top-5 ClassificationErrors, a
scheduled and a hand-set learning rate, SendStat, GPUUtilizationTracker, InjectShell,
MovingAverageSummary and ProgressBar. The same list here runs on CPU in seconds, from the
repository root::

    python examples/seeds/tensorpack_resnet.py [RUN_DIR]

(or ``python -m examples.seeds.tensorpack_resnet``). RUN_DIR defaults to
``runs/tensorpack_resnet``; each run starts it afresh, removing what an earlier run wrote
there (as ``schedtrain train --overwrite`` does), so the command runs again as written.
While it runs, ``echo "lr = 0.0001" > runs/tensorpack_resnet/hyper.txt`` changes the
learning rate at the next epoch, and ``touch runs/tensorpack_resnet/shell`` opens a
shell (from a terminal). ``specs/seeds/tensorpack_resnet.toml`` is the same list in TOML.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from schedtrain.callbacks import (
    ClassificationError,
    GPUUtilizationTracker,
    HumanHyperParamSetter,
    InferenceRunner,
    InjectShell,
    MinSaver,
    ModelSaver,
    MovingAverageSummary,
    ProgressBar,
    ScalarStats,
    ScheduledHyperParamSetter,
    SendStat,
)
from schedtrain.training import Task, Trainer

EPOCHS = 6
#: tensorpack's ResNet schedule, in this run's epochs.
LR_SCHEDULE = [(0, 1e-2), (3, 3e-3), (5, 1e-3)]
#: What SendStat runs: a harmless stand-in for the seed's curl to a phone.
NOTIFY = ("import sys, pathlib; "
          "pathlib.Path(sys.argv[1]).write_text(' '.join(sys.argv[2:]) + chr(10))")


def make_task(batch_size: int = 64) -> Task:
    """A two-layer CNN on the 8x8 digits (1797 images), Adam, a fixed validation split."""
    try:
        from sklearn.datasets import load_digits
    except ImportError as exc:
        raise ImportError("examples.seeds.tensorpack_resnet needs scikit-learn: "
                          "pip install 'schedtrain[examples]'") from exc
    data = load_digits()
    x = torch.tensor(data.images, dtype=torch.float32).unsqueeze(1) / 16.0
    y = torch.tensor(data.target, dtype=torch.long)
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(1234))
    val_idx, train_idx = order[:360], order[360:]
    model = nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(),
        nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.ReLU(),
        nn.Flatten(), nn.Linear(32 * 4 * 4, 10))
    optimizer = torch.optim.Adam(model.parameters(), lr=LR_SCHEDULE[0][1])
    train = DataLoader(TensorDataset(x[train_idx], y[train_idx]), batch_size=batch_size,
                       shuffle=True)
    val = DataLoader(TensorDataset(x[val_idx], y[val_idx]), batch_size=256)
    return Task(model, optimizer, train, val, loss_fn=nn.functional.cross_entropy)


def callbacks(shell_hook: Any = None) -> list[Any]:
    """The seed's list, in an order schedtrain accepts: a callback that reads a metric
    comes after the one producing it (tensorpack put MinSaver first)."""
    return [
        ModelSaver(keep=2),                                # every epoch
        InferenceRunner(inferencers=[                      # every epoch
            ScalarStats(["loss"]),
            ClassificationError(1, "val-error-top1"),
            ClassificationError(5, "val-error-top5")]),
        MinSaver("val-error-top1"),                        # best/min-val-error-top1.pt
        ScheduledHyperParamSetter("lr", LR_SCHEDULE),
        HumanHyperParamSetter("lr"),                       # RUN_DIR/hyper.txt, after the schedule
        SendStat([sys.executable, "-c", NOTIFY, "{run_dir}/sent.txt",
                  "epoch={epoch}", "val-error-top1={val-error-top1}"],
                 ["val-error-top1"], timeout=10),
        GPUUtilizationTracker(),                           # host figures on a CPU machine
        InjectShell(shell="ipython", hook=shell_hook),     # touch RUN_DIR/shell
        MovingAverageSummary(["train/loss"]),              # train/loss_ema, every step
        ProgressBar(),
    ]


def build(run_dir: str | Path, extra: Sequence[Any] = (), shell_hook: Any = None,
          **kw: Any) -> Trainer:
    """A trainer of the task with the seed's callbacks (and ``extra`` ones after them)."""
    task = make_task()
    return Trainer(task.model, task.optimizer, task.train_data, task.loss_fn,
                   val_data=task.val_data, callbacks=[*callbacks(shell_hook), *extra],
                   max_epochs=EPOCHS, run_dir=run_dir, seed=0, **kw)


def main(run_dir: str | Path = "runs/tensorpack_resnet") -> Trainer:
    """Train afresh in ``run_dir`` with the seed's list and print the two validation
    errors."""
    torch.set_num_threads(1)  # a tiny model: one thread is faster (docs/performance.md#cpu-threads)
    trainer = build(run_dir, overwrite=True)
    trainer.fit()
    print(f"val-error-top1 {trainer.metrics.value('val-error-top1'):.4f}, "
          f"val-error-top5 {trainer.metrics.value('val-error-top5'):.4f}")
    return trainer


if __name__ == "__main__":
    main(*sys.argv[1:2])
