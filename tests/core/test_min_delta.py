"""``min_delta`` in ``improved``, ``plateau`` and ``EarlyStopping``, value by value.

A value is a new best only when it beats the best by *more* than ``min_delta``: a smaller
or an equal gain, an equal value and a value inside the band leave the best (and, for
``plateau``, the patience count) as they were. Every stream below is written for
``mode="min"`` and run mirrored (each value negated) for ``mode="max"``; all values are
multiples of 1/8, so ``best - min_delta`` is exact and "equal to min_delta" really is.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from hypothesis import given, reject
from hypothesis import strategies as st
from oracle import RunSpec, firings

from schedtrain import Schedule, ScheduleError, simulate
from schedtrain.triggers import Trigger, all_of, any_of, every, improved, not_, on, plateau
from schedtrain.triggers.metric import early_stop

MODES = pytest.mark.parametrize("mode", ["min", "max"])


def _sign(mode: str) -> float:
    return 1.0 if mode == "min" else -1.0


def fired(trigger: Trigger, values: Sequence[float]) -> list[int]:
    """The 1-based indices of ``values`` (one put at the end of each epoch) at which
    ``trigger``, checked once an epoch, fires in ``simulate()``."""
    log = simulate(Schedule({"t": every("1 epoch") & trigger}), steps_per_epoch=1,
                   epochs=len(values),
                   metrics={"m": [(f"{e} epochs", v) for e, v in enumerate(values, 1)]})
    return log.epochs("t")


class TestImproved:
    """``improved("m", mode, min_delta)``: fires on a gain of more than ``min_delta``."""

    @MODES
    @pytest.mark.parametrize(("values", "delta", "expected"), [
        ([1.0, 0.75], 0.5, [1]),  # a gain smaller than min_delta
        ([1.0, 0.5], 0.5, [1]),  # a gain equal to min_delta: not more than it
        ([1.0, 0.25], 0.5, [1, 2]),  # a gain larger than min_delta
        ([1.0, 0.875], 0.0, [1, 2]),  # without min_delta any gain counts
        ([1.0, 1.0, 1.0], 0.0, [1]),  # an equal value is no gain
        ([1.0, 1.0, 1.0], 0.5, [1]),
        ([1.0, 1.5, 0.75], 0.5, [1]),  # a worse value, then one inside the band
    ])
    def test_one_gain(self, mode: str, values: list[float], delta: float,
                      expected: list[int]) -> None:
        s = _sign(mode)
        assert fired(improved("m", mode, delta), [s * v for v in values]) == expected

    @MODES
    def test_gains_inside_the_band_do_not_move_the_best(self, mode: str) -> None:
        """Each value beats the one before by 1/8, inside a band of 1/2: the best stays at
        the first until a value is more than 1/2 below it, then the band starts from there."""
        s = _sign(mode)
        values = [1.0, 0.875, 0.75, 0.625, 0.5, 0.375, 0.25, 0.125, 0.0, -0.125, -0.25]
        assert fired(improved("m", mode, 0.5), [s * v for v in values]) == [1, 6, 11]

    @MODES
    def test_without_min_delta_each_small_gain_is_a_best(self, mode: str) -> None:
        """The same stream without min_delta: every value is a new best."""
        s = _sign(mode)
        values = [1.0, 0.875, 0.75, 0.625]
        assert fired(improved("m", mode), [s * v for v in values]) == [1, 2, 3, 4]


class TestPlateau:
    """``plateau("m", patience, mode, min_delta)``: values that gain no more than
    ``min_delta`` count towards ``patience``; it fires at ``patience`` and counts anew."""

    @MODES
    @pytest.mark.parametrize(("values", "patience", "delta", "expected"), [
        ([1.0, 0.75, 0.625], 2, 0.5, [3]),  # two gains inside the band
        ([1.0, 0.5, 0.5], 2, 0.5, [3]),  # a gain equal to min_delta, then an equal value
        ([1.0, 0.25, 0.125], 2, 0.5, []),  # a real gain resets the count
        ([1.0, 0.75, 0.25, 0.125, 0.0], 2, 0.5, [5]),  # the count starts at the new best
        ([1.0, 0.75], 1, 0.5, [2]),
        ([1.0, 0.75], 1, 0.0, []),  # without min_delta the small gain is a new best
        ([1.0, 1.0, 1.0, 1.0, 1.0], 2, 0.0, [3, 5]),  # equal values; counting anew
        ([1.0, 1.5, 0.75, 0.5], 3, 0.5, [4]),  # worse, inside, at the edge: three
    ])
    def test_patience_counting(self, mode: str, values: list[float], patience: int,
                               delta: float, expected: list[int]) -> None:
        s = _sign(mode)
        got = fired(plateau("m", patience, mode, delta), [s * v for v in values])
        assert got == expected


class TestEarlyStopping:
    """``EarlyStopping``'s check shares the rule: only a gain of more than ``min_delta``
    resets its wait."""

    @MODES
    @pytest.mark.parametrize(("value", "new_best"), [(0.75, False), (0.5, False), (0.25, True),
                                                    (1.0, False)])
    def test_one_check(self, mode: str, value: float, new_best: bool) -> None:
        s = _sign(mode)
        best, wait, why = early_stop(s * value, best=s * 1.0, wait=1, monitor="m", mode=mode,
                                     min_delta=0.5, patience=2)
        if new_best:
            assert (best, wait, why) == (s * value, 0, None)
        else:
            assert (best, wait) == (s * 1.0, 2)
            assert why == f"m did not improve for 2 checks (best {s * 1.0:.4g})"


# -- property: the rule read another way -----------------------------------------------

EIGHTHS = st.integers(-8, 8).map(lambda k: k / 8)  # exact in binary: no rounding at the band


def _improved_by_definition(values: list[float], mode: str, delta: float) -> list[int]:
    """``improved`` fires at the first value and then at each value more than ``delta``
    beyond the value of its previous firing (that value is the best)."""
    s = _sign(mode)
    out: list[int] = []
    for i, v in enumerate(values, 1):
        if not out or s * (values[out[-1] - 1] - v) > delta:
            out.append(i)
    return out


def _plateau_by_definition(values: list[float], mode: str, delta: float,
                           patience: int) -> list[int]:
    """``plateau`` fires once ``patience`` values have come since the later of the last
    new best (a firing of ``improved``) and its own last firing."""
    bests = set(_improved_by_definition(values, mode, delta))
    out: list[int] = []
    since = 0
    for i in range(1, len(values) + 1):
        if i in bests:
            since = i
        elif i - since == patience:
            out.append(i)
            since = i
    return out


@given(st.lists(EIGHTHS, min_size=1, max_size=12), st.sampled_from(["min", "max"]),
       st.integers(0, 4).map(lambda k: k / 8), st.integers(1, 3))
def test_streams_landing_in_the_band(values: list[float], mode: str, delta: float,
                                     patience: int) -> None:
    """On streams of eighths (gains inside, at and beyond a band of 0 to 1/2), both
    triggers fire where their definitions say."""
    assert fired(improved("m", mode, delta), values) == _improved_by_definition(values, mode,
                                                                                delta)
    assert fired(plateau("m", patience, mode, delta), values) == _plateau_by_definition(
        values, mode, delta, patience)


# -- property: simulate() against the reference, on schedules made of metric triggers --------

_MODE = st.sampled_from(["min", "max"])
_DELTA = st.sampled_from([0.0, 0.25, 0.5])
_metric = st.one_of(st.builds(improved, st.just("m"), _MODE, _DELTA),
                    st.builds(plateau, st.just("m"), st.integers(1, 3), _MODE, _DELTA))
_clock = st.one_of(st.integers(1, 3).map(lambda k: every(f"{k} steps")),
                   st.just(every("1 epoch")), st.just(on("train_end")))
_tree = st.one_of(_metric, _metric,
                  st.tuples(_clock, _metric).map(lambda ts: all_of(*ts)),
                  st.lists(_metric, min_size=2, max_size=3).map(lambda ts: any_of(*ts)),
                  _metric.map(not_))


@st.composite
def _runs(draw: st.DrawFn) -> RunSpec:
    """Short runs with a dense stream of eighths for ``m``, put at steps and epochs."""
    lengths = tuple(draw(st.lists(st.integers(1, 5), min_size=1, max_size=3)))
    total = sum(lengths)
    when = st.one_of(st.tuples(st.just("step"), st.integers(0, total)),
                     st.tuples(st.just("epoch"), st.integers(0, len(lengths))))
    records = draw(st.lists(st.tuples(when, st.just("m"), EIGHTHS), min_size=2, max_size=10))
    return RunSpec(lengths, max_steps=draw(st.none() | st.integers(1, total)),
                   metrics=tuple(records))


@given(st.lists(_tree, min_size=1, max_size=3), _runs())
def test_metric_schedules_fire_as_the_reference(trees: list[Trigger], run: RunSpec) -> None:
    """Metric triggers alone, under a clock part, in an ``any`` and negated, on dense
    streams: ``simulate()`` fires exactly where tests/oracle.py (its own reading of
    min_delta and patience) says."""
    schedule = Schedule({f"cb{i}": t for i, t in enumerate(trees)})
    stream = [(f"{k} {unit}s", name, value) for (unit, k), name, value in run.metrics]
    try:
        log = simulate(schedule, epoch_lengths=list(run.epoch_lengths),
                       max_steps=run.max_steps, metrics=stream)
    except ScheduleError:
        reject()
    assert [(f.callback, f.event, f.timestamp) for f in log] == firings(schedule, run)
