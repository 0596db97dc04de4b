"""Ignite: schedtrain ``Callback`` objects in ``attach_schedule`` fire where ``simulate()``
says on Ignite's clock, stop the engine, and keep their state in the handle's
``state_dict`` (what Ignite's ``Checkpoint`` saves) across a kill and a resume."""

from __future__ import annotations

import json
import warnings
from typing import Any

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

pytest.importorskip("ignite")
import torch
from host_strategies import host_schedules
from hosted_helpers import Recorder, fired, recorded, simulated_fired
from ignite.engine import Engine, Events

from schedtrain import Schedule, Scheduled, ScheduleWarning, Unit, every, simulate
from schedtrain.callbacks import EarlyStopping, TerminateOnNaN
from schedtrain.integrations.context import HostError
from schedtrain.integrations.ignite import ScheduleHandle, attach_schedule

UNITS = [Unit.STEP, Unit.BATCH, Unit.EPOCH, Unit.SAMPLE]


class Kill(Exception):
    """Stands for the process being killed."""


def attach(engine: Engine, schedule: Schedule, accum: int, **kw: Any) -> ScheduleHandle:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ScheduleWarning)
        return attach_schedule(engine, schedule, batches_per_step=accum,
                               samples=lambda b: b.shape[0], **kw)


def batches(steps: int, accum: int, rows: int) -> list[torch.Tensor]:
    return [torch.zeros(rows, 2) for _ in range(steps * accum)]


def simulated(schedule: Schedule, epochs: int, steps: int, accum: int, rows: int
              ) -> list[tuple[object, ...]]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ScheduleWarning)
        return simulated_fired(simulate(schedule, epochs=epochs, steps_per_epoch=steps,
                                        batches_per_step=accum, samples_per_batch=rows))


shapes = st.tuples(st.integers(1, 3), st.integers(1, 5), st.integers(1, 3), st.integers(1, 3))


class TestCallbacksFireAsSimulated:
    """A user's ``Callback`` subclass runs where ``simulate()`` says."""

    @settings(max_examples=25, deadline=None)
    @given(schedule=host_schedules(UNITS), shape=shapes)
    def test_trigger_and_epoch_hooks(self, schedule: Schedule,
                                     shape: tuple[int, int, int, int]) -> None:
        """``_trigger`` on Ignite's clock (iterations // batches_per_step, iterations,
        epochs, samples), the epoch hooks once per epoch with a 1-based ``epoch_num``."""
        epochs, steps, accum, rows = shape
        bound, recorders = recorded(schedule)
        engine = Engine(lambda e, b: 0.0)
        attach(engine, bound, accum)
        engine.run(batches(steps, accum, rows), max_epochs=epochs)
        assert fired(recorders) == simulated(schedule, epochs, steps, accum, rows)
        for r in recorders.values():
            assert r.epochs == [(w, e) for e in range(1, epochs + 1)
                                for w in ("before", "after")]

    @settings(max_examples=20, deadline=None)
    @given(schedule=host_schedules(UNITS), shape=shapes, data=st.data())
    def test_kill_and_resume_keeps_state(self, schedule: Schedule,
                                         shape: tuple[int, int, int, int],
                                         data: st.DataObject) -> None:
        """Killed after any iteration, the engine's and the handle's state saved (as JSON)
        and loaded into new callbacks: their firings and counts continue exactly."""
        epochs, steps, accum, rows = shape
        total = epochs * steps * accum
        assume(total > 1)
        cut = data.draw(st.integers(1, total - 1), label="killed after iteration")
        feed = batches(steps, accum, rows)
        first = Engine(lambda e, b: 0.0)
        bound, first_rec = recorded(schedule)
        handle = attach(first, bound, accum)
        saved: dict[str, Any] = {}

        @first.on(Events.ITERATION_COMPLETED(once=cut))
        def kill(engine: Engine) -> None:
            saved["engine"] = engine.state_dict()
            saved["schedule"] = json.loads(json.dumps(handle.state_dict()))
            saved["fired"] = fired(first_rec)
            raise Kill

        with pytest.raises(Kill):
            first.run(feed, max_epochs=epochs)
        second = Engine(lambda e, b: 0.0)
        bound2, second_rec = recorded(schedule)
        resumed = attach(second, bound2, accum)
        resumed.load_state_dict(saved["schedule"])
        second.load_state_dict(saved["engine"])
        second.run(feed)
        assert (sorted(saved["fired"] + fired(second_rec))
                == sorted(simulated(schedule, epochs, steps, accum, rows)))
        assert ({n: r.count for n, r in second_rec.items()}
                == {n: len(r.fired) + len([f for f in saved["fired"] if f[0] == n])
                    for n, r in second_rec.items()})


class TestStopping:
    """A callback's stop terminates the engine."""

    def test_early_stopping_on_the_engine_output(self) -> None:
        """``EarlyStopping("loss", patience=2)`` every 2 steps on a constant output: a best
        at step 2, none better at 4 and 6, so the engine stops after iteration 6."""
        engine = Engine(lambda e, b: 1.0)
        stop = EarlyStopping("loss", patience=2)
        attach(engine, Schedule({"early": every("2 steps")}), 1, actions={"early": stop},
               metrics=lambda e: {"loss": e.state.output})
        engine.run(batches(5, 1, 1), max_epochs=4)
        assert engine.state.iteration == 6 and stop.wait == 2

    def test_terminate_on_nan_with_the_loss_given(self) -> None:
        """Given ``loss=``, ``TerminateOnNaN`` finds the first NaN step (3) at its firing."""
        engine = Engine(lambda e, b: float("nan") if e.state.iteration >= 3 else 1.0)
        nan = TerminateOnNaN()
        attach(engine, Schedule([Scheduled(every("4 steps"), nan, "nan")]), 1,
               loss=lambda e: e.state.output)
        engine.run(batches(5, 1, 1), max_epochs=4)
        assert (engine.state.iteration, nan.first_bad_step) == (4, 3)


class TestHostObjects:
    """What an ``Engine`` does not hold comes from ``attach_schedule``."""

    def test_model_and_optimizer_given(self) -> None:
        """``model=`` and ``optimizer=`` are what the callback sees."""
        model = torch.nn.Linear(2, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.5)
        seen: list[Any] = []

        class Peek(Recorder):
            def _trigger(self) -> None:
                seen.append((self.model, self.optimizer))

        engine = Engine(lambda e, b: 0.0)
        attach(engine, Schedule({"p": every("1 epoch")}), 1, actions={"p": Peek()},
               model=model, optimizer=opt)
        engine.run(batches(2, 1, 1), max_epochs=1)
        assert seen == [(model, opt)]

    def test_terminate_on_nan_without_loss_is_refused(self) -> None:
        """Without ``loss=`` the engine's loss is unknown: refused when attached."""
        with pytest.raises(HostError, match=r"'nan' \(TerminateOnNaN\) reads each step's "
                                            "training loss, which Ignite does not show"):
            attach(Engine(lambda e, b: 0.0), Schedule({"nan": every("2 steps")}), 1,
                   actions={"nan": TerminateOnNaN()})
