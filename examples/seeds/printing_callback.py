"""Lightning's ``MyPrintingCallback``: print at the trainer's set-up and at the end.

Lightning's ``on_init_start``/``on_init_end`` become ``_setup`` (once, when the
trainer binds its callbacks, before training); ``on_train_end`` becomes the trigger
``on("train_end")``, so the same class could print at any other time by changing the
trigger alone.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from schedtrain import on
from schedtrain.callbacks import Callback
from schedtrain.training import Trainer

if not __package__:  # `python examples/seeds/NAME.py`: the repository root holds `examples`
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from examples.seeds._data import loaders, model


class MyPrinting(Callback):
    """Prints when it is set up, when training starts and when its trigger fires."""

    default_trigger = on("train_end")

    def _setup(self) -> None:
        print("Starting to init trainer!")
        print("trainer is init now")

    def _before_train(self) -> None:
        print(f"training starts at step {self.now.step}")

    def _trigger(self) -> None:
        print(f"do something when training ends (step {self.now.step})")


def main() -> None:
    """Train one epoch with the printing callback."""
    train, _ = loaders(n=64)
    net = model()
    Trainer(net, torch.optim.SGD(net.parameters(), lr=0.1), train,
            torch.nn.functional.cross_entropy, max_epochs=1, device="cpu",
            callbacks=[MyPrinting()]).fit()


if __name__ == "__main__":
    main()
