"""Event names, and ``EventSet``: the events at which a trigger can be true.

The built-in events, in loop order::

    (sanity_eval)           # once, before training, with [run] sanity_eval_batches > 0
    train_start
      epoch_start
        (batch_start)*      # before each micro-batch's forward
        (batch_end)*        # after each micro-batch's backward
        step_end            # after each optimizer step
      epoch_end
    train_end

    eval_start, (eval_step_start, eval_step_end)*, eval_end   # around an evaluation run
    preempt                               # SIGTERM/SIGINT, before the last checkpoint

Custom events are declared on a schedule and fired by user code with ``fire()``.

A trigger with no clock part (a window, a condition, a metric trigger, a ``not``)
is evaluated at every *default* event: all events but the opt-in ones
(``sanity_eval``, ``batch_start``, ``batch_end``, the ``eval_*`` events and
``preempt``), which are evaluated for a callback only when its own trigger names them.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

import attrs

from schedtrain.names import NAME_RULE, is_name

__all__ = [
    "BOUNDED_EVENTS",
    "BUILTIN_EVENTS",
    "DEFAULT_EVENTS",
    "OPT_IN_EVENTS",
    "EventSet",
    "check_event_name",
]

BUILTIN_EVENTS: Final = (
    "sanity_eval",
    "train_start",
    "epoch_start",
    "batch_start",
    "batch_end",
    "step_end",
    "epoch_end",
    "train_end",
    "eval_start",
    "eval_step_start",
    "eval_step_end",
    "eval_end",
    "preempt",
)
#: Evaluated for a callback only when its own trigger names them.
OPT_IN_EVENTS: Final = frozenset({"sanity_eval", "batch_start", "batch_end", "eval_start",
                                  "eval_step_start", "eval_step_end", "eval_end", "preempt"})
#: Events frequent enough that the table skips them with a precomputed due vector.
BOUNDED_EVENTS: Final = ("batch_end", "step_end", "epoch_end")


def check_event_name(name: object) -> str:
    """Return ``name`` if it is a valid event name, else raise ``ValueError``."""
    if not is_name(name):
        raise ValueError(
            f"invalid event name {name!r}: expected an identifier such as 'train_end' "
            f"or a custom event such as 'swa_start' ({NAME_RULE})"
        )
    return name  # type: ignore[return-value]  # is_name checked it is a str


@attrs.frozen
class EventSet:
    """Events at which a trigger can be true: ``named`` ones, plus every default event.

    ``EventSet.of("step_end")`` for a clock part evaluated at one event;
    ``DEFAULT_EVENTS`` for a trigger with no clock part.
    """

    named: frozenset[str] = frozenset()
    default: bool = False

    @classmethod
    def of(cls, *events: str) -> EventSet:
        """Exactly these events."""
        return cls(frozenset(events), False)

    def __contains__(self, event: object) -> bool:
        return event in self.named or (self.default and event not in OPT_IN_EVENTS)

    @property
    def empty(self) -> bool:
        """Whether no event at all is in the set."""
        return not self.named and not self.default

    def union(self, other: EventSet) -> EventSet:
        """Events in either set (``any``)."""
        return EventSet(self.named | other.named, self.default or other.default)

    @classmethod
    def all_of(cls, sets: Iterable[EventSet]) -> EventSet:
        """The events of ``all``: where every clock part's events meet.

        A part with no clock part (``default``) restricts nothing: in
        ``every("2 batches") & window(...)`` the window is evaluated at ``batch_end`` too.
        Only when no part has a clock part is the result itself without one; the events
        its parts name stay named.
        """
        sets = list(sets)
        clocked = [s.named for s in sets if not s.default]
        if not clocked:
            return cls(frozenset().union(*(s.named for s in sets)), True)
        return cls(frozenset.intersection(*clocked), False)

    def describe(self) -> str:
        """``step_end``, ``epoch_end/train_end``, ``any default event``..."""
        parts = sorted(self.named)
        if self.default:
            parts.append("any default event")
        return "/".join(parts) or "no event"

    @classmethod
    def union_of(cls, sets: Iterable[EventSet]) -> EventSet:
        """The events of ``any``: where some part can be true."""
        out = cls()
        for s in sets:
            out = out.union(s)
        return out


#: The events of a trigger with no clock part: every event but the opt-in ones.
DEFAULT_EVENTS: Final = EventSet(frozenset(), True)
