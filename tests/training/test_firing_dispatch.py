"""What each firing sees and what the trainer keeps of its firings."""

from __future__ import annotations

import torch
from training_helpers import UnevenData, tiny_model

from schedtrain import Schedule, every
from schedtrain.callbacks import Callback
from schedtrain.schedule.firings import Firing
from schedtrain.training import Trainer


class _SeesLoss(Callback):
    """Records the ``train/loss`` value and count it sees when it fires."""

    def __init__(self) -> None:
        self.seen: list[tuple[int, float, int]] = []

    def _trigger(self) -> None:
        latest = self.metrics.latest("train/loss")
        assert latest is not None
        self.seen.append((self.trainer.clock.step, float(latest.value), latest.count))


def _trainer(steps: int, n: int, **kw: object) -> tuple[Trainer, list[_SeesLoss]]:
    model, opt = tiny_model()
    cbs = [_SeesLoss() for _ in range(n)]
    names = {f"cb{i}": every("2 steps") for i in range(n)}
    trainer = Trainer(model, opt, UnevenData([steps]), torch.nn.functional.mse_loss,
                      schedule=Schedule(names),
                      bindings=dict(zip(names, cbs, strict=True)), max_epochs=1, **kw)  # type: ignore[arg-type]
    return trainer, cbs


def test_every_callback_firing_at_an_event_sees_its_train_loss() -> None:
    """``train/loss`` is put once per event, before its first firing: all callbacks
    firing there see the same value, the next event a new one."""
    trainer, cbs = _trainer(6, 3)
    trainer.fit()
    first = cbs[0].seen
    assert [(step, count) for step, _, count in first] == [(2, 1), (4, 2), (6, 3)]
    assert all(cb.seen == first for cb in cbs[1:])


def test_firings_keeps_the_most_recent_as_firing_records() -> None:
    trainer, _ = _trainer(6, 2, keep_firings=3)
    trainer.fit()
    kept = trainer.firings
    assert all(isinstance(f, Firing) for f in kept)
    assert [(f.callback, f.event, f.step) for f in kept] == [
        ("cb1", "step_end", 4), ("cb0", "step_end", 6), ("cb1", "step_end", 6)]
    assert trainer.firings == kept
