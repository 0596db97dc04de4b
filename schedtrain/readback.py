"""The one boundary for everything a run reads back from disk or an object store.

A file schedtrain wrote earlier (``run.json``, a retime request or its answer, the
journal of applied retimes, a lease, a line of ``events.jsonl`` a resume replays, the run
state inside a checkpoint) may have been damaged by a crash or a full disk, or crafted by
hand. Nothing read back is trusted: it is read by ``read_json`` (a regular file only,
never a blocking open, a size cap, a nesting cap) and structured by ``structure`` into a
frozen attrs record whose fields carry their types and bounds (finite numbers, ranges,
list lengths, printable names). What fails is a ``DamagedFile`` that names the file and
the key path in one line: the caller passes a damaged checkpoint over for the previous
one, answers a bad request "refused", or ends with exit 2 — never a traceback, never a
value used as it was found.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, Final, TypeVar

import attrs
import cattrs
from cattrs.errors import (
    AttributeValidationNote,
    BaseValidationError,
    ForbiddenExtraKeysError,
    IterableValidationNote,
)

from schedtrain.errors import Error, RunDirError, describe, one_line
from schedtrain.files import read_regular
from schedtrain.nesting import CONTROL as _CONTROL
from schedtrain.nesting import MAX_DEPTH, check_depth, printable, too_deep_at
from schedtrain.urls import redact_text

__all__ = [
    "MAX_DEPTH",
    "MAX_LIST",
    "SMALL_FILE",
    "DamagedFile",
    "Invalid",
    "PartStateError",
    "at_most",
    "between",
    "check_depth",
    "finite",
    "invalid",
    "parse_json",
    "printable",
    "read_json",
    "state_number",
    "structure",
    "too_deep_at",
    "valid",
]

T = TypeVar("T")

#: The size cap of a small control file (``run.json``, a retime request, a lease).
SMALL_FILE: Final = 1 << 20
#: The longest list a read-back record holds (stretches of an epoch, retimes applied).
MAX_LIST: Final = 10_000

Where = tuple[str | int, ...]


class DamagedFile(RunDirError):
    """A file read back that is not what schedtrain wrote there: not a regular file, too
    large, not JSON, nested too deeply, or a field of the wrong type or out of bounds.

    Attributes:
        path: the file (or its URL, as shown).
        key: the key path at fault (``""``: the file as a whole).
        reason: what was expected and what was found.
    """

    def __init__(self, path: Path | str, key: str, reason: str) -> None:
        where = f"{key}: " if key else ""
        super().__init__(one_line(redact_text(f"{str(path)!r}: {where}{reason}"), 300))
        self.path = path
        self.key = key
        self.reason = reason


def _no_constant(name: str) -> float:
    raise ValueError(f"{name} is not a JSON number")


def parse_json(data: str | bytes, path: Path | str, *, depth: int = MAX_DEPTH) -> Any:
    """JSON ``data`` read from ``path``, refused (``DamagedFile``) where it is not JSON,
    nests deeper than ``depth``, or holds ``NaN``/``Infinity`` (JSON has no such numbers)."""
    deep = too_deep_at(data, depth)
    if deep is not None:
        raise DamagedFile(path, deep, f"lists and tables nest more than {depth} levels deep")
    try:
        return json.loads(data, parse_constant=_no_constant)
    except (ValueError, UnicodeDecodeError) as exc:
        raise DamagedFile(path, "", f"is not JSON ({printable(str(exc))[:100]})") from None
    except RecursionError:  # pragma: no cover - check_depth refuses it first
        raise DamagedFile(path, "", "nests too deeply") from None


def read_json(path: Path, *, limit: int = SMALL_FILE, depth: int = MAX_DEPTH) -> Any:
    """The JSON file ``path``: a regular file (a FIFO, directory or device refused,
    opened without blocking), at most ``limit`` bytes, nested at most ``depth`` deep.

    Raises:
        FileNotFoundError: it is missing (the caller knows whether that is normal).
        DamagedFile: anything else is wrong with it.
    """
    try:
        data = read_regular(path, limit)
    except FileNotFoundError:
        raise
    except RunDirError as exc:  # UnsafeFile: not a regular file, or too long
        raise DamagedFile(path, "", str(exc).split(": ", 1)[-1].removeprefix(
            f"{str(path)!r} ")) from None
    except OSError as exc:
        raise DamagedFile(path, "", f"cannot be read ({exc.strerror or exc})") from None
    return parse_json(data, path, depth=depth)


class Invalid(Error):
    """Raised by a structuring hook: what was expected (the spec's converter raises it
    too, through the strict scalar hooks it shares: ``strict_int``, ``strict_str``,
    ``strict_bool``)."""


_Invalid = Invalid


class _At(Exception):
    """An item of a list (its index) or an entry of a table (its key) that failed."""

    def __init__(self, index: int | str, inner: BaseException) -> None:
        super().__init__(index)
        self.index = index
        self.inner = inner


class _FieldInvalid(_Invalid):
    """Raised by a field's validator: what was expected, and which field."""

    def __init__(self, name: str, message: str) -> None:
        super().__init__(message)
        self.name = name


def strict_int(value: object, _t: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _Invalid(f"expected an integer, found {describe(value)}")
    return value


def _float(value: object, _t: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _Invalid(f"expected a number, found {describe(value)}")
    if not math.isfinite(value):
        raise _Invalid(f"expected a finite number, found {value!r}")
    return float(value)


def strict_str(value: object, _t: object) -> str:
    if not isinstance(value, str):
        raise _Invalid(f"expected a string, found {describe(value)}")
    return value


def strict_bool(value: object, _t: object) -> bool:
    if not isinstance(value, bool):
        raise _Invalid(f"expected true or false, found {describe(value)}")
    return value


def _sequence(value: object, t: Any) -> tuple[Any, ...]:
    if not isinstance(value, list | tuple):
        raise _Invalid(f"expected a list, found {describe(value)}")
    if len(value) > MAX_LIST:
        raise _Invalid(f"expected at most {MAX_LIST:,} items, found {len(value):,}")
    args = t.__args__
    if len(args) == 2 and args[1] is Ellipsis:
        args = (args[0],) * len(value)
    elif len(value) != len(args):
        raise _Invalid(f"expected {len(args)} items, found {len(value)}")
    out = []
    for index, (item, kind) in enumerate(zip(value, args, strict=True)):
        try:
            out.append(_converter.structure(item, kind))
        except Exception as exc:
            raise _At(index, exc) from None
    return tuple(out)


def _mapping(value: object, t: Any) -> dict[Any, Any]:
    if not isinstance(value, dict):
        raise _Invalid(f"expected a table, found {describe(value)}")
    if len(value) > MAX_LIST:
        raise _Invalid(f"expected at most {MAX_LIST:,} entries, found {len(value):,}")
    args = getattr(t, "__args__", (str, Any))
    out = {}
    for k, v in value.items():
        key = _converter.structure(k, args[0])
        try:  # an entry that fails is named by its key
            out[key] = v if args[1] is Any else _converter.structure(v, args[1])
        except Exception as exc:
            raise _At(printable(str(k))[:60], exc) from None
    return out


_converter = cattrs.Converter(forbid_extra_keys=False, detailed_validation=True)
_converter.register_structure_hook(int, strict_int)
_converter.register_structure_hook(float, _float)
_converter.register_structure_hook(str, strict_str)
_converter.register_structure_hook(bool, strict_bool)
_converter.register_structure_hook_func(
    lambda t: getattr(t, "__origin__", None) is tuple, _sequence)
_converter.register_structure_hook_func(
    lambda t: getattr(t, "__origin__", None) in (dict, Mapping) or t is dict, _mapping)


# -- bounds, as attrs validators on a record's fields ------------------------------------------
def between(low: float, high: float) -> Callable[[Any, Any, Any], None]:
    """A field within ``low..high`` (both included)."""
    def check(_inst: Any, attribute: Any, value: Any) -> None:
        if value is not None and not low <= value <= high:
            raise _FieldInvalid(attribute.name,
                                f"expected a value from {low:,} to {high:,}, found {value!r}")
    return check


def at_most(high: int) -> Callable[[Any, Any, Any], None]:
    """A list or text field of at most ``high`` items or characters."""
    def check(_inst: Any, attribute: Any, value: Any) -> None:
        if value is not None and len(value) > high:
            raise _FieldInvalid(attribute.name,
                                f"expected at most {high:,} items, found {len(value):,}")
    return check


def finite(_inst: Any, attribute: Any, value: Any) -> None:
    """A number that is finite (the converter already refuses NaN and infinities; this
    guards a record made in Python)."""
    if value is not None and not math.isfinite(value):
        raise _FieldInvalid(attribute.name, f"expected a finite number, found {value!r}")


def valid(_inst: Any, attribute: Any, value: Any) -> None:
    """A name shown in messages: no control characters, at most 200 characters."""
    if value is not None and (_CONTROL.search(value) or len(value) > 200):
        raise _FieldInvalid(attribute.name, "expected a printable name of at most 200 "
                            f"characters, found {printable(value)[:60]!r}")


def invalid(field: str, message: str) -> Exception:
    """The error a record's own cross-field check raises (in ``__attrs_post_init__``):
    ``field`` is the key named, ``message`` what was expected."""
    return _FieldInvalid(field, message)


class PartStateError(Error, ValueError):
    """A part's own ``load_state_dict`` refusing its state: ``key`` is the key path inside
    that state (``best``, ``best.wait``), ``reason`` what was expected and found. Whoever
    loads the part names the full path (``within`` prefixes the part's own key)."""

    def __init__(self, key: str, reason: str) -> None:
        super().__init__(f"{key}: {reason}")
        self.key = key
        self.reason = reason

    def within(self, prefix: str) -> PartStateError:
        """The same error, its key path under ``prefix``."""
        return PartStateError(f"{prefix}.{self.key}" if self.key else prefix, self.reason)


def state_number(state: Any, key: str, *, low: float = -math.inf, high: float = math.inf,
                 whole: bool = False, none: bool = False, real: bool = False) -> Any:
    """``state[key]`` (a part's state table) checked: a number (an integer where ``whole``,
    ``None`` where ``none``), finite and within ``low..high`` (``real``: any float, NaN
    and infinities included, as a diverged metric's value is); else ``PartStateError``."""
    if not isinstance(state, Mapping):
        raise PartStateError("", f"expected a table, found {describe(state)}")
    if key not in state:
        raise PartStateError(key, "expected a value, found nothing")
    value = state[key]
    if value is None and none:
        return None
    number = value if isinstance(value, int | float) and not isinstance(value, bool) else None
    if number is None or (whole and not isinstance(number, int)) or not (
            (real and not whole) or (math.isfinite(number) and low <= number <= high)):
        what = "an integer" if whole else "a number" if real else "a finite number"
        rng = f" from {low:,} to {high:,}" if math.isfinite(low) and math.isfinite(high) else ""
        raise PartStateError(key, f"expected {what}{rng}{' or null' if none else ''}, found "
                             f"{printable(describe(value))[:60]}")
    return value


def _collect(exc: BaseException, path: Where) -> Iterator[tuple[Where, str]]:
    """Flatten a cattrs error tree into ``(key path, message)`` pairs."""
    if isinstance(exc, _At):
        yield from _collect(exc.inner, (*path, exc.index))
    elif isinstance(exc, _FieldInvalid):
        yield (*path, exc.name), str(exc)
    elif isinstance(exc, _Invalid):
        yield path, str(exc)
    elif isinstance(exc, ForbiddenExtraKeysError):  # pragma: no cover - not forbidden
        yield path, f"unknown keys {sorted(exc.extra_fields)}"
    elif isinstance(exc, BaseValidationError):
        for sub in exc.exceptions:
            seg: Where = ()
            for note in getattr(sub, "__notes__", []):
                if isinstance(note, AttributeValidationNote):
                    seg = (note.name,)
                elif isinstance(note, IterableValidationNote):
                    seg = (note.index,)
            yield from _collect(sub, (*path, *seg))
    elif isinstance(exc, KeyError):
        yield path, "missing"
    else:  # a validator's own check (a record's cross-field rule) or Python's words
        yield path, printable(str(exc)) or "expected a value of another kind here"


def _key(path: Where) -> str:
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else (
            f".{printable(part)}" if text else printable(part))
    return text


def structure(data: Any, cls: type[T], path: Path | str, key: str = "") -> T:
    """``data`` (read from ``path``, at ``key`` inside it) as a ``cls`` record, its
    types and bounds checked.

    Raises:
        DamagedFile: the first field at fault, by key path.
    """
    if not isinstance(data, dict) and attrs.has(cls):
        raise DamagedFile(path, key, f"expected a table, found {describe(data)}")
    try:
        return _converter.structure(data, cls)
    except (BaseValidationError, _Invalid, _At, KeyError, TypeError, ValueError) as exc:
        problems = list(_collect(exc, ()))
        where, message = problems[0] if problems else ((), "expected another shape")
        full = ".".join(p for p in (key, _key(where)) if p).replace(".[", "[")
        raise DamagedFile(path, full, message) from None
