"""``ScheduleDriver``: a hand-written loop fires what ``simulate()`` predicts, and resumes
exactly; a quiet step costs one comparison; bad input is refused with a clear message."""

from __future__ import annotations

import json
import warnings

import pytest
from host_strategies import counters, host_schedules
from hypothesis import given, settings
from hypothesis import strategies as st

from schedtrain import Schedule, ScheduleWarning, Unit, at, every, improved, on, simulate, when
from schedtrain.integrations import ScheduleDriver

NS = 250_000_000  # a fake wall clock: each optimizer step takes 0.25 s
ALL_UNITS = [Unit.STEP, Unit.BATCH, Unit.EPOCH, Unit.SAMPLE, Unit.TOKEN, Unit.SECOND]


class FakeTime:
    """A nanosecond source the loop moves: exact time triggers."""

    def __init__(self) -> None:
        self.t = 0

    def __call__(self) -> int:
        return self.t


def metric_at(step: int) -> float:
    """The value the loop reports before step ``step``'s end (a saw-tooth)."""
    return float((step * 7) % 5)


Shape = tuple[list[int], int, int, int]
"""Epoch lengths in steps, micro-batches per step, samples and tokens per micro-batch."""


def run_loop(driver: ScheduleDriver, clock: FakeTime, shape: Shape, *, from_batch: int = 0,
             until_batch: int | None = None) -> None:
    """Drive ``driver`` through a run of ``shape``: killed right after the ``batch_end`` of
    micro-batch ``until_batch``, or resumed after ``from_batch`` (skipping what ran)."""
    lengths, accum, samples, tokens = shape
    step = batch = 0
    driver.train_start()
    for length in lengths:
        if (step + length) * accum < from_batch:  # epochs that ended before the cut
            step += length
            batch = step * accum
            continue
        driver.epoch_start()
        for _ in range(length):
            step += 1
            for _ in range(accum):
                batch += 1
                if batch > from_batch:
                    driver.batch_end(samples=samples, tokens=tokens)
                if batch == until_batch:
                    return
            if batch >= from_batch:
                driver.put("m", metric_at(step))
                clock.t = step * NS
                driver.step_end()
        driver.epoch_end()
    driver.train_end()


shapes = st.tuples(st.lists(st.integers(1, 8), min_size=1, max_size=4), st.integers(1, 3),
                   st.integers(0, 4), st.sampled_from([0, 3, 10]))


def simulated(schedule: Schedule, lengths: list[int], accum: int, samples: int,
              tokens: int) -> list[tuple[object, ...]]:
    total = sum(lengths)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ScheduleWarning)
        log = simulate(schedule, epoch_lengths=lengths, batches_per_step=accum,
                       samples_per_batch=samples, tokens_per_batch=tokens,
                       seconds_per_step=NS / 1e9,
                       metrics={"m": [(s, metric_at(s)) for s in range(1, total + 1)]})
    return counters(log)


def driver_for(schedule: Schedule, clock: FakeTime) -> ScheduleDriver:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ScheduleWarning)
        return ScheduleDriver(schedule, time_source=clock, record=True)


class TestAgainstSimulation:
    """A loop that reports its steps, batches and epochs fires what simulate() predicts."""

    @settings(max_examples=80, deadline=None)
    @given(schedule=host_schedules(ALL_UNITS, metric="m"), shape=shapes)
    def test_firings_equal_simulation(self, schedule: Schedule,
                                      shape: Shape) -> None:
        """Every unit, windows, lifecycle events and metric conditions: same firings,
        same counters, in the same order."""
        lengths, accum, samples, tokens = shape
        clock = FakeTime()
        driver = driver_for(schedule, clock)
        run_loop(driver, clock, shape)
        assert counters(driver.firings) == simulated(schedule, lengths, accum, samples,
                                                     tokens)

    @settings(max_examples=60, deadline=None)
    @given(schedule=host_schedules(ALL_UNITS, metric="m"), shape=shapes, data=st.data())
    def test_resume_fires_as_the_uninterrupted_run(
            self, schedule: Schedule, shape: Shape,
            data: st.DataObject) -> None:
        """Killed after any micro-batch (inside a step too), saved as JSON and resumed in a
        new driver: the two parts' firings are the uninterrupted run's (metric triggers'
        state and values included)."""
        lengths, accum, samples, tokens = shape
        cut = data.draw(st.integers(1, sum(lengths) * accum), label="killed after batch")
        clock = FakeTime()
        first = driver_for(schedule, clock)
        run_loop(first, clock, shape, until_batch=cut)
        saved = json.loads(json.dumps(first.state_dict()))
        second = driver_for(schedule, clock)
        second.load_state_dict(saved)
        run_loop(second, clock, shape, from_batch=cut)
        assert counters(first.firings + second.firings) == simulated(
            schedule, lengths, accum, samples, tokens)


class TestLoop:
    """What a loop author relies on."""

    def test_step_returns_due_callbacks_and_runs_actions(self) -> None:
        """``step()`` returns the names due at that step and runs their actions."""
        ran: list[int] = []
        driver = ScheduleDriver(Schedule({"log": every("2 steps")}),
                                actions={"log": lambda: ran.append(driver.now.step)})
        driver.train_start()
        driver.epoch_start()
        due = [driver.step(samples=8) for _ in range(5)]
        assert due == [(), ("log",), (), ("log",), ()]
        assert ran == [2, 4]
        assert driver.now.sample == 40

    def test_quiet_step_is_one_comparison(self) -> None:
        """Between firings the table is not evaluated: ``fire`` runs only at due steps."""
        driver = ScheduleDriver(Schedule({"save": every("100 steps")}))
        calls: list[str] = []
        inner = driver.fire
        driver.fire = lambda event: calls.append(event) or inner(event)  # type: ignore[method-assign]
        driver.train_start()
        for _ in range(250):
            driver.step()
        assert calls == ["train_start", "step_end", "step_end"]
        assert driver.table.step_due == 300

    def test_action_metric_seen_by_later_callback_at_same_event(self) -> None:
        """A metric an action puts is seen by callbacks declared after it, at that event."""
        driver = ScheduleDriver(
            Schedule({"evaluate": every("1 epoch"), "report": on("epoch_end") & when("acc > 0.5")}),
            actions={"evaluate": lambda: driver.put("acc", 0.9)})
        driver.train_start()
        driver.epoch_start()
        driver.step()
        assert driver.epoch_end() == ("evaluate", "report")

    def test_resumed_inside_epoch_does_not_restart_it(self) -> None:
        """``epoch_start`` after resuming inside an epoch fires nothing and keeps
        ``step_in_epoch``; ``train_start`` fires only in a fresh run."""
        schedule = Schedule({"start": on("train_start") | on("epoch_start")})
        driver = ScheduleDriver(schedule)
        assert driver.train_start() == ("start",)
        assert driver.epoch_start() == ("start",)
        driver.step()
        resumed = ScheduleDriver(schedule)
        resumed.load_state_dict(driver.state_dict())
        assert resumed.train_start() == ()
        assert resumed.epoch_start() == ()
        assert resumed.now.step_in_epoch == 1


class TestBadInput:
    """Bad arguments are refused naming what was wrong."""

    def test_action_for_unknown_callback(self) -> None:
        """An action named for no callback of the schedule names it and the schedule's."""
        with pytest.raises(ValueError, match=r"\['svae'\].*\['save'\]"):
            ScheduleDriver(Schedule({"save": every("2 steps")}), actions={"svae": print})

    def test_action_not_callable(self) -> None:
        """An action that cannot be called is refused with its name."""
        with pytest.raises(TypeError, match=r"actions\['save'\] must be callable"):
            ScheduleDriver(Schedule({"save": every("2 steps")}), actions={"save": 3})  # type: ignore[dict-item]

    def test_metric_not_a_number(self) -> None:
        """A metric value that is not a number is refused with the metric's name."""
        driver = ScheduleDriver(Schedule({"save": every("2 steps")}))
        with pytest.raises(TypeError, match="metric 'loss' must be a number"):
            driver.put("loss", "low")

    def test_not_a_schedule(self) -> None:
        """Something other than a schedule is refused."""
        with pytest.raises(TypeError, match="expected a Schedule"):
            ScheduleDriver({"save": every("2 steps")})  # type: ignore[arg-type]

    def test_state_of_something_else(self) -> None:
        """Loading a state that is not a driver's says what is missing."""
        driver = ScheduleDriver(Schedule({"save": every("2 steps")}))
        with pytest.raises(ValueError, match="missing"):
            driver.load_state_dict({"clock": {}})


def test_resumed_between_micro_batches_looks_at_metrics_where_the_run_did() -> None:
    """Killed inside step 10 (after its first micro-batch), saved and resumed: ``improved``
    beside a conditioned clock part is looked at on the uninterrupted run's steps only, so
    the firing at step 15 (a new best there) is kept."""
    schedule = Schedule({"cb0": improved("m") & (at("1 step")
                                                 | (every("3 steps") & when("m < 0.5")))})
    shape: Shape = ([7, 8], 3, 0, 0)
    for cut in (28, 29, 30):
        clock = FakeTime()
        first = driver_for(schedule, clock)
        run_loop(first, clock, shape, until_batch=cut)
        second = driver_for(schedule, clock)
        second.load_state_dict(json.loads(json.dumps(first.state_dict())))
        run_loop(second, clock, shape, from_batch=cut)
        assert counters(first.firings + second.firings) == simulated(schedule, *shape)
        assert [f.step for f in first.firings + second.firings] == [1, 15]
