"""Ignite: ``trigger_event``'s quiet path. Iterations before the trigger's next due step
are not counted as they end but caught up later; handlers still run exactly where
``simulate()`` fires, and a state taken while the count lags saves the caught-up
counters."""

from __future__ import annotations

import json
import warnings

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

pytest.importorskip("ignite")
from host_strategies import host_triggers
from ignite.engine import Engine, Events

from schedtrain import Schedule, ScheduleError, ScheduleWarning, Unit, every, simulate
from schedtrain.integrations.driver import ScheduleDriver
from schedtrain.integrations.ignite import ScheduleHandle, _events
from schedtrain.triggers import Trigger

NAMES = {"STARTED": "train_start", "EPOCH_STARTED": "epoch_start",
         "ITERATION_COMPLETED": "step_end", "EPOCH_COMPLETED": "epoch_end",
         "COMPLETED": "train_end"}

Seen = list[tuple[str, int, int]]


class Kill(Exception):
    """Stands for the process being killed right after a state is taken."""


def follow(engine: Engine, trigger: Trigger, seen: Seen, handlers: int = 2) -> ScheduleHandle:
    """``handlers`` handlers on ``trigger_event(trigger)``'s events; each run is recorded
    as (event, iteration, epochs completed)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ScheduleWarning)
        handle = ScheduleHandle(ScheduleDriver(Schedule({"t": trigger}), record=True))
    events = _events(handle)

    def record(engine: Engine) -> None:
        name = NAMES[engine.last_event_name.name]  # type: ignore[union-attr]
        done = engine.state.epoch - (name in ("epoch_start", "step_end"))
        seen.append((name, engine.state.iteration, done))

    for _ in range(handlers):
        engine.add_event_handler(events, record)
    return handle


def expected(trigger: Trigger, epochs: int, steps: int, handlers: int = 2) -> Seen:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ScheduleWarning)
        log = simulate(Schedule({"t": trigger}), epochs=epochs, steps_per_epoch=steps)
    return [(f.event, f.timestamp.step, f.timestamp.epoch) for f in log
            for _ in range(handlers)]


def engine() -> Engine:
    return Engine(lambda e, batch: 0.0)


@st.composite
def clock_triggers(draw: st.DrawFn) -> Trigger:
    """A random step and epoch trigger that compiles."""
    trigger = draw(host_triggers([Unit.STEP, Unit.EPOCH]))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ScheduleWarning)
        try:
            Schedule({"t": trigger}).compile()
        except ScheduleError:
            assume(False)
    return trigger


runs = st.tuples(st.integers(1, 3), st.integers(1, 12))


@settings(max_examples=60, deadline=None)
@given(trigger=clock_triggers(), run=runs)
def test_handlers_run_where_simulate_fires(trigger: Trigger, run: tuple[int, int]) -> None:
    """Random step and epoch triggers (windows, ``at``, lifecycle events, combinations),
    random epochs and iterations: each of two handlers runs exactly at simulate()'s
    firings, at iterations and at the other events."""
    epochs, steps = run
    e, seen = engine(), []
    follow(e, trigger, seen)
    e.run(range(steps), max_epochs=epochs)
    assert seen == expected(trigger, epochs, steps)


@settings(max_examples=40, deadline=None)
@given(trigger=clock_triggers(), run=runs, data=st.data())
def test_state_taken_while_lagging_resumes_exactly(
        trigger: Trigger, run: tuple[int, int], data: st.DataObject) -> None:
    """Killed after any iteration, the handle's state taken then (its count may lag the
    engine) resumes a new engine to the uninterrupted run's firings, and holds the
    engine's own iteration."""
    epochs, steps = run
    assume(epochs * steps > 1)
    cut = data.draw(st.integers(1, epochs * steps - 1), label="killed after iteration")
    first, seen = engine(), []
    handle = follow(first, trigger, seen)
    saved: dict[str, object] = {}

    @first.on(Events.ITERATION_COMPLETED(once=cut))
    def kill(engine: Engine) -> None:
        saved["engine"] = engine.state_dict()
        saved["schedule"] = state = json.loads(json.dumps(handle.state_dict()))
        assert state["clock"]["now"]["step"] == state["clock"]["now"]["batch"] == cut
        raise Kill

    with pytest.raises(Kill):
        first.run(range(steps), max_epochs=epochs)
    second = engine()
    resumed = follow(second, trigger, seen)
    resumed.load_state_dict(saved["schedule"])  # type: ignore[arg-type]
    second.load_state_dict(saved["engine"])  # type: ignore[arg-type]
    second.run(range(steps))
    # Compared on the schedule's firings: killed between an epoch's last iteration and its
    # EPOCH_COMPLETED, the resumed engine's EPOCH_STARTED answers both epoch_end and
    # epoch_start, one handler call.
    both = [(f.event, f.timestamp.step, f.timestamp.epoch)
            for f in handle.driver.firings + resumed.driver.firings]
    assert both == expected(trigger, epochs, steps, handlers=1)


def test_quiet_iterations_leave_the_clock_behind() -> None:
    """Before the due step the filter does not count (the one-comparison path); the count
    catches up at the due step and the state is the engine's."""
    e, seen = engine(), []
    handle = follow(e, every("5 steps"), seen, handlers=1)
    looked: list[tuple[int, int]] = []

    @e.on(Events.ITERATION_COMPLETED)
    def look(engine: Engine) -> None:
        looked.append((engine.state.iteration, handle.driver.clock.step))

    e.run(range(7), max_epochs=1)
    assert looked[:6] == [(1, 0), (2, 0), (3, 0), (4, 0), (5, 5), (6, 5)]
    assert seen == [("step_end", 5, 0)]
    assert handle.state_dict()["clock"]["now"]["step"] == 7


def test_counted_schedules_keep_the_counting_path() -> None:
    """Samples counted per batch cannot be caught up: every iteration is counted."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ScheduleWarning)
        handle = ScheduleHandle(ScheduleDriver(Schedule({"t": every("8 samples")})),
                                samples=len)
    e, fired = engine(), []
    e.add_event_handler(_events(handle), lambda en: fired.append(en.state.iteration))
    e.run([[0, 0, 0]] * 6, max_epochs=1)
    assert (handle.quiet_until, handle.driver.clock.sample, fired) == (0, 18, [3, 6])


@settings(max_examples=30, deadline=None)
@given(k=st.integers(2, 20), before=st.integers(0, 5), data=st.data())
def test_skipped_steps_save_the_counted_state(k: int, before: int, data: st.DataObject) -> None:
    """``ScheduleDriver.skip_to`` over quiet steps leaves the state (counters, position in
    the step) that counting each of them leaves, wall time aside."""
    n = data.draw(st.integers(before, before + k - 1), label="skipped to")

    def driver() -> ScheduleDriver:
        d = ScheduleDriver(Schedule({"t": every(k, "steps", offset=before or None)}),
                           time_source=lambda: 0)
        d.train_start()
        d.epoch_start()
        return d

    counted, skipped = driver(), driver()
    for _ in range(n):
        counted.step()
    assume(n < counted.table.step_due or n == 0)
    skipped.skip_to(n)
    assert skipped.state_dict() == counted.state_dict()
