"""``JsonlWriter``: every scalar and every firing as one JSON line in ``events.jsonl``."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from schedtrain.monitors.store import Record
from schedtrain.time import Timestamp

__all__ = ["JsonlWriter"]


class JsonlWriter:
    """Append scalars (``{"kind": "scalar", ...}``) and firings (``{"kind": "firing", ...}``).

    Lines are appended (a resumed run continues the same file) and flushed at
    each write, so the file is readable while training runs.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = self.path.open("a", encoding="utf-8")

    def _write(self, rows: list[dict[str, Any]]) -> None:
        if self._file.closed:  # a second fit() on the same trainer appends again
            self._file = self.path.open("a", encoding="utf-8")
        self._file.write("".join(json.dumps(r) + "\n" for r in rows))
        self._file.flush()

    def scalars(self, records: Sequence[Record]) -> None:
        self._write([r.to_dict() for r in records])

    def firing(self, callback: str, event: str, ts: Timestamp, wall: float) -> None:
        self._write([{"kind": "firing", "callback": callback, "event": event,
                      "step": ts.step, "epoch": ts.epoch, "batch": ts.batch,
                      "step_in_epoch": ts.step_in_epoch, "sample": ts.sample,
                      "token": ts.token, "seconds": ts.seconds, "time": wall}])

    def close(self) -> None:
        self._file.close()
