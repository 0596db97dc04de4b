"""Deadlines on two real ranks (torchrun, gloo on the CPU): decided on the chief, agreed."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from test_distributed import rank_firings, write_spec
from torchrun_helpers import forked_ranks

pytestmark = pytest.mark.skipif(not torch.distributed.is_available(),
                                reason="torch.distributed is not available")


def test_both_ranks_fire_deadline_triggers_at_the_same_steps(tmp_path: Path) -> None:
    """Each rank reads its own wall clock; the chief's deadline and time decide, so
    `before_deadline` fires once, at one step on both, and `time_left` alike."""
    spec = write_spec(tmp_path, """
[callbacks.slow]
type = "jobs.ddp:Sleep"
seconds = 0.05
trigger = { every = "1 step" }

[callbacks.last_save]
type = "ModelSaver"
trigger = { before_deadline = "0.7 s" }

[callbacks.late]
type = "ModelSaver"
trigger = { every = "1 step", if = "time_left < 0.4 s" }
""")
    spec.write_text(spec.read_text().replace("seed = 1\n", 'seed = 1\ndeadline = "1 s"\n'))
    result = forked_ranks(spec, tmp_path / "run")
    assert result.returncode == 0, result.stderr[-3000:]
    zero, one = rank_firings(tmp_path, 0), rank_firings(tmp_path, 1)
    assert zero == one
    once = [f[2] for f in zero if f[0] == "last_save"]
    late = [f[2] for f in zero if f[0] == "late" and f[1] == "step_end"]
    assert len(once) == 1 and late and once[0] <= late[0]  # type: ignore[operator]
