"""``MetricStore``: scalar metrics with history, lazy until read; and images,
histograms and text, which go to the sinks only (``put_image`` ...).

Values put as tensors stay on their device: nothing is copied to the host (no
device sync) until a value is read (``latest``, ``history``) or the store is
``flush``-ed. A flush materialises every pending value in one transfer and
hands the records to the sinks (JSONL, TensorBoard, console).
"""

from __future__ import annotations

import collections
import itertools
import math
import operator
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol

import attrs
import torch

from schedtrain.monitors.media import MediaKind, MediaRecord, to_histogram, to_image, to_text
from schedtrain.monitors.medialog import MediaLog
from schedtrain.time import Timestamp
from schedtrain.triggers.protocol import MetricValue

__all__ = ["MetricStore", "Record", "Sink"]


@attrs.define(slots=True)
class Record:
    """One scalar value: its name, value (a float once materialised) and when it was put."""

    name: str
    value: Any
    step: int
    epoch: int
    wall: float

    def to_dict(self) -> dict[str, Any]:
        """The ``events.jsonl`` line of this scalar."""
        return {"kind": "scalar", "name": self.name, "value": self.value, "step": self.step,
                "epoch": self.epoch, "time": self.wall}


class Sink(Protocol):
    """A writer the store and trainer report to.

    A sink may also define ``media(records)`` (images, histograms, text: a list of
    ``MediaRecord``), ``epoch_end(ts)`` (told after each epoch's values were
    flushed), ``state_dict()``/``load_state_dict(state)`` (kept in checkpoints, so a
    resumed run reports what the uninterrupted one would) and
    ``firing_timed(callback, event, ts, wall, duration)`` (called in place of ``firing``
    with the seconds the callback ran); the store calls them where they exist.
    """

    def scalars(self, records: Sequence[Record]) -> None:
        """Materialised scalar records, in the order they were put."""

    def firing(self, callback: str, event: str, ts: Timestamp, wall: float) -> None:
        """A callback fired."""

    def close(self) -> None:
        """Flush and release files."""


def _as_float(name: str, value: Any) -> float:
    if isinstance(value, bool | str | bytes) or value is None:
        raise TypeError(f"metric {name!r} must be a number or a one-element tensor, got "
                        f"{type(value).__name__} {value!r:.40}; text, images and histograms "
                        "have their own calls: put_text, put_image, put_histogram")
    try:
        return float(value)
    except (TypeError, ValueError):
        raise TypeError(f"metric {name!r} must be a number or a one-element tensor, "
                        f"got {type(value).__name__} {value!r:.40}") from None


class MetricStore:
    """Scalar metrics with history; implements the core's ``MetricsView``.

    Args:
        now: returns the clock's timestamp, stamped on each value put.
        sinks: writers that receive each value once materialised.
        history_limit: how many recent values of each metric are kept in memory
            (``None``: all); the count of values is kept whole, and every value goes to
            the sinks (``events.jsonl``), so a long run's memory does not grow.
    """

    def __init__(self, now: Callable[[], Timestamp] | None = None,
                 sinks: Iterable[Sink] = (), history_limit: int | None = 10_000) -> None:
        self._now = now or Timestamp
        self.sinks: list[Sink] = list(sinks)
        self.history_limit = history_limit
        self._history: dict[str, collections.deque[Record]] = {}
        self._counts: dict[str, int] = {}
        self._pending: list[Record] = []  # put but not yet materialised or sent to sinks
        #: when a list, every value put is also appended to it (the trainer collects a
        #: firing's values there to reduce them across ranks)
        self.recorder: list[Record] | None = None
        self._epochs_ended = 0  # the epoch counter at the last ``epoch_ended``
        #: restored from a checkpoint taken at an epoch_end before its values were flushed:
        #: that epoch's end and how many of the pending values are from before it
        self._owed: tuple[Timestamp, int, int] | None = None
        self.media = MediaLog()

    def put(self, name: str, value: Any) -> None:
        """Add a value of ``name`` (a number, or a one-element tensor kept lazy).

        Raises:
            ValueError, TypeError: naming the metric, for a tensor of several values, a
                string or anything else that is not one number.
        """
        if not isinstance(name, str) or not name:
            raise ValueError(f"a metric name must be a non-empty string, got {name!r}")
        if isinstance(value, torch.Tensor):
            if value.numel() != 1:
                raise ValueError(f"metric {name!r} must be a scalar, got a tensor of shape "
                                 f"{tuple(value.shape)}")
            value = value.detach()
        elif type(value) is not float and type(value) is not int:
            value = _as_float(name, value)
        if self.media.kinds and name in self.media.kinds:
            raise ValueError(f"metric {name!r} is {self.media.describe(name)}; a scalar "
                             "needs another name")
        ts = self._now()
        rec = Record(name, value, ts.step, ts.epoch, time.time())
        hist: collections.deque[Record] | None = self._history.get(name)
        if hist is None:
            hist = self._history[name] = collections.deque(maxlen=self.history_limit)
        hist.append(rec)
        self._counts[name] = self._counts.get(name, 0) + 1
        self._pending.append(rec)
        if self.recorder is not None:
            self.recorder.append(rec)

    # -- values that are not scalars -----------------------------------------------------
    def put_image(self, name: str, image: Any, *, layout: str | None = None) -> None:
        """Add an image of ``name``: a tensor or numpy array, ``uint8`` (0..255) or float
        (0..1), ``HW``, ``CHW``/``HWC`` or a batch ``NCHW``/``NHWC`` (written as one grid).

        By default a torch tensor is channels-first and a numpy array channels-last;
        ``layout`` says otherwise. The image is copied to the host now.

        Raises:
            ValueError, TypeError: naming the metric, its shape or dtype and what was
                expected.
        """
        self._put_media("image", name, lambda: to_image(name, image, layout))

    def put_histogram(self, name: str, values: Any, *, bins: int = 30) -> None:
        """Add a histogram of ``values`` (a tensor, numpy array or numbers, all finite) in
        ``bins`` equal bins from their min to their max, computed now."""
        self._put_media("histogram", name, lambda: to_histogram(name, values, bins))

    def put_text(self, name: str, text: Any) -> None:
        """Add text: a string, or a 2-D integer tensor (a confusion matrix, written as a
        Markdown table; ``confusion_table`` names its classes)."""
        self._put_media("text", name, lambda: to_text(name, text))

    def _put_media(self, kind: MediaKind, name: str,
                   convert: Callable[[], torch.Tensor | Any]) -> None:
        if not isinstance(name, str) or not name:
            raise ValueError(f"a metric name must be a non-empty string, got {name!r}")
        if name in self._history:
            raise ValueError(f"metric {name!r} has scalar values; {kind} needs another name")
        self.media.check(kind, name)
        self.media.add(kind, name, convert(), ts=self._now(), wall=time.time(),
                       position=len(self._pending))

    def _no_scalars(self, name: str) -> None:
        if name in self.media.kinds:
            raise TypeError(f"metric {name!r} is {self.media.describe(name)}: conditions, "
                            "metric triggers and latest() read scalars only")

    # -- flushing -------------------------------------------------------------------------
    def flush(self) -> None:
        """Materialise pending values (one device transfer) and hand them to the sinks."""
        if self._owed is not None:
            (ts, n, m), self._owed = self._owed, None
            before, self._pending = self._pending[:n], self._pending[n:]
            self._send(before, self.media.take(m, n))
            self._tell_epoch_end(ts)
        if not self._pending and not self.media.pending:
            return
        pending, self._pending = self._pending, []
        self._send(pending, self.media.take(len(self.media.pending), len(pending)))

    def _send(self, pending: list[Record], media: list[tuple[int, MediaRecord]]) -> None:
        _materialize(pending)
        done = 0
        # In the order they were put: the scalars before each group of media, the group.
        for pos, group in itertools.groupby(media, key=operator.itemgetter(0)):
            self._to_sinks(pending[done:pos])
            done = pos
            self._media_to_sinks([r for _, r in group])
        self._to_sinks(pending[done:])

    def _to_sinks(self, records: list[Record]) -> None:
        if records:
            for sink in self.sinks:
                sink.scalars(records)

    def _media_to_sinks(self, records: list[MediaRecord]) -> None:
        for sink in self.sinks:
            got = getattr(sink, "media", None)
            if got is not None:  # a sink that shows no media (the console) leaves them
                got(records)

    def epoch_ended(self, ts: Timestamp) -> None:
        """Flush, then tell the sinks that define ``epoch_end`` that an epoch ended (the
        loop calls this once per epoch, after ``epoch_end`` fired)."""
        self.flush()
        self._tell_epoch_end(ts)

    def _tell_epoch_end(self, ts: Timestamp) -> None:
        self._epochs_ended = ts.epoch
        for sink in self.sinks:
            ended = getattr(sink, "epoch_end", None)
            if ended is not None:
                ended(ts)

    # -- reading (MetricsView) ---------------------------------------------------------
    def latest(self, name: str) -> MetricValue | None:
        """The newest value of ``name`` and how many values it has had, or ``None``."""
        hist = self._history.get(name)
        if not hist:
            self._no_scalars(name)
            return None
        rec = hist[-1]
        if not isinstance(rec.value, float):
            self.flush()
        return MetricValue(rec.value, self._counts[name])

    def newest(self, name: str) -> tuple[Any, int] | None:
        """The newest value of ``name`` as put (a tensor stays on its device: this never
        syncs) and how many values it has had, or ``None``."""
        hist = self._history.get(name)
        return None if not hist else (hist[-1].value, self._counts[name])

    def put_at(self, name: str) -> tuple[int, int] | None:
        """``(step, epoch)`` of the clock when the newest value of ``name`` was put, or
        ``None``: a value put at an earlier step measured other weights."""
        hist = self._history.get(name)
        return None if not hist else (hist[-1].step, hist[-1].epoch)

    def value(self, name: str, default: float = math.nan) -> float:
        """The newest value of ``name`` as a float, or ``default``."""
        got = self.latest(name)
        return default if got is None else got.value

    def history(self, name: str) -> list[tuple[int, float]]:
        """``(step, value)`` for each kept value of ``name`` (the last ``history_limit``)."""
        if name not in self._history:
            self._no_scalars(name)
        hist: Iterable[Record] = self._history.get(name, ())
        if any(not isinstance(r.value, float) for r in hist):
            self.flush()
        return [(r.step, r.value) for r in hist]

    def materialized(self) -> dict[str, float]:
        """The newest value of each metric already on the host (never syncs)."""
        out: dict[str, float] = {}
        for name, hist in self._history.items():
            for r in reversed(hist):
                if isinstance(r.value, float):
                    out[name] = r.value
                    break
        return out

    def names(self) -> list[str]:
        """Names that have at least one value, in order of first appearance."""
        return list(self._history)

    def __contains__(self, name: object) -> bool:
        return name in self._history

    def firing(self, callback: str, event: str, ts: Timestamp, wall: float,
               duration: float) -> None:
        """Report a firing to the sinks, once its callback has run: it started at ``wall``
        (``time.time()``) and ran ``duration`` seconds (a measurement: it differs between
        runs, so a resumed run's log equals the uninterrupted one's all but these)."""
        for sink in self.sinks:
            timed = getattr(sink, "firing_timed", None)
            if timed is not None:
                timed(callback, event, ts, wall, duration)
            else:
                sink.firing(callback, event, ts, wall)

    def close(self) -> None:
        """Flush and close the sinks."""
        self.flush()
        for sink in self.sinks:
            sink.close()

    # -- resume --------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The kept values (materialised) and counts, so metric triggers see the same
        counts after resume, and the values not yet sent to the sinks.

        Nothing is flushed: a checkpoint taken anywhere (a preemption between two events)
        leaves ``events.jsonl`` exactly as the uninterrupted run writes it.
        """
        _materialize(self._pending)
        for hist in self._history.values():
            _materialize([r for r in hist if not isinstance(r.value, float)])
        return {"history": {n: [[r.step, r.epoch, r.value, r.wall] for r in h]
                            for n, h in self._history.items()},
                "counts": dict(self._counts),
                "pending": [[r.name, r.step, r.epoch, r.value, r.wall]
                            for r in self._pending],
                "epochs_ended": self._epochs_ended,
                "media": self.media.state_dict(),
                "sinks": {key: sd() for key, sink in self._keyed_sinks()
                          if (sd := getattr(sink, "state_dict", None)) is not None}}

    def _keyed_sinks(self) -> list[tuple[str, Sink]]:
        # The position and class name: a resumed run with other sinks restores none wrongly.
        return [(f"{i}:{type(s).__name__}", s) for i, s in enumerate(self.sinks)]

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore values saved by ``state_dict``; those the sinks had not received then
        are sent at the next flush."""
        self._pending = [Record(str(n), float(v), int(s), int(e), float(w))
                         for n, s, e, v, w in state.get("pending", [])]
        self._history = {
            n: collections.deque((Record(n, float(v), int(s), int(e), float(w))
                                  for s, e, v, w in h), maxlen=self.history_limit)
            for n, h in state["history"].items()}
        self._counts = {n: int(c) for n, c in state.get(
            "counts", {n: len(h) for n, h in self._history.items()}).items()}
        # A checkpoint taken during an epoch_end, before the loop flushed its values: the
        # first flush sends them and then ends the epoch for the sinks, as it would have.
        self.media = MediaLog()
        if "media" in state:
            self.media.load_state_dict(state["media"])
        now = self._now()
        self._epochs_ended = int(state.get("epochs_ended", now.epoch))
        self._owed = ((now, len(self._pending), len(self.media.pending))
                      if now.epoch > self._epochs_ended else None)
        saved = state.get("sinks", {})
        for key, sink in self._keyed_sinks():
            load = getattr(sink, "load_state_dict", None)
            if key in saved and load is not None:
                load(saved[key])


def _materialize(records: Sequence[Record]) -> None:
    """Turn each record's value into a float, with one device transfer for tensors."""
    lazy = [r for r in records if isinstance(r.value, torch.Tensor)]
    if lazy:
        host = torch.stack([r.value.reshape(()).float() for r in lazy]).cpu().tolist()
        for r, v in zip(lazy, host, strict=True):
            r.value = float(v)
    for r in records:
        r.value = float(r.value)
