"""The compiled trigger table: which callbacks fire at an event, in declared order.

For every frequent event (``step_end``, ``batch_end``, ``epoch_end``) each
callback has a *due vector*: thresholds on the clock's counters below which its
trigger cannot be true. The table keeps their element-wise minimum, so a step on
which nothing can fire costs one comparison per watched counter (one, for a
schedule in steps and epochs), whatever the number of callbacks. Only callbacks
whose own due vector is reached are evaluated; dynamic parts (conditions, metric
triggers) are evaluated only when their clock part holds.
"""

from __future__ import annotations

import heapq
import math
import warnings
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

import attrs

from schedtrain.clock import Clock, step_back
from schedtrain.errors import Problem, ScheduleError, ScheduleWarning, did_you_mean
from schedtrain.events import BOUNDED_EVENTS, BUILTIN_EVENTS
from schedtrain.time import COUNTERS, Timestamp
from schedtrain.triggers.base import (
    ANY_TIME,
    NEVER,
    Due,
    Explanation,
    MetricsView,
    Node,
    Point,
    Predicate,
    Trigger,
)
from schedtrain.triggers.conditions import When
from schedtrain.triggers.lifecycle import On
from schedtrain.triggers.logic import AllOf, AnyOf, Not
from schedtrain.triggers.metric import Improved, Plateau
from schedtrain.triggers.periodic import Every
from schedtrain.triggers.points import At
from schedtrain.triggers.windows import Window

if TYPE_CHECKING:
    from schedtrain.schedule import Schedule

__all__ = ["TableExplanation", "TriggerTable", "compile_schedule"]

_ZERO = Timestamp()

Runner = Callable[[str, Timestamp], None]
"""Runs a firing callback, by name and with the clock at the event, while the table
evaluates that event."""
_EXACT_COUNTERS = ("step", "batch", "epoch")


def _walk(trigger: Trigger, path: str) -> Iterator[tuple[Trigger, str]]:
    yield trigger, path
    if isinstance(trigger, AllOf):
        for i, t in enumerate(trigger.triggers):
            yield from _walk(t, f"{path}.all[{i}]")
    elif isinstance(trigger, AnyOf):
        for i, t in enumerate(trigger.triggers):
            yield from _walk(t, f"{path}.any[{i}]")
    elif isinstance(trigger, Not):
        yield from _walk(trigger.trigger, f"{path}.not")


def _clock_only(trigger: Trigger) -> bool:
    """Whether the trigger reads nothing but the clock (no condition, no metric state)."""
    return not any(isinstance(t, When | Improved | Plateau) for t, _ in _walk(trigger, ""))


def _never_reason(trigger: Trigger) -> str | None:
    """Why a clock-only combination can never be true, if it provably cannot."""
    events = trigger.events()
    if events is not None and not events:
        parts = ", ".join(
            f"{t!r} at {'/'.join(sorted(ev))}"
            for t in trigger.children()
            if (ev := t.events()) is not None
        )
        return f"it can never fire: it requires different events at once ({parts})"
    if isinstance(trigger, AnyOf):
        reasons = [_never_reason(t) for t in trigger.triggers]
        return reasons[0] if all(reasons) else None
    if not isinstance(trigger, AllOf):
        return None
    for t in trigger.triggers:
        reason = _never_reason(t)
        if reason is not None:
            return reason
    lo: dict[str, float] = {}
    hi: dict[str, float] = {}
    for t in trigger.triggers:
        if isinstance(t, Window):
            c = t.counter
            if t.start is not None:
                lo[c] = max(lo.get(c, 0.0), t.start.base)
            if t.stop is not None:
                hi[c] = min(hi.get(c, math.inf), t.stop.base)
    for c in set(lo) | set(hi):
        if lo.get(c, 0.0) >= hi.get(c, math.inf):
            return f"it can never fire: its windows on {c} do not overlap"
    for t in trigger.triggers:
        if isinstance(t, At) and t.unit.counter in _EXACT_COUNTERS:
            c = t.unit.counter
            if not any(lo.get(c, 0.0) <= p.base < hi.get(c, math.inf) for p in t.points):
                return f"it can never fire: every point of {t!r} lies outside its window on {c}"
        if isinstance(t, Every) and t.unit.counter in _EXACT_COUNTERS:
            c = t.unit.counter
            first = t.next_grid_point(max(lo.get(c, 0.0) - 1, 0.0))
            if first >= hi.get(c, math.inf):
                return (
                    f"it can never fire: {t!r} first fires at {c} {first:g}, "
                    f"after its window ends at {hi[c]:g}"
                )
    return None


def _check(
    schedule: Schedule,
    predicates: Mapping[str, Predicate] | None,
    produced_metrics: Collection[str] | None,
) -> tuple[list[Problem], list[str]]:
    problems: list[Problem] = []
    notes: list[str] = []
    known_events = set(BUILTIN_EVENTS) | set(schedule.events)
    for entry in schedule.entries:
        name = entry.default_name()
        root = f"callbacks.{name}.trigger"
        for t, path in _walk(entry.trigger, root):
            if isinstance(t, On) and t.event not in known_events:
                problems.append(Problem(path, (
                    f"unknown event {t.event!r}{did_you_mean(t.event, known_events)}; "
                    "declare custom events on the schedule (events=[...])")))
            if isinstance(t, When) and t.fn is None:
                if predicates is not None:
                    for p in sorted(t.predicate_names - set(predicates)):
                        problems.append(Problem(path, (
                            f"predicate {p!r} is not registered"
                            f"{did_you_mean(p, predicates)}; register it from Python or, "
                            "for a metric, compare it ('metric < 0.5')")))
                metric_names = t.metric_names
            elif isinstance(t, Improved | Plateau):
                metric_names = frozenset((t.metric,))
            else:
                metric_names = frozenset()
            if produced_metrics is not None:
                for m in sorted(metric_names - set(produced_metrics)):
                    notes.append(
                        f"{path}: {t!r} reads metric {m!r}, which no callback produces"
                        f"{did_you_mean(m, produced_metrics)}"
                    )
        reason = _never_reason(entry.trigger)
        if reason is not None:
            problems.append(Problem(root, f"{entry.trigger!r}: {reason}"))
            continue
        for t, path in _walk_live(entry.trigger, root):
            if isinstance(t, AnyOf):
                for i, child in enumerate(t.triggers):
                    reason = _never_reason(child)
                    if reason is not None:
                        notes.append(f"{path}.any[{i}]: {child!r} is dead: {reason}")
    return problems, notes


def _walk_live(trigger: Trigger, path: str) -> Iterator[tuple[Trigger, str]]:
    """Like ``_walk`` but not below a ``not`` (a never-true term there is deliberate)."""
    yield trigger, path
    if isinstance(trigger, AllOf | AnyOf):
        key = "all" if isinstance(trigger, AllOf) else "any"
        for i, t in enumerate(trigger.triggers):
            yield from _walk_live(t, f"{path}.{key}[{i}]")


def compile_schedule(
    schedule: Schedule,
    *,
    predicates: Mapping[str, Predicate] | None = None,
    produced_metrics: Collection[str] | None = None,
) -> TriggerTable:
    """Check ``schedule`` and build its table; see ``Schedule.compile``."""
    problems, notes = _check(schedule, predicates, produced_metrics)
    if problems:
        raise ScheduleError(problems)
    for note in notes:
        warnings.warn(note, ScheduleWarning, stacklevel=3)
    return TriggerTable(schedule, predicates=predicates, warnings=tuple(notes))


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


class TriggerTable:
    """A compiled schedule: evaluate it at events, in declared order, cheaply.

    Use: ``table.attach(clock, metrics)`` once, then call ``step_end()`` after each
    optimizer step, ``epoch_end()``, ``batch_end()`` (only if ``needs_batch_end``)
    and ``fire(event)`` for the rare events. Each returns the names that fire.
    A loop that wants the last nanoseconds inlines the step check::

        if clock.step >= table.step_due:
            run(table.step_end())
    """

    def __init__(
        self,
        schedule: Schedule,
        *,
        predicates: Mapping[str, Predicate] | None = None,
        warnings: tuple[str, ...] = (),
    ) -> None:
        self.schedule = schedule
        self.names: tuple[str, ...] = schedule.names
        self.triggers: tuple[Trigger, ...] = tuple(e.trigger for e in schedule.entries)
        self.nodes: tuple[Node, ...] = tuple(t.compile() for t in self.triggers)
        # Callbacks with equal clock-only triggers (no condition, no metric) are true
        # together and due together: each is evaluated and bounded once per event, by
        # the first such callback (its index here; -1 for triggers with state or metrics).
        first: dict[Trigger, int] = {}
        self._shared: tuple[int, ...] = tuple(
            first.setdefault(t, i) if _clock_only(t) else -1
            for i, t in enumerate(self.triggers))
        self.warnings = warnings
        self.predicates = predicates
        self._events = [t.events() for t in self.triggers]
        self._listeners: dict[str, tuple[int, ...]] = {}
        self._metrics: MetricsView | None = None
        self._clock: Clock | None = None
        self._due: dict[str, list[Due]] = {e: [NEVER] * len(self.nodes) for e in BOUNDED_EVENTS}
        # Per event and counter, a heap of (threshold, callback, version) for callbacks whose
        # due vector has that single finite counter; the rest are checked one by one.
        self._heaps: dict[str, list[list[tuple[float, int, int]]]] = {}
        self._general: dict[str, set[int]] = {}
        self._version: dict[str, list[int]] = {}
        self._global: dict[str, Due] = dict.fromkeys(BOUNDED_EVENTS, NEVER)
        #: Call ``step_end()`` only once ``clock.step >= step_due``: the loop's whole
        #: per-step cost when nothing fires (0 when other counters must be watched).
        self.step_due: float = math.inf
        self._steps_only = True
        self.needs_batch_end = any(
            ev is not None and "batch_end" in ev for ev in self._events)
        self.step_end: Callable[..., tuple[str, ...]] = self._step_end_generic

    # -- structure ------------------------------------------------------------------------
    def listeners(self, event: str) -> tuple[int, ...]:
        """Indexes of callbacks whose trigger can be true at ``event``."""
        found = self._listeners.get(event)
        if found is None:
            found = tuple(
                i for i, ev in enumerate(self._events)
                if (ev is None and (event != "batch_end" or self.needs_batch_end))
                or (ev is not None and event in ev)
            )
            self._listeners[event] = found
        return found

    @property
    def always_evaluated(self) -> tuple[str, ...]:
        """Callbacks evaluated at every step: no clock part bounds them (report in plans)."""
        return tuple(
            self.names[i] for i in self.listeners("step_end")
            if self.nodes[i].bound("step_end", _ZERO) == ANY_TIME
        )

    # -- binding -------------------------------------------------------------------------
    def attach(
        self,
        clock: Clock,
        metrics: MetricsView | None = None,
        predicates: Mapping[str, Predicate] | None = None,
    ) -> None:
        """Bind to a clock (and metric store) and compute due vectors from its position."""
        self._clock = clock
        self._metrics = metrics
        if predicates is not None:
            self.predicates = predicates
        for event in BOUNDED_EVENTS:
            last = clock.previous(event) if event == "step_end" else clock.now()
            self._heaps[event] = [[] for _ in COUNTERS]
            self._general[event] = set()
            self._version[event] = [0] * len(self.nodes)
            self._set_dues(event, self._bounds(event, last, self.listeners(event)))
            self._refresh_global(event)
        watched = {
            COUNTERS[k] for i in self.listeners("step_end")
            for k, v in enumerate(self._structural_due(i)) if v != math.inf
        }
        self._steps_only = watched <= {"step"}
        self.step_end = self._step_end_steps if self._steps_only else self._step_end_generic
        self._refresh_global("step_end")

    def _structural_due(self, i: int) -> Due:
        """Which counters a callback's step-end bound can ever involve (union over its leaves)."""
        out = [math.inf] * 6
        for t, _ in _walk(self.triggers[i], ""):
            counter = None
            if isinstance(t, Every | At):
                counter = t.unit.counter
            elif isinstance(t, Window):
                counter = t.counter
            if counter is not None:
                out[COUNTERS.index(counter)] = 0.0
        out[0] = 0.0
        return (out[0], out[1], out[2], out[3], out[4], out[5])

    def _set_dues(self, event: str, dues: Iterable[tuple[int, Due]]) -> None:
        # Called with every callback evaluated at an event: the lookups are done once.
        dues_of, version, general = self._due[event], self._version[event], self._general[event]
        heaps = self._heaps[event]
        inf = math.inf
        for i, due in dues:
            dues_of[i] = due
            version[i] += 1
            finite = 6 - due.count(inf)
            if finite == 1:
                general.discard(i)
                k = 0
                while due[k] == inf:
                    k += 1
                heapq.heappush(heaps[k], (due[k], i, version[i]))
            elif finite:
                general.add(i)
            else:
                general.discard(i)

    def _refresh_global(self, event: str) -> None:
        heaps, version = self._heaps[event], self._version[event]
        dues = self._due[event]
        g = [math.inf] * 6
        for k, heap in enumerate(heaps):
            while heap and heap[0][2] != version[heap[0][1]]:
                heapq.heappop(heap)  # superseded entry
            if heap:
                g[k] = heap[0][0]
        for i in self._general[event]:
            d = dues[i]
            for k in range(6):
                g[k] = min(g[k], d[k])
        self._global[event] = (g[0], g[1], g[2], g[3], g[4], g[5])
        if event == "step_end":
            self.step_due = g[0] if self._steps_only else 0.0

    def _candidates(self, event: str, cur: tuple[float, ...]) -> list[int]:
        """Callbacks whose own due vector is reached; their heap entries are consumed."""
        heaps, version = self._heaps[event], self._version[event]
        found: set[int] = set()
        for k, heap in enumerate(heaps):
            c = cur[k]
            while heap and heap[0][0] <= c:
                _, i, v = heapq.heappop(heap)
                if v == version[i]:
                    found.add(i)
        dues = self._due[event]
        for i in self._general[event]:
            if not all(c < d for c, d in zip(cur, dues[i], strict=True)):
                found.add(i)
        return sorted(found)

    def due(self, event: str) -> Due:
        """The table's due vector for a frequent event: nothing fires before it."""
        return self._global[event]

    # -- firing --------------------------------------------------------------------------
    def _step_end_steps(self, run: Runner | None = None) -> tuple[str, ...]:
        if self._clock.step < self.step_due:  # type: ignore[union-attr]
            return ()
        return self.fire("step_end", run)

    def _step_end_generic(self, run: Runner | None = None) -> tuple[str, ...]:
        return self.fire("step_end", run)

    def batch_end(self, run: Runner | None = None) -> tuple[str, ...]:
        """Call after each micro-batch (only needed when ``needs_batch_end``)."""
        return self.fire("batch_end", run)

    def epoch_end(self, run: Runner | None = None) -> tuple[str, ...]:
        """Call at the end of each epoch."""
        return self.fire("epoch_end", run)

    def fire(self, event: str, run: Runner | None = None) -> tuple[str, ...]:
        """Evaluate at ``event`` now; the names that fire, in declared order.

        With ``run``, each firing callback's name (and the clock at the event) is passed
        to ``run`` as soon as its trigger is found true, before the triggers of callbacks
        declared after it are evaluated: a metric that an earlier callback produces at
        this event is visible to later callbacks' triggers at the same event (as in
        ``simulate``).
        """
        return tuple(self.names[i] for i, value in self.evaluate(event, run) if value)

    def evaluate(
        self, event: str, run: Runner | None = None
    ) -> list[tuple[int, bool | None]]:
        """Evaluate at ``event`` now; ``(index, value)`` for each callback true or unknown.

        ``run`` (optional) is called with each true callback's name, in order, before
        the next candidate is evaluated (see ``fire``), and the clock at the event.
        """
        clock = self._clock
        if clock is None:
            raise RuntimeError("attach the table to a clock before firing events")
        if event in self._global:
            g = self._global[event]
            cur = (clock.step, clock.batch, clock.epoch, clock.sample, clock.token,
                   clock.seconds)
            if all(c < d for c, d in zip(cur, g, strict=True)):
                return []
            candidates = self._candidates(event, cur)
        else:
            candidates = list(self.listeners(event))
        if not candidates:
            return []
        now = clock.now()
        prev = clock.previous(event)
        pt = Point(event, now, prev, self._metrics, self.predicates)
        out: list[tuple[int, bool | None]] = []
        nodes, shared = self.nodes, self._shared
        values: dict[int, bool | None] = {}
        try:
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
                        run(self.names[i], now)
        finally:
            if event in self._global:
                self._set_dues(event, self._bounds(event, now, candidates))
                self._refresh_global(event)
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
        """
        if prev is None:
            prev = (step_back(now, event) if event != "step_end"
                    else attrs.evolve(now, step=max(now.step - 1, 0)))
        pt = Point(event, now, prev, metrics if metrics is not None else self._metrics,
                   self.predicates)
        return TableExplanation(
            event, now, {n: node.explain(pt) for n, node in zip(self.names, self.nodes,
                                                                  strict=True)})

    def state_dict(self) -> dict[str, Any]:
        """Trigger state (metric triggers' best values and waits) by callback name."""
        return {"triggers": {n: s for n, node in zip(self.names, self.nodes, strict=True)
                             if (s := node.state_dict())}}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore ``state_dict``; re-``attach`` afterwards to recompute due vectors."""
        saved = state.get("triggers", {})
        unknown = set(saved) - set(self.names)
        if unknown:
            raise ValueError(
                f"saved trigger state names callbacks not in this schedule: {sorted(unknown)}")
        for name, node in zip(self.names, self.nodes, strict=True):
            if name in saved:
                node.load_state_dict(saved[name])
        if self._clock is not None:
            self.attach(self._clock, self._metrics, self.predicates)

    def __repr__(self) -> str:
        rows = ", ".join(f"{n}: {t!r}" for n, t in zip(self.names, self.triggers, strict=True))
        return f"<TriggerTable {rows}>"
