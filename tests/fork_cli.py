"""``schedtrain`` commands in forked children of the test process: torch and the package
are imported once, in the parent, instead of once per command (seconds each on a loaded
2-core machine). tests/fuzz_runs.py, tests/life_faults.py and tests/torchrun_helpers.py's
``forked_ranks`` run their commands through it."""

from __future__ import annotations

import ast
import contextlib
import functools
import importlib
import logging
import os
import runpy
import signal
import subprocess
import sys
import sysconfig
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NoReturn


def leave_child(code: int) -> NoReturn:
    """End a forked child with ``code``: its output flushed and logging shut down, then
    ``os._exit``, never back into the test process's pytest."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    with contextlib.suppress(Exception):
        logging.shutdown()
    os._exit(code)


def output_to(stdout: Path, stderr: Path) -> None:
    """A forked child's stdout and stderr written to the files ``stdout`` and ``stderr``
    (made afresh), line-buffered as a fresh process's."""
    for fd, path in ((1, stdout), (2, stderr)):
        opened = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(opened, fd)
        os.close(opened)
    sys.stdout = os.fdopen(1, "w", buffering=1)
    sys.stderr = os.fdopen(2, "w", buffering=1)


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



def warm_up() -> None:
    """Import, once in the test process, what a ``check --import`` or ``train`` of a
    small task imports, so that each forked command starts at once."""
    import torch

    import schedtrain.callbacks
    import schedtrain.cli.main
    import schedtrain.training  # noqa: F401

    torch.optim.SGD(torch.nn.Linear(1, 1).parameters(), lr=0.1)  # imports torch._dynamo

@functools.cache
def _interpreter_path() -> tuple[str, ...]:
    """The folders a fresh interpreter of this Python, started without PYTHONPATH, looks
    in (its standard library and site-packages), asked of one: cheap, without torch."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    got = subprocess.run([sys.executable, "-c", "import sys; print(sys.path[1:])"], env=env,
                         capture_output=True, text=True, check=True)
    return tuple(ast.literal_eval(got.stdout))


def _under(path: str, folders: Sequence[str]) -> bool:
    return any(path == f or path.startswith(f.rstrip(os.sep) + os.sep) for f in folders)


def as_fresh_process(first: Sequence[str] = ()) -> Callable[[], None]:
    """What a forked child calls to look for modules as a fresh process of this Python
    does: ``sys.path`` becomes ``first`` and the interpreter's own path (none of the
    folders pytest put first), and every module the test process imported from
    elsewhere is forgotten (a test file, a helper, a user module of the same name that
    an earlier test imported): the child imports such a name afresh, or misses it.
    What the interpreter's path holds (torch, pytest) stays imported, and so does
    schedtrain: its imported modules are the code under test."""
    base = _interpreter_path()
    real = [os.path.realpath(f) for f in base]

    def start() -> None:
        sys.path[:] = [*first, *base]
        for name, module in list(sys.modules.items()):
            if name.partition(".")[0] in ("schedtrain", "__main__", "__mp_main__"):
                continue
            file = getattr(module, "__file__", None)
            where = [file] if file else list(getattr(module, "__path__", None) or [])
            # torch.ops and torch.classes name no real file: they stay
            if any(Path(w).is_absolute() and not _under(os.path.realpath(w), real)
                   for w in where):
                del sys.modules[name]
        importlib.invalidate_caches()

    return start


def as_installed_command() -> Callable[[], None]:
    """fork_main's ``before`` for a child that looks for modules as the installed
    ``schedtrain`` command does in a fresh process (as_fresh_process: the script's
    folder first, no PYTHONPATH), where what the command finds is what is tested."""
    fresh = as_fresh_process([sysconfig.get_path("scripts")])

    def start() -> None:
        fresh()
        os.environ.pop("PYTHONPATH", None)

    return start


def fresh_env(folder: Path) -> dict[str, str]:
    """The environment for a fresh interpreter that runs the code under test as an
    installed package: no PYTHONPATH of the test process (its folders would be looked
    in for a user's modules), but one that holds only a link to the schedtrain package
    this process imported (``folder``/code), so a worktree's code is what runs, not
    whichever checkout the interpreter has installed."""
    import schedtrain

    code = folder / "code"
    code.mkdir(parents=True, exist_ok=True)
    link = code / "schedtrain"
    if not link.exists():
        link.symlink_to(Path(schedtrain.__file__).resolve().parent)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return {**env, "PYTHONPATH": str(code)}
