"""``RUN_DIR/run.json``: what a run directory holds, as a typed, bounded record.

Written by ``training.run_dir.RunDirectory.record`` (atomically), read back by the run
itself, ``schedtrain retime``, ``schedtrain diff`` and ``plan --costs``. It is read
through ``readback.read_json`` (a regular file only, never a blocking open, size and
nesting caps) and structured as a ``RunStatus``: a FIFO, a directory or a field of the
wrong type or out of bounds is a ``DamagedFile`` naming the file and key. Torch-free: the
commands that read it import nothing heavy.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Final

import attrs

from schedtrain.readback import (
    SMALL_FILE,
    at_most,
    between,
    invalid,
    read_json,
    structure,
    valid,
)
from schedtrain.time import MAX_COUNT

__all__ = ["BATCH_EVENTS", "LOCK_FILE", "RUN_FILE", "STATUSES", "RunStatus", "process_alive",
           "read_status"]

RUN_FILE: Final = "run.json"
#: Held (a POSIX record lock) by the process whose run uses the directory.
LOCK_FILE: Final = ".lock"
#: What ``run.json`` may say of its run.
STATUSES: Final = ("running", "finished", "stopped", "preempted", "failed")
#: A stamp past the year 5000 is no clock's (``updated``, seconds since 1970).
_LATEST: Final = 1e11
#: Events a loop fires only when it was built for a trigger that names them: what
#: ``batch_events`` may name (a running job cannot start firing one).
BATCH_EVENTS: Final = ("batch_start", "batch_end")
#: The longest path or URL ``checkpoint`` may hold.
_PATH_MAX: Final = 4096


def _status(_inst: Any, _attribute: Any, value: str) -> None:
    if value not in STATUSES:
        raise invalid("status", f"expected one of {', '.join(STATUSES)}, found {value[:40]!r}")


def _path(_inst: Any, attribute: Any, value: str | None) -> None:
    if value is not None and (len(value) > _PATH_MAX or any(
            ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F for c in value)):
        raise invalid(attribute.name, f"expected a path or URL of at most {_PATH_MAX:,} "
                                      "characters, without control characters")


def _batch_events(_inst: Any, _attribute: Any, value: tuple[str, ...] | None) -> None:
    if value is not None and not set(value) <= set(BATCH_EVENTS):
        raise invalid("batch_events", f"expected some of {', '.join(BATCH_EVENTS)}")


@attrs.frozen
class RunStatus:
    """``run.json``: the run's status and the clock when it last changed.

    Attributes:
        status: one of ``STATUSES``.
        step, epoch: the clock then.
        pid: the process that wrote it (``None``: unknown).
        updated: when (seconds since 1970).
        checkpoint, phase: the last checkpoint written (its path or URL) and its event.
        resumable: the step of the last checkpoint written that ``--resume auto`` may
            pick (``None``: none yet): a resume from an older one trains what remains.
        schedule: the schedule the run runs (canonical TOML; ``None``: no stored form).
        batch_events: the per-batch events its loop fires (``planning.retime.LOOP_EVENTS``;
            fixed when it started; ``None``: not recorded, an earlier version).
    """

    status: str = attrs.field(validator=[valid, _status])
    step: int = attrs.field(default=0, validator=between(0, MAX_COUNT))
    epoch: int = attrs.field(default=0, validator=between(0, MAX_COUNT))
    pid: int | None = attrs.field(default=None, validator=between(0, 2**31 - 1))
    updated: float | None = attrs.field(default=None, validator=between(0, _LATEST))
    checkpoint: str | None = attrs.field(default=None, validator=_path)
    phase: str | None = attrs.field(default=None, validator=valid)
    resumable: int | None = attrs.field(default=None, validator=between(0, MAX_COUNT))
    schedule: str | None = attrs.field(default=None, validator=at_most(SMALL_FILE))
    batch_events: tuple[str, ...] | None = attrs.field(default=None, validator=_batch_events)
    format: str = attrs.field(default="schedtrain-run-1", validator=valid)

    def to_dict(self) -> dict[str, Any]:
        """The JSON record (fields without a value left out)."""
        return {k: v for k, v in attrs.asdict(self).items() if v is not None}


def read_status(run_dir: Path) -> RunStatus | None:
    """``run_dir``'s ``run.json`` (``None``: there is none).

    Raises:
        DamagedFile: it is not a regular file, not JSON, or a field is out of its bounds.
    """
    path = run_dir / RUN_FILE
    try:
        data = read_json(path)
    except FileNotFoundError:
        return None
    return structure(data, RunStatus, path)



def process_alive(pid: int) -> bool:
    """Whether process ``pid`` exists on this machine (another machine's: assumed so)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # not ours to signal: it exists
        return True
    return True
