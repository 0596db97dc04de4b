"""Live retime: what may change in a running job, and the files that carry it.

``schedtrain retime RUN_DIR NEW`` (or ``trainer.retimer.retime(schedule)``) hands a new
schedule to a running job. The job applies it by the rules of a resume with
``--schedule-change apply`` (``planning.changes.carry``), except that it cannot build or
drop callback objects while it runs: a change that adds, removes or reorders callbacks,
or changes a callback's arguments, is refused with one line saying why (restart with
``--resume auto --schedule-change apply`` for those). Everything here is torch-free: the
command checks a request with the same rules the run applies.

Files in the run directory (each written atomically):

- ``retime.json``: the request, ``{"id", "schedule"}`` (canonical TOML); the run removes
  it once it has answered;
- ``retime.answer.json``: the run's answer, ``{"id", "status": "applied" | "unchanged" |
  "refused", "step", "epoch", "reason"}``;
- ``retimes.json``: every retime applied, ``{"base": TEXT, "applied": [{"step", "epoch",
  "schedule"}, ...]}``, so a resumed run (``--resume auto``) applies each again where it
  was applied: the run goes on exactly as it went.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

import attrs
import tomllib

from schedtrain.errors import Error, describe
from schedtrain.files import write_atomic

__all__ = ["ANSWER_FILE", "HISTORY_FILE", "REQUEST_FILE", "Applied", "History",
           "ScheduleChangeRefused",
           "live_refusal", "read_answer", "read_history", "read_request", "write_history",
           "write_json", "write_request"]

REQUEST_FILE: Final = "retime.json"
ANSWER_FILE: Final = "retime.answer.json"
HISTORY_FILE: Final = "retimes.json"


class ScheduleChangeRefused(Error, ValueError):
    """A retime the running job cannot take (the message says why)."""


def live_refusal(old: str, new: str) -> str | None:
    """Why a running job cannot take ``new`` in place of ``old`` (both canonical
    schedules), or ``None``: it can (only triggers change; the rules of
    ``--schedule-change apply`` say whose state is kept)."""
    a = tomllib.loads(old)
    b = tomllib.loads(new)
    ca, cb = a.get("callbacks", {}), b.get("callbacks", {})
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
    others = sorted(k for k in {*a, *b} if k not in ("callbacks", "triggers")
                    and a.get(k) != b.get(k))
    if others:
        return (f"the new schedule changes [{others[0]}]: a running job keeps it{restart}")
    return None


@attrs.frozen
class Applied:
    """One retime applied: after the ``step_end`` of ``step``, ``schedule`` took over."""

    step: int
    epoch: int
    schedule: str

    def to_dict(self) -> dict[str, Any]:
        """The JSON record."""
        return {"step": self.step, "epoch": self.epoch, "schedule": self.schedule}


@attrs.frozen
class History:
    """A run's retimes: its schedule at the start (``base``), then each one applied."""

    base: str
    applied: tuple[Applied, ...] = ()

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


def _read_json(path: Path) -> dict[str, Any] | None:
    """The JSON object at ``path`` (``None``: absent, unreadable or not an object)."""
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def write_request(run_dir: Path, schedule: str) -> str:
    """Hand ``schedule`` to the job running in ``run_dir``; returns the request's id."""
    ident = uuid.uuid4().hex
    write_json(run_dir / REQUEST_FILE, {"id": ident, "schedule": schedule})
    return ident


def read_request(run_dir: Path) -> tuple[str, str] | str | None:
    """The request waiting in ``run_dir``: ``(id, schedule)``, a line saying why it
    cannot be read, or ``None``: none."""
    path = run_dir / REQUEST_FILE
    if not path.exists():
        return None
    value = _read_json(path)
    if value is None:
        return f"{REQUEST_FILE} is not a JSON object (write it with `schedtrain retime`)"
    ident, text = value.get("id"), value.get("schedule")
    if not isinstance(ident, str) or not isinstance(text, str):
        return (f"{REQUEST_FILE}: expected string keys id and schedule, found id "
                f"{describe(ident)}, schedule {describe(text)}")
    return ident, text


def read_answer(run_dir: Path, ident: str) -> dict[str, Any] | None:
    """The run's answer to request ``ident`` (``None``: not yet)."""
    value = _read_json(run_dir / ANSWER_FILE)
    return value if value is not None and value.get("id") == ident else None


def read_history(run_dir: Path) -> History | None:
    """``retimes.json`` (``None``: absent or not in its form)."""
    value = _read_json(run_dir / HISTORY_FILE)
    if value is None or not isinstance(value.get("base"), str):
        return None
    try:
        applied = tuple(Applied(int(a["step"]), int(a["epoch"]), str(a["schedule"]))
                        for a in value.get("applied", []))
    except (TypeError, KeyError, ValueError):
        return None
    return History(value["base"], applied)


def write_history(run_dir: Path, history: History) -> None:
    """Store ``history`` as ``retimes.json``."""
    write_json(run_dir / HISTORY_FILE, history.to_dict())
