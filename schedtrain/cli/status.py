"""``schedtrain status RUN_DIR``: how the run there ended, as one line and the exit code
``schedtrain train`` gives for that ending.

A launcher does not pass its processes' exit codes on: ``torchrun`` exits 1 with its
failure report when its ranks exit 75 (preempted), so a requeue script cannot tell a
preemption from a crash by its exit code. ``run.json`` says which, and this command turns
it back into the code: ``torchrun ... -m schedtrain train job.toml; schedtrain status
RUN_DIR`` exits 75 for a preempted run (docs/distributed.md, "Preemption").

Exit codes: 0 finished or stopped; 75 preempted (run again with ``--resume auto``);
1 failed, or still ``running`` (a job that runs yet, or one killed before it could record
its end: kill -9, out of memory); 2 no run directory or ``run.json`` there, or a damaged one.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Final

from schedtrain.cli.preflight import UsageError
from schedtrain.errors import RunDirError, one_line
from schedtrain.planning.run_status import RunStatus, process_alive, read_status
from schedtrain.urls import redact_text

__all__ = ["EXIT_CODES", "cmd_status", "status_line"]

#: ``run.json``'s status -> the exit code of ``schedtrain train`` for that ending.
EXIT_CODES: Final = {"finished": 0, "stopped": 0, "preempted": 75, "failed": 1,
                     "running": 1}


def status_line(run_dir: Path, record: RunStatus) -> str:
    """One line: the run's status, its clock, and what to do next."""
    at = f"step {record.step} (epoch {record.epoch})"
    state = record.status
    if state == "preempted":
        text = f"preempted after {at}"
        if record.checkpoint is not None:
            text += f": checkpoint {record.checkpoint}"
        text += "; resume with: schedtrain train SPEC --resume auto"
    elif state == "failed":
        text = f"failed after {at}"
        if (run_dir / "traceback.txt").is_file():
            text += f"; traceback in {run_dir / 'traceback.txt'}"
    elif state == "running":
        pid = record.pid
        if pid is not None and not process_alive(pid):
            text = (f"running at {at} by its run.json, but its process {pid} is gone: "
                    "killed before it could record its end (resume with --resume auto)")
        else:
            where = f" (process {pid})" if pid is not None else ""
            text = f"running{where}, at {at} or later"
    else:
        text = f"{state} at {at}"
    return one_line(redact_text(f"{run_dir}: {text}"))


def cmd_status(args: argparse.Namespace) -> int:
    """Print ``RUN_DIR``'s status line; return ``EXIT_CODES[status]``."""
    run_dir = Path(args.run_dir)
    if not run_dir.is_dir():
        raise UsageError(f"{run_dir}: no such run directory")
    try:
        record = read_status(run_dir)
    except RunDirError as exc:
        raise UsageError(str(exc)) from None
    if record is None:
        raise UsageError(f"{run_dir}: not a run directory (no run.json)")
    print(status_line(run_dir, record))
    return EXIT_CODES[record.status]
