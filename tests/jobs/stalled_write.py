"""The crash job, whose Nth checkpoint write stalls half-way when ``STALL_WRITE=N`` is
set (a test hook of the tests only): it writes half the file, creates the file named by
``STALL_MARKER`` and sleeps, so a test can kill -9 the process during a background write.
Without ``STALL_WRITE`` it is the crash job as it is."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from jobs.crash import make_task as crash_task
from schedtrain.checkpoints import store
from schedtrain.training import Task


def make_task() -> Task:
    """The crash job's task, with the stalling write installed when asked for."""
    stall = int(os.environ.get("STALL_WRITE", "0"))
    if stall:
        _install(stall, Path(os.environ["STALL_MARKER"]))
    return crash_task()


def _install(stall: int, marker: Path) -> None:
    real = store.write_atomic
    count = [0]

    def write_atomic(path: Path, write: Callable[[Any], None]) -> Path:
        count[0] += 1
        if count[0] != stall:
            return real(path, write)

        def half(f: Any) -> None:
            write(f)
            f.truncate(f.tell() // 2)
            f.flush()
            marker.write_text(f"{threading.current_thread().name} {path.name}")
            while True:
                time.sleep(1)

        return real(path, half)

    store.write_atomic = write_atomic  # type: ignore[assignment]
