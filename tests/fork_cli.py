"""``schedtrain`` commands in forked children of the test process: torch and the package
are imported once, in the parent, instead of once per command (seconds each on a loaded
2-core machine). tests/fuzz_runs.py, tests/life_faults.py and tests/torchrun_helpers.py's
``forked_ranks`` run their commands through it."""

from __future__ import annotations

import contextlib
import logging
import os
import runpy
import signal
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path


def leave_child(code: int) -> None:
    """End a forked child with ``code``: its output flushed and logging shut down, then
    ``os._exit``, never back into the test process's pytest."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    with contextlib.suppress(Exception):
        logging.shutdown()
    os._exit(code)


def fork_main(argv: Sequence[str], cwd: Path, *, stderr: Path, stdout: Path | None = None,
              env: dict[str, str] | None = None,
              before: Callable[[], None] | None = None) -> int:
    """Fork a child that runs ``schedtrain ARGV`` in ``cwd`` and returns its pid.

    The child writes its stderr to ``stderr`` and its stdout to ``stdout`` (the same file
    where they are equal; None: discarded), takes ``env`` into its environment, resets
    SIGTERM, SIGINT and SIGUSR1 to their defaults, calls ``before`` (a fault to plant),
    then the command line's ``main``; it leaves with ``os._exit``, its code main's (1 with
    a traceback where main let an exception through): never back into pytest."""
    pid = os.fork()
    if pid:
        return pid
    code = 1
    try:
        os.chdir(cwd)
        os.environ.update(env or {})
        err = os.open(stderr, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        out = (err if stdout == stderr else
               os.open(stdout if stdout is not None else os.devnull,
                       os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644))
        os.dup2(out, 1)
        os.dup2(err, 2)
        sys.stdout = os.fdopen(1, "w", buffering=1)
        sys.stderr = os.fdopen(2, "w", buffering=1)
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):
            signal.signal(sig, signal.SIG_DFL)
        if before is not None:
            before()
        from schedtrain.cli.main import main

        code = main(list(argv))
    except BaseException:  # an exception main let through: a traceback, exit 1
        traceback.print_exc()
        code = 1
    finally:
        leave_child(code)


def wait(pids: Sequence[int], until: float, *, grace: float = 0.0) -> list[int] | None:
    """Each child's exit code, or None where one outlived the monotonic time ``until``:
    then every child still running gets SIGTERM and, ``grace`` seconds later (at once
    where 0), SIGKILL."""
    codes: dict[int, int] = {}

    def reap(block: bool = False) -> None:
        for pid in pids:
            if pid not in codes:
                got, status = os.waitpid(pid, 0 if block else os.WNOHANG)
                if got:
                    codes[pid] = os.waitstatus_to_exitcode(status)

    while len(codes) < len(pids):
        reap()
        if len(codes) == len(pids):
            break
        if time.monotonic() > until:
            _stop([p for p in pids if p not in codes], grace, reap, codes)
            return None
        time.sleep(0.005)
    return [codes[pid] for pid in pids]


def _stop(pids: list[int], grace: float, reap: Callable[..., None],
          codes: dict[int, int]) -> None:
    if grace > 0:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        end = time.monotonic() + grace
        while time.monotonic() < end and any(p not in codes for p in pids):
            reap()
            time.sleep(0.01)
    for pid in pids:
        if pid not in codes:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    reap(block=True)


def fork_script(script: Path, args: Sequence[str], *, stderr: Path) -> int:
    """Run ``python SCRIPT ARGS`` in a forked child of the test process (its imports
    already made) and wait for it: its exit code, as the interpreter's would be (a
    SystemExit's code; 1 with a traceback for another exception); its stdout and stderr
    go to ``stderr``. For a run where a fresh start is not what is tested (a reference,
    a resume)."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            err = os.open(stderr, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(err, 1)
            os.dup2(err, 2)
            sys.stdout = os.fdopen(1, "w", buffering=1)
            sys.stderr = os.fdopen(2, "w", buffering=1)
            for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):
                signal.signal(sig, signal.SIG_DFL)
            sys.argv = [str(script), *args]
            runpy.run_path(str(script), run_name="__main__")
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
            if exc.code is not None and not isinstance(exc.code, int):
                print(exc.code, file=sys.stderr)
        except BaseException:
            traceback.print_exc()
        finally:
            leave_child(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)
