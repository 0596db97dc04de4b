"""Real `schedtrain train` processes killed or preempted, then resumed: the run is exact.

Each process is a child forked from the test process (``jobs.forked``: torch imported
once), run and signalled as ``python -m schedtrain train`` would be."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from jobs import forked
from jobs.trials import compare, env, final_weights, leftovers, lines, run_to_end, write_spec
from jobs.trials import train as train_process

from schedtrain.checkpoints import newest_valid

pytestmark = pytest.mark.slow
#: 4 epochs of 64 steps: the lr schedule's change at epoch 2, validation, the best model
#: and checkpoints every 11 steps all happen between the kills.
EPOCHS = 4
#: Where the kill test's three kills land: as the run starts (``run.json`` says running,
#: no checkpoint yet), mid-epoch, and at an epoch's end (validation and the best model's
#: save in progress).
KILL_AT_STEPS = [0, 100, 192]


def train(spec: Path, run_dir: Path, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    result: subprocess.CompletedProcess[str] = train_process(spec, run_dir, fork=True,
                                                             **kwargs)
    return result


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The spec, and its uninterrupted run."""
    folder = tmp_path_factory.mktemp("crash")
    spec = write_spec(folder, EPOCHS)
    reference = folder / "reference"
    result = train(spec, reference, resume=False)
    assert result.returncode == 0, result.stderr
    return spec, reference


def _started(run_dir: Path, timeout: float = 120) -> None:
    """Wait until training has written its first lines."""
    log = run_dir / "events.jsonl"
    deadline = time.monotonic() + timeout
    while not (log.exists() and log.stat().st_size > 2000):
        if time.monotonic() > deadline:
            raise AssertionError("training did not start")
        time.sleep(0.005)


def _unfinished(run_dir: Path) -> bool:
    """Whether the run in ``run_dir`` was interrupted: ``run.json`` does not say it
    finished, and no checkpoint of its end was written."""
    status = json.loads((run_dir / "run.json").read_text())["status"]
    return status != "finished" and not any(
        torch.load(p, weights_only=True)["phase"] == "train_end"
        for p in (run_dir / "checkpoints").glob("*.pt"))


def test_kill_9_at_random_moments_then_resume_is_exact(job: tuple[Path, Path],
                                                       tmp_path: Path) -> None:
    """Killed three times (as it starts, mid-epoch, at an epoch's end) and resumed each
    time with --resume auto: the same log lines and bit-identical final weights, no
    leftover files."""
    spec, reference = job
    run_dir = tmp_path / "run"
    for step in KILL_AT_STEPS:
        killed = train(spec, run_dir, kill_at_step=step)
        assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
        assert _unfinished(run_dir), f"the kill at step {step} landed after the run ended"
    codes = run_to_end(spec, run_dir, [], fork=True)
    assert codes == [0]
    assert compare(reference, run_dir) == []


def test_sigterm_checkpoints_and_says_how_to_resume(job: tuple[Path, Path],
                                                    tmp_path: Path) -> None:
    """SIGTERM mid-run: the step finishes, a checkpoint is written, exit 75 with one line
    saying where and how to resume; resuming finishes the run exactly."""
    spec, reference = job
    run_dir = tmp_path / "run"
    proc = forked.schedtrain(["train", str(spec), "--run-dir", str(run_dir)],
                             cwd=spec.parent.parent, env=env(0))
    _started(run_dir)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 75, err
    (line,) = [x for x in err.splitlines() if x.startswith("preempted by SIGTERM")]
    assert "checkpoint " in line and "--resume auto" in line
    saved = Path(line.split("checkpoint ")[1].split(";")[0])
    assert saved.exists()
    assert torch.load(saved, weights_only=True)["phase"] == "preempt"
    status = (run_dir / "run.json").read_text()
    assert '"preempted"' in status
    resumed = train(spec, run_dir)
    assert resumed.returncode == 0, resumed.stderr
    assert compare(reference, run_dir) == []


def test_a_second_run_in_the_same_directory_is_refused(job: tuple[Path, Path]) -> None:
    """Starting the finished reference run again without --resume/--overwrite: exit 2."""
    spec, reference = job
    before = lines(reference)
    result = train(spec, reference, resume=False)
    assert result.returncode == 2
    assert "holds a run" in result.stderr and "Traceback" not in result.stderr
    assert lines(reference) == before and not leftovers(reference)
    assert final_weights(reference)


def test_a_requeued_job_whose_run_finished_succeeds_doing_nothing(
        job: tuple[Path, Path]) -> None:
    """`--resume auto` on a finished run (a requeued job, or a kill after the last step):
    exit 0, nothing fired or written again; an explicit checkpoint is an error (exit 2)."""
    spec, reference = job
    before = lines(reference)
    result = train(spec, reference)
    assert result.returncode == 0, result.stderr
    assert result.stderr.splitlines() == [
        f"the run finished at step {json.loads((reference / 'run.json').read_text())['step']}"
        "; nothing left to do"]  # one plain line
    newest = sorted((reference / "checkpoints").glob("*.pt"))[-1]
    explicit = forked.schedtrain(["train", str(spec), "--run-dir", str(reference),
                                  "--resume", str(newest)], cwd=spec.parent.parent, env=env(0))
    _, explicit_err = explicit.communicate(timeout=120)
    assert explicit.returncode == 2 and "nothing left to resume" in explicit_err
    assert "Traceback" not in result.stderr + explicit_err
    assert lines(reference) == before and not leftovers(reference)


def test_a_second_sigint_aborts_at_once(job: tuple[Path, Path], tmp_path: Path) -> None:
    """Ctrl-C twice: no checkpoint for the preemption, exit 130, no traceback."""
    spec, _ = job
    run_dir = tmp_path / "run"
    proc = forked.schedtrain(["train", str(spec), "--run-dir", str(run_dir)],
                             cwd=spec.parent.parent, env=env(0))
    _started(run_dir)
    proc.send_signal(signal.SIGINT)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode in (75, 130), err  # the second may land after the checkpoint
    assert "Traceback" not in err
    if proc.returncode == 130:
        # One line: no checkpoint of the step in progress, and where a resume continues.
        last = err.strip().splitlines()[-1]
        assert last.startswith("interrupted") and "no checkpoint was written" in last
        found = newest_valid(run_dir / "checkpoints")
        assert (f"continues from {str(found)!r}" if found is not None
                else "start again from step 0") in last
        assert not any(
            p.name.startswith("step-") and torch.load(p, weights_only=True)["phase"] == "preempt"
            for p in (run_dir / "checkpoints").glob("*.pt"))
