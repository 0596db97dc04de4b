"""One ``schedtrain`` command in a forked child of the test process (torch imported once),
with a fault planted in the child only: the child signals itself at a chosen step (after
that step's step_end: at the next training forward), or dies inside its n-th checkpoint
write, right after its n-th commit, or right after a retime is journaled (before the
request is answered and removed); a retime request or a cloud notice asked for at a step.
Kill points are deterministic: nothing races a timer."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import attrs
from fork_cli import fork_main, wait

#: Fault kinds and what ``at`` counts: a step (after its step_end), or the n-th
#: checkpoint write of this command (1-based).
STEP_FAULTS = ("kill", "term", "usr1", "notice", "retime", "kill_retime")
WRITE_FAULTS = ("kill_save", "kill_commit")
#: Seconds a step takes once a retime or notice is asked for: the job's look at the
#: request (at most every 0.5 s) and the notice poller (every 0.05 s) land mid-run.
PACE = 0.03
#: The file (beside the run directory) that asks the lifecycle's metadata server for a
#: preemption notice.
NOTICE_FLAG = "notice.flag"
#: The file (beside the run directory) that asks the parent for ``schedtrain retime``.
RETIME_FLAG = "retime.flag"


@attrs.frozen
class Fault:
    """What the child does to itself: ``kind`` at ``at``; ``retime``: the spec file a
    retime request carries (for ``retime`` and ``kill_retime``); ``command``: the
    request is handed by the real ``schedtrain retime`` (run by the parent when the
    child asks), not written by the child itself."""

    kind: str = "none"
    at: int = 0
    retime: str = ""
    command: bool = False

    def __str__(self) -> str:
        if self.kind == "none":
            return "no fault"
        unit = "write" if self.kind in WRITE_FAULTS else "step"
        extra = f" to {self.retime}" if self.retime else ""
        extra += " (by the command)" if self.command else ""
        return f"{self.kind} at {unit} {self.at}{extra}"


NO_FAULT = Fault()


@attrs.frozen
class Outcome:
    """What one command did: its exit code (-9: killed by SIGKILL; None: hung) and
    stderr."""

    code: int | None
    stderr: str
    seconds: float

    def lines(self) -> list[str]:
        """stderr's lines that are not warnings (what the command says)."""
        return [x for x in self.stderr.splitlines() if x.strip()
                and not x.lstrip().startswith(("warning", "[warning", "  "))]


def warm_up() -> None:
    """Import what every command imports, once, so forked children start at once."""
    import torch

    import schedtrain.callbacks
    import schedtrain.cli.main
    import schedtrain.training  # noqa: F401

    torch.optim.Adam(torch.nn.Linear(1, 1).parameters(), lr=0.1)  # imports torch._dynamo
    with contextlib.suppress(ImportError):  # a run in a bucket; no loop is started here
        import s3fs  # noqa: F401


def _die(sig: int = signal.SIGKILL) -> None:
    os.kill(os.getpid(), sig)
    if sig == signal.SIGKILL:  # never returns
        time.sleep(60)


def _plant(fault: Fault, run_dir: Path) -> None:
    """Patch this (child) process for ``fault``."""
    from jobs import lifecycle as task

    from schedtrain.training.loop import Loop

    where = {"base": 0, "calls": 0, "paced": False}
    steps = Loop._steps

    def counted(self: Any, it: Any) -> Any:
        where["base"], where["calls"] = self.clock.step, 0
        return steps(self, it)

    Loop._steps = counted  # type: ignore[method-assign]

    def hook() -> None:
        done = where["base"] + where["calls"]
        where["calls"] += 1
        if where["paced"]:
            time.sleep(PACE)
        if done != fault.at:
            return
        if fault.kind == "kill":
            _die()
        elif fault.kind in ("term", "usr1"):
            os.kill(os.getpid(), signal.SIGTERM if fault.kind == "term" else signal.SIGUSR1)
        elif fault.kind == "notice":
            (run_dir.parent / NOTICE_FLAG).write_text("notice\n")
            where["paced"] = True
        elif fault.kind in ("retime", "kill_retime") and fault.command:
            (run_dir.parent / RETIME_FLAG).write_text("retime\n")
            where["paced"] = True
        elif fault.kind in ("retime", "kill_retime"):
            from schedtrain.planning.changes import canonical
            from schedtrain.planning.requests import write_request
            from schedtrain.spec import load_spec

            text = canonical(load_spec(run_dir.parent / fault.retime).schedule())
            assert text is not None
            with contextlib.suppress(Exception):  # a request already waits: the job's turn
                write_request(run_dir, text)
            where["paced"] = True

    task.HOOK = hook
    if fault.kind == "kill_retime":
        from schedtrain.training.control.retime import Retimer

        remember = Retimer._remember

        def remembered(self: Any, applied: Any, old: str) -> None:
            remember(self, applied, old)
            _die()

        Retimer._remember = remembered  # type: ignore[method-assign]
    if fault.kind in WRITE_FAULTS:
        from schedtrain.checkpoints import store

        write_atomic, n = store.write_atomic, {"writes": 0}  # type: ignore[attr-defined]

        def faulty(path: Path, save: Callable[[Any], None]) -> Path:
            if Path(path).parent.name == "checkpoints":  # not best/ files
                n["writes"] += 1
            if n["writes"] != fault.at or Path(path).parent.name != "checkpoints":
                return write_atomic(path, save)
            if fault.kind == "kill_save":
                def half(f: Any) -> None:
                    save(f)
                    f.flush()
                    _die()  # the temporary file written, never renamed
                return write_atomic(path, half)
            out = write_atomic(path, save)
            _die()  # committed; nothing after it (run.json, pruning) happened
            return out

        store.write_atomic = faulty  # type: ignore[attr-defined,assignment]


def run_cli(argv: Sequence[str], cwd: Path, *, fault: Fault = NO_FAULT,
            run_dir: Path | None = None, deadline: float = 120.0,
            env: dict[str, str] | None = None, log: str = ".stderr") -> Outcome:
    """``schedtrain ARGV`` in a forked child with ``fault`` planted; killed (SIGKILL) at
    ``deadline`` seconds, which counts as a hang. ``log``: the file (in ``cwd``) that
    takes its output meanwhile (stdout too: the summary lines are judged with stderr)."""
    out = cwd / log
    start = time.monotonic()
    where = run_dir if run_dir is not None else cwd / "run"
    plant = None if fault.kind == "none" else (lambda: _plant(fault, where))
    pid = fork_main(argv, cwd, stderr=out, stdout=out, env=env, before=plant)
    codes = wait([pid], start + deadline)
    text = out.read_text(errors="replace") if out.exists() else ""
    with contextlib.suppress(FileNotFoundError):
        out.unlink()
    return Outcome(None if codes is None else codes[0], text, time.monotonic() - start)
