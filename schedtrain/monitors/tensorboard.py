"""``TensorBoardWriter``: scalars as TensorBoard event files (the ``tensorboard`` extra)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from schedtrain.monitors.store import Record
from schedtrain.time import Timestamp

__all__ = ["TensorBoardWriter"]


class TensorBoardWriter:
    """Write each scalar with ``SummaryWriter.add_scalar`` at its step; firings are not written."""

    def __init__(self, log_dir: str | Path) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as exc:  # tensorboard itself is missing
            raise ImportError(
                "TensorBoardWriter needs the tensorboard package: "
                "pip install 'schedtrain[tensorboard]'") from exc
        self._writer: Any = SummaryWriter(log_dir=str(log_dir))

    def scalars(self, records: Sequence[Record]) -> None:
        for r in records:
            self._writer.add_scalar(r.name, r.value, r.step, walltime=r.wall)

    def firing(self, callback: str, event: str, ts: Timestamp, wall: float) -> None:
        return None

    def close(self) -> None:
        self._writer.close()
