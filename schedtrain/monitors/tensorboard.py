"""``TensorBoardWriter``: scalars as TensorBoard event files (the ``tensorboard`` extra)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from schedtrain.monitors.media import Histogram, MediaRecord
from schedtrain.monitors.png import encode_png
from schedtrain.monitors.store import Record
from schedtrain.time import Timestamp

__all__ = ["TensorBoardWriter"]


class TensorBoardWriter:
    """Write each scalar with ``SummaryWriter.add_scalar`` at its step, images, histograms
    and text as TensorBoard shows them; firings are not written."""

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

    def media(self, records: Sequence[MediaRecord]) -> None:
        for r in records:
            if isinstance(r.payload, torch.Tensor):
                self._image(r, r.payload)
            elif isinstance(r.payload, Histogram):
                p = r.payload
                self._writer.add_histogram_raw(
                    r.name, p.min, p.max, p.num, p.sum, p.sum_squares,
                    list(p.edges[1:]), list(p.counts), r.step, walltime=r.wall)
            else:
                self._writer.add_text(r.name, r.payload, r.step, walltime=r.wall)

    def _image(self, r: MediaRecord, hwc: torch.Tensor) -> None:
        # Our own PNG bytes in TensorBoard's image summary: no Pillow needed.
        from tensorboard.compat.proto.summary_pb2 import Summary

        h, w, c = hwc.shape
        png = encode_png(hwc.contiguous().numpy().tobytes(), h, w, c)
        image = Summary.Image(height=h, width=w, colorspace=c, encoded_image_string=png)
        summary = Summary(value=[Summary.Value(tag=r.name, image=image)])
        # add_image would encode with Pillow; the writer's own file writer takes ours.
        self._writer._get_file_writer().add_summary(summary, r.step, r.wall)

    def firing(self, callback: str, event: str, ts: Timestamp, wall: float) -> None:
        return None

    def close(self) -> None:
        self._writer.close()
