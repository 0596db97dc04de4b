"""``Pace``: the background writer's share of the time, so overlapped steps keep their speed.

Serialising, checksumming and copying a large state into the page cache take cores and
memory bandwidth that a training step on the CPU needs as much: run flat out beside it, a
write slowed the benchmark's steps by 40% (docs/performance.md). A paced write works in
pieces and, after each ``QUANTUM`` of work, sleeps so that it is busy at most ``share`` of
the time: the same work is spread over more steps, each slowed less. Work is the thread's
own CPU time: where other threads hold the cores (a niced writer on a busy machine), the
write gets less of them and sleeps less in proportion. The moment the loop
waits for the write (the next save, a way out, SIGTERM) ``release`` lifts the pace, so
nothing waits longer than the write itself takes.

The pieces are where the write already loops (a tensor checked, hashed, a file's bytes
written): ``pause`` is called there. It does nothing outside a paced thread, so a
synchronous save pays one thread-local lookup per piece.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO, Any, Final

from schedtrain.spec.model import CPU_WRITE_SHARE

__all__ = ["PIECE", "QUANTUM", "Pace", "paced", "paced_file", "pause",
           "update_in_pieces", "write_share"]

#: Work between two looks at the pace (seconds): short beside a step, long beside a sleep.
QUANTUM: Final = 0.02
#: The most bytes one ``write`` call of a paced file hands on at once.
PIECE: Final = 8 << 20

_local = threading.local()


class Pace:
    """Busy at most ``share`` (0 < share <= 1) of the time until ``release``d; it counts
    the CPU time of the thread that ``begin``s it (``paced`` does)."""

    def __init__(self, share: float) -> None:
        if not 0 < share <= 1:
            raise ValueError(f"a writer's share of the time must be in (0, 1], got {share!r}")
        self.share = share
        self._released = threading.Event()
        self._since = time.thread_time()

    @property
    def released(self) -> bool:
        """Whether the pace is lifted: the write runs flat out from now on."""
        return self._released.is_set() or self.share >= 1

    def release(self) -> None:
        """Lift the pace (from any thread): a sleep in progress ends at once."""
        self._released.set()

    def begin(self) -> None:
        """Count work from now, in the calling thread (the one that writes)."""
        self._since = time.thread_time()

    def pause(self) -> None:
        """After a piece of work: sleep if this thread was busy a ``QUANTUM`` or more."""
        if self.released:
            return
        busy = time.thread_time() - self._since
        if busy < QUANTUM:
            return
        self._released.wait(busy * (1 - self.share) / self.share)
        self._since = time.thread_time()


def write_share(share: float | None, device_type: str) -> float:
    """``share``, or where not given (``None``) the default for a run on ``device_type``
    (``"cpu"``: the spec's ``CPU_WRITE_SHARE``; a device: 1, the host's cores are the write's)."""
    if share is not None:
        return share
    return CPU_WRITE_SHARE if device_type == "cpu" else 1.0


def pause() -> None:
    """A piece of a write is done: let the calling thread's pace (if any) sleep."""
    pace: Pace | None = getattr(_local, "pace", None)
    if pace is not None:
        pace.pause()


@contextmanager
def paced(pace: Pace | None) -> Iterator[None]:
    """Run the block under ``pace`` in this thread (``None``: unpaced)."""
    before = getattr(_local, "pace", None)
    _local.pace = pace
    if pace is not None:
        pace.begin()
    try:
        yield
    finally:
        _local.pace = before


def update_in_pieces(h: Any, data: Any) -> None:
    """``h.update(data)`` (a hash of a buffer) in ``PIECE``s, pausing between them."""
    view = memoryview(data).cast("B")
    for start in range(0, len(view), PIECE):
        h.update(view[start:start + PIECE])
        pause()


class _PacedFile:
    """A binary file whose large writes are handed on in ``PIECE``s, pausing between."""

    def __init__(self, file: IO[bytes]) -> None:
        self._file = file

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        for start in range(0, len(view), PIECE):
            self._file.write(view[start:start + PIECE])
            pause()
        return len(view)

    def flush(self) -> None:
        self._file.flush()


def paced_file(file: IO[bytes]) -> IO[bytes]:
    """``file`` itself, or in a paced thread a wrapper that pauses between pieces (the
    bytes written are the same)."""
    if getattr(_local, "pace", None) is None:
        return file
    return _PacedFile(file)  # type: ignore[return-value]
