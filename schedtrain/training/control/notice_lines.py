"""The lines a cloud preemption notice's poller says, in the plain style of the command
line's other lines (``resumed from ...``, ``preempted by ...``).

Each is logged as a structlog event whose ``line`` field holds the sentence: the command
line prints that sentence alone (``cli.main``'s renderer), a program's own structlog
configuration keeps the event's name and fields.
"""

from __future__ import annotations

import datetime as dt
from typing import Final

__all__ = ["notice_line", "reachable_line", "unreachable_line"]

#: What each cloud serves, as the notice line names it.
_NOTICES: Final = {"aws": "AWS spot instance-action", "gce": "GCE instance/preempted"}


def notice_line(kind: str, deadline: float, now: float) -> str:
    """``notice: AWS spot instance-action, deadline 21:36:54 UTC (120 s)``: the notice of
    ``kind``'s server, its ``deadline`` (seconds since the epoch) and the time left then."""
    at = dt.datetime.fromtimestamp(deadline, dt.timezone.utc).strftime("%H:%M:%S")
    what = _NOTICES.get(kind, f"{kind} preemption notice")
    return f"notice: {what}, deadline {at} UTC ({max(deadline - now, 0.0):.0f} s)"


def unreachable_line(kind: str, server: str, error: str) -> str:
    """The one line for a server that stopped answering (``server`` redacted, ``error``
    printable): the poller keeps asking, and says nothing more until it answers."""
    return (f"notice: the {kind.upper()} notice server {server} does not answer "
            f"({error}); still polling, said once")


def reachable_line(kind: str, server: str) -> str:
    """The line for a server that answers again after ``unreachable_line``."""
    return f"notice: the {kind.upper()} notice server {server} answers again"
