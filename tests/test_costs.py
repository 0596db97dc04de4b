"""Cost and ETA (issue 20 item 4): firing durations in events.jsonl, and ``plan --costs``
predicting a longer run from a shorter one's measurements."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from jobs.trials import write_spec
from training_helpers import Noop, UnevenData, tiny_model

from schedtrain import Schedule, every
from schedtrain.cli.main import main
from schedtrain.monitors.cadence import Every
from schedtrain.monitors.jsonl import JsonlWriter
from schedtrain.planning.costs import CostError, read_costs
from schedtrain.time import Timestamp
from schedtrain.training import Trainer


def _rows(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in (run_dir / "events.jsonl").read_text().splitlines()]


def _train(tmp: Path, name: str, epochs: int) -> Path:
    spec = write_spec(tmp / name, epochs)
    run_dir = tmp / name / "run"
    assert main(["train", str(spec), "--run-dir", str(run_dir)]) == 0
    return run_dir


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("costs")
    return {"short": _train(tmp, "short", 1), "long": _train(tmp, "long", 2)}


def test_every_firing_line_has_its_duration(runs: dict[str, Path]) -> None:
    """Each firing line carries the non-negative seconds its callback ran."""
    firings = [r for r in _rows(runs["short"]) if r["kind"] == "firing"]
    assert firings
    assert all(isinstance(r["duration"], float) and r["duration"] >= 0 for r in firings)


def test_plan_costs_predicts_the_longer_runs_firings(
        runs: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    """The short run's costs applied to the 2-epoch plan: the planned firings are the ones
    the 2-epoch run made, and the predicted time is the arithmetic of the measurements."""
    spec = runs["long"].parent / "specs" / "crash.toml"
    capsys.readouterr()
    assert main(["plan", str(spec), "--import", "--format", "json",
                 "--costs", str(runs["short"] / "events.jsonl")]) == 0
    doc = json.loads(capsys.readouterr().out)
    real = [r for r in _rows(runs["long"]) if r["kind"] == "firing"]
    # "best" fires only when val/loss improved: the plan without metrics cannot know
    planned = [(f["callback"], f["event"], f["step"]) for f in doc["firings"]
               if f["callback"] != "best"]
    assert planned == [(r["callback"], r["event"], r["step"]) for r in real
                       if r["callback"] != "best"]
    costs = read_costs(runs["short"] / "events.jsonl")
    got = doc["costs"]
    for c in got["callbacks"]:
        measured = costs.durations.get(c["callback"], ())
        assert c["measured"] == len(measured)
        assert c["mean"] == pytest.approx(statistics.fmean(measured) if measured else 0)
        assert c["total"] == pytest.approx(c["firings"] * c["mean"])
    assert got["step_seconds"] == pytest.approx(got["steps"] * costs.seconds_per_step)
    assert got["total_seconds"] == pytest.approx(
        got["step_seconds"] + sum(c["total"] for c in got["callbacks"]))
    offsets = [f["offset_seconds"] for f in doc["firings"]]
    assert offsets == sorted(offsets) and offsets[0] >= 0


def test_share_warning(runs: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    """--warn-share 0 names every callback that took any time; 1 names none."""
    spec = runs["long"].parent / "specs" / "crash.toml"
    events = str(runs["short"] / "events.jsonl")
    capsys.readouterr()
    assert main(["plan", str(spec), "--import", "--costs", events, "--warn-share", "1"]) == 0
    out = capsys.readouterr()
    assert "predicted wall time" in out.out and "warning: callbacks." not in out.err
    assert main(["plan", str(spec), "--import", "--costs", events, "--warn-share", "0"]) == 0
    assert "warning: callbacks.validate takes" in capsys.readouterr().err


def _line(cb: str, step: int, time: float, duration: float) -> str:
    return json.dumps({"kind": "firing", "callback": cb, "event": "step_end", "step": step,
                       "time": time, "duration": duration})


@given(st.lists(st.tuples(st.integers(1, 50), st.floats(0, 5), st.floats(0, 2)),
                min_size=2, max_size=20))
def test_seconds_per_step_excludes_firings(steps: list[tuple[int, float, float]]) -> None:
    """Per step: the span between the first and last firing, less the firings run in it."""
    import tempfile
    step, t, lines = 0, 1000.0, []
    spent = 0.0
    for gap, train, dur in steps:
        step += gap
        t += train
        lines.append(_line("a", step, t, dur))
        t += dur
        spent += dur
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "events.jsonl"
        path.write_text("\n".join(lines) + "\n")
        costs = read_costs(path)
    trained = sum(train for _, train, _ in steps[1:])
    assert costs.seconds_per_step == pytest.approx(trained / (step - steps[0][0]), abs=1e-6)
    assert costs.durations["a"] == tuple(d for _, _, d in steps)


def test_bad_costs_file_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A log without durations is refused naming the file, without a traceback."""
    old = tmp_path / "events.jsonl"
    old.write_text(json.dumps({"kind": "firing", "callback": "a", "step": 1}) + "\n")
    with pytest.raises(CostError, match="no firing line with a \"duration\""):
        read_costs(old)
    spec = write_spec(tmp_path, 1)
    assert main(["plan", str(spec), "--import", "--costs", str(old)]) == 2
    err = capsys.readouterr().err
    assert str(old) in err and "Traceback" not in err


class _OldSink:
    """A user's sink written before durations: ``firing`` with four arguments."""

    def __init__(self) -> None:
        self.firings: list[tuple[str, str, int]] = []

    def scalars(self, records: object) -> None:
        return None

    def firing(self, callback: str, event: str, ts: Timestamp, wall: float) -> None:
        self.firings.append((callback, event, ts.step))

    def close(self) -> None:
        return None


def test_sinks_without_durations_still_get_firings(tmp_path: Path) -> None:
    """A sink with only ``firing`` is told every firing, and the JSONL writer behind a
    cadence wrapper still gets each firing's duration."""
    old = _OldSink()
    model, opt = tiny_model()
    t = Trainer(model, opt, UnevenData([4]), torch.nn.functional.mse_loss,
                schedule=Schedule({"a": every("2 steps")}), bindings={"a": Noop()},
                max_epochs=1, sinks=[old, Every(JsonlWriter(tmp_path / "e.jsonl"), "1 step")])
    t.fit()
    assert old.firings == [("a", "step_end", 2), ("a", "step_end", 4)]
    lines = [json.loads(x) for x in (tmp_path / "e.jsonl").read_text().splitlines()]
    assert [r["duration"] >= 0 for r in lines if r["kind"] == "firing"] == [True, True]
