"""Reading a spec's text: TOML syntax, the top-level keys, ``[clock]``, ``[run]``, ``events``.

One private cattrs converter with strict scalar hooks (``"10"`` is not an integer,
``"my_event"`` is not a list) and detailed validation structures the tables; range
checks follow, each problem with its key path, what was expected and what was found.
Trigger and callback tables are left raw here for ``spec.triggers`` and
``spec.callbacks``.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator, Mapping
from typing import Any, Final

import attrs
import cattrs
from cattrs.errors import (
    AttributeValidationNote,
    BaseValidationError,
    ForbiddenExtraKeysError,
    IterableValidationNote,
)

from schedtrain.errors import describe, did_you_mean
from schedtrain.events import BUILTIN_EVENTS
from schedtrain.names import NAME_RULE, is_callback_name, is_name
from schedtrain.readback import Invalid as _Invalid
from schedtrain.readback import strict_bool, strict_int, strict_str
from schedtrain.spec.clock_check import check_clock
from schedtrain.spec.failures import without_mistyped_mtbf
from schedtrain.spec.model import ClockSpec
from schedtrain.spec.outputs import SINKS, sink_period_problem
from schedtrain.spec.problems import Problems, Rel
from schedtrain.spec.run_check import check_run
from schedtrain.spec.run_fields import PYTHON_ONLY, RunFields
from schedtrain.time import MAX_COUNT
from schedtrain.triggers import MAX_DEPTH

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

__all__ = ["MAX_NAME", "SINKS", "Document", "parse_toml", "read_document",
           "sink_period_problem", "structure"]

#: The longest name of a callback, named trigger or event (names become file and metric
#: names).
MAX_NAME: Final = 100


@attrs.frozen
class Document:
    """A spec's top level, structured; trigger and callback tables still raw."""

    clock: ClockSpec = attrs.Factory(ClockSpec)
    #: ``[run]``, structured (``check_run`` checks it; ``spec.load`` builds the ``RunConfig``)
    run: RunFields | None = None
    events: tuple[str, ...] = ()
    triggers: dict[str, Any] = attrs.field(factory=dict)
    callbacks: dict[str, Any] = attrs.field(factory=dict)


def _strict_float(value: object, _t: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _Invalid(f"expected a number, found {describe(value)}")
    return float(value)


def _strict_str_map(value: object, _t: object) -> dict[str, str]:
    table = _table(value, _t)
    for key, v in table.items():
        if not isinstance(v, str):
            raise _Invalid(f"expected a string for {key!r}, found {describe(v)}")
    return table


def _strict_list(value: object, t: Any) -> tuple[Any, ...]:
    if not isinstance(value, list):
        raise _Invalid(f"expected a list, found {describe(value)}")
    item = t.__args__[0]
    return tuple(_converter.structure(v, item) for v in value)


def _is_int_or_list(t: object) -> bool:
    args = set(getattr(t, "__args__", ()))
    return int in args and tuple[int, ...] in args


def _int_or_list(value: object, _t: object) -> int | tuple[int, ...] | None:
    """A per-batch amount: one whole number, or a list of them (one epoch's batches)."""
    if value is None or isinstance(value, list):
        return None if value is None else _strict_list(value, tuple[int, ...])
    return strict_int(value, int)


def _share(value: object, _t: object) -> str | float | None:
    """A share of the time: text (``"2%"``) or a number (``0.02``); ``check_run`` ranges it."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _Invalid(f"expected a share of the time such as '2%' or 0.02, found "
                       f"{describe(value)}")
    return float(value)


def _table(value: object, _t: object) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _Invalid(f"expected a table, found {describe(value)}")
    return value


_converter = cattrs.Converter(forbid_extra_keys=True, detailed_validation=True)
_converter.register_structure_hook(int, strict_int)
_converter.register_structure_hook(float, _strict_float)
_converter.register_structure_hook(str, strict_str)
_converter.register_structure_hook(bool, strict_bool)
_converter.register_structure_hook_func(lambda t: t == Mapping[str, str], _strict_str_map)
_converter.register_structure_hook_func(_is_int_or_list, _int_or_list)
_converter.register_structure_hook_func(lambda t: t == (str | float | None), _share)
_converter.register_structure_hook_func(
    lambda t: getattr(t, "__origin__", None) is tuple, _strict_list)
_converter.register_structure_hook_func(
    lambda t: getattr(t, "__origin__", None) is dict or t == Mapping[str, Any], _table)


_HEADER_RE: Final = re.compile(r"\[\[?\s*([^\]]+?)\s*\]\]?")
_KEY_RE: Final = re.compile(r"\s*([A-Za-z0-9_\-.\"']+)\s*=")


def _too_deep_at(text: str, limit: int = 100) -> tuple[str, str]:
    """Where brackets and braces first nest deeper than ``limit``: the key path and line.

    A light scan (strings and comments skipped) for when the TOML reader itself gives
    up; the key path is the table header and the key whose value nests.
    """
    depth, quote, header, key = 0, "", "", ""
    for lineno, line in enumerate(text.splitlines(), 1):
        if depth == 0 and not quote:
            if (m := _HEADER_RE.match(line.strip())) is not None:
                header = m.group(1)
            elif (m := _KEY_RE.match(line)) is not None:
                key = m.group(1)
        for col, ch in enumerate(line, 1):
            if quote:
                quote = "" if ch == quote else quote
            elif ch in "'\"":
                quote = ch
            elif ch == "#":
                break
            elif ch in "[{":
                depth += 1
                if depth > limit:
                    return ".".join(p for p in (header, key) if p), f"line {lineno}, column {col}"
            elif ch in "]}":
                depth -= 1
        quote = ""
    return "", "somewhere"


_QUOTED_RE: Final = re.compile(r"\"(?:[^\"\\]|\\.)*\"|'[^']*'")
_HUGE_INT_RE: Final = re.compile(r"[0-9][0-9_]{4299,}")


def _huge_int_at(text: str) -> tuple[str, str, int]:
    """Where the first integer too long for Python to read (over 4,300 digits) is: the
    key path (table header and key), the line, and its digits."""
    header, key = "", ""
    for lineno, line in enumerate(text.splitlines(), 1):
        if (m := _HEADER_RE.match(line.strip())) is not None:
            header = m.group(1)
            continue
        if (m := _KEY_RE.match(line)) is not None:
            key = m.group(1)
        found = _HUGE_INT_RE.search(_QUOTED_RE.sub("", line.split("#", 1)[0]))
        if found is not None:
            digits = len(found[0].replace("_", ""))
            return ".".join(p for p in (header, key) if p), f"line {lineno}", digits
    return "", "somewhere", 4301


def parse_toml(text: str, problems: Problems) -> dict[str, Any] | None:
    """TOML text -> a dict, or ``None`` with the syntax error (line and column) recorded."""
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        problems.add("", f"invalid TOML: {exc}")
    except ValueError:  # Python refuses to read an integer of over 4,300 digits
        path, where, digits = _huge_int_at(text)
        problems.add(path, f"an integer of {digits:,} digits ({where}); counts and sizes are "
                           f"at most {MAX_COUNT:,}", expected=f"at most {MAX_COUNT}",
                     found=f"an integer of {digits:,} digits")
    except RecursionError:
        path, where = _too_deep_at(text)
        problems.add(path, f"tables and lists nest too deeply to read ({where}); trigger "
                           f"tables and argument values may nest at most {MAX_DEPTH} levels",
                     expected=f"at most {MAX_DEPTH} levels", found="more than 100 levels")
    return None


def _collect(exc: BaseException, path: Rel) -> Iterator[tuple[Rel, str]]:
    """Flatten a cattrs error tree into ``(path, message)`` pairs."""
    if isinstance(exc, _Invalid):
        yield path, str(exc)
    elif isinstance(exc, ForbiddenExtraKeysError):
        fields = [a.name for a in attrs.fields(exc.cl) if a.name not in PYTHON_ONLY]
        for key in sorted(exc.extra_fields):
            yield (*path, key), (f"unknown key {key!r}{did_you_mean(key, fields)}; expected one "
                                 f"of {', '.join(fields)}")
    elif isinstance(exc, BaseValidationError):
        for sub in exc.exceptions:
            seg: Rel = ()
            for note in getattr(sub, "__notes__", []):
                if isinstance(note, AttributeValidationNote):
                    seg = (note.name,)
                elif isinstance(note, IterableValidationNote):
                    seg = (note.index,)
            yield from _collect(sub, (*path, *seg))
    elif isinstance(exc, KeyError):
        yield path, f"missing key {exc.args[0]!r}"
    else:  # not one of the hooks' own errors: say what, not Python's words for it
        yield path, "expected a value of another kind here"



def _check_events(events: tuple[str, ...], problems: Problems) -> None:
    seen: set[str] = set()
    for i, event in enumerate(events):
        if event in BUILTIN_EVENTS:
            problems.add(("events", i), f"{event!r} is a built-in event; declare only custom "
                                        "ones", expected="a custom event name", found=event)
        elif len(event) > MAX_NAME:
            problems.add(("events", i), f"a name is at most {MAX_NAME} characters; this one "
                                        f"has {len(event):,}",
                         expected=f"at most {MAX_NAME} characters", found=event)
        elif not is_name(event):
            problems.add(("events", i), f"invalid event name {event!r}: {NAME_RULE}",
                         expected="a name", found=event)
        elif event in seen:
            problems.add(("events", i), f"event {event!r} is declared twice",
                         expected="each event once", found=event)
        seen.add(event)


_TOP_KEYS: Final = ("clock", "run", "events", "triggers", "callbacks")


def _structure(value: object, cls: type, where: Rel, problems: Problems) -> Any:
    if attrs.has(cls) and not isinstance(value, dict):
        problems.expect(where, "a table", value)
        return None
    try:
        return _converter.structure(value, cls)
    except Exception as exc:
        for path, message in _collect(exc, where):
            problems.add(path, message)
        return None


def structure(value: object, cls: type, where: Rel, problems: Problems) -> Any:
    """``value`` structured as ``cls`` by the strict converter, or ``None`` with the
    problems recorded at their key paths under ``where``."""
    return _structure(value, cls, where, problems)


def _structure_run(value: object, problems: Problems) -> RunFields | None:
    """The ``[run]`` table; a key only Python or the command line sets is refused."""
    if isinstance(value, dict):
        for key in sorted(PYTHON_ONLY.intersection(value)):
            problems.add(("run", key), f"{key!r} is not a [run] key: it is set from Python "
                         f"(Trainer({key}=...)) or the command line",
                         expected="a [run] key", found=key)
        value = without_mistyped_mtbf(
            {k: v for k, v in value.items() if k not in PYTHON_ONLY}, problems)
    run: RunFields | None = _structure(value, RunFields, ("run",), problems)
    return run


def read_document(data: dict[str, Any], problems: Problems) -> Document:
    """Structure and range-check the top level; a table that cannot be structured is
    reported and read as empty, so the other tables are still checked."""
    for key in data:
        if key not in _TOP_KEYS:
            problems.add((key,), f"unknown key {key!r}{did_you_mean(key, _TOP_KEYS)}; expected "
                                 f"one of {', '.join(_TOP_KEYS)}", found=key)
    clock = _structure(data.get("clock", {}), ClockSpec, ("clock",), problems) or ClockSpec()
    run = _structure_run(data["run"], problems) if "run" in data else None
    events = _structure(data.get("events", []), tuple[str, ...], ("events",), problems) or ()
    tables = {k: _structure(data.get(k, {}), dict[str, Any], (k,), problems) or {}
              for k in ("triggers", "callbacks")}
    check_clock(clock, problems)
    if run is not None:
        check_run(run, problems)
    _check_events(events, problems)
    for kind, table in tables.items():
        for name in table:
            if len(name) > MAX_NAME:
                problems.add((kind, name), f"a name is at most {MAX_NAME} characters; this "
                                           f"one has {len(name):,}",
                             expected=f"at most {MAX_NAME} characters", found=name)
            elif not (is_callback_name(name) if kind == "callbacks" else is_name(name)):
                problems.add((kind, name), f"invalid name {name!r}: {NAME_RULE}",
                             expected="a name", found=name)
    return Document(clock, run, events, tables["triggers"], tables["callbacks"])
