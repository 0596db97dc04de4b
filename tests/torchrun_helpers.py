"""``torchrun`` of ``schedtrain train`` on the CPU (gloo), for the tests that run two real
processes (tests/distributed/, and callbacks that must agree across ranks)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent


def torchrun(spec: Path, run_dir: Path, *args: str, kill_at_line: int | None = None,
             sig: int = signal.SIGKILL, timeout: float = 120,
             nproc: int = 2) -> subprocess.CompletedProcess[str]:
    """``torchrun --standalone --nproc-per-node NPROC -m schedtrain train SPEC``; with
    ``kill_at_line``, ``sig`` goes to the launcher and both ranks once ``events.jsonl``
    has that many lines (as a scheduler would stop the job)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           "--nproc-per-node", str(nproc), "-m", "schedtrain", "train", str(spec),
           "--run-dir", str(run_dir), *args]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), str(ROOT)]),
           "OMP_NUM_THREADS": "1", "PYTHONFAULTHANDLER": "1"}  # a crash shows its stacks
    proc = subprocess.Popen(cmd, cwd=spec.parent, env=env, text=True, start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    if kill_at_line is not None:
        log = run_dir / "events.jsonl"
        deadline = time.monotonic() + timeout
        while proc.poll() is None and time.monotonic() < deadline:
            if log.exists() and log.read_text().count("\n") >= kill_at_line:
                os.killpg(proc.pid, sig)
                break
            time.sleep(0.01)
    out, err = proc.communicate(timeout=timeout)
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)
