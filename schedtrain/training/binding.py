"""Turn what the user gave the trainer into a schedule of bound ``Callback`` objects.

Accepted: a list whose items are ``Callback`` objects (scheduled by their
``default_trigger``), ``Scheduled`` values (trigger, callback, name, gate), or
plain functions ``fn(trainer)`` inside a ``Scheduled``; or a ``Schedule`` (from
Python or a TOML spec) plus a mapping of name to callback for entries that
carry no callback object.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import attrs

from schedtrain.callbacks.base import Callback
from schedtrain.errors import ScheduleError, did_you_mean
from schedtrain.schedule.schedule import Schedule, Scheduled
from schedtrain.spec.metrics import TRAINER_METRICS
from schedtrain.triggers.auto import auto_parts

__all__ = ["Bound", "FunctionCallback", "bind", "bind_checked", "check_order", "order_problems"]


class FunctionCallback(Callback):
    """A plain function ``fn(trainer)`` run when its trigger fires."""

    def __init__(self, fn: Callable[[Any], Any], name: str | None = None) -> None:
        self.fn = fn
        given = name or str(getattr(fn, "__name__", ""))
        self.name = given if given.isidentifier() else "function"  # e.g. '<lambda>'

    def _trigger(self) -> None:
        self.fn(self.trainer)

    def __repr__(self) -> str:
        return f"<FunctionCallback {self.name}>"


def _as_callback(obj: Any, where: str) -> Callback:
    if isinstance(obj, Callback):
        return obj
    if callable(obj):
        return FunctionCallback(obj)
    raise TypeError(f"{where}: expected a Callback, a Scheduled or a function, got {obj!r}")


def bind(
    callbacks: Iterable[Any] | Schedule | None,
    schedule: Schedule | None = None,
    bindings: Mapping[str, Any] | None = None,
) -> tuple[Schedule, list[Callback]]:
    """The schedule to compile and its callbacks, in declared order.

    Args:
        callbacks: ``Callback``/``Scheduled`` items, or a ``Schedule``.
        schedule: a ``Schedule`` (e.g. a TOML spec's); its entries come after ``callbacks``.
        bindings: name to callback for schedule entries without a callback object.
    """
    entries: list[Scheduled] = []
    events: tuple[str, ...] = ()
    if isinstance(callbacks, Schedule):
        schedule, callbacks = (callbacks, None) if schedule is None else (schedule, callbacks)
    for i, item in enumerate(callbacks or ()):
        if isinstance(item, Scheduled):
            cb = _as_callback(item.callback, f"callbacks[{i}]")
            entries.append(attrs.evolve(item, callback=cb))
        else:
            cb = _as_callback(item, f"callbacks[{i}]")
            entries.append(Scheduled(cb.default_trigger, cb, cb.name,
                                     trigger_epoch=cb.bare_trigger_epoch))
    if schedule is not None:
        events = schedule.events
        bindings = dict(bindings or {})
        for e in schedule.entries:
            name = e.default_name()
            obj = e.callback if e.callback is not None else bindings.pop(name, None)
            if obj is None:
                raise ScheduleError(
                    f"callbacks.{name}: no callback is bound to this name; give it a `type` "
                    "in the spec or pass it from Python (bindings={name: callback})")
            entries.append(attrs.evolve(e, callback=_as_callback(obj, f"callbacks.{name}")))
        if bindings:
            extra = sorted(bindings)
            raise ScheduleError(
                f"bindings name callbacks not in the schedule: {extra}"
                f"{did_you_mean(extra[0], schedule.names)}")
    sched = Schedule(entries, events=events)
    _check_unambiguous(sched)
    _check_auto_fed(sched)
    cbs: list[Callback] = []
    for e in sched.entries:
        cb = e.callback
        cb.name = e.name
        cbs.append(cb)
    return sched, cbs


def _keeps_state(callback: Callback) -> bool:
    try:
        return bool(callback.state_dict())
    except Exception:  # a state_dict that needs setup: assume it has state
        return True


def _check_auto_fed(schedule: Schedule) -> None:
    """Refuse ``every("auto")`` on a callback that does not measure its saves: nothing
    would feed the interval, which would stay at its first step for the whole run."""
    for e in schedule.entries:
        cb = e.callback
        if auto_parts(e.trigger) and not getattr(cb, "measures_its_saves", False):
            raise ScheduleError(
                f"callbacks.{e.default_name()}: every('auto') picks a checkpoint interval "
                f"from the measured cost of the saves its callback makes, and "
                f"{type(cb).__name__} measures none: bind it to a ModelSaver (or a "
                "subclass), or give an interval such as every(500, 'steps')")


def _check_unambiguous(schedule: Schedule) -> None:
    """Refuse unnamed callbacks of one class whose saved state would be matched by position.

    A second unnamed ``Foo`` is named ``Foo#2`` by its place in the list: if such
    callbacks keep state (their own, or differing triggers that keep some), a checkpoint
    resumed with the list reordered would hand each the other's state.
    """
    groups: dict[str, list[Scheduled]] = {}
    for e in schedule.entries:
        groups.setdefault(e.default_name().split("#")[0], []).append(e)
    for base, group in groups.items():
        if len(group) < 2 or not any("#" in e.default_name() for e in group):
            continue
        triggers_differ = any(e.trigger != group[0].trigger for e in group)
        if (any(_keeps_state(e.callback) for e in group)
                or (triggers_differ and any(not e.trigger.pure for e in group))):
            names = ", ".join(repr(e.default_name()) for e in group)
            raise ScheduleError(
                f"callbacks {names} are {len(group)} unnamed {base} callbacks that keep "
                "state: a checkpoint would match their state by their place in the list, so "
                "reordering them would swap it; name each one (Scheduled(trigger, callback, "
                "name='...'), callback.name = '...', or its TOML table name)")


def trigger_metrics(schedule: Schedule) -> dict[str, set[str]]:
    """Per callback name, the metrics its trigger reads."""
    out: dict[str, set[str]] = {}
    for e in schedule.entries:
        names: set[str] = set()
        todo = [e.trigger]
        while todo:
            t = todo.pop()
            names |= t.metrics()
            todo.extend(t.children())
        out[e.default_name()] = names
    return out


def check_order(schedule: Schedule, callbacks: list[Callback]) -> None:
    """Refuse a callback that reads a metric (``needs`` or its trigger) produced only later.

    Callbacks at one event run in declared order, so such a callback would read a
    stale value: a clear error at start rather than a silent miss.
    """
    problems = [message for _, message in order_problems(schedule, callbacks)]
    if problems:
        raise ScheduleError("; ".join(problems) if len(problems) == 1 else
                            "\n".join(problems))


def order_problems(schedule: Schedule, callbacks: list[Callback]) -> list[tuple[str, str]]:
    """``(callback name, message)`` for each metric a callback reads (``needs`` or its
    trigger) that only a callback declared after it produces (``check_order``)."""
    produced_at: dict[str, int] = {}
    for i, cb in enumerate(callbacks):
        for m in cb.produces:
            produced_at.setdefault(m, i)
    reads = trigger_metrics(schedule)
    problems = []
    for i, cb in enumerate(callbacks):
        assert cb.name is not None
        for m, how in [(m, "needs") for m in cb.needs] + [
                (m, "its trigger reads") for m in sorted(reads[cb.name] - set(cb.needs))]:
            j = produced_at.get(m)
            if j is not None and j > i:
                problems.append((cb.name, (
                    f"callback {cb.name!r} {how} metric {m!r}, which {callbacks[j].name!r} "
                    f"produces, but {callbacks[j].name!r} is declared after it; declare "
                    f"{callbacks[j].name!r} first")))
    return problems


@attrs.frozen
class Bound:
    """A schedule bound to its callbacks and order-checked, built once: ``prepare_run``
    builds it for ``schedtrain train`` and the ``Trainer`` reuses it (``prepared=``).

    Args:
        schedule: the bound schedule, callbacks in declared order.
        callbacks: its callbacks, in that order.
        produced: every metric the trainer or a callback puts.
        seeded: the seed the random streams were seeded with before the task's model was
            built (``None``: not seeded; the ``Trainer`` seeds them).
    """

    schedule: Schedule
    callbacks: tuple[Callback, ...]
    produced: frozenset[str]
    seeded: int | None = None


def bind_checked(callbacks: Iterable[Any] | Schedule | None, schedule: Schedule | None = None,
                 bindings: Mapping[str, Any] | None = None) -> Bound:
    """``bind`` then ``check_order``, with the metrics produced (what the ``Trainer``
    compiles)."""
    bound, cbs = bind(callbacks, schedule, bindings)
    check_order(bound, cbs)
    return Bound(bound, tuple(cbs), produced_metrics(cbs))


def produced_metrics(callbacks: Iterable[Callback]) -> frozenset[str]:
    """The trainer's metrics and every one ``callbacks`` produce."""
    return frozenset(TRAINER_METRICS).union(*(cb.produces for cb in callbacks))
