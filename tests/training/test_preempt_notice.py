"""Cloud preemption notices (`[run] preempt_notice`): a local server answering as AWS's and
GCE's metadata servers serves a notice at a chosen moment of a real run, which then
checkpoints, commits and stops as a preemption, its deadline seen by `before_deadline`;
a server that is down or hangs never holds the loop up."""

from __future__ import annotations

import datetime as dt
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import structlog
import torch
from config_helpers import python_problem as _python_problem
from config_helpers import toml_problem as _toml_problem
from hypothesis import given
from hypothesis import strategies as st
from notice_server import NoticeServer
from training_helpers import Noop, tiny_model

from schedtrain import Schedule
from schedtrain.errors import Preempted
from schedtrain.spec.deadlines import check_notice, notice_source
from schedtrain.training import Trainer
from schedtrain.training.control.notice import POLL_ENV, TIMEOUT, NoticeWatcher
from schedtrain.triggers import before_deadline

FAST_POLL = "0.02"


class Batches:
    """``n`` fixed batches, each taking ``pause`` s to load; at batch ``at`` it calls
    ``then`` (serves the notice), so the loop is in its quiet steps when it comes."""

    def __init__(self, n: int, *, pause: float = 0.002, at: int | None = None,
                 then: Any = None) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 2, 3, generator=g)
        self.n, self.pause, self.at, self.then = n, pause, at, then

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for i in range(self.n):
            if i == self.at:
                self.then()
            time.sleep(self.pause)
            yield self.x[i], self.x[i].sum(1, keepdim=True)


def trainer(data: Batches, notice: str | None, run_dir: Path | None = None,
            **schedule: Any) -> Trainer:
    model, opt = tiny_model()
    return Trainer(model, opt, data, torch.nn.functional.mse_loss,
                   schedule=Schedule(schedule), bindings={k: Noop() for k in schedule},
                   max_epochs=1, preempt_notice=notice, run_dir=run_dir)


def fired(t: Trainer, name: str) -> list[int]:
    return [f.timestamp.step for f in t.firings if f.callback == name]


# -- the rule: which values are a notice source --------------------------------------------
@given(kind=st.sampled_from(["aws", "gce"]), scheme=st.sampled_from(["http", "https"]),
       host=st.from_regex(r"[a-z0-9]([a-z0-9.-]{0,20}[a-z0-9])?", fullmatch=True),
       port=st.integers(1, 65535), slash=st.booleans())
def test_a_server_url_is_read_as_its_cloud(kind: str, scheme: str, host: str, port: int,
                                           slash: bool) -> None:
    url = f"{scheme}://{host}:{port}"
    assert notice_source(f"{kind}+{url}{'/' if slash else ''}") == (kind, url)


@given(st.text(max_size=40).filter(
    lambda s: s not in ("aws", "gce") and not s.startswith(("aws+http", "gce+http"))))
def test_anything_else_is_refused_naming_the_key(value: str) -> None:
    """The rule refuses it saying what is expected (the words TOML and Python give)."""
    why = check_notice(value)
    assert why is not None and "'aws', 'gce'" in why


@pytest.mark.parametrize("value", ["azure", "http://127.0.0.1:9", "aws+ftp://h:1",
                                   "gce+http://h:1/path", "AWS", 5])
def test_bad_values_are_refused_by_toml_and_python(value: Any) -> None:
    shown = f'"{value}"' if isinstance(value, str) else str(value)
    toml = _toml_problem("preempt_notice", shown)
    assert toml is not None and toml.startswith("`preempt_notice`: ")
    assert "\n" not in toml
    assert _python_problem("preempt_notice", value) == toml


# -- the documented shapes -----------------------------------------------------------------
@given(when=st.datetimes(min_value=dt.datetime(2000, 1, 1), max_value=dt.datetime(2100, 1, 1)))
def test_an_aws_notice_time_is_its_deadline(when: dt.datetime) -> None:
    from schedtrain.training.control.notice import _when
    when = when.replace(microsecond=0, tzinfo=dt.timezone.utc)
    assert _when(when.strftime("%Y-%m-%dT%H:%M:%SZ")) == when.timestamp()


def test_aws_and_gce_answers() -> None:
    with NoticeServer() as server:
        aws, gce = NoticeWatcher(server.url("aws")), NoticeWatcher(server.url("gce"))
        assert aws.poll() is None and gce.poll() is None  # 404 / FALSE
        server.serve_notice(seconds_left=90)
        assert aws.poll() == int(server.deadline or 0)  # the notice's time, whole seconds
        before = time.time()
        first = gce.poll()
        assert first is not None and before + 30 <= first <= time.time() + 30
        assert gce.poll() == first  # 30 s from when it was first seen, not from each poll
        server.expire_token = True  # a 401: a new token, the same answer
        assert aws.poll() == int(server.deadline or 0) and server.tokens == 2


# -- the table: a deadline learned mid-run -------------------------------------------------
@given(margin=st.integers(1, 100), at=st.integers(1, 50), left=st.integers(-5, 200),
       earlier=st.one_of(st.none(), st.integers(1, 300)),
       nested=st.booleans())
def test_a_deadline_learned_mid_run_fires_before_deadline_as_if_known(
        margin: int, at: int, left: int, earlier: int | None, nested: bool) -> None:
    """One second a step; at step ``at`` a notice says ``left`` s remain (the run may
    already know an ``earlier`` deadline, which then stays). ``before_deadline`` fires at
    the first step end from ``at`` on with less than ``margin`` left of the earlier of the
    two, and once; nested in `any` alike; an every-10-steps sibling is untouched."""
    from schedtrain.clock import LoopClock
    from schedtrain.triggers import every
    now = [0]
    clock = LoopClock(time_source=lambda: now[0])
    trig = before_deadline(f"{margin} s")
    table = Schedule({"ckpt": trig | every("1000 steps") if nested else trig,
                      "tick": every("10 steps")}).compile(predicates={})
    table.deadline_ns = None if earlier is None else earlier * 10**9
    clock.start_train()
    table.attach(clock, None, predicates={})
    fired: dict[str, list[int]] = {"ckpt": [], "tick": []}
    for step in range(1, 120):
        now[0] = step * 10**9
        clock.end_batch()
        clock.end_step()
        if step == at:
            table.set_deadline((step + left) * 10**9)
        if clock.step >= table.step_due:
            for name in table.step_end():
                fired[name].append(step)
    notice = at + left
    deadline = notice if earlier is None else min(earlier, notice)
    expected = [s for s in range(1, 120) if deadline - s < margin
                and (s >= at or (earlier is not None and earlier - s < margin))]
    assert fired["ckpt"] == expected[:1]
    assert fired["tick"] == list(range(10, 120, 10))


# -- a real run ----------------------------------------------------------------------------
@pytest.mark.parametrize(("kind", "left"), [("aws", 45.0), ("gce", None)])
def test_a_notice_mid_run_checkpoints_commits_and_stops(
        kind: str, left: float | None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The notice (45 s left on AWS; GCE's 30 s) stops the run a few steps later with a
    committed checkpoint; `before_deadline = "60 s"` fires at that step, "20 s" does not."""
    monkeypatch.setenv(POLL_ENV, FAST_POLL)
    with NoticeServer() as server:
        data = Batches(20_000, at=10, then=lambda: server.serve_notice(left or 0))
        t = trainer(data, server.url(kind), tmp_path / "run",
                    soon=before_deadline("60 s"), late=before_deadline("20 s"))
        with pytest.raises(Preempted) as info:
            t.fit()
    stop = info.value
    assert stop.signal == f"the {kind.upper()} preemption notice"
    assert 10 <= stop.step < 20_000
    assert stop.checkpoint is not None and Path(stop.checkpoint).exists()
    assert t.outcome == "preempted"
    assert fired(t, "soon") == [stop.step] and fired(t, "late") == []


def test_without_a_notice_the_run_finishes(tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(POLL_ENV, FAST_POLL)
    with NoticeServer() as server:
        t = trainer(Batches(200), server.url("aws"), soon=before_deadline("60 s"))
        t.fit()
        assert server.requests > 2  # it was asked, and said no
    assert t.clock.step == 200 and fired(t, "soon") == []


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_server_that_is_down_is_logged_once_and_the_run_finishes(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(POLL_ENV, FAST_POLL)
    with structlog.testing.capture_logs() as logs:
        t = trainer(Batches(300), f"gce+http://127.0.0.1:{_closed_port()}")
        t.fit()
    assert t.clock.step == 300
    down = [e for e in logs if e["event"] == "preempt_notice_unreachable"]
    assert len(down) == 1 and "Connection refused" in down[0]["error"]


def test_a_hanging_server_never_holds_the_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every answer takes 30 s: the run's 400 steps (about a second) end long before one
    does, and the run ends without waiting for the request in flight."""
    monkeypatch.setenv(POLL_ENV, FAST_POLL)
    with NoticeServer(hang=True) as server:
        start = time.monotonic()
        t = trainer(Batches(400), server.url("aws"))
        t.fit()
        took = time.monotonic() - start
        assert server.requests >= 1  # the thread was waiting on it
    assert t.clock.step == 400 and took < 20
    assert not any(th.name == "schedtrain-notice" and th.is_alive() and not th.daemon
                   for th in threading.enumerate())


@pytest.mark.parametrize("kind", ["aws", "gce"])
def test_a_trickling_server_costs_one_timeout_a_poll(kind: str) -> None:
    """The first answer comes a byte every 50 ms for 10 s (no read waits long): the poll
    gives up after its timeout, for the whole of it, and the next one is answered."""
    with NoticeServer(trickle=10) as server:
        watcher = NoticeWatcher(server.url(kind), timeout=0.5)
        start = time.monotonic()
        with pytest.raises(TimeoutError, match=r"no whole answer within 0\.5 s"):
            watcher.poll()
        assert time.monotonic() - start < 2
        server.serve_notice(seconds_left=90)
        assert watcher.poll() is not None


def test_a_trickling_server_never_hides_a_later_notice(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Its first answer trickles for a minute; a notice served at step 10 still preempts
    the run within a poll's timeout or two."""
    monkeypatch.setenv(POLL_ENV, FAST_POLL)
    served: list[float] = []

    def serve() -> None:
        server.serve_notice(45)
        served.append(time.monotonic())

    with NoticeServer(trickle=60) as server:
        t = trainer(Batches(10_000, at=10, then=serve), server.url("aws"),
                    soon=before_deadline("60 s"))
        with pytest.raises(Preempted) as info:
            t.fit()
        took = time.monotonic() - served[0]
    assert took < 2 * TIMEOUT + 3, took
    assert fired(t, "soon") == [info.value.step]


# -- schedtrain train: exit 75, then --resume auto continues exactly -----------------------
@pytest.mark.slow
def test_train_preempted_by_a_notice_resumes_exactly(tmp_path: Path) -> None:
    """The commands are children forked from the test process (``jobs.forked``: torch
    imported once), polling the server this process serves from."""
    from jobs import forked
    from jobs.trials import compare, env, train, write_spec
    from test_requeue import _started
    with NoticeServer() as server:
        # 3 epochs, not 4: the lr schedule's change at epoch 2 still comes after the stop
        spec = write_spec(tmp_path, 3)
        text = spec.read_text().replace(
            "seed = 3\n", f'seed = 3\npreempt_notice = "{server.url("aws")}"\n')
        assert text != spec.read_text()
        spec.write_text(text)
        reference = tmp_path / "reference"
        assert train(spec, reference, resume=False, fork=True).returncode == 0
        run_dir = tmp_path / "run"
        cmd = ["train", str(spec), "--run-dir", str(run_dir), "--resume", "auto"]
        environ = {**env(0), POLL_ENV: FAST_POLL}
        proc = forked.schedtrain(cmd, cwd=spec.parent.parent, env=environ)
        _started(run_dir)
        server.serve_notice()
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 75, err
        assert any(x.startswith("preempted by the AWS preemption notice")
                   for x in err.splitlines()), err
        server.deadline = None  # the next machine has no notice
        again = forked.schedtrain(cmd, cwd=spec.parent.parent, env=environ)
        _, err = again.communicate(timeout=300)
    assert again.returncode == 0, err
    assert compare(reference, run_dir) == []
