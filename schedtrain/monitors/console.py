"""``ConsolePrinter``: one line per step at which scalars were flushed."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import TextIO

from schedtrain.monitors.store import Record
from schedtrain.time import Timestamp

__all__ = ["ConsolePrinter"]


class ConsolePrinter:
    """Print scalars grouped by step: ``epoch 2 step 120  val/loss=0.31  val/accuracy=0.95``."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self._stream = stream

    def scalars(self, records: Sequence[Record]) -> None:
        stream = self._stream or sys.stdout
        groups: dict[tuple[int, int], list[Record]] = {}
        for r in records:
            groups.setdefault((r.epoch, r.step), []).append(r)
        for (epoch, step), recs in groups.items():
            values = "  ".join(f"{r.name}={r.value:.4g}" for r in recs)
            print(f"epoch {epoch} step {step}  {values}", file=stream)

    def firing(self, callback: str, event: str, ts: Timestamp, wall: float) -> None:
        return None

    def close(self) -> None:
        return None
