"""``before_deadline``: fire once, at the first step end with less than a margin left.

The run's deadline (``[run] deadline`` or the scheduler's job end) is placed on the
clock's ``time_ns`` axis when training starts and reaches triggers as
``Point.deadline_ns``; time left is that minus the point's ``time_ns``. Since the time
is the chief's agreed time on several ranks, every rank decides alike. The node
remembers that it fired (saved in checkpoints), so a resumed run never fires it again.
"""

from __future__ import annotations

from typing import Any

import attrs

from schedtrain.errors import ArgumentError
from schedtrain.events import EventSet
from schedtrain.time import Time, Timestamp, as_time
from schedtrain.triggers.base import Trigger
from schedtrain.triggers.protocol import ANY_TIME, NEVER, Due, Explanation, Point, due_on

__all__ = ["BeforeDeadline", "before_deadline"]

_EVENT = "step_end"


def _validate_margin(instance: BeforeDeadline, attribute: attrs.Attribute[Time],
                     value: Time) -> None:
    if not isinstance(value, Time) or not value.unit.is_time:
        raise ArgumentError("margin", f"`before_deadline` needs a duration such as '10 min', "
                            f"got {value}", expected="a duration ('10 min', '90 s')",
                            found=str(value))


@attrs.frozen(repr=False)
class BeforeDeadline(Trigger):
    """Fires once, at the first ``step_end`` where less than ``margin`` is left."""

    margin: Time = attrs.field(validator=_validate_margin)

    def reads_deadline(self) -> bool:
        return True

    def events(self) -> EventSet:
        return EventSet.of(_EVENT)

    def compile(self) -> _Node:
        return _Node(self)

    def evaluate(self, pt: Point) -> bool | None:
        """Stateless reading: whether less than ``margin`` is left at ``pt``."""
        if pt.event != _EVENT or pt.deadline_ns is None:
            return False
        return pt.deadline_ns - pt.now.time_ns < self.margin.base

    def __repr__(self) -> str:
        return f"before_deadline({str(self.margin)!r})"


class _Node:
    """The compiled trigger: fires at most once per run, resumes included."""

    def __init__(self, trigger: BeforeDeadline) -> None:
        self.trigger = trigger
        self.fired = False
        # The deadline as the last evaluated point gave it, so later bounds skip every
        # step before it can fire (until a point was seen, every step end is looked at).
        self._seen = False
        self._deadline: int | None = None

    def evaluate(self, pt: Point) -> bool | None:
        if pt.event != _EVENT or self.fired:
            return False
        self._seen, self._deadline = True, pt.deadline_ns
        if self.trigger.evaluate(pt):
            self.fired = True
            return True
        return False

    def bound(self, event: str, last: Timestamp) -> Due:
        if event != _EVENT or self.fired:
            return NEVER
        if not self._seen:
            return ANY_TIME
        if self._deadline is None:
            return NEVER
        # true once time_ns > deadline - margin
        return due_on("time_ns", max(self._deadline - self.trigger.margin.base + 1, 0))

    def explain(self, pt: Point) -> Explanation:
        if self.fired:
            return Explanation(repr(self.trigger), False, "fired already (fires once)")
        value = self.trigger.evaluate(pt)
        if pt.deadline_ns is None:
            reason = "the run has no deadline"
        else:
            left = (pt.deadline_ns - pt.now.time_ns) / 1e9
            reason = f"{left:g} s left, fires below {self.trigger.margin}"
        return Explanation(repr(self.trigger), value, reason)

    def state_dict(self) -> dict[str, Any]:
        return {"fired": self.fired}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.fired = bool(state.get("fired", False))


def before_deadline(margin: Time | str) -> BeforeDeadline:
    """Fire once when less than ``margin`` is left before the run's deadline:
    ``before_deadline("10 min")``."""
    return BeforeDeadline(as_time(margin, "margin"))
