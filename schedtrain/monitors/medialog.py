"""``MediaLog``: the images, histograms and text a ``MetricStore`` holds until its flush.

They never enter the scalar history that triggers and conditions read; the log keeps
which kind each name is (a name is one kind for the whole run), where each value's file
goes, and the values not yet written, in the order they were put among the scalars.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from schedtrain.monitors.media import Histogram, MediaKind, MediaRecord, media_path
from schedtrain.time import Timestamp

__all__ = ["MediaLog"]

_ARTICLE = {"image": "an image (put_image)", "histogram": "a histogram (put_histogram)",
            "text": "text (put_text)"}


class MediaLog:
    """Media values put but not yet sent to the sinks, each with the count of scalars
    pending before it (so a flush keeps the order they were put in)."""

    def __init__(self) -> None:
        self.kinds: dict[str, MediaKind] = {}
        self._at: dict[str, tuple[int, int]] = {}  # name -> (step, values put at that step)
        self.pending: list[tuple[int, MediaRecord]] = []

    def describe(self, name: str) -> str:
        """``"an image (put_image)"`` for a name put as an image, and so on."""
        return _ARTICLE[self.kinds[name]]

    def check(self, kind: MediaKind, name: str) -> None:
        """Refuse (``ValueError``) a value of ``name`` put as another kind before."""
        was = self.kinds.get(name, kind)
        if was != kind:
            raise ValueError(f"metric {name!r} is {_ARTICLE[was]}; {_ARTICLE[kind]} needs "
                             "another name")

    def add(self, kind: MediaKind, name: str, payload: torch.Tensor | Histogram | str, *,
            ts: Timestamp, wall: float, position: int) -> MediaRecord:
        """Record a value of ``name`` put at ``ts`` after ``position`` pending scalars."""
        self.check(kind, name)
        self.kinds[name] = kind
        step, n = self._at.get(name, (-1, 0))
        repeat = n if step == ts.step else 0
        self._at[name] = (ts.step, repeat + 1)
        rec = MediaRecord(kind, name, ts.step, ts.epoch, wall,
                          media_path(kind, name, ts.step, repeat), payload)
        self.pending.append((position, rec))
        return rec

    def take(self, count: int, scalars: int) -> list[tuple[int, MediaRecord]]:
        """The first ``count`` pending values; those left count their position from
        after the first ``scalars`` pending scalars (which go with them)."""
        got, rest = self.pending[:count], self.pending[count:]
        self.pending = [(max(p - scalars, 0), r) for p, r in rest]
        return got

    # -- resume --------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Kinds, files per step and pending values, as plain data and tensors."""
        return {"kinds": dict(self.kinds),
                "at": {n: list(v) for n, v in self._at.items()},
                "pending": [[p, r.kind, r.name, r.step, r.epoch, r.wall, r.path,
                             r.payload.to_dict() if isinstance(r.payload, Histogram)
                             else r.payload] for p, r in self.pending]}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore ``state_dict``."""
        self.kinds = {str(n): k for n, k in state["kinds"].items()}
        self._at = {str(n): (int(s), int(c)) for n, (s, c) in state["at"].items()}
        self.pending = [
            (int(p), MediaRecord(kind, str(name), int(s), int(e), float(w), str(path),
                                 Histogram.from_dict(pay) if kind == "histogram" else pay))
            for p, kind, name, s, e, w, path, pay in state["pending"]]
