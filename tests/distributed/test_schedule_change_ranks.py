"""A changed schedule on two processes (torchrun, gloo): refused alike, applied alike."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torchrun_helpers import forked_ranks

pytestmark = pytest.mark.skipif(not torch.distributed.is_available(),
                                reason="torch.distributed is not available")

SPEC = """\
[run]
task = "jobs.ddp:make_task"
max_epochs = {epochs}
seed = 1

[callbacks.validate]
type = "InferenceRunner"
trigger = {validate}

[callbacks.best]
type = "MinSaver"
trigger = {{ all = [{{ every = "1 epoch" }}, {{ improved = "val/loss" }}] }}

[callbacks.save]
type = "ModelSaver"
keep = 2
trigger = {{ every = "1 epoch" }}

[callbacks.samples]
type = "jobs.ddp:DumpFirings"
trigger = {{ on = "train_end" }}
"""


def test_two_ranks_refuse_then_apply_alike(tmp_path: Path) -> None:
    """Resumed with validation every 5 steps instead of every epoch: both ranks refuse
    (the chief prints the diff once); with apply both ranks fire the same, on the run's
    grid, and the one log holds one schedule_change line."""
    old = tmp_path / "old.toml"
    old.write_text(SPEC.format(epochs=2, validate='{ every = "1 epoch" }'))
    new = tmp_path / "new.toml"
    new.write_text(SPEC.format(epochs=3, validate='{ every = "5 steps" }'))
    run_dir = tmp_path / "run"
    first = forked_ranks(old, run_dir)
    assert first.returncode == 0, first.stderr[-3000:]
    refused = forked_ranks(new, run_dir, "--resume", "auto")
    assert refused.returncode != 0
    assert refused.stderr.count("was saved with another schedule") == 1, refused.stderr[-3000:]
    assert "changed callbacks.validate.trigger" in refused.stderr
    assert "--schedule-change apply" in refused.stderr
    applied = forked_ranks(new, run_dir, "--resume", "auto", "--schedule-change", "apply")
    assert applied.returncode == 0, applied.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"firings-rank{r}.json").read_text()) for r in (0, 1)]
    assert ranks[0] == ranks[1]
    rows = [json.loads(x) for x in (run_dir / "events.jsonl").read_text().splitlines()]
    (change,) = [r for r in rows if r["kind"] == "schedule_change"]
    assert change["step"] == 16 and change["rules"]["reset"] == ["validate"]
    after = rows[rows.index(change) + 1:]
    assert [(r["event"], r["step"]) for r in after
            if r.get("callback") == "validate"] == [("step_end", 20)]


RETIME = """\
[run]
task = "jobs.ddp:make_task"
max_epochs = 6
seed = 1

[callbacks.ask]
type = "jobs.retime:AskRetime"
spec = "new.toml"
trigger = {{ at = "3 steps" }}

[callbacks.validate]
type = "InferenceRunner"
trigger = {validate}

[callbacks.slow]
type = "jobs.ddp:Sleep"
seconds = 0.05
trigger = {{ every = "1 step" }}

[callbacks.samples]
type = "jobs.ddp:DumpFirings"
trigger = {{ on = "train_end" }}
"""


def test_two_ranks_take_a_live_retime_at_one_step(tmp_path: Path) -> None:
    """A retime asked while two ranks train: the chief sees the request, both apply it
    after the same step_end (the log has one schedule_change line), and both fire the
    old schedule before it and the new one after it, alike."""
    old = tmp_path / "old.toml"
    old.write_text(RETIME.format(validate='{ every = "7 steps" }'))
    (tmp_path / "new.toml").write_text(RETIME.format(validate='{ every = "5 steps" }'))
    run_dir = tmp_path / "run"
    done = forked_ranks(old, run_dir)
    assert done.returncode == 0, done.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"firings-rank{r}.json").read_text()) for r in (0, 1)]
    assert ranks[0] == ranks[1]
    rows = [json.loads(x) for x in (run_dir / "events.jsonl").read_text().splitlines()]
    (change,) = [r for r in rows if r["kind"] == "schedule_change"]
    step = change["step"]
    assert change["rule"] == "retime" and change["rules"]["reset"] == ["validate"]
    validate = [s for c, e, s, _ in ranks[0] if c == "validate" and e == "step_end"]
    assert validate == (list(range(7, step + 1, 7))
                        + list(range(5 * (step // 5 + 1), 6 * 8 + 1, 5)))
