"""Checks of a loaded ``ScheduleDriver`` state, before any of it is used.

A state comes from a checkpoint file, which may be damaged or crafted: each value is
checked for its type, its range and its agreement with the clock it travels with, and a
bad one is refused with one line naming its key path (``driver state: pending[0]: ...``)
instead of hanging, or crashing somewhere later.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final

from schedtrain.errors import Error, describe, one_line
from schedtrain.readback import DamagedFile, PartStateError, printable, structure
from schedtrain.time import MAX_COUNT

__all__ = ["MAX_NESTING", "DriverStateError", "check_driver_state", "check_nesting",
           "check_seen", "count", "host_state", "latest_values", "load_part"]

_FIELDS: Final = ("step", "batch", "epoch", "step_in_epoch", "sample", "token", "time_ns")
_KEYS: Final = ("clock", "pending", "table", "metrics", "started", "in_epoch")


class DriverStateError(Error, ValueError):
    """A loaded driver state that cannot be this driver's: one line, with its key path."""

    def __init__(self, path: str, expected: str, found: object) -> None:
        shown = found if isinstance(found, str) else describe(found)
        # expected "": ``found`` is the whole reason (a part's own words)
        super().__init__(one_line(f"driver state: {path}: "
                                  + (f"expected {expected}, found {shown}" if expected
                                     else shown), 300))
        self.path = path


def count(value: object, path: str) -> int:
    # bool is an int to Python, never a count to a checkpoint
    if type(value) is not int or not 0 <= value <= MAX_COUNT:
        raise DriverStateError(path, f"an integer from 0 to {MAX_COUNT}", value)
    return value


def _table(value: object, path: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise DriverStateError(path, "a table", value)
    return value


def _flag(value: object, path: str) -> bool:
    if not isinstance(value, bool):
        raise DriverStateError(path, "true or false", value)
    return value


def _timestamp(value: object, path: str) -> dict[str, int]:
    table = _table(value, path)
    extra = sorted(str(k) for k in table if k not in _FIELDS)
    if extra:
        raise DriverStateError(f"{path}.{extra[0]}", f"only the keys {', '.join(_FIELDS)}",
                               f"key {extra[0]!r}")
    out = {}
    for field in _FIELDS:
        if field not in table:
            raise DriverStateError(f"{path}.{field}", "an integer", "nothing")
        out[field] = count(table[field], f"{path}.{field}")
    return out


def check_driver_state(state: object, *, store: bool = False,
                       stateful: Iterable[str] = ()) -> None:
    """Refuse a driver state (``ScheduleDriver.state_dict``'s shape) that is damaged;
    ``store``: its metrics are a ``MetricStore``'s (a ``CallbackDriver``), checked as the
    own loop checks them (``MetricsState``); ``stateful``: the callbacks whose triggers
    keep a state (each saves one, so one missing is damage, not a fresh trigger)."""
    top = _table(state, "(top)")
    missing = [key for key in _KEYS if key not in top]
    if missing:
        raise DriverStateError("(top)", f"a ScheduleDriver state (keys {', '.join(_KEYS)})",
                               f"missing {', '.join(missing)}")
    clock = _table(top["clock"], "clock")
    now = _timestamp(clock.get("now"), "clock.now")
    if now["step_in_epoch"] > now["step"]:
        raise DriverStateError("clock.now.step_in_epoch", f"at most clock.now.step "
                               f"({now['step']})", str(now["step_in_epoch"]))
    prev = _timestamp(clock.get("previous_step_end"), "clock.previous_step_end")
    # (its batch and epoch counters are the clock's, not that step end's)
    for field in ("step", "sample", "token", "time_ns"):
        if prev[field] > now[field]:
            raise DriverStateError(f"clock.previous_step_end.{field}",
                                   f"at most clock.now.{field} ({now[field]})",
                                   str(prev[field]))
    pending = top["pending"]
    if not isinstance(pending, list | tuple) or len(pending) != 3:
        raise DriverStateError("pending", "a list of 3 counts (batches, samples, tokens)",
                               pending)
    for i, (field, n) in enumerate(zip(("batch", "sample", "token"), pending, strict=True)):
        n_pending = count(n, f"pending[{i}]")
        if now[field] + n_pending > MAX_COUNT:
            raise DriverStateError(f"pending[{i}]", f"at most {MAX_COUNT - now[field]} (the "
                                   f"clock's {field} count is {now[field]})", str(n_pending))
    if now["batch"] < now["step"]:  # each step has a micro-batch at least
        raise DriverStateError("clock.now.batch", f"at least clock.now.step ({now['step']})",
                               str(now["batch"]))
    if not pending[0] and any(pending[1:]):
        raise DriverStateError("pending[1]" if pending[1] else "pending[2]", "no samples or "
                               "tokens without a batch (pending[0] is 0)", str(pending))
    if store:  # a hosted callback's metric store: the own loop's record of it
        from schedtrain.training.run_records import MetricsState
        try:
            structure(top["metrics"], MetricsState, "driver state", "metrics")
        except DamagedFile as exc:
            raise DriverStateError(exc.key, "", exc.reason) from None
    else:  # its own load_state_dict checks its entries
        _table(top["metrics"], "metrics")
    _flag(top["started"], "started")
    _flag(top["in_epoch"], "in_epoch")
    table = _table(top["table"], "table")
    if "triggers" not in table:  # read as "no state yet", it would fire afresh
        raise DriverStateError("table.triggers", "the triggers' states", "nothing")
    triggers = _table(table["triggers"], "table.triggers")
    lost = [name for name in stateful if name not in triggers]
    if lost:
        raise DriverStateError(f"table.triggers.{printable(lost[0])}", "the state this "
                               "trigger saved", "nothing")
    schedule = top.get("schedule")
    if schedule is not None and not isinstance(schedule, str):
        raise DriverStateError("schedule", "the schedule's text (canonical TOML)", schedule)
    agreed = top.get("agreed")
    if agreed is not None:
        if not isinstance(agreed, list | tuple) or len(agreed) != 2:
            raise DriverStateError("agreed", "a list of 2 counts (samples, tokens)", agreed)
        for i, n in enumerate(agreed):
            count(n, f"agreed[{i}]")


def host_state(state: object, keys: tuple[str, ...]) -> Mapping[str, Any]:
    """The host callback's own state table (the driver's state and what the host keeps
    beside it), each of ``keys`` present."""
    top = _table(state, "(top)")
    for key in keys:
        if key not in top:
            raise DriverStateError(key, "this part of the schedule's state", "nothing")
    return top


def latest_values(value: object, path: str) -> dict[str, float]:
    """A table of metric name -> the number last read (a host's ``last_read``; NaN kept,
    as the metric store keeps a diverged loss)."""
    table = _table(value, path)
    for name, number in table.items():
        if (not isinstance(name, str) or isinstance(number, bool)
                or not isinstance(number, int | float)):
            raise DriverStateError(f"{path}.{printable(str(name))[:60]}", "a number",
                                   number)
    return {name: float(number) for name, number in table.items()}


def check_seen(table: Any, metrics: Any) -> None:
    """A metric trigger's ``seen`` (the values of its metric it has looked at) at most the
    values the loaded metrics counted: more would skip the values still to come."""
    for name, node in zip(table.names, table.nodes, strict=True):
        seen = getattr(node, "seen", None)
        metric = getattr(getattr(node, "trigger", None), "metric", None)
        if isinstance(seen, int) and isinstance(metric, str):
            latest = metrics.latest(metric)
            have = 0 if latest is None else latest.count
            if seen > have:
                raise DriverStateError(f"table.triggers.{name}.seen", f"at most {have} (the "
                                       f"values of {metric} in metrics)", str(seen))


def load_part(path: str, load: Callable[[Any], None], value: Any) -> None:
    """``load(value)`` for the part at ``path`` (the metrics, the triggers), a part it
    cannot read refused in one line: each part's own ``load_state_dict`` knows its
    shape (the hosts keep their metrics differently), so its error is named, not
    re-checked here."""
    try:
        load(value)
    except PartStateError as exc:  # the part named the key inside its state
        raise DriverStateError(f"{path}.{exc.key}" if exc.key else path, "",
                               exc.reason) from None
    except (KeyError, IndexError, TypeError, ValueError, AttributeError, OverflowError) as exc:
        raise DriverStateError(path, "the state this part saved",
                               f"{type(exc).__name__}: {exc}") from None


#: How deeply a driver state may nest: Lightning deep-copies it before the callback reads
#: it, and a state nested past Python's recursion limit would end the fit there.
MAX_NESTING = 200


def check_nesting(state: object, path: str = "driver state") -> None:
    """Refuse a state nested deeper than ``MAX_NESTING`` (a walk without recursion).

    Raises:
        DriverStateError: naming the key path where it nests too deep.
    """
    stack: list[tuple[object, str, int]] = [(state, "", 0)]
    while stack:
        value, where, depth = stack.pop()
        if depth > MAX_NESTING:
            raise DriverStateError(where or path, f"at most {MAX_NESTING} nested levels",
                                   "more")
        if isinstance(value, Mapping):
            stack.extend((v, f"{where}.{k}" if where else str(k), depth + 1)
                         for k, v in value.items())
        elif isinstance(value, list | tuple):
            stack.extend((v, f"{where}[{i}]", depth + 1) for i, v in enumerate(value))
