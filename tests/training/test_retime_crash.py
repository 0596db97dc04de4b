"""A real ``schedtrain train`` job retimed by ``schedtrain retime`` while it runs, killed
with SIGKILL after the retime and resumed with ``--resume auto``: the run is exactly the
uninterrupted run retimed at the same step. Each job is a child forked from the test
process (``jobs.forked``: torch imported once)."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest
from jobs import forked
from jobs.forked import Forked
from jobs.trials import compare, env, train, write_spec

import schedtrain.training.control.retime as live
from schedtrain.planning.changes import canonical
from schedtrain.planning.requests import Applied, History, write_history
from schedtrain.spec import load_spec

pytestmark = pytest.mark.slow
EPOCHS = 3


def _log_steps(run_dir: Path) -> list[int]:
    try:
        rows = (run_dir / "events.jsonl").read_text().splitlines()
    except FileNotFoundError:
        return []
    out = []
    for row in rows:
        try:
            step = json.loads(row).get("step")
        except ValueError:  # a line being written
            continue
        if isinstance(step, int):
            out.append(step)
    return out


def _wait_for(what: str, test: object, proc: Forked, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while not test():  # type: ignore[operator]
        if proc.poll() is not None:
            raise AssertionError(f"the job ended before {what}: {proc.communicate()[1][-2000:]}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.005)


def test_kill_9_after_a_retime_then_resume_auto_is_the_retimed_run(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Retimed mid-run (checkpoints every 7 steps instead of 11, validation every 19 steps
    instead of 23), killed after a checkpoint of the new schedule, resumed: the log lines
    and the kept checkpoints' weights equal those of an uninterrupted run that applies the
    same retime at the same step (replayed from retimes.json)."""
    from schedtrain.cli.main import main

    spec = write_spec(tmp_path, EPOCHS)
    new = spec.parent / "new.toml"
    new.write_text(spec.read_text().replace('every = "11 steps"', 'every = "7 steps"')
                   .replace('every = "23 steps"', 'every = "19 steps"'))
    run_dir = tmp_path / "run"
    # The job (forked: it inherits this) looks for a request at each slow-path step, at
    # most 10 steps apart here, instead of once in 0.5 s; paced (10 ms a step), it is
    # still running when the request reaches it, however idle the machine.
    monkeypatch.setattr(live, "POLL_NS", 0)
    proc = forked.schedtrain(["train", str(spec), "--run-dir", str(run_dir)], cwd=tmp_path,
                             env={**env(0), "CRASH_JOB_STEP_SECONDS": "0.01"})
    try:
        _wait_for("training", lambda: any(s >= 20 for s in _log_steps(run_dir)), proc)
        assert main(["retime", str(run_dir), str(new), "--wait", "120"]) == 0
        answer = json.loads((run_dir / "retime.answer.json").read_text())
        step = answer["step"]
        assert answer["status"] == "applied" and step >= 20
        # killed once a checkpoint of the new schedule (every 7 steps) is written
        _wait_for("a checkpoint after the retime",
                  lambda: any(s >= step + 8 for s in _log_steps(run_dir)), proc)
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == -signal.SIGKILL, "killed after it ended: retime it earlier"
    assert json.loads((run_dir / "run.json").read_text())["status"] == "running"
    resumed = train(spec, run_dir, fork=True)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    # The uninterrupted run with the same retime at the same step: replayed from its
    # retimes.json by a --resume auto that finds no checkpoint.
    reference = tmp_path / "reference"
    reference.mkdir()
    base = canonical(load_spec(spec).schedule())
    changed = canonical(load_spec(new).schedule())
    assert base is not None and changed is not None
    write_history(reference, History(base, (Applied(step, answer["epoch"], changed),)))
    whole = train(spec, reference, fork=True)
    assert whole.returncode == 0, whole.stderr[-3000:]
    rows = [json.loads(x) for x in (run_dir / "events.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if r["kind"] == "schedule_change"] == [step]
    saves = [r["step"] for r in rows if r.get("callback") == "checkpoint"
             and r["event"] == "step_end"]
    assert [s for s in saves if s > step] == list(range(step - step % 7 + 7,
                                                        64 * EPOCHS + 1, 7))
    assert compare(reference, run_dir) == []
