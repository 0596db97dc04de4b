"""``on``: fire at an event of the loop (``train_end``) or a custom one."""

from __future__ import annotations

import attrs

from schedtrain.events import EventSet, check_event_name
from schedtrain.time import Timestamp
from schedtrain.triggers.base import Trigger
from schedtrain.triggers.protocol import ANY_TIME, NEVER, Due, Point

__all__ = ["On", "on"]


@attrs.frozen(repr=False)
class On(Trigger):
    """Fires at every occurrence of ``event``."""

    event: str = attrs.field(validator=lambda _i, _a, v: check_event_name(v))

    def events(self) -> EventSet:
        return EventSet.of(self.event)

    def evaluate(self, pt: Point) -> bool:
        return pt.event == self.event

    def bound(self, event: str, last: Timestamp) -> Due:
        return ANY_TIME if event == self.event else NEVER

    def _reason(self, pt: Point, value: bool | None) -> str:
        return f"event is {pt.event}"

    def __repr__(self) -> str:
        return f"on({self.event!r})"


def on(event: str) -> On:
    """Fire at ``event``: ``on("train_end")``, ``on("epoch_start")``, ``on("swa_start")``."""
    return On(event)
