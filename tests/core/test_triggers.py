"""Trigger values: factories, validation, repr and the condition grammar."""

from __future__ import annotations

import re

import pytest

from schedtrain import Schedule, Timestamp, simulate
from schedtrain.triggers import (
    AllOf,
    AnyOf,
    Every,
    MetricValue,
    Not,
    Point,
    all_of,
    any_of,
    at,
    every,
    improved,
    not_,
    on,
    parse_condition,
    plateau,
    when,
    window,
)


class Metrics:
    """A minimal MetricsView for tests."""

    def __init__(self, **values: float) -> None:
        self.values = values

    def latest(self, name: str) -> MetricValue | None:
        return MetricValue(self.values[name], 1) if name in self.values else None


def point(event: str = "step_end", step: int = 1, metrics=None, **kw) -> Point:
    now = Timestamp(step=step, **kw)
    prev = Timestamp(step=max(step - 1, 0), **kw)
    return Point(event, now, prev, metrics, {})


class TestEvery:
    """``every``: periodic with crossing semantics."""

    def test_forms(self) -> None:
        """A number with a unit, text, and a Time all build the same trigger."""
        assert every(500, "steps") == every("500 steps") == Every(every("500 steps").period)

    def test_offset_shifts_the_grid(self) -> None:
        """``offset`` moves the grid: every 3 steps offset 1 fires at 1, 4, 7."""
        t = every(3, "steps", offset=1)
        fired = [s for s in range(1, 9) if t.evaluate(point(step=s))]
        assert fired == [1, 4, 7]

    @pytest.mark.parametrize(("args", "error", "fragment"), [
        ((0, "steps"), ValueError, "positive period"),
        ((5,), TypeError, "needs a unit"),
        (("5 steps", "steps"), TypeError, "only with a number"),
        (("five steps",), ValueError, "invalid time"),
    ])
    def test_bad_arguments(self, args, error, fragment) -> None:
        """Bad periods are refused with a message saying what was expected."""
        with pytest.raises(error, match=fragment):
            every(*args)

    def test_offset_in_other_unit_refused(self) -> None:
        """The offset must share the period's unit."""
        with pytest.raises(ValueError, match="unit of the period"):
            every("3 steps", offset="1 epoch")

    def test_repr_reads_like_toml(self) -> None:
        """The repr is the factory call that rebuilds it."""
        assert repr(every("3 steps", offset="1 step")) == "every('3 steps', offset='1 step')"


class TestAtOnWindow:
    """Points, lifecycle events and windows."""

    def test_at_fires_once_per_point(self) -> None:
        """``at`` fires at the evaluation point where each listed time is reached."""
        t = at("2 steps", "5 steps")
        assert [s for s in range(1, 8) if t.evaluate(point(step=s))] == [2, 5]

    def test_at_refuses_time_zero(self) -> None:
        """A point at zero is refused with a pointer to ``on('train_start')``."""
        with pytest.raises(ValueError, match="train_start"):
            at("0 steps")

    def test_at_mixed_units_split(self) -> None:
        """Points in two units become an ``any_of`` of one ``at`` per unit, each firing at
        its own event: the first epoch's end (3 steps an epoch) and step 5's end."""
        t = at("5 steps", "1 epoch")
        assert t == any_of(at("5 steps"), at("1 epoch"))
        log = simulate(Schedule({"a": t}), steps_per_epoch=3, epochs=3)
        assert [(f.event, f.timestamp.step) for f in log] == [("epoch_end", 3), ("step_end", 5)]

    def test_on_and_bad_event_name(self) -> None:
        """``on`` matches its event; an invalid name is refused."""
        assert on("train_end").evaluate(point("train_end"))
        assert not on("train_end").evaluate(point("step_end"))
        with pytest.raises(ValueError, match="invalid event name"):
            on("not an event!")

    def test_window_is_half_open(self) -> None:
        """``start`` is inclusive and ``stop`` exclusive."""
        w = window(start="2 steps", stop="4 steps")
        assert [s for s in range(1, 6) if w.evaluate(point(step=s))] == [2, 3]

    def test_empty_window_refused(self) -> None:
        """``stop <= start`` is refused, naming both."""
        with pytest.raises(ValueError, match="stop` 2 steps must be after `start` 5 steps"):
            window(start="5 steps", stop="2 steps")

    def test_window_across_units_is_two_windows(self) -> None:
        """A start and stop in different units bound two counters: open from step 10 until
        the second epoch ends (8 steps an epoch), at every default event in between."""
        t = window(start="10 steps", stop="2 epochs")
        assert t == all_of(window(start="10 steps"), window(stop="2 epochs"))
        log = simulate(Schedule({"w": t}), steps_per_epoch=8, epochs=3)
        assert [(f.event, f.timestamp.step) for f in log] == [("step_end", s)
                                                               for s in range(10, 17)]


class TestConditions:
    """``when``: a small grammar, never ``eval``."""

    @pytest.mark.parametrize(("text", "metrics", "expected"), [
        ("val/loss < 0.5", {"val/loss": 0.4}, True),
        ("val/loss < 0.5", {"val/loss": 0.6}, False),
        ("val/loss < 0.5", {}, False),
        ("0.1 < val/loss <= 0.5", {"val/loss": 0.5}, True),
        ("acc >= 0.9 and not loss > 1", {"acc": 0.95, "loss": 0.5}, True),
        ("acc >= 0.9 or loss < 1e-3", {"acc": 0.5, "loss": 1e-4}, True),
        ("(acc > 0.9 or acc < 0.1) and loss != 0", {"acc": 0.05, "loss": 2.0}, True),
        ("train/loss < val/loss", {"train/loss": 0.1, "val/loss": 0.2}, True),
        ("delta > -1", {"delta": -0.5}, True),
        ("not (a < 1 or b > 2)", {"a": 1.5, "b": 1.0}, True),
        ("not (a < 1 or b > 2)", {"a": 0.5, "b": 1.0}, False),
        ("x < 1 and (y > 2 or z < 3)", {"x": 0, "y": 0, "z": 2}, True),
        ("x < 1 and (y > 2 or z < 3)", {"x": 0, "y": 0, "z": 4}, False),
        ("a > 1 or (b > 1 and not (c > 1))", {"a": 0, "b": 2, "c": 0}, True),
        ("not(a<1)and(b<1)", {"a": 2, "b": 0}, True),
        ("x != 1", {"x": float("nan")}, True),
        ("x < 1", {"x": float("nan")}, False),
    ])
    def test_comparisons(self, text: str, metrics: dict, expected: bool) -> None:
        """Comparisons, chains, and/or/not and parentheses evaluate against metric values."""
        assert when(text).evaluate(point(metrics=Metrics(**metrics))) is expected

    @pytest.mark.parametrize(("text", "fragment"), [
        ("__import__('os')", "calls are not allowed"),
        ("val/loss <", "expected a metric or a number after '<'"),
        ("val/loss < 0.5 and", "expected a metric, a number"),
        ("1 < 2", "compares only numbers"),
        ("loss ** 2 < 1", "unexpected '*'"),
        ("(loss < 1", "expected ')'"),
        ("", "empty"),
        ("3", "comparison operator"),
        ("os.system('rm')", "calls are not allowed"),
        ("loss; import os", "unexpected ';'"),
        ("not (" * 70 + "a < 1" + ")" * 70, "nest more than 64 levels"),
        ("a < 1 and f(2)", "calls are not allowed ('f(' at position 11)"),
    ])
    def test_unsafe_or_malformed_text_is_refused(self, text: str, fragment: str) -> None:
        """Text that is not the grammar is refused with where and what was expected."""
        with pytest.raises(ValueError, match=re.escape(fragment)):
            parse_condition(text)

    def test_unknown_without_metrics(self) -> None:
        """Without metric values (planning) a condition is unknown, not false."""
        assert when("val/loss < 0.5").evaluate(point(metrics=None)) is None

    def test_names_read(self) -> None:
        """A condition reports the metrics and predicates it reads."""
        w = when("is_chief and val/loss < 0.5")
        assert w.metric_names == {"val/loss"}
        assert w.predicate_names == {"is_chief"}

    def test_python_callable(self) -> None:
        """A Python callable receives the evaluation point."""
        w = when(lambda pt: pt.now.step > 2)
        assert w.evaluate(point(step=3)) is True
        assert w.evaluate(point(step=1)) is False


class TestMetricTriggers:
    """``improved`` and ``plateau`` validate their arguments."""

    def test_bad_arguments(self) -> None:
        """Mode, min_delta and patience are checked with clear messages."""
        with pytest.raises(ValueError, match="'min' or 'max'"):
            improved("val/loss", mode="lowest")  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="min_delta"):
            improved("val/loss", min_delta=-1)
        with pytest.raises(ValueError, match="patience"):
            plateau("val/loss", patience=0)

    def test_repr(self) -> None:
        """Reprs rebuild the trigger."""
        assert repr(plateau("val/loss", 3)) == "plateau('val/loss', patience=3, mode='min')"


class TestComposition:
    """``&``, ``|``, ``~`` and their factories."""

    def test_flattening(self) -> None:
        """Nested compositions of one kind are spliced into one."""
        a, b, c = every("1 step"), every("2 steps"), every("3 steps")
        assert (a & b) & c == a & (b & c) == AllOf((a, b, c))
        assert (a | b) | c == a | (b | c) == AnyOf((a, b, c))
        assert all_of(a) is a and any_of(a) is a

    def test_double_negation(self) -> None:
        """``~~t`` is ``t``."""
        t = every("3 steps")
        assert ~~t == t
        assert isinstance(~t, Not)
        assert not_(not_(t)) == t

    def test_repr_reads_like_python(self) -> None:
        """The composed repr is valid Python that rebuilds an equal trigger."""
        t = every(500, "steps") & ~at("1000 steps") | on("train_end")
        text = repr(t)
        assert text == "(every('500 steps') & ~at('1000 steps')) | on('train_end')"
        assert eval(text, {"every": every, "at": at, "on": on}) == t

    def test_only_triggers_compose(self) -> None:
        """Composing with a non-trigger is a TypeError."""
        with pytest.raises(TypeError):
            _ = every("1 step") & 3  # type: ignore[operator]
