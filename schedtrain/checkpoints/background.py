"""Background saves: a host snapshot of a checkpoint's state, written by one thread.

The loop blocks only for ``snapshot``: every tensor of the state is copied to host
memory (pinned when CUDA is there), so training may change the live state at once.
``Writer`` then serialises, checksums, writes, syncs and commits it in one background
thread; at most one save is in flight. What the thread raised is kept and re-raised on
the loop's thread by ``Writer.result`` (never lost), and ``on_done`` tells the loop a
save ended, so it looks at the next step. ``checked`` decides a checkpoint's name in
that thread: the finiteness check reads the host copy, not the loop's time.

On Linux the thread runs at the lowest CPU priority (``WRITER_NICE``), so on busy cores
the training step's threads run first and the write takes the time they leave; where
cores are free the nice value changes nothing. Whenever the loop waits for the write (the
next save, a way out of the loop) the thread gets its priority back first, so the loop
never waits behind other work on the machine. Both are best-effort: where the system
refuses (raising a priority back needs root, ``CAP_SYS_NICE`` or ``RLIMIT_NICE``), the
thread keeps what it has.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Final

import torch

from schedtrain.checkpoints.format import is_finite

__all__ = ["BUSY_RULES", "MODES", "WRITER_NICE", "Writer", "checked", "nonfinite", "snapshot",
           "trim"]

#: ``[run] checkpoint_mode``: write in the background, or block until the file is committed.
MODES: Final = ("async", "sync")
#: ``[run] checkpoint_busy``: what a save asked for while another is in flight does.
BUSY_RULES: Final = ("wait", "skip")
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


def snapshot(tree: Any) -> Any:
    """A deep copy of a state tree whose tensors are host copies.

    Tensors sharing a storage share the copied one (views, tied weights), so the copy
    serialises to the same bytes as the original; containers are copied, other values
    (numbers, strings) are immutable and kept; a ``state_dict``'s ``_metadata`` is copied.
    """
    storages: dict[tuple[str, int], torch.UntypedStorage] = {}

    def copy(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            return _host_tensor(value, storages)
        if type(value) is dict:
            return {k: copy(v) for k, v in value.items()}
        if isinstance(value, dict):  # an OrderedDict state_dict: its ``_metadata`` too
            out = type(value)()
            for k, v in value.items():
                out[k] = copy(v)
            out.__dict__.update(copy(vars(value)))
            return out
        if isinstance(value, list):
            return [copy(v) for v in value]
        if isinstance(value, tuple):
            return tuple(copy(v) for v in value)
        if isinstance(value, set):
            return set(value)
        return value

    return copy(tree)


def _tensors(tree: Any) -> Iterator[torch.Tensor]:
    if isinstance(tree, torch.Tensor):
        yield tree
    elif isinstance(tree, dict):
        for v in tree.values():
            yield from _tensors(v)
    elif isinstance(tree, list | tuple):
        for v in tree:
            yield from _tensors(v)


def trim(tree: dict[str, Any]) -> dict[str, Any]:
    """``tree`` with each tensor that alone uses a larger storage (a scalar loss in an
    allocator's block) replaced by a compact copy; containers are new (the run's live
    state dicts are never changed), other tensors are the same objects.

    ``torch.save`` writes whole storages: the bytes outside the tensor are whatever
    memory held, so without this two runs computing the same values could write
    different files.
    """
    users: dict[int, int] = {}
    for t in _tensors(tree):
        if type(t) is torch.Tensor:
            key = t.untyped_storage().data_ptr()
            users[key] = users.get(key, 0) + 1

    def fix(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            if (type(value) is torch.Tensor
                    and value.untyped_storage().nbytes() > value.nbytes
                    and users[value.untyped_storage().data_ptr()] == 1):
                return value.clone()
            return value
        if type(value) is dict:
            return {k: fix(v) for k, v in value.items()}
        if isinstance(value, dict):  # an OrderedDict state_dict, with its _metadata
            out = type(value)()
            for k, v in value.items():
                out[k] = fix(v)
            out.__dict__.update(vars(value))
            return out
        if isinstance(value, list):
            return [fix(v) for v in value]
        if isinstance(value, tuple):
            return tuple(fix(v) for v in value)
        return value

    fixed: dict[str, Any] = fix(tree)
    return fixed


def _host_tensor(t: torch.Tensor,
                 storages: dict[tuple[str, int], torch.UntypedStorage]) -> torch.Tensor:
    if type(t) is not torch.Tensor:  # a subclass (DTensor...): its own copy
        return t.detach().clone()
    source = t.untyped_storage()
    key = (str(t.device), source.data_ptr())
    host = storages.get(key)
    if host is None:
        if t.device.type == "cpu":
            host = source.clone()  # type: ignore[no-untyped-call]
        else:  # pinned host memory: the copy from the device is as fast as it gets
            buffer = torch.empty(source.nbytes(), dtype=torch.uint8, pin_memory=True)
            host = buffer.untyped_storage()
            host.copy_(source)
        storages[key] = host
    out = torch.empty(0, dtype=t.dtype)
    out.set_(host, t.storage_offset(), t.size(), t.stride())
    return out


class Writer:
    """One background thread at a time, writing one checkpoint.

    Args:
        on_done: called from the thread when a save ended (written or failed).
        nice: the thread's nice value while nobody waits for it (Linux only; ``None``:
            the priority of the thread that starts it).
    """

    def __init__(self, on_done: Callable[[], None] | None = None,
                 nice: int | None = WRITER_NICE) -> None:
        self.on_done, self.nice = on_done, nice
        self._thread: threading.Thread | None = None
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

    def start(self, write: Callable[[], object]) -> None:
        """Run ``write()`` in the background; a save must not be in flight."""
        if self._thread is not None:
            raise RuntimeError("a checkpoint save is already in flight")
        self._error = self._result = self._priority = None
        self._waited = False

        def run() -> None:
            try:
                with self._lock:
                    if self.nice is not None and not self._waited:
                        self._priority = _lower_priority(self.nice)
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
        self._thread = None

    def result(self) -> Any:
        """Wait for the save in flight to end; re-raise what it raised, else return what
        it returned (``None`` when none was in flight). The thread gets its priority back
        first: the loop now waits for it."""
        thread, self._thread = self._thread, None
        if thread is None:
            return None
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
