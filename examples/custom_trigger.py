"""A trigger of your own: log-spaced checkpoints (steps 1, 2, 4, 8, ...).

``LogSpaced`` implements the same protocol as the built-in triggers (the events it
watches, when it is next due, whether it fires), so it fires identically in
``simulate()``, in ``schedtrain plan --import specs/custom_trigger.toml`` and in a real
``Trainer`` run. Run from the repository root::

    python examples/custom_trigger.py       # or: python -m examples.custom_trigger
"""

from __future__ import annotations

import json
import subprocess
import sys

import attrs

from schedtrain import FiringLog, Schedule, Time, Timestamp, simulate
from schedtrain.events import EventSet
from schedtrain.triggers import NEVER, Due, Point, Trigger, due_on


@attrs.frozen(repr=False)
class LogSpaced(Trigger):
    """Fires where its counter first reaches ``first``, ``first * factor``, ``first * factor**2``...

    Args:
        first: the first point, e.g. ``"1 step"`` or ``"1M tokens"``.
        factor: how much each point is farther than the last (a whole number >= 2).
    """

    first: Time = attrs.field(converter=Time.parse)
    factor: int = 2

    def __attrs_post_init__(self) -> None:
        if self.first.base < 1 or self.factor < 2:
            raise ValueError(f"LogSpaced needs first > 0 and factor >= 2, got {self!r}")

    def _after(self, value: int) -> int:
        """The first point strictly after ``value`` (in the counter's own unit)."""
        point = self.first.base
        while point <= value:
            point *= self.factor
        return point

    # The protocol: where it can fire, when it is next due, whether it fires.
    def events(self) -> EventSet:
        return EventSet.of(self.first.unit.event)

    def bound(self, event: str, last: Timestamp) -> Due:
        if event != self.first.unit.event:
            return NEVER
        return due_on(self.first.counter, self._after(last.get(self.first.counter)))

    def evaluate(self, pt: Point) -> bool:
        counter = self.first.counter
        return (pt.event == self.first.unit.event
                and self._after(pt.prev.get(counter)) <= pt.now.get(counter))

    def __repr__(self) -> str:
        return f"LogSpaced({str(self.first)!r}, factor={self.factor})"


SCHEDULE = Schedule({"checkpoint": LogSpaced("1 step")})


def in_simulation() -> list[int]:
    """Steps at which it fires in a simulated run of 3 epochs of 40 steps."""
    return simulate(SCHEDULE, epochs=3, steps_per_epoch=40).steps("checkpoint")


def in_plan() -> list[int]:
    """Steps at which ``schedtrain plan --import specs/custom_trigger.toml`` lists it."""
    out = subprocess.run([sys.executable, "-m", "schedtrain", "plan", "--import",
                          "specs/custom_trigger.toml", "--format", "json"],
                         capture_output=True, text=True, check=True).stdout
    return [f["step"] for f in json.loads(out)["firings"] if f["callback"] == "checkpoint"]


def in_training() -> list[int]:
    """Steps at which it fires in a real training run of the same shape."""
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    from schedtrain.callbacks import Callback
    from schedtrain.training import Trainer

    class Note(Callback):
        def _trigger(self) -> None:
            pass

    x = torch.randn(160, 3)
    data = DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=4)
    model = torch.nn.Linear(3, 1)
    trainer = Trainer(model, torch.optim.SGD(model.parameters(), lr=0.01), data,
                      torch.nn.functional.mse_loss, schedule=SCHEDULE,
                      bindings={"checkpoint": Note()}, max_epochs=3)
    trainer.fit()
    return FiringLog(trainer.firings).steps("checkpoint")


if __name__ == "__main__":
    simulated, planned, trained = in_simulation(), in_plan(), in_training()
    print(f"simulate():         {simulated}")
    print(f"plan --import:      {planned}")
    print(f"a real Trainer run: {trained}")
    assert simulated == planned == trained == [1, 2, 4, 8, 16, 32, 64], "they disagree"
    print("all three agree")
