"""The cookbook's SLURM requeue: SIGUSR1 (`--signal=USR1@90`) to a real `schedtrain train`
with `[run] preempt_signals`, then the same command again (what `--requeue` runs). Each
command is a child forked from the test process (``jobs.forked``: torch imported once),
signalled as ``python -m schedtrain train`` would be."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest
from jobs import forked
from jobs.trials import compare, env, train, write_spec

pytestmark = pytest.mark.slow


def _started(run_dir: Path, timeout: float = 120) -> None:
    log = run_dir / "events.jsonl"
    end = time.monotonic() + timeout
    while not (log.exists() and log.stat().st_size > 2000):
        if time.monotonic() > end:
            raise AssertionError("training did not start")
        time.sleep(0.005)


def test_sigusr1_requeue_resumes_exactly(tmp_path: Path) -> None:
    """SIGUSR1 checkpoints and exits 75; the same command with --resume auto finishes the
    run: events.jsonl and the final weights equal the uninterrupted run's."""
    spec = write_spec(tmp_path, 3)  # the lr schedule's change at epoch 2 comes after the stop
    text = spec.read_text().replace("seed = 3\n",
                                    'seed = 3\npreempt_signals = ["SIGTERM", "SIGUSR1"]\n')
    assert text != spec.read_text()
    spec.write_text(text)
    reference = tmp_path / "reference"
    assert train(spec, reference, resume=False, fork=True).returncode == 0
    run_dir = tmp_path / "run"
    cmd = ["train", str(spec), "--run-dir", str(run_dir), "--resume", "auto"]
    proc = forked.schedtrain(cmd, cwd=spec.parent.parent, env=env(0))
    _started(run_dir)
    proc.send_signal(signal.SIGUSR1)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 75, err
    assert any(x.startswith("preempted by SIGUSR1") for x in err.splitlines()), err
    again = forked.schedtrain(cmd, cwd=spec.parent.parent, env=env(0))
    _, err = again.communicate(timeout=300)
    assert again.returncode == 0, err
    assert compare(reference, run_dir) == []
