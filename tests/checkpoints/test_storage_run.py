"""Runs whose checkpoints live in a bucket (S3 on a moto server, Cloud Storage on an
emulator): resume auto, exactness, leftovers, pruning, a fresh run refused."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from test_resume_chain import _log
from test_resume_chain import _trainer as _local_trainer

from schedtrain.checkpoints.storage import FsspecStorage
from schedtrain.errors import Preempted, RunDirError
from schedtrain.training import Trainer

Bucket = tuple[str, dict[str, Any]]


def _trainer(run_dir: Path, url: str, options: dict[str, Any], crash_at: int | None, *,
             preempt: bool = False, overwrite: bool = False) -> Trainer:
    """The crash-chain run of test_resume_chain, its checkpoints at ``url``."""
    return _local_trainer(run_dir, crash_at, 1, 3, preempt=preempt, checkpoint_dir=url,
                          storage_options=options, overwrite=overwrite)


def _resume_auto(t: Trainer) -> None:
    """What ``--resume auto`` does: the newest valid checkpoint, else start over."""
    t.resume("auto")


def _store(bucket: Bucket, prefix: str) -> FsspecStorage:
    return FsspecStorage(f"{bucket[0]}/{prefix}", bucket[1])


@pytest.mark.filterwarnings("ignore::schedtrain.ScheduleWarning")
def test_crash_and_preempt_resume_from_bucket_exactly(tmp_path: Path, object_bucket: Bucket
                                                      ) -> None:
    """A run crashed at step 9 and preempted at step 17, each time resumed from the newest
    committed checkpoint in the bucket, ends with the uninterrupted run's log line for
    line and its weights bit for bit; pruning (keep=2) deleted only the run's own files
    there, and nothing was written to the local checkpoints folder."""
    whole = _local_trainer(tmp_path / "whole", None, 1, 3)
    whole.fit()
    url, options = f"{object_bucket[0]}/lm/checkpoints", object_bucket[1]
    run_dir = tmp_path / "run"
    first = _trainer(run_dir, url, options, 9)
    _resume_auto(first)
    with pytest.raises(RuntimeError, match="crash at step 9"):
        first.fit()
    store = _store(object_bucket, "lm/checkpoints")
    assert sorted(store.committed()) == ["step-00000006.pt", "step-00000008.pt"]
    # Another run's checkpoint in the same folder: never the run's to prune.
    store.write("step-00000000.pt", lambda f: torch.save({"foreign": True}, f))
    second = _trainer(run_dir, url, options, 17, preempt=True)
    _resume_auto(second)
    assert second.clock.step == 8
    with pytest.raises(Preempted):
        second.fit()
    last = _trainer(run_dir, url, options, None)
    _resume_auto(last)
    assert last.clock.step == 17
    last.fit()
    assert _log(run_dir) == _log(tmp_path / "whole")
    for a, b in zip(whole.model.parameters(), last.model.parameters(), strict=True):
        assert torch.equal(a, b)
    assert sorted(store.committed()) == ["step-00000000.pt", "step-00000028.pt",
                                         "step-00000030.pt"]
    assert not (run_dir / "checkpoints").exists()


@pytest.mark.filterwarnings("ignore::schedtrain.ScheduleWarning")
def test_uncommitted_checkpoint_ignored_and_cleaned(tmp_path: Path, object_bucket: Bucket) -> None:
    """A checkpoint file without its manifest (a write cut short) is never resumed from,
    and the run that owns the folder removes it when it opens the run."""
    url, options = f"{object_bucket[0]}/ck", object_bucket[1]
    first = _trainer(tmp_path / "run", url, options, 5)
    _resume_auto(first)
    with pytest.raises(RuntimeError, match="crash at step 5"):
        first.fit()
    store = _store(object_bucket, "ck")
    store.fs.pipe_file(f"{store.root}/step-00000005.pt", b"the first half of a checkpoint")
    again = _trainer(tmp_path / "run", url, options, None)
    _resume_auto(again)
    assert again.clock.step == 4
    again.fit()
    assert not store.fs.exists(f"{store.root}/step-00000005.pt")


@pytest.mark.filterwarnings("ignore::schedtrain.ScheduleWarning")
def test_fresh_run_refused_where_checkpoints_are(tmp_path: Path, object_bucket: Bucket) -> None:
    """A new run (no resume) in an empty run directory whose checkpoint_dir holds
    checkpoints is refused as a run directory holding a run is; overwrite empties it."""
    url, options = f"{object_bucket[0]}/ck", object_bucket[1]
    first = _trainer(tmp_path / "a", url, options, 3)
    with pytest.raises(RuntimeError, match="crash at step 3"):
        first.fit()
    fresh = _trainer(tmp_path / "b", url, options, None)
    with pytest.raises(RunDirError, match=r"checkpoint_dir '.*/ck' holds checkpoints"):
        fresh.fit()
    over = _trainer(tmp_path / "b", url, options, 1, overwrite=True)
    with pytest.raises(RuntimeError, match="crash at step 1"):
        over.fit()
    assert _store(object_bucket, "ck").committed() == []


@pytest.mark.filterwarnings("ignore::schedtrain.ScheduleWarning")
def test_local_folder_elsewhere(tmp_path: Path) -> None:
    """checkpoint_dir a local folder outside the run directory: checkpoints are written
    there (atomically, no manifest), pruned there, and a crashed run resumes from there
    to the uninterrupted run's log and weights."""
    whole = _local_trainer(tmp_path / "whole", None, 1, 3)
    whole.fit()
    elsewhere = tmp_path / "fast" / "ck"
    first = _trainer(tmp_path / "run", str(elsewhere), {}, 13)
    with pytest.raises(RuntimeError, match="crash at step 13"):
        first.fit()
    assert sorted(p.name for p in elsewhere.iterdir()) == ["step-00000010.pt",
                                                           "step-00000012.pt"]
    last = _trainer(tmp_path / "run", str(elsewhere), {}, None)
    _resume_auto(last)
    assert last.clock.step == 12
    last.fit()
    assert _log(tmp_path / "run") == _log(tmp_path / "whole")
    for a, b in zip(whole.model.parameters(), last.model.parameters(), strict=True):
        assert torch.equal(a, b)
    assert not (tmp_path / "run" / "checkpoints").exists()
