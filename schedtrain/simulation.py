"""Simulated training: ``SimClock`` and ``simulate()``, jumping from one firing to the next.

A simulated run has a fixed shape: epochs of known lengths (in optimizer steps),
``batches_per_step`` micro-batches per step, and constant samples and tokens per
batch and seconds per step. Counters are then functions of the position, so the
simulation asks the trigger table for its due vectors and jumps straight to the
next point where anything can fire: 10^9 steps with few firings take milliseconds.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple

from schedtrain.errors import ScheduleError
from schedtrain.firings import Firing, FiringLog
from schedtrain.schedule import Schedule
from schedtrain.simclock import (
    _PH_BATCH,
    _PH_EPOCH_END,
    _PH_EPOCH_START,
    _PH_STEP,
    _PH_TRAIN_END,
    _TRAIN_START,
    Key,
    RunShape,
    SimClock,
    _ceil_div,
)
from schedtrain.table import TriggerTable
from schedtrain.time import COUNTERS, Time, Unit, as_time
from schedtrain.triggers.base import Due, MetricValue, Predicate

__all__ = ["Firing", "FiringLog", "RunShape", "SimClock", "Simulation", "next_firing", "simulate"]

# -- metrics from a stream ---------------------------------------------------------------


class MetricRecord(NamedTuple):
    """A metric value that appears at a given time of a simulated run."""

    at: Time
    name: str
    value: float


class _StreamMetrics:
    """Metric values of a simulated run: a record is visible from the point its time is reached."""

    def __init__(self, records: Iterable[MetricRecord], shape: RunShape) -> None:
        by_name: dict[str, list[tuple[Key, float]]] = {}
        for r in records:
            by_name.setdefault(r.name, []).append((self._key(r.at, shape), float(r.value)))
        self._keys = {n: [k for k, _ in sorted(v, key=lambda kv: kv[0])]
                      for n, v in by_name.items()}
        self._values = {n: [x for _, x in sorted(v, key=lambda kv: kv[0])]
                        for n, v in by_name.items()}
        self.position: Key = _TRAIN_START

    @staticmethod
    def _key(at: Time, shape: RunShape) -> Key:
        if at.unit is Unit.EPOCH:
            e = int(at.value)
            if e == 0:
                return _TRAIN_START
            if e > shape.epochs:
                return (shape.total_steps + 1, 0, 0)
            return (shape.start(e), _PH_EPOCH_END, 0)
        if at.unit is Unit.BATCH:
            b = int(at.value)
            return ((b - 1) // shape.batches_per_step + 1, _PH_BATCH, b) if b else _TRAIN_START
        s = shape.min_steps(at.counter, at.base)
        if s == 0:
            return _TRAIN_START
        return (int(s), _PH_STEP, 0) if math.isfinite(s) else (shape.total_steps + 1, 0, 0)

    def latest(self, name: str) -> MetricValue | None:
        keys = self._keys.get(name)
        if not keys:
            return None
        n = bisect.bisect_right(keys, self.position)
        return MetricValue(self._values[name][n - 1], n) if n else None


def _records(metrics: Any) -> list[MetricRecord]:
    """Accept ``{"val/loss": [("1 epoch", 0.9), ...]}`` or ``[(at, name, value), ...]``."""
    out: list[MetricRecord] = []
    if isinstance(metrics, Mapping):
        for name, series in metrics.items():
            for at, value in series:
                out.append(MetricRecord(_at(at), str(name), float(value)))
    else:
        for at, name, value in metrics:
            out.append(MetricRecord(_at(at), str(name), float(value)))
    return out


def _at(at: Any) -> Time:
    if isinstance(at, int) and not isinstance(at, bool):
        return Time(at, Unit.STEP)
    return as_time(at, "metric time")


# -- the simulation ------------------------------------------------------------------------


class Simulation:
    """A resumable simulated run of a schedule; ``simulate()`` is the one-call form."""

    def __init__(
        self,
        schedule: Schedule | TriggerTable,
        shape: RunShape,
        *,
        metrics: Any = None,
        predicates: Mapping[str, Predicate] | None = None,
        events: Mapping[str, Iterable[int]] | None = None,
    ) -> None:
        self.table = schedule if isinstance(schedule, TriggerTable) else schedule.compile(
            predicates=predicates)
        self.shape = shape
        self.clock = SimClock(shape)
        self._metrics = None if metrics is None else _StreamMetrics(_records(metrics), shape)
        declared = set(self.table.schedule.events)
        custom: list[tuple[int, int, str]] = []
        for order, (name, steps) in enumerate((events or {}).items()):
            if name not in declared:
                raise ScheduleError(
                    f"custom event {name!r} is not declared on the schedule "
                    f"(declared: {sorted(declared) or 'none'})")
            custom.extend((int(s), order, name) for s in steps)
        self._custom = sorted(custom)
        self._custom_keys = [(s, _PH_STEP, 1 + o) for s, o, _ in self._custom]
        self.table.attach(self.clock, self._metrics,
                          predicates if predicates is not None else self.table.predicates)

    # -- candidates ---------------------------------------------------------------------
    def _next_step_end(self, key: Key, due: Due) -> float:
        sh = self.shape
        first = key[0] if key[1] < _PH_STEP else key[0] + 1
        first = max(first, 1)
        best = math.inf
        for k, d in enumerate(due):
            if d == math.inf:
                continue
            c = COUNTERS[k]
            if c == "epoch":
                e = math.ceil(d)
                s = sh.start(e) + 1 if e < sh.epochs else math.inf
            else:
                s = sh.min_steps(c, d)
            best = min(best, max(s, first))
        return best if best <= sh.total_steps else math.inf

    def _next_batch_end(self, key: Key, due: Due) -> float:
        sh = self.shape
        b_rate = sh.batches_per_step
        first = key[2] + 1 if key[1] == _PH_BATCH else key[0] * b_rate + 1
        best = math.inf
        b: float
        for k, d in enumerate(due):
            if d == math.inf:
                continue
            c = COUNTERS[k]
            if c == "batch":
                b = math.ceil(d)
            elif c == "sample":
                b = _ceil_div(d, sh.samples_per_batch)
            elif c == "token":
                b = _ceil_div(d, sh.tokens_per_batch)
            elif c == "epoch":
                e = math.ceil(d)
                b = sh.start(e) * b_rate + 1 if e < sh.epochs else math.inf
            else:
                b = sh.min_steps(c, d) * b_rate + 1
            best = min(best, max(b, first))
        return best if best <= sh.total_steps * b_rate else math.inf

    def _next_epoch_end(self, key: Key, due: Due) -> float:
        sh = self.shape
        # epoch_end j sits at (start(j + 1), _PH_EPOCH_END, 0): the first one after `key`
        if key[1] < _PH_EPOCH_END:
            first = max(bisect.bisect_left(sh._starts, key[0]), 1) - 1
        else:
            first = bisect.bisect_right(sh._starts, key[0]) - 1
        best = math.inf
        j: float
        for k, d in enumerate(due):
            if d == math.inf:
                continue
            c = COUNTERS[k]
            if c == "epoch":
                j = max(math.ceil(d) - 1, 0)
            else:
                s = sh.min_steps(c, d)
                j = math.inf if s == math.inf else (sh.epoch_of_step(int(s)) if s >= 1 else 0)
            best = min(best, max(j, first))
        return best if best < sh.ended_epochs else math.inf

    def _next_point(self) -> tuple[Key, str, int] | None:
        """The next point that may fire, after the clock's position: (key, event, index)."""
        key = self.clock.key
        table, sh = self.table, self.shape
        cands: list[tuple[Key, str, int]] = []
        if key < _TRAIN_START or (key == _TRAIN_START and not self._started):
            cands.append((_TRAIN_START, "train_start", 0))
        s = self._next_step_end(key, table.due("step_end"))
        if s != math.inf:
            cands.append(((int(s), _PH_STEP, 0), "step_end", int(s)))
        if table.needs_batch_end:
            b = self._next_batch_end(key, table.due("batch_end"))
            if b != math.inf:
                bi = int(b)
                cands.append((((bi - 1) // sh.batches_per_step + 1, _PH_BATCH, bi),
                              "batch_end", bi))
        j = self._next_epoch_end(key, table.due("epoch_end"))
        if j != math.inf:
            ji = int(j)
            cands.append(((sh.start(ji + 1), _PH_EPOCH_END, 0), "epoch_end", ji))
        if table.listeners("epoch_start"):
            starts = sh._starts[:-1]
            e = (bisect.bisect_left(starts, key[0]) if key[1] < _PH_EPOCH_START
                 else bisect.bisect_right(starts, key[0]))
            if e < sh.epochs:
                cands.append(((sh.start(e), _PH_EPOCH_START, 0), "epoch_start", e))
        i = bisect.bisect_right(self._custom_keys, key)
        if i < len(self._custom):
            cands.append((self._custom_keys[i], self._custom[i][2], i))
        end_key = (sh.total_steps, _PH_TRAIN_END, 0)
        if key < end_key:
            cands.append((end_key, "train_end", 0))
        return min(cands) if cands else None

    _started = False

    # -- running ----------------------------------------------------------------------------
    def iter_firings(self, until: Key | None = None) -> Iterator[Firing]:
        """Run, yielding firings, up to and including the point at ``until``."""
        names = self.table.names
        while True:
            nxt = self._next_point()
            if nxt is None or (until is not None and nxt[0] > until):
                return
            key, event, index = nxt
            clock = self.clock
            if event == "train_start":
                self._started = True
            elif event == "step_end":
                clock.to_step_end(index)
            elif event == "batch_end":
                clock.to_batch_end(index)
            elif event == "epoch_end":
                clock.to_epoch_end(index)
            elif event == "epoch_start":
                clock.to_epoch_start(index)
            elif event == "train_end":
                clock.to_train_end()
            else:
                clock.to_custom(key[0], key[2] - 1)
            if self._metrics is not None:
                self._metrics.position = key
            ts = clock.now()
            for i, value in self.table.evaluate(event):
                yield Firing(names[i], event, ts, conditional=value is None)
            if event == "train_end":
                return

    def run(self, until_step: int | None = None) -> FiringLog:
        """Run to the end, or stop right after the end of step ``until_step``."""
        until = None if until_step is None else (until_step, _PH_STEP, 10**9)
        return FiringLog(self.iter_firings(until))

    def state_dict(self) -> dict[str, Any]:
        """Clock position and trigger state: load into a new ``Simulation`` to resume."""
        return {"clock": self.clock.state_dict(), "table": self.table.state_dict(),
                "started": self._started}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume from ``state_dict``."""
        self.clock.load_state_dict(state["clock"])
        self._started = bool(state["started"])
        self.table.load_state_dict(state["table"])
        self.table.attach(self.clock, self._metrics, self.table.predicates)


def simulate(
    schedule: Schedule | TriggerTable,
    *,
    epochs: int | None = None,
    steps_per_epoch: int | None = None,
    epoch_lengths: Sequence[int] | None = None,
    batches_per_step: int = 1,
    samples_per_batch: int = 0,
    tokens_per_batch: int = 0,
    seconds_per_step: float = 0.0,
    metrics: Any = None,
    predicates: Mapping[str, Predicate] | None = None,
    events: Mapping[str, Iterable[int]] | None = None,
    max_steps: int | None = None,
) -> FiringLog:
    """Simulate a run and return every firing, in order.

    Args:
        schedule: a ``Schedule`` (or a compiled ``TriggerTable``).
        epochs, steps_per_epoch: a run of equal epochs; or ``epoch_lengths``.
        batches_per_step: micro-batches per optimizer step.
        samples_per_batch, tokens_per_batch, seconds_per_step: counter rates.
        metrics: metric values over time, ``{"val/loss": [("1 epoch", 0.9), ...]}``;
            without them, firings that depend on metrics are marked conditional.
        predicates: predicates for ``when`` conditions; without them, conditional.
        events: custom events to fire, ``{"swa_start": [step, ...]}`` (after those steps).
        max_steps: end right after this step, as the trainer does (no ``epoch_end``
            for an epoch cut short).
    """
    shape = RunShape.build(
        epochs=epochs, steps_per_epoch=steps_per_epoch, epoch_lengths=epoch_lengths,
        batches_per_step=batches_per_step, samples_per_batch=samples_per_batch,
        tokens_per_batch=tokens_per_batch, seconds_per_step=seconds_per_step,
        max_steps=max_steps)
    return Simulation(schedule, shape, metrics=metrics, predicates=predicates,
                      events=events).run()


def next_firing(
    schedule: Schedule | TriggerTable, *, after_step: int = 0, **shape: Any
) -> Firing | None:
    """The first firing after the end of step ``after_step`` (``shape`` as for ``simulate``)."""
    metrics = shape.pop("metrics", None)
    predicates = shape.pop("predicates", None)
    events = shape.pop("events", None)
    sim = Simulation(schedule, RunShape.build(**shape), metrics=metrics,
                     predicates=predicates, events=events)
    for firing in sim.iter_firings():
        if sim.clock.key > (after_step, _PH_STEP, 10**9):
            return firing
    return None
