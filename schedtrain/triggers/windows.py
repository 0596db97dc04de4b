"""``window``: restrict a trigger to ``start <= t < stop``, like a Python range."""

from __future__ import annotations

import math

import attrs

from schedtrain.errors import ArgumentError
from schedtrain.time import Time, Timestamp, as_time
from schedtrain.triggers.base import Trigger, all_of
from schedtrain.triggers.protocol import ANY_TIME, NEVER, Due, Point, due_on

__all__ = ["Window", "window"]


@attrs.frozen(repr=False)
class Window(Trigger):
    """True at points where the window's counter is in ``[start, stop)``.

    A window is a filter: AND it with a trigger that says when (``every``,
    ``at``, ``on``); alone it is true at every event inside it.
    """

    start: Time | None = None
    stop: Time | None = None

    def __attrs_post_init__(self) -> None:
        if self.start is None and self.stop is None:
            raise ArgumentError("start", "`window` needs `start`, `stop` or both",
                                expected="a start or a stop time", found="neither")
        if self.start is not None and self.stop is not None:
            if self.start.counter != self.stop.counter:
                raise ArgumentError(
                    "stop", f"`start` {self.start} and `stop` {self.stop} must share a unit; "
                    "AND two windows to bound two counters",
                    expected=f"a time in {self.start.unit.spell(2)}", found=str(self.stop))
            if self.stop <= self.start:
                raise ArgumentError(
                    "stop", f"empty window: `stop` {self.stop} must be after `start` "
                    f"{self.start}", expected=f"a time after {self.start}",
                    found=str(self.stop))

    @property
    def counter(self) -> str:
        """The counter the window reads."""
        edge = self.start if self.start is not None else self.stop
        assert edge is not None
        return edge.counter

    def contains(self, value: float) -> bool:
        """Whether a counter value is inside the window."""
        if self.start is not None and value < self.start.base:
            return False
        return self.stop is None or value < self.stop.base

    def first_possible(self, counter: str, value: float) -> float:
        if counter != self.counter:
            return value
        if self.stop is not None and value >= self.stop.base:
            return math.inf
        return value if self.start is None else max(value, self.start.base)

    def evaluate(self, pt: Point) -> bool:
        return self.contains(pt.now.get(self.counter))

    def bound(self, event: str, last: Timestamp) -> Due:
        value = last.get(self.counter)
        if self.stop is not None and value >= self.stop.base:
            return NEVER
        if self.start is not None and value < self.start.base:
            return due_on(self.counter, self.start.base)
        return ANY_TIME

    def _reason(self, pt: Point, value: bool | None) -> str:
        return f"{self.counter} is {pt.now.get(self.counter)}"

    def __repr__(self) -> str:
        parts = []
        if self.start is not None:
            parts.append(f"start={str(self.start)!r}")
        if self.stop is not None:
            parts.append(f"stop={str(self.stop)!r}")
        return f"window({', '.join(parts)})"


def window(start: Time | str | None = None, stop: Time | str | None = None) -> Trigger:
    """Restrict to ``start <= t < stop``: ``every("1 epoch") & window(start="2 epochs")``.

    ``start`` and ``stop`` in different units become two windows AND-ed.
    """
    start_t = None if start is None else as_time(start, "start")
    stop_t = None if stop is None else as_time(stop, "stop")
    if start_t is not None and stop_t is not None and start_t.counter != stop_t.counter:
        return all_of(Window(start=start_t), Window(stop=stop_t))
    return Window(start_t, stop_t)
