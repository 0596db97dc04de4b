"""Lightning: ``ScheduleCallback`` inside a real ``Trainer.fit`` fires what ``simulate()``
predicts on Lightning's clock (global_step under accumulation, batches, epochs, samples and
tokens, a metric the module logs), acts on Lightning, and resumes exactly from its
checkpoints."""

from __future__ import annotations

import logging
import warnings
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

pytest.importorskip("lightning")
import lightning.pytorch as pl
import torch
from host_strategies import counters, host_schedules
from torch.utils.data import DataLoader

from schedtrain import Schedule, ScheduleWarning, Unit, every, improved, on, simulate
from schedtrain.integrations.lightning import ScheduleCallback

UNITS = [Unit.STEP, Unit.BATCH, Unit.EPOCH, Unit.SAMPLE, Unit.TOKEN]
for _name in ("lightning", "lightning.pytorch", "lightning.fabric"):
    logging.getLogger(_name).setLevel(logging.ERROR)


def metric_before(global_step: int) -> float:
    """What the module logs as ``m`` in a training step taken at ``global_step``."""
    return float((global_step * 7) % 5)


class Module(pl.LightningModule):
    """A linear model that logs ``m`` at every batch and counts validation runs."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(3, 1)
        self.validated_at: list[int] = []

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        self.log("m", metric_before(self.global_step), on_step=True)
        return self.layer(batch).pow(2).mean()

    def validation_step(self, batch: torch.Tensor, batch_idx: int) -> None:
        if batch_idx == 0:
            self.validated_at.append(self.global_step)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def loader(batches: int, rows: int) -> DataLoader[torch.Tensor]:
    return DataLoader(torch.zeros(batches * max(rows, 1), 3), batch_size=max(rows, 1))


def trainer(callbacks: list[Any], **kwargs: Any) -> pl.Trainer:
    saving = any(isinstance(c, pl.callbacks.ModelCheckpoint) for c in callbacks)
    return pl.Trainer(logger=False, enable_checkpointing=saving, enable_progress_bar=False,
                      enable_model_summary=False, num_sanity_val_steps=0, accelerator="cpu",
                      callbacks=callbacks, **kwargs)


def schedule_callback(schedule: Schedule, **kwargs: Any) -> ScheduleCallback:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ScheduleWarning)
        return ScheduleCallback(schedule, tokens=lambda b: b.numel(), record=True, **kwargs)


Shape = tuple[int, int, int, int]
"""Epochs, optimizer steps per epoch, batches per step, rows per batch."""


def simulated(schedule: Schedule, shape: Shape, max_steps: int | None = None
              ) -> list[tuple[object, ...]]:
    epochs, steps, accum, rows = shape
    rows = max(rows, 1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ScheduleWarning)
        log = simulate(schedule, epochs=epochs, steps_per_epoch=steps, batches_per_step=accum,
                       samples_per_batch=rows, tokens_per_batch=3 * rows, max_steps=max_steps,
                       metrics={"m": [(s, metric_before(s - 1))
                                      for s in range(1, epochs * steps + 1)]})
    return counters(log)


shapes = st.tuples(st.integers(1, 3), st.integers(1, 4), st.integers(1, 3), st.integers(1, 3))
quiet = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::DeprecationWarning")


@quiet
class TestAgainstSimulation:
    """The firing list inside Lightning is simulate()'s on Lightning's clock."""

    @settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(schedule=host_schedules(UNITS, metric="m"), shape=shapes)
    # a batch_end firing on the value of the step before it (read at that step's end)
    @example(schedule=Schedule({"cb0": every("1 batch") & improved("m")}), shape=(1, 2, 1, 1))
    def test_firings_equal_simulation(self, schedule: Schedule, shape: Shape) -> None:
        """global_step under accumulate_grad_batches, batches, epochs, samples and tokens of
        each batch, windows, conditions and ``improved`` on a logged metric: as simulated."""
        epochs, steps, accum, rows = shape
        cb = schedule_callback(schedule)
        trainer([cb], max_epochs=epochs, accumulate_grad_batches=accum).fit(
            Module(), loader(steps * accum, rows))
        assert counters(cb.firings) == simulated(schedule, shape)

    @settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(schedule=host_schedules(UNITS, metric="m"), shape=shapes, data=st.data())
    def test_resume_fires_as_the_uninterrupted_run(self, schedule: Schedule, shape: Shape,
                                                   data: st.DataObject,
                                                   tmp_path_factory: pytest.TempPathFactory
                                                   ) -> None:
        """Killed after any optimizer step, resumed with ``ckpt_path`` from the checkpoint
        Lightning's ModelCheckpoint wrote there: what fired up to that checkpoint and what
        the resumed fit fires are the uninterrupted fit's firings."""
        epochs, steps, accum, rows = shape
        total = epochs * steps
        assume(total > 1)
        cut = data.draw(st.integers(1, total - 1), label="killed after step")
        folder = tmp_path_factory.mktemp("ckpt")
        first = schedule_callback(schedule)
        saver = pl.callbacks.ModelCheckpoint(dirpath=folder, every_n_train_steps=1,
                                             save_top_k=-1, filename="{step}")

        saved_after: list[int] = []  # how many firings the checkpoint's fit had made

        class Kill(pl.Callback):
            def on_train_batch_end(self, tr: pl.Trainer, *_: Any) -> None:
                if tr.global_step == cut and not saved_after:  # ModelCheckpoint saves next
                    saved_after.append(len(first.firings))

            def on_train_batch_start(self, tr: pl.Trainer, *_: Any) -> None:
                if tr.global_step == cut:
                    raise KeyError("killed")

        with pytest.raises(KeyError):
            trainer([first, Kill(), saver], max_epochs=epochs,
                    accumulate_grad_batches=accum).fit(Module(), loader(steps * accum, rows))
        second = schedule_callback(schedule)
        trainer([second], max_epochs=epochs, accumulate_grad_batches=accum).fit(
            Module(), loader(steps * accum, rows), ckpt_path=folder / f"step={cut}.ckpt")
        before = first.firings[:saved_after[0]]
        assert counters(before + second.firings) == simulated(schedule, shape)


@quiet
class TestLightningCounters:
    """Lightning's own off-by-ones, as the callback maps them."""

    def test_partial_accumulation_steps_at_epoch_end(self) -> None:
        """5 batches with accumulate_grad_batches=2 make 3 optimizer steps per epoch
        (Lightning steps on an epoch's last batch): ``every 3 steps`` fires at each epoch's
        end, as ``simulate(steps_per_epoch=3)`` says."""
        schedule = Schedule({"s": every("3 steps")})
        cb = schedule_callback(schedule)
        trainer([cb], max_epochs=2, accumulate_grad_batches=2).fit(Module(), loader(5, 1))
        expected = simulate(schedule, epochs=2, steps_per_epoch=3).steps("s")
        assert [f.step for f in cb.firings] == expected == [3, 6]
        assert [f.timestamp.batch for f in cb.firings] == [5, 10]

    def test_max_steps_inside_an_epoch_has_no_epoch_end(self) -> None:
        """A fit cut by ``max_steps`` inside an epoch ends with train_end and no epoch_end,
        though Lightning calls on_train_epoch_end."""
        schedule = Schedule({"e": every("1 epoch") | on("train_end")})
        cb = schedule_callback(schedule)
        trainer([cb], max_epochs=3, max_steps=5).fit(Module(), loader(4, 1))
        assert counters(cb.firings) == simulated(schedule, (3, 4, 1, 1), max_steps=5)
        assert [f.event for f in cb.firings] == ["epoch_end", "train_end"]


    def test_manual_optimization_counts_its_optimizer_steps(self) -> None:
        """Under manual optimization global_step counts the module's own optimizer steps
        (here one per two batches): ``every 2 steps`` fires at batches 4 and 8."""

        class Manual(Module):
            def __init__(self) -> None:
                super().__init__()
                self.automatic_optimization = False

            def training_step(self, batch: torch.Tensor, batch_idx: int) -> None:
                opt = self.optimizers()
                assert isinstance(opt, torch.optim.Optimizer)
                self.manual_backward(self.layer(batch).pow(2).mean())
                if batch_idx % 2:
                    opt.step()
                    opt.zero_grad()

        cb = schedule_callback(Schedule({"s": every("2 steps")}))
        trainer([cb], max_epochs=1).fit(Manual(), loader(8, 1))
        assert cb._steps is not None  # the counter inside the loop, read directly
        assert [(f.step, f.timestamp.batch) for f in cb.firings] == [(2, 4), (4, 8)]

    @pytest.mark.parametrize("version", ["2.1.0", "3.0.0"])
    def test_unknown_lightning_reads_global_step(self, version: str,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
        """On a Lightning whose loops it does not know, the callback reads global_step
        itself (not the counter inside the loop) and fires as simulated."""
        monkeypatch.setattr(pl, "__version__", version)
        schedule = Schedule({"s": every("2 steps"), "e": every("1 epoch")})
        cb = schedule_callback(schedule)
        trainer([cb], max_epochs=2, accumulate_grad_batches=2).fit(Module(), loader(6, 1))
        assert cb._steps is None
        assert counters(cb.firings) == simulated(schedule, (2, 3, 2, 1))


@quiet
class TestVerbs:
    """Callbacks bound to Lightning's verbs act on the Trainer."""

    def test_validate_checkpoint_stop(self, tmp_path: Path) -> None:
        """``validate`` runs the validation loop where the trigger fires (and Lightning's
        own cadence never), ``checkpoint`` writes a file, ``stop`` ends the fit."""
        schedule = Schedule({"val": every("3 steps"), "save": every("1 epoch"),
                             "halt": every("7 steps")})
        cb = schedule_callback(schedule, actions={"val": "validate", "save": "checkpoint",
                                                  "halt": "stop"}, checkpoint_dir=tmp_path)
        module = Module()
        fit = trainer([cb], max_epochs=5)
        fit.fit(module, loader(4, 1), loader(2, 1))
        assert module.validated_at == [3, 6]
        assert sorted(p.name for p in tmp_path.iterdir()) == ["save-epoch=1-step=4.ckpt"]
        assert fit.global_step == 7

    def test_function_sees_trainer_and_module(self) -> None:
        """A function bound to a callback gets the Trainer and the module."""
        seen: list[int] = []
        cb = schedule_callback(Schedule({"log": every("2 steps")}),
                               actions={"log": lambda tr, m: seen.append(tr.global_step)})
        trainer([cb], max_epochs=1).fit(Module(), loader(5, 1))
        assert seen == [2, 4]


class TestBadInput:
    """Mistakes are named before anything runs."""

    def test_unknown_verb(self) -> None:
        """A verb Lightning does not have is refused, with the ones it has."""
        with pytest.raises(ValueError, match="unknown Lightning verb 'save'"):
            ScheduleCallback(Schedule({"s": every("2 steps")}), {"s": "save"})

    def test_validate_at_train_start(self) -> None:
        """``validate`` on a trigger that can fire at train_start is refused."""
        with pytest.raises(ValueError, match=r"can also fire at \['train_start'\]"):
            ScheduleCallback(Schedule({"v": on("train_start") | every("2 steps")}),
                             {"v": "validate"})

    def test_unknown_callback(self) -> None:
        """An action for a name not in the schedule is refused, with the names."""
        with pytest.raises(ValueError, match=r"\['x'\]"):
            ScheduleCallback(Schedule({"s": every("2 steps")}), {"x": "stop"})
