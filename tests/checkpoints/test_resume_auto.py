"""``Trainer.resume("auto")``: Python's ``--resume auto``, reading the checkpoint once."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from training_helpers import UnevenData, comparable, tiny_model

from schedtrain import Schedule, every
from schedtrain.callbacks import ModelSaver
from schedtrain.checkpoints import store
from schedtrain.training import Trainer


def _trainer(run_dir: Path, **kw: Any) -> Trainer:
    model, opt = tiny_model()
    return Trainer(model, opt, UnevenData([4] * 6), torch.nn.functional.mse_loss,
                   schedule=Schedule({"save": every(4, "steps")}),
                   bindings={"save": ModelSaver(keep=10)}, device="cpu",
                   run_dir=run_dir, handle_signals=False, checkpoint_mode="sync", **kw)


def _count_reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    reads: list[str] = []
    real = store.load_checked

    def counted(source: Any, map_location: Any, *, shown: Any) -> dict[str, Any]:
        reads.append(str(shown))
        return real(source, map_location, shown=shown)

    monkeypatch.setattr(store, "load_checked", counted)
    return reads


def test_resume_auto_reads_the_checkpoint_once_and_resumes_exactly(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The newest good checkpoint is read once (to check and to restore), and the resumed
    run ends as the uninterrupted one: same firings, same weights."""
    whole = _trainer(tmp_path / "whole", max_epochs=4)
    whole.fit()
    cut = _trainer(tmp_path / "cut", max_steps=10)
    cut.fit()
    again = _trainer(tmp_path / "cut", max_epochs=4)
    reads = _count_reads(monkeypatch)
    found = again.resume("auto")
    assert found == tmp_path / "cut" / "checkpoints" / "step-00000008.pt"
    assert reads == [str(found)]
    again.fit()
    after = [f for f in comparable(whole.firings) if f[2].step > 8]
    assert after and [f for f in comparable(again.firings) if f[2].step > 8] == after
    for a, b in zip(again.model.parameters(), whole.model.parameters(), strict=True):
        assert torch.equal(a, b)


def test_resume_auto_passes_over_a_damaged_newest(tmp_path: Path) -> None:
    """A damaged newest checkpoint is passed over for the one before it."""
    _trainer(tmp_path, max_steps=9).fit()
    folder = tmp_path / "checkpoints"
    newest = sorted(folder.glob("step-*.pt"))[-1]
    newest.write_bytes(newest.read_bytes()[:100])
    again = _trainer(tmp_path, max_epochs=4)
    found = again.resume("auto")
    assert found == sorted(folder.glob("step-*.pt"))[-2]
    assert again.clock.step == int(Path(found).stem.split("-")[1])


def test_resume_auto_without_a_checkpoint_starts_over(tmp_path: Path) -> None:
    """Nothing to resume: ``None``, and fit trains from step 0 in that directory."""
    again = _trainer(tmp_path, max_steps=2)
    assert again.resume("auto") is None
    again.fit()
    assert again.clock.step == 2


def test_resume_auto_needs_a_run_directory() -> None:
    """Without ``run_dir`` there is nowhere to look: one line says so."""
    model, opt = tiny_model()
    t = Trainer(model, opt, UnevenData([2]), torch.nn.functional.mse_loss, max_epochs=1,
                handle_signals=False)
    with pytest.raises(ValueError, match="run_dir"):
        t.resume("auto")
