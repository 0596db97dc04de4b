"""Run control at the driver level (``ScheduleDriver(..., control=HostControl(DIR))``),
the part every host shares: ``schedtrain retime DIR NEW`` finds the folder and the job
applies it; a retime is kept in the driver's state and a resume from an earlier state
replays it at its step; a cloud notice from a local metadata server asks for a
preemption and gives ``before_deadline`` its deadline at that step; bad options and a
damaged state are refused in one line."""

from __future__ import annotations

import copy
import os
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import pytest
from host_strategies import counters, host_schedules, host_triggers
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from notice_server import NoticeServer

import schedtrain.training.control.retime as live
from schedtrain import Schedule, ScheduleWarning, Unit, at, every, on, simulate
from schedtrain.integrations.driver import ScheduleDriver
from schedtrain.integrations.driver_control import AUTO_REFUSED
from schedtrain.integrations.driver_state import DriverStateError
from schedtrain.integrations.host_control import HostControl, HostPreempted
from schedtrain.planning.changes import canonical
from schedtrain.planning.requests import LOOK_STEPS, live_refusal, read_history
from schedtrain.training.control.notice import POLL_ENV
from schedtrain.triggers import before_deadline
from schedtrain.triggers.auto import auto_every

UNITS = [Unit.STEP, Unit.EPOCH]
EPOCHS, STEPS = 3, 5


def driver(schedule: Schedule, control: HostControl, **actions: Any) -> ScheduleDriver:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ScheduleWarning)
        return ScheduleDriver(schedule, record=True, control=control, actions=actions)


def train(d: ScheduleDriver, start: int = 0, each: Any = None) -> None:
    """Steps ``start`` (done: a state saved after its step end) to the end of
    ``EPOCHS`` epochs of ``STEPS``; ``each(step)`` after every step end."""
    d.train_start()
    if start and start % STEPS == 0:  # saved before that epoch's end
        d.epoch_end()
    for step in range(start, EPOCHS * STEPS):
        if step % STEPS == 0:
            d.epoch_start()
        d.step()
        if each is not None:
            each(step + 1)
        if (step + 1) % STEPS == 0:
            d.epoch_end()
    d.train_end()


# -- bad options ---------------------------------------------------------------------------
@pytest.mark.parametrize(("kwargs", "key"), [
    ({"preempt_notice": "azure"}, "preempt_notice"),
    ({"preempt_signals": ["SIGKILL"]}, "preempt_signals"),
    ({"preempt_signals": "SIGTERM"}, "preempt_signals"),
    ({"deadline": "tomorrow"}, "deadline"),
    ({"handle_signals": "yes"}, "handle_signals"),
])
def test_a_bad_option_is_refused_in_one_line(kwargs: dict[str, Any], key: str) -> None:
    with pytest.raises(ValueError) as found:
        HostControl("runs/x", **kwargs)
    line = str(found.value)
    assert line.startswith(f"HostControl({key}=...): ") and "\n" not in line
    assert len(line) <= 300


def test_a_damaged_schedule_in_a_state_is_refused_by_key(tmp_path: Path) -> None:
    d = driver(Schedule({"a": every("2 steps")}), HostControl(tmp_path))
    d.train_start()
    d.step()
    state = copy.deepcopy(d.state_dict())
    d.train_end()
    assert state["schedule"] == canonical(Schedule({"a": every("2 steps")}))
    state["schedule"] = 5
    with pytest.raises(DriverStateError, match=r"driver state: schedule: expected"):
        driver(Schedule({"a": every("2 steps")}), HostControl(tmp_path)).load_state_dict(state)


def test_without_control_the_state_is_as_before() -> None:
    d = ScheduleDriver(Schedule({"a": every("2 steps")}))
    d.train_start()
    d.step()
    assert "schedule" not in d.state_dict() and d.control is None


# -- live retime ---------------------------------------------------------------------------
@st.composite
def edits(draw: st.DrawFn) -> tuple[Schedule, Schedule, int, int]:
    """A schedule, the same callbacks with some triggers changed (both with "ask" at the
    retime's step first), the retime's step and an earlier state's step."""
    step = draw(st.integers(1, EPOCHS * STEPS - 1))
    old = draw(host_schedules(UNITS)).triggers()
    new = {n: t if draw(st.booleans()) else draw(host_triggers(UNITS)) for n, t in old.items()}
    ask = {"ask": at(f"{step} steps")}
    a, b = Schedule({**ask, **old}), Schedule({**ask, **new})
    try:
        ta, tb = canonical(a), canonical(b)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ScheduleWarning)
            b.compile()
    except Exception:
        assume(False)
    assert ta is not None and tb is not None
    assume(live_refusal(ta, tb, ()) is None)
    return a, b, step, draw(st.integers(1, step))


@pytest.mark.filterwarnings("ignore::schedtrain.errors.ScheduleWarning")
@settings(max_examples=25, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(edit=edits())
def test_a_retime_replays_from_an_earlier_state_as_continue_with(
        edit: tuple[Schedule, Schedule, int, int],
        tmp_path_factory: pytest.TempPathFactory) -> None:
    """Retimed in Python at step k's end; a new process resumed from the driver's state
    at c <= k (saved after c's step end) goes on as the retimed run: before k the state
    holds the old schedule and retimes.json replays the retime at k; at k the state
    holds the new one."""
    old, new, k, c = edit
    folder = tmp_path_factory.mktemp("run")
    control = HostControl(folder)
    first = driver(old, control, ask=lambda: control.retimer.retime(new))
    states: dict[int, Any] = {}
    train(first, each=lambda step: states.setdefault(step, copy.deepcopy(first.state_dict())))
    want = counters(simulate(old, epochs=EPOCHS, steps_per_epoch=STEPS)
                    .continue_with(new, at=k))
    assert counters(first.firings) == want
    kept = [f for f in first.firings
            if f.timestamp.step < c or (f.timestamp.step == c and f.event == "step_end")]
    again = driver(old, HostControl(folder))  # this process does not ask
    again.load_state_dict(states[c])
    train(again, c)
    assert counters(kept + again.firings) == want
    history = read_history(folder)
    if canonical(old) != canonical(new):
        assert history is not None and [a.step for a in history.applied] == [k]


def test_the_retime_command_finds_the_folder_and_the_job_applies_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``schedtrain retime DIR NEW --wait`` against a driver training in this process:
    run.json says it runs (its schedule, pid, per-batch events), the request is answered
    "applied" at the step the driver took it, and the driver fires the new schedule on."""
    monkeypatch.setattr(live, "POLL_NS", 0)
    old = Schedule({"a": every("2 steps"), "b": on("epoch_end")})
    new_text = '[callbacks.a]\ntrigger = { every = "3 steps" }\n\n' \
               '[callbacks.b]\ntrigger = { on = "epoch_end" }\n'
    spec = tmp_path / "new.toml"
    spec.write_text(new_text)
    run_dir = tmp_path / "run"
    d = driver(old, HostControl(run_dir))
    d.train_start()
    d.epoch_start()
    command = subprocess.Popen(
        [sys.executable, "-m", "schedtrain", "retime", str(run_dir), str(spec), "--wait", "60"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})
    until = time.monotonic() + 60
    while command.poll() is None and time.monotonic() < until:
        d.step()  # every second step is due: the driver looks at each
        time.sleep(0.01)
    out, err = command.communicate(timeout=30)
    assert command.returncode == 0, err
    history = read_history(run_dir)
    assert history is not None and len(history.applied) == 1
    k = history.applied[0].step
    assert f"applied at step {k}" in out
    fired = [f.timestamp.step for f in d.firings if f.callback == "a"]
    assert fired == [s for s in range(1, d.clock.step + 1) if s % (2 if s <= k else 3) == 0]
    d.train_end()
    assert '"status": "finished"' in (run_dir / "run.json").read_text()


# -- signals and notices -------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["aws", "gce"])
def test_a_notice_asks_for_a_preemption_and_gives_its_deadline(
        kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Served while the loop trains: at the next step end ``before_deadline`` (a margin
    wider than the notice's warning) fires and the driver holds the preemption."""
    monkeypatch.setenv(POLL_ENV, "0.01")
    schedule = Schedule({"late": before_deadline("10 min"), "e": every("1 step")})
    with NoticeServer() as server:
        control = HostControl(tmp_path, preempt_notice=server.url(kind))
        d = driver(schedule, control)
        d.train_start()
        d.epoch_start()
        d.step()
        server.serve_notice(seconds_left=120)
        until = time.monotonic() + 20
        while control.inbox.requested is None and time.monotonic() < until:
            time.sleep(0.01)
        d.step()
    assert d.preempt_requested == f"the {kind.upper()} preemption notice"
    assert [f.timestamp.step for f in d.firings if f.callback == "late"] == [2]
    d.close_control(HostPreempted(d.preempt_requested, 2, None))
    assert '"status": "preempted"' in (tmp_path / "run.json").read_text()


def test_a_signal_is_held_until_the_step_end_and_handlers_come_back(tmp_path: Path) -> None:
    before = signal.getsignal(signal.SIGTERM)
    d = driver(Schedule({"a": every("5 steps")}), HostControl(tmp_path))
    d.train_start()
    d.epoch_start()
    d.step()
    os.kill(os.getpid(), signal.SIGTERM)
    assert d.preempt_requested is None  # quiet until a step ends
    d.step()
    assert d.preempt_requested == "SIGTERM"
    d.train_end()
    assert signal.getsignal(signal.SIGTERM) is before


@pytest.mark.parametrize("host", ["Lightning", "the HF Trainer", "Ignite", "your loop"])
def test_every_auto_is_refused_in_one_line_saying_why_for_the_host(host: str) -> None:
    with pytest.raises(ValueError) as found:
        ScheduleDriver(Schedule({"save": auto_every()}), host=host)
    line = str(found.value)
    assert "\n" not in line and len(line) <= 300
    assert line.startswith("callback 'save': every('auto') paces saves by their measured")
    assert (AUTO_REFUSED.get(host) or "your loop saves its own way") in line


def test_with_control_a_quiet_step_still_drains_nothing(tmp_path: Path) -> None:
    """The control is drained only where a trigger is due and every ``LOOK_STEPS`` steps
    (a request file is looked for), never on the quiet steps between."""
    control = HostControl(tmp_path)
    d = driver(Schedule({"save": every("100 steps")}), control)
    drained: list[int] = []
    inner = control.drain
    control.drain = lambda step, due: drained.append(step) or inner(step, due)  # type: ignore[method-assign]
    d.train_start()
    for _ in range(300):
        d.step()
    d.train_end()
    assert drained == [100, 200, LOOK_STEPS, 300]


def test_schedtrain_callbacks_in_a_host_take_the_same_control(tmp_path: Path) -> None:
    """A ``CallbackDriver`` (schedtrain callbacks inside a host): a retime applies at the
    step's end, a callback whose trigger changed starts afresh, a signal is held for the
    host, and a preemption runs ``after_train`` with the outcome "preempted"."""
    from schedtrain.callbacks import Callback
    from schedtrain.integrations.hosted import CallbackDriver

    class Seen(Callback):
        def __init__(self) -> None:
            super().__init__()
            self.steps: list[int] = []
            self.outcome: str | None = None

        def _trigger(self) -> None:
            self.steps.append(self.trainer.clock.step)

        def _after_train(self) -> None:
            self.outcome = self.trainer.outcome

    seen = Seen()
    control = HostControl(tmp_path)
    d = CallbackDriver(Schedule({"seen": every("2 steps")}), {"seen": seen}, control=control)
    d.train_start()
    d.epoch_start()
    for step in range(1, 11):
        d.step()
        if step == 4:
            control.retimer.retime(Schedule({"seen": every("3 steps")}))
        if step == 9:
            assert d.preempt_requested is None
            os.kill(os.getpid(), signal.SIGTERM)
    # asked after step 4: taken at 6, the next due step; then every 3 steps, afresh
    assert seen.steps == [2, 4, 6, 9]
    assert d.preempt_requested == "SIGTERM"
    d.exception(HostPreempted("SIGTERM", 10, None))
    assert seen.outcome == "preempted"
    assert '"status": "preempted"' in (tmp_path / "run.json").read_text()


def test_due_step_is_lowered_by_a_signal(tmp_path: Path) -> None:
    d = driver(Schedule({"a": every("100 steps")}), HostControl(tmp_path))
    d.train_start()
    d.step()
    assert d.due_step == 100
    os.kill(os.getpid(), signal.SIGTERM)
    assert d.due_step == 0
    d.step()
    assert d.preempt_requested == "SIGTERM"
    d.train_end()
    plain = ScheduleDriver(Schedule({"a": every("100 steps")}))
    assert plain.due_step == plain.table.step_due
