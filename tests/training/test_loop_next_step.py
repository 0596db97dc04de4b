"""The loop's next slow-path step does not move for a waiting live retime (one process).

The loop compares each step with one limit (``Loop._limit``), and its slow path
(``Loop._step_end``) is where a retime request is looked for and taken. A request that
waits, and is answered without changing the schedule, must not add or move a slow-path
step: the steps the slow path runs at, and the next step each one sets, are those of the
same run with no request. The request is taken at the step the rules say: one made in
Python at the next slow path, the request file at the next look (every ``LOOK_STEPS``
steps) when ``POLL_NS`` has not passed. Epochs are shorter than a fold of the losses, so
the look is a slow path of its own.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset
from training_helpers import Noop

from schedtrain import Schedule, at, every
from schedtrain.callbacks import Callback
from schedtrain.planning.changes import canonical
from schedtrain.planning.requests import LOOK_STEPS, write_request

EPOCHS, PER_EPOCH = 6, 100  # past two looks at the request file
ASK = "1 epochs"  # the request is handed at the first epoch's end, and waits


def _schedule() -> Schedule:
    return Schedule({"ask": at(ASK), "tick": every("7 steps")})


def _refused() -> str:
    """A schedule the running job refuses (it adds a callback)."""
    text = canonical(Schedule({"ask": at(ASK), "tick": every("7 steps"),
                               "more": every("3 steps")}))
    assert text is not None
    return text


class Asker(Callback):
    """Hands the running job ``new`` when it fires: in Python, or as ``schedtrain retime``
    does, by the request file."""

    def __init__(self, new: Callable[[], str], by_file: bool) -> None:
        super().__init__()
        self.new, self.by_file = new, by_file

    def _trigger(self) -> None:
        trainer: Any = self.trainer  # the Trainer, not only what callbacks see
        if self.by_file:
            write_request(trainer.run_dir, self.new())
        else:
            trainer.retimer.retime(self.new())


def _run(run_dir: Path, asker: Callback) -> tuple[list[tuple[int, float]], list[int], Any]:
    """A run of ``EPOCHS`` epochs: each ``_limit`` the loop asked (its step and the next
    step it gave), the steps ``_step_end`` ran at, and the trainer."""
    from schedtrain.training import Trainer

    torch.manual_seed(0)
    x = torch.randn(PER_EPOCH, 3)
    model = torch.nn.Linear(3, 1)
    trainer = Trainer(model, torch.optim.SGD(model.parameters(), lr=0.01),
                      DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=1),
                      torch.nn.functional.mse_loss, schedule=_schedule(),
                      bindings={"ask": asker, "tick": Noop()}, max_epochs=EPOCHS,
                      run_dir=run_dir, keep_firings=None, handle_signals=False)
    loop = trainer._parts.loop
    limits: list[tuple[int, float]] = []
    ends: list[int] = []
    limit, step_end = loop._limit, loop._step_end

    def recorded_limit(step: int, kept: int) -> float:
        limits.append((step, got := limit(step, kept)))
        return got

    def recorded_step_end(step: int, *args: Any) -> None:
        ends.append(step)
        step_end(step, *args)

    loop._limit, loop._step_end = recorded_limit, recorded_step_end  # type: ignore[method-assign,assignment]
    trainer.fit()
    return limits, ends, trainer


def _unchanged() -> str:
    text = canonical(_schedule())
    assert text is not None
    return text


@pytest.mark.filterwarnings("ignore:retime refused:schedtrain.errors.ScheduleWarning")
@pytest.mark.parametrize(("by_file", "new", "status"), [
    (False, _unchanged, None), (True, _unchanged, "unchanged"), (True, _refused, "refused")],
    ids=["python", "file", "file-refused"])
def test_a_waiting_retime_leaves_the_loops_next_steps_as_without_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, by_file: bool,
        new: Callable[[], str], status: str | None) -> None:
    import schedtrain.training.control.retime as live

    monkeypatch.setattr(live, "POLL_NS", 10**18)  # the file: looked for at the folds only
    quiet = _run(tmp_path / "quiet", Noop())
    asked = _run(tmp_path / "asked", Asker(new, by_file))
    assert asked[0] == quiet[0] and asked[1] == quiet[1]
    assert LOOK_STEPS in quiet[1] and 2 * LOOK_STEPS in quiet[1]  # the looks
    assert [(f.callback, f.event, f.step) for f in asked[2].firings] == [
        (f.callback, f.event, f.step) for f in quiet[2].firings]
    assert asked[2].retimer.asked is None  # taken (in Python: at the next slow path)
    if by_file:
        answer = json.loads((tmp_path / "asked" / "retime.answer.json").read_text())
        # It waited through quiet steps for the next look, and was answered there.
        assert (answer["status"], answer["step"]) == (status, LOOK_STEPS)
        assert not (tmp_path / "asked" / "retime.json").exists()
