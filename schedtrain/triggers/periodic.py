"""``every``: periodic triggers with crossing semantics.

``every("3 steps")`` fires at the ``step_end`` of steps 3, 6, 9...: at each
evaluation point where the counter crosses a grid point ``g`` (``prev < g <= now``).
The grid is ``offset + n * period`` for ``n >= 0``, without 0: nothing periodic
fires at time zero, a crossing fires once, and a counter that jumps over
several grid points fires once.
"""

from __future__ import annotations

import math

import attrs

from schedtrain.errors import ArgumentError
from schedtrain.events import EventSet
from schedtrain.time import Time, Timestamp, Unit, as_time
from schedtrain.triggers.base import Trigger
from schedtrain.triggers.protocol import NEVER, Due, Point, due_on

__all__ = ["Every", "every"]


#: Counters that move by exactly one at the events that read them.
_EXACT = frozenset({"step", "batch", "epoch"})


def _validate_period(instance: Every, attribute: attrs.Attribute[Time], value: Time) -> None:
    if not isinstance(value, Time):
        raise TypeError(f"`period` must be a Time such as Time(500, 'steps'), got {value!r}")
    if value.base <= 0:
        raise ArgumentError("period", f"`every` needs a positive period, got {value}",
                            expected="a period > 0", found=str(value))


@attrs.frozen(repr=False)
class Every(Trigger):
    """Fires each time the ``period.unit`` counter crosses ``offset + n * period``."""

    period: Time = attrs.field(validator=_validate_period)
    offset: Time | None = None
    # The grid in counter units, read at every evaluation and bound: a table fires
    # and re-bounds each of its callbacks at once, so these are worked out here once.
    _counter: str = attrs.field(init=False, eq=False, hash=False)
    _event: str = attrs.field(init=False, eq=False, hash=False)
    _k: int = attrs.field(init=False, eq=False, hash=False)
    _off: int = attrs.field(init=False, eq=False, hash=False)
    # Its events, asked for by every check of a schedule (a live retime's included).
    _events: EventSet = attrs.field(init=False, eq=False, hash=False)

    def __attrs_post_init__(self) -> None:
        if self.offset is not None and self.offset.counter != self.period.counter:
            raise ArgumentError(
                "offset", f"`offset` {self.offset} must be in the unit of the period "
                f"{self.period}", expected=f"a time in {self.period.unit.spell(2)}",
                found=str(self.offset))
        object.__setattr__(self, "_counter", self.period.counter)
        object.__setattr__(self, "_event", self.period.unit.event)
        object.__setattr__(self, "_k", self.period.base)
        object.__setattr__(self, "_off", self.offset.base if self.offset is not None else 0)
        object.__setattr__(self, "_events", EventSet(frozenset((self._event,)), False))

    @property
    def unit(self) -> Unit:
        """The period's unit."""
        return self.period.unit

    @property
    def event(self) -> str:
        """The event this trigger is evaluated at."""
        return self._event

    def events(self) -> EventSet:
        return self._events

    def next_grid_point(self, value: int) -> int:
        """The first grid point strictly after ``value`` (in counter units)."""
        k, off = self._k, self._off
        if value < off:
            return off if off > 0 else k
        return off + ((value - off) // k + 1) * k

    def first_possible(self, counter: str, value: float) -> float:
        if counter != self._counter:
            return value
        lowest = max(math.ceil(value), 1)
        first = self.next_grid_point(lowest - 1)
        return first if counter in _EXACT else max(value, self.next_grid_point(0))

    def evaluate(self, pt: Point) -> bool:
        if pt.event != self._event:
            return False
        counter = self._counter
        now: int = getattr(pt.now, counter)
        return self.next_grid_point(getattr(pt.prev, counter)) <= now

    def bound(self, event: str, last: Timestamp) -> Due:
        if event != self._event:
            return NEVER
        counter = self._counter
        return due_on(counter, self.next_grid_point(getattr(last, counter)))

    def _reason(self, pt: Point, value: bool | None) -> str:
        if pt.event != self.event:
            return f"evaluated at {self.event}, not {pt.event}"
        counter = self.period.counter
        g = self.next_grid_point(pt.prev.get(counter))
        prev, now = pt.prev.get(counter), pt.now.get(counter)
        if value:
            return f"{counter} crossed {g} ({prev} -> {now})"
        return f"next crossing at {counter} {g} (now {now})"

    def __repr__(self) -> str:
        if self.offset is None or self.offset.base == 0:
            return f"every({str(self.period)!r})"
        return f"every({str(self.period)!r}, offset={str(self.offset)!r})"


def every(
    period: int | float | Time | str,
    unit: str | Unit | None = None,
    *,
    offset: int | float | Time | str | None = None,
) -> Every:
    """Fire every ``period``: ``every(500, "steps")``, ``every("2 epochs")``.

    Args:
        period: a ``Time``, its text, or a number together with ``unit``.
        unit: the unit when ``period`` is a number.
        offset: shifts the grid: ``every(3, "steps", offset=1)`` fires at 1, 4, 7...
    """
    if isinstance(period, int | float) and not isinstance(period, bool):
        if unit is None:
            raise TypeError(f"every({period!r}) needs a unit, e.g. every({period!r}, 'steps')")
        period_t = Time(period, unit)
    else:
        if unit is not None:
            raise TypeError(f"every({period!r}, {unit!r}): give a unit only with a number")
        period_t = as_time(period, "period")  # type: ignore[arg-type]
    offset_t: Time | None
    if offset is None:
        offset_t = None
    elif isinstance(offset, int | float) and not isinstance(offset, bool):
        offset_t = Time(offset, period_t.unit)
    else:
        offset_t = as_time(offset, "offset")  # type: ignore[arg-type]
    return Every(period_t, offset_t)
