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
    t.resume("auto")
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
        f"step-{e * STEPS:08d}.pt" for e in (4, 10)}
    assert milestones <= set(files)


@pytest.mark.filterwarnings("ignore::schedtrain.ScheduleWarning")
def test_applied_change_in_a_bucket(tmp_path: Path, s3_bucket: tuple[str, dict[str, Any]]
                                    ) -> None:
    """D2 on S3 (moto): the milestones in the bucket survive the applied change."""
    url, options = f"{s3_bucket[0]}/dk/checkpoints", s3_bucket[1]
    _change(tmp_path, 1, 2, 12, 16, checkpoint_dir=url, storage_options=options)
    store = FsspecStorage(url, options)
    assert sorted(store.committed()) == _expected(KEEP, [*range(1, 13), 14, 16])
    assert {"step-00000025.pt", "step-00000050.pt"} <= set(store.committed())


@pytest.mark.parametrize("keep", [KEEP, 2, {"any": [{"latest": 1}, {"every": "3 epochs"}]}])
def test_the_refusal_lists_the_files_the_change_deletes(tmp_path: Path, keep: Any) -> None:
    """The changed-schedule refusal lists, of the saver's files there now, those the
    new schedule deletes by the end of the run; applied, the run deletes exactly those
    (and `diff CHECKPOINT NEW` lists them alike)."""
    from schedtrain.training.control.schedule_change import ScheduleChanged

    _trainer(tmp_path, 1, 12, keep).fit()
    there = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    refused = _trainer(tmp_path, 2, 20, keep)
    newest = tmp_path / "checkpoints" / there[-1]
    with pytest.raises(ScheduleChanged) as caught:
        refused.resume(newest)
    refused.close()
    (change,) = caught.value.diff.files
    assert sorted(change.there) == there
    assert "checkpoint files:" in str(caught.value)
    assert f"of its {len(there)} checkpoint files there now" in str(caught.value)
    t = _trainer(tmp_path, 2, 20, keep, schedule_change="apply")
    t.resume(newest)
    t.fit()
    left = {p.name for p in (tmp_path / "checkpoints").iterdir()}
    assert sorted(n for n in there if n not in left) == sorted(change.new)


def test_diff_lists_the_files_the_change_deletes(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """`schedtrain diff CHECKPOINT NEW.toml --epochs E --steps-per-epoch S` lists the
    files of the checkpoint's savers the new schedule deletes (its JSON too)."""
    import json

    from schedtrain.cli import main

    _trainer(tmp_path, 1, 12).fit()
    spec = tmp_path / "new.toml"
    spec.write_text('[callbacks.ckpt]\ntype = "ModelSaver"\nkeep = 2\n'
                    'trigger = { every = "2 epochs" }\n')
    checkpoint = str(tmp_path / "checkpoints" / "step-00000060.pt")
    shape = ["--epochs", "20", "--steps-per-epoch", str(STEPS)]
    assert main(["diff", checkpoint, str(spec), *shape]) == 1
    out = capsys.readouterr().out
    assert "the new schedule deletes step-00000025.pt, step-00000050.pt, step-00000055.pt, "\
        "step-00000060.pt" in out, out
    assert main(["diff", checkpoint, str(spec), *shape, "--format", "json"]) == 1
    (files,) = json.loads(capsys.readouterr().out)["files"]
    assert files["deleted_by_new"] == ["step-00000025.pt", "step-00000050.pt",
                                       "step-00000055.pt", "step-00000060.pt"]
