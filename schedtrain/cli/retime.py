"""``schedtrain retime RUN_DIR NEW``: hand a running job a new schedule.

The new spec's schedule is checked against the one the job runs (``run.json``'s, which
the job updates at each retime) by the rules a running job applies
(``planning.retime.live_refusal``), the diff of the next firings is printed (as
``schedtrain diff``), and the request is written atomically as ``RUN_DIR/retime.json``;
the job takes it at its next slow-path step (docs/checkpoints.md, "Live retime").
Exit codes: 0 handed (with ``--wait``: applied, or nothing to change), 2 bad input or a
change the rules refuse (known here, or answered so by the job within ``--wait``), 1 no
answer within ``--wait`` (the request stays; the job takes it when it looks).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from schedtrain.cli.diff import Side, _shape, read_side
from schedtrain.cli.preflight import UsageError
from schedtrain.planning.changes import diff_texts
from schedtrain.planning.retime import (
    ANSWER_FILE,
    REQUEST_FILE,
    live_refusal,
    read_answer,
    write_request,
)

__all__ = ["cmd_retime"]

#: How often ``--wait`` looks for the job's answer.
_LOOK_S = 0.02


def _running(run_dir: Path) -> dict[str, Any]:
    """``run.json`` of a job running in ``run_dir``; a ``UsageError`` otherwise."""
    restart = (f"to change its schedule, resume it with the new spec: schedtrain train "
               f"NEW --run-dir {run_dir} --resume auto --schedule-change apply")
    try:
        status = json.loads((run_dir / "run.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        raise UsageError(f"{run_dir}: not a run directory (no readable run.json)") from None
    if not isinstance(status, dict):
        raise UsageError(f"{run_dir}/run.json: expected a JSON object")
    pid = status.get("pid")
    if status.get("status") != "running":
        raise UsageError(f"{run_dir}: no job runs there (its run.json says "
                         f"{status.get('status')!r}); {restart}")
    if isinstance(pid, int) and not _alive(pid):
        raise UsageError(f"{run_dir}: its job (process {pid}) is gone; {restart}")
    if not isinstance(status.get("schedule"), str):
        raise UsageError(f"{run_dir}: its job's schedule has no stored form (a Python "
                         "trigger, or an earlier version): it cannot be retimed")
    return status


def _alive(pid: int) -> bool:
    """Whether process ``pid`` exists on this machine (another machine's: assumed so)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # not ours to signal: it exists
        return True
    return True


def _last_step(run_dir: Path, status: dict[str, Any]) -> int:
    """The job's last step in its log (``events.jsonl``'s last line), else run.json's."""
    try:
        with (run_dir / "events.jsonl").open("rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 65536))
            lines = f.read().splitlines()
        for line in reversed(lines):
            step = json.loads(line).get("step")
            if isinstance(step, int):
                return step
    except (OSError, ValueError, AttributeError):
        pass
    step = status.get("step")
    return step if isinstance(step, int) else 0


def cmd_retime(args: argparse.Namespace) -> int:
    """The ``retime`` command; its exit code."""
    run_dir = Path(args.run_dir)
    status = _running(run_dir)
    new = read_side(args.new, do_import=False)
    if new.spec is None:
        raise UsageError(f"{args.new}: expected a spec file (.toml)")
    old_text: str = status["schedule"]
    why = live_refusal(old_text, new.schedule)
    if why is not None:
        print(f"error: refused: {why}", file=sys.stderr)
        return 2
    if old_text == new.schedule:
        print(f"{args.new}: the job in {run_dir} already runs this schedule; nothing handed")
        return 0
    step = _last_step(run_dir, status)
    old = Side(str(run_dir), old_text, step=step)
    shape = _shape(args, old, new)
    diff = diff_texts(old_text, new.schedule, shape=shape,
                      from_step=step if shape is not None else None,
                      files=(f"{run_dir} (running)", args.new))
    sys.stdout.write(diff.table(args.first))
    asked = time.monotonic()
    ident = write_request(run_dir, new.schedule)
    print(f"handed to the job in {run_dir} ({REQUEST_FILE}): it applies the new schedule "
          "after its next step where a trigger is due (at most 256 steps on one process)")
    if args.wait is None:
        return 0
    return _wait(run_dir, ident, asked, args.wait)


def _wait(run_dir: Path, ident: str, asked: float, wait: float) -> int:
    """Wait up to ``wait`` seconds for the job's answer; print it."""
    while True:
        answer = read_answer(run_dir, ident)
        if answer is not None:
            took = time.monotonic() - asked
            print(f"{answer.get('status')} at step {answer.get('step')} (epoch "
                  f"{answer.get('epoch')}), {took:.3f} s after the request: "
                  f"{answer.get('reason')}")
            return 2 if answer.get("status") == "refused" else 0
        if time.monotonic() - asked > wait:
            print(f"no answer in {wait:g} s ({ANSWER_FILE}); the request stays in "
                  f"{run_dir / REQUEST_FILE}: the job takes it when it next looks",
                  file=sys.stderr)
            return 1
        time.sleep(_LOOK_S)
