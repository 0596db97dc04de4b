"""Background saves: a host snapshot of a checkpoint's state, written by one thread.

The loop blocks only for ``Writer.stage``: every tensor of the state is copied to host
memory (``checkpoints.staging``: pinned when CUDA is there, into the last save's buffers
by default), so training may change the live state at once.
``Writer`` then serialises, checksums, writes, syncs and commits it in one background
thread; at most one save is in flight. What the thread raised is kept and re-raised on
the loop's thread by ``Writer.result`` (never lost), and ``on_done`` tells the loop a
save ended, so it looks at the next step. ``checked`` decides a checkpoint's name in
that thread: the finiteness check reads the host copy, not the loop's time.

On Linux the thread runs at the lowest CPU priority (``WRITER_NICE``), so on busy cores
the training step's threads run first and the write takes the time they leave; where
cores are free the nice value changes nothing. A ``share`` below 1 also paces the write
(``checkpoints.pacing``): busy at most that share of the time, it leaves memory bandwidth
and cores to the step even where nice has nothing to give. Whenever the loop waits for
the write (the next save, a way out of the loop) the thread gets its priority back and
its pace is lifted first, so the loop never waits longer than the write itself takes.
Priorities are best-effort: where the system refuses (raising a priority back needs root,
``CAP_SYS_NICE`` or ``RLIMIT_NICE``), the thread keeps what it has.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

import torch

from schedtrain.checkpoints.format import is_finite
from schedtrain.checkpoints.pacing import Pace, paced
from schedtrain.checkpoints.staging import Staging
from schedtrain.spec.run import BUSY_RULES, MODES

__all__ = ["BUSY_RULES", "MODES", "WRITER_NICE", "Writer", "checked", "nonfinite"]

#: The writing thread's nice value (Linux): it yields the cores to the training step.
WRITER_NICE: Final = 19


def nonfinite(path: Path) -> Path:
    """Where a checkpoint of non-finite weights or loss goes: beside ``path``, never
    replacing a finite one (``last.pt``: ``last-nonfinite.pt``)."""
    return path.with_name(f"{path.stem}-nonfinite{path.suffix}")


def checked(state: dict[str, Any], loss: torch.Tensor | None, path: Path,
            written_if_not: list[str],
            write: Callable[[dict[str, Any], Path], Path]) -> Callable[[], Path]:
    """A background write of the snapshot ``state`` that first checks its weights and
    ``loss`` (host copies): if any is not finite the checkpoint goes to
    ``nonfinite(path)``, marked so, with ``written_if_not`` as its ``run.written`` — the
    file ``"sync"`` writes. Returns the path written."""
    def run() -> Path:
        if is_finite(state["model"], loss):
            return write(state, path)
        state["finite"] = False
        state["run"]["written"] = written_if_not
        return write(state, nonfinite(path))

    return run


class Writer:
    """One background thread at a time, writing one checkpoint.

    Args:
        on_done: called from the thread when a save ended (written or failed).
        nice: the thread's nice value while nobody waits for it (Linux only; ``None``:
            the priority of the thread that starts it).
        share: the most of the time the thread is busy while nobody waits for it
            (``Pace``; 1: flat out).
        staging: ``"reuse"`` or ``"fresh"`` host buffers for the snapshots (``Staging``).
    """

    def __init__(self, on_done: Callable[[], None] | None = None,
                 nice: int | None = WRITER_NICE, share: float = 1.0,
                 staging: str = "reuse") -> None:
        self.on_done, self.nice = on_done, nice
        self.staging = Staging(staging)
        Pace(share)  # refuses a share outside (0, 1] here, not in the thread
        self.share = share
        self._pace: Pace | None = None
        self._thread: threading.Thread | None = None
        self._stray: threading.Thread | None = None  # forgotten, maybe still writing
        self._error: BaseException | None = None
        self._result: Any = None
        #: the running thread's id and its priority before ``nice`` (Linux), for ``result``
        self._priority: tuple[int, int] | None = None
        self._waited = False  # the loop waits: the thread keeps (or gets back) its priority
        self._lock = threading.Lock()

    @property
    def busy(self) -> bool:
        """Whether a save is in flight (started and not yet collected)."""
        return self._thread is not None

    def done(self) -> bool:
        """Whether the save in flight (if any) has ended."""
        return self._thread is None or not self._thread.is_alive()

    def stage(self, tree: Any) -> Any:
        """A host snapshot of ``tree`` for the next ``start``; copied into the buffers of
        the last one unless a forgotten write may still read them."""
        stray = self._stray
        return self.staging.snapshot(tree, free=stray is None or not stray.is_alive())

    def start(self, write: Callable[[], object]) -> None:
        """Run ``write()`` in the background; a save must not be in flight."""
        if self._thread is not None:
            raise RuntimeError("a checkpoint save is already in flight")
        self._error = self._result = self._priority = None
        self._waited = False
        pace = self._pace = Pace(self.share)

        def run() -> None:
            try:
                with self._lock:
                    if self.nice is not None and not self._waited:
                        self._priority = _lower_priority(self.nice)
                with paced(pace):
                    self._result = write()
            except BaseException as exc:  # kept for the loop's thread: never lost
                self._error = exc
            finally:
                if self.on_done is not None:
                    self.on_done()

        self._thread = threading.Thread(target=run, name="schedtrain-checkpoint",
                                        daemon=True)
        self._thread.start()

    def forget(self) -> None:
        """No longer track the save in flight (it runs on, in a daemon thread)."""
        self._stray, self._thread = self._thread or self._stray, None

    def result(self) -> Any:
        """Wait for the save in flight to end; re-raise what it raised, else return what
        it returned (``None`` when none was in flight). The thread gets its priority back
        first: the loop now waits for it."""
        thread, self._thread = self._thread, None
        if thread is None:
            return None
        if self._pace is not None:
            self._pace.release()
        with self._lock:
            self._waited = True
            priority, self._priority = self._priority, None
            if priority is not None and thread.is_alive():
                _set_priority(*priority)
        thread.join()
        error, self._error = self._error, None
        result, self._result = self._result, None
        if error is not None:
            raise error
        return result


def _lower_priority(nice: int) -> tuple[int, int] | None:
    """Give the calling thread the nice value ``nice`` if that is lower priority than it
    has (Linux: ``setpriority`` of a thread id applies to that thread alone); returns its
    id and former value, or ``None`` where nothing changed."""
    if not sys.platform.startswith("linux"):
        return None
    tid = threading.get_native_id()
    try:
        before = os.getpriority(os.PRIO_PROCESS, tid)
        if before >= nice:
            return None
        os.setpriority(os.PRIO_PROCESS, tid, nice)
    except OSError:
        return None
    return tid, before


def _set_priority(tid: int, nice: int) -> None:
    """Best-effort: thread ``tid``'s nice value back to ``nice`` (raising a priority may
    be refused: the write then goes on as it is)."""
    with contextlib.suppress(OSError):
        os.setpriority(os.PRIO_PROCESS, tid, nice)
