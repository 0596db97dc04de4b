"""Time values and timestamps."""

from __future__ import annotations

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from schedtrain import Time, Timestamp, Unit
from schedtrain.time import MAX_COUNT

UNIT_NAMES = ["steps", "step", "batches", "batch", "epochs", "epoch", "samples", "sample",
              "tokens", "token", "s", "min", "h", "seconds", "minutes", "hours"]


class TestParse:
    """``Time.parse`` reads the TOML vocabulary."""

    @pytest.mark.parametrize(("text", "value", "unit"), [
        ("500 steps", 500, Unit.STEP),
        ("1 step", 1, Unit.STEP),
        ("2 epochs", 2, Unit.EPOCH),
        ("3 batches", 3, Unit.BATCH),
        ("64 samples", 64, Unit.SAMPLE),
        ("1e6 tokens", 1_000_000, Unit.TOKEN),
        ("50M tokens", 50_000_000, Unit.TOKEN),
        ("2k steps", 2000, Unit.STEP),
        ("1_000 steps", 1000, Unit.STEP),
        ("30 min", 30, Unit.MINUTE),
        ("1.5 h", 1.5, Unit.HOUR),
        ("0.5 s", 0.5, Unit.SECOND),
    ])
    def test_accepts(self, text: str, value: float, unit: Unit) -> None:
        """Numbers with units, plural or singular, exponents and k/M/G suffixes parse."""
        t = Time.parse(text)
        assert (t.value, t.unit) == (value, unit)

    @pytest.mark.parametrize(("text", "fragment"), [
        ("5 stpes", "did you mean 'steps'"),
        ("steps", "expected '<number> <unit>'"),
        ("1.5 steps", "not a whole number"),
        ("-3 steps", "expected '<number> <unit>'"),
        ("", "expected '<number> <unit>'"),
        ("3 fortnights", "unknown unit 'fortnights'"),
        ("10steps", "a space between the number and the unit: '10 steps'"),
        ("50Mtokens", "'50M tokens'"),
        ("1.5s", "'1.5 s'"),
    ])
    def test_rejects_with_reason(self, text: str, fragment: str) -> None:
        """Bad text is refused with a message naming the text and what was expected."""
        with pytest.raises(ValueError, match=fragment) as info:
            Time.parse(text)
        assert repr(text) in str(info.value)

    def test_rejects_non_text(self) -> None:
        """A number where text was expected is a TypeError naming the value."""
        with pytest.raises(TypeError, match="500"):
            Time.parse(500)  # type: ignore[arg-type]

    @given(st.integers(0, 10**12), st.sampled_from(UNIT_NAMES))
    def test_str_round_trips(self, value: int, unit: str) -> None:
        """``Time.parse(str(t)) == t`` for every unit and value."""
        assume(value * Unit.parse(unit).scale <= MAX_COUNT)
        t = Time(value, unit)
        assert Time.parse(str(t)) == t
        assert str(Time.parse(str(t))) == str(t)

    @given(st.floats(0, 1e6, allow_nan=False), st.sampled_from(["s", "min", "h"]))
    def test_fractional_time_round_trips(self, value: float, unit: str) -> None:
        """Fractional seconds, minutes and hours print and parse back exactly."""
        t = Time(value, unit)
        assert Time.parse(str(t)) == t

    def test_prints_round_millions_with_suffix(self) -> None:
        """Round millions and billions print as ``M`` and ``G``; others in full."""
        assert [str(Time(50_000_000, "tokens")), str(Time(2 * 10**9, "samples")),
                str(Time(1_500_000, "tokens"))] == ["50M tokens", "2G samples", "1500000 tokens"]

    def test_prints_singular_and_plural(self) -> None:
        """One step, two steps, one batch, two batches; time units stay short."""
        assert [str(Time(1, "steps")), str(Time(2, "step")), str(Time(2, "batch")),
                str(Time(30, "minutes"))] == ["1 step", "2 steps", "2 batches", "30 min"]


class TestArithmetic:
    """Arithmetic and comparison within one dimension."""

    def test_add_and_compare(self) -> None:
        """Same-unit arithmetic and ordering work."""
        assert Time(2, "steps") + Time(3, "steps") == Time(5, "steps")
        assert Time(5, "steps") - Time(3, "steps") == Time(2, "steps")
        assert Time(2, "epochs") * 3 == Time(6, "epochs")
        assert Time(2, "steps") < Time(3, "steps")

    def test_time_units_share_a_dimension(self) -> None:
        """Seconds, minutes and hours compare and add; the result is in the finer unit."""
        assert Time(1, "h") == Time(60, "min") == Time(3600, "s")
        assert Time(1, "min") + Time(30, "s") == Time(90, "s")
        assert str(Time(1, "min") + Time(30, "s")) == "90 s"
        assert Time(1, "h") > Time(59, "min")

    def test_different_units_name_both_operands(self) -> None:
        """Mixing units is a TypeError that names both operands."""
        with pytest.raises(TypeError, match="3 steps and 2 epochs"):
            Time(3, "steps") + Time(2, "epochs")
        with pytest.raises(TypeError, match="different units"):
            _ = Time(3, "steps") < Time(2, "epochs")

    def test_equality_is_strict(self) -> None:
        """A Time never equals a bare number or a string."""
        assert Time(5, "steps") != 5
        assert Time(5, "steps") != "5 steps"

    def test_cannot_go_negative(self) -> None:
        """Subtracting a larger time is a ValueError naming both operands."""
        with pytest.raises(ValueError, match="cannot subtract 5 steps from 3 steps"):
            Time(3, "steps") - Time(5, "steps")

    def test_ratio(self) -> None:
        """Dividing two times of one dimension gives a plain number."""
        assert Time(1, "h") / Time(30, "min") == 2.0


class TestTimestamp:
    """The clock's immutable snapshot."""

    def test_is_immutable(self) -> None:
        """Counters cannot be changed in place."""
        ts = Timestamp(step=3)
        with pytest.raises(AttributeError):
            ts.step = 4  # type: ignore[misc]

    def test_reads_counters_by_unit(self) -> None:
        """``in_unit`` converts seconds to the unit asked for."""
        ts = Timestamp(step=7, seconds=5400.0)
        assert ts.get("step") == 7
        assert ts.in_unit(Unit.HOUR) == 1.5
