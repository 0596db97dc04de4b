"""``plan --costs`` over a real run's ``events.jsonl`` predicts the ``every = "auto"``
interval the run decided: it takes the seconds per step as the run measured them, without
the saves' stalls (a sync save stalls the loop outside any firing's duration)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from schedtrain.checkpoints.mount import Mount
from schedtrain.cli import main

#: The loop's stall per save (seconds): a tenth of the 1 s MTBF, so Young/Daly's interval
#: is about 0.45 s and the stalls are a fifth of the wall time between saves.
_STALL = 0.1

_SPEC = """
[run]
task = "jobs.crash:make_task"
max_epochs = 3
seed = 3
mtbf = "1 s"
checkpoint_mode = "sync"

[callbacks.ckpt]
type = "ModelSaver"
keep = 1
trigger = {{ every = "auto" }}

[callbacks.validate]
type = "InferenceRunner"
trigger = {{ every = "{validate}" }}
"""


def _scalars(events: Path, name: str) -> list[float]:
    rows = [json.loads(x) for x in events.read_text().splitlines()]
    return [float(r["value"]) for r in rows if r.get("kind") == "scalar" and r["name"] == name]


@pytest.mark.parametrize("validate", ["1 epoch", "25 steps"])
def test_the_planned_interval_is_the_one_the_run_decided(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        validate: str) -> None:
    """Tolerance: 3% (and at least one step) of the run's last decided interval; the
    same measurements give the same Young/Daly interval, up to a rounding. A plan that
    counts the stalls in its step time predicts about 20% shorter."""
    real = Mount.write

    def stalled(self: Any, body: Any, path: Any) -> Any:
        import time

        time.sleep(_STALL)
        return real(self, body, path)

    monkeypatch.setattr(Mount, "write", stalled)
    monkeypatch.setenv("CRASH_JOB_STEP_SECONDS", "0.005")  # steps of about 6 ms
    spec = tmp_path / "auto.toml"
    spec.write_text(_SPEC.format(validate=validate))
    monkeypatch.chdir(tmp_path)
    assert main(["train", str(spec), "--run-dir", "run"]) == 0
    events = tmp_path / "run" / "events.jsonl"
    decided = _scalars(events, "ckpt/interval")
    assert len(decided) >= 2 and all(c >= _STALL for c in _scalars(events, "ckpt/save_cost"))
    capsys.readouterr()
    assert main(["plan", str(spec), "--import", "--costs", str(events),
                 "--format", "json"]) == 0
    [got] = json.loads(capsys.readouterr().out)["auto_intervals"]
    assert abs(got["interval_steps"] - decided[-1]) <= max(1, 0.03 * decided[-1]), \
        (got, decided)
