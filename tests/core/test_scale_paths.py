"""The quick paths a schedule of thousands of callbacks takes give the answers of the
general ones: a time parsed directly, a unit's properties, a composite's text worked out
late, and the garbage collector paused while schedules are built and simulated."""

from __future__ import annotations

import gc

import pytest
from hypothesis import given
from hypothesis import strategies as st

from schedtrain import Schedule, Time, Timestamp, Unit
from schedtrain.errors import SpecError
from schedtrain.schedule.collector import collector_paused
from schedtrain.simulation import simulate
from schedtrain.spec import loads_spec
from schedtrain.time import MAX_COUNT, NS_PER_SECOND
from schedtrain.triggers import all_of, any_of, every, improved, not_, window
from schedtrain.triggers.protocol import Point

_SPELLINGS = ["step", "steps", "batch", "batches", "epoch", "epochs", "sample", "samples",
              "token", "tokens", "s", "sec", "secs", "second", "seconds", "min", "mins",
              "minute", "minutes", "h", "hr", "hrs", "hour", "hours"]
_SUFFIX = {"": 1, "k": 1_000, "M": 1_000_000, "G": 1_000_000_000, "B": 1_000_000_000}


def test_unit_properties_follow_their_definition() -> None:
    """Counting units read their own counter in whole units; s, min and h read
    ``time_ns`` at their number of nanoseconds."""
    wall = {Unit.SECOND: 1, Unit.MINUTE: 60, Unit.HOUR: 3600}
    for unit in Unit:
        if unit in wall:
            assert (unit.counter, unit.scale, unit.is_time, unit.is_integral) == (
                "time_ns", wall[unit] * NS_PER_SECOND, True, False)
        else:
            assert (unit.counter, unit.scale, unit.is_time, unit.is_integral) == (
                unit.value, 1, False, True)


@given(st.integers(0, 10**12), st.sampled_from(_SPELLINGS), st.sampled_from(sorted(_SUFFIX)))
def test_parse_of_a_whole_number_is_the_time_built_from_it(n: int, unit: str,
                                                           suffix: str) -> None:
    """What ``parse`` builds directly is the ``Time`` the constructor builds, and the
    one ``from_base`` builds from its base: equal, same base, same value and type; past
    ``MAX_COUNT`` in the counter's unit, refused."""
    text = f"{n}{suffix} {unit}"
    if n * _SUFFIX[suffix] * Unit.parse(unit).scale > MAX_COUNT:
        with pytest.raises(ValueError, match=f"invalid time '{text}': too large"):
            Time.parse(text)
        return
    t = Time.parse(text)
    built = Time(n * _SUFFIX[suffix], unit)
    again = Time.from_base(t.base, t.unit)
    assert (t.unit, t.base) == (built.unit, built.base) == (again.unit, again.base)
    assert t.value == again.value and type(t.value) is type(again.value)


@given(st.integers(0, 10**6), st.integers(1, 999), st.sampled_from(["s", "min", "h"]))
def test_parse_of_a_decimal_time_is_exact(whole: int, frac: int, unit: str) -> None:
    """A decimal wall time has the exact base of its decimal and ``from_base``'s value."""
    t = Time.parse(f"{whole}.{frac:03d} {unit}")
    assert t.base == (whole * 1000 + frac) * Unit.parse(unit).scale // 1000
    again = Time.from_base(t.base, t.unit)
    assert t.value == again.value and type(t.value) is type(again.value)


def test_parse_refusals_are_unchanged() -> None:
    """A fraction of a counting unit and an unknown unit are refused as before."""
    with pytest.raises(ValueError, match=r"1.5 steps is not a whole number of steps"):
        Time.parse("1.5 steps")
    with pytest.raises(ValueError, match=r"invalid time '5 stpes': unknown unit 'stpes'"):
        Time.parse("5 stpes")


@pytest.mark.parametrize("trigger", [
    every("2 steps") & window(stop="9 steps"),
    every("2 steps") | every("3 steps"),
    not_(every("2 steps")),
    all_of(every("1 epoch"), any_of(every("5 steps"), improved("val/loss"))),
])
def test_composite_node_is_named_by_its_trigger(trigger: object) -> None:
    """A compiled composite's explanation names it as its ``repr`` does, though the text
    is worked out only when asked."""
    node = trigger.compile()  # type: ignore[attr-defined]
    pt = Point("step_end", Timestamp(step=4), Timestamp(step=3), None, {})
    assert node.text == repr(trigger)
    assert node.explain(pt).trigger == repr(trigger)


def test_collector_paused_restores_the_collector() -> None:
    """On inside: off; after, as before, an error included; off already: left off."""
    assert gc.isenabled()
    with collector_paused():
        assert not gc.isenabled()
        with collector_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()  # the inner block leaves the outer one's pause
    assert gc.isenabled()
    with pytest.raises(KeyError), collector_paused():
        raise KeyError("x")
    assert gc.isenabled()
    gc.disable()
    try:
        with collector_paused():
            pass
        assert not gc.isenabled()  # the program's own choice stays
    finally:
        gc.enable()


def test_loading_and_simulating_leave_the_collector_on() -> None:
    """A spec loaded, refused or simulated leaves the collector as it found it."""
    spec = loads_spec('[callbacks.a]\ntrigger = { every = "2 steps" }\n')
    with pytest.raises(SpecError):
        loads_spec('[callbacks.a]\ntrigger = { every = "2 stpes" }\n')
    assert gc.isenabled()
    log = simulate(Schedule({"a": spec.callbacks["a"].trigger}), epochs=1, steps_per_epoch=4)
    assert [f.step for f in log] == [2, 4]
    assert gc.isenabled()
