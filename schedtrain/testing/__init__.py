"""Helpers for testing your own schedules against a simulated clock.

::

    from schedtrain.testing import simulate, fired_at, assert_fires

    def test_checkpoints_every_500_steps():
        log = simulate(schedule, epochs=2, steps_per_epoch=1000)
        assert fired_at(log, "checkpoint") == [500, 1000, 1500, 2000]

All helpers are plain functions over a ``FiringLog``; they work with pytest's
assertion rewriting and with any other runner. ``simulate_ranks`` simulates a run on
several processes (``torchrun``): global samples and tokens, metrics reduced across ranks.
``assert_resumes_exactly`` checks that a trigger of your own saves all its state.
Schedule coverage (``pytest --schedule-coverage``): ``testing.coverage`` (what is
recorded), ``testing.recorder`` (how) and ``testing.plugin`` (the pytest plugin).
"""

from __future__ import annotations

from collections.abc import Sequence

from schedtrain.simulation.ranks import simulate_ranks
from schedtrain.simulation.simulate import (
    Firing,
    FiringLog,
    RunShape,
    SimClock,
    Simulation,
    next_firing,
    simulate,
)
from schedtrain.testing.resume import assert_resumes_exactly
from schedtrain.time import Unit

__all__ = [
    "Firing",
    "FiringLog",
    "RunShape",
    "SimClock",
    "Simulation",
    "assert_fires",
    "assert_never_fires",
    "assert_resumes_exactly",
    "fired_at",
    "next_firing",
    "simulate",
    "simulate_ranks",
]


def fired_at(
    log: FiringLog, callback: str, unit: str | Unit = Unit.STEP, *, event: str | None = None
) -> list[int | float]:
    """The clock value (steps by default, or ``"epochs"``, ``"tokens"``...) at each firing.

    Args:
        log: a firing log from ``simulate``.
        callback: the callback's name in the schedule.
        unit: which counter to report.
        event: only firings at this event (e.g. ``"epoch_end"``).
    """
    u = Unit.parse(unit)
    return [f.timestamp.in_unit(u) for f in log.of(callback) if event is None or f.event == event]


def assert_fires(
    log: FiringLog,
    callback: str,
    expected: Sequence[int | float],
    unit: str | Unit = Unit.STEP,
    *,
    event: str | None = None,
) -> None:
    """Fail with a readable diff unless ``callback`` fired exactly at ``expected``."""
    got = fired_at(log, callback, unit, event=event)
    if list(got) == list(expected):
        return
    missing = sorted(set(expected) - set(got))
    extra = sorted(set(got) - set(expected))
    u = Unit.parse(unit)
    raise AssertionError(
        f"{callback!r} fired at {u.spell(2)} {got}, expected {list(expected)}"
        + (f"; missing {missing}" if missing else "")
        + (f"; unexpected {extra}" if extra else "")
    )


def assert_never_fires(log: FiringLog, callback: str) -> None:
    """Fail, listing the firings, if ``callback`` fired at all."""
    firings = log.of(callback)
    if firings:
        shown = ", ".join(f"{f.event}@step {f.step}" for f in list(firings)[:5])
        raise AssertionError(f"{callback!r} fired {len(firings)} times: {shown}")
