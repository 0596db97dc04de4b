"""A local cloud metadata server for preemption notices, in a thread: AWS's IMDSv2
(`PUT /latest/api/token`, then `GET /latest/meta-data/spot/instance-action`: 404, then
`{"action": "terminate", "time": "...Z"}`) and GCE's
(`GET /computeMetadata/v1/instance/preempted` with `Metadata-Flavor: Google`: `FALSE`,
then `TRUE`), as their documentation gives them. Used by tests/test_preempt_notice.py
and benchmarks/bench_preempt_notice.py."""

from __future__ import annotations

import datetime as dt
import http.server
import json
import threading
import time
from pathlib import Path
from typing import Any

TOKEN = "local-token"
#: Seconds between the bytes of a trickled answer.
TRICKLE_GAP = 0.05
#: Seconds between the serving thread's looks at a shutdown request: ``shutdown()`` (each
#: ``with`` block's end) waits for the next look, half a second by the standard library's
#: default, in every test that serves a notice.
SHUTDOWN_LOOK = 0.005


class NoticeServer:
    """Serves no notice until ``serve_notice()``; ``hang`` makes every answer take 30 s;
    ``trickle`` sends the first answer a byte at a time, every ``TRICKLE_GAP`` s, so that
    it takes that many seconds (no read ever waits long: a per-read timeout never ends it).

    Attributes:
        deadline: the AWS notice's ``time`` (seconds since the epoch), set by
            ``serve_notice``.
        served_at: when the first answer holding a notice went out (``None``: not yet).
        requests: the number of requests answered (or hung on).
        expire_token: answer the next instance-action request 401 (an expired token).
    """

    def __init__(self, *, hang: bool = False, trickle: float = 0.0) -> None:
        self.hang = hang
        self.trickle = trickle
        self._closed = threading.Event()
        self.deadline: float | None = None
        self.noticed_at: float | None = None
        self.served_at: float | None = None
        self.requests = 0
        self.expire_token = False
        self.tokens = 0
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:  # quiet
                pass

            def do_PUT(self) -> None:
                owner._answer(self, "PUT")

            def do_GET(self) -> None:
                owner._answer(self, "GET")

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        args=(SHUTDOWN_LOOK,), daemon=True)

    def url(self, kind: str) -> str:
        """``[run] preempt_notice`` for this server answering as ``kind``."""
        return f"{kind}+http://127.0.0.1:{self.port}"

    def __enter__(self) -> NoticeServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._closed.set()  # a trickle in progress stops
        self._server.shutdown()
        self._server.server_close()

    def serve_notice(self, seconds_left: float = 120.0) -> None:
        """From now on, serve a notice whose (AWS) deadline is ``seconds_left`` away."""
        now = time.time()
        self.deadline = now + seconds_left
        self.noticed_at = now

    def _answer(self, handler: http.server.BaseHTTPRequestHandler, method: str) -> None:
        self.requests += 1
        if self.hang:
            time.sleep(30)
        path, headers = handler.path, handler.headers
        status, body = 404, b""
        if method == "PUT" and path == "/latest/api/token":
            if headers.get("X-aws-ec2-metadata-token-ttl-seconds"):
                self.tokens += 1
                status, body = 200, TOKEN.encode()
            else:
                status = 400
        elif method == "GET" and path == "/latest/meta-data/spot/instance-action":
            if headers.get("X-aws-ec2-metadata-token") != TOKEN or self.expire_token:
                self.expire_token = False
                status = 401
            elif self.deadline is not None:
                when = dt.datetime.fromtimestamp(self.deadline, dt.timezone.utc)
                status, body = 200, json.dumps({
                    "action": "terminate",
                    "time": when.strftime("%Y-%m-%dT%H:%M:%SZ")}).encode()
        elif method == "GET" and path == "/computeMetadata/v1/instance/preempted":
            if headers.get("Metadata-Flavor") != "Google":
                status = 403
            else:
                status, body = 200, b"TRUE" if self.deadline is not None else b"FALSE"
        if status == 200 and self.deadline is not None and path != "/latest/api/token" \
                and self.served_at is None:
            self.served_at = time.time()
        handler.send_response(status)
        handler.send_header("Content-Length", str(len(body)))
        trickle, self.trickle = self.trickle, 0.0  # the first answer only
        if trickle:
            # a header of one byte per gap: the answer is whole only after `trickle` s
            handler.flush_headers()
            for i in range(int(trickle / TRICKLE_GAP)):
                if self._closed.wait(TRICKLE_GAP):
                    return
                handler.wfile.write(b"x" if i else b"X-Padding: x")
            handler.wfile.write(b"\r\n")
        handler.end_headers()
        handler.wfile.write(body)


def wait_for_file(path: Path, timeout: float = 120) -> None:
    """Wait until ``path`` exists and is not empty."""
    end = time.monotonic() + timeout
    while not (path.exists() and path.stat().st_size > 0):
        if time.monotonic() > end:
            raise AssertionError(f"{path.name} did not appear")
        time.sleep(0.02)
