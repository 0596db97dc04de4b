"""`before_deadline` fires at the step a preemption notice stops the run at, whatever else
fires there (issue 42): the notice is driven at chosen moments of a real run that saves
every step (the cookbook's spot recipe) — while a step's batch loads, inside a step end's
firings (a save in progress, before or after `before_deadline` is looked at), inside an
epoch end, at the last step — from a local metadata server (AWS, GCE) and by a signal
(SIGUSR1, SIGTERM) in a run with a deadline. Each moment has one right answer: the step
the run is preempted at, `before_deadline` firing there (or not at all when the notice
came after the run's last step end and the run finishes), the saver at every step."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from notice_server import NoticeServer
from training_helpers import Noop, tiny_model

from schedtrain import Schedule, every, on
from schedtrain.callbacks import Callback, ModelSaver
from schedtrain.clock import LoopClock
from schedtrain.errors import Preempted
from schedtrain.training import Trainer
from schedtrain.training.control.notice import POLL_ENV
from schedtrain.triggers import before_deadline

#: Each run saves at every step: its fsyncs would be most of its time (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("no_fsync")

STEPS, EPOCHS = 6, 3  # 6 steps an epoch: the run's last step is 18
LAST = STEPS * EPOCHS


class Data:
    """``STEPS`` batches an epoch; ``load(step)`` is called while a step's batch loads."""

    def __init__(self) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(STEPS, 2, 3, generator=g)
        self.load: Callable[[int], None] = lambda step: None
        self.step = 0

    def __len__(self) -> int:
        return STEPS

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for i in range(STEPS):
            self.step += 1
            self.load(self.step)
            yield self.x[i], self.x[i].sum(1, keepdim=True)


class Drive(Callback):
    """Fired where the notice must land (a step end's firings, an epoch end): calls
    ``then`` there."""

    def __init__(self) -> None:
        self.then: Callable[[], None] = lambda: None

    def _trigger(self) -> None:
        self.then()


#: where the notice lands: (moment, step or epoch). "load": while step k's batch loads,
#: before its step end; "first"/"last": inside step k's step end, from a callback fired
#: before / after `before_deadline` is looked at (the saver fires there too); "epoch":
#: inside epoch k's end.
MOMENTS = [("load", 1), ("load", 4), ("load", STEPS), ("load", LAST),
           ("first", 3), ("last", 3), ("first", STEPS), ("last", 2 * STEPS),
           ("first", LAST), ("last", LAST), ("epoch", 1), ("epoch", 2), ("epoch", EPOCHS)]


def notice_step(moment: str, k: int) -> int | None:
    """The step the run is preempted at; ``None``: it finishes (the notice came after
    its last step end). A notice seen before a step end is that step's; one that came
    inside a step end (or an epoch end) is the next step's, whose end is the first to
    see its deadline."""
    if moment == "load":
        return k
    after = k * STEPS if moment == "epoch" else k
    return after + 1 if after < LAST else None


def run(moment: str, k: int, tmp_path: Path, *, notice: str | None,
        deliver: Callable[[Trainer], None], **options: Any) -> tuple[Trainer, int | None]:
    """Train with the notice delivered at ``(moment, k)``; the step preempted at."""
    data, drive = Data(), Drive()
    trigger = (on("epoch_end") if moment == "epoch"
               else every("1 step"))
    named: dict[str, Any] = {"save": every("1 step"), "validate": every("4 steps"),
                             "alert": before_deadline("60 s")}
    names = (["drive", *named] if moment in ("first", "epoch")
             else [*named, "drive"])
    schedule = {n: trigger if n == "drive" else named[n] for n in names}
    bindings: dict[str, Callback] = {"drive": drive, "save": ModelSaver(keep=2),
                                     "validate": Noop(), "alert": Noop()}
    model, opt = tiny_model()
    t = Trainer(model, opt, data, torch.nn.functional.mse_loss, schedule=Schedule(schedule),
                bindings={n: bindings[n] for n in names}, max_epochs=EPOCHS,
                preempt_notice=notice, run_dir=tmp_path / "run", **options)
    if moment == "load":
        data.load = lambda step: deliver(t) if step == k else None
    elif moment == "epoch":
        drive.then = lambda: deliver(t) if t.clock.epoch == k else None
    else:
        drive.then = lambda: deliver(t) if t.clock.step == k else None
    try:
        t.fit()
    except Preempted as stop:
        assert t.outcome == "preempted"
        assert stop.checkpoint is not None and Path(stop.checkpoint).exists()
        return t, stop.step
    assert t.outcome == "finished"
    return t, None


def fired(t: Trainer, name: str) -> list[int]:
    return [f.timestamp.step for f in t.firings if f.callback == name and f.event == "step_end"]


def served(server: NoticeServer) -> Callable[[Trainer], None]:
    """Serve the notice and wait until the run's poller handed it to the loop, so it lands
    exactly where the caller stands."""
    def deliver(t: Trainer) -> None:
        server.serve_notice(45)
        end = time.monotonic() + 30
        while t._parts.control.inbox.requested is None:
            assert time.monotonic() < end, "the poller never saw the notice"
            time.sleep(0.002)
    return deliver


@pytest.mark.parametrize("kind", ["aws", "gce"])
@pytest.mark.parametrize(("moment", "k"), MOMENTS)
def test_before_deadline_fires_at_the_notice_step(kind: str, moment: str, k: int,
                                                  tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(POLL_ENV, "0.005")
    monkeypatch.delenv("SLURM_JOB_END_TIME", raising=False)
    with NoticeServer() as server:
        t, stop = run(moment, k, tmp_path, notice=server.url(kind), deliver=served(server))
    expected = notice_step(moment, k)
    assert stop == expected
    assert fired(t, "alert") == ([] if expected is None else [expected])
    end = LAST if expected is None else expected
    assert fired(t, "save") == list(range(1, end + 1))  # the save at that step too
    assert fired(t, "validate") == list(range(4, end + 1, 4))


class FakeTime:
    """10 s a reading of the clock: the run's deadline is crossed at a known step."""

    def __init__(self) -> None:
        self.now = 0

    def __call__(self) -> int:
        self.now += 10 * 10**9
        return self.now


@pytest.mark.parametrize("case", [(signal.SIGUSR1, 0), (signal.SIGTERM, 0),
                                  (signal.SIGUSR1, 1)])
@pytest.mark.parametrize(("moment", "k"), MOMENTS)
def test_a_signal_preempts_at_its_step_with_the_deadline_triggers(
        case: tuple[signal.Signals, int], moment: str, k: int, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A signal carries no deadline: it preempts at the step end it came before (inside a
    step end or an epoch end: that one). The run's own deadline (10 s a step on a fake
    clock) is crossed at the preemption's step (``after`` 0) or the one after it:
    `before_deadline` fires there beside the saver and the preemption, or not at all."""
    monkeypatch.delenv("SLURM_JOB_END_TIME", raising=False)
    sig, after = case
    expected = k * STEPS if moment == "epoch" else k
    # the clock is at 10 s times the step at each step end: under 60 s left from step
    # `expected + after` on
    left = f"{60 + 10 * (expected + after) - 5} s"

    def deliver(t: Trainer) -> None:
        os.kill(os.getpid(), sig)

    t, stop = run(moment, k, tmp_path, notice=None, deliver=deliver, deadline=left,
                  preempt_signals=["SIGTERM", "SIGUSR1"],
                  clock=LoopClock(time_source=FakeTime()))
    assert stop == expected
    deadline = t.table.deadline_ns
    assert deadline is not None
    below = [f.timestamp.step for f in t.firings
             if f.callback == "save" and deadline - f.timestamp.time_ns < 60 * 10**9]
    assert below == ([expected] if after == 0 else [])  # the fake clock's promise
    assert fired(t, "alert") == below
    assert fired(t, "save") == list(range(1, expected + 1))
