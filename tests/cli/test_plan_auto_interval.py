"""``schedtrain plan`` with ``every = "auto"``: the interval, the work lost per failure and
the overhead, from ``--checkpoint-seconds`` or ``--costs``; the plan's firings use it."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from schedtrain.cli import main

_SPEC = """
[clock]
epochs = 1
steps_per_epoch = {steps}
seconds_per_step = {step_s}

[run]
mtbf = "{mtbf} s"
{overhead}

[callbacks.save]
type = "ModelSaver"
trigger = {{ every = "auto", offset = "5 steps" }}
"""


def _spec(tmp: Path, steps: int = 400, step_s: float = 0.5, mtbf: int = 3600,
          overhead: str = "") -> Path:
    path = tmp / "auto.toml"
    path.write_text(_SPEC.format(steps=steps, step_s=step_s, mtbf=mtbf, overhead=overhead))
    return path


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.floats(0.1, 100.0), st.integers(60, 100_000), st.sampled_from(["", "1%", "5%"]))
def test_plan_json_gives_young_daly_and_fires_at_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], cost: float, mtbf: int,
        share: str) -> None:
    overhead = f'max_checkpoint_overhead = "{share}"' if share else ""
    spec = _spec(tmp_path, mtbf=mtbf, overhead=overhead)
    capsys.readouterr()
    assert main(["plan", str(spec), "--checkpoint-seconds", str(cost), "--format",
                 "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    [got] = out["auto_intervals"]
    steps = max(1, round(math.sqrt(2 * cost * mtbf) / 0.5))
    if share:
        steps = max(steps, math.ceil(cost / (float(share[:-1]) / 100 * 0.5) - 1e-9))
    assert got["interval_steps"] == steps
    assert got["lost_per_failure_seconds"] == pytest.approx(steps * 0.5 / 2)
    assert got["overhead"] == pytest.approx(cost / (steps * 0.5))
    fired = [f["step"] for f in out["firings"] if f["callback"] == "save"]
    assert fired == list(range(5, 401, steps))


def test_plan_table_names_interval_loss_and_overhead(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", str(_spec(tmp_path, mtbf=7200)), "--checkpoint-seconds", "30"]) == 0
    out = capsys.readouterr().out
    # sqrt(2 * 30 * 7200) = 657.3 s = 1315 steps of 0.5 s
    assert ("save: every 1,315 steps (657.5 s) for a save of 30 s and MTBF 7200 s; work lost "
            "per failure 328.8 s (interval/2 + restart 0 s); overhead 4.56%") in out


def test_plan_costs_reads_an_auto_runs_logged_save_cost(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    events = tmp_path / "events.jsonl"
    rows = [{"kind": "firing", "callback": "save", "event": "step_end", "step": s,
             "epoch": 0, "time": 100.0 + s, "duration": 0.01} for s in (10, 20, 30)]
    rows += [{"kind": "scalar", "name": "save/save_cost", "value": v, "step": s, "epoch": 0,
              "time": 1.0} for s, v in ((10, 2.0), (20, 4.0))]
    events.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert main(["plan", str(_spec(tmp_path, mtbf=100)), "--costs", str(events),
                 "--format", "json"]) == 0
    [got] = json.loads(capsys.readouterr().out)["auto_intervals"]
    assert got["save_seconds"] == 3.0


def test_plan_without_a_cost_warns_and_uses_the_start(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", str(_spec(tmp_path))]) == 0
    assert "every = \"auto\" is planned at its start interval; --checkpoint-seconds" \
        in capsys.readouterr().err


@pytest.mark.parametrize("bad", ["0", "-3", "inf", "nan", "soon"])
def test_a_bad_checkpoint_seconds_is_a_usage_error(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], bad: str) -> None:
    assert main(["plan", str(_spec(tmp_path)), "--checkpoint-seconds", bad]) == 2
    assert f"--checkpoint-seconds: expected seconds > 0, got {bad!r}" in capsys.readouterr().err
