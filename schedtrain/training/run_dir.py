"""A run directory belongs to one run: locked while in use, and its status recorded.

``RUN_DIR/run.json`` says what the directory holds (``running``, ``finished``,
``stopped``, ``preempted``, ``failed``, and the clock when it last changed);
``RUN_DIR/.lock`` is held (a POSIX record lock) while a run uses it, so a second run is
refused at once, and a run killed with ``kill -9`` releases it with its process. Opening the
directory removes the temporary files interrupted writes left behind.

No file here is written through a symbolic link planted in its place, and no folder a
run writes into (``checkpoints``, ``best``, ``tensorboard``) may lead out of the directory
(``schedtrain.files``).
"""

from __future__ import annotations

import contextlib
import json
import os
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any, Final

from schedtrain.checkpoints.files import clear_folders, list_checkpoints, remove_leftovers
from schedtrain.errors import RunDirError, RunEnded, traceback_file
from schedtrain.files import UnsafeFile, inside, open_in_place, write_atomic
from schedtrain.planning.run_status import LOCK_FILE, RUN_FILE, read_status
from schedtrain.urls import redact_text

__all__ = ["RunDirError", "RunDirectory"]

#: What a run writes, and all that --overwrite removes.
_OWNED_FILES: Final = ("events.jsonl", RUN_FILE, "traceback.txt")
_OWNED_DIRS: Final = ("checkpoints", "best", "media", "export")
#: Folders a run writes into: none may lead out of the directory.
_WRITTEN_DIRS: Final = (*_OWNED_DIRS, "tensorboard")


class RunDirectory:
    """The directory of one run.

    Args:
        path: the directory (created if missing).
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._lock: IO[str] | None = None
        #: what ``record`` wrote last while this object held the lock (``None``: nothing
        #: yet, or the lock was let go): the next record starts from it
        self._written: dict[str, Any] | None = None

    # -- what it holds ---------------------------------------------------------------------
    @property
    def checkpoints(self) -> Path:
        """Where checkpoints go: ``RUN_DIR/checkpoints``."""
        return self.path / "checkpoints"

    @property
    def events(self) -> Path:
        """The run's log: ``RUN_DIR/events.jsonl``."""
        return self.path / "events.jsonl"

    def status(self) -> dict[str, Any] | None:
        """The content of ``run.json`` (checked: ``RunStatus``), or ``None`` when the
        directory holds no run, or a damaged ``run.json`` (the run records a new one)."""
        try:
            found = read_status(self.path)
        except RunDirError:  # DamagedFile: a status no longer known, as a killed run's
            return None
        return found.to_dict() if found is not None else None

    def ended(self, max_epochs: int | None, max_steps: int | None,
              resumed_step: int | None = None) -> bool:
        """Whether the run here ended with nothing left to resume for these limits, from
        a checkpoint at ``resumed_step`` (a resume would be refused with ``RunEnded``)."""
        return self.refusal(max_epochs, max_steps, resumed_step) is not None

    def refusal(self, max_epochs: int | None, max_steps: int | None,
                resumed_step: int | None = None) -> RunEnded | None:
        """The ``RunEnded`` a resume from a checkpoint at ``resumed_step`` gets when the
        run here ended for these limits (``ended``); ``None`` when it has more to do."""
        status = self.status()
        if status is None or not _ended(status, max_epochs, max_steps, resumed_step):
            return None
        return RunEnded(f"the run in {str(self.path)!r} {status['status']} at step "
                        f"{status.get('step')}; there is nothing left to resume (start "
                        "over with --overwrite, or use another --run-dir)",
                        status=status["status"], step=int(status.get("step", 0)))

    def holds_a_run(self) -> bool:
        """Whether a run has used this directory (``run.json``, a log or checkpoints)."""
        return (self.status() is not None or self.events.exists()
                or bool(list_checkpoints(self.checkpoints)))

    def refuse_fresh(self) -> None:
        """Raise what ``open_for_run`` raises a fresh run here without ``overwrite`` (in
        use, holding a run), without keeping the lock or creating the directory.

        Raises:
            RunDirError: in use by another process, or holding a run.
        """
        if self.holds_a_run():
            self.open_for_run(fresh=True, overwrite=False, ends_at=None)
            self.release()

    # -- using it ----------------------------------------------------------------------------
    def acquire(self) -> None:
        """Lock the directory for this process; refuse at once if another run holds it.

        Raises:
            RunDirError: another process holds the lock (its pid is named).
            UnsafeFile: the lock file is a link or not a regular file, or a folder a run
                writes into leads out of the directory.
        """
        if self._lock is not None:
            return
        self.path.mkdir(parents=True, exist_ok=True)
        f = open_in_place(self.path / LOCK_FILE, "r+")
        try:
            import fcntl
        except ImportError:  # pragma: no cover - no flock on this platform: no lock
            self._lock = f
            return
        try:
            # A POSIX record lock: data-loader workers forked later do not inherit it (a
            # flock would stay held by them after this process let go).
            fcntl.lockf(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            f.seek(0)
            holder = f.read().strip() or "another process"
            f.close()
            raise RunDirError(f"run directory {str(self.path)!r} is in use by process "
                              f"{holder}; wait for it to end, or give another --run-dir"
                              ) from None
        f.seek(0)
        f.truncate()
        f.write(str(os.getpid()))
        f.flush()
        self._lock = f
        try:
            for name in _WRITTEN_DIRS:
                inside(self.path / name, self.path)
        except UnsafeFile:
            self.release()
            raise
        for folder in (self.path, self.checkpoints, self.path / "best", self.path / "export"):
            remove_leftovers(folder)

    def release(self) -> None:
        """Unlock the directory."""
        self._written = None
        if self._lock is not None:
            with contextlib.suppress(OSError):
                self._lock.close()
            self._lock = None

    def open_for_run(self, *, fresh: bool, overwrite: bool,
                     ends_at: tuple[int | None, int | None] | None,
                     resumed_step: int | None = None,
                     on_ended: Callable[[], None] | None = None,
                     starting_over: bool = False) -> None:
        """Lock the directory for a run, refusing what would mix two runs' files.

        Args:
            fresh: a new run starts (not a resume): a directory holding a run is refused,
                or cleared with ``overwrite``.
            overwrite: remove what runs wrote here first.
            ends_at: for a resume, the run's ``(max_epochs, max_steps)``: resuming a run
                that stopped, or finished at or past these, is refused (it would only
                end again).
            resumed_step: the step of the checkpoint resumed: one older than the last
                the run wrote for ``--resume auto`` (that one damaged or gone) trains
                what remains; one older than where the run ended, no.
            on_ended: called, with the directory still locked, before a resume of a run
                that ended is refused (it completes the run's log).
            starting_over: a resume found no valid checkpoint: a run that ended here is
                refused (its log is kept), one that was cut short starts again.

        Raises:
            RunDirError: in use by another process, or holding a run.
            RunEnded: resuming a run that ended, with nothing left to do.
        """
        self.acquire()
        status = self.status()
        try:
            if fresh and self.holds_a_run():
                if not overwrite:
                    shown = f" ({_described(status)})" if status else ""
                    raise RunDirError(f"run directory {str(self.path)!r} holds a run{shown}; "
                                      "resume it (--resume auto) or start over (--overwrite)")
                self.clear()
            if (starting_over and ends_at is not None and status is not None
                    and status.get("status") in ("finished", "stopped")
                    and not _ended(status, *ends_at)):
                # Starting again would replace a whole run's log and best weights.
                raise RunDirError(f"the run in {str(self.path)!r} {_described(status)} and "
                                  "left no checkpoint to continue from; start over with "
                                  "--overwrite, or use another --run-dir")
            ended = None if ends_at is None else self.refusal(*ends_at, resumed_step)
            if ended is not None:
                if on_ended is not None:
                    on_ended()
                raise ended
        except RunDirError:
            self.release()
            raise

    def save_traceback(self, exc: BaseException) -> None:
        """Keep a failed run's traceback in ``RUN_DIR/traceback.txt`` (replaced whole)."""
        path = self.path / "traceback.txt"
        text = redact_text("".join(traceback.format_exception(exc))).encode()
        with contextlib.suppress(OSError):
            write_atomic(path, lambda f: f.write(text))
            traceback_file(exc, path)

    def clear(self) -> None:
        """Remove what runs write here (``--overwrite``); other files are left alone."""
        self._written = None
        for name in _OWNED_FILES:
            with contextlib.suppress(FileNotFoundError):
                (self.path / name).unlink()
        clear_folders(*(self.path / name for name in _OWNED_DIRS))

    def record(self, status: str, **fields: Any) -> None:
        """Write ``run.json`` with ``status`` and ``fields`` (atomically), over the fields
        it held (an earlier run's ``resumable`` and ``checkpoint`` are kept)."""
        # While this object holds the lock, run.json is its run's alone: only ``record``
        # writes it, and only the lock's holder records (``fit`` and the hosts' run
        # control acquire first; another process is refused the lock; ``schedtrain
        # retime``, ``status``, ``diff`` and ``plan`` only read the file; ``clear`` and
        # ``release`` forget what was written). So what this object wrote last is what
        # the file holds: it is read back at the first record only (a damaged one there
        # is dropped, as ``status`` says), not at each of a run's records.
        held = self._written if self._lock is not None else None
        before = (self.status() or {}) if held is None else held
        data = {"format": "schedtrain-run-1", **before, **fields,
                "status": status, "pid": os.getpid(), "updated": time.time()}
        text = json.dumps(data, indent=1, sort_keys=True) + "\n"
        write_atomic(self.path / RUN_FILE, lambda f: f.write(text.encode()))
        if self._lock is not None:  # a null field reads back as absent: kept so
            self._written = {k: v for k, v in data.items() if v is not None}

    def remove_file(self, name: str) -> None:
        """Remove the run's own file ``name`` of the directory (live retime's request
        once answered, or an earlier run's retimes on a fresh start).

        Raises:
            UnsafeFile: something there that cannot be removed (a directory).
        """
        path = self.path / Path(name).name
        try:
            path.unlink(missing_ok=True)
        except OSError as exc:  # a directory someone made there: theirs to remove
            raise UnsafeFile(path, f"cannot be removed ({exc.strerror or exc}); it is "
                                   "not a file a run wrote: remove it") from None

    def checkpoint_written(self, path: Path | str, phase: str, step: int, epoch: int,
                           resumable: bool = False) -> None:
        """Record the run's progress at each checkpoint: after a ``kill -9``, ``run.json``
        says how far the run got and which checkpoint it wrote last (its path or URL);
        of one ``--resume auto`` may pick, its step (``resumable``)."""
        # Still running: how it ends (finished, stopped, preempted) is recorded after.
        more = {"resumable": step} if resumable else {}
        self.record("running", step=step, epoch=epoch, checkpoint=str(path), phase=phase,
                    **more)

    def __repr__(self) -> str:
        return f"RunDirectory({str(self.path)!r})"


def _described(status: dict[str, Any]) -> str:
    """``running at step 300``, or for a run whose process is gone, ``killed or lost at
    step 300 (its process 1234 is gone)``."""
    step = status.get("step")
    pid = status.get("pid")
    if status.get("status") == "running" and isinstance(pid, int) and not _alive(pid):
        return f"killed or lost at step {step} (its process {pid} is gone)"
    return f"{status.get('status')} at step {step}"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process: it exists
        return True
    return True


def _ended(status: dict[str, Any], max_epochs: int | None, max_steps: int | None,
           resumed_step: int | None = None) -> bool:
    """Whether a run that ended would end again at once: it stopped (its stop condition
    would hold again), or finished and its end was not moved later. A checkpoint older
    than the last one the run wrote to resume from (that one damaged or gone) has steps
    left to train; the steps after the run's last checkpoint were trained and logged
    (training them again would fire their callbacks twice)."""
    if resumed_step is not None and resumed_step < int(status.get("resumable", 0) or 0):
        return False
    if status.get("status") == "stopped":
        return True
    if status.get("status") != "finished":
        return False
    epoch, step = status.get("epoch", 0), status.get("step", 0)
    return ((max_epochs is not None and epoch >= max_epochs)
            or (max_steps is not None and step >= max_steps))
