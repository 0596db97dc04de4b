"""Lightning: schedtrain ``Callback`` objects inside a real ``Trainer.fit`` fire where
``simulate()`` says, see the module and optimizer, stop the fit (``EarlyStopping`` on a
metric the module logs) and keep their state through a kill and a resume."""

from __future__ import annotations

import logging
import warnings
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("lightning")
import lightning.pytorch as pl
import torch
from host_strategies import host_schedules
from hosted_helpers import Recorder, fired, recorded, simulated_fired
from torch.utils.data import DataLoader

from schedtrain import Schedule, Scheduled, ScheduleWarning, Unit, every, simulate
from schedtrain.callbacks import (
    Callback,
    EarlyStopping,
    LearningRateMonitor,
    MinSaver,
    PeriodicTrigger,
    TerminateOnNaN,
)
from schedtrain.integrations.context import HostError
from schedtrain.integrations.lightning import ScheduleCallback

for _name in ("lightning", "lightning.pytorch", "lightning.fabric"):
    logging.getLogger(_name).setLevel(logging.ERROR)
quiet = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::DeprecationWarning")


class Module(pl.LightningModule):
    """A linear model that logs a constant ``c``, and a NaN loss from ``nan_from`` on."""

    def __init__(self, nan_from: int | None = None) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(3, 1)
        self.nan_from = nan_from

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        self.log("c", 1.0, on_step=True)
        loss = self.layer(batch).pow(2).mean()
        if self.nan_from is not None and self.global_step + 1 >= self.nan_from:
            loss = loss * float("nan")
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def loader(batches: int) -> DataLoader[torch.Tensor]:
    return DataLoader(torch.zeros(batches * 2, 3), batch_size=2)


def trainer(callbacks: list[Any], **kwargs: Any) -> pl.Trainer:
    saving = any(isinstance(c, pl.callbacks.ModelCheckpoint) for c in callbacks)
    return pl.Trainer(logger=False, enable_checkpointing=saving, enable_progress_bar=False,
                      enable_model_summary=False, num_sanity_val_steps=0, accelerator="cpu",
                      callbacks=callbacks, **kwargs)


def hosted(schedule: Schedule, actions: dict[str, Any] | None = None) -> ScheduleCallback:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ScheduleWarning)
        return ScheduleCallback(schedule, actions)


@quiet
class TestCallbacksFireAsSimulated:
    """A user's ``Callback`` subclass runs where ``simulate()`` says."""

    @settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(schedule=host_schedules([Unit.STEP, Unit.BATCH, Unit.EPOCH, Unit.SAMPLE]),
           epochs=st.integers(1, 3), steps=st.integers(1, 4), accum=st.integers(1, 2))
    def test_trigger_and_epoch_hooks(self, schedule: Schedule, epochs: int, steps: int,
                                     accum: int) -> None:
        """``_trigger`` at each firing on Lightning's clock (global_step under
        accumulation, batches, epochs, samples), ``_before_epoch``/``_after_epoch`` once
        per epoch with tensorpack's 1-based ``epoch_num``."""
        bound, recorders = recorded(schedule)
        trainer([hosted(bound)], max_epochs=epochs, accumulate_grad_batches=accum).fit(
            Module(), loader(steps * accum))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ScheduleWarning)
            log = simulate(schedule, epochs=epochs, steps_per_epoch=steps,
                           batches_per_step=accum, samples_per_batch=2)
        assert fired(recorders) == simulated_fired(log)
        for r in recorders.values():
            assert r.epochs == [(w, e) for e in range(1, epochs + 1)
                                for w in ("before", "after")]

    def test_tensorpack_wrapper_and_named_binding(self) -> None:
        """A ``PeriodicTrigger`` entry and a callback bound by name in ``actions`` both run;
        a callback sees the LightningModule and its optimizer."""
        seen: list[tuple[int, bool, float]] = []

        class Peek(Callback):
            def _trigger(self) -> None:
                seen.append((self.global_step, isinstance(self.model, Module),
                             self.optimizer.param_groups[0]["lr"]))

        periodic = Recorder()
        schedule = Schedule([PeriodicTrigger(periodic, every_k_steps=3),
                             Scheduled(every("2 steps"), None, "peek")])
        trainer([hosted(schedule, {"peek": Peek()})], max_epochs=2).fit(Module(), loader(4))
        assert [f[1] for f in periodic.fired] == [3, 6]
        assert seen == [(2, True, 0.01), (4, True, 0.01), (6, True, 0.01), (8, True, 0.01)]


@quiet
class TestStopping:
    """A callback's stop ends Lightning's fit."""

    def test_early_stopping_on_a_logged_metric(self) -> None:
        """``EarlyStopping("c", patience=2)`` every 2 steps on a constant the module logs:
        a best at step 2, no better at 4 and 6, so the fit ends after step 6."""
        stop = EarlyStopping("c", patience=2)
        fit = trainer([hosted(Schedule([Scheduled(every("2 steps"), stop, "early")]))],
                      max_epochs=5)
        fit.fit(Module(), loader(4))
        assert fit.global_step == 6
        assert (stop.best, stop.wait) == (1.0, 2)

    def test_terminate_on_nan(self) -> None:
        """``TerminateOnNaN`` reads each step's loss from Lightning's outputs: a NaN from
        step 3 on stops the fit at its next firing, naming step 3."""
        nan = TerminateOnNaN()
        fit = trainer([hosted(Schedule([Scheduled(every("2 steps"), nan, "nan")]))],
                      max_epochs=3)
        fit.fit(Module(nan_from=3), loader(4))
        assert (fit.global_step, nan.first_bad_step) == (4, 3)

    def test_learning_rate_monitor_puts_metrics(self) -> None:
        """A built-in that reads the optimizer and puts metrics works inside Lightning."""
        monitor = LearningRateMonitor()
        cb = hosted(Schedule([Scheduled(every("2 steps"), monitor, "lr")]))
        trainer([cb], max_epochs=1).fit(Module(), loader(4))
        store = cb.driver.metrics
        assert store.history("lr") == [(2, 0.01), (4, 0.01)]  # type: ignore[attr-defined]


@quiet
class TestFailure:
    """A failed fit tells the callbacks, as schedtrain's loop does."""

    def test_on_exception_then_after_train(self) -> None:
        """An exception in the module: ``_on_exception`` with it, then ``_after_train``
        with the outcome "failed"."""
        calls: list[Any] = []

        class Cleanup(Callback):
            def _on_exception(self, exc: BaseException) -> None:
                calls.append(("exception", type(exc).__name__))

            def _after_train(self) -> None:
                calls.append(("after_train", self.trainer.outcome))

        class Failing(Module):
            def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
                if self.global_step == 2:
                    raise KeyError("boom")
                return super().training_step(batch, batch_idx)

        with pytest.raises(KeyError):
            trainer([hosted(Schedule({"c": every("5 steps")}), {"c": Cleanup()})],
                    max_epochs=1).fit(Failing(), loader(4))
        assert calls == [("exception", "KeyError"), ("after_train", "failed")]


@quiet
class TestResume:
    """A callback's state rides in Lightning's checkpoint."""

    @pytest.mark.parametrize("cut", [1, 3, 4, 6])
    def test_kill_and_resume_keeps_state(self, cut: int, tmp_path: Path) -> None:
        """Killed after step ``cut`` and resumed with ``ckpt_path``: the resumed callback's
        count and firings continue the uninterrupted fit's exactly."""
        schedule = Schedule({"r": every("2 steps") | every("1 epoch")})
        whole, whole_rec = recorded(schedule)
        trainer([hosted(whole)], max_epochs=2).fit(Module(), loader(4))

        first, first_rec = recorded(schedule)
        saver = pl.callbacks.ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=1,
                                             save_top_k=-1, filename="{step}")
        before: list[int] = []

        class Kill(pl.Callback):
            def on_train_batch_end(self, tr: pl.Trainer, *_: Any) -> None:
                if tr.global_step == cut and not before:
                    before.append(len(first_rec["r"].fired))

            def on_train_batch_start(self, tr: pl.Trainer, *_: Any) -> None:
                if tr.global_step == cut:
                    raise KeyError("killed")

        with pytest.raises(KeyError):
            trainer([hosted(first), Kill(), saver], max_epochs=2).fit(Module(), loader(4))
        second, second_rec = recorded(schedule)
        trainer([hosted(second)], max_epochs=2).fit(Module(), loader(4),
                                                    ckpt_path=tmp_path / f"step={cut}.ckpt")
        assert first_rec["r"].fired[:before[0]] + second_rec["r"].fired == whole_rec["r"].fired
        assert second_rec["r"].count == whole_rec["r"].count


class TestRefused:
    """Callbacks that need what Lightning cannot give are refused at construction."""

    def test_saver(self) -> None:
        """A schedtrain saver needs schedtrain's checkpoints."""
        with pytest.raises(HostError, match=r"callback 'best' \(MinSaver\) writes schedtrain "
                                            "checkpoints"):
            ScheduleCallback(Schedule([Scheduled(every("2 steps"), MinSaver(), "best")]))

    def test_per_batch_hook(self) -> None:
        """A hook around Lightning's own backward pass cannot be called."""

        class Grads(Callback):
            def _before_backward(self, info: Any) -> None:
                return None

        with pytest.raises(HostError, match=r"callback 'g' \(Grads\) overrides "
                                            "_before_backward, which Lightning cannot call"):
            ScheduleCallback(Schedule({"g": every("2 steps")}), {"g": Grads()})


class TestValidateVersion:
    """The ``validate`` verb uses the fit loop's internals: only on a Lightning it knows."""

    def test_unknown_lightning_is_refused(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """On a Lightning version outside ``VALIDATE_KNOWN`` binding ``validate`` is
        refused in one line naming the version and what to do."""
        monkeypatch.setattr(pl, "__version__", "2.7.0")
        with pytest.raises(ValueError, match=r"actions\['v'\] = 'validate' .* known for "
                                             r"lightning 2\.2 to 2\.6, and this is "
                                             r"lightning 2\.7\.0"):
            ScheduleCallback(Schedule({"v": every("2 steps")}), {"v": "validate"})

    def test_known_lightning_is_accepted(self) -> None:
        """The installed Lightning (a known one, as pyproject's extra pins) is accepted."""
        cb = ScheduleCallback(Schedule({"v": every("2 steps")}), {"v": "validate"})
        assert cb.actions == {"v": "validate"}
