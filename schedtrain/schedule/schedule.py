"""``Schedule``: named callbacks, each with the trigger that says when it runs."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from typing import Any

import attrs

from schedtrain.errors import ScheduleError, ScheduleWarning
from schedtrain.events import BUILTIN_EVENTS, check_event_name
from schedtrain.names import NAME_RULE, is_callback_name
from schedtrain.schedule.analysis import Analysis, analyze, locate
from schedtrain.schedule.table import TriggerTable
from schedtrain.time import Timestamp
from schedtrain.triggers.base import Trigger
from schedtrain.triggers.protocol import Predicate

__all__ = ["TRIGGER_EPOCH_MODES", "Schedule", "Scheduled"]

#: How a callback's ``_trigger_epoch`` runs (``Scheduled.trigger_epoch``).
TRIGGER_EPOCH_MODES = ("hook", "fires", "off")

HookGate = Callable[[Timestamp], bool]
"""Decides, at the moment a lifecycle hook would run, whether it runs (``EnableCallbackIf``)."""


def _check_name(_i: object, _a: object, value: str | None) -> None:
    # "Name#2" is how a second unnamed callback of one class is told apart.
    if value is not None and not is_callback_name(value):
        raise ValueError(f"invalid callback name {value!r}: {NAME_RULE}")


def _check_trigger(_i: object, _a: object, value: Trigger) -> None:
    if not isinstance(value, Trigger):
        raise TypeError(f"expected a trigger such as every('500 steps'), got {value!r}")


@attrs.frozen
class Scheduled:
    """A callback (any object; the core never looks inside) and when it runs.

    Args:
        trigger: when the callback's ``_trigger`` runs.
        callback: the callback object, or ``None`` when bound later by name.
        name: the name in the schedule; defaults to the callback's ``name`` or class name.
        gate: optional; decides whether the callback's other hooks run
            (tensorpack's ``EnableCallbackIf`` / ``PeriodicCallback``).
        trigger_epoch: how the callback's ``_trigger_epoch`` runs: ``"hook"``, after each
            epoch; ``"fires"``, as what a firing runs instead of ``_trigger`` (tensorpack's
            default ``trigger_epoch``, which the class overrides); ``"off"``, never
            (tensorpack's ``PeriodicTrigger`` replaces the call).
    """

    trigger: Trigger = attrs.field(validator=_check_trigger)
    callback: Any = None
    name: str | None = attrs.field(default=None, validator=_check_name)
    gate: HookGate | None = None
    trigger_epoch: str = attrs.field(default="hook", kw_only=True,
                                     validator=attrs.validators.in_(TRIGGER_EPOCH_MODES))

    def default_name(self) -> str:
        """The name to use when none was given."""
        if self.name is not None:
            return self.name
        cb = self.callback
        name = getattr(cb, "name", None)
        return name if isinstance(name, str) else type(cb).__name__


def _to_entries(value: Mapping[str, Trigger] | Iterable[Scheduled]) -> tuple[Scheduled, ...]:
    if isinstance(value, Mapping):
        return tuple(Scheduled(trigger, None, name) for name, trigger in value.items())
    entries: list[Scheduled] = []
    used: set[str] = set()
    for item in value:
        if not isinstance(item, Scheduled):
            raise TypeError(f"expected Scheduled entries or a mapping of triggers, got {item!r}")
        name = item.default_name()
        base, n = name, 1
        while item.name is None and name in used:  # two unnamed of one class: Foo, Foo#2
            n += 1
            name = f"{base}#{n}"
        used.add(name)
        # A named entry is kept as it is: evolving it would build and check it again.
        entries.append(item if item.name == name else attrs.evolve(item, name=name))
    return tuple(entries)


def _check_unique(_i: object, _a: object, value: tuple[Scheduled, ...]) -> None:
    seen: set[str | None] = set()
    for e in value:
        if e.name in seen:
            raise ValueError(f"callback name {e.name!r} is used twice")
        seen.add(e.name)


def _to_events(value: Iterable[str]) -> tuple[str, ...]:
    if isinstance(value, str):
        value = (value,)
    return tuple(check_event_name(e) for e in value)


@attrs.frozen
class Schedule:
    """Named callbacks in declared order, each with a trigger.

    ``Schedule({"checkpoint": every("500 steps"), "final": on("train_end")})``

    Args:
        entries: a mapping of name to trigger, or ``Scheduled`` values.
        events: custom events the schedule's triggers may name (``on("swa_start")``).
    """

    entries: tuple[Scheduled, ...] = attrs.field(converter=_to_entries, validator=_check_unique)
    events: tuple[str, ...] = attrs.field(default=(), converter=_to_events)
    #: The static checks' result, when whoever built the schedule ran them already.
    checked: Analysis | None = attrs.field(default=None, eq=False, repr=False, kw_only=True)

    def __attrs_post_init__(self) -> None:
        clash = set(self.events) & set(BUILTIN_EVENTS)
        if clash:
            raise ValueError(f"custom events {sorted(clash)} clash with built-in events")
        twice = sorted({e for e in self.events if self.events.count(e) > 1})
        if twice:
            raise ValueError(f"custom events {twice} are declared more than once")

    @property
    def names(self) -> tuple[str, ...]:
        """Callback names in declared order."""
        return tuple(e.default_name() for e in self.entries)

    def __getitem__(self, name: str) -> Trigger:
        for e in self.entries:
            if e.name == name:
                return e.trigger
        raise KeyError(name)

    def __iter__(self) -> Iterator[Scheduled]:
        return iter(self.entries)

    def __len__(self) -> int:
        return len(self.entries)

    def triggers(self) -> dict[str, Trigger]:
        """Name to trigger, in declared order."""
        return {e.default_name(): e.trigger for e in self.entries}

    def analyze(
        self,
        *,
        predicates: Mapping[str, Predicate] | None = None,
        produced_metrics: Collection[str] | None = None,
    ) -> Analysis:
        """Run the static checks (see ``schedtrain.schedule.analysis``); nothing is raised."""
        if predicates is None and produced_metrics is None and self.checked is not None:
            return self.checked
        located = [(e.default_name(), locate(e.trigger, f"callbacks.{e.default_name()}.trigger"))
                   for e in self.entries]
        return analyze(located, self.events, predicates=predicates,
                       produced_metrics=produced_metrics)

    def compile(
        self,
        *,
        predicates: Mapping[str, Predicate] | None = None,
        produced_metrics: Collection[str] | None = None,
    ) -> TriggerTable:
        """Check the schedule and compile it into a ``TriggerTable``.

        Args:
            predicates: predicates registered by name for ``when`` conditions;
                ``None`` leaves them undecided (planning).
            produced_metrics: metric names something will produce; conditions on
                others get a ``ScheduleWarning``. ``None`` skips that check.

        Raises:
            ScheduleError: listing every problem (a trigger that can never fire, an
                unknown event, an unregistered predicate) with its key path.
        """
        result = self.analyze(predicates=predicates, produced_metrics=produced_metrics)
        if result.problems:
            raise ScheduleError(result.problems)
        for note in result.notes:
            warnings.warn(note, ScheduleWarning, stacklevel=2)
        return TriggerTable([(e.default_name(), e.trigger) for e in self.entries],
                            events=self.events, predicates=predicates, warnings=result.notes)
