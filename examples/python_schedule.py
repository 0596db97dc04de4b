"""Compose triggers in Python with a custom callback; no TOML.

Run from the repository root: ``python examples/python_schedule.py`` (or ``python -m
examples.python_schedule``).
"""

from __future__ import annotations

import logging

import structlog
import torch
from torch.utils.data import DataLoader, TensorDataset

from schedtrain import Scheduled, at, every, improved, on, window
from schedtrain.callbacks import Callback, PeriodicTrigger
from schedtrain.callbacks.inference import InferenceRunner
from schedtrain.callbacks.stopping import TerminateOnNaN
from schedtrain.training import Trainer


class WeightNorm(Callback):
    """Report the model's weight norm (what); the schedule below says when."""

    produces = ("weights/norm",)

    def _trigger(self) -> None:
        norm = torch.sqrt(sum((p.detach() ** 2).sum() for p in self.model.parameters()))
        self.metrics.put("weights/norm", norm)  # stays on the device until read


class Announce(Callback):
    """Print a line whenever validation accuracy improves."""

    needs = ("val/accuracy",)

    def _trigger(self) -> None:
        print(f"new best accuracy {self.metrics.value('val/accuracy'):.3f} "
              f"at step {self.now.step}")


def main() -> None:
    """Train a linear classifier on synthetic data for 6 epochs."""
    # An application may configure logging (the library never does): hide per-firing debug lines.
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.INFO))
    torch.set_num_threads(1)
    torch.manual_seed(0)
    x = torch.randn(512, 10)
    y = (x[:, :3].sum(1) > 0).long()
    model = torch.nn.Linear(10, 2)
    trainer = Trainer(
        model, torch.optim.SGD(model.parameters(), lr=0.2),
        DataLoader(TensorDataset(x, y), batch_size=32, shuffle=True),
        torch.nn.functional.cross_entropy,
        val_data=DataLoader(TensorDataset(x, y), batch_size=256),
        callbacks=[
            # validate every epoch, and every 5 steps during the first epoch
            Scheduled(every("1 epoch") | (every("5 steps") & window(stop="1 epoch")),
                      InferenceRunner()),
            Scheduled(improved("val/accuracy", mode="max"), Announce()),
            Scheduled(at("10 steps", "50 steps") | on("train_end"), WeightNorm()),
            PeriodicTrigger(TerminateOnNaN(), every_k_steps=20),
        ],
        max_epochs=6)
    trainer.fit()
    print("weight norms:", trainer.metrics.history("weights/norm"))
    print("final accuracy:", round(trainer.metrics.value("val/accuracy"), 3))


if __name__ == "__main__":
    main()
