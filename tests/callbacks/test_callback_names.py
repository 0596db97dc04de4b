"""Callback state is saved by a stable name, never by the callback's place in the list."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from training_helpers import Noop, UnevenData, tiny_model

from schedtrain import Scheduled, ScheduleError, every
from schedtrain.callbacks import Callback
from schedtrain.callbacks.saver import MinSaver
from schedtrain.checkpoints import read_checkpoint
from schedtrain.errors import SpecError
from schedtrain.spec import loads_spec
from schedtrain.training import Trainer


class Counter(Callback):
    """Counts its firings; the count is its state."""

    def __init__(self, start: int = 0) -> None:
        self.count = start

    def _trigger(self) -> None:
        self.count += 1

    def state_dict(self) -> dict[str, Any]:
        return {"count": self.count}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.count = state["count"]


def _trainer(callbacks: list[Any], run_dir: Path, **kw: Any) -> Trainer:
    model, opt = tiny_model()
    return Trainer(model, opt, UnevenData([4] * 4), torch.nn.functional.mse_loss,
                   callbacks=callbacks, max_epochs=4, run_dir=run_dir, **kw)


def test_two_unnamed_stateful_callbacks_of_one_class_are_refused(tmp_path: Path) -> None:
    """Two unnamed callbacks of one class with state: the error asks to name them."""
    with pytest.raises(ScheduleError, match=r"'Counter', 'Counter#2'.*name each one"):
        _trainer([Counter(), Counter()], tmp_path)
    with pytest.raises(ScheduleError, match="unnamed MinSaver callbacks that keep state"):
        _trainer([MinSaver("train/loss"), MinSaver("val/loss")], tmp_path)


def test_unnamed_stateless_callbacks_of_one_class_are_accepted(tmp_path: Path) -> None:
    """Without state, position cannot matter: Noop, Noop#2 train as before."""
    trainer = _trainer([Noop(), Scheduled(every("2 steps"), Noop())], tmp_path)
    trainer.fit()
    assert {f.callback for f in trainer.firings} == {"Noop", "Noop#2"}


def test_one_unnamed_stateful_callback_per_class_is_accepted(tmp_path: Path) -> None:
    """A single unnamed callback of a class is named by its class: nothing is ambiguous;
    its state is saved under that name and comes back by it."""
    counter = Counter()
    first = _trainer([counter, Noop(), Noop()], tmp_path / "run", max_steps=8)
    first.fit()
    assert {f.callback for f in first.firings} == {"Counter", "Noop", "Noop#2"}
    assert counter.count == 2  # its default trigger: every epoch of 4 steps
    ckpt = tmp_path / "mid.pt"
    first.save_checkpoint(ckpt)
    assert read_checkpoint(ckpt)["run"]["callbacks"]["Counter"] == {"count": 2}
    again = Counter()
    resumed = _trainer([again, Noop(), Noop()], tmp_path / "run2")
    resumed.resume(ckpt)
    resumed.fit()
    assert again.count == 4


def test_named_state_follows_the_name_when_the_order_changes(tmp_path: Path) -> None:
    """Resumed with the list reversed, each named callback gets its own state back."""
    a, b = Counter(), Counter(start=100)
    first = _trainer([Scheduled(every("1 step"), a, "fast"),
                      Scheduled(every("1 epoch"), b, "slow")], tmp_path / "run",
                     max_steps=6)
    first.fit()
    assert (a.count, b.count) == (6, 101)
    ckpt = tmp_path / "mid.pt"
    first.save_checkpoint(ckpt)
    a2, b2 = Counter(), Counter(start=100)
    # Reordered callbacks fire in another order at an event: a schedule change, applied.
    resumed = _trainer([Scheduled(every("1 epoch"), b2, "slow"),
                        Scheduled(every("1 step"), a2, "fast")], tmp_path / "run2",
                       schedule_change="apply")
    resumed.resume(ckpt)
    resumed.fit()
    assert a2.count == 16
    assert b2.count == 104


class Steps(Callback):
    """Records the steps it fires at; keeps no state, so it may go unnamed."""

    def __init__(self) -> None:
        self.steps: list[int] = []

    def _trigger(self) -> None:
        self.steps.append(self.now.step)


def test_two_unnamed_callbacks_of_one_class_resume_under_a_changed_schedule(
        tmp_path: Path) -> None:
    """Two unnamed callbacks of one class are `Steps` and `Steps#2`; a checkpoint holding
    them resumes under a changed schedule (`apply`): the stored schedule reads back, the
    retimed one is reset and fires on its new period."""
    first = _trainer([Scheduled(every("1 step"), Steps()),
                      Scheduled(every("2 steps"), Steps())], tmp_path / "run", max_steps=6)
    first.fit()
    ckpt = tmp_path / "mid.pt"
    first.save_checkpoint(ckpt)
    same, changed = Steps(), Steps()
    resumed = _trainer([Scheduled(every("1 step"), same),
                        Scheduled(every("3 steps"), changed)], tmp_path / "run2",
                       schedule_change="apply")
    with pytest.warns(UserWarning, match="Steps#2: its trigger changed"):
        resumed.resume(ckpt)
    resumed.fit()
    assert same.steps == list(range(7, 17))
    assert changed.steps == [9, 12, 15]


@pytest.mark.parametrize("name", ["Counter#2", "Counter#17", "a.b-c_d#3"])
def test_an_auto_name_reads_back_from_toml(name: str) -> None:
    """The name a schedule gives a second unnamed callback is a valid TOML callback name."""
    spec = loads_spec(f'[callbacks."{name}"]\ntrigger = {{ every = "1 step" }}\n')
    assert spec.schedule().names == (name,)


@pytest.mark.parametrize("name", ["Counter#", "Counter#0", "Counter#02", "Counter#x", "#2",
                                  "Counter#2#3"])
def test_other_hash_names_are_refused(name: str) -> None:
    """Only `Name#N` (N >= 1, no leading zero) is an auto name; the rest is refused."""
    with pytest.raises(SpecError, match="invalid name"):
        loads_spec(f'[callbacks."{name}"]\ntrigger = {{ every = "1 step" }}\n')
    with pytest.raises(ValueError, match="invalid callback name"):
        Scheduled(every("1 step"), Counter(), name)
