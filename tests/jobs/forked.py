"""A job as a child forked from the test process, driven like ``subprocess.Popen``: torch
and the package are imported once, in the test process, instead of once per job by a
fresh interpreter (seconds each on a loaded 2-core machine; a job here trains for well
under one). The child gets what a fresh ``python`` would have - its own working folder,
environment, stdout and stderr, and SIGTERM, SIGINT and SIGUSR1 as an interpreter starts
with them - and leaves with ``os._exit``, never back into pytest."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from fork_cli import leave_child, output_to

__all__ = ["Forked", "schedtrain", "warm_up"]


class Forked:
    """``body()`` in a forked child; its return value is the exit code (1, with the
    traceback on stderr, where it raised). ``poll``, ``wait``, ``send_signal``, ``kill``,
    ``communicate`` and ``returncode`` as ``subprocess.Popen`` has them (text output)."""

    def __init__(self, body: Callable[[], int], *, cwd: Path,
                 env: Mapping[str, str] | None = None, args: Sequence[str] = ()) -> None:
        self.args = list(args)
        self.returncode: int | None = None
        self._scratch = Path(tempfile.mkdtemp(prefix="forked-"))
        self._out, self._err = self._scratch / "out", self._scratch / "err"
        pid = os.fork()
        if pid == 0:
            _child(body, cwd, env or {}, self._out, self._err)
        self.pid = pid

    def poll(self) -> int | None:
        if self.returncode is None:
            got, status = os.waitpid(self.pid, os.WNOHANG)
            if got:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        end = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if end is not None and time.monotonic() > end:
                raise subprocess.TimeoutExpired(self.args, timeout or 0)
            time.sleep(0.002)
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:  # never a reaped pid: it may be another process's now
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def communicate(self, timeout: float | None = None) -> tuple[str, str]:
        """Wait for the child (``subprocess.TimeoutExpired`` past ``timeout``, the child
        left running); its stdout and stderr."""
        self.wait(timeout)
        out, err = (p.read_text(errors="replace") if p.exists() else ""
                    for p in (self._out, self._err))
        shutil.rmtree(self._scratch, ignore_errors=True)
        return out, err


def _child(body: Callable[[], int], cwd: Path, env: Mapping[str, str], out: Path,
           err: Path) -> None:
    code = 1
    try:
        os.chdir(cwd)
        os.environ.update(env)
        output_to(out, err)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGUSR1, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)  # as python starts
        code = body()
    except BaseException:  # what body let through: a traceback, exit 1
        traceback.print_exc()
        code = 1
    finally:
        leave_child(code)


def schedtrain(argv: Sequence[str], *, cwd: Path,
               env: Mapping[str, str] | None = None) -> Forked:
    """``python -m schedtrain ARGV`` in ``cwd``, forked."""
    warm_up()

    def body() -> int:
        from schedtrain.cli.main import main

        return main(list(argv))
    return Forked(body, cwd=cwd, env=env, args=["schedtrain", *argv])


def warm_up() -> None:
    """Import, once in this process, what a job imports, so a forked job starts at once
    instead of importing it again each time."""
    import torch

    import jobs.crash  # noqa: F401
    import schedtrain.callbacks
    import schedtrain.cli.main
    import schedtrain.training  # noqa: F401

    torch.optim.Adam(torch.nn.Linear(1, 1).parameters(), lr=0.1)  # imports torch._dynamo
