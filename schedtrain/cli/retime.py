"""``schedtrain retime RUN_DIR NEW``: hand a running job a new schedule.

The new spec's schedule is checked against the one the job runs (``run.json``'s, which
the job updates at each retime) by the rules a running job applies
(``planning.retime.live_refusal``), the diff of the next firings is printed (as
``schedtrain diff``), and the request is written atomically as ``RUN_DIR/retime.json``;
the job takes it at its next slow-path step (docs/checkpoints.md, "Live retime").
Exit codes: 0 handed (with ``--wait``: applied, or nothing to change), 2 bad input
(a damaged ``run.json`` named with its key), another request still waiting (requests
are created exclusively: none overwrites another), or a change the rules refuse (known
here, or answered so by the job within ``--wait``), 1 no answer within ``--wait``.
"""

from __future__ import annotations

import argparse
import os
import stat
import sys
import time
from pathlib import Path
from typing import Final

from schedtrain.cli.diff import Side, _shape, read_side
from schedtrain.cli.preflight import UsageError
from schedtrain.errors import RunDirError, one_line, with_head
from schedtrain.planning.changes import diff_texts
from schedtrain.planning.retime import (
    ANSWER_FILE,
    REQUEST_FILE,
    Request,
    RequestWaiting,
    live_refusal,
    read_answer,
    read_request,
    write_request,
)
from schedtrain.planning.run_status import RunStatus, read_status
from schedtrain.planning.run_status import process_alive as _alive
from schedtrain.readback import parse_json

__all__ = ["cmd_retime"]

#: How often ``--wait`` looks for the job's answer.
_LOOK_S = 0.02
_NONBLOCK: Final = getattr(os, "O_NONBLOCK", 0)
_NOFOLLOW: Final = getattr(os, "O_NOFOLLOW", 0)


def _running(run_dir: Path) -> RunStatus:
    """``run.json`` of a job running in ``run_dir``; a ``UsageError`` otherwise (a
    damaged one named with its key, a FIFO refused without blocking)."""
    restart = (f"to change its schedule, resume it with the new spec: schedtrain train "
               f"NEW --run-dir {run_dir} --resume auto --schedule-change apply")
    try:
        status = read_status(run_dir)
    except RunDirError as exc:
        raise UsageError(str(exc)) from None
    if status is None:
        raise UsageError(f"{run_dir}: not a run directory (no run.json)")
    if status.status != "running":
        raise UsageError(f"{run_dir}: no job runs there (its run.json says "
                         f"{status.status!r}); {restart}")
    if status.pid is not None and not _alive(status.pid):
        raise UsageError(f"{run_dir}: its job (process {status.pid}) is gone; {restart}")
    if status.schedule is None:
        raise UsageError(f"{run_dir}: its job's schedule has no stored form (a Python "
                         "trigger, or an earlier version): it cannot be retimed")
    return status


def _last_step(run_dir: Path, status: RunStatus) -> int:
    """The job's last step in its log (``events.jsonl``'s last lines), else run.json's."""
    try:  # a regular file only, opened without blocking (a FIFO would hang the command)
        fd = os.open(run_dir / "events.jsonl", os.O_RDONLY | _NONBLOCK | _NOFOLLOW)
    except OSError:
        return status.step
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return status.step
        f.seek(0, os.SEEK_END)
        f.seek(max(0, f.tell() - 65536))
        lines = f.read(65536).splitlines()
    for line in reversed(lines):
        try:
            row = parse_json(line, "events.jsonl", depth=4)
        except RunDirError:  # a line being written, or not ours
            continue
        step = row.get("step") if isinstance(row, dict) else None
        if isinstance(step, int) and not isinstance(step, bool) and step >= 0:
            return step
    return status.step


def cmd_retime(args: argparse.Namespace) -> int:
    """The ``retime`` command; its exit code."""
    run_dir = Path(args.run_dir)
    status = _running(run_dir)
    new = read_side(args.new, do_import=False)
    if new.spec is None:
        raise UsageError(f"{args.new}: expected a spec file (.toml)")
    old_text = status.schedule
    assert old_text is not None  # _running refuses a job without one
    why = live_refusal(old_text, new.schedule)
    if why is not None:
        print(with_head("error: refused: ", why), file=sys.stderr)
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
    try:
        ident = write_request(run_dir, new.schedule)
    except RequestWaiting as exc:
        raise UsageError(f"nothing handed: {exc}") from None
    print(f"handed to the job in {run_dir} ({REQUEST_FILE}): it applies the new schedule "
          "after its next step where a trigger is due (at most 256 steps on one process)")
    if args.wait is None:
        return 0
    return _wait(run_dir, ident, asked, args.wait)


def _wait(run_dir: Path, ident: str, asked: float, wait: float) -> int:
    """Wait up to ``wait`` seconds for the job's answer to request ``ident``; print it."""
    while True:
        answer = read_answer(run_dir, ident)
        if answer is not None:
            took = time.monotonic() - asked
            print(f"{answer.status} at step {answer.step} (epoch {answer.epoch}), "
                  f"{took:.3f} s after the request: {one_line(answer.reason, 300)}")
            return 2 if answer.status == "refused" else 0
        if time.monotonic() - asked > wait:
            break
        time.sleep(_LOOK_S)
    waiting = read_request(run_dir)
    if isinstance(waiting, Request) and waiting.id == ident:
        print(f"no answer in {wait:g} s ({ANSWER_FILE}); the request stays in "
              f"{run_dir / REQUEST_FILE}: the job takes it when it next looks",
              file=sys.stderr)
    else:  # taken, and no answer names it: say so, never "it stays"
        print(f"no answer in {wait:g} s ({ANSWER_FILE}), and the request is no longer in "
              f"{run_dir / REQUEST_FILE} (removed, or answered and the answer since "
              "replaced): see the job's events.jsonl", file=sys.stderr)
    return 1
