"""The sinks ``[run] sinks`` names, each reporting at most once per ``sink_every`` period."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from schedtrain.files import inside
from schedtrain.monitors.console import ConsolePrinter
from schedtrain.monitors.store import Record, Sink
from schedtrain.time import Time, Timestamp, Unit

__all__ = ["Every", "build_sinks"]


class Every:
    """Pass ``sink`` the scalars of one report per ``period`` (steps or epochs), with
    crossing semantics: a report whose step (or epoch) crosses a multiple of the period
    goes through, with all its scalars; the others are left out. Firings pass through.

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
        self._last = 0  # the counter at the last report passed on
        self._accepted: int | None = None

    def _counter(self, r: Record) -> int:
        return r.epoch if self.period.unit is Unit.EPOCH else r.step

    def scalars(self, records: Sequence[Record]) -> None:
        # The report passed on last may go on in the next flush: its values still go.
        k, last, accepted = self.period.base, self._last, self._accepted
        keep: list[Record] = []
        for r in records:
            cur = self._counter(r)
            if cur != accepted and cur // k != last // k:
                accepted = last = cur
            if cur == accepted:
                keep.append(r)
        self._last, self._accepted = last, accepted
        if keep:
            self.sink.scalars(keep)

    def firing(self, callback: str, event: str, ts: Timestamp, wall: float) -> None:
        self.sink.firing(callback, event, ts, wall)

    def close(self) -> None:
        self.sink.close()


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
