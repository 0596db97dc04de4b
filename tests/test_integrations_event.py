"""Actions that declare a parameter ``event`` are told which event fired them: in your own
loop (``ScheduleDriver``) each call's event and clock are simulate()'s firing's."""

from __future__ import annotations

import warnings
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from schedtrain import Schedule, ScheduleWarning, Unit, simulate
from schedtrain.integrations import ScheduleDriver
from schedtrain.integrations.driver import takes_event
from tests.host_strategies import host_schedules

UNITS = [Unit.STEP, Unit.BATCH, Unit.EPOCH]


def run(schedule: Schedule, epochs: int, steps: int, accum: int) -> list[tuple[Any, ...]]:
    told: list[tuple[Any, ...]] = []
    driver: ScheduleDriver

    def action(name: str) -> Any:
        return lambda event: told.append((name, event, driver.now.step, driver.now.epoch))

    driver = ScheduleDriver(schedule, actions={n: action(n) for n in schedule.names})
    driver.train_start()
    for _ in range(epochs):
        driver.epoch_start()
        for _ in range(steps):
            for _ in range(accum):
                driver.batch_end()
            driver.step_end()
        driver.epoch_end()
    driver.train_end()
    return told


@settings(max_examples=60, deadline=None)
@given(schedule=host_schedules(UNITS), epochs=st.integers(1, 3), steps=st.integers(1, 4),
       accum=st.integers(1, 3))
def test_each_action_is_told_its_event(schedule: Schedule, epochs: int, steps: int,
                                       accum: int) -> None:
    """Over random schedules (batch-, step- and epoch-unit, lifecycle events) and shapes:
    the (callback, event, step, epoch) each action is told are simulate()'s firings."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ScheduleWarning)
        log = simulate(schedule, epochs=epochs, steps_per_epoch=steps, batches_per_step=accum)
    want = [(f.callback, f.event, f.step, f.timestamp.epoch) for f in log]
    assert run(schedule, epochs, steps, accum) == want


def test_only_a_declared_event_is_passed() -> None:
    """A function without ``event`` (or taking it only by ``**kwargs``) is called as before."""
    def plain() -> None: ...
    def keyword(*, event: str) -> None: ...
    def extra(**kwargs: Any) -> None: ...
    assert [takes_event(f) for f in (plain, keyword, extra, print)] == [False, True, False,
                                                                        False]
