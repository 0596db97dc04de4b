"""Cost and ETA (issue 20 item 4): firing durations in events.jsonl, and ``plan --costs``
predicting a longer run from a shorter one's measurements."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

import attrs
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
from schedtrain.planning.costs import CostError, predict_firings, read_costs
from schedtrain.schedule.firings import Firing
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
        assert c["first"] == (measured[0] if measured else 0)
        later = statistics.fmean(measured[1:]) if len(measured) > 1 else c["first"]
        assert c["total"] == pytest.approx(c["first"] + (c["firings"] - 1) * later)
    assert got["step_seconds"] == pytest.approx(got["steps"] * costs.seconds_per_step)
    assert got["warmup_seconds"] == costs.warmup and got["tail_seconds"] == costs.tail > 0
    assert got["total_seconds"] == pytest.approx(
        got["warmup_seconds"] + got["step_seconds"] + got["tail_seconds"]
        + sum(c["total"] for c in got["callbacks"]))
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


# -- the model, on runs written with a fake clock ------------------------------------------


@attrs.frozen
class _FakeRun:
    """A run's timing as the model sees it: the first step takes ``warmup`` more than
    ``per_step``; callback "a" fires every ``k`` steps, "v" every ``m`` steps and at
    ``train_end``, "s" at ``train_start``; each callback's first firing takes
    ``first[name]``, the others ``later[name]``; the run ends ``tail`` after its last."""

    per_step: float
    warmup: float
    k: int
    m: int
    first: dict[str, float]
    later: dict[str, float]
    tail: float

    def firings(self, steps: int) -> list[Firing]:
        out = [Firing("s", "train_start", Timestamp())]
        for step in range(1, steps + 1):
            out += [Firing(n, "step_end", Timestamp(step=step))
                    for n, k in (("a", self.k), ("v", self.m)) if step % k == 0]
        if steps % self.m:
            out.append(Firing("v", "train_end", Timestamp(step=steps)))
        return out

    def write(self, run_dir: Path, steps: int) -> float:
        """Write the run's events.jsonl and run.json; return its wall time."""
        t0 = 1_000_000.0
        now, done, seen, lines = t0, 0, set(), []
        for f in self.firings(steps):
            if f.step > done:  # the steps up to this event
                now += (f.step - done) * self.per_step + (self.warmup if done == 0 else 0)
                done = f.step
            dur = self.later[f.callback] if f.callback in seen else self.first[f.callback]
            seen.add(f.callback)
            lines.append(json.dumps({"kind": "firing", "callback": f.callback,
                                     "event": f.event, "step": f.step, "time": now,
                                     "seconds": now - t0, "duration": dur}))
            now += dur
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "events.jsonl").write_text("\n".join(lines) + "\n")
        (run_dir / "run.json").write_text(json.dumps({"status": "finished",
                                                      "updated": now + self.tail}))
        return now + self.tail - t0


_seconds = st.floats(0, 3, allow_nan=False)


_by_callback = st.fixed_dictionaries(dict.fromkeys("asv", _seconds))
_runs = st.builds(_FakeRun, per_step=st.floats(0.01, 1), warmup=_seconds,
                  k=st.integers(1, 6), m=st.integers(1, 6), first=_by_callback,
                  later=_by_callback, tail=_seconds)


@given(_runs, st.integers(0, 10), st.integers(1, 200))
def test_a_short_run_predicts_a_long_one_exactly(run: _FakeRun, extra: int,
                                                 more: int) -> None:
    """When time behaves as the model says (a warm-up, a steady step, first firings
    apart, an end), a short run's log predicts a longer run's wall time exactly."""
    import tempfile
    k, m, per_step, warmup = run.k, run.m, run.per_step, run.warmup
    short = 2 * max(k, m) + extra  # every callback fires twice at least
    with tempfile.TemporaryDirectory() as d:
        run.write(Path(d) / "short", short)
        real = run.write(Path(d) / "long", short + more)
        costs = read_costs(Path(d) / "short" / "events.jsonl")
    assert costs.seconds_per_step == pytest.approx(per_step)
    assert costs.warmup == pytest.approx(warmup, abs=1e-6)
    pred = predict_firings(run.firings(short + more), short + more, costs)
    assert pred.total == pytest.approx(real, rel=1e-9)


def test_warmup_is_paid_once_and_not_in_the_step(tmp_path: Path) -> None:
    """A slow first step is measured apart: the steady rate, and the excess once."""
    run = _FakeRun(0.1, 2.0, 5, 7, dict.fromkeys("asv", 0.0), dict.fromkeys("asv", 0.0), 0.0)
    run.write(tmp_path, 30)
    costs = read_costs(tmp_path / "events.jsonl")
    assert (costs.seconds_per_step, costs.warmup) == (pytest.approx(0.1), pytest.approx(2.0))
    pred = predict_firings(run.firings(300), 300, costs)
    assert pred.total == pytest.approx(300 * 0.1 + 2.0)
    assert pred.offsets[0] == 0  # train_start: before any step, before the warm-up


def test_first_firing_is_priced_apart(tmp_path: Path) -> None:
    """The first firing costs what the first measured one did, the others the mean of
    the later ones; a callback fired once costs its one measurement each time."""
    rows = [_line("v", 5, 1.0, 3.0), _line("v", 10, 5.0, 1.0), _line("v", 15, 7.0, 2.0),
            _line("a", 15, 9.0, 0.5)]
    (tmp_path / "events.jsonl").write_text("\n".join(rows) + "\n")
    costs = read_costs(tmp_path / "events.jsonl")
    assert [costs.firing("v", n) for n in range(3)] == [3.0, 1.5, 1.5]
    assert [costs.firing("a", n) for n in range(2)] == [0.5, 0.5]
    assert costs.firing("never", 0) == 0
    pred = predict_firings([Firing("v", "step_end", Timestamp(step=s)) for s in (5, 10)],
                           10, costs)
    assert pred.callbacks[0].total == 4.5 and pred.callbacks[0].first == 3.0


@pytest.mark.parametrize(("status", "tail"), [("finished", 2.5), ("stopped", 2.5),
                                              ("running", 0.0), ("failed", 0.0)])
def test_end_of_the_run_from_run_json(tmp_path: Path, status: str, tail: float) -> None:
    """The end after the last firing comes from a run that ended (finished or stopped);
    a run still running or failed says nothing about it."""
    (tmp_path / "events.jsonl").write_text(
        "\n".join([_line("a", 2, 10.0, 0.5), _line("a", 4, 11.0, 0.5)]) + "\n")
    (tmp_path / "run.json").write_text(json.dumps({"status": status, "updated": 14.0}))
    assert read_costs(tmp_path / "events.jsonl").tail == tail
