"""Run control in Ignite (``attach_schedule(..., control=HostControl(...))``): a live
retime (the Python API, the request file, the real ``schedtrain retime`` command) fires
as ``continue_with`` says and rides in Ignite's ``Checkpoint``; a cloud notice or a
SIGTERM is saved through ``Checkpoint``, exits 75 with one line, and the Ignite resume
equals the uninterrupted run (firings and final weights); ``before_deadline`` fires from a
notice's deadline; the run control is closed however the run ends."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("ignite")
from fork_cli import fork_script
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from ignite.engine import Engine, Events
from ignite.handlers import Checkpoint, DiskSaver
from jobs.ignite_job import BATCHES, EPOCHS, Run, build, data, resume, schedule
from notice_server import NoticeServer

import schedtrain.training.control.retime as live
from schedtrain import Schedule, at, every, on, simulate
from schedtrain.integrations.host_control import HostControl, HostPreempted
from schedtrain.integrations.ignite import attach_schedule
from schedtrain.planning.changes import canonical
from schedtrain.planning.requests import write_request
from schedtrain.training.control.notice import POLL_ENV
from schedtrain.triggers import Trigger

JOB = Path(__file__).resolve().parents[1] / "jobs" / "ignite_job.py"
STEPS = BATCHES * EPOCHS
Fired = list[tuple[str, str, int]]


def predicted(a: Schedule, b: Schedule, step: int) -> Fired:
    log = simulate(a, epochs=EPOCHS, steps_per_epoch=BATCHES).continue_with(b, at=step)
    return [(f.callback, f.event, f.step) for f in log]


def run_json(run_dir: Path) -> dict[str, Any]:
    return json.loads((run_dir / "run.json").read_text())


def every_step(run: Run, folder: Path) -> Checkpoint:
    """The user's own Checkpoint of ``handle.to_save`` at every step."""
    ckpt = Checkpoint(run.to_save, DiskSaver(folder, require_empty=False), n_saved=None,
                      global_step_transform=lambda e, _: e.state.iteration)
    run.engine.add_event_handler(Events.ITERATION_COMPLETED, ckpt)
    return ckpt


# -- live retime ---------------------------------------------------------------------------

TRIGGERS = st.one_of(
    st.integers(1, 6).map(lambda n: every(f"{n} steps")),
    st.integers(1, 2).map(lambda n: every(f"{n} epochs")),
    st.integers(1, STEPS).map(lambda n: at(f"{n} steps")),
    st.sampled_from([on("train_end"), on("epoch_start"), on("epoch_end")]),
    st.tuples(st.integers(2, 5), st.sampled_from(["epoch_start", "epoch_end"])).map(
        lambda t: every(f"{t[0]} steps") | on(t[1])),
)


@st.composite
def retimes(draw: st.DrawFn) -> tuple[dict[str, Trigger], dict[str, Trigger], int]:
    """A schedule, the same callbacks with some triggers changed, and a retime step."""
    old = draw(st.dictionaries(st.sampled_from("abcd"), TRIGGERS, min_size=1, max_size=3))
    new = {n: (t if draw(st.booleans()) else draw(TRIGGERS)) for n, t in old.items()}
    return old, new, draw(st.integers(1, STEPS - 1))


@pytest.mark.filterwarnings("ignore::schedtrain.errors.ScheduleWarning")
@settings(max_examples=6, derandomize=True, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(edit=retimes(), by_file=st.booleans())
def test_a_retime_during_engine_run_fires_as_continue_with(
        tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch,
        edit: tuple[dict[str, Trigger], dict[str, Trigger], int], by_file: bool) -> None:
    """Asked in an action at step k (``handle.retimer.retime``, or the request file
    ``schedtrain retime`` writes): the engine fires the old schedule up to k and the new
    one on, as ``simulate(old).continue_with(new, at=k)``; ``retimes.json`` and
    ``run.json`` keep it, the request is answered."""
    monkeypatch.setattr(live, "POLL_NS", 0)  # the file is looked for at k itself
    old, new, step = edit
    a = Schedule({"ask": at(f"{step} steps"), **old})
    b = Schedule({"ask": at(f"{step} steps"), **new})
    run_dir = tmp_path_factory.mktemp("run")
    text = canonical(b)
    assert text is not None

    def ask(_: Engine) -> None:
        if by_file:
            write_request(run_dir, text)
        else:
            run.handle.retimer.retime(b)

    run = build(run_dir, a, {"ask": ask})
    run.engine.run(data(), max_epochs=EPOCHS)
    assert run.fired == predicted(a, b, step)
    assert run_json(run_dir)["schedule"] == text
    if canonical(a) == text:
        assert not (run_dir / "retimes.json").exists()
        return
    history = json.loads((run_dir / "retimes.json").read_text())
    assert [(x["step"], x["schedule"]) for x in history["applied"]] == [(step, text)]
    if by_file:
        answer = json.loads((run_dir / "retime.answer.json").read_text())
        assert (answer["status"], answer["step"]) == ("applied", step)
        assert not (run_dir / "retime.json").exists()


A = Schedule({"ask": at("6 steps"), "a": every("3 steps"), "b": on("epoch_end")})
B = Schedule({"ask": at("6 steps"), "a": every("4 steps"), "b": on("epoch_end")})


def test_the_retime_command_reaches_a_running_engine(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """``schedtrain retime RUN NEW`` (the real command, run from an action at step 6)
    finds the engine's folder running, and the engine takes the schedule after step 6."""
    monkeypatch.setattr(live, "POLL_NS", 0)
    new = tmp_path / "new.toml"
    new.write_text(canonical(B) or "")
    run_dir = tmp_path / "run"
    said: list[subprocess.CompletedProcess[str]] = []

    def ask(_: Engine) -> None:
        said.append(subprocess.run(
            [sys.executable, "-m", "schedtrain", "retime", str(run_dir), str(new)],
            capture_output=True, text=True, timeout=120, check=False))

    run = build(run_dir, A, {"ask": ask})
    run.engine.run(data(), max_epochs=EPOCHS)
    assert said[0].returncode == 0, said[0].stderr
    assert run.fired == predicted(A, B, 6)
    answer = json.loads((run_dir / "retime.answer.json").read_text())
    assert (answer["status"], answer["step"]) == ("applied", 6)


@pytest.mark.parametrize("saved_at", [8, 5])  # after the retime at step 6, then before it
def test_a_resume_from_ignites_checkpoint_keeps_or_replays_the_retime(
        saved_at: int, tmp_path: Path) -> None:
    """Saved after the retime: the checkpoint holds the new schedule (the handle's state);
    saved before it: the resume applies it again at its step (``retimes.json``). Either
    way the resumed engine fires what the retimed run did after the checkpoint."""
    run_dir, folder = tmp_path / "run", tmp_path / "ckpt"
    whole = build(run_dir, A, {"ask": lambda _: whole.handle.retimer.retime(B)})
    every_step(whole, folder)
    whole.engine.run(data(), max_epochs=EPOCHS)
    assert whole.fired == predicted(A, B, 6)
    again = build(run_dir, A)  # the schedule the run was started with
    resume(again, folder / f"checkpoint_{saved_at}.pt")
    again.engine.run(data(), max_epochs=EPOCHS)
    assert again.fired == [f for f in whole.fired if f[2] > saved_at]
    assert again.digest() == whole.digest()


# -- notices and signals -------------------------------------------------------------------

PREEMPT_AT = 10  # a notice served at step 9 (the "once" firing) is seen at step 10


@pytest.mark.parametrize(("kind", "left"), [("aws", 45.0), ("gce", None)])
def test_a_notice_is_saved_by_ignites_checkpoint_and_resumes_exactly(
        kind: str, left: float | None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A notice from a local metadata server (45 s left on AWS; GCE's 30 s) ends the
    engine at the next step end: ``before_deadline("60 s")`` fires there, ``"20 s"``
    never; Ignite's Checkpoint is written, the exit is 75; ``Checkpoint.load_objects``
    then ``engine.run`` fires and trains what the uninterrupted run did, and once it
    completes, the preemption's checkpoint is removed."""
    monkeypatch.setenv(POLL_ENV, "0.02")
    reference = build(tmp_path / "reference")
    reference.engine.run(data(), max_epochs=EPOCHS)
    run_dir = tmp_path / "run"
    with NoticeServer() as server:
        def serve(_: Engine) -> None:  # then wait for the poller: a step of its own
            server.serve_notice(left or 0)
            inbox = run.handle.driver.control.inbox  # type: ignore[union-attr]
            waited = time.monotonic() + 10
            while inbox.requested is None and time.monotonic() < waited:
                time.sleep(0.01)

        run = build(run_dir, actions={"once": serve}, preempt_notice=server.url(kind))
        with pytest.raises(SystemExit) as info:
            run.engine.run(data(), max_epochs=EPOCHS)
    stop = info.value
    assert isinstance(stop, HostPreempted) and stop.code == 75
    assert (stop.signal, stop.step) == (f"the {kind.upper()} preemption notice", PREEMPT_AT)
    ckpt = run_dir / "checkpoints" / f"preempted_checkpoint_{PREEMPT_AT}.pt"
    assert Path(str(stop.checkpoint)) == ckpt and ckpt.exists()
    assert run.handle.preempted == stop.signal
    assert run_json(run_dir)["status"] == "preempted"
    deadline = [f for f in run.fired if f[0] in ("soon", "late")]
    assert deadline == [("soon", "step_end", PREEMPT_AT)]
    before = [f for f in reference.fired if f[2] <= PREEMPT_AT]
    assert [f for f in run.fired if f[0] != "soon"] == before
    again = build(run_dir)
    resume(again, ckpt)
    again.engine.run(data(), max_epochs=EPOCHS)
    assert again.fired == [f for f in reference.fired if f[2] > PREEMPT_AT]
    assert again.digest() == reference.digest()
    assert run_json(run_dir)["status"] == "finished"
    assert not ckpt.exists()  # older than what the completed run trained


def _job(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(JOB), *args], capture_output=True, text=True,
                          timeout=300, check=False)


def test_sigterm_exits_75_with_one_line_and_the_resume_is_exact(tmp_path: Path) -> None:
    """A real process: SIGTERM from iteration 7's handler (after the schedule's step end)
    is acted on at step 8: Ignite's Checkpoint, one line on stderr, no traceback, exit 75;
    the resumed process ends as the uninterrupted one (firings, final weights)."""
    whole = tmp_path / "whole.err"  # the reference: forked, its imports made already
    assert fork_script(JOB, [str(tmp_path / "whole")], stderr=whole) == 0, whole.read_text()
    run_dir = tmp_path / "run"
    killed = _job(str(run_dir), "--term-at", "7")
    ckpt = run_dir / "checkpoints" / "preempted_checkpoint_8.pt"
    assert killed.returncode == 75, killed.stderr
    assert killed.stderr.splitlines() == [
        f"schedtrain: preempted by SIGTERM after step 8: checkpoint {ckpt}"]
    # the resumed process: forked with the imports made, it has only the checkpoint to
    # resume from (what a fresh start adds was seen in the killed run)
    resumed = tmp_path / "resumed.err"
    assert fork_script(JOB, [str(run_dir), "--resume", str(ckpt)], stderr=resumed) == 0, \
        resumed.read_text()
    out = [json.loads((d / "out.json").read_text()) for d in (tmp_path / "whole", run_dir)]
    assert out[1]["fired"] == [f for f in out[0]["fired"] if f[2] > 8]
    assert out[1]["digest"] == out[0]["digest"]


# -- the run control's life with the engine's ---------------------------------------------


def test_a_failing_run_closes_its_control_and_fails_as_ignite_would(tmp_path: Path) -> None:
    """An exception: the signal handlers are given back, ``run.json`` says failed, and
    the exception comes out of ``engine.run`` (Ignite's way with no handler of
    EXCEPTION_RAISED); with a user's handler that keeps it (and ends the run), it does
    not."""
    before = signal.getsignal(signal.SIGTERM)

    def boom(_: Engine) -> None:
        raise RuntimeError("boom")

    run = build(tmp_path / "a", actions={"once": boom})
    with pytest.raises(RuntimeError, match="boom"):
        run.engine.run(data(), max_epochs=EPOCHS)
    assert signal.getsignal(signal.SIGTERM) == before
    assert run_json(tmp_path / "a")["status"] == "failed"
    kept: list[BaseException] = []
    run = build(tmp_path / "b", actions={"once": boom})

    def keep(engine: Engine, exc: BaseException) -> None:
        kept.append(exc)
        engine.terminate()

    run.engine.add_event_handler(Events.EXCEPTION_RAISED, keep)
    run.engine.run(data(), max_epochs=EPOCHS)
    assert [str(e) for e in kept] == ["boom"]
    assert signal.getsignal(signal.SIGTERM) == before
    assert run_json(tmp_path / "b")["status"] == "failed"


def test_a_terminate_without_completed_closes_the_control(tmp_path: Path) -> None:
    before = signal.getsignal(signal.SIGTERM)
    run = build(tmp_path, actions={"once": lambda e: e.terminate(skip_completed=True)})
    run.engine.run(data(), max_epochs=EPOCHS)
    assert run.engine.state.iteration == 9
    assert signal.getsignal(signal.SIGTERM) == before
    assert run_json(tmp_path)["status"] == "finished"
    assert not (tmp_path / "checkpoints").exists()  # not a preemption


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"to_save": {"schedule": Engine(lambda e, b: None)}},
     r"to_save=\.\.\.\) has a key 'schedule': it is the schedule's own"),
    ({"to_save": {"x": 3}, "save_handler": "ckpt"}, r"to_save\['x'\]\) has no state_dict"),
    ({"save_handler": "ckpt"}, "give to_save="),
    ({"to_save": {"e": Engine(lambda e, b: None)}, "control": HostControl()},
     "needs where a preemption's checkpoint goes"),
])
def test_what_a_preemption_cannot_save_with_is_refused_in_one_line(
        kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises((TypeError, ValueError), match=message) as info:
        attach_schedule(Engine(lambda e, b: None), schedule(), record=True, **kwargs)
    assert "\n" not in str(info.value) and len(str(info.value)) <= 300


@pytest.mark.parametrize("name", ["save", "a-callback-named-at-length-" * 8])
def test_every_auto_is_refused_saying_why_for_ignite(name: str) -> None:
    """The save could be timed around its action, but the interval it decides comes after
    its Checkpoint is written: a resume would lose it. One line, naming the callback."""
    from schedtrain.triggers import auto_every

    with pytest.raises(ValueError, match=r"every\('auto'\) paces saves") as info:
        attach_schedule(Engine(lambda e, b: None), Schedule({name: auto_every() | on(
            "train_end")}), {name: lambda e: None}, control=HostControl())
    line = str(info.value)
    assert "\n" not in line and len(line) <= 300 and line.startswith("callback '")
    if len(name) < 20:
        assert ("an Ignite Checkpoint it runs could be timed, but the interval decided "
                "from it comes after that Checkpoint is written") in line


@pytest.mark.parametrize(("at_step", "stops"), [(9, 9), (STEPS, None)])
def test_a_sigterm_from_an_action_preempts_at_its_step_but_not_the_last(
        at_step: int, stops: int | None, tmp_path: Path) -> None:
    """A signal while a step end's actions run preempts at that step (no deadline to
    wait for), ``preempt`` firing with its action; at the run's last step the run
    completes instead (exit 0): Ignite would run an engine resumed at its last iteration
    again from the start."""
    import os

    def term(_: Engine) -> None:
        os.kill(os.getpid(), signal.SIGTERM)

    completed: list[int] = []
    sched = Schedule({"term": at(f"{at_step} steps"), "tick": every("4 steps"),
                      "last": on("preempt")})
    run = build(tmp_path, sched, {"term": term})
    run.engine.add_event_handler(Events.COMPLETED, lambda e: completed.append(e.state.iteration))
    if stops is None:
        run.engine.run(data(), max_epochs=EPOCHS)
        assert completed == [STEPS] and run_json(tmp_path)["status"] == "finished"
        assert not (tmp_path / "checkpoints").exists()
        assert ("last", "preempt", STEPS) not in run.fired
        return
    with pytest.raises(HostPreempted) as info:
        run.engine.run(data(), max_epochs=EPOCHS)
    assert info.value.step == stops and completed == []
    assert run.fired[-1] == ("last", "preempt", stops)  # its action ran, before the save
    assert (tmp_path / "checkpoints" / f"preempted_checkpoint_{stops}.pt").exists()


def test_schedtrain_callbacks_in_the_engine_end_as_preempted(tmp_path: Path) -> None:
    """A schedtrain ``Callback`` in the schedule (a ``CallbackDriver``): a SIGTERM from
    an action preempts at that step, the callback's ``after_train`` runs with the outcome
    "preempted", and its state rides in the preemption's checkpoint."""
    import os

    import torch
    from hosted_helpers import Recorder
    from ignite.engine import DeterministicEngine

    outcomes: list[str | None] = []

    class Ends(Recorder):
        def _after_train(self) -> None:
            outcomes.append(self.trainer.outcome)

    rec = Ends()
    engine = DeterministicEngine(lambda e, b: 0.0)
    attach_schedule(engine, Schedule({"rec": every("2 steps"), "term": at("5 steps")}),
                    {"rec": rec, "term": lambda _: os.kill(os.getpid(), signal.SIGTERM)},
                    control=HostControl(tmp_path), to_save={"trainer": engine})
    with pytest.raises(HostPreempted) as info:
        engine.run(data(), max_epochs=EPOCHS)
    assert info.value.step == 5 and outcomes == ["preempted"] and rec.count == 2
    saved = torch.load(tmp_path / "checkpoints" / "preempted_checkpoint_5.pt",
                       weights_only=False)
    assert saved["schedule"]["callbacks"]["rec"] == {"count": 2}


def test_an_engine_run_on_after_terminate_keeps_its_retimes(tmp_path: Path) -> None:
    """Ignite runs a terminated engine on from where it stopped: the run control opens
    again as the same run's (its retimes kept), not as a fresh one's (forgotten)."""
    sched = Schedule({"ask": at("6 steps"), "a": every("3 steps"), "stop": at("8 steps")})
    new = Schedule({"ask": at("6 steps"), "a": every("4 steps"), "stop": at("8 steps")})
    run = build(tmp_path, sched, {"ask": lambda _: run.handle.retimer.retime(new),
                                  "stop": lambda e: e.terminate(skip_completed=True)})
    run.engine.run(data(), max_epochs=EPOCHS)
    run.engine.run(data(), max_epochs=EPOCHS)
    assert (tmp_path / "retimes.json").exists()
    assert run_json(tmp_path)["schedule"] == canonical(new)
