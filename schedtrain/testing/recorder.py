"""The recorder of schedule coverage: probes around every part of a simulated trigger.

While a ``Recorder`` is started, every ``Simulation`` shows it its table before it runs
(``simulation.simulate.observe_tables``), and the recorder puts a probe around each
part of each callback's trigger, noting each part's value at each evaluation for the
callback's ``CallbackCoverage`` (``testing.coverage``).

The table only looks where something can fire, so where a window's bound hides the
points where it blocks, a clock-only trigger is also looked at where its other parts
hold, until each such part has blocked once; those extra points never fire (the bound
the trigger gives decides that), so the firings are those of a run without coverage.
Nothing of this runs unless a recorder is started (the pytest plugin's
``--schedule-coverage``).
"""

from __future__ import annotations

import math
from typing import Any

from schedtrain.events import BOUNDED_EVENTS
from schedtrain.schedule.table import TriggerTable, _share_groups
from schedtrain.simulation.simulate import TableObserver, observe_tables
from schedtrain.testing.coverage import (
    FALSE,
    TRUE,
    UNKNOWN,
    UNSEEN,
    CallbackCoverage,
    Gap,
    kind_of,
)
from schedtrain.time import COUNTERS, Timestamp
from schedtrain.triggers.base import Trigger
from schedtrain.triggers.nodes import AllNode, AnyNode, NotNode, and_bound
from schedtrain.triggers.protocol import NEVER, Due, Explanation, Node, Point

__all__ = ["Recorder"]


def _code(value: bool | None) -> int:
    return UNKNOWN if value is None else TRUE if value else FALSE


class _Probe:
    """A part's node: notes its value at each evaluation, otherwise the node itself."""

    def __init__(self, inner: Node, slot: int, values: list[int]) -> None:
        self.inner = inner
        self.slot = slot
        self.values = values

    def evaluate(self, pt: Point) -> bool | None:
        value = self.inner.evaluate(pt)
        self.values[self.slot] = _code(value)
        return value

    def bound(self, event: str, last: Timestamp) -> Due:
        return self.inner.bound(event, last)

    def explain(self, pt: Point) -> Explanation:
        return self.inner.explain(pt)

    def state_dict(self) -> dict[str, Any]:
        return self.inner.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.inner.load_state_dict(state)


def _build(trigger: Trigger, values: list[int], probes: list[_Probe]) -> _Probe:
    """The node ``trigger.compile()`` gives, with a probe around every part."""
    slot = len(probes)
    probe = _Probe(trigger, slot, values)  # placeholder inner, set below
    probes.append(probe)
    kind = kind_of(trigger)
    kids = [_build(c, values, probes) for c in trigger.children()] if kind != "leaf" else []
    inner: Node
    if kind == "all":
        inner = AllNode(repr(trigger), list(kids), [c.dynamic for c in trigger.children()])
    elif kind == "any":
        inner = AnyNode(repr(trigger), list(kids))
    elif kind == "not":
        inner = NotNode(repr(trigger), kids[0])
    else:
        inner = trigger.compile()
    probe.inner = inner
    return probe


def _below(now: Timestamp, due: Due) -> bool:
    return all(now.get(c) < d for c, d in zip(COUNTERS, due, strict=True))


class _Root:
    """A callback's node under coverage: notes every part's value, feeds the records."""

    def __init__(self, trigger: Trigger, record: CallbackCoverage) -> None:
        self.records = [record]
        self.probes: list[_Probe] = []
        self.values: list[int] = []
        self.top = _build(trigger, self.values, self.probes)
        self.values.extend([UNSEEN] * len(self.probes))
        self.pure = trigger.pure
        self._plain: dict[str, Due] = {}

    def evaluate(self, pt: Point) -> bool | None:
        values = self.values
        values[:] = [UNSEEN] * len(values)
        value = self.top.evaluate(pt)
        plain = self._plain.get(pt.event)
        # a point looked at for coverage alone, which the trigger's bound rules out
        extra = plain is not None and pt.event in BOUNDED_EVENTS and _below(pt.now, plain)
        if extra:
            value = False
        for record in self.records:
            record.observe(values, value is True)
        return value

    def plain_bound(self, event: str, last: Timestamp) -> Due:
        """The trigger's own bound."""
        return self.top.bound(event, last)

    def bound(self, event: str, last: Timestamp) -> Due:
        plain = self._plain[event] = self.top.bound(event, last)
        if not self.pure:  # extra points would show stateful parts more values
            return plain
        wide = list(plain)
        for record in self.records:
            for i in record.open_blocks():
                siblings = record.parts[record.parts[i].parent].children
                due = and_bound([self.probes[s].bound(event, last)
                                 for s in siblings if s != i])
                wide = [min(a, b) for a, b in zip(wide, due, strict=True)]
        if wide == [math.inf] * 6:
            return NEVER
        return (wide[0], wide[1], wide[2], wide[3], wide[4], wide[5])

    def explain(self, pt: Point) -> Explanation:
        return self.top.explain(pt)

    def state_dict(self) -> dict[str, Any]:
        return self.top.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.top.load_state_dict(state)


class Recorder:
    """Collects coverage from every simulation while started.

    ``where`` names what is running (the pytest plugin sets the test's id; empty:
    outside a test); a
    callback is reported with the first place its trigger was simulated.
    """

    def __init__(self) -> None:
        self.callbacks: dict[tuple[str, str], CallbackCoverage] = {}
        self.where = ""
        self._previous: TableObserver | None = None

    def start(self) -> None:
        """Instrument every simulation from now on."""
        self._previous = observe_tables(self.instrument)

    def stop(self) -> None:
        """Stop instrumenting (the observer before ``start`` is back)."""
        observe_tables(self._previous)

    def record(self, name: str, trigger: Trigger) -> CallbackCoverage:
        """The record of a callback, made on first sight."""
        key = (name, repr(trigger))
        found = self.callbacks.get(key)
        if found is None:
            found = self.callbacks[key] = CallbackCoverage(name, trigger, self.where)
        return found

    def instrument(self, table: TriggerTable) -> None:
        """Put a probe around each callback's trigger (once; its state carried over)."""
        if any(isinstance(n, _Root) for n in table.nodes):
            return
        shared = _share_groups(table.triggers)
        nodes: list[Node] = []
        for i, (name, trigger, node) in enumerate(
                zip(table.names, table.triggers, table.nodes, strict=True)):
            record = self.record(name, trigger)
            first = shared[i]
            if 0 <= first < i:  # an equal clock-only trigger: evaluated once, seen by both
                root = nodes[first]
                assert isinstance(root, _Root)
                root.records.append(record)
            else:
                root = _Root(trigger, record)
                state = node.state_dict()
                if state:
                    root.load_state_dict(state)
            nodes.append(root)
        table.nodes = tuple(nodes)

    def gaps(self) -> list[Gap]:
        """Every part of every recorded callback that never decided a firing."""
        return [g for cov in self.callbacks.values() for g in cov.gaps()]
