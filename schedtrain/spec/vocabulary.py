"""The trigger vocabulary of TOML: one table that both reading and writing use.

Each ``Term`` owns some keys of a trigger table (``every`` and ``offset``), builds the
trigger those keys describe, and writes such a trigger back as those keys. The
keys of one table are AND-ed in the order of ``TERMS``; ``all``, ``any`` and ``not``
nest tables (``spec.triggers`` reads them).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Final

import attrs

from schedtrain.errors import ArgumentError
from schedtrain.events import check_event_name
from schedtrain.spec.custom import CustomTrigger
from schedtrain.spec.problems import Problems, Rel, nesting
from schedtrain.time import Time
from schedtrain.triggers import (
    MAX_DEPTH,
    At,
    AutoEvery,
    BeforeDeadline,
    Every,
    Improved,
    On,
    Plateau,
    Trigger,
    When,
    Window,
    at,
    improved,
    on,
    plateau,
    when,
    window,
)
from schedtrain.triggers.auto import DEFAULT_FIRST

__all__ = ["COMPOSITE_KEYS", "TERMS", "TRIGGER_KEYS", "Term", "term_of"]

Reader = Callable[[Mapping[str, Any], Rel, Problems], Trigger | None]
Writer = Callable[[Any], dict[str, Any]]


@attrs.frozen
class Term:
    """Keys of a trigger table that together describe one trigger.

    Args:
        keys: the keys it owns; the first is the one that names it.
        kind: the trigger class it reads and writes.
        read: builds the trigger from the table (recording problems), or ``None``.
        write: the keys for a trigger of ``kind``.
        arguments: a factory's argument name -> the key that holds it, to place errors.
    """

    keys: tuple[str, ...]
    kind: type[Trigger]
    read: Reader
    write: Writer
    arguments: Mapping[str, str] = attrs.field(factory=dict)

    @property
    def key(self) -> str:
        """The key that names the term."""
        return self.keys[0]

    def build(self, table: Mapping[str, Any], rel: Rel, problems: Problems,
              factory: Callable[[], Trigger]) -> Trigger | None:
        """Call ``factory``; a bad argument becomes a problem at the key that holds it."""
        try:
            return factory()
        except ArgumentError as exc:
            key = self.arguments.get(exc.argument, self.key)
            problems.add((*rel, key), str(exc), expected=exc.expected, found=exc.found)
        except (TypeError, ValueError) as exc:
            problems.add((*rel, self.key), str(exc))
        return None


_A_TIME: Final = "a time such as '500 steps', '2 epochs' or '30 min'"


def _time(table: Mapping[str, Any], key: str, rel: Rel, problems: Problems,
          where: Rel | None = None, *, expected: str = _A_TIME) -> Time | None:
    value = table[key]
    where = (*rel, key) if where is None else where
    if not isinstance(value, str):
        problems.expect(where, expected, value)
        return None
    try:
        return Time.parse(value)
    except ValueError as exc:
        problems.add(where, str(exc), expected="'<number> <unit>'", found=value)
        return None


# -- every, at, on, window, if ------------------------------------------------------------


def _read_every(table: Mapping[str, Any], rel: Rel, problems: Problems) -> Trigger | None:
    if table["every"] == "auto":
        return _read_auto(table, rel, problems)
    period = _time(table, "every", rel, problems)
    offset = _time(table, "offset", rel, problems) if "offset" in table else None
    if period is None or ("offset" in table and offset is None):
        return None
    return _EVERY.build(table, rel, problems, lambda: Every(period, offset))


def _read_auto(table: Mapping[str, Any], rel: Rel, problems: Problems) -> Trigger | None:
    """``every = "auto"``: the interval picked from the save's cost and ``[run] mtbf``
    (checked with the run's options); ``offset`` is the step of the first save."""
    first = DEFAULT_FIRST
    if "offset" in table:
        offset = _time(table, "offset", rel, problems,
                       expected="the step of the first save, such as '20 steps'")
        if offset is None:
            return None
        if offset.counter != "step":
            problems.add((*rel, "offset"), f"`offset` of every = \"auto\" is the step of the "
                         f"first save: give it in steps, not {offset}",
                         expected="a number of steps such as '20 steps'", found=str(offset))
            return None
        first = offset.base
    return _EVERY.build(table, rel, problems, lambda: AutoEvery(first))


def _write_every(t: Every | AutoEvery) -> dict[str, Any]:
    if isinstance(t, AutoEvery):
        return {"every": "auto"} if t.first == DEFAULT_FIRST \
            else {"every": "auto", "offset": f"{t.first} steps"}
    out: dict[str, Any] = {"every": str(t.period)}
    if t.offset is not None:
        out["offset"] = str(t.offset)
    return out


def _read_at(table: Mapping[str, Any], rel: Rel, problems: Problems) -> Trigger | None:
    raw = table["at"]
    if isinstance(raw, list):
        if not raw:
            problems.expect((*rel, "at"), "a time or a non-empty list of times", raw)
            return None
        points = [_time({"at": p}, "at", rel, problems, (*rel, "at", i))
                  for i, p in enumerate(raw)]
    else:
        points = [_time(table, "at", rel, problems)]
    if any(p is None for p in points):
        return None
    return _AT.build(table, rel, problems, lambda: at([p for p in points if p is not None]))


def _read_on(table: Mapping[str, Any], rel: Rel, problems: Problems) -> Trigger | None:
    event = table["on"]
    try:
        return on(check_event_name(event))
    except ValueError:
        problems.expect((*rel, "on"), "an event name such as 'train_end' or a declared "
                                      "custom event", event)
        return None


def _read_window(table: Mapping[str, Any], rel: Rel, problems: Problems) -> Trigger | None:
    lo = _time(table, "start", rel, problems) if "start" in table else None
    hi = _time(table, "stop", rel, problems) if "stop" in table else None
    if ("start" in table and lo is None) or ("stop" in table and hi is None):
        return None
    return _WINDOW.build(table, rel, problems, lambda: window(lo, hi))


def _write_window(t: Window) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if t.start is not None:
        out["start"] = str(t.start)
    if t.stop is not None:
        out["stop"] = str(t.stop)
    return out


def _read_if(table: Mapping[str, Any], rel: Rel, problems: Problems) -> Trigger | None:
    text = table["if"]
    if not isinstance(text, str):
        problems.expect((*rel, "if"), "condition text such as 'val/loss < 0.5'", text)
        return None
    try:
        return when(text)  # parsed by the core grammar, never evaluated
    except ValueError as exc:
        problems.add((*rel, "if"), str(exc), expected="a condition", found=text)
        return None


def _write_if(t: When) -> dict[str, Any]:
    if t.fn is not None:
        raise ValueError(
            f"{t!r} wraps a Python callable, which TOML cannot express; register it as a "
            "named predicate and write if = \"name\" instead")
    return {"if": t.text}


def _read_before_deadline(table: Mapping[str, Any], rel: Rel,
                          problems: Problems) -> Trigger | None:
    margin = _time(table, "before_deadline", rel, problems,
                   expected="a duration such as '10 min' or '90 s'")
    if margin is None:
        return None
    return _BEFORE_DEADLINE.build(table, rel, problems, lambda: BeforeDeadline(margin))


# -- improved, plateau ----------------------------------------------------------------


def _metric_args(table: Mapping[str, Any], key: str, rel: Rel,
                 problems: Problems) -> tuple[str, str, float] | None:
    start = len(problems.items)
    metric = table[key]
    if not isinstance(metric, str) or not metric.strip():
        problems.expect((*rel, key), "a metric name such as 'val/loss'", metric)
    mode = table.get("mode", "min")
    if mode not in ("min", "max"):
        problems.expect((*rel, "mode"), "'min' or 'max'", mode)
    delta = table.get("min_delta", 0.0)
    if isinstance(delta, bool) or not isinstance(delta, int | float) or not 0 <= delta < 1e308:
        problems.expect((*rel, "min_delta"), "a number >= 0", delta)
    if len(problems.items) > start:
        return None
    return metric, mode, float(delta)


def _read_improved(table: Mapping[str, Any], rel: Rel, problems: Problems) -> Trigger | None:
    args = _metric_args(table, "improved", rel, problems)
    if args is None:
        return None
    metric, mode, delta = args
    return _IMPROVED.build(table, rel, problems,
                           lambda: improved(metric, mode, delta))  # type: ignore[arg-type]


def _read_plateau(table: Mapping[str, Any], rel: Rel, problems: Problems) -> Trigger | None:
    if "patience" not in table:
        problems.add((*rel, "patience"), "missing key 'patience': `plateau` needs the number "
                                         "of new values without improvement, e.g. patience = 3",
                     expected="a whole number >= 1", found="nothing")
        return None
    patience = table["patience"]
    if isinstance(patience, bool) or not isinstance(patience, int) or patience < 1:
        problems.expect((*rel, "patience"), "a whole number >= 1", patience)
        return None
    args = _metric_args(table, "plateau", rel, problems)
    if args is None:
        return None
    metric, mode, delta = args
    return _PLATEAU.build(table, rel, problems,
                          lambda: plateau(metric, patience, mode, delta))  # type: ignore[arg-type]


def _write_metric(key: str) -> Writer:
    def write(t: Improved | Plateau) -> dict[str, Any]:
        out: dict[str, Any] = {key: t.metric}
        if isinstance(t, Plateau):
            out["patience"] = t.patience
        out["mode"] = t.mode
        if t.min_delta:
            out["min_delta"] = t.min_delta
        return out
    return write


# -- a user's own trigger class --------------------------------------------------------


def _read_custom(table: Mapping[str, Any], rel: Rel, problems: Problems) -> Trigger | None:
    target = table["custom"]
    args = table.get("args", {})
    if not isinstance(target, str):
        problems.expect((*rel, "custom"), "a trigger class as 'package.module:Class'", target)
        return None
    if not isinstance(args, dict):
        problems.expect((*rel, "args"), "a table of the class's arguments", args)
        return None
    if nesting(args, MAX_DEPTH) > MAX_DEPTH:
        problems.add((*rel, "args"), f"tables and lists nest more than {MAX_DEPTH} levels deep "
                                     "here", expected=f"at most {MAX_DEPTH} levels",
                     found="deeper")
        return None
    return CustomTrigger.declare(target, args, (*rel, "custom"), problems,
                                 load=problems.imports)


def _write_custom(t: CustomTrigger) -> dict[str, Any]:
    out: dict[str, Any] = {"custom": t.target}
    if t.args:
        out["args"] = dict(t.args)
    return out


_EVERY: Final = Term(("every", "offset"), Every, _read_every, _write_every,
                     {"period": "every", "offset": "offset"})
_AT: Final = Term(("at",), At, _read_at, lambda t: {"at": [str(p) for p in t.points]},
                  {"points": "at"})
_WINDOW: Final = Term(("start", "stop"), Window, _read_window, _write_window,
                      {"start": "start", "stop": "stop"})
_BEFORE_DEADLINE: Final = Term(("before_deadline",), BeforeDeadline, _read_before_deadline,
                              lambda t: {"before_deadline": str(t.margin)},
                              {"margin": "before_deadline"})
_METRIC_ARGS: Final = {"mode": "mode", "min_delta": "min_delta", "patience": "patience"}
_IMPROVED: Final = Term(("improved", "mode", "min_delta"), Improved, _read_improved,
                        _write_metric("improved"), {"metric": "improved", **_METRIC_ARGS})
_PLATEAU: Final = Term(("plateau", "patience", "mode", "min_delta"), Plateau, _read_plateau,
                       _write_metric("plateau"), {"metric": "plateau", **_METRIC_ARGS})

#: Every term, in the order one table's parts are AND-ed.
TERMS: Final = (
    _EVERY,
    _AT,
    Term(("on",), On, _read_on, lambda t: {"on": t.event}),
    _WINDOW,
    _BEFORE_DEADLINE,
    Term(("if",), When, _read_if, _write_if),
    _IMPROVED,
    _PLATEAU,
    Term(("custom", "args"), CustomTrigger, _read_custom, _write_custom),
)
#: Keys that nest trigger tables.
COMPOSITE_KEYS: Final = ("all", "any", "not")
#: Every key a trigger table may have, in the order they are documented.
TRIGGER_KEYS: Final = tuple(dict.fromkeys(
    [k for term in TERMS for k in term.keys] + list(COMPOSITE_KEYS)))
#: Keys that name a term (the others only modify one).
NAMING_KEYS: Final = (*(term.key for term in TERMS), "stop", *COMPOSITE_KEYS)

_BY_KIND: Final = {**{term.kind: term for term in TERMS}, AutoEvery: _EVERY}


def term_of(trigger: Trigger) -> Term | None:
    """The term that writes ``trigger``, if it has a TOML form of its own."""
    return _BY_KIND.get(type(trigger))


def owners(key: str) -> list[Term]:
    """The terms that own ``key``."""
    return [term for term in TERMS if key in term.keys]


def describe_key(key: str) -> str:
    """``every`` for a naming key; ``every`` or ``plateau`` for a modifier."""
    return " or ".join(f"`{t.key}`" for t in owners(key)) or f"`{key}`"


__all__ += ["NAMING_KEYS", "describe_key", "owners"]
