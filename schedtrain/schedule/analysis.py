"""Static checks of a schedule, before anything runs.

Problems (the schedule is refused): a trigger that can never fire, an event nobody
declared, a predicate that is not registered. Notes (warnings): a condition on a
metric nobody produces, a branch of an ``any`` that can never fire.

Checks walk ``Located`` trees: each trigger with the key path where it was written.
``locate`` makes one for a trigger built in Python; a TOML spec builds its own with
the paths of its file, so every problem names the place it is about.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterator, Mapping, Sequence
from typing import Final

import attrs

from schedtrain.errors import Problem, did_you_mean
from schedtrain.events import BUILTIN_EVENTS
from schedtrain.triggers.base import SEARCH_BUDGET, AllOf, AnyOf, Not, Trigger, first_possible_memo

__all__ = ["Analysis", "Located", "analyze", "locate", "never_reason"]

#: Counters that move by exactly one at the events that read them: what a static
#: check can reason about.
EXACT_COUNTERS: Final = ("step", "batch", "epoch")


@attrs.frozen
class Located:
    """A trigger, the key path where it was written, and its children located likewise."""

    trigger: Trigger
    path: str
    children: tuple[Located, ...] = ()

    def walk(self, *, into_not: bool = True) -> list[Located]:
        """This node and every node below it (not below a ``not`` when ``into_not`` is off),
        depth first in written order."""
        # A list built by a loop: no generator resumed at each node (the spec's checks
        # walk every trigger several times; a live retime pays that on its step), and
        # no recursion for a deep tree.
        found: list[Located] = []
        todo = [self]
        while todo:
            node = todo.pop()
            found.append(node)
            if into_not or not isinstance(node.trigger, Not):
                todo.extend(reversed(node.children))
        return found


def locate(trigger: Trigger, path: str) -> Located:
    """``trigger`` with synthetic paths below ``path`` (``.all[0]``, ``.any[1]``, ``.not``)."""
    kids = trigger.children()
    return Located(trigger, path, tuple(locate(c, path + trigger.child_path(i))
                                        for i, c in enumerate(kids)))


@attrs.frozen
class Analysis:
    """What the checks found: problems refuse the schedule, notes are warnings."""

    problems: tuple[Problem, ...] = ()
    notes: tuple[str, ...] = ()


def never_reason(trigger: Trigger) -> str | None:
    """Why ``trigger`` can provably never fire, or ``None`` when it may."""
    events = trigger.events()
    if events.empty:
        parts = ", ".join(f"{t!r} at {t.events().describe()}" for t in trigger.children())
        return f"it can never fire: it requires different events at once ({parts})"
    for counter in EXACT_COUNTERS:
        if trigger.first_possible(counter, 0) == math.inf:
            return f"it can never fire: {_why_not(trigger, counter)}"
    return None


def _why_not(trigger: Trigger, counter: str) -> str:
    """Which part rules out every value of ``counter``, and from where."""
    if isinstance(trigger, AnyOf):
        return "none of its branches can fire; " + _why_not(trigger.triggers[0], counter)
    parts = trigger.children() if isinstance(trigger, AllOf) else (trigger,)
    value: float = 0
    raisers: list[Trigger] = []
    for _ in range(64):  # the same climb as AllOf.first_possible
        answers = [(t, t.first_possible(counter, value)) for t in parts]
        blocker = next((t for t, a in answers if a == math.inf), None)
        if blocker is not None:
            if not raisers:
                return f"{blocker!r} is never true at any {counter} value"
            # "X is not true before V" only when V is where X can first be true at all
            if all(t.first_possible(counter, 0) == value for t in raisers):
                shown = ", ".join(repr(t) for t in raisers)
                return (f"{blocker!r} is never true at {counter} {value:g} or later, and "
                        f"{shown} is not true before {counter} {value:g}")
            break
        nxt = max(a for _, a in answers)
        raisers = [t for t, a in answers if a == nxt and nxt > value] or raisers
        value = nxt
    shown = ", ".join(repr(t) for t in parts if t.first_possible(counter, 0) != 0)
    return f"no {counter} value makes all of its parts true ({shown})"


def _dead_branches(root: Located) -> Iterator[str]:
    # Below a `not`, a term that is never true is deliberate.
    for node in root.walk(into_not=False):
        if isinstance(node.trigger, AnyOf):
            for child in node.children:
                reason = never_reason(child.trigger)
                if reason is not None:
                    yield f"{child.path}: {child.trigger!r} is dead: {reason}"


def analyze(
    entries: Sequence[tuple[str, Located]],
    events: Collection[str] = (),
    *,
    predicates: Mapping[str, object] | None = None,
    produced_metrics: Collection[str] | None = None,
    file: str | None = None,
) -> Analysis:
    """Check located callback triggers.

    Args:
        entries: ``(callback name, located trigger)`` in declared order.
        events: the custom events the schedule declares.
        predicates: registered predicates; ``None`` leaves names unchecked (planning).
        produced_metrics: metrics something produces; ``None`` skips that check.
        file: the spec file, named in each problem.
    """
    problems: list[Problem] = []
    notes: list[str] = []
    known = set(BUILTIN_EVENTS) | set(events)
    produced = None if produced_metrics is None else set(produced_metrics)
    # One node's answers serve every question about it; the budget grows with the
    # schedule, so thousands of small triggers are each checked in full.
    nodes = sum(1 for _, root in entries for _ in root.walk())
    with first_possible_memo(SEARCH_BUDGET + 100 * nodes):
        for _name, root in entries:
            for node in root.walk():
                t = node.trigger
                if not node.children:
                    for event in sorted(t.events().named - known):
                        problems.append(Problem(node.path, (
                            f"unknown event {event!r}{did_you_mean(event, known)}; declare custom "
                            "events on the schedule (events = [...])"), file,
                            expected="a built-in or declared event", found=repr(event)))
                if predicates is not None:
                    for p in sorted(t.predicates() - set(predicates)):
                        problems.append(Problem(node.path, (
                            f"predicate {p!r} is not registered{did_you_mean(p, predicates)}; "
                            "register it from Python or, for a metric, compare it "
                            "('metric < 0.5')"), file, expected="a registered predicate",
                            found=repr(p)))
                if produced is not None:
                    for m in sorted(t.metrics() - produced):
                        notes.append(f"{node.path}: {t!r} reads metric {m!r}, which no callback "
                                     f"produces{did_you_mean(m, produced)}")
            reason = never_reason(root.trigger)
            if reason is not None:
                problems.append(Problem(root.path, f"{root.trigger!r}: {reason}", file))
            else:
                notes.extend(_dead_branches(root))
    return Analysis(tuple(problems), tuple(notes))
