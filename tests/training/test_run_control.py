"""``RunControl`` built as a host's driver builds it: a table, callbacks, a run folder and a
position, no loop, no agreement, no run directory. At its one call after a step end
(``drain``) it applies a retime request found in its folder, replays a journaled retime
at its step (which ``next_step`` names beforehand), and returns a preemption asked by a
signal or a cloud's notice once a step end has seen the notice's deadline."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
from training_helpers import Noop

from schedtrain import Schedule, every
from schedtrain.planning.changes import canonical
from schedtrain.planning.requests import LOOK_STEPS, Applied, History, write_history, write_request
from schedtrain.training.control import RunControl

NOW = 0  # the training clock's time (ns): the notice's deadline is put on this axis


class Position:
    """A host's step and epoch, as its own loop counts them."""

    def __init__(self) -> None:
        self.step, self.epoch = 0, 0

    def __call__(self) -> tuple[int, int]:
        return self.step, self.epoch


def _text(n: int) -> str:
    text = canonical(Schedule({"tick": every(f"{n} steps")}))
    assert text is not None
    return text


def _control(run_dir: Path | None, position: Position, **kw: object) -> RunControl:
    """Run control as a host builds it."""
    schedule = Schedule({"tick": every("4 steps")})
    return RunControl.build(table=schedule.compile(), callbacks={"tick": Noop()},
                            position=position, time_ns=lambda: NOW, schedule=schedule,
                            run_dir=run_dir, **kw)  # type: ignore[arg-type]


def test_a_retime_request_in_its_folder_is_applied_at_drain(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import schedtrain.training.control.retime as live

    monkeypatch.setattr(live, "POLL_NS", 0)  # every drain looks (at most every 0.5 s)
    at = Position()
    control = _control(tmp_path, at, handle_signals=False)
    with control.open(fresh=True, resumed=False):
        at.step = 5
        assert control.drain(5, due=False) is None  # nothing waits: nothing changes
        assert control.retimer.change.text == _text(4)
        write_request(tmp_path, _text(3))
        at.step = 6
        assert control.drain(6, due=False) is None
    assert control.retimer.change.text == _text(3)
    assert list(control.table.triggers) == [every("3 steps")]
    answer = json.loads((tmp_path / "retime.answer.json").read_text())
    assert (answer["status"], answer["step"]) == ("applied", 6)
    history = json.loads((tmp_path / "retimes.json").read_text())
    assert [a["step"] for a in history["applied"]] == [6]


def test_a_signal_is_returned_by_drain_and_its_handler_only_while_open(
        tmp_path: Path) -> None:
    at = Position()
    control = _control(None, at, signals=("SIGUSR1",))
    before = signal.getsignal(signal.SIGUSR1)
    with control.open(fresh=True, resumed=False):
        assert control.drain(1, due=True) is None
        os.kill(os.getpid(), signal.SIGUSR1)
        time.sleep(0.01)  # the handler runs in the main thread, between bytecodes
        assert control.inbox.limit == 0  # the loop's next step takes the slow path
        assert control.drain(2, due=False) == "SIGUSR1"
    assert signal.getsignal(signal.SIGUSR1) is before


def test_a_notice_is_returned_once_a_step_end_has_seen_its_deadline(tmp_path: Path) -> None:
    """The notice's deadline goes to the table at the first drain; the request is
    returned from the next one (``before_deadline`` fired at a step end in between)."""
    at = Position()
    control = _control(None, at, handle_signals=False)
    with control.open(fresh=True, resumed=False):
        control.inbox.notice("AWS spot instance-action", time.time() + 120)  # its thread's call
        assert control.drain(3, due=False) is None
        deadline = control.table.deadline_ns
        assert deadline is not None and abs(deadline - 120e9) < 5e9
        assert control.drain(4, due=False) == "AWS spot instance-action"


def test_a_notice_collected_before_the_step_end_is_returned_at_its_drain() -> None:
    """The own loop collects before firing ``step_end`` (its triggers see the deadline),
    so that step's drain may act on the request; a notice that lands after the collect
    (during the step end's firings) is left to the next step end."""
    control = _control(None, Position(), handle_signals=False)
    with control.open(fresh=True, resumed=False):
        control.inbox.notice("GCE preemption", time.time() + 30)
        assert control.collect() is True
        assert control.drain(3, due=True) == "GCE preemption"
        # One that comes during a step end's firings waits for the next step end.
        control.inbox.notice("GCE maintenance", time.time() + 20)
        assert control.collect() is True
        control.inbox.notice("GCE maintenance", time.time() + 10)  # while step_end fires
        assert control.drain(4, due=True) is None
        assert control.collect() is True
        assert control.drain(5, due=True) == "GCE preemption"  # the first source's name


def test_next_step_names_a_replayed_retime_which_drain_applies_there(tmp_path: Path) -> None:
    at = Position()
    control = _control(tmp_path, at, handle_signals=False)
    write_history(tmp_path, History(_text(4), (Applied(7, 0, _text(5), "python-1"),)))
    at.step = 3  # the checkpoint's step: the retime at 7 came after it
    control.replay({"schedule": _text(4), "clock": {"now": {"step": 3}},
                    "events_offset": None})
    assert control.next_step == 7
    with control.open(fresh=False, resumed=True):
        assert control.retimer.change.text == _text(4)  # not before its step
        for step in range(4, 8):
            at.step = step
            control.drain(step, due=False)
            assert control.retimer.change.text == (_text(5) if step >= 7 else _text(4))
    assert control.next_step == LOOK_STEPS  # one process's next look for a request
    assert list(control.table.triggers) == [every("5 steps")]


@pytest.mark.parametrize(("fresh", "replayed"), [(True, LOOK_STEPS), (False, 7)],
                         ids=["fresh", "starting-over"])
def test_a_fresh_run_forgets_an_earlier_runs_retimes_one_starting_over_replays_them(
        tmp_path: Path, fresh: bool, replayed: int) -> None:
    write_history(tmp_path, History(_text(4), (Applied(7, 0, _text(5)),)))
    control = _control(tmp_path, Position(), handle_signals=False)
    with control.open(fresh=fresh, resumed=False):
        assert control.next_step == replayed
