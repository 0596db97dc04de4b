"""What the table and the simulator know of a trigger: evaluation points, due vectors, nodes.

A trigger says which events it watches (``Trigger.events()``); compiled, it becomes a
``Node`` that says whether it fires at an evaluation ``Point``, gives a ``Due`` vector
(per counter, the next value before which it cannot fire, or "look every time"), and
saves and restores its state. Built-in and user triggers go through exactly this.

Evaluation is three-valued: ``True``, ``False`` or ``None`` (unknown, when a plan has
no metric values to decide a condition).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any, Protocol, TypeAlias

import attrs

from schedtrain.time import COUNTERS, Timestamp

__all__ = [
    "ANY_TIME",
    "NEVER",
    "Due",
    "Explanation",
    "MetricValue",
    "MetricsView",
    "Node",
    "Point",
    "Predicate",
    "due_on",
]

Due: TypeAlias = tuple[float, float, float, float, float, float]
"""Per counter (``COUNTERS`` order: step, batch, epoch, sample, token, time_ns) a
threshold: a trigger cannot be true at an evaluation point where *every* counter is
below its threshold. ``ANY_TIME`` means "look at every point"; ``NEVER`` "not again"."""

NEVER: Due = (math.inf,) * 6
ANY_TIME: Due = (0.0,) * 6

_COUNTER_INDEX = {c: i for i, c in enumerate(COUNTERS)}


def due_on(counter: str, value: float) -> Due:
    """A due vector with one finite threshold: nothing before ``counter`` reaches ``value``."""
    due = [math.inf] * 6
    due[_COUNTER_INDEX[counter]] = value
    return (due[0], due[1], due[2], due[3], due[4], due[5])


@attrs.frozen
class MetricValue:
    """The latest value of a metric and how many values it has had."""

    value: float
    count: int


class MetricsView(Protocol):
    """Read access to the latest metric values, as triggers need it."""

    def latest(self, name: str) -> MetricValue | None:
        """The newest value of ``name``, or ``None`` if it has none yet."""


Predicate: TypeAlias = Callable[["Point"], bool]
"""A predicate registered by name; receives the evaluation point."""


@attrs.frozen
class Point:
    """An evaluation point: an event, the clock at it and at the previous point of that event.

    ``metrics`` or ``predicates`` set to ``None`` means unknown (planning):
    conditions that need them evaluate to ``None``. ``deadline_ns`` is the run's
    deadline on the clock's ``time_ns`` axis (``None``: the run has none);
    ``final_epoch`` the number of epochs it is to train and ``final_step`` the step that
    ends the last of them (``None``: not known).
    """

    event: str
    now: Timestamp
    prev: Timestamp
    metrics: MetricsView | None = None
    predicates: Mapping[str, Predicate] | None = None
    deadline_ns: int | None = None
    final_epoch: int | None = None
    final_step: int | None = None


@attrs.frozen
class Explanation:
    """Why a trigger is (or is not) true at a point; a tree mirroring the trigger."""

    trigger: str
    value: bool | None
    reason: str
    children: tuple[Explanation, ...] = ()

    def render(self, indent: int = 0) -> str:
        """The tree as indented text."""
        mark = {True: "yes", False: "no", None: "unknown"}[self.value]
        line = f"{'  ' * indent}{self.trigger}: {mark} — {self.reason}"
        return "\n".join([line] + [c.render(indent + 1) for c in self.children])

    def __str__(self) -> str:
        return self.render()


class Node(Protocol):
    """A compiled trigger, as the table evaluates it."""

    def evaluate(self, pt: Point) -> bool | None:
        """Whether the trigger is true at ``pt``; may update the node's state."""

    def bound(self, event: str, last: Timestamp) -> Due:
        """Thresholds before which it cannot be true at points of ``event`` after ``last``."""

    def explain(self, pt: Point) -> Explanation:
        """Like ``evaluate`` but never changes state, and says why."""

    def state_dict(self) -> dict[str, Any]:
        """State that must survive a resume (plain data)."""

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what ``state_dict`` returned."""
