"""Lightning's ``"log"`` verb: the values ``self.log`` gathered in a step reach the loggers
after exactly the steps where the schedule fires (``simulate()``'s step_end firings), in
place of ``log_every_n_steps``; refused where Lightning cannot log a step, and on a
Lightning version whose logger connector it does not know."""

from __future__ import annotations

import logging
import warnings
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

pytest.importorskip("lightning")
import lightning.pytorch as pl
import torch
from lightning.pytorch.loggers import Logger
from torch.utils.data import DataLoader

from schedtrain import (
    Schedule,
    ScheduleError,
    ScheduleWarning,
    Time,
    Unit,
    at,
    every,
    on,
    simulate,
    window,
)
from schedtrain.integrations.lightning import ScheduleCallback

for _name in ("lightning", "lightning.pytorch", "lightning.fabric"):
    logging.getLogger(_name).setLevel(logging.ERROR)
quiet = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::DeprecationWarning")

#: Triggers on the step grid (a period, points, a window, and unions of them): the ones
#: that fire at step ends only.
_LEAVES = st.one_of(
    st.builds(lambda k, off: every(k, Unit.STEP, offset=off or None), st.integers(1, 5),
              st.integers(0, 3)),
    st.builds(lambda ps: at(*(Time(p, Unit.STEP) for p in ps)),
              st.lists(st.integers(1, 12), min_size=1, max_size=3)))
STEP_TRIGGERS = st.one_of(
    _LEAVES,
    st.builds(lambda t, a, n: t & window(Time(a, Unit.STEP) if a else None,
                                         Time(a + n, Unit.STEP)),
              _LEAVES, st.integers(0, 6), st.integers(1, 8)),
    st.builds(lambda a, b: a | b, _LEAVES, _LEAVES))


class Recorded(Logger):
    """Keeps the logger step of each ``log_metrics`` call that carries ``m``."""

    def __init__(self) -> None:
        super().__init__()
        self.steps: list[int] = []

    @property
    def name(self) -> str:
        return "recorded"

    @property
    def version(self) -> int:
        return 0

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        if "m" in metrics:
            assert step is not None
            self.steps.append(step)

    def log_hyperparams(self, *args: Any, **kwargs: Any) -> None:
        return None


class Module(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(3, 1)

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        self.log("m", float(self.global_step), on_step=True, on_epoch=False)
        return self.layer(batch).pow(2).mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


@quiet
class TestLogVerb:
    @settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(schedule=STEP_TRIGGERS.map(lambda t: Schedule({"cb0": t})),
           shape=st.tuples(st.integers(1, 3), st.integers(1, 4), st.integers(1, 2)),
           every_n=st.sampled_from([1, 3, 50]))
    @example(schedule=Schedule({"cb0": every("3 steps")}), shape=(2, 4, 1), every_n=1)
    def test_logs_after_exactly_the_firing_steps(self, schedule: Schedule,
                                                 shape: tuple[int, int, int],
                                                 every_n: int) -> None:
        """Whatever ``log_every_n_steps`` says, ``m`` is logged after the steps where the
        trigger fires, at Lightning's logger step for them (the step before it ends)."""
        epochs, steps, accum = shape
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ScheduleWarning)
            try:
                schedule.compile()
            except ScheduleError:  # a window that shuts before the grid's first point
                assume(False)
            cb = ScheduleCallback(schedule, {"cb0": "log"})
            log = simulate(schedule, epochs=epochs, steps_per_epoch=steps,
                           batches_per_step=accum, samples_per_batch=2)
        recorded = Recorded()
        pl.Trainer(logger=recorded, enable_checkpointing=False, enable_progress_bar=False,
                   enable_model_summary=False, num_sanity_val_steps=0, accelerator="cpu",
                   callbacks=[cb], max_epochs=epochs, accumulate_grad_batches=accum,
                   log_every_n_steps=every_n).fit(
            Module(), DataLoader(torch.zeros(steps * accum * 2, 3), batch_size=2))
        assert [s + 1 for s in recorded.steps] == [f.timestamp.step for f in log]

    def test_refused_where_lightning_cannot_log_a_step(self) -> None:
        """An epoch end, the train start...: refused in one line naming the events."""
        with pytest.raises(ValueError, match=r"actions\['l'\] = 'log' sends the step's "
                                             r"self\.log values .* only at step_end; the "
                                             r"trigger .* can also fire at \['epoch_end'\]"):
            ScheduleCallback(Schedule({"l": every("1 epoch")}), {"l": "log"})
        with pytest.raises(ValueError, match=r"can also fire at \['train_start'\]"):
            ScheduleCallback(Schedule({"l": every("2 steps") | on("train_start")}),
                             {"l": "log"})

    def test_unknown_lightning_is_refused(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setattr(pl, "__version__", "2.7.0")
        with pytest.raises(ValueError, match=r"actions\['l'\] = 'log' drives when Lightning's "
                                             r"logger connector logs a step, known for "
                                             r"lightning 2\.2 to 2\.6, and this is lightning "
                                             r"2\.7\.0: .* log_every_n_steps instead"):
            ScheduleCallback(Schedule({"l": every("2 steps")}), {"l": "log"})
