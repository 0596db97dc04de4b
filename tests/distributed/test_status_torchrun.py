"""A preempted torchrun job (two processes, gloo): torchrun exits 1 with its failure report
although both ranks exit 75; `schedtrain status RUN_DIR` after it exits 75, so a requeue
script gets the code it waits for (E4 of the first-day report)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch
from notice_server import NoticeServer, wait_for_file
from test_distributed import ROOT, TESTS, torchrun, write_spec

from schedtrain.training.control.notice import POLL_ENV

pytestmark = pytest.mark.skipif(not torch.distributed.is_available(),
                                reason="torch.distributed is not available")


def test_status_gives_75_after_a_preempted_torchrun_job(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(POLL_ENV, "0.02")
    with NoticeServer() as server:
        spec = write_spec(tmp_path, """
[callbacks.slow]
type = "jobs.ddp:Sleep"
seconds = 0.05
trigger = { every = "1 step" }
""", epochs=200)  # ends by the notice long before
        spec.write_text(spec.read_text().replace(
            "seed = 1\n", f'seed = 1\npreempt_notice = "{server.url("aws")}"\n'))
        run_dir = tmp_path / "run"
        served = threading.Thread(target=lambda: (wait_for_file(run_dir / "events.jsonl"),
                                                  server.serve_notice()), daemon=True)
        served.start()
        result = torchrun(spec, run_dir, timeout=300)
    assert "exitcode  : 75" in result.stderr, result.stderr[-3000:]  # both ranks: 75
    assert result.returncode == 1  # torchrun's own: what a requeue script sees
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), str(ROOT)])}
    status = subprocess.run([sys.executable, "-m", "schedtrain", "status", str(run_dir)],
                            capture_output=True, text=True, timeout=120, env=env,
                            check=False)
    assert status.returncode == 75, status.stderr
    line = status.stdout.strip()
    assert line.startswith(f"{run_dir}: preempted after step "), line
    checkpoint = line.split(": checkpoint ", 1)[1].split(";", 1)[0]
    assert Path(checkpoint).exists() and "--resume auto" in line
