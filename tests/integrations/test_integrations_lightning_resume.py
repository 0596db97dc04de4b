"""Lightning: a fit killed after any optimizer step (an epoch's last one included, where
``ModelCheckpoint(every_n_train_steps=k)`` saves before the epoch's end) and resumed with
``ckpt_path`` runs every action at the ``global_step`` the uninterrupted fit ran it at, and
fires what ``simulate()`` predicts."""

from __future__ import annotations

import logging
import warnings
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

pytest.importorskip("lightning")
import lightning.pytorch as pl
import torch
from host_strategies import counters, host_schedules
from torch.utils.data import DataLoader

from schedtrain import Schedule, ScheduleWarning, Unit, every, on, simulate
from schedtrain.integrations.lightning import ScheduleCallback

for _name in ("lightning", "lightning.pytorch", "lightning.fabric"):
    logging.getLogger(_name).setLevel(logging.ERROR)
quiet = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::DeprecationWarning")

Shape = tuple[int, int, int]
"""Epochs, optimizer steps per epoch, batches per step."""


class Module(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(3, 1)

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        return self.layer(batch).pow(2).mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


class Observed:
    """A ``ScheduleCallback`` whose every callback records ``(name, trainer.global_step)``."""

    def __init__(self, schedule: Schedule) -> None:
        self.seen: list[tuple[str, int]] = []
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ScheduleWarning)
            self.callback = ScheduleCallback(
                schedule, {n: self._action(n) for n in schedule.names}, record=True)

    def _action(self, name: str) -> Any:
        return lambda trainer, module: self.seen.append((name, trainer.global_step))


def fit(callbacks: list[Any], shape: Shape, ckpt_path: Path | None = None) -> None:
    epochs, steps, accum = shape
    saving = any(isinstance(c, pl.callbacks.ModelCheckpoint) for c in callbacks)
    pl.Trainer(logger=False, enable_checkpointing=saving, enable_progress_bar=False,
               enable_model_summary=False, num_sanity_val_steps=0, accelerator="cpu",
               callbacks=callbacks, max_epochs=epochs, accumulate_grad_batches=accum).fit(
        Module(), DataLoader(torch.zeros(steps * accum * 2, 3), batch_size=2),
        ckpt_path=ckpt_path)


def simulated(schedule: Schedule, shape: Shape) -> list[tuple[object, ...]]:
    epochs, steps, accum = shape
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ScheduleWarning)
        return counters(simulate(schedule, epochs=epochs, steps_per_epoch=steps,
                                 batches_per_step=accum, samples_per_batch=2))


def killed_and_resumed(schedule: Schedule, shape: Shape, cut: int, folder: Path
                       ) -> tuple[list[tuple[str, int]], list[tuple[object, ...]]]:
    """What the actions saw and what fired: up to the checkpoint of step ``cut`` in a fit
    killed just after it, then in the fit resumed from that checkpoint."""
    first = Observed(schedule)
    saver = pl.callbacks.ModelCheckpoint(dirpath=folder, every_n_train_steps=1,
                                         save_top_k=-1, filename="{step}")
    saved: list[tuple[int, int]] = []  # (actions run, firings) when the checkpoint was taken

    class Kill(pl.Callback):
        def on_train_batch_end(self, tr: pl.Trainer, *_: Any) -> None:
            if tr.global_step == cut and not saved:  # ModelCheckpoint saves right after
                saved.append((len(first.seen), len(first.callback.firings)))

        def on_train_batch_start(self, tr: pl.Trainer, *_: Any) -> None:
            if tr.global_step == cut:
                raise KeyError("killed")

    with pytest.raises(KeyError):
        fit([first.callback, Kill(), saver], shape)
    second = Observed(schedule)
    fit([second.callback], shape, ckpt_path=folder / f"step={cut}.ckpt")
    seen, fired = saved[0]
    return (first.seen[:seen] + second.seen,
            counters(first.callback.firings[:fired] + second.callback.firings))


@quiet
class TestResumeAtEveryStep:
    """Killed after each step of a small fit in turn, epoch ends included."""

    @settings(max_examples=3, deadline=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
    @given(schedule=host_schedules([Unit.STEP, Unit.BATCH, Unit.EPOCH, Unit.SAMPLE]),
           shape=st.tuples(st.integers(2, 3), st.integers(1, 2), st.integers(1, 2)))
    # every epoch boundary is a kill point; epoch_end/epoch_start actions read global_step
    @example(schedule=Schedule({"end": every("1 epoch"), "start": on("epoch_start"),
                                "step": every("2 steps")}), shape=(3, 2, 1))
    def test_actions_see_the_uninterrupted_global_step(
            self, schedule: Schedule, shape: Shape, tmp_path_factory: pytest.TempPathFactory
    ) -> None:
        """For every kill point: the (callback, global_step) each action saw and the
        firings equal the uninterrupted fit's, which equal ``simulate()``'s; a firing at
        an epoch or step boundary sees ``global_step`` equal to the schedule's step."""
        whole = Observed(schedule)
        fit([whole.callback], shape)
        expected = counters(whole.callback.firings)
        assert expected == simulated(schedule, shape)
        for (name, step), firing in zip(whole.seen, whole.callback.firings, strict=True):
            assert name == firing.callback
            if firing.event != "batch_end":  # a batch end closing a step sees it taken
                assert step == firing.timestamp.step
        epochs, steps, _ = shape
        for cut in range(1, epochs * steps):
            seen, fired = killed_and_resumed(schedule, shape, cut, tmp_path_factory.mktemp("c"))
            assert (cut, seen) == (cut, whole.seen)
            assert (cut, fired) == (cut, expected)
