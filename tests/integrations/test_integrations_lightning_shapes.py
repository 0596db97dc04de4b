"""Lightning on the shapes ``simulate()`` models with ``batches_per_epoch`` and per-batch
lists: an epoch that ends on a partial accumulation step (Lightning steps on the epoch's
last batch when fewer than ``accumulate_grad_batches`` remain) and an uneven last batch
(fewer samples and tokens). The firings inside real fits equal ``simulate()``'s."""

from __future__ import annotations

import warnings

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("lightning")
import torch
from host_strategies import counters, host_schedules
from test_integrations_lightning import Module, schedule_callback, trainer
from torch.utils.data import DataLoader

from schedtrain import Schedule, ScheduleWarning, Unit, every, simulate

UNITS = [Unit.STEP, Unit.BATCH, Unit.EPOCH, Unit.SAMPLE, Unit.TOKEN]
quiet = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::DeprecationWarning")

Shape = tuple[int, int, int, int, int]
"""Epochs, micro-batches per epoch, micro-batches per step, rows per batch, rows in the
epoch's last batch."""


def fired(schedule: Schedule, shape: Shape) -> list[tuple[object, ...]]:
    """The firings inside a real fit of ``shape`` (tokens: 3 a row)."""
    epochs, batches, accum, rows, last = shape
    cb = schedule_callback(schedule)
    data = DataLoader(torch.zeros((batches - 1) * rows + last, 3), batch_size=rows)
    trainer([cb], max_epochs=epochs, accumulate_grad_batches=accum).fit(Module(), data)
    return counters(cb.firings)


def simulated(schedule: Schedule, shape: Shape) -> list[tuple[object, ...]]:
    epochs, batches, accum, rows, last = shape
    samples = [rows] * (batches - 1) + [last]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ScheduleWarning)
        log = simulate(schedule, epochs=epochs, batches_per_epoch=batches,
                       batches_per_step=accum, samples_per_batch=samples,
                       tokens_per_batch=[3 * n for n in samples])
    return counters(log)


@st.composite
def uneven_shapes(draw: st.DrawFn) -> Shape:
    rows = draw(st.integers(1, 4))
    return (draw(st.integers(1, 3)), draw(st.integers(1, 7)), draw(st.integers(1, 3)), rows,
            draw(st.integers(1, rows)))


@quiet
class TestUnevenShapes:
    def test_the_counter_tables_example(self) -> None:
        """10 batches, 3 a step: steps of 3, 3, 3 and 1 batches; 10 rows in batches of 4
        (4, 4, 2) for the samples: each crossing is where simulate() puts it."""
        schedule = Schedule({"b": every("1 batch"), "s": every("1 step"),
                             "x": every("5 samples"), "e": every("1 epoch")})
        shape = (2, 10, 3, 4, 2)
        got = fired(schedule, shape)
        assert [f[3] for f in got if f[:2] == ("s", "step_end")] == [3, 6, 9, 10, 13, 16,
                                                                      19, 20]
        assert [f[6] for f in got if f[:2] == ("x", "step_end")][:3] == [12, 24, 36]
        assert got == simulated(schedule, shape)

    @settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(schedule=host_schedules(UNITS), shape=uneven_shapes())
    def test_firings_equal_simulation(self, schedule: Schedule, shape: Shape) -> None:
        """Random step, batch, epoch, sample and token triggers over random partial steps
        and uneven last batches: every firing, with Lightning's counters, is simulate()'s."""
        assert fired(schedule, shape) == simulated(schedule, shape)
