"""Live retime: what may change in a running job, and the files that carry it.

``schedtrain retime RUN_DIR NEW`` (or ``trainer.retimer.retime(schedule)``) hands a new
schedule to a running job. The job applies it by the rules of a resume with
``--schedule-change apply`` (``planning.changes.carry``), except that it cannot build or
drop callback objects while it runs: a change that adds, removes or reorders callbacks,
or changes a callback's arguments, is refused with one line saying why (restart with
``--resume auto --schedule-change apply`` for those). Everything here is torch-free: the
command checks a request with the same rules the run applies.

Files in the run directory (each written atomically):

- ``retime.json``: the request, ``{"id", "schedule"}`` (canonical TOML), created only
  where none waits (``write_request``); the run removes it once it has answered;
- ``retime.answer.json``: the run's newest answer, ``{"id", "status": "applied" |
  "unchanged" | "refused", "step", "epoch", "reason", "earlier": [...]}`` (``earlier``:
  the few answers before it, so a command that looks late still finds its own);
- ``retimes.json``: every retime applied, ``{"base": TEXT, "applied": [{"step", "epoch",
  "schedule", "id"}, ...]}``, so a resumed run (``--resume auto``) applies each again where
  it was applied: the run goes on exactly as it went. A request whose id is there (the
  run killed before it removed ``retime.json``) is answered as applied there, never
  applied again.

Each is read back through ``readback.read_json`` into a typed, bounded record
(``Request``, ``Answer``, ``History``); a damaged request is answered "refused", a damaged
journal refuses the resume that would replay it (``DamagedFile``, one line).
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import Any, Final

import attrs

from schedtrain.errors import Error
from schedtrain.files import write_atomic
from schedtrain.planning.run_status import BATCH_EVENTS
from schedtrain.planning.stored import StoredSchedule, stored
from schedtrain.readback import (
    MAX_LIST,
    SMALL_FILE,
    DamagedFile,
    at_most,
    invalid,
    printable,
    read_json,
    structure,
    valid,
)
from schedtrain.time import MAX_COUNT

__all__ = ["ANSWER_FILE", "HISTORY_FILE", "LOOK_STEPS", "LOOP_EVENTS",
           "REQUEST_FILE", "Answer", "Applied",
           "BadRequest", "History", "Request", "RequestWaiting", "ScheduleChangeRefused",
           "live_refusal", "loop_events", "read_answer", "read_answers", "read_history",
           "read_request", "write_answer", "write_history", "write_json", "write_request"]

REQUEST_FILE: Final = "retime.json"
ANSWER_FILE: Final = "retime.answer.json"
HISTORY_FILE: Final = "retimes.json"
#: What an answer may say of a request.
STATUSES: Final = ("applied", "unchanged", "refused")
#: How many earlier answers ``retime.answer.json`` keeps beside its newest.
KEEP_ANSWERS: Final = 8
#: ``retimes.json`` holds a schedule per retime: larger than a request, still bounded.
MAX_HISTORY: Final = 64 << 20
#: A job on one process looks for a request at least every this many steps (at each
#: multiple of it, and at each fold of its kept losses, ``training.losses.FOLD``).
LOOK_STEPS: Final = 256
#: Events the loop fires only when it was built for a trigger that names them.
LOOP_EVENTS: Final = BATCH_EVENTS


class ScheduleChangeRefused(Error, ValueError):
    """A retime the running job cannot take (the message says why)."""


def live_refusal(old: StoredSchedule | str, new: StoredSchedule | str,
                 fires: Collection[str] | None = None) -> str | None:
    """Why a running job cannot take ``new`` in place of ``old`` (both canonical
    schedules: text is parsed here), or ``None``: it can (only triggers change; the
    rules of ``--schedule-change apply`` say whose state is kept). The job and
    ``schedtrain retime`` both ask this, so the command refuses up front what the job
    would.

    Args:
        fires: which of ``LOOP_EVENTS`` the running loop fires (``run.json``'s
            ``batch_events``); ``None``: those ``old`` names.

    Raises:
        SpecError: ``new`` (or, with ``fires`` ``None``, ``old``) is not a valid schedule.
    """
    # The job hands both parsed: only text is handed to ``stored`` (in another module).
    was = old if isinstance(old, StoredSchedule) else stored(old, "running schedule")
    now = new if isinstance(new, StoredSchedule) else stored(new, "new schedule")
    a, b = was.doc, now.doc
    ca, cb = was.callbacks, now.callbacks
    added = [n for n in cb if n not in ca]
    removed = [n for n in ca if n not in cb]
    restart = ("; restart the run with the new spec and --resume auto --schedule-change "
               "apply for that")
    if added or removed:
        what = ", ".join([*(f"adds {n!r}" for n in added[:3]),
                          *(f"removes {n!r}" for n in removed[:3])])
        return f"the new schedule {what}: a running job cannot build or drop callbacks{restart}"
    if list(ca) != list(cb):
        return ("the new schedule reorders the callbacks (at an event they fire in "
                f"declared order): a running job keeps its order{restart}")
    for name in ca:
        args_a = {k: v for k, v in ca[name].items() if k != "trigger"}
        args_b = {k: v for k, v in cb[name].items() if k != "trigger"}
        if args_a != args_b:
            keys = sorted(k for k in {*args_a, *args_b} if args_a.get(k) != args_b.get(k))
            return (f"callbacks.{name}: its arguments change ({', '.join(keys)}): a running "
                    f"callback keeps the arguments it was built with{restart}")
        if ca[name].get("trigger") != cb[name].get("trigger") and (
                _auto(ca[name].get("trigger")) or _auto(cb[name].get("trigger"))):
            # Its saver measures its saves into the deciders it was built with: a new
            # every = "auto" part would never be fed, an old one fed for nothing.
            return (f"callbacks.{name}: its trigger changes and holds every = \"auto\" "
                    "(before or after): a running saver keeps the interval decisions of "
                    f"the trigger it was built with{restart}")
    others = sorted(k for k in {*a, *b} if k not in ("callbacks", "triggers")
                    and a.get(k) != b.get(k))
    if others:
        return (f"the new schedule changes [{others[0]}]: a running job keeps it{restart}")
    custom = _custom(b)
    if custom is not None:
        return (f"the new schedule names a trigger class of its own ({{ custom = "
                f"{printable(custom)[:80]!r} }}): a running job imports no code a request "
                f"names{restart}")
    fired = loop_events(was) if fires is None else frozenset(fires)
    for name, events in now.events().items():
        missing = [e for e in LOOP_EVENTS if e in events and e not in fired]
        if missing:
            return (f"callbacks.{name}.trigger: names {missing[0]}, which the running loop "
                    f"was not built to fire (no trigger named it when the job started)"
                    f"{restart}")
    return None


def loop_events(schedule: StoredSchedule | str) -> frozenset[str]:
    """Which of ``LOOP_EVENTS`` a loop built for ``schedule`` (canonical TOML) fires."""
    found = stored(schedule, "schedule").events().values()
    return frozenset(e for e in LOOP_EVENTS if any(e in events for events in found))


def _auto(trigger: Any) -> bool:
    """Whether a trigger's TOML form holds ``every = "auto"``."""
    todo: list[Any] = [trigger]
    while todo:  # a loop, not recursion: a request's nesting is not ours to trust
        value = todo.pop()
        if isinstance(value, Mapping):
            if value.get("every") == "auto":
                return True
            todo.extend(value.values())
        elif isinstance(value, list):
            todo.extend(value)
    return False


def _custom(doc: Mapping[str, Any]) -> str | None:
    """The first custom trigger class (``{ custom = "pkg.mod:Class" }``) ``doc`` names."""
    todo: list[Any] = [doc.get("callbacks", {}), doc.get("triggers", {})]
    while todo:  # a loop, not recursion: a request's nesting is not ours to trust
        value = todo.pop()
        if isinstance(value, Mapping):
            if isinstance(value.get("custom"), str):
                return str(value["custom"])
            todo.extend(value.values())
        elif isinstance(value, list):
            todo.extend(value)
    return None


def _one_of(*choices: str) -> Callable[[Any, Any, Any], None]:
    def check(_inst: Any, attribute: Any, value: str) -> None:
        if value not in choices:
            raise invalid(attribute.name, f"expected one of {', '.join(choices)}, found "
                                          f"{printable(value)[:40]!r}")
    return check


def _count(_inst: Any, attribute: Any, value: Any) -> None:
    """A step or epoch from 0 to ``MAX_COUNT``: ``readback.between(0, MAX_COUNT)``'s rule
    and words, written here because each answer and retime the job records checks two,
    on the step that applies it (a call into another module each)."""
    if value is not None and not 0 <= value <= MAX_COUNT:
        raise invalid(attribute.name, f"expected a value from 0 to {MAX_COUNT:,}, found "
                                      f"{value!r}")


@attrs.frozen
class Request:
    """``retime.json``: a request's id (its answer names it) and its schedule."""

    id: str = attrs.field(validator=valid)
    schedule: str = attrs.field(validator=at_most(SMALL_FILE))


@attrs.frozen
class Answer:
    """What became of request ``id``: ``status`` at ``step`` (``epoch``), and why."""

    id: str = attrs.field(validator=valid)
    status: str = attrs.field(validator=_one_of(*STATUSES))
    step: int = attrs.field(validator=_count)
    epoch: int = attrs.field(validator=_count)
    reason: str = attrs.field(validator=at_most(4096))

    def to_dict(self) -> dict[str, Any]:
        """The JSON record."""
        return attrs.asdict(self)


@attrs.frozen
class _Earlier:
    """The answers ``retime.answer.json`` keeps beside its newest (``earlier``)."""

    earlier: tuple[Answer, ...] = attrs.field(default=(), validator=at_most(KEEP_ANSWERS))


@attrs.frozen
class Applied:
    """One retime applied: after the ``step_end`` of ``step``, ``schedule`` took over;
    ``id``: the request's (``None``: a replay's, or a journal written before ids were
    kept), so a request still waiting after a kill is not applied twice."""

    step: int = attrs.field(validator=_count)
    epoch: int = attrs.field(validator=_count)
    schedule: str = attrs.field(validator=at_most(SMALL_FILE))
    id: str | None = attrs.field(default=None, validator=valid)

    def to_dict(self) -> dict[str, Any]:
        """The JSON record."""
        found = {"step": self.step, "epoch": self.epoch, "schedule": self.schedule}
        return found if self.id is None else {**found, "id": self.id}


@attrs.frozen
class History:
    """A run's retimes: its schedule at the start (``base``), then each one applied
    (in the order of their steps: a later retime replaces those after its step)."""

    base: str = attrs.field(validator=at_most(SMALL_FILE))
    applied: tuple[Applied, ...] = attrs.field(default=(), validator=at_most(MAX_LIST))

    def __attrs_post_init__(self) -> None:
        steps = [a.step for a in self.applied]
        bad = next((i for i in range(1, len(steps)) if steps[i] < steps[i - 1]), None)
        if bad is not None:
            raise invalid("applied", f"expected retimes in the order of their steps, found "
                                     f"step {steps[bad]} after step {steps[bad - 1]}")

    def applied_as(self, ident: str) -> Applied | None:
        """The retime request ``ident`` made, when it was applied."""
        return next((a for a in self.applied if a.id == ident), None)

    def texts(self) -> list[str]:
        """The schedule in force before the first retime, then after each."""
        return [self.base, *(a.schedule for a in self.applied)]

    def to_dict(self) -> dict[str, Any]:
        """The JSON record."""
        return {"base": self.base, "applied": [a.to_dict() for a in self.applied]}


def write_json(path: Path, value: Mapping[str, Any]) -> None:
    """``value`` as JSON at ``path``, atomically."""
    text = json.dumps(dict(value), indent=1) + "\n"
    write_atomic(path, lambda f: f.write(text.encode()))


class RequestWaiting(Error):
    """``retime.json`` already holds a request the job has not answered yet."""


def write_request(run_dir: Path, schedule: str) -> str:
    """Hand ``schedule`` to the job running in ``run_dir``; returns the request's id.

    The request is created only where none waits (a link of a complete temporary file,
    which fails when the name exists): two commands racing never overwrite each other's
    request, so each is told the truth about its own.

    Raises:
        RequestWaiting: another request waits for the job (or something else sits at
            ``retime.json``).
    """
    ident = uuid.uuid4().hex
    text = json.dumps({"id": ident, "schedule": schedule}, indent=1) + "\n"
    path = run_dir / REQUEST_FILE
    tmp = run_dir / f".{REQUEST_FILE}.{ident}.tmp"
    tmp.write_bytes(text.encode())
    try:
        os.link(tmp, path)
    except FileExistsError:
        raise RequestWaiting(f"{str(path)!r} already holds a request the job has not "
                             "answered; wait for its answer (schedtrain retime --wait) "
                             "and ask again, or remove the file") from None
    finally:
        tmp.unlink(missing_ok=True)
    return ident


@attrs.frozen
class BadRequest:
    """What sits at ``retime.json`` and cannot be a request: ``reason`` says why in one
    line; ``id`` is its id where one could be read (its answer names it), else ``""``."""

    id: str
    reason: str


def read_request(run_dir: Path) -> Request | BadRequest | None:
    """The request waiting in ``run_dir``: a ``Request``, a ``BadRequest`` (a FIFO, a
    directory, not JSON, nested too deep, a field of another type), or ``None``: none.
    Never blocks, never raises for what the file holds."""
    path = run_dir / REQUEST_FILE
    data: Any = None
    try:
        data = read_json(path)
        return structure(data, Request, path)
    except FileNotFoundError:
        return None
    except DamagedFile as exc:
        ident = data.get("id") if isinstance(data, dict) else None
        try:
            valid(None, attrs.fields(Request).id, ident)
        except Exception:  # no id to answer to: the answer names none
            ident = None
        return BadRequest(ident if isinstance(ident, str) else "", str(exc))


def read_answers(run_dir: Path) -> tuple[Answer, ...]:
    """The answers kept in ``retime.answer.json``, newest first (none: absent).

    Raises:
        DamagedFile: it is not in its form.
    """
    path = run_dir / ANSWER_FILE
    try:
        data = read_json(path)
    except FileNotFoundError:
        return ()
    return (structure(data, Answer, path), *structure(data, _Earlier, path).earlier)


def read_answer(run_dir: Path, ident: str) -> Answer | None:
    """The run's answer to request ``ident`` (``None``: not yet, or the file is being
    replaced or damaged: the next look reads it again)."""
    try:
        found = read_answers(run_dir)
    except DamagedFile:
        return None
    return next((a for a in found if a.id == ident), None)


def write_answer(run_dir: Path, answer: Answer) -> None:
    """Store ``answer`` as the newest in ``retime.answer.json``, the few before it kept
    (``earlier``): a command that looks a moment late still finds its own."""
    try:
        kept = [a for a in read_answers(run_dir) if a.id != answer.id]
    except DamagedFile:  # ours to write: a damaged one is replaced
        kept = []
    write_json(run_dir / ANSWER_FILE, {**answer.to_dict(), "earlier": [
        a.to_dict() for a in kept[:KEEP_ANSWERS]]})


def read_history(run_dir: Path) -> History | None:
    """``retimes.json`` (``None``: absent).

    Raises:
        DamagedFile: it is not in its form (a resume cannot replay its retimes).
    """
    path = run_dir / HISTORY_FILE
    try:
        data = read_json(path, limit=MAX_HISTORY)
    except FileNotFoundError:
        return None
    return structure(data, History, path)


def write_history(run_dir: Path, history: History) -> None:
    """Store ``history`` as ``retimes.json``."""
    write_json(run_dir / HISTORY_FILE, history.to_dict())
