"""A checkpoint's ``events_offset`` checked against the log it cuts back.

A resume cuts ``events.jsonl`` back to the length its checkpoint recorded. A crafted
length within bounds would still cut the wrong lines (``0`` deletes the whole log, a
length past its end keeps lines of steps the resumed run writes again), so it is checked
against the log itself: the log only grows after a checkpoint records its length, and
its firing lines are written as they happen, so the last one before the length comes at
or before the checkpoint's step and the first one after it at or after. Only a window
around the length is read, however long the log.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Final

from schedtrain.files import UnsafeFile, open_regular
from schedtrain.readback import DamagedFile

__all__ = ["check_offset"]

#: How far either side of the length the firing lines are looked for.
WINDOW: Final = 1 << 20


def _firing_step(line: bytes) -> int | None:
    if b'"firing"' not in line:
        return None
    try:
        row = json.loads(line)
    except (ValueError, RecursionError):
        return None
    step = row.get("step") if isinstance(row, dict) and row.get("kind") == "firing" else None
    return step if isinstance(step, int) and not isinstance(step, bool) else None


def _steps(lines: list[bytes]) -> list[int]:
    return [s for s in map(_firing_step, lines) if s is not None]


def check_offset(log: Path, offset: int, step: int, shown: Path | str) -> None:
    """Refuse an ``offset`` (``run.events_offset``) past the end of the log, or that does
    not fall between the log's firings before the checkpoint's ``step`` and those after
    it; a log that is missing, empty, a link or not a regular file is not judged here
    (the log's writer refuses what is not a regular file of the run).

    Raises:
        DamagedFile: naming the checkpoint and ``run.events_offset``.
    """
    if log.is_symlink():  # not the run's log: the writer refuses it (``open_in_place``)
        return
    try:
        f = open_regular(log)
    except (OSError, UnsafeFile):
        return
    with f:
        size = os.fstat(f.fileno()).st_size
        if 0 < size < offset:
            raise DamagedFile(shown, "run.events_offset", (
                f"expected at most the log's length {size:,}, found {offset:,}: {log.name} "
                "was shortened since (edited, or its end lost); move it aside to resume "
                "with a new log"))
        cut = min(offset, size)
        start = max(cut - WINDOW, 0)
        f.seek(start)
        before = f.read(cut - start).split(b"\n")
        after = f.read(WINDOW).split(b"\n") if offset <= size else []
    if start > 0:
        before = before[1:]  # the window began inside a line
    earlier, later = _steps(before), _steps(after[:-1] if len(after) > 1 else [])
    if earlier and earlier[-1] > step:
        raise DamagedFile(shown, "run.events_offset", (
            f"expected the log's length at step {step}, found {offset:,}, after a firing "
            f"at step {earlier[-1]} in {log.name}"))
    if later and later[0] < step:
        raise DamagedFile(shown, "run.events_offset", (
            f"expected the log's length at step {step}, found {offset:,}, before a firing "
            f"at step {later[0]} in {log.name}"))
