"""The real loop fires exactly what ``simulate()`` predicts for the same schedule and shape."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, reject, settings
from hypothesis import strategies as st
from strategies import lifecycle, windows
from training_helpers import Noop, UnevenData, comparable, tiny_model

from schedtrain import FiringLog, Schedule, ScheduleError, Time, Unit, simulate
from schedtrain.training import Trainer
from schedtrain.triggers import Trigger, all_of, any_of, at, every, not_, on

UNITS = [Unit.STEP, Unit.EPOCH, Unit.BATCH, Unit.SAMPLE]  # no wall time: it is never equal


@st.composite
def _periodic(draw: st.DrawFn) -> Trigger:
    k = draw(st.integers(1, 9))
    off = draw(st.integers(0, k))
    return every(k, draw(st.sampled_from(UNITS)), offset=off or None)


@st.composite
def _points(draw: st.DrawFn) -> Trigger:
    unit = draw(st.sampled_from(UNITS))
    return at(*(Time(p, unit) for p in draw(st.lists(st.integers(1, 40), min_size=1,
                                                        max_size=3))))


_leaves = st.one_of(_periodic(), _periodic(), _points(), lifecycle, windows())
_triggers = st.recursive(
    _leaves,
    lambda c: st.one_of(st.lists(c, min_size=2, max_size=3).map(lambda ts: all_of(*ts)),
                        st.lists(c, min_size=2, max_size=3).map(lambda ts: any_of(*ts)),
                        c.map(not_)),
    max_leaves=5)


@st.composite
def _schedules(draw: st.DrawFn) -> Schedule:
    n = draw(st.integers(1, 4))
    return Schedule({f"cb{i}": draw(_triggers) for i in range(n)})


@pytest.mark.filterwarnings("ignore::schedtrain.ScheduleWarning")
class TestRealLoopEqualsSimulation:
    """Trainer.fit() and simulate() agree firing for firing (all counters but wall time)."""

    @settings(max_examples=40, deadline=None)
    @given(_schedules(), st.lists(st.integers(1, 6), min_size=1, max_size=4),
           st.sampled_from([1, 2, 3]))
    def test_random_schedules_uneven_epochs_and_accumulation(
            self, schedule: Schedule, lengths: list[int], accum: int) -> None:
        """Random trigger trees over steps/epochs/batches/samples, epochs of uneven length."""
        try:
            expected = simulate(schedule, epoch_lengths=lengths, batches_per_step=accum,
                                samples_per_batch=2)
        except ScheduleError:
            reject()
        model, opt = tiny_model()
        data = UnevenData([n * accum for n in lengths], batch_size=2)
        trainer = Trainer(model, opt, data, torch.nn.functional.mse_loss,
                          schedule=schedule, bindings={n: Noop() for n in schedule.names},
                          max_epochs=len(lengths), grad_accum=accum)
        trainer.fit()
        assert comparable(trainer.firings) == comparable(expected)

    @settings(max_examples=25, deadline=None)
    @given(_schedules(), st.lists(st.integers(1, 6), min_size=1, max_size=4),
           st.integers(1, 30))
    def test_max_steps_agrees(self, schedule: Schedule, lengths: list[int], cut: int) -> None:
        """A run ended by ``max_steps`` (mid-epoch or not) fires as ``simulate(max_steps=)``."""
        cut = min(cut, sum(lengths))
        try:
            expected = simulate(schedule, epoch_lengths=lengths, samples_per_batch=2,
                                max_steps=cut)
        except ScheduleError:
            reject()
        model, opt = tiny_model()
        trainer = Trainer(model, opt, UnevenData(lengths, batch_size=2),
                          torch.nn.functional.mse_loss, schedule=schedule,
                          bindings={n: Noop() for n in schedule.names},
                          max_epochs=len(lengths), max_steps=cut)
        trainer.fit()
        assert comparable(trainer.firings) == comparable(expected)

    def test_max_steps_mid_epoch_ends_without_epoch_end(self) -> None:
        """max_steps inside an epoch: train_end right after the step, no partial epoch_end."""
        schedule = Schedule({"e": every("1 epoch"), "end": every("1 step") & ~every("2 steps")})
        model, opt = tiny_model()
        trainer = Trainer(model, opt, UnevenData([4]), torch.nn.functional.mse_loss,
                          schedule=schedule, bindings={"e": Noop(), "end": Noop()},
                          max_steps=6)
        trainer.fit()
        assert trainer.clock.step == 6
        assert FiringLog(trainer.firings).epochs("e") == [1]


_new_event_leaves = st.one_of(_periodic(), _points(), windows(),
                              st.sampled_from(["batch_start", "batch_end", "sanity_eval",
                                               "train_start", "step_end"]).map(on))
_new_event_triggers = st.recursive(
    _new_event_leaves,
    lambda c: st.one_of(st.lists(c, min_size=2, max_size=3).map(lambda ts: all_of(*ts)),
                        st.lists(c, min_size=2, max_size=3).map(lambda ts: any_of(*ts))),
    max_leaves=4)


@pytest.mark.filterwarnings("ignore::schedtrain.ScheduleWarning")
class TestNewEventsAgree:
    """Triggers naming batch_start and sanity_eval fire alike in simulate() and the loop."""

    @settings(max_examples=30, deadline=None)
    @given(st.lists(_new_event_triggers, min_size=1, max_size=3),
           st.lists(st.integers(1, 4), min_size=1, max_size=3), st.sampled_from([1, 2, 3]),
           st.booleans())
    def test_batch_start_and_sanity_eval(self, triggers: list[Trigger], lengths: list[int],
                                         accum: int, sanity: bool) -> None:
        """Random trees mixing on('batch_start'), on('sanity_eval') and clock parts, under
        accumulation and uneven epochs, with and without sanity_eval_batches."""
        schedule = Schedule({f"cb{i}": t for i, t in enumerate(triggers)})
        try:
            expected = simulate(schedule, epoch_lengths=lengths, batches_per_step=accum,
                                samples_per_batch=2, sanity_eval=sanity)
        except ScheduleError:
            reject()
        model, opt = tiny_model()
        data = UnevenData([n * accum for n in lengths], batch_size=2)
        trainer = Trainer(model, opt, data, torch.nn.functional.mse_loss,
                          schedule=schedule, bindings={n: Noop() for n in schedule.names},
                          max_epochs=len(lengths), grad_accum=accum,
                          sanity_eval_batches=2 if sanity else 0)
        trainer.fit()
        assert comparable(trainer.firings) == comparable(expected)

    def test_batch_start_counts_the_batches_before_it(self) -> None:
        """At batch_start the clock holds the micro-batches before this one."""
        schedule = Schedule({"s": on("batch_start")})
        log = simulate(schedule, epochs=2, steps_per_epoch=2, batches_per_step=2)
        assert [(f.timestamp.batch, f.timestamp.step, f.timestamp.epoch) for f in log] == [
            (0, 0, 0), (1, 0, 0), (2, 1, 0), (3, 1, 0),
            (4, 2, 1), (5, 2, 1), (6, 3, 1), (7, 3, 1)]
