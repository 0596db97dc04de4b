"""Deadlines in a real Trainer on a fake nanosecond clock: `[run] deadline`, SLURM's job end."""

from __future__ import annotations

import time

import pytest
import torch
from training_helpers import Noop, UnevenData, tiny_model

from schedtrain import Schedule
from schedtrain.clock import LoopClock
from schedtrain.training import Trainer
from schedtrain.triggers import before_deadline, when


class FakeTime:
    """Moves ``step_ns`` per reading: the loop reads it at the start and at each step end."""

    def __init__(self, step_ns: int) -> None:
        self.step_ns, self.now = step_ns, 0

    def __call__(self) -> int:
        value, self.now = self.now, self.now + self.step_ns
        return value


def fired(deadline: str | None) -> tuple[list[int], list[int]]:
    model, opt = tiny_model()
    sched = Schedule({"once": before_deadline("25 s"), "cond": when("time_left < 25 s")})
    trainer = Trainer(model, opt, UnevenData([8]), torch.nn.functional.mse_loss,
                      schedule=sched, bindings={"once": Noop(), "cond": Noop()},
                      max_epochs=1, deadline=deadline,
                      clock=LoopClock(time_source=FakeTime(10 * 10**9)))
    trainer.fit()
    def at_step_ends(name: str) -> list[int]:
        return [f.timestamp.step for f in trainer.firings
                if f.callback == name and f.event == "step_end"]
    return at_step_ends("once"), at_step_ends("cond")


def test_run_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    """10 s a step, deadline 47 s after the start: 17 s left after step 3."""
    monkeypatch.delenv("SLURM_JOB_END_TIME", raising=False)
    assert fired("47 s") == ([3], [3, 4, 5, 6, 7, 8])
    assert fired(None) == ([], [])


def test_slurm_job_end_wins_when_earlier(monkeypatch: pytest.MonkeyPatch) -> None:
    """SLURM's end 60 to 61 s away beats a 200 s deadline: under 25 s left after step 4."""
    monkeypatch.setenv("SLURM_JOB_END_TIME", str(int(time.time()) + 61))
    assert fired("200 s") == ([4], [4, 5, 6, 7, 8])
    assert fired("47 s") == ([3], [3, 4, 5, 6, 7, 8])  # the spec's is earlier: it wins


def test_bad_deadline_argument() -> None:
    model, opt = tiny_model()
    with pytest.raises(ValueError, match="`deadline`: invalid deadline 'soon'"):
        Trainer(model, opt, UnevenData([4]), torch.nn.functional.mse_loss,
                schedule=Schedule({}), max_epochs=1, deadline="soon")


def test_a_bad_slurm_end_time_is_ignored_with_a_warning(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURM_JOB_END_TIME", "soon")
    with pytest.warns(RuntimeWarning, match="SLURM_JOB_END_TIME='soon'.*ignored"):
        assert fired("47 s") == ([3], [3, 4, 5, 6, 7, 8])
