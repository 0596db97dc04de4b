"""The inbox: what reaches the loop from other threads and processes while it trains.

A signal (SIGTERM or SIGINT, ``[run] preempt_signals``), a cloud's preemption notice with
its deadline (``control.notice``'s polling thread), and a background checkpoint write
that ended each leave a note here and lower the loop's next due step (``limit``) to zero:
the step in progress finishes, the loop's one comparison leads it to the slow path, and
the slow path reads the note. There a preemption fires ``preempt``, writes a checkpoint
and raises ``Preempted``; a second SIGINT aborts at once (``KeyboardInterrupt``).

Schedulers (SLURM, Kubernetes, spot instances) send SIGTERM before they kill a job;
Ctrl-C sends SIGINT. The handlers are installed only in the main thread, and only while
``fit`` runs.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
import warnings
from collections.abc import Iterator, Sequence
from types import FrameType
from typing import Any

from schedtrain.distributed.comm import Comm
from schedtrain.spec.deadlines import SLURM_END, deadline_ns, resolve_deadline

__all__ = ["Inbox", "deadline_on_clock", "handle_signals"]

class Inbox:
    """The loop's next due step, and the requests that arrived for it from elsewhere.

    The loop compares its step with ``limit`` after every step. A signal or a notice
    (``requested``, with a notice's ``deadline``) sets ``limit = 0``, so that comparison
    leads to the slow path, where the request is read; a background checkpoint write that
    ended does the same through ``wake`` (``woken``), so the loop collects it (or its
    failure) at the next step.
    """

    __slots__ = ("deadline", "limit", "requested", "woken")

    def __init__(self) -> None:
        self.limit: float = 0
        self.requested: str | None = None
        self.woken = False
        #: a preemption notice's deadline (seconds since the epoch), until the loop's
        #: slow path gives it to the trigger table (``control.notice``)
        self.deadline: float | None = None

    def set_limit(self, limit: float) -> None:
        """Set the next due step, unless a stop was requested or a background save
        ended (then it stays 0)."""
        self.limit = limit
        if self.requested is not None or self.woken:  # set between the two lines: wins
            self.limit = 0

    def notice(self, source: str, deadline: float | None) -> None:
        """A preemption notice from ``source`` (called from its polling thread): stop as
        a signal does; ``deadline`` (``None``: not shared) goes to the triggers first."""
        self.deadline = deadline
        self.requested = self.requested or source
        self.limit = 0

    def take_deadline(self, time_ns: int) -> int | None:
        """The notice's deadline on the clock's axis (the clock at ``time_ns`` now),
        once."""
        found, self.deadline = self.deadline, None
        return None if found is None else deadline_ns(found, time_ns=time_ns, now=time.time())

    def wake(self) -> None:
        """Take the slow path at the next step (called from another thread)."""
        self.woken = True
        self.limit = 0


@contextlib.contextmanager
def handle_signals(inbox: Inbox,
                   signals: Sequence[signal.Signals] = (signal.SIGTERM, signal.SIGINT)
                   ) -> Iterator[None]:
    """Route ``signals`` (``[run] preempt_signals``) to ``inbox`` while the block runs
    (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if inbox.requested is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt  # the second Ctrl-C: stop now, no checkpoint
        inbox.requested = inbox.requested or name
        inbox.limit = 0

    previous: dict[signal.Signals, Any] = {}
    for sig in signals:
        previous[sig] = signal.signal(sig, on_signal)
    try:
        yield
    finally:
        for old, handler in previous.items():
            signal.signal(old, handler)


def deadline_on_clock(comm: Comm | None, time_ns: int, deadline: str | None) -> int | None:
    """A run's deadline on its clock's time axis (the clock at ``time_ns`` now),
    worked out on the chief so every rank counts down to the same point (one broadcast,
    only when a deadline is known somewhere), from ``[run] deadline`` and the
    scheduler's job end."""
    if comm is not None and not comm.is_chief:
        found = None
    else:
        start = time.time()
        try:
            end = resolve_deadline(deadline, start=start, env=os.environ)
        except ValueError as exc:  # the scheduler's value, not the user's: go on
            warnings.warn(f"{exc}; it is ignored", RuntimeWarning, stacklevel=3)
            end = resolve_deadline(deadline, start=start, env={})
        found = None if end is None else deadline_ns(end, time_ns=time_ns, now=time.time())
    if comm is not None and comm.size > 1 and (deadline is not None or SLURM_END in os.environ):
        found = comm.broadcast(found)
    return found
