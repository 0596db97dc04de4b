"""E10: what `schedtrain train` says about a cloud preemption notice is said as its other
lines are (`resumed from ...`, `preempted by ...`): one plain sentence, no structlog
`[warning  ] preempt_notice key=value` line; the events keep their names and fields for a
program's own logging."""

from __future__ import annotations

import datetime as dt
import re
import socket
import threading
from pathlib import Path

import pytest
import structlog

from schedtrain.cli import main
from schedtrain.training.control.notice import POLL_ENV
from schedtrain.training.control.notice_lines import notice_line, unreachable_line
from tests.notice_server import NoticeServer

FAST_POLL = "0.02"


def _spec(tmp_path: Path, notice: str, steps: int) -> Path:
    spec = tmp_path / "job.toml"
    spec.write_text(f'[run]\ntask = "tests.jobs.crash:make_task"\nmax_steps = {steps}\n'
                    f'run_dir = "{tmp_path / "run"}"\npreempt_notice = "{notice}"\n\n'
                    '[callbacks.checkpoint]\ntype = "ModelSaver"\n'
                    'trigger = { every = "50 steps" }\n')
    return spec


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _structlog_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("[") or "preempt_notice" in line]


@pytest.mark.parametrize(("kind", "what"), [("aws", "AWS spot instance-action"),
                                             ("gce", "GCE instance/preempted")])
def test_a_notice_is_one_plain_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                    monkeypatch: pytest.MonkeyPatch, kind: str, what: str
                                    ) -> None:
    """The notice: `notice: AWS spot instance-action, deadline HH:MM:SS UTC (N s)`, the
    deadline the server's (GCE: 30 s after it was first seen), then the preemption."""
    monkeypatch.setenv(POLL_ENV, FAST_POLL)
    monkeypatch.setenv("CRASH_JOB_STEP_SECONDS", "0.01")
    with NoticeServer() as server:
        server.serve_notice(seconds_left=100)
        code = main(["train", str(_spec(tmp_path, server.url(kind), 3000))])
    err = capsys.readouterr().err
    assert code == 75, err
    [line] = [x for x in err.splitlines() if x.startswith("notice:")]
    found = re.fullmatch(rf"notice: {what}, deadline (\d\d:\d\d:\d\d) UTC \((\d+) s\)", line)
    assert found, line
    left = int(found[2])
    if kind == "aws":
        assert server.deadline is not None
        at = dt.datetime.fromtimestamp(server.deadline, dt.timezone.utc)
        assert found[1] == at.strftime("%H:%M:%S") and 90 <= left <= 100
    else:
        assert 20 <= left <= 30
    assert _structlog_lines(err) == [], err
    assert "preempted by the " in err


def test_an_unreachable_server_is_one_plain_line_once(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A server that refuses every poll: one `notice: ... does not answer (...)` line for
    the whole run, which finishes."""
    monkeypatch.setenv(POLL_ENV, FAST_POLL)
    monkeypatch.setenv("CRASH_JOB_STEP_SECONDS", "0.01")
    server = f"http://127.0.0.1:{_closed_port()}"
    code = main(["train", str(_spec(tmp_path, f"aws+{server}", 100))])
    err = capsys.readouterr().err
    assert code == 0, err
    lines = [x for x in err.splitlines() if x.startswith("notice:")]
    assert len(lines) == 1, err
    assert lines[0].startswith(f"notice: the AWS notice server {server} does not answer (")
    assert "Connection refused" in lines[0] and lines[0].endswith("); still polling, said once")
    assert _structlog_lines(err) == [], err


def test_the_events_keep_their_names_and_fields(monkeypatch: pytest.MonkeyPatch) -> None:
    """A program's own structlog sees `preempt_notice_unreachable` with its server and
    error, and the line beside them."""
    from schedtrain.training.control.inbox import Inbox
    from schedtrain.training.control.notice import NoticeWatcher

    monkeypatch.setenv(POLL_ENV, FAST_POLL)
    server = f"http://127.0.0.1:{_closed_port()}"
    watcher, stop = NoticeWatcher(f"gce+{server}"), threading.Event()
    with structlog.testing.capture_logs() as logs:
        thread = threading.Thread(target=watcher.run, args=(Inbox(), stop, 0.01, True))
        thread.start()
        stop.wait(0.3)
        stop.set()
        thread.join()
    [event] = [e for e in logs if e["event"] == "preempt_notice_unreachable"]
    assert event["server"] == server and "Connection refused" in event["error"]
    assert event["line"] == unreachable_line("gce", server, event["error"])


def test_the_notice_line_counts_down_from_now() -> None:
    """The seconds are the deadline's distance from when the notice was seen, never
    negative."""
    deadline = dt.datetime(2026, 11, 28, 21, 36, 54, tzinfo=dt.timezone.utc).timestamp()
    assert notice_line("aws", deadline, deadline - 120) == \
        "notice: AWS spot instance-action, deadline 21:36:54 UTC (120 s)"
    assert notice_line("gce", deadline, deadline + 5).endswith("21:36:54 UTC (0 s)")
