"""The algebra's laws, checked on random trigger trees at random evaluation points."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from strategies import clock_triggers, holds

from schedtrain import Schedule, Time, Timestamp, Unit, simulate
from schedtrain.triggers import Point, all_of, any_of, at, every, not_

# Random trees often contain dead branches; their warnings are expected here.
pytestmark = pytest.mark.filterwarnings("ignore::schedtrain.ScheduleWarning")

EVENTS = ["train_start", "epoch_start", "batch_end", "step_end", "epoch_end", "train_end"]


@st.composite
def points(draw: st.DrawFn) -> Point:
    step = draw(st.integers(0, 60))
    prev_step = max(step - draw(st.integers(1, 3)), 0)
    epoch = draw(st.integers(0, 6))
    sample = draw(st.integers(0, 100))
    token = draw(st.integers(0, 100))
    seconds = float(draw(st.integers(0, 100)))
    now = Timestamp(step, step, epoch, 0, sample, token, seconds)
    prev = Timestamp(prev_step, max(step - 1, 0), max(epoch - 1, 0), 0,
                     max(sample - draw(st.integers(0, 30)), 0),
                     max(token - draw(st.integers(0, 30)), 0),
                     max(seconds - draw(st.integers(0, 30)), 0.0))
    return Point(draw(st.sampled_from(EVENTS)), now, prev, None, None)


def value(t, pt: Point) -> bool:
    return bool(t.compile().evaluate(pt))


class TestTruthTables:
    """``&``, ``|`` and ``~`` are conjunction, disjunction and negation at every point."""

    @given(clock_triggers(), clock_triggers(), points())
    def test_and_or_not(self, a, b, pt) -> None:
        """The composite's value is the boolean combination of its parts' values."""
        assert value(a & b, pt) == (value(a, pt) and value(b, pt))
        assert value(a | b, pt) == (value(a, pt) or value(b, pt))
        assert value(~a, pt) == (not value(a, pt))

    @given(clock_triggers(), points())
    def test_evaluation_matches_definitions(self, t, pt) -> None:
        """Compiled evaluation agrees with the definitions of DESIGN §3."""
        assert value(t, pt) == holds(t, pt.event, pt.now, pt.prev)


class TestStructure:
    """Associativity with flattening, double negation, De Morgan."""

    @given(clock_triggers(), clock_triggers(), clock_triggers())
    def test_associativity_flattens(self, a, b, c) -> None:
        """``(a & b) & c`` and ``a & (b & c)`` are the same value; likewise ``|``."""
        assert (a & b) & c == a & (b & c) == all_of(a, b, c)
        assert (a | b) | c == a | (b | c) == any_of(a, b, c)

    @given(clock_triggers())
    def test_double_negation(self, a) -> None:
        """``~~a == a``."""
        assert ~~a == a

    @given(clock_triggers(), clock_triggers(), points())
    def test_de_morgan(self, a, b, pt) -> None:
        """``~(a & b)`` is true exactly where ``~a | ~b`` is."""
        assert value(not_(a & b), pt) == value(~a | ~b, pt)
        assert value(not_(a | b), pt) == value(~a & ~b, pt)


class TestEveryIsAtItsMultiples:
    """``every k`` fires exactly where ``at`` its multiples fires."""

    @given(st.integers(1, 15), st.sampled_from([Unit.STEP, Unit.EPOCH, Unit.SAMPLE]),
           st.lists(st.integers(1, 20), min_size=1, max_size=4), st.integers(1, 9))
    def test_every_equals_at_multiples(self, k, unit, lengths, samples) -> None:
        """Over a whole run, ``every(k)`` and ``at(k, 2k, ...)`` give the same firings."""
        total = sum(lengths) * samples if unit is Unit.SAMPLE else (
            len(lengths) if unit is Unit.EPOCH else sum(lengths))
        multiples = [Time(m, unit) for m in range(k, total + 1, k)] or [Time(total + k, unit)]
        log_every = simulate(Schedule({"x": every(k, unit)}), epoch_lengths=lengths,
                             samples_per_batch=samples)
        log_at = simulate(Schedule({"x": at(*multiples)}), epoch_lengths=lengths,
                          samples_per_batch=samples)
        assert list(log_every) == list(log_at)
