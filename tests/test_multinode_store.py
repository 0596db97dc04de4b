"""Nodes that share only an object store: every rank resumes the checkpoint the chief
picks, and two "nodes" (two torchrun launchers on one machine, each with its own run
directory) with checkpoints on a real S3 server (moto) train, and resume after a node's
``kill -9``, exactly as one node with two processes does."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from training_helpers import UnevenData, tiny_model

from schedtrain import Schedule, every
from schedtrain.callbacks import ModelSaver
from schedtrain.checkpoints import CheckpointError
from schedtrain.training import Trainer


class _Rank:
    """A rank's agreement with its chief, in one process: ``broadcast`` hands back what
    the chief said (or, on the chief, records what it says)."""

    def __init__(self, rank: int, said: Any = None) -> None:
        self.rank, self.size, self.is_chief, self.said = rank, 2, rank == 0, said
        self.sent: list[Any] = []

    def broadcast(self, obj: Any, src: int = 0) -> Any:
        self.sent.append(obj)
        return obj if self.is_chief else self.said


def _trainer(run_dir: Path, **kw: Any) -> Trainer:
    model, opt = tiny_model()
    return Trainer(model, opt, UnevenData([4] * 6), torch.nn.functional.mse_loss,
                   schedule=Schedule({"save": every(4, "steps")}),
                   bindings={"save": ModelSaver(keep=10)}, device="cpu",
                   run_dir=run_dir, handle_signals=False, checkpoint_mode="sync", **kw)


@pytest.mark.parametrize("said", [None, "step-00000004.pt", "step-00000008.pt"])
def test_a_rank_resumes_the_checkpoint_its_chief_picked(tmp_path: Path, said: str | None
                                                        ) -> None:
    """A non-chief rank resumes the checkpoint named by the chief's broadcast, whatever
    its own view of the folder would pick (here: step 8), and starts over when the chief
    found none; the chief says the name of the one it picked."""
    _trainer(tmp_path, max_steps=10).fit()
    checkpoints = tmp_path / "checkpoints"
    other = _trainer(tmp_path, max_epochs=4)
    rank = _Rank(1, said)
    found = other._run.parts.checkpoints.mount.pick_to_resume(checkpoints, rank)  # type: ignore[arg-type]
    assert rank.sent == [None]
    assert found == (None if said is None else (checkpoints / said, None))
    chief = _Rank(0)
    picked = other._run.parts.checkpoints.mount.pick_to_resume(checkpoints, chief)  # type: ignore[arg-type]
    assert picked is not None and picked[0].name == "step-00000008.pt"
    assert chief.sent == ["step-00000008.pt"]


def test_a_rank_fails_with_its_chief_when_the_chief_cannot_pick(tmp_path: Path) -> None:
    """The chief's failure to list the folder is every rank's: the chief raises its own
    error after telling the others, which raise one naming the chief (none waits)."""
    _trainer(tmp_path, max_steps=10).fit()
    trainer = _trainer(tmp_path, max_epochs=4)
    mount = trainer._run.parts.checkpoints.mount

    def broken(*_: Any) -> None:
        raise CheckpointError(tmp_path, "the store does not answer")

    mount.newest_to_resume = broken  # type: ignore[method-assign]
    chief = _Rank(0)
    with pytest.raises(CheckpointError, match="does not answer"):
        mount.pick_to_resume(tmp_path / "checkpoints", chief)  # type: ignore[arg-type]
    assert chief.sent == [""]
    with pytest.raises(CheckpointError, match="the chief could not pick"):
        mount.pick_to_resume(tmp_path / "checkpoints", _Rank(1, ""))  # type: ignore[arg-type]
