"""pytorch-accelerated's custom callback event: ``verify_train_batch`` with the batch.

pytorch-accelerated subclasses its trainer to call a new event from the loss
computation. Here a callback fires the event (declared on the schedule) with the batch
as payload, and any callback whose trigger names the event reads it from
``self.trainer.payload``; triggers combine the event with anything else (``window``
below checks only the first 3 steps).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch

from schedtrain import Schedule, on, window
from schedtrain.callbacks import Callback
from schedtrain.training import Trainer

if not __package__:  # `python examples/seeds/NAME.py`: the repository root holds `examples`
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from examples.seeds._data import BATCH, loaders, model


class FireVerifyEvent(Callback):
    """Fires ``verify_train_batch`` before each step, with the step's images and labels."""

    def _before_step(self, step: int, batch: Any) -> None:
        xb, yb = batch
        self.fire("verify_train_batch", xb=xb, yb=yb)


class VerifyBatchOnEvent(Callback):
    """Checks the payload of ``verify_train_batch``."""

    def __init__(self) -> None:
        self.seen: list[tuple[int, ...]] = []

    def _trigger(self) -> None:
        xb, yb = self.trainer.payload["xb"], self.trainer.payload["yb"]
        if xb.shape[1:] != (1, 28, 28) or yb.shape[0] != xb.shape[0]:
            raise ValueError(f"bad batch: images {tuple(xb.shape)}, labels {tuple(yb.shape)}")
        self.seen.append(tuple(xb.shape))


def main() -> list[tuple[int, ...]]:
    """Train one epoch; returns the batch shapes the listener checked."""
    torch.set_num_threads(1)  # a tiny model: one thread is faster (docs/performance.md#cpu-threads)
    train, _ = loaders()
    net = model()
    listener = VerifyBatchOnEvent()
    schedule = Schedule({"emit": on("train_start"),
                         "verify": on("verify_train_batch") & window(stop="3 steps")},
                        events=["verify_train_batch"])
    Trainer(net, torch.optim.SGD(net.parameters(), lr=0.1), train,
            torch.nn.functional.cross_entropy, max_epochs=1, device="cpu",
            schedule=schedule, bindings={"emit": FireVerifyEvent(), "verify": listener}).fit()
    print(f"checked {len(listener.seen)} batches of shape {listener.seen[0]} (batch {BATCH})")
    return listener.seen


if __name__ == "__main__":
    main()
