"""``schedtrain retime RUN_DIR NEW``: hand a running job a new schedule.

The new spec is checked as ``check`` checks it (its warnings printed: a saver judging a
metric no new value was put for, ...), and its schedule against the one the job runs
(``run.json``'s, which the job updates at each retime) by the very rule the job applies
(``planning.retime.live_refusal``, with the per-batch events the job's loop fires).
The diff of the next firings is printed (as ``schedtrain diff``) from the earliest step
the job can apply it at, and the request is written atomically as
``RUN_DIR/retime.json``; the job takes it at its next slow-path step (docs/checkpoints.md,
"Live retime"); with ``--wait`` the answer says the step, and the diff from there.
A job starting up (its directory locked, ``run.json`` not yet saying so) is waited for
with ``--wait``, else the command says to retry.
Exit codes: 0 handed (with ``--wait``: applied, or nothing to change), 2 bad input
(a damaged ``run.json`` named with its key), another request still waiting (requests
are created exclusively: none overwrites another), or a change the rules refuse (known
here, or answered so by the job within ``--wait``), 1 no answer within ``--wait``, or
the job still starting (nothing handed: retry).
"""

from __future__ import annotations

import argparse
import os
import stat
import sys
import time
from pathlib import Path
from typing import Final

from schedtrain.cli.diff import NOT_COMPARED, Side, _shape, read_side
from schedtrain.cli.preflight import UsageError, checked, print_warnings
from schedtrain.errors import RunDirError, one_line, with_head
from schedtrain.planning.changes import StoredSchedule, diff_texts
from schedtrain.planning.requests import (
    ANSWER_FILE,
    LOOK_STEPS,
    REQUEST_FILE,
    Answer,
    Request,
    RequestWaiting,
    live_refusal,
    read_answer,
    read_request,
    write_request,
)
from schedtrain.planning.run_status import LOCK_FILE, RunStatus, read_status
from schedtrain.planning.run_status import process_alive as _alive
from schedtrain.readback import parse_json

__all__ = ["cmd_retime"]

#: How often ``--wait`` looks for the job's answer.
_LOOK_S = 0.02
_NONBLOCK: Final = getattr(os, "O_NONBLOCK", 0)
_NOFOLLOW: Final = getattr(os, "O_NOFOLLOW", 0)


class _Starting(Exception):
    """The job in the run directory is starting: nothing handed (exit 1, retry)."""


def _running(run_dir: Path, until: float | None) -> RunStatus:
    """``run.json`` of a job running in ``run_dir``, waited for while the job starts
    (until ``until`` on the monotonic clock; ``None``: not waited for); a ``UsageError``
    for no job (a damaged ``run.json`` named with its key, a FIFO refused without
    blocking), ``_Starting`` for one that has not said it runs yet."""
    restart = (f"to change its schedule, resume it with the new spec: schedtrain train "
               f"NEW --run-dir {run_dir} --resume auto --schedule-change apply")
    while True:
        try:
            status = read_status(run_dir)
        except RunDirError as exc:
            if not _locked(run_dir):  # a job starting writes it whole (atomically)
                raise UsageError(str(exc)) from None
            status = None
        if (status is not None and status.status == "running"
                and (status.pid is None or _alive(status.pid))):
            break
        if not _locked(run_dir):
            if status is None:
                raise UsageError(f"{run_dir}: not a run directory (no run.json)")
            if status.status != "running":
                raise UsageError(f"{run_dir}: no job runs there (its run.json says "
                                 f"{status.status!r}); {restart}")
            raise UsageError(f"{run_dir}: its job (process {status.pid}) is gone; {restart}")
        if status is not None and status.status != "running" and status.pid is not None \
                and status.pid != os.getpid() and _alive(status.pid):
            # The process that recorded how the run ended still holds the lock: it is ending.
            raise UsageError(f"{run_dir}: its job (process {status.pid}) is ending (its "
                             f"run.json says {status.status!r}): nothing handed; {restart}")
        if until is None or time.monotonic() > until:
            said = ("has no run.json yet" if status is None else
                    f"still says {status.status!r}")
            raise _Starting(f"the job in {run_dir} is starting (it holds the directory's "
                            f"lock; its run.json {said}): nothing handed; retry"
                            + ("" if until is not None else ", or give --wait SECONDS"))
        time.sleep(_LOOK_S)
    if status.schedule is None:
        raise UsageError(f"{run_dir}: its job's schedule has no stored form (a Python "
                         "trigger, or an earlier version): it cannot be retimed")
    return status


def _locked(run_dir: Path) -> bool:
    """Whether a process holds the run directory's lock (``RunDirectory.acquire``): tested
    without taking it (a lock taken, even for a moment, would refuse the job's own)."""
    try:
        fd = os.open(run_dir / LOCK_FILE, os.O_RDONLY | _NONBLOCK | _NOFOLLOW)
    except OSError:
        return False
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return False
        os.lockf(fd, os.F_TEST, 0)
    except OSError:  # EACCES or EAGAIN: another process holds a lock on it
        return True
    finally:
        os.close(fd)
    return False


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
    new = read_side(args.new, do_import=False)
    if new.spec is None:
        raise UsageError(f"{args.new}: expected a spec file (.toml)")
    _, notes = checked(new.spec, do_import=False)  # what check says of it, train refuses
    print_warnings(args.new, [*new.spec.warnings, *notes], sys.stderr)
    asked = time.monotonic()
    try:
        status = _running(run_dir, None if args.wait is None else asked + args.wait)
    except _Starting as exc:
        print(str(exc), file=sys.stderr)
        return 1
    assert status.schedule is not None  # _running refuses a job without one
    # Each side parsed once, and read by every rule below.
    running = StoredSchedule.parse(status.schedule, f"{run_dir} (running)")
    asked_for = StoredSchedule.parse(new.schedule, args.new)
    why = live_refusal(running, asked_for, status.batch_events)
    if why is not None:
        print(with_head("error: refused: ", why), file=sys.stderr)
        return 2
    if running == asked_for:
        print(f"{args.new}: the job in {run_dir} already runs this schedule; nothing handed")
        return 0
    step = _last_step(run_dir, status)
    shape = _shape(args, Side(str(run_dir), running.text, step=step), new)
    if shape is None:
        print(NOT_COMPARED, file=sys.stderr)
    diff = diff_texts(running, asked_for, shape=shape,
                      from_step=step if shape is not None else None)
    # The job takes it at its next look, at this step or later: the firings listed are
    # those of the earliest step; the answer gives the real one, and its diff.
    sys.stdout.write(diff.table(args.first, since=f"if applied after step {step} (the "
                                                  f"earliest: it applies at step >= {step})"))
    try:
        ident = write_request(run_dir, new.schedule)
    except RequestWaiting as exc:
        raise UsageError(f"nothing handed: {exc}") from None
    print(f"handed to the job in {run_dir} ({REQUEST_FILE}): it applies the new schedule "
          f"after its next step where a trigger is due (at most {LOOK_STEPS} steps on one process)")
    if args.wait is None:
        return 0
    answer = _wait(run_dir, ident, asked, args.wait)
    if answer is None:
        return 1
    if answer.status == "applied" and shape is not None and answer.step != step:
        applied = diff_texts(running, asked_for, shape=shape, from_step=answer.step)
        sys.stdout.write("\n".join(applied.firing_lines(args.first)) + "\n")
    return 2 if answer.status == "refused" else 0


def _wait(run_dir: Path, ident: str, asked: float, wait: float) -> Answer | None:
    """Wait until ``wait`` seconds after ``asked`` for the job's answer to request
    ``ident``; print it (``None``: no answer, said so)."""
    while True:
        answer = read_answer(run_dir, ident)
        if answer is not None:
            took = time.monotonic() - asked
            print(f"{answer.status} at step {answer.step} (epoch {answer.epoch}), "
                  f"{took:.3f} s after the request: {one_line(answer.reason, 300)}")
            return answer
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
    return None
