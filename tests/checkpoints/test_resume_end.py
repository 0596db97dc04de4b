"""A run killed right after its final checkpoint (taken at ``train_end``, before the
values of its last events reach ``events.jsonl``) resumes to the uninterrupted run's
log and end: finished or stopped early, never training on, never a line short."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from training_helpers import UnevenData, tiny_model

from schedtrain import Schedule, every, on
from schedtrain.callbacks import Callback, ModelSaver
from schedtrain.errors import RunEnded, StopTraining
from schedtrain.training import Trainer

mse = torch.nn.functional.mse_loss


class Validate(Callback):
    """Puts values that depend on the weights, as a validation would (they stay pending
    in the metric store until the next flush)."""

    produces = ("val/loss", "val/error")

    def _trigger(self) -> None:
        w = next(self.trainer.model.parameters()).detach()
        self.metrics.put("val/loss", float(w.abs().sum()))
        self.metrics.put("val/error", float(w.sum()))


class StopAt(Callback):
    """Stops the run at the end of epoch ``epoch`` (``None``: never), as early stopping."""

    def __init__(self, epoch: int | None) -> None:
        self.epoch = epoch

    def _trigger(self) -> None:
        if self.now.epoch == self.epoch:
            raise StopTraining(f"stopped at epoch {self.epoch}")


class KillAfterFinalCheckpoint(Callback):
    """When armed, copies the run directory as a ``kill -9`` would leave it right after
    the final checkpoint: ``after_train`` runs once ``train_end``'s checkpoint is written
    and before the run's last values are flushed and its end recorded."""

    def __init__(self, run_dir: Path, killed: Path | None = None) -> None:
        self.run_dir, self.killed = run_dir, killed

    def _after_train(self) -> None:
        if self.killed is not None:
            shutil.copytree(self.run_dir, self.killed,
                            ignore=shutil.ignore_patterns(".lock"))


def _trainer(run_dir: Path, *, steps: int, epochs: int, stop: int | None,
             max_steps: int | None = None, killed: Path | None = None) -> Trainer:
    model, opt = tiny_model()
    return Trainer(model, opt, UnevenData([steps] * epochs), mse,
                   schedule=Schedule({"val": every("1 epoch") | on("train_end"),
                                      "stop": every("1 epoch"),
                                      "save": every("2 steps") | on("train_end"),
                                      "kill": on("train_end")}),
                   bindings={"val": Validate(), "stop": StopAt(stop),
                             "save": ModelSaver(keep=2),
                             "kill": KillAfterFinalCheckpoint(run_dir, killed)},
                   max_epochs=epochs, max_steps=max_steps, run_dir=run_dir,
                   handle_signals=False)


def _log(run_dir: Path) -> list[dict[str, Any]]:
    rows = [json.loads(x) for x in (run_dir / "events.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k not in ("time", "seconds", "duration")} for r in rows]


def _status(run_dir: Path) -> tuple[str, int, int]:
    data = json.loads((run_dir / "run.json").read_text())
    return data["status"], data["step"], data["epoch"]


def _resume_auto(run_dir: Path, **kw: Any) -> Trainer:
    t = _trainer(run_dir, **kw)
    found = t.checkpoints.newest_valid(run_dir / "checkpoints")
    assert found is not None
    t.resume(found)
    t.fit()
    return t


@settings(max_examples=12, deadline=None)
@given(steps=st.integers(1, 4), epochs=st.integers(1, 4), stop=st.integers(0, 4),
       at_max_steps=st.booleans())
def test_killed_after_the_final_checkpoint_resumes_to_the_same_end(
        tmp_path_factory: pytest.TempPathFactory, steps: int, epochs: int, stop: int,
        at_max_steps: bool) -> None:
    """The resumed run's log, weights and recorded end (finished, or stopped early at
    the same step) equal the uninterrupted run's; the last events' values are written."""
    tmp = tmp_path_factory.mktemp("end")
    kw: dict[str, Any] = {"steps": steps, "epochs": epochs,
                          "stop": stop if 0 < stop <= epochs else None,
                          "max_steps": steps * epochs if at_max_steps else None}
    full = _trainer(tmp / "full", killed=tmp / "killed", **kw)
    full.fit()
    killed = _log(tmp / "killed")
    assert _status(tmp / "killed")[0] == "running"
    assert len(killed) < len(_log(tmp / "full"))  # the last values never reached it
    resumed = _resume_auto(tmp / "killed", **kw)
    assert _log(tmp / "killed") == _log(tmp / "full")
    assert _status(tmp / "killed") == _status(tmp / "full")
    # the reason is in the checkpoint, the place is not
    assert (resumed.stopped and resumed.stopped.reason) == (full.stopped and full.stopped.reason)
    for name, value in full.model.state_dict().items():
        assert torch.equal(value, resumed.model.state_dict()[name])


def test_a_run_recorded_as_ended_with_a_short_log_gets_its_lines(tmp_path: Path) -> None:
    """run.json says finished but events.jsonl stops where the final checkpoint was
    taken: `--resume auto` writes what that checkpoint holds unwritten, then says there
    is nothing left to do."""
    kw: dict[str, Any] = {"steps": 3, "epochs": 2, "stop": None}
    _trainer(tmp_path / "full", killed=tmp_path / "killed", **kw).fit()
    run_file = tmp_path / "killed" / "run.json"
    run_file.write_text(json.dumps({**json.loads(run_file.read_text()),
                                    "status": "finished"}))
    with pytest.raises(RunEnded):
        _resume_auto(tmp_path / "killed", **kw)
    assert _log(tmp_path / "killed") == _log(tmp_path / "full")
    with pytest.raises(RunEnded):  # again: nothing more is written
        _resume_auto(tmp_path / "killed", **kw)
    assert _log(tmp_path / "killed") == _log(tmp_path / "full")
