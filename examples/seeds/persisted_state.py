"""Lightning's "Persisting State": a callback whose state survives a resume.

``state_dict()`` / ``load_state_dict()`` are saved in every checkpoint under the
callback's name, so two callbacks of one class are fine as long as each has a name
(Lightning allows only one instance per class). Here ``LossStats`` keeps the count,
sum and minimum of the step losses; a run stopped after 2 epochs and resumed for 2 more
ends with the same statistics as one run of 4 epochs.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

from schedtrain import Scheduled, every
from schedtrain.callbacks import Callback, ModelSaver, StepOutputs
from schedtrain.training import Trainer

if not __package__:  # `python examples/seeds/NAME.py`: the repository root holds `examples`
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from examples.seeds._data import loaders, model


class LossStats(Callback):
    """Count, sum and minimum of the step losses (kept on the device until read)."""

    def __init__(self) -> None:
        self.count = 0
        self.total = torch.zeros(())
        self.best = torch.tensor(float("inf"))

    def _after_step(self, step: int, outputs: StepOutputs) -> None:
        loss = outputs.loss.cpu()
        self.count += 1
        self.total = self.total + loss
        self.best = torch.minimum(self.best, loss)

    def _trigger(self) -> None:
        self.metrics.put("loss/mean_so_far", self.total / self.count)

    def state_dict(self) -> dict[str, Any]:
        return {"count": self.count, "total": self.total, "best": self.best}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.count = state["count"]
        self.total, self.best = state["total"], state["best"]


def _trainer(run_dir: Path, epochs: int, stats: LossStats) -> Trainer:
    train, _ = loaders()
    net = model()
    return Trainer(net, torch.optim.SGD(net.parameters(), lr=0.1), train,
                   torch.nn.functional.cross_entropy, max_epochs=epochs, device="cpu",
                   run_dir=run_dir, callbacks=[
                       Scheduled(every("1 epoch"), stats, name="loss_stats"),
                       ModelSaver(keep=None)])


def main(folder: str | Path | None = None) -> tuple[LossStats, LossStats]:
    """One run of 4 epochs, and one of 2 resumed for 2 more; returns both statistics."""
    torch.set_num_threads(1)  # a tiny model: one thread is faster (docs/performance.md#cpu-threads)
    folder = Path(folder or tempfile.mkdtemp(prefix="persisted-state-"))
    whole = LossStats()
    _trainer(folder / "whole", 4, whole).fit()
    _trainer(folder / "cut", 2, LossStats()).fit()
    resumed = LossStats()
    trainer = _trainer(folder / "cut", 4, resumed)
    trainer.resume(folder / "cut" / "checkpoints" / f"step-{32:08d}.pt")  # 2 epochs of 16
    trainer.fit()
    for name, s in (("uninterrupted", whole), ("resumed", resumed)):
        print(f"{name}: {s.count} steps, mean {float(s.total) / s.count:.4f}, "
              f"min {float(s.best):.4f}")
    return whole, resumed


if __name__ == "__main__":
    main()
