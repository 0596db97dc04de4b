"""The compiled trigger table: which callbacks fire at an event, in declared order.

The table knows triggers only through their protocol (``triggers.protocol``): the
events each watches, a due vector per frequent event, whether it fires, its state.
For every frequent event (``batch_end``, ``step_end``, ``epoch_end``) it keeps each
callback's due vector in a ``DueBook``; a step on which nothing can fire costs one
comparison against ``step_due``, whatever the number of callbacks. Only callbacks
whose own vector is reached are evaluated; a callback is evaluated at an event only
if its own trigger can be true there, so its firings never depend on the others.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import attrs

from schedtrain.clock import Clock, step_back
from schedtrain.errors import describe
from schedtrain.events import BOUNDED_EVENTS, EventSet
from schedtrain.readback import PartStateError, printable
from schedtrain.schedule.collector import collector_paused
from schedtrain.schedule.dues import DueBook
from schedtrain.time import Timestamp
from schedtrain.triggers.base import Trigger
from schedtrain.triggers.protocol import (
    ANY_TIME,
    Due,
    Explanation,
    MetricsView,
    Node,
    Point,
    Predicate,
)

__all__ = ["Runner", "TableExplanation", "TriggerTable"]

_ZERO = Timestamp()

Runner = Callable[[str, Timestamp], None]
"""Runs a firing callback, by name and with the clock at the event, while the table
evaluates that event."""


@attrs.frozen
class TableExplanation:
    """Per callback, whether it fires at one point and why."""

    event: str
    now: Timestamp
    callbacks: Mapping[str, Explanation]

    @property
    def firing(self) -> tuple[str, ...]:
        """Names of the callbacks that fire, in declared order."""
        return tuple(n for n, e in self.callbacks.items() if e.value)

    def __str__(self) -> str:
        head = f"at {self.event}, step {self.now.step}, epoch {self.now.epoch}:"
        return "\n".join([head] + [f"[{n}] {e.render(1).lstrip()}"
                                   for n, e in self.callbacks.items()])


def _share_groups(triggers: Sequence[Trigger]) -> tuple[int, ...]:
    """Per callback, the first callback with an equal pure trigger (-1: evaluate alone).

    Equal pure triggers (clock only, no state) are true together and due together, so
    each group is evaluated and bounded once per event.
    """
    first: dict[Trigger, int] = {}
    out = []
    for i, t in enumerate(triggers):
        try:
            out.append(first.setdefault(t, i) if t.pure else -1)
        except TypeError:  # an unhashable user trigger is evaluated on its own
            out.append(-1)
    return tuple(out)


class TriggerTable:
    """A compiled schedule: evaluate it at events, in declared order, cheaply.

    Use: ``table.attach(clock, metrics)`` once, then ``step_end()`` after each
    optimizer step, ``epoch_end()``, ``batch_end()`` (only if ``needs_batch_end``)
    and ``fire(event)`` for the other events. Each returns the names that fire.
    A loop that wants the last nanoseconds inlines the step check::

        if clock.step >= table.step_due:
            run(table.step_end())

    Args:
        entries: ``(callback name, trigger)`` in declared order.
        events: the custom events the schedule declares.
        predicates: predicates registered by name (``None``: undecided, for planning).
        warnings: notes from the static checks, kept for reports.
    """

    def __init__(
        self,
        entries: Sequence[tuple[str, Trigger]],
        *,
        events: tuple[str, ...] = (),
        predicates: Mapping[str, Predicate] | None = None,
        warnings: tuple[str, ...] = (),
    ) -> None:
        self.names: tuple[str, ...] = tuple(n for n, _ in entries)
        self.triggers: tuple[Trigger, ...] = tuple(t for _, t in entries)
        self.events = events
        with collector_paused():  # a node, a group and an event set per callback
            self.nodes: tuple[Node, ...] = tuple(t.compile() for t in self.triggers)
            self._shared = _share_groups(self.triggers)
            self._event_sets: tuple[EventSet, ...] = tuple(t.events() for t in self.triggers)
        self._listeners: dict[str, tuple[int, ...]] = {}
        self.warnings = warnings
        self.predicates = predicates
        self._metrics: MetricsView | None = None
        #: The run's deadline on the clock's ``time_ns`` axis (``None``: none); set
        #: before ``attach`` by the trainer (or the simulator).
        self.deadline_ns: int | None = None
        #: The run's number of epochs (``max_epochs``; ``None``: not known), set likewise.
        self.final_epoch: int | None = None
        #: The step ending that epoch (``None``: not known), set likewise.
        self.final_step: int | None = None
        self._clock: Clock | None = None
        self._books: dict[str, DueBook] = {}
        #: Call ``step_end()`` only once ``clock.step >= step_due``: the loop's whole
        #: per-step cost when nothing fires (0 while other counters must be watched).
        self.step_due: float = math.inf
        #: Whether any callback is evaluated at ``batch_end`` (its trigger names it).
        self.needs_batch_end = bool(self.listeners("batch_end"))
        #: Whether any callback is evaluated at ``batch_start`` (its trigger names it).
        self.needs_batch_start = bool(self.listeners("batch_start"))

    # -- structure ------------------------------------------------------------------------
    def listeners(self, event: str) -> tuple[int, ...]:
        """Indexes of callbacks whose own trigger can be true at ``event``."""
        found = self._listeners.get(event)
        if found is None:
            found = tuple(i for i, ev in enumerate(self._event_sets) if event in ev)
            self._listeners[event] = found
        return found

    @property
    def always_evaluated(self) -> tuple[str, ...]:
        """Callbacks evaluated at every step: no clock part bounds them (report in plans)."""
        # A node may widen its bound to be looked at more often (schedule coverage does);
        # ``plain_bound`` is then the trigger's own.
        return tuple(self.names[i] for i in self.listeners("step_end")
                     if getattr(self.nodes[i], "plain_bound", self.nodes[i].bound)(
                         "step_end", _ZERO) == ANY_TIME)

    # -- binding -------------------------------------------------------------------------
    def attach(
        self,
        clock: Clock,
        metrics: MetricsView | None = None,
        predicates: Mapping[str, Predicate] | None = None,
        *,
        last_step_end: Timestamp | None = None,
    ) -> None:
        """Bind to a clock (and metric store) and compute due vectors from its position.

        The clock's position is taken as already evaluated, as a resumed run's is: nothing
        is due again before the next point where a trigger can fire, so a dynamic part (a
        metric trigger, which counts the values it looks at) is looked at exactly where the
        uninterrupted run looked. ``last_step_end`` is the last step end when the clock has
        moved past it (micro-batches of the next step already counted).
        """
        self._clock = clock
        self._metrics = metrics
        if predicates is not None:
            self.predicates = predicates
        now = clock.now()
        with collector_paused():  # per callback and event, a due vector and its entries
            for event in BOUNDED_EVENTS:
                last = (last_step_end if event == "step_end" and last_step_end is not None
                        else now)
                book = self._books[event] = DueBook(len(self.nodes), self._shared)
                book.set(self._bounds(event, last, self.listeners(event)))
        self._update_step_due()

    def _update_step_due(self) -> None:
        g = self._books["step_end"].minimum
        clock = self._clock
        assert clock is not None
        # Only the step counter moves on every step with certainty of one; an epoch
        # threshold cannot be crossed between epoch ends, where this is recomputed.
        steps_only = (g[1] == g[3] == g[4] == g[5] == math.inf
                      and (g[2] == math.inf or clock.epoch < g[2]))
        self.step_due = g[0] if steps_only else 0

    def set_deadline(self, deadline_ns: int) -> None:
        """A deadline learned while the run goes on (a preemption notice), kept when
        earlier than the run's: the triggers that count down to one are looked at at the
        next step end (their bounds were worked out without it)."""
        if self.deadline_ns is not None and self.deadline_ns <= deadline_ns:
            return
        self.deadline_ns = deadline_ns
        if self._clock is None:
            return
        self._books["step_end"].set([(i, ANY_TIME) for i in self.listeners("step_end")
                                     if self.triggers[i].reads_deadline()])
        self._update_step_due()

    def due(self, event: str) -> Due:
        """The table's due vector for a frequent event: nothing fires before it."""
        return self._books[event].minimum

    # -- firing --------------------------------------------------------------------------
    def step_end(self, run: Runner | None = None) -> tuple[str, ...]:
        """Call after each optimizer step; one comparison while ``step < step_due``."""
        clock = self._clock
        if clock is not None and clock.step < self.step_due:
            return ()
        return self.decide("step_end", run)

    def batch_end(self, run: Runner | None = None) -> tuple[str, ...]:
        """Call after each micro-batch (only needed when ``needs_batch_end``)."""
        return self.decide("batch_end", run)

    def epoch_end(self, run: Runner | None = None) -> tuple[str, ...]:
        """Call at the end of each epoch."""
        return self.decide("epoch_end", run)

    def decide(self, event: str, run: Runner | None = None) -> tuple[str, ...]:
        """Decide which callbacks fire at ``event`` now; their names, in declared order.

        With ``run``, each firing callback's name (and the clock at the event) is passed
        to ``run`` as soon as its trigger is found true, before the triggers of callbacks
        declared after it are evaluated: a metric that an earlier callback produces at
        this event is visible to later callbacks' triggers at the same event.
        """
        names = self.names
        return tuple([names[i] for i, value in self.evaluate(event, run) if value])

    def fire(self, event: str, run: Runner | None = None) -> tuple[str, ...]:
        """Deprecated name of ``decide`` (the table decides; the trainer fires)."""
        warnings.warn("TriggerTable.fire is now TriggerTable.decide (the old name stops "
                      "working in 0.3)", DeprecationWarning, stacklevel=2)
        return self.decide(event, run)

    def evaluate(
        self, event: str, run: Runner | None = None
    ) -> list[tuple[int, bool | None]]:
        """Evaluate at ``event`` now; ``(index, value)`` for each callback true or unknown.

        ``run`` (optional) is called with each true callback's name, in order, before
        the next candidate is evaluated (see ``decide``), and the clock at the event.
        """
        clock = self._clock
        if clock is None:
            raise RuntimeError("attach the table to a clock before firing events")
        book = self._books.get(event)
        if book is None:
            candidates: Iterable[int] = self.listeners(event)
            if not candidates:
                return []
        else:
            g = book.minimum
            cur = (clock.step, clock.batch, clock.epoch, clock.sample, clock.token,
                   clock.time_ns)
            if all(c < d for c, d in zip(cur, g, strict=True)):
                if event == "epoch_end":
                    self._update_step_due()
                return []
            candidates = book.reached(cur)
        try:
            return self._evaluate(event, candidates, run)
        finally:
            if book is not None:
                book.set(self._bounds(event, clock.now(), candidates))
                if event in ("step_end", "epoch_end"):
                    self._update_step_due()

    def _evaluate(self, event: str, candidates: Iterable[int],
                  run: Runner | None) -> list[tuple[int, bool | None]]:
        clock = self._clock
        assert clock is not None
        now = clock.now()
        pt = Point(event, now, clock.previous(event), self._metrics, self.predicates,
                   self.deadline_ns, self.final_epoch, self.final_step)
        out: list[tuple[int, bool | None]] = []
        nodes, shared, names = self.nodes, self._shared, self.names
        values: dict[int, bool | None] = {}
        for i in candidates:
            first = shared[i]
            if first < 0:
                value = nodes[i].evaluate(pt)
            elif first in values:
                value = values[first]
            else:
                value = values[first] = nodes[i].evaluate(pt)
            if value is not False:
                out.append((i, value))
                if value and run is not None:
                    run(names[i], now)
        return out

    def _bounds(self, event: str, now: Timestamp,
                candidates: Iterable[int]) -> list[tuple[int, Due]]:
        nodes, shared = self.nodes, self._shared
        found: dict[int, Due] = {}
        out = []
        for i in candidates:
            first = shared[i]
            if first < 0:
                due = nodes[i].bound(event, now)
            elif first in found:
                due = found[first]
            else:
                due = found[first] = nodes[i].bound(event, now)
            out.append((i, due))
        return out

    # -- introspection ---------------------------------------------------------------------
    def explain(
        self,
        event: str,
        now: Timestamp,
        prev: Timestamp | None = None,
        metrics: MetricsView | None = None,
    ) -> TableExplanation:
        """Which callbacks fire at ``event`` with the clock at ``now``, and why.

        ``prev`` is the clock at the previous point of the same event; by default
        the event's own counter one lower (pass it for sample, token or time triggers).
        Callbacks whose trigger is not evaluated at ``event`` are shown as not firing.
        """
        if prev is None:
            prev = (step_back(now, event) if event != "step_end"
                    else attrs.evolve(now, step=max(now.step - 1, 0)))
        pt = Point(event, now, prev, metrics if metrics is not None else self._metrics,
                   self.predicates, self.deadline_ns, self.final_epoch, self.final_step)
        listening = set(self.listeners(event))
        out: dict[str, Explanation] = {}
        for i, (name, node) in enumerate(zip(self.names, self.nodes, strict=True)):
            if i in listening:
                out[name] = node.explain(pt)
            else:
                out[name] = Explanation(repr(self.triggers[i]), False,
                                        f"not evaluated at {event}")
        return TableExplanation(event, now, out)

    def state_dict(self) -> dict[str, Any]:
        """Trigger state (metric triggers' best values and waits) by callback name."""
        return {"triggers": {n: s for n, node in zip(self.names, self.nodes, strict=True)
                             if (s := node.state_dict())}}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore ``state_dict``; an attached table recomputes its due vectors."""
        saved = state.get("triggers", {})
        if not isinstance(saved, Mapping):
            raise PartStateError("triggers", f"expected a table, found {describe(saved)}")
        unknown = set(saved) - set(self.names)
        if unknown:
            raise PartStateError(
                f"triggers.{printable(str(sorted(map(str, unknown))[0]))[:60]}",
                f"names a callback not in this schedule (it has {', '.join(self.names)})")
        for name, node in zip(self.names, self.nodes, strict=True):
            if name in saved:
                try:
                    node.load_state_dict(saved[name])
                except PartStateError as exc:
                    raise exc.within(f"triggers.{name}") from None
        if self._clock is not None:
            self.attach(self._clock, self._metrics, self.predicates)

    def __repr__(self) -> str:
        rows = ", ".join(f"{n}: {t!r}" for n, t in zip(self.names, self.triggers, strict=True))
        return f"<TriggerTable {rows}>"
