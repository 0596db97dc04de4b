"""A run interrupted at a checkpoint and resumed fires exactly what the uninterrupted run fires."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader, TensorDataset
from training_helpers import Noop, comparable

from schedtrain import Schedule, at, every, improved, on, plateau
from schedtrain.callbacks.inference import InferenceRunner
from schedtrain.callbacks.saver import ModelSaver
from schedtrain.training import Trainer


def _make(run_dir: Path, save_at: str, accum: int = 1) -> Trainer:
    torch.manual_seed(0)
    x = torch.randn(40, 4)
    y = (x[:, 0] > 0).long()
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Dropout(0.2),
                                torch.nn.Linear(8, 2))
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    schedule = Schedule({
        "validate": every("1 epoch") | every("7 steps"),
        "save": at(save_at) if save_at else on("never_fired"),
        # bands that some gains fall inside (accuracy moves in steps of 1/40): the best
        # kept across the resume is then not the last value
        "best": improved("val/loss", min_delta=0.02),
        "flat": plateau("val/accuracy", 2, mode="max", min_delta=0.03),
        "tick": every("3 steps") | on("epoch_start"),
        "end": on("train_end"),
    }, events=("never_fired",))
    return Trainer(
        model, opt, DataLoader(TensorDataset(x, y), batch_size=4, shuffle=True),
        torch.nn.functional.cross_entropy,
        schedule=schedule,
        bindings={"validate": InferenceRunner(), "save": ModelSaver(keep=None),
                  "best": Noop(), "flat": Noop(), "tick": Noop(), "end": Noop()},
        val_data=DataLoader(TensorDataset(x, y), batch_size=8), max_epochs=4,
        grad_accum=accum, run_dir=run_dir)


def _cut(firings: list, step: int, event: str) -> int:
    """Index just after the last firing at (event, step): where the checkpoint was written."""
    idx = [i for i, f in enumerate(firings) if f.event == event and f.step == step]
    return idx[-1] + 1


class TestResume:
    """save_checkpoint / resume reproduce the uninterrupted run."""

    @settings(max_examples=12, deadline=None)
    @given(st.integers(1, 39), st.sampled_from([1, 2]))
    def test_resume_at_any_step_equals_uninterrupted(self, tmp_path_factory: pytest.TempPathFactory,
                                                     save_step: int, accum: int) -> None:
        """Resume at a random step (mid-epoch or at an epoch's last step): same firings, weights."""
        save_step = min(save_step, 40 // accum - 1)
        full_dir = tmp_path_factory.mktemp("full")
        full = _make(full_dir, f"{save_step} steps", accum)
        full.fit()
        ckpt = full_dir / "checkpoints" / f"step-{save_step:08d}.pt"
        assert ckpt.exists()
        resumed = _make(tmp_path_factory.mktemp("resumed"), f"{save_step} steps", accum)
        resumed.resume(ckpt)
        resumed.fit()
        cut = _cut(full.firings, save_step, "step_end")
        assert comparable(resumed.firings) == comparable(full.firings[cut:])
        for a, b in zip(full.model.parameters(), resumed.model.parameters(), strict=True):
            assert torch.equal(a, b)
        assert full.metrics.history("val/loss") == resumed.metrics.history("val/loss")

    def test_resume_at_epoch_end(self, tmp_path: Path) -> None:
        """A checkpoint written at an epoch's end resumes with the next epoch."""
        full = _make(tmp_path / "a", "2 epochs")
        full.fit()
        ckpt = tmp_path / "a" / "checkpoints" / f"step-{20:08d}.pt"
        resumed = _make(tmp_path / "b", "2 epochs")
        resumed.resume(ckpt)
        resumed.fit()
        cut = _cut(full.firings, 20, "epoch_end")
        assert comparable(resumed.firings) == comparable(full.firings[cut:])

    def test_resume_refuses_other_callbacks(self, tmp_path: Path) -> None:
        """A checkpoint from a run with other callbacks is refused, naming both sets."""
        full = _make(tmp_path / "a", "5 steps")
        full.fit()
        model = torch.nn.Linear(4, 2)
        other = Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), [],
                        torch.nn.functional.cross_entropy, callbacks=[Noop()], max_epochs=1)
        with pytest.raises(ValueError, match="saved with callbacks"):
            other.resume(tmp_path / "a" / "checkpoints" / f"step-{5:08d}.pt")
