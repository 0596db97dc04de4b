"""pytorch-accelerated's ``VerifyBatchCallback``: check each training batch before its step.

``_before_step(step, batch)`` sees the step's first micro-batch before the forward pass,
so a wrong batch stops training before it reaches the model, with a message saying what
was wrong (an ``assert`` would vanish under ``python -O``).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch

from schedtrain import on
from schedtrain.callbacks import Callback
from schedtrain.training import Trainer

if not __package__:  # `python examples/seeds/NAME.py`: the repository root holds `examples`
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from examples.seeds._data import BATCH, loaders, model


class VerifyBatch(Callback):
    """Refuse a batch whose images are not ``(batch_size, 1, 28, 28)`` with as many labels."""

    default_trigger = on("train_end")  # it works in a hook; its trigger does nothing

    def __init__(self, batch_size: int) -> None:
        self.batch_size = batch_size
        self.checked = 0

    def _before_step(self, step: int, batch: Any) -> None:
        xb, yb = batch
        expected = (self.batch_size, 1, 28, 28)
        if tuple(xb.shape) != expected:
            raise ValueError(f"step {step}: images of shape {tuple(xb.shape)}, "
                             f"expected {expected}")
        if yb.shape != (self.batch_size,):
            raise ValueError(f"step {step}: {tuple(yb.shape)} labels for "
                             f"{self.batch_size} images")
        self.checked += 1


def main(*, drop_last: bool = True) -> int:
    """Train one epoch; returns how many batches were checked.

    With ``drop_last=False`` the last, smaller batch fails the check.
    """
    torch.set_num_threads(1)  # a tiny model: one thread is faster (docs/performance.md#cpu-threads)
    train, _ = loaders(n=250)
    train = torch.utils.data.DataLoader(train.dataset, batch_size=BATCH, drop_last=drop_last)
    net = model()
    verify = VerifyBatch(BATCH)
    Trainer(net, torch.optim.SGD(net.parameters(), lr=0.1), train,
            torch.nn.functional.cross_entropy, max_epochs=1, device="cpu",
            callbacks=[verify]).fit()
    print(f"{verify.checked} batches checked")
    return verify.checked


if __name__ == "__main__":
    main()
