"""Cloud preemption notices (``[run] preempt_notice``): a daemon thread polls the
metadata server and, when a notice is served, asks the loop to preempt as a signal does.

AWS (IMDSv2): ``PUT /latest/api/token`` for a session token, then
``GET /latest/meta-data/spot/instance-action``: 404 while there is no notice, then
``{"action": "terminate", "time": "2026-11-27T15:02:00Z"}``, whose time is the deadline.
GCE: ``GET /computeMetadata/v1/instance/preempted`` (``Metadata-Flavor: Google``):
``FALSE``, then ``TRUE``; the deadline is 30 s after it was first seen. ``aws+URL`` and
``gce+URL`` ask another server the same paths (a proxy, a test's server).

The loop reads only what the thread sets (``Inbox.notice``: the next step takes the slow
path), so quiet steps cost nothing; each poll has a short timeout for all of it (a
watchdog cuts the connection when it is over, so a server that trickles its answer a byte
at a time costs what one that hangs does), and a server that is down, refuses, hangs or
trickles delays only the thread. Failures are logged once, not per poll.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import http.client
import os
import socket
import threading
import time
import urllib.parse
from collections.abc import Iterator
from typing import Final

from schedtrain.distributed.comm import Comm
from schedtrain.logs import get_logger
from schedtrain.readback import parse_json, printable
from schedtrain.spec.deadlines import notice_source
from schedtrain.training.control.inbox import Inbox
from schedtrain.training.control.notice_lines import notice_line, reachable_line, unreachable_line
from schedtrain.urls import redact, redact_text

__all__ = ["DEFAULT_POLL", "GCE_NOTICE", "POLL_ENV", "NoticeWatcher", "watch_notices"]

_log = get_logger("schedtrain.training")

#: Seconds between polls (AWS and GCE update their notices about this often).
DEFAULT_POLL: Final = 5.0
#: The environment variable that overrides ``DEFAULT_POLL`` (seconds; meant for tests).
POLL_ENV: Final = "SCHEDTRAIN_PREEMPT_POLL"
#: A GCE preemption's warning, in seconds: its deadline after ``preempted`` turns ``TRUE``.
GCE_NOTICE: Final = 30.0
#: Seconds one poll may take, all its requests together, however the server answers: a
#: hanging or trickling server costs the thread this a poll, never the loop.
TIMEOUT: Final = 2.0
_AWS_TOKEN: Final = "/latest/api/token"
_AWS_ACTION: Final = "/latest/meta-data/spot/instance-action"
_GCE_PREEMPTED: Final = "/computeMetadata/v1/instance/preempted"


def poll_interval() -> float:
    """``POLL_ENV``'s seconds, else ``DEFAULT_POLL``."""
    raw = os.environ.get(POLL_ENV, "").strip()
    try:
        value = float(raw) if raw else DEFAULT_POLL
    except ValueError:
        raise ValueError(f"environment variable {POLL_ENV}={raw!r}: expected seconds "
                         "such as 5 or 0.1") from None
    if not value > 0:
        raise ValueError(f"environment variable {POLL_ENV}={raw!r}: expected seconds > 0")
    return value


def _when(text: str) -> float:
    """An AWS notice's ISO time (``...Z``, which ``fromisoformat`` reads only from 3.11)."""
    text = text.strip()
    when = dt.datetime.fromisoformat(text[:-1] + "+00:00" if text.endswith("Z") else text)
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.timezone.utc)
    return when.timestamp()


class _HTTPStatus(OSError):
    """A metadata server's answer other than 200 (``code``)."""

    def __init__(self, code: int, path: str) -> None:
        super().__init__(f"HTTP {code} for {path}")
        self.code = code


class NoticeWatcher:
    """Asks one metadata server whether a preemption notice is out.

    Args:
        value: ``[run] preempt_notice`` (checked).
        timeout: seconds a request may take.
    """

    def __init__(self, value: str, *, timeout: float = TIMEOUT) -> None:
        self.kind, self.server = notice_source(value)
        self.timeout = timeout
        #: what ``Inbox.requested`` and ``Preempted`` name
        self.source = f"the {self.kind.upper()} preemption notice"
        self._token: str | None = None
        self._seen: float | None = None  # when GCE's flag was first seen TRUE
        self._until = 0.0  # when the poll in progress must end (time.monotonic)

    def _get(self, path: str, headers: dict[str, str], method: str = "GET") -> bytes:
        """The body of a 200 answer, within what is left of the poll's timeout.

        Raises:
            _HTTPStatus: another status; OSError: no whole answer in time (``TimeoutError``)
            or none at all.
        """
        left = self._until - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"no whole answer within {self.timeout:g} s")
        url = urllib.parse.urlsplit(self.server)
        kind = (http.client.HTTPSConnection if url.scheme == "https"
                else http.client.HTTPConnection)
        conn = kind(url.hostname or "", url.port, timeout=left)
        # A timeout bounds each read, not the answer: the watchdog shuts the socket down
        # when the poll's time is over, which ends any read in progress.
        cut = threading.Event()

        def watchdog() -> None:
            cut.set()
            if (sock := conn.sock) is not None:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

        timer = threading.Timer(left, watchdog)
        timer.daemon = True
        timer.start()
        try:
            conn.connect()
            # Over before there was a socket to shut down (a TLS handshake is bounded by
            # the per-read timeout only): end here.
            if cut.is_set():
                raise TimeoutError
            conn.request(method, path, headers=headers)
            response = conn.getresponse()
            body = response.read()
            if cut.is_set():  # an answer cut short can look whole
                raise TimeoutError
        except (OSError, http.client.HTTPException):
            if cut.is_set():
                raise TimeoutError(f"no whole answer within {self.timeout:g} s") from None
            raise
        finally:
            timer.cancel()
            conn.close()
        if response.status != 200:
            raise _HTTPStatus(response.status, path)
        return body

    def poll(self) -> float | None:
        """The deadline (seconds since the epoch) of a notice served now; ``None``: none.

        Raises:
            OSError, ValueError: the server did not answer, or not as documented.
        """
        self._until = time.monotonic() + self.timeout
        return self._aws() if self.kind == "aws" else self._gce()

    def _aws(self) -> float | None:
        for attempt in (1, 2):
            if self._token is None:
                self._token = self._get(_AWS_TOKEN, {
                    "X-aws-ec2-metadata-token-ttl-seconds": "21600"}, "PUT").decode()
            try:
                body = self._get(_AWS_ACTION, {"X-aws-ec2-metadata-token": self._token})
            except _HTTPStatus as exc:
                if exc.code == 404:
                    return None  # no notice
                if exc.code == 401 and attempt == 1:  # the token expired: a new one
                    self._token = None
                    continue
                raise
            # The answer is read back as a file is: a crafted one is refused, not recursed.
            notice = parse_json(body, redact(self.server) + _AWS_ACTION)
            if not isinstance(notice, dict) or not isinstance(notice.get("time"), str):
                raise ValueError(f"expected {{'action': ..., 'time': ...}}, got {body[:200]!r}")
            return _when(notice["time"])
        raise AssertionError("unreachable")  # pragma: no cover

    def _gce(self) -> float | None:
        body = self._get(_GCE_PREEMPTED, {"Metadata-Flavor": "Google"}).decode().strip()
        if body not in ("TRUE", "FALSE"):
            raise ValueError(f"expected TRUE or FALSE, got {body[:200]!r}")
        if body == "FALSE":
            return None
        if self._seen is None:
            self._seen = time.time()
        return self._seen + GCE_NOTICE

    def run(self, inbox: Inbox, stop: threading.Event, interval: float,
            share_deadline: bool) -> None:
        """Poll every ``interval`` s until ``stop`` or a notice, which goes to ``inbox``
        (its deadline only when ``share_deadline``)."""
        failing = False
        while not stop.is_set():
            try:
                deadline = self.poll()
            # Any failure (refused, timed out, a bad answer) is the server's: the thread
            # keeps polling, since the run must not lose its notices to one bad answer.
            except Exception as exc:
                if not failing:
                    error = printable(redact_text(f"{type(exc).__name__}: {exc}"))[:300]
                    _log.warning("preempt_notice_unreachable", server=redact(self.server),
                                 error=error, line=unreachable_line(
                                     self.kind, redact(self.server), error))
                failing = True
            else:
                if failing:
                    _log.info("preempt_notice_reachable", server=redact(self.server),
                              line=reachable_line(self.kind, redact(self.server)))
                failing = False
                if deadline is not None and not stop.is_set():
                    _log.warning("preempt_notice", source=self.source, deadline=dt.datetime
                                 .fromtimestamp(deadline, dt.timezone.utc).isoformat(),
                                 line=notice_line(self.kind, deadline, time.time()))
                    inbox.notice(self.source, deadline if share_deadline else None)
                    return
            stop.wait(interval)


@contextlib.contextmanager
def watch_notices(inbox: Inbox, value: str | None, comm: Comm | None) -> Iterator[None]:
    """Poll ``value``'s server (``[run] preempt_notice``; ``None``: nothing) while the
    block runs, on one process per machine (``LOCAL_RANK`` 0).

    On several processes a notice preempts every rank (the ranks agree on a step, as for a
    signal); its deadline reaches ``before_deadline`` only on one process, where no rank
    can decide otherwise."""
    if value is None or os.environ.get("LOCAL_RANK", "0") != "0":
        yield
        return
    stop = threading.Event()
    share = comm is None or comm.size <= 1
    thread = threading.Thread(target=NoticeWatcher(value).run, name="schedtrain-notice",
                              args=(inbox, stop, poll_interval(), share), daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()  # not joined: a request in flight may hang up to TIMEOUT; it is a daemon
