"""A resumed run's log equals the uninterrupted one's, wherever the last checkpoint was
taken; an epoch's hooks see that epoch's loss."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from training_helpers import UnevenData, tiny_model

from schedtrain import Schedule, every, on
from schedtrain.callbacks import Callback, ModelSaver
from schedtrain.training import Trainer

mse = torch.nn.functional.mse_loss
#: The uninterrupted run's log and weights.
Full = tuple[list[dict[str, Any]], dict[str, torch.Tensor]]


class Validate(Callback):
    """Puts a value that depends on the weights, as a validation would."""

    produces = ("val/loss",)

    def _trigger(self) -> None:
        w = next(self.trainer.model.parameters())
        self.metrics.put("val/loss", float(w.detach().abs().sum()))


class Crash(Callback):
    """Fails the run at one step of its event (as a kill would end it there), when armed."""

    def __init__(self, at: int | None = None) -> None:
        self.at = at

    def _trigger(self) -> None:
        if self.now.step == self.at:
            raise RuntimeError("killed")


def _trainer(run_dir: Path, *, steps: int, epochs: int, max_steps: int | None,
             crash: tuple[str, int] | None = None) -> Trainer:
    model, opt = tiny_model()
    event, at = crash if crash is not None else ("", None)
    return Trainer(model, opt, UnevenData([steps] * epochs), mse,
                   schedule=Schedule({"save": every("1 step") | on("train_end"),
                                      "crash_step": every("1 step"),
                                      "crash_epoch": every("1 epoch"),
                                      "val": every("1 epoch")}),
                   bindings={"save": ModelSaver(keep=None),
                             "crash_step": Crash(at if event == "step_end" else None),
                             "crash_epoch": Crash(at if event == "epoch_end" else None),
                             "val": Validate()},
                   max_epochs=epochs, max_steps=max_steps, run_dir=run_dir,
                   handle_signals=False)


def _log(run_dir: Path) -> list[dict[str, Any]]:
    out = []
    for line in (run_dir / "events.jsonl").read_text().splitlines():
        row = json.loads(line)
        for key in ("seconds", "time", "wall", "duration"):
            row.pop(key, None)
        out.append(row)
    return out


@pytest.fixture(scope="module")
def full_run(tmp_path_factory: pytest.TempPathFactory
             ) -> Callable[[int, int, int | None], Full]:
    """The uninterrupted run of each shape, trained once per module: examples that draw
    the same shape (they differ in where the kill lands) compare with the same run."""
    done: dict[tuple[int, int, int | None], Full] = {}

    def get(steps: int, epochs: int, max_steps: int | None) -> Full:
        key = (steps, epochs, max_steps)
        if key not in done:
            run_dir = tmp_path_factory.mktemp("full")
            full = _trainer(run_dir, steps=steps, epochs=epochs, max_steps=max_steps)
            full.fit()
            done[key] = (_log(run_dir), {name: value.clone() for name, value
                                         in full.model.state_dict().items()})
        return done[key]

    return get


@settings(max_examples=15, deadline=None)
@given(steps=st.integers(1, 4), epochs=st.integers(1, 3), at_end=st.booleans(),
       epoch_end=st.booleans(), pick=st.integers(0, 10**6))
def test_a_run_killed_anywhere_resumes_to_the_same_log(  # noqa: PLR0917
        full_run: Callable[[int, int, int | None], Full],
        tmp_path_factory: pytest.TempPathFactory, steps: int, epochs: int, at_end: bool,
        epoch_end: bool, pick: int) -> None:
    """Killed at any step end or epoch end (the last step's epoch end, after its
    checkpoint, included) and resumed from the newest checkpoint, the run's log and
    weights equal the uninterrupted run's, with and without ``max_steps`` at the end."""
    tmp = tmp_path_factory.mktemp("gap")
    max_steps = steps * epochs if at_end else None
    log, weights = full_run(steps, epochs, max_steps)
    step = 1 + pick % (steps * epochs)
    if epoch_end:
        step = steps * (1 + pick % epochs)
    crash = ("epoch_end" if epoch_end else "step_end", step)
    with pytest.raises(RuntimeError, match="killed"):
        _trainer(tmp / "cut", steps=steps, epochs=epochs, max_steps=max_steps,
                 crash=crash).fit()
    resumed = _trainer(tmp / "cut", steps=steps, epochs=epochs, max_steps=max_steps)
    found = resumed.checkpoints.newest_valid(tmp / "cut" / "checkpoints")
    if found is None:  # killed before its first checkpoint: --resume auto starts again
        resumed.start_over()
    else:
        resumed.resume(found)
    resumed.fit()
    assert _log(tmp / "cut") == log
    for name, value in weights.items():
        assert torch.equal(value, resumed.model.state_dict()[name])


def test_after_epoch_sees_the_epochs_own_loss(tmp_path: Path) -> None:
    """``_after_epoch`` (tensorpack's ``_trigger_epoch`` time) reads the ``train/loss``
    of the epoch that just ended, as its triggers at ``epoch_end`` do."""
    seen: list[tuple[int, int]] = []

    class Watch(Callback):
        def _after_epoch(self) -> None:
            put = self.metrics.put_at("train/loss")
            seen.append((self.now.step, -1 if put is None else put[0]))

    model, opt = tiny_model()
    Trainer(model, opt, UnevenData([3, 2, 4]), mse, callbacks=[Watch()], max_epochs=3,
            handle_signals=False).fit()
    assert seen == [(3, 3), (5, 5), (9, 9)]
