"""Writing schedules and specs as TOML that loads back to an equal value.

A small hand-written emitter (no dependency): strings are escaped per TOML, keys
quoted when not bare, triggers written in the vocabulary ``spec.loads_spec`` reads.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any, Final

import attrs

from schedtrain.schedule import Schedule
from schedtrain.spec import ClockSpec, RunSpec, Spec
from schedtrain.triggers import (
    AllOf,
    AnyOf,
    At,
    Every,
    Improved,
    Not,
    On,
    Plateau,
    Trigger,
    When,
    Window,
)

__all__ = ["dump_spec", "schedule_to_toml", "toml_value", "trigger_to_toml"]


_BARE_KEY_RE: Final = re.compile(r"^[A-Za-z0-9_-]+$")


def _toml_str(text: str) -> str:
    out = ['"']
    for ch in text:
        code = ord(ch)
        if ch == '"':
            out.append('\\"')
        elif ch == "\\":
            out.append("\\\\")
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\t":
            out.append("\\t")
        elif code < 0x20 or code == 0x7F:
            out.append(f"\\u{code:04X}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def _toml_key(key: str) -> str:
    return key if _BARE_KEY_RE.match(key) else _toml_str(key)


def toml_value(value: object) -> str:
    """A TOML value as inline text (strings, numbers, booleans, lists, inline tables)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        text = repr(value)
        return text if any(c in text for c in ".eE") else text + ".0"
    if isinstance(value, str):
        return _toml_str(value)
    if isinstance(value, Mapping):
        inner = ", ".join(f"{_toml_key(str(k))} = {toml_value(v)}" for k, v in value.items())
        return f"{{ {inner} }}" if inner else "{}"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    raise TypeError(f"cannot write {value!r} as TOML")


def _trigger_table(trigger: Trigger) -> dict[str, Any]:
    if isinstance(trigger, Every):
        table: dict[str, Any] = {"every": str(trigger.period)}
        if trigger.offset is not None:
            table["offset"] = str(trigger.offset)
        return table
    if isinstance(trigger, At):
        return {"at": [str(p) for p in trigger.points]}
    if isinstance(trigger, On):
        return {"on": trigger.event}
    if isinstance(trigger, Window):
        table = {}
        if trigger.start is not None:
            table["start"] = str(trigger.start)
        if trigger.stop is not None:
            table["stop"] = str(trigger.stop)
        return table
    if isinstance(trigger, When):
        if trigger.fn is not None:
            raise ValueError(
                f"{trigger!r} wraps a Python callable, which TOML cannot express; register it "
                "as a named predicate and write if = \"name\" instead")
        return {"if": trigger.text}
    if isinstance(trigger, Improved | Plateau):
        key = "improved" if isinstance(trigger, Improved) else "plateau"
        table = {key: trigger.metric}
        if isinstance(trigger, Plateau):
            table["patience"] = trigger.patience
        table["mode"] = trigger.mode
        if trigger.min_delta:
            table["min_delta"] = trigger.min_delta
        return table
    if isinstance(trigger, AllOf):
        merged = _merged(trigger.triggers)
        if merged is not None:
            return merged
    if isinstance(trigger, AllOf | AnyOf):
        key = "all" if isinstance(trigger, AllOf) else "any"
        return {key: [_trigger_table(t) for t in trigger.triggers]}
    if isinstance(trigger, Not):
        return {"not": _trigger_table(trigger.trigger)}
    raise ValueError(f"{trigger!r} ({type(trigger).__name__}) has no TOML form")


def _rank(trigger: Trigger) -> int | None:
    """Where a leaf's part goes when the loader ANDs one table's keys (see ``TRIGGER_KEYS``)."""
    kinds: tuple[type[Trigger], ...] = (Every, At, On, Window, When)
    for i, kind in enumerate(kinds):
        if isinstance(trigger, kind):
            return i
    return len(kinds) if isinstance(trigger, Improved | Plateau) else None


def _merged(children: Sequence[Trigger]) -> dict[str, Any] | None:
    """One table for an AND of leaves the loader would AND back in the same order, if any."""
    ranks = [_rank(t) for t in children]
    if any(a is None or b is None or a >= b for a, b in itertools.pairwise(ranks)) or (
        None in ranks
    ):
        return None
    table: dict[str, Any] = {}
    for t in children:
        table.update(_trigger_table(t))
    return table


def trigger_to_toml(trigger: Trigger) -> str:
    """A trigger as an inline TOML table: ``{ every = "500 steps" }``.

    Raises:
        ValueError: the trigger wraps a Python callable (``when(fn)``) or has no TOML form.
    """
    return toml_value(_trigger_table(trigger))


def _header(*keys: str) -> str:
    return "[" + ".".join(_toml_key(k) for k in keys) + "]"


def _write(
    callbacks: Mapping[str, tuple[str | None, Mapping[str, Any], Trigger]],
    *,
    events: Sequence[str] = (),
    clock: ClockSpec | None = None,
    run: RunSpec | None = None,
    triggers: Mapping[str, Trigger] | None = None,
) -> str:
    lines: list[str] = []
    if events:
        lines.append(f"events = {toml_value(list(events))}")
    for title, obj in (("clock", clock), ("run", run)):
        if obj is None:
            continue
        values = {k: v for k, v in attrs.asdict(obj).items() if v is not None}
        if values:
            lines += ["", f"[{title}]"] + [f"{k} = {toml_value(v)}" for k, v in values.items()]
    for name, trigger in (triggers or {}).items():
        table = _trigger_table(trigger)
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
