"""A run's deadline and its preemption signals: reading ``[run] deadline``,
``SLURM_JOB_END_TIME`` and ``[run] preempt_signals``.

``[run] preempt_notice`` names a cloud metadata endpoint to poll for a preemption notice
(``"aws"``, ``"gce"``, or ``"aws+http://host:port"``/``"gce+http://host:port"``: the same
paths on another server); ``training.control.notice`` polls it.

A deadline is a wall-clock time (seconds since the epoch). ``[run] deadline`` is an ISO
time (``2026-11-26T09:00+00:00``; without an offset, the machine's local time) or a
duration from the start of this process's training (``"23 h"``: each requeued job gets its
own). SLURM exports the job's projected end as ``SLURM_JOB_END_TIME`` (a Unix time);
when both are known the earlier wins: neither can be outlived, and a spec written
for a 24 h allocation stays right in a job granted less.
"""

from __future__ import annotations

import datetime as dt
import re
import signal
import urllib.parse
from collections.abc import Mapping, Sequence
from typing import Final

from schedtrain.errors import describe
from schedtrain.time import Time
from schedtrain.urls import redact

__all__ = ["DEFAULT_SIGNALS", "NOTICE_SERVERS", "SLURM_END", "check_deadline", "check_notice",
           "check_signals", "deadline_ns", "notice_source", "resolve_deadline", "signals_of"]

#: The signals that preempt a run unless ``[run] preempt_signals`` says otherwise.
DEFAULT_SIGNALS: Final = ("SIGTERM", "SIGINT")
#: The environment variable SLURM sets to the job's projected end (a Unix time).
SLURM_END: Final = "SLURM_JOB_END_TIME"
_UNCATCHABLE: Final = ("SIGKILL", "SIGSTOP")
#: Each cloud's metadata server, where ``[run] preempt_notice = "aws"``/``"gce"`` looks.
NOTICE_SERVERS: Final = {"aws": "http://169.254.169.254",
                         "gce": "http://metadata.google.internal"}
_NOTICE_URL: Final = re.compile(r"(?P<kind>aws|gce)\+(?P<url>https?://[^/?#\s]+)/?")


def _parse(value: str, start: float) -> float:
    try:
        left = Time.parse(value)
    except ValueError:
        left = None
    if left is not None:
        if not left.unit.is_time:
            raise ValueError(f"a deadline is a duration such as '23 h', not {left}")
        return start + left.base / 1e9
    try:
        return dt.datetime.fromisoformat(value).timestamp()
    except ValueError:
        raise ValueError(f"invalid deadline {value!r}: expected an ISO time such as "
                         "'2026-11-26T09:00+00:00' or a duration such as '23 h'") from None


def check_deadline(value: object) -> str | None:
    """Why ``value`` is not a deadline (``None``: it is one)."""
    if not isinstance(value, str):
        return f"expected an ISO time or a duration such as '23 h', got {value!r}"
    try:
        _parse(value, 0.0)
    except ValueError as exc:
        return str(exc)
    return None


def resolve_deadline(value: str | None, *, start: float,
                     env: Mapping[str, str]) -> float | None:
    """The run's deadline (seconds since the epoch), the earlier of ``value`` (from
    ``start``) and the scheduler's job end in ``env``; ``None`` when neither is known."""
    found: list[float] = []
    if value is not None:
        found.append(_parse(value, start))
    raw = env.get(SLURM_END, "").strip()
    if raw:
        try:
            found.append(float(int(raw)))
        except ValueError:
            raise ValueError(f"environment variable {SLURM_END}={raw!r}: expected a Unix "
                             "time (whole seconds)") from None
    return min(found) if found else None


def deadline_ns(deadline: float, *, time_ns: int, now: float) -> int:
    """Where ``deadline`` falls on the clock's ``time_ns`` axis, read at wall time ``now``
    with the clock at ``time_ns``."""
    return time_ns + round((deadline - now) * 1e9)


def check_signals(names: object) -> str | None:
    """Why ``names`` is not a list of signals that can preempt (``None``: it is)."""
    if not isinstance(names, list | tuple) or not names:
        return f"expected a non-empty list such as ['SIGTERM', 'SIGUSR1'], got {names!r}"
    for name in names:
        if not isinstance(name, str) or name not in signal.Signals.__members__:
            return f"{name!r} is not a signal name such as 'SIGTERM' or 'SIGUSR1'"
        if name in _UNCATCHABLE:
            return f"{name} cannot be caught, so it cannot preempt a run"
    return None


def signals_of(names: Sequence[str]) -> tuple[signal.Signals, ...]:
    """The signals named (checked with ``check_signals`` first)."""
    return tuple(signal.Signals[n] for n in dict.fromkeys(names))


def notice_source(value: str) -> tuple[str, str]:
    """The cloud (``"aws"`` or ``"gce"``) and server of ``[run] preempt_notice``.

    Raises:
        ValueError: ``value`` is neither a cloud's name nor ``aws+URL``/``gce+URL`` with a
            host and a port within 1..65535 and no credentials (shown redacted).
    """
    if value in NOTICE_SERVERS:
        return value, NOTICE_SERVERS[value]
    shown = redact(value)
    match = _NOTICE_URL.fullmatch(value)
    if match is None:
        raise ValueError(f"expected 'aws', 'gce', or a server answering as one of them, "
                         f"'aws+http://HOST:PORT' or 'gce+http://HOST:PORT', got {shown!r}")
    parts = urllib.parse.urlsplit(match["url"])
    if "@" in parts.netloc:
        raise ValueError(f"{shown!r} holds credentials in the URL, which would be printed "
                         "and stored; a metadata server takes none: give 'aws+http://HOST:PORT'")
    try:
        port = parts.port
    except ValueError:
        port = 0
    if port == 0 or not parts.hostname:
        raise ValueError(f"{shown!r}: expected a host and a port from 1 to 65535, "
                         "'aws+http://HOST:PORT'")
    return match["kind"], match["url"]


def check_notice(value: object) -> str | None:
    """Why ``value`` is not a ``preempt_notice`` (``None``: it is one)."""
    if not isinstance(value, str):
        return f"expected 'aws', 'gce', 'aws+http://HOST:PORT' or 'gce+http://HOST:PORT', " \
               f"got {describe(value)}"
    try:
        notice_source(value)
    except ValueError as exc:
        return str(exc)
    return None
