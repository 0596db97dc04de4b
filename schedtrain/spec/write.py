"""Writing schedules and specs as TOML that loads back to an equal value.

Triggers are written with the same vocabulary ``spec.load`` reads (``TERMS``): each
term writes its own keys. Strings are escaped per TOML and keys quoted when not bare.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from schedtrain.schedule.schedule import Schedule
from schedtrain.spec.model import ClockSpec, Spec
from schedtrain.spec.run import RunConfig, toml_fields
from schedtrain.spec.toml_text import toml_key as _toml_key
from schedtrain.spec.toml_text import toml_value
from schedtrain.spec.vocabulary import TERMS, term_of
from schedtrain.triggers import AllOf, AnyOf, Not, Trigger

__all__ = ["dump_spec", "schedule_to_toml", "toml_value", "trigger_table", "trigger_to_toml"]


def trigger_table(trigger: Trigger) -> dict[str, Any]:
    """A trigger as the table the reader reads back to it."""
    term = term_of(trigger)
    if term is not None:
        return term.write(trigger)
    if isinstance(trigger, AllOf):
        merged = _merged(trigger.triggers)
        if merged is not None:
            return merged
    if isinstance(trigger, AllOf | AnyOf):
        key = "all" if isinstance(trigger, AllOf) else "any"
        return {key: [trigger_table(t) for t in trigger.triggers]}
    if isinstance(trigger, Not):
        return {"not": trigger_table(trigger.trigger)}
    raise ValueError(f"{trigger!r} ({type(trigger).__name__}) has no TOML form; a trigger "
                     "class of your own is written as {{ custom = \"package.module:Class\" }}")


def _merged(children: Sequence[Trigger]) -> dict[str, Any] | None:
    """One table for an AND of leaves that the reader would AND back in the same order.

    That needs leaves of distinct terms, in the order ``TERMS`` ANDs them, whose keys
    do not overlap.
    """
    order = [TERMS.index(term) if (term := term_of(t)) is not None else -1 for t in children]
    if -1 in order or any(b <= a for a, b in itertools.pairwise(order)):
        return None
    keys = [k for i in order for k in TERMS[i].keys]
    if len(keys) != len(set(keys)):
        return None
    table: dict[str, Any] = {}
    for t in children:
        table.update(trigger_table(t))
    return table


def trigger_to_toml(trigger: Trigger) -> str:
    """A trigger as an inline TOML table: ``{ every = "500 steps" }``.

    Raises:
        ValueError: the trigger wraps a Python callable (``when(fn)``) or has no TOML form.
    """
    return toml_value(trigger_table(trigger))


def _header(*keys: str) -> str:
    return "[" + ".".join(_toml_key(k) for k in keys) + "]"


def _write(
    callbacks: Mapping[str, tuple[str | None, Mapping[str, Any], Trigger]],
    *,
    events: Sequence[str] = (),
    clock: ClockSpec | None = None,
    run: RunConfig | None = None,
    triggers: Mapping[str, Trigger] | None = None,
) -> str:
    lines: list[str] = []
    if events:
        lines.append(f"events = {toml_value(list(events))}")
    for title, fields in (("clock", attrs.asdict(clock) if clock is not None else None),
                          ("run", toml_fields(run) if run is not None else None)):
        if fields is None:
            continue
        values = {k: list(v) if isinstance(v, tuple) else dict(v) if isinstance(v, Mapping)
                  else v for k, v in fields.items() if v is not None}
        if values:
            lines += ["", f"[{title}]"] + [f"{k} = {toml_value(v)}" for k, v in values.items()]
    for name, trigger in (triggers or {}).items():
        table = trigger_table(trigger)
        lines += ["", _header("triggers", name)]
        lines += [f"{_toml_key(k)} = {toml_value(v)}" for k, v in table.items()]
    for name, (type_name, args, trigger) in callbacks.items():
        lines += ["", _header("callbacks", name)]
        if type_name is not None:
            lines.append(f"type = {toml_value(type_name)}")
        lines += [f"{_toml_key(k)} = {toml_value(v)}" for k, v in args.items()]
        lines.append(f"trigger = {trigger_to_toml(trigger)}")
    return "\n".join(lines).lstrip("\n") + "\n"


def schedule_to_toml(schedule: Schedule) -> str:
    """Write a schedule composed in Python as TOML that loads back to an equal schedule.

    Callbacks are written without ``type``: their objects are bound from Python by name.

    Raises:
        ValueError: a trigger wraps a Python callable (``when(fn)``).
    """
    return _write({e.default_name(): (None, {}, e.trigger) for e in schedule.entries},
                  events=schedule.events)


def dump_spec(spec: Spec) -> str:
    """Write a ``Spec`` back as TOML (named triggers are written out in full)."""
    return _write({n: (cb.type, cb.args, cb.trigger) for n, cb in spec.callbacks.items()},
                  events=spec.events, clock=spec.clock, run=spec.run, triggers=spec.triggers)
