"""Ignite: a schedule on a real ``Engine`` fires what ``simulate()`` predicts on Ignite's
clock (iterations are micro-batches, ``batches_per_step`` of them a step), resumes exactly
through ``Checkpoint``, and any trigger works as an event filter."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

pytest.importorskip("ignite")
import torch
from host_strategies import counters, host_schedules
from ignite.engine import Engine, Events
from ignite.handlers import Checkpoint, DiskSaver

from schedtrain import Schedule, ScheduleWarning, Unit, at, every, on, simulate, window
from schedtrain.integrations.ignite import ScheduleHandle, attach_schedule, trigger_event

UNITS = [Unit.STEP, Unit.BATCH, Unit.EPOCH, Unit.SAMPLE, Unit.TOKEN]


class Kill(Exception):
    """Stands for the process being killed right after a checkpoint."""


def loss_at(step: int) -> float:
    """What the process function reports at the iteration that ends step ``step``."""
    return float((step * 7) % 5)


def make_engine(accum: int) -> Engine:
    """An engine whose output is a known function of the optimizer step."""
    return Engine(lambda e, batch: loss_at(e.state.iteration // accum))


def data(steps_per_epoch: int, accum: int, samples: int, tokens: int) -> list[torch.Tensor]:
    """One epoch of batches: ``samples`` rows of ``tokens`` tokens each."""
    return [torch.zeros(samples, tokens) for _ in range(steps_per_epoch * accum)]


def attach(engine: Engine, schedule: Schedule, accum: int) -> ScheduleHandle:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ScheduleWarning)
        return attach_schedule(engine, schedule, batches_per_step=accum,
                               samples=lambda b: b.shape[0], tokens=lambda b: b.numel(),
                               metrics=lambda e: {"loss": e.state.output}, record=True)


Shape = tuple[int, int, int, int, int]
"""Epochs, steps per epoch, iterations per step, samples per batch, tokens per sample."""


def simulated(schedule: Schedule, shape: Shape) -> list[tuple[object, ...]]:
    epochs, steps, accum, samples, tokens = shape
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ScheduleWarning)
        log = simulate(schedule, epochs=epochs, steps_per_epoch=steps, batches_per_step=accum,
                       samples_per_batch=samples, tokens_per_batch=samples * tokens,
                       metrics={"loss": [(s, loss_at(s)) for s in range(1, epochs * steps + 1)]})
    return counters(log)


shapes = st.tuples(st.integers(1, 3), st.integers(1, 6), st.integers(1, 3), st.integers(0, 3),
                   st.integers(1, 3))


class TestAgainstSimulation:
    """The firing list inside Ignite is simulate()'s on Ignite's clock."""

    @settings(max_examples=25, deadline=None)
    @given(schedule=host_schedules(UNITS, metric="loss"), shape=shapes)
    def test_firings_equal_simulation(self, schedule: Schedule,
                                      shape: Shape) -> None:
        """Steps (iterations // batches_per_step), batches (iterations), epochs, samples and
        tokens of each batch, windows, conditions on the engine's output: as simulated."""
        epochs, steps, accum, samples, tokens = shape
        engine = make_engine(accum)
        handle = attach(engine, schedule, accum)
        engine.run(data(steps, accum, samples, tokens), max_epochs=epochs)
        assert counters(handle.driver.firings) == simulated(schedule, shape)

    @settings(max_examples=20, deadline=None)
    @given(schedule=host_schedules(UNITS, metric="loss"), shape=shapes, data_=st.data())
    def test_resume_fires_as_the_uninterrupted_run(
            self, schedule: Schedule, shape: Shape,
            data_: st.DataObject) -> None:
        """Killed after any iteration, the engine's and the schedule's state saved, then a
        new engine resumed: both parts fire what the uninterrupted run fires."""
        epochs, steps, accum, samples, tokens = shape
        total = epochs * steps * accum
        assume(total > 1)
        # Ignite restarts a run whose last iteration is done: kill it before that one.
        cut = data_.draw(st.integers(1, total - 1), label="killed after iteration")
        batches = data(steps, accum, samples, tokens)
        first = make_engine(accum)
        handle = attach(first, schedule, accum)
        saved: dict[str, object] = {}

        @first.on(Events.ITERATION_COMPLETED(once=cut))
        def kill(engine: Engine) -> None:
            saved["engine"] = engine.state_dict()
            saved["schedule"] = json.loads(json.dumps(handle.state_dict()))
            raise Kill

        with pytest.raises(Kill):
            first.run(batches, max_epochs=epochs)
        second = make_engine(accum)
        resumed = attach(second, schedule, accum)
        resumed.load_state_dict(saved["schedule"])  # type: ignore[arg-type]
        second.load_state_dict(saved["engine"])  # type: ignore[arg-type]
        second.run(batches)
        both = handle.driver.firings + resumed.driver.firings
        assert counters(both) == simulated(schedule, shape)


class TestCheckpoint:
    """Ignite's own ``Checkpoint`` saves and loads the schedule's state."""

    def test_resume_through_checkpoint_files(self, tmp_path: Path) -> None:
        """A run killed after a ``Checkpoint`` written on disk resumes to the same firings."""
        schedule = Schedule({"log": every("3 steps") & window(start="4 steps"),
                             "final": on("train_end") | at("7 steps")})
        batches = data(5, 1, 2, 1)

        def run(engine: Engine, folder: Path, kill_at: int | None = None) -> tuple[Any, Any]:
            handle = attach(engine, schedule, 1)
            ckpt = Checkpoint({"trainer": engine, "schedule": handle}, DiskSaver(folder),
                              n_saved=None)
            engine.add_event_handler(Events.ITERATION_COMPLETED(every=4), ckpt)
            if kill_at is not None:
                @engine.on(Events.ITERATION_COMPLETED(once=kill_at))
                def kill(_: Engine) -> None:
                    raise Kill

            return handle, ckpt

        whole_engine = make_engine(1)
        whole, _ = run(whole_engine, tmp_path / "whole")
        whole_engine.run(batches, max_epochs=3)

        first_engine = make_engine(1)
        first, ckpt = run(first_engine, tmp_path / "killed", kill_at=9)
        with pytest.raises(Kill):
            first_engine.run(batches, max_epochs=3)
        second_engine = make_engine(1)
        second, _ = run(second_engine, tmp_path / "resumed")
        saved = torch.load(tmp_path / "killed" / ckpt.last_checkpoint, weights_only=True)
        Checkpoint.load_objects({"trainer": second_engine, "schedule": second}, saved)
        second_engine.run(batches)
        kept = [f for f in first.driver.firings if f.step <= 8]  # up to the checkpoint
        assert counters(kept + second.driver.firings) == counters(whole.driver.firings)


class TestEventFilter:
    """``trigger_event`` makes any trigger an Ignite event."""

    def test_handler_runs_where_the_trigger_fires(self) -> None:
        """A handler on ``trigger_event(t)`` runs at the iterations and epoch ends where
        ``simulate`` fires ``t``."""
        trigger = every("3 steps") & window(start="1 epoch") | every("2 epochs")
        engine = make_engine(1)
        seen: list[int] = []
        engine.add_event_handler(trigger_event(trigger),
                                 lambda e: seen.append(e.state.iteration))
        engine.run(data(4, 1, 1, 1), max_epochs=4)
        assert seen == simulate(Schedule({"t": trigger}), epochs=4, steps_per_epoch=4).steps("t")

    def test_two_handlers_share_one_filter(self) -> None:
        """Two handlers on the same returned events each run once per firing."""
        event = trigger_event(every("2 batches"))
        engine = make_engine(1)
        a: list[int] = []
        b: list[int] = []
        engine.add_event_handler(event, lambda e: a.append(e.state.iteration))
        engine.add_event_handler(event, lambda e: b.append(e.state.iteration))
        engine.run(data(5, 1, 1, 1), max_epochs=1)
        assert a == b == [2, 4]

    def test_accumulation_counts_steps_not_iterations(self) -> None:
        """With ``batches_per_step=4``, ``every 2 steps`` is every 8 iterations."""
        engine = make_engine(4)
        seen: list[int] = []
        engine.add_event_handler(trigger_event(every("2 steps"), batches_per_step=4),
                                 lambda e: seen.append(e.state.iteration))
        engine.run(data(4, 4, 1, 1), max_epochs=1)
        assert seen == [8, 16]


class TestBadInput:
    """Mistakes are named."""

    def test_unknown_action(self) -> None:
        """An action for a callback not in the schedule is refused, with the names."""
        with pytest.raises(ValueError, match=r"\['sve'\]"):
            attach_schedule(make_engine(1), Schedule({"save": every("2 steps")}),
                            {"sve": print})

    def test_attached_late(self) -> None:
        """A schedule attached after the engine ran says how to attach it."""
        engine = make_engine(1)
        engine.run(data(2, 1, 1, 1), max_epochs=1)
        attach_schedule(engine, Schedule({"save": every("2 steps")}), record=True)
        with pytest.raises(RuntimeError, match="attach the schedule before the engine runs"):
            engine.run(data(2, 1, 1, 1), max_epochs=2)

    def test_finished_engine_run_again(self) -> None:
        """Ignite restarts a finished engine from iteration 0: the schedule refuses to
        count on from where it ended."""
        engine = make_engine(1)
        attach_schedule(engine, Schedule({"save": every("2 steps")}), record=True)
        engine.run(data(2, 1, 1, 1), max_epochs=1)
        with pytest.raises(RuntimeError, match="a new run needs a new schedule"):
            engine.run(data(2, 1, 1, 1), max_epochs=1)

    def test_bad_batches_per_step(self) -> None:
        """``batches_per_step`` must be a whole number >= 1."""
        with pytest.raises(ValueError, match="batches_per_step"):
            attach_schedule(make_engine(1), Schedule({"s": every("2 steps")}),
                            batches_per_step=0, record=True)
