"""Simulated training: ``SimClock`` and ``simulate()``, jumping from one firing to the next.

A simulated run has a fixed shape: epochs of known lengths (in optimizer steps),
``batches_per_step`` micro-batches per step, and constant samples and tokens per
batch and seconds per step. Counters are then functions of the position, so the
simulation asks the trigger table for its due vectors and jumps straight to the
next point where anything can fire: 10^9 steps with few firings take milliseconds.
"""

from __future__ import annotations

import bisect
import json
import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple, overload

import attrs

from schedtrain.clock import Clock, step_back
from schedtrain.errors import ScheduleError
from schedtrain.schedule import Schedule
from schedtrain.table import TriggerTable
from schedtrain.time import COUNTERS, Time, Timestamp, Unit, as_time
from schedtrain.triggers.base import Due, MetricValue, Predicate

__all__ = ["Firing", "FiringLog", "RunShape", "SimClock", "Simulation", "next_firing", "simulate"]

#: Position of a point in a run: (completed steps, phase, sub-position).
Key = tuple[int, int, int]
_TRAIN_START: Key = (0, -1, 0)
_PH_BATCH, _PH_STEP, _PH_EPOCH_END, _PH_EPOCH_START, _PH_TRAIN_END = 0, 1, 2, 3, 4


def _ceil_div(d: float, rate: float) -> float:
    """Smallest whole n >= 0 with n * rate >= d (inf when unreachable)."""
    if d <= 0:
        return 0
    if rate <= 0 or math.isinf(d):
        return math.inf
    n = math.ceil(d / rate)
    while n > 0 and (n - 1) * rate >= d:  # float division can overshoot
        n -= 1
    while n * rate < d:
        n += 1
    return n


def _to_tuple(values: Iterable[int]) -> tuple[int, ...]:
    return tuple(values)


@attrs.frozen
class RunShape:
    """The shape of a simulated run.

    Args:
        epoch_lengths: optimizer steps in each epoch.
        batches_per_step: micro-batches per optimizer step (gradient accumulation).
        samples_per_batch, tokens_per_batch: what each micro-batch adds to the counters.
        seconds_per_step: training wall time per optimizer step.
    """

    epoch_lengths: tuple[int, ...] = attrs.field(converter=_to_tuple)
    batches_per_step: int = 1
    samples_per_batch: int = 0
    tokens_per_batch: int = 0
    seconds_per_step: float = 0.0
    _starts: tuple[int, ...] = attrs.field(init=False, eq=False, repr=False)

    def __attrs_post_init__(self) -> None:
        for i, n in enumerate(self.epoch_lengths):
            if isinstance(n, bool) or not isinstance(n, int) or n < 1:
                raise ValueError(f"epoch_lengths[{i}] must be a whole number >= 1, got {n!r}")
        if self.batches_per_step < 1:
            raise ValueError(f"batches_per_step must be >= 1, got {self.batches_per_step!r}")
        if self.samples_per_batch < 0 or self.tokens_per_batch < 0 or self.seconds_per_step < 0:
            raise ValueError("samples_per_batch, tokens_per_batch and seconds_per_step "
                             "must be >= 0")
        starts = [0]
        for n in self.epoch_lengths:
            starts.append(starts[-1] + n)
        object.__setattr__(self, "_starts", tuple(starts))

    @classmethod
    def build(
        cls,
        *,
        epochs: int | None = None,
        steps_per_epoch: int | None = None,
        epoch_lengths: Sequence[int] | None = None,
        batches_per_step: int = 1,
        samples_per_batch: int = 0,
        tokens_per_batch: int = 0,
        seconds_per_step: float = 0.0,
    ) -> RunShape:
        """From ``epochs`` and ``steps_per_epoch``, or from ``epoch_lengths``."""
        if epoch_lengths is not None:
            if steps_per_epoch is not None:
                raise TypeError("give steps_per_epoch or epoch_lengths, not both")
            lengths = list(epoch_lengths)
            if epochs is not None and epochs != len(lengths):
                raise ValueError(
                    f"epochs={epochs} but epoch_lengths has {len(lengths)} entries")
        else:
            if epochs is None or steps_per_epoch is None:
                raise TypeError("give epochs and steps_per_epoch, or epoch_lengths")
            if epochs < 0:
                raise ValueError(f"epochs must be >= 0, got {epochs}")
            lengths = [steps_per_epoch] * epochs
        return cls(tuple(lengths), batches_per_step, samples_per_batch, tokens_per_batch,
                   seconds_per_step)

    @property
    def epochs(self) -> int:
        """Number of epochs."""
        return len(self.epoch_lengths)

    @property
    def total_steps(self) -> int:
        """Optimizer steps in the whole run."""
        return self._starts[-1]

    def start(self, epoch: int) -> int:
        """Steps completed before ``epoch`` (0-based index) begins."""
        return self._starts[epoch]

    def epoch_of_step(self, step: int) -> int:
        """Index of the epoch that contains global step ``step`` (1-based)."""
        return bisect.bisect_left(self._starts, step) - 1

    def at_steps(self, steps: int, epoch: int, in_epoch: int) -> Timestamp:
        """Counters with ``steps`` steps completed."""
        b = steps * self.batches_per_step
        return Timestamp(steps, b, epoch, in_epoch, b * self.samples_per_batch,
                         b * self.tokens_per_batch, steps * self.seconds_per_step)

    def min_steps(self, counter: str, due: float) -> float:
        """Fewest completed steps at which a step-driven ``counter`` reaches ``due``."""
        b = self.batches_per_step
        rate = {"step": 1, "batch": b, "sample": b * self.samples_per_batch,
                "token": b * self.tokens_per_batch, "seconds": self.seconds_per_step}[counter]
        return _ceil_div(due, rate)


class SimClock(Clock):
    """A clock for a run of known shape; positioned by the simulation, never backwards."""

    def __init__(self, shape: RunShape) -> None:
        self.shape = shape
        self._key: Key = _TRAIN_START
        self._set(Timestamp())
        self._prev_step_end = Timestamp()

    def _set(self, ts: Timestamp) -> None:
        self.step, self.batch, self.epoch = ts.step, ts.batch, ts.epoch
        self.step_in_epoch, self.sample, self.token = ts.step_in_epoch, ts.sample, ts.token
        self.seconds = ts.seconds

    def _move(self, key: Key, ts: Timestamp) -> None:
        if key < self._key:
            raise ValueError(
                f"time can't go backwards: the clock is at {self._key}, asked for {key}")
        self._key = key
        self._set(ts)

    @property
    def key(self) -> Key:
        """Where the clock is in the run's sequence of evaluation points."""
        return self._key

    # -- positioning ----------------------------------------------------------------
    def to_step_end(self, step: int) -> None:
        """Move to the end of global step ``step``."""
        sh = self.shape
        if not 1 <= step <= sh.total_steps:
            raise ValueError(f"step {step} is outside the run (1..{sh.total_steps})")
        e = sh.epoch_of_step(step)
        self._prev_step_end = self._step_end_ts(step - 1)
        self._move((step, _PH_STEP, 0), sh.at_steps(step, e, step - sh.start(e)))

    def _step_end_ts(self, step: int) -> Timestamp:
        if step == 0:
            return Timestamp()
        e = self.shape.epoch_of_step(step)
        return self.shape.at_steps(step, e, step - self.shape.start(e))

    def to_batch_end(self, batch: int) -> None:
        """Move to the end of global micro-batch ``batch``."""
        sh = self.shape
        done = (batch - 1) // sh.batches_per_step
        e = sh.epoch_of_step(done + 1)
        ts = attrs.evolve(sh.at_steps(done, e, done - sh.start(e)), batch=batch,
                          sample=batch * sh.samples_per_batch,
                          token=batch * sh.tokens_per_batch)
        self._move((done + 1, _PH_BATCH, batch), ts)

    def to_epoch_start(self, epoch: int) -> None:
        """Move to the start of epoch ``epoch`` (0-based)."""
        s = self.shape.start(epoch)
        self._move((s, _PH_EPOCH_START, 0), self.shape.at_steps(s, epoch, 0))

    def to_epoch_end(self, epoch: int) -> None:
        """Move to the end of epoch ``epoch`` (0-based): the epoch counter becomes ``epoch + 1``."""
        s = self.shape.start(epoch + 1)
        self._move((s, _PH_EPOCH_END, 0),
                   self.shape.at_steps(s, epoch + 1, self.shape.epoch_lengths[epoch]))

    def to_custom(self, step: int, index: int) -> None:
        """Move to a custom event fired after step ``step``'s end."""
        self._move((step, _PH_STEP, 1 + index), self._step_end_ts(step))

    def to_train_end(self) -> None:
        """Move to the end of training."""
        sh = self.shape
        ts = sh.at_steps(sh.total_steps, sh.epochs,
                         sh.epoch_lengths[-1] if sh.epochs else 0)
        self._move((sh.total_steps, _PH_TRAIN_END, 0), ts)

    def advance(self, steps: int) -> None:
        """Move ``steps`` optimizer steps forward, to a step end."""
        if steps < 0:
            raise ValueError(f"time can't go backwards: advance(steps={steps})")
        self.to_step_end(self.step + steps)

    def advance_epochs(self, epochs: int) -> None:
        """Move to the end of the ``epochs``-th epoch from here (1: the current epoch's end)."""
        if epochs < 1:
            raise ValueError(f"time can't go backwards: advance_epochs({epochs})")
        # Inside an epoch ``epoch`` is its index; at an epoch end it is the next one's.
        target = self.epoch + epochs - 1
        if target >= self.shape.epochs:
            raise ValueError(f"epoch {target + 1} is past the run's {self.shape.epochs} epochs")
        self.to_epoch_end(target)

    # -- the Clock interface ----------------------------------------------------------
    def now(self) -> Timestamp:
        return Timestamp(self.step, self.batch, self.epoch, self.step_in_epoch,
                         self.sample, self.token, self.seconds)

    def previous(self, event: str) -> Timestamp:
        if event == "step_end":
            return self._prev_step_end
        return step_back(self.now(), event)

    def state_dict(self) -> dict[str, Any]:
        return {"key": list(self._key), **super().state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._key = (int(state["key"][0]), int(state["key"][1]), int(state["key"][2]))
        self._set(Timestamp(**state["now"]))
        self._prev_step_end = Timestamp(**state["previous_step_end"])


# -- the log ---------------------------------------------------------------------------


@attrs.frozen
class Firing:
    """One callback firing: at which event, with the clock's counters then.

    ``conditional`` marks a firing that depends on a runtime condition or metric
    that the simulation could not decide.
    """

    callback: str
    event: str
    timestamp: Timestamp
    conditional: bool = False

    @property
    def step(self) -> int:
        """Steps completed at the firing."""
        return self.timestamp.step

    @property
    def epoch(self) -> int:
        """Epochs completed at the firing."""
        return self.timestamp.epoch

    def to_dict(self) -> dict[str, Any]:
        """The plan's JSON record (DESIGN §6)."""
        out: dict[str, Any] = {"callback": self.callback, "event": self.event}
        out.update(attrs.asdict(self.timestamp))
        if self.conditional:
            out["conditional"] = True
        return out


class FiringLog(Sequence[Firing]):
    """Firings in order, with helpers to query them."""

    def __init__(self, firings: Iterable[Firing] = ()) -> None:
        self._firings = tuple(firings)

    @overload
    def __getitem__(self, index: int) -> Firing: ...
    @overload
    def __getitem__(self, index: slice) -> FiringLog: ...
    def __getitem__(self, index: int | slice) -> Firing | FiringLog:
        if isinstance(index, slice):
            return FiringLog(self._firings[index])
        return self._firings[index]

    def __len__(self) -> int:
        return len(self._firings)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, FiringLog):
            return self._firings == other._firings
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self._firings)

    def __add__(self, other: FiringLog) -> FiringLog:
        return FiringLog(self._firings + tuple(other))

    def __repr__(self) -> str:
        return f"FiringLog({len(self)} firings)"

    def of(self, callback: str) -> FiringLog:
        """Firings of one callback."""
        return FiringLog(f for f in self._firings if f.callback == callback)

    def steps(self, callback: str) -> list[int]:
        """Steps completed at each firing of ``callback``."""
        return [f.step for f in self.of(callback)]

    def epochs(self, callback: str) -> list[int]:
        """Epochs completed at each firing of ``callback``."""
        return [f.epoch for f in self.of(callback)]

    def events(self, callback: str) -> list[str]:
        """The event of each firing of ``callback``."""
        return [f.event for f in self.of(callback)]

    def count(self, callback: str) -> int:  # type: ignore[override,unused-ignore]
        """How many times ``callback`` fired."""
        return sum(1 for f in self._firings if f.callback == callback)

    def callbacks(self) -> list[str]:
        """Names that fired at least once, in order of first firing."""
        return list(dict.fromkeys(f.callback for f in self._firings))

    def to_json(self) -> str:
        """``{"firings": [...]}`` as ``schedtrain plan --format json`` prints it."""
        return json.dumps({"firings": [f.to_dict() for f in self._firings]})


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
        return best if best < sh.epochs else math.inf

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
    """
    shape = RunShape.build(
        epochs=epochs, steps_per_epoch=steps_per_epoch, epoch_lengths=epoch_lengths,
        batches_per_step=batches_per_step, samples_per_batch=samples_per_batch,
        tokens_per_batch=tokens_per_batch, seconds_per_step=seconds_per_step)
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
