"""The fuzzer's second fixture run (issue 41): ``jobs.fuzz`` without an ``every = "auto"``
saver, retimed live at step 3 (``retimes.json`` holds the applied change a resume
replays), preempted (SIGTERM) at step 10 on one process, resumed on two (two ranks forked, gloo:
the epoch's rest re-divided), and preempted there inside the same epoch by a cloud notice
a local metadata server serves (``[run] preempt_notice``). Its last checkpoint holds two
ranks' parts and an epoch division with a stretch done, so every case resumes it on one
process and re-divides the epoch's rest again. tests/fuzz_runs.py judges; this module
only makes it."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import torch
from fuzz_runs import run_cli, train_argv
from jobs.fuzz import FIXTURE, NOTICE_FLAG
from notice_server import NoticeServer
from torchrun_helpers import forked_ranks

from schedtrain.training.control.notice import POLL_ENV

#: The run: the crash job's model on 256 samples in batches of 2 (jobs.fuzz:make_task),
#: two epochs of 64 steps a rank.
SPEC = """\
[run]
task = "jobs.fuzz:make_task"
max_epochs = 2
seed = 5
preempt_notice = "{notice}"

[callbacks.ask]
type = "jobs.fuzz:AskRetime"
spec = "new.toml"
trigger = {{ at = "3 steps" }}

[callbacks.preempt]
type = "jobs.fuzz:Preempt"
trigger = {{ at = "{preempt} steps" }}

[callbacks.notice]
type = "jobs.fuzz:AskNotice"
trigger = {{ at = "{at} steps" }}

[callbacks.validate]
type = "InferenceRunner"
trigger = {validate}

[callbacks.save]
type = "ModelSaver"
keep = {{ any = [{{ latest = 2 }}, {{ every = "10 steps" }}] }}
trigger = {{ any = [{{ every = "{save}" }}, {{ on = "train_end" }}] }}
"""
OLD = {"validate": '{ every = "1 epoch" }', "save": "5 steps"}
#: The retime saves every 8 steps, not 5: a resume (each case's, 170 steps) writes 21
#: checkpoints, not 42 at every 4 (most of its time).
NEW = {"validate": '{ any = [{ every = "1 epoch" }, { every = "9 steps" }] }',
       "save": "8 steps"}
#: One process trains steps 1 to 10 (a stretch of 20 samples) and is preempted; two
#: share the epoch's rest (59 steps a rank: the epoch ends at step 69). The notice is
#: asked for at step 20; the notice thread (polling every 0.02 s here) sees it within
#: the step, at the next check step (every 16 on several processes: 32) the ranks agree
#: to stop at 34, so at the check step after: 48, inside the epoch.
PREEMPT_AT = 10
NOTICE_AT = 20


@contextlib.contextmanager
def _environ(**values: str) -> Iterator[None]:
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _serve_on_flag(server: NoticeServer, flag: Path, stop: threading.Event) -> None:
    while not stop.is_set():
        if flag.exists():
            server.serve_notice(120.0)
            return
        time.sleep(0.005)


def _hold(port: int) -> socket.socket | None:
    """A socket bound (not listening) to ``port``: a resume's notice thread is refused
    there at once, and no other server can take the port while the cases run (None
    where something took it first: then the cases would show it)."""
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        s.bind(("127.0.0.1", port))
    except OSError:
        s.close()
        return None
    return s


@contextlib.contextmanager
def notice_fixture(folder: Path, *, outside: str = "outside.txt") -> Iterator[Path]:
    """A case folder (``old.toml``, ``new.toml``, ``outside.txt``, ``run/``) holding the
    two-process run retimed live and preempted by a notice; the notice server's port
    stays held (refusing connections) until the context ends."""
    folder.mkdir(parents=True)
    (folder / outside).write_text("a user's notes\n")
    run_dir = folder / "run"
    with NoticeServer() as server:
        url = server.url("aws")
        for name, values in (("old.toml", OLD), ("new.toml", NEW)):
            (folder / name).write_text(SPEC.format(notice=url, preempt=PREEMPT_AT,
                                                    at=NOTICE_AT, **values))
        stop = threading.Event()
        watcher = threading.Thread(target=_serve_on_flag, daemon=True,
                                   args=(server, folder / NOTICE_FLAG, stop))
        watcher.start()
        try:
            env = {FIXTURE: "1", POLL_ENV: "0.02"}
            first = run_cli(train_argv(folder), folder, deadline=300, env=env)
            if first.code != 75:
                raise AssertionError("the notice fixture's first process was not preempted"
                                     f" (exit {first.code}):\n{first.stderr[-3000:]}")
            with _environ(**env):
                got = forked_ranks(folder / "old.toml", run_dir, "--resume", "auto",
                                   timeout=300)
        finally:
            stop.set()
            watcher.join()
    held = _hold(server.port)
    try:
        _check(run_dir, got.stderr)
        yield folder
    finally:
        if held is not None:
            held.close()


def _check(run_dir: Path, stderr: str) -> None:
    """The fixture is what the fuzzer needs: preempted by the notice inside the first
    epoch, with the retime applied and the last checkpoint divided between two ranks."""
    def fail(why: str) -> AssertionError:
        return AssertionError(f"the notice fixture {why}:\n{stderr[-3000:]}")

    if "preempted by the AWS preemption notice" not in stderr:
        raise fail("was not preempted by the notice")
    if json.loads((run_dir / "run.json").read_text()).get("status") != "preempted":
        raise fail("did not record its preemption")
    journal = json.loads((run_dir / "retimes.json").read_text())
    if not journal.get("applied"):
        raise fail(f"has no applied retime: {journal}")
    last = max((run_dir / "checkpoints").glob("step-*.pt"))
    state = torch.load(last, weights_only=True)
    step = state["run"]["clock"]["now"]["step"]
    split = state["run"]["data"].get("split", {})
    if state["phase"] != "preempt" or not state["run"].get("epoch_open"):
        raise fail(f"did not end in a preemption checkpoint inside an epoch ({last.name})")
    if len(state["run"].get("ranks", ())) != 2 or split.get("done") != [[1, PREEMPT_AT]]:
        raise fail(f"holds no two ranks' parts after a stretch on one ({last.name}: "
                   f"step {step}, split {split})")
