"""``at``: fire once at each listed time (crossing semantics, like ``every``)."""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable

import attrs

from schedtrain.errors import ArgumentError
from schedtrain.events import EventSet
from schedtrain.time import Time, Timestamp, Unit, as_time
from schedtrain.triggers.base import Trigger, any_of
from schedtrain.triggers.protocol import NEVER, Due, Point, due_on

__all__ = ["At", "at"]


def _sorted_points(points: Iterable[Time]) -> tuple[Time, ...]:
    return tuple(sorted(set(points), key=lambda t: t.base))


@attrs.frozen(repr=False)
class At(Trigger):
    """Fires at the evaluation point where the counter first reaches each point."""

    points: tuple[Time, ...] = attrs.field(converter=_sorted_points)
    _bases: tuple[int, ...] = attrs.field(init=False, eq=False, hash=False)

    def __attrs_post_init__(self) -> None:
        if not self.points:
            raise ArgumentError("points", "`at` needs at least one point",
                                expected="one or more times", found="none")
        counters = {p.counter for p in self.points}
        if len(counters) > 1:
            raise ArgumentError("points", f"`at` points must share one unit, got "
                                f"{self._text()}", expected="times in one unit",
                                found=self._text())
        for p in self.points:
            if p.base <= 0:
                raise ArgumentError(
                    "points", f"`at` point {p} is at time zero, where nothing is evaluated; "
                    "use on('train_start') instead", expected="times > 0", found=str(p))
        object.__setattr__(self, "_bases", tuple(p.base for p in self.points))

    @property
    def unit(self) -> Unit:
        """The points' unit."""
        return self.points[0].unit

    @property
    def event(self) -> str:
        """The event this trigger is evaluated at."""
        return self.unit.event

    def events(self) -> EventSet:
        return EventSet.of(self.event)

    def _next_after(self, value: float) -> int | None:
        i = bisect.bisect_right(self._bases, value)
        return self._bases[i] if i < len(self._bases) else None

    def first_possible(self, counter: str, value: float) -> float:
        if counter != self.unit.counter:
            return value
        if counter in ("step", "batch", "epoch"):
            i = bisect.bisect_left(self._bases, value)
            return self._bases[i] if i < len(self._bases) else math.inf
        return max(value, self._bases[0])

    def evaluate(self, pt: Point) -> bool:
        if pt.event != self.event:
            return False
        counter = self.unit.counter
        nxt = self._next_after(pt.prev.get(counter))
        return nxt is not None and nxt <= pt.now.get(counter)

    def bound(self, event: str, last: Timestamp) -> Due:
        if event != self.event:
            return NEVER
        nxt = self._next_after(last.get(self.unit.counter))
        return NEVER if nxt is None else due_on(self.unit.counter, nxt)

    def _reason(self, pt: Point, value: bool | None) -> str:
        if pt.event != self.event:
            return f"evaluated at {self.event}, not {pt.event}"
        counter = self.unit.counter
        nxt = self._next_after(pt.prev.get(counter))
        if value:
            return f"{counter} reached the point {nxt}"
        return "no points left" if nxt is None else f"next point at {counter} {nxt}"

    def _text(self) -> str:
        return ", ".join(repr(str(p)) for p in self.points)

    def __repr__(self) -> str:
        return f"at({self._text()})"


def at(*points: Time | str | Iterable[Time | str]) -> Trigger:
    """Fire once at each point: ``at("1000 steps", "5000 steps")`` or ``at([...])``.

    Points in several units become ``any_of`` one ``at`` per unit.
    """
    flat: list[Time] = []
    for p in points:
        if isinstance(p, Time | str):
            flat.append(as_time(p, "at"))
        else:
            flat.extend(as_time(q, "at") for q in p)
    by_counter: dict[str, list[Time]] = {}
    for p in flat:
        by_counter.setdefault(p.unit.counter, []).append(p)
    if len(by_counter) <= 1:
        return At(tuple(flat))
    return any_of(*(At(tuple(ps)) for ps in by_counter.values()))
