"""The trigger contract: evaluation points, due vectors, explanations and the base class.

A trigger is an immutable value. ``compile()`` turns it into a ``Node`` that
the trigger table evaluates; stateless triggers are their own nodes, while
metric triggers compile to nodes that carry state (best value, patience).

Evaluation is three-valued: ``True``, ``False`` or ``None`` (unknown, when a
plan has no metric values to decide a condition).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any, Protocol, TypeAlias

import attrs

from schedtrain.time import COUNTERS, Timestamp

__all__ = [
    "ALL_EVENTS",
    "ANY_TIME",
    "NEVER",
    "Due",
    "Explanation",
    "MetricValue",
    "MetricsView",
    "Node",
    "Point",
    "Predicate",
    "Trigger",
]

Due: TypeAlias = tuple[float, float, float, float, float, float]
"""Per counter (``COUNTERS`` order) a threshold: a trigger cannot be true at an
evaluation point where *every* counter is below its threshold."""

NEVER: Due = (math.inf,) * 6
ANY_TIME: Due = (0.0,) * 6

#: ``events()`` of a trigger that may be true at any event (windows, conditions).
ALL_EVENTS = None


_COUNTER_INDEX = {c: i for i, c in enumerate(COUNTERS)}


def due_on(counter: str, value: float) -> Due:
    """A due vector with one finite threshold."""
    due = list(NEVER)
    due[_COUNTER_INDEX[counter]] = value
    return tuple(due)  # type: ignore[return-value]  # six items, as NEVER has


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
    """An evaluation point: an event, the clock at it and at the previous point.

    ``metrics`` or ``predicates`` set to ``None`` means unknown (planning):
    conditions that need them evaluate to ``None``.
    """

    event: str
    now: Timestamp
    prev: Timestamp
    metrics: MetricsView | None = None
    predicates: Mapping[str, Predicate] | None = None


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
        """State that must survive a resume."""

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what ``state_dict`` returned."""


class Trigger:
    """Base of every trigger value. Compose with ``&``, ``|`` and ``~``."""

    __slots__ = ()

    @property
    def dynamic(self) -> bool:
        """Whether evaluation reads anything beyond the clock (metrics, predicates)."""
        return False

    def __and__(self, other: Trigger) -> Trigger:
        from schedtrain.triggers.logic import all_of

        if not isinstance(other, Trigger):
            return NotImplemented
        return all_of(self, other)

    def __or__(self, other: Trigger) -> Trigger:
        from schedtrain.triggers.logic import any_of

        if not isinstance(other, Trigger):
            return NotImplemented
        return any_of(self, other)

    def __invert__(self) -> Trigger:
        from schedtrain.triggers.logic import not_

        return not_(self)

    # -- the node protocol, for stateless triggers ----------------------------------
    def events(self) -> frozenset[str] | None:
        """Events at which this trigger can be true; ``None`` for any event."""
        return ALL_EVENTS

    def children(self) -> tuple[Trigger, ...]:
        """Sub-triggers, for walking a tree."""
        return ()

    def compile(self) -> Node:
        """A node for the trigger table; stateless triggers are their own node."""
        return self

    def evaluate(self, pt: Point) -> bool | None:
        """Whether the trigger is true at ``pt``."""
        raise NotImplementedError

    def bound(self, event: str, last: Timestamp) -> Due:
        """Thresholds before which it cannot be true at ``event`` (see ``Due``)."""
        return ANY_TIME

    def explain(self, pt: Point) -> Explanation:
        """Why the trigger is or is not true at ``pt``."""
        value = self.evaluate(pt)
        return Explanation(repr(self), value, self._reason(pt, value))

    def _reason(self, pt: Point, value: bool | None) -> str:
        return "true here" if value else "false here"

    def state_dict(self) -> dict[str, Any]:
        """Stateless triggers have nothing to save."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Stateless triggers have nothing to restore."""
