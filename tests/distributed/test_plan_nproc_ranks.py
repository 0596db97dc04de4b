"""``plan --import --nproc 2`` counts the steps per epoch a real two-process run (torchrun,
gloo) takes on each rank: 250 samples in batches of 10 are 25 steps on one process, 13 a
rank on two (125 samples each), not 25 / 2."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from torchrun_helpers import forked_ranks

from schedtrain.cli import main

pytestmark = pytest.mark.skipif(not torch.distributed.is_available(),
                                reason="torch.distributed is not available")

SPEC = """\
[run]
task = "jobs.ddp:make_sized_task"
max_epochs = 2
seed = 1
strategy = "ddp"

[callbacks.samples]
type = "jobs.ddp:DumpFirings"
trigger = { on = "train_end" }
"""


def _planned(capsys: pytest.CaptureFixture[str], *args: str) -> int:
    capsys.readouterr()
    assert main(["plan", *args]) == 0
    found = re.search(r"2 epochs x ([\d,]+) steps", capsys.readouterr().out)
    assert found is not None
    return int(found[1])


def test_plan_counts_the_steps_each_rank_takes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("SIZED_TASK", "250,10,0")
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    spec = tmp_path / "job.toml"
    spec.write_text(SPEC)
    result = forked_ranks(spec, tmp_path / "run")
    assert result.returncode == 0, result.stderr[-3000:]
    ends = []
    for rank in (0, 1):
        firings = json.loads((tmp_path / f"firings-rank{rank}.json").read_text())
        [end] = [f for f in firings if f[1] == "train_end"]
        ends.append(end[2])
    assert ends[0] == ends[1]
    per_epoch = ends[0] // 2
    assert per_epoch == 13
    assert _planned(capsys, str(spec), "--import", "--nproc", "2") == per_epoch
    assert _planned(capsys, str(spec), "--import") == 25  # one process, with a note
