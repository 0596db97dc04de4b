"""Retention across a resume that applies a changed schedule: a saver whose trigger
changed keeps its record of the files it wrote, so ``keep`` rules on epochs (or
samples, tokens, time) still know each file, locally and in a bucket."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from schedtrain import Schedule, every
from schedtrain.callbacks.saver import ModelSaver
from schedtrain.checkpoints.storage import FsspecStorage
from schedtrain.retention import Saved, parse_keep, retained
from schedtrain.time import Timestamp
from schedtrain.training import Trainer

KEEP: Any = {"any": [{"latest": 2}, {"every": "5 epochs"}]}
STEPS = 5  # per epoch: 20 rows, batches of 4


def _trainer(run_dir: Path, period: int, epochs: int, keep: Any = KEEP,
             **kwargs: Any) -> Trainer:
    torch.manual_seed(0)
    x = torch.randn(4 * STEPS, 3)
    model = torch.nn.Linear(3, 1)
    return Trainer(model, torch.optim.SGD(model.parameters(), lr=0.01),
                   DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=4),
                   torch.nn.functional.mse_loss,
                   schedule=Schedule({"ckpt": every(f"{period} epochs")}),
                   bindings={"ckpt": ModelSaver(keep=keep)}, max_epochs=epochs,
                   run_dir=run_dir, **kwargs)


def _expected(keep: Any, epochs: list[int]) -> list[str]:
    """The files the policy leaves after saves at the ends of ``epochs``, pruned after each."""
    policy = parse_keep(keep)
    kept: list[Saved] = []
    for e in epochs:
        kept.append(Saved(f"step-{e * STEPS:08d}.pt", Timestamp(step=e * STEPS, epoch=e)))
        kept = [kept[i] for i in sorted(retained(policy, kept))]
    return [s.name for s in kept]


def _change(run_dir: Path, old: int, new: int, first: int, second: int,
            **kwargs: Any) -> None:
    _trainer(run_dir, old, first, **kwargs).fit()
    t = _trainer(run_dir, new, second, schedule_change="apply", **kwargs)
    t.resume(t.checkpoints.mount.newest_to_resume(run_dir / "checkpoints"))
    t.fit()


@pytest.mark.parametrize(("old", "new"), [(1, 2), (1, 3), (2, 1)])
def test_applied_change_keeps_what_keep_keeps(tmp_path: Path, old: int, new: int) -> None:
    """D2: the ``every 5 epochs`` files of the first part survive a resume that changes
    the saver's trigger, and the files left are those the policy keeps of all the saves,
    as if the records had never been reset."""
    _change(tmp_path, old, new, 12, 20)
    saves = [*range(old, 13, old), *range(12 + new, 21, new)]
    files = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert files == _expected(KEEP, saves)
    milestones = {f"step-{e * STEPS:08d}.pt" for e in (5, 10)} if old == 1 else {
        f"step-{e * STEPS:08d}.pt" for e in (6, 10)}
    assert milestones <= set(files)


def test_a_renamed_saver_leaves_the_old_files(tmp_path: Path) -> None:
    """A saver under a new name (the old one's records dropped) never judges files it
    has no record of: the old saver's files all stay, its own are pruned."""
    _trainer(tmp_path, 1, 6).fit()
    torch.manual_seed(0)
    x = torch.randn(4 * STEPS, 3)
    model = torch.nn.Linear(3, 1)
    t = Trainer(model, torch.optim.SGD(model.parameters(), lr=0.01),
                DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=4),
                torch.nn.functional.mse_loss, schedule=Schedule({"save": every("1 epoch")}),
                bindings={"save": ModelSaver(keep=1)}, max_epochs=9, run_dir=tmp_path,
                schedule_change="apply")
    t.resume(tmp_path / "checkpoints" / "step-00000030.pt")
    t.fit()
    files = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert files == ["step-00000025.pt", "step-00000030.pt", "step-00000045.pt"]


@pytest.mark.filterwarnings("ignore::schedtrain.ScheduleWarning")
def test_applied_change_in_a_bucket(tmp_path: Path, s3_bucket: tuple[str, dict[str, Any]]
                                    ) -> None:
    """D2 on S3 (moto): the milestones in the bucket survive the applied change."""
    url, options = f"{s3_bucket[0]}/dk/checkpoints", s3_bucket[1]
    _change(tmp_path, 1, 2, 12, 16, checkpoint_dir=url, storage_options=options)
    store = FsspecStorage(url, options)
    assert sorted(store.committed()) == _expected(KEEP, [*range(1, 13), 14, 16])
    assert {"step-00000025.pt", "step-00000050.pt"} <= set(store.committed())
