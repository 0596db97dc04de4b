"""The sinks ``[run] sinks`` names, each reporting at most once per ``sink_every`` period."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from schedtrain.files import inside
from schedtrain.monitors.console import ConsolePrinter
from schedtrain.monitors.media import MediaRecord
from schedtrain.monitors.store import Record, Sink
from schedtrain.time import Time, Timestamp, Unit

__all__ = ["Every", "build_sinks"]


class Every:
    """Pass ``sink`` exactly one report per ``period``; a report is the values put at one
    ``(step, epoch)`` of the clock (a step's ``step_end``, or an ``epoch_end``).

    * ``"k steps"``: the first report whose step crosses a multiple of ``k`` (crossing
      semantics, as ``every``): the ``step_end`` report of step 100 for ``"100 steps"``,
      never also the ``epoch_end`` report made at that same step.
    * ``"k epochs"``: at each ``epoch_end`` that completes a multiple of ``k`` epochs, the
      newest value of every name put since the last report passed (tensorpack's
      ``ScalarPrinter``: a per-step ``train/loss_ema`` beside the ``epoch_end``'s
      validation), stamped as the newest report (that ``epoch_end``'s, or the epoch's
      last step's): one report, as of the epoch's end. A run cut inside an epoch
      (``max_steps``) passes nothing for that partial epoch, as it fires no ``epoch_end``.

    A report's values all go, also when they reach the sink in several flushes. Firings
    and media (images, histograms, text) pass through unthinned.

    Args:
        sink: the sink to thin out.
        period: ``"1 epoch"``, ``"100 steps"``.
    """

    def __init__(self, sink: Sink, period: str | Time) -> None:
        t = Time.parse(period)
        if t.unit not in (Unit.STEP, Unit.EPOCH) or t.base < 1:
            raise ValueError(f"a sink's period must be a whole number >= 1 of steps or "
                             f"epochs, got {str(period)!r}")
        self.sink, self.period = sink, t
        self._last = 0  # steps: the step of the last report passed on
        self._accepted: tuple[int, int] | None = None  # steps: that report's (step, epoch)
        #: epochs: each name's newest record since the last report passed (oldest first)
        self._held: dict[str, Record] = {}

    def scalars(self, records: Sequence[Record]) -> None:
        if self.period.unit is Unit.EPOCH:
            held = self._held
            for r in records:
                held.pop(r.name, None)
                held[r.name] = r
            return
        k, last, accepted = self.period.base, self._last, self._accepted
        keep: list[Record] = []
        for r in records:
            key = (r.step, r.epoch)
            if key != accepted and r.step // k != last // k:
                accepted, last = key, r.step
            if key == accepted:
                keep.append(r)
        self._last, self._accepted = last, accepted
        if keep:
            self.sink.scalars(keep)

    def epoch_end(self, ts: Timestamp) -> None:
        """An epoch ended (after its ``epoch_end`` values were flushed): an epoch period
        passes its held report when ``ts.epoch`` completes a period."""
        if self.period.unit is Unit.EPOCH and self._held and ts.epoch % self.period.base == 0:
            held, self._held = list(self._held.values()), {}
            step, epoch = held[-1].step, held[-1].epoch
            # new records: the store's own go to the other sinks as they were put
            self.sink.scalars([r if (r.step, r.epoch) == (step, epoch)
                               else Record(r.name, r.value, step, epoch, r.wall) for r in held])
        ended = getattr(self.sink, "epoch_end", None)
        if ended is not None:
            ended(ts)

    def media(self, records: Sequence[MediaRecord]) -> None:
        got = getattr(self.sink, "media", None)
        if got is not None:
            got(records)

    def firing(self, callback: str, event: str, ts: Timestamp, wall: float) -> None:
        self.sink.firing(callback, event, ts, wall)

    def firing_timed(self, callback: str, event: str, ts: Timestamp, wall: float,
                     duration: float) -> None:
        timed = getattr(self.sink, "firing_timed", None)
        if timed is not None:
            timed(callback, event, ts, wall, duration)
        else:
            self.sink.firing(callback, event, ts, wall)

    def close(self) -> None:
        self.sink.close()

    # -- resume: a resumed run passes the reports the uninterrupted one would ------------
    def state_dict(self) -> dict[str, Any]:
        """Where the period stands: the last report passed, the report held."""
        return {"last": self._last,
                "accepted": list(self._accepted) if self._accepted is not None else None,
                "held": [[r.name, r.step, r.epoch, r.value, r.wall]
                         for r in self._held.values()]}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore ``state_dict``."""
        self._last = int(state["last"])
        acc = state["accepted"]
        self._accepted = None if acc is None else (int(acc[0]), int(acc[1]))
        self._held = {str(n): Record(str(n), float(v), int(s), int(e), float(w))
                      for n, s, e, v, w in state["held"]}


def build_sinks(names: Sequence[str], every: Mapping[str, str],
                run_dir: Path | None) -> list[Sink]:
    """The console and TensorBoard sinks ``names`` lists (``"jsonl"`` is the trainer's
    own ``events.jsonl``), each thinned to its ``every`` period.

    Raises:
        UnsafeFile: ``RUN_DIR/tensorboard`` is a link leading out of the run directory.
    """
    out: list[Sink] = []
    for name in names:
        sink: Sink
        if name == "console":
            sink = ConsolePrinter()
        elif name == "tensorboard":
            from schedtrain.monitors.tensorboard import TensorBoardWriter

            log_dir = (run_dir or Path("runs")) / "tensorboard"
            if run_dir is not None:  # a link there must not lead the event files out
                inside(log_dir, run_dir)
            sink = TensorBoardWriter(log_dir)
        else:
            continue
        out.append(Every(sink, every[name]) if name in every else sink)
    return out
