"""Simulated training: ``SimClock`` and ``simulate()``, jumping from one firing to the next.

A simulated run has a fixed shape: epochs of known lengths (in optimizer steps),
``batches_per_step`` micro-batches per step (an epoch's last step may take fewer),
samples and tokens per batch (constant, or one epoch's list) and seconds per step.
Counters are then functions of the position, so the simulation asks the trigger
table for its due vectors and jumps straight to the next point where anything can
fire: 10^9 steps with few firings take milliseconds.
"""

from __future__ import annotations

import bisect
import inspect
import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from types import MappingProxyType
from typing import Any, Final

from schedtrain.errors import ScheduleError
from schedtrain.schedule.collector import collector_paused
from schedtrain.schedule.firings import Firing, FiringLog
from schedtrain.schedule.schedule import Schedule
from schedtrain.schedule.table import TriggerTable
from schedtrain.simulation.metric_stream import StreamMetrics, records
from schedtrain.simulation.retimed import SimulatedRun
from schedtrain.simulation.simclock import (
    PH_BATCH,
    PH_EPOCH_END,
    PH_EPOCH_START,
    PH_STEP,
    PH_TRAIN_END,
    TRAIN_START,
    Key,
    RunShape,
    SimClock,
    batch_key,
)
from schedtrain.time import COUNTERS, Time, as_time
from schedtrain.triggers.protocol import Due, Predicate

__all__ = ["SHAPE_DEFAULTS", "Firing", "FiringLog", "RunShape", "SimClock", "Simulation",
           "next_firing", "observe_tables", "simulate"]

TableObserver = Callable[[TriggerTable], None]
#: Shown each simulation's table before it runs; ``None`` (the default) costs nothing.
_observer: TableObserver | None = None


def observe_tables(observer: TableObserver | None) -> TableObserver | None:
    """Show every ``Simulation``'s table to ``observer`` before it is attached (schedule
    coverage instruments it); ``None`` stops. Returns the observer it replaces."""
    global _observer  # one switch for the whole process, off by default
    previous, _observer = _observer, observer
    return previous

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
        sanity_eval: bool = False,
        deadline: Time | str | None = None,
    ) -> None:
        self.table = schedule if isinstance(schedule, TriggerTable) else schedule.compile(
            predicates=predicates)
        if deadline is not None:  # a duration from the start: where it falls on time_ns
            left = as_time(deadline, "deadline")
            if not left.unit.is_time:
                raise ValueError(f"deadline must be a duration such as '23 h', got {left}")
            self.table.deadline_ns = left.base
        self.shape = shape
        self.table.final_epoch = shape.epochs
        self.table.final_step = None if shape.cut_short else shape.total_steps
        #: ``sanity_eval`` fires once, first (the run's ``sanity_eval_batches`` > 0)
        self.sanity_eval = sanity_eval
        self.clock = SimClock(shape)
        self._metrics = None if metrics is None else StreamMetrics(records(metrics), shape)
        declared = set(self.table.events)
        custom: list[tuple[int, int, str]] = []
        for order, (name, steps) in enumerate((events or {}).items()):
            if name not in declared:
                raise ScheduleError(
                    f"custom event {name!r} is not declared on the schedule "
                    f"(declared: {sorted(declared) or 'none'})")
            custom.extend((int(s), order, name) for s in steps)
        self._custom = sorted(custom)
        self._custom_keys = [(s, PH_STEP, 1 + o) for s, o, _ in self._custom]
        if _observer is not None:
            _observer(self.table)
        self.table.attach(self.clock, self._metrics,
                          predicates if predicates is not None else self.table.predicates)

    # -- candidates ---------------------------------------------------------------------
    def _next_step_end(self, key: Key, due: Due) -> float:
        sh = self.shape
        first = key[0] if key[1] < PH_STEP else key[0] + 1
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
        # at a batch's start (2b - 1) or end (2b), the next end is of b or b + 1
        first = key[2] // 2 + 1 if key[1] == PH_BATCH else sh.batches_at(key[0]) + 1
        best = math.inf
        b: float
        for k, d in enumerate(due):
            if d == math.inf:
                continue
            c = COUNTERS[k]
            if c in ("batch", "sample", "token"):
                b = sh.min_batches(c, d)
            elif c == "epoch":
                e = math.ceil(d)
                b = sh.batches_at(sh.start(e)) + 1 if e < sh.epochs else math.inf
            else:  # a step counter reached at a step's end: true from the next batch on
                s = sh.min_steps(c, d)
                b = math.inf if math.isinf(s) else sh.batches_at(int(s)) + 1
            best = min(best, max(b, first))
        return best if best <= sh.batches_at(sh.total_steps) else math.inf

    def _next_epoch_end(self, key: Key, due: Due) -> float:
        sh = self.shape
        # epoch_end j sits at (start(j + 1), PH_EPOCH_END, 0): the first one after `key`
        if key[1] < PH_EPOCH_END:
            first = max(sh.first_epoch_starting(key[0], after=False), 1) - 1
        else:
            first = sh.first_epoch_starting(key[0], after=True) - 1
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
        if self.sanity_eval and not self._sanity_done:
            return TRAIN_START, "sanity_eval", 0  # before anything else
        cands: list[tuple[Key, str, int]] = []
        if key < TRAIN_START or (key == TRAIN_START and not self._started):
            cands.append((TRAIN_START, "train_start", 0))
        s = self._next_step_end(key, table.due("step_end"))
        if s != math.inf:
            cands.append(((int(s), PH_STEP, 0), "step_end", int(s)))
        if table.needs_batch_end:
            b = self._next_batch_end(key, table.due("batch_end"))
            if b != math.inf:
                bi = int(b)
                cands.append((batch_key(bi, sh), "batch_end", bi))
        if table.needs_batch_start:
            # the batch after the one whose start or end the clock is at (2b - 1, 2b)
            bi = ((key[2] + 1) // 2 + 1 if key[1] == PH_BATCH
                  else sh.batches_at(key[0]) + 1)
            if bi <= sh.batches_at(sh.total_steps):
                cands.append((batch_key(bi, sh, start=True), "batch_start", bi))
        j = self._next_epoch_end(key, table.due("epoch_end"))
        if j != math.inf:
            ji = int(j)
            cands.append(((sh.start(ji + 1), PH_EPOCH_END, 0), "epoch_end", ji))
        if table.listeners("epoch_start"):
            e = sh.first_epoch_starting(key[0], after=key[1] >= PH_EPOCH_START)
            if e < sh.epochs:
                cands.append(((sh.start(e), PH_EPOCH_START, 0), "epoch_start", e))
        i = bisect.bisect_right(self._custom_keys, key)
        if i < len(self._custom):
            cands.append((self._custom_keys[i], self._custom[i][2], i))
        end_key = (key[0] if self._stopping else sh.total_steps, PH_TRAIN_END, 0)
        if self._stopping:  # the run ends where it stopped
            return (end_key, "train_end", 0) if key < end_key else None
        if key < end_key:
            cands.append((end_key, "train_end", 0))
        return min(cands) if cands else None

    _started = False
    _stopping = False
    _sanity_done = False

    def stop(self) -> None:
        """End the run after the current evaluation point, as a callback's stop does:
        the other callbacks firing at this point still run, then ``train_end`` fires
        here and nothing more."""
        self._stopping = True

    @property
    def metrics(self) -> StreamMetrics | None:
        """The metric values visible at the current point (``None``: no stream given)."""
        return self._metrics

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
            if event == "sanity_eval":
                self._sanity_done = True
            elif event == "train_start":
                self._started = True
            elif event == "step_end":
                clock.to_step_end(index)
            elif event == "batch_end":
                clock.to_batch_end(index)
            elif event == "batch_start":
                clock.to_batch_start(index)
            elif event == "epoch_end":
                clock.to_epoch_end(index)
            elif event == "epoch_start":
                clock.to_epoch_start(index)
            elif event == "train_end":
                if self._stopping:
                    clock.to_stop()
                else:
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
        until = None if until_step is None else (until_step, PH_STEP, 10**9)
        return FiringLog(self.iter_firings(until))

    def state_dict(self) -> dict[str, Any]:
        """Clock position and trigger state: load into a new ``Simulation`` to resume."""
        return {"clock": self.clock.state_dict(), "table": self.table.state_dict(),
                "started": self._started, "stopping": self._stopping,
                "sanity_done": self._sanity_done}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume from ``state_dict``."""
        self.clock.load_state_dict(state["clock"])
        self._started = bool(state["started"])
        self._stopping = bool(state.get("stopping", False))
        self._sanity_done = bool(state.get("sanity_done", self._started))
        self.table.load_state_dict(state["table"])
        self.table.attach(self.clock, self._metrics, self.table.predicates)


def simulate(
    schedule: Schedule | TriggerTable,
    *,
    epochs: int | None = None,
    steps_per_epoch: int | None = None,
    epoch_lengths: Sequence[int] | None = None,
    batches_per_step: int = 1,
    samples_per_batch: int | Sequence[int] = 0,
    tokens_per_batch: int | Sequence[int] = 0,
    seconds_per_step: float = 0.0,
    metrics: Any = None,
    predicates: Mapping[str, Predicate] | None = None,
    events: Mapping[str, Iterable[int]] | None = None,
    max_steps: int | None = None,
    shape: RunShape | None = None,
    sanity_eval: bool = False,
    deadline: Time | str | None = None,
    batches_per_epoch: int | None = None,
) -> FiringLog:
    """Simulate a run and return every firing, in order; given a ``Schedule``, the log's
    ``continue_with(new, at=step)`` predicts the run retimed after ``step``.

    Args:
        schedule: a ``Schedule`` (or a compiled ``TriggerTable``).
        epochs, steps_per_epoch: a run of equal epochs; or ``epoch_lengths``.
        batches_per_step: micro-batches per optimizer step.
        samples_per_batch, tokens_per_batch, seconds_per_step: counter rates; the
            first two may list one epoch's batches (``[4, 4, 2]``: an uneven last batch).
        batches_per_epoch: micro-batches per epoch, with ``epochs``: steps per epoch are
            ``batches_per_epoch / batches_per_step`` rounded up, the last one partial
            (10 batches, 3 a step: steps of 3, 3, 3, 1), as Lightning and HF step.
        metrics: metric values over time, ``{"val/loss": [("1 epoch", 0.9), ...]}``;
            without them, firings that depend on metrics are marked conditional.
        predicates: predicates for ``when`` conditions; without them, conditional.
        events: custom events to fire, ``{"swa_start": [step, ...]}`` (after those steps).
        max_steps: end right after this step, as the trainer does (no ``epoch_end``
            for an epoch cut short).
        shape: instead of the keywords above that shape the run, a ``RunShape`` built
            once (``RunShape.build(...)``) and passed as is.
        sanity_eval: the run has ``sanity_eval_batches`` > 0: ``sanity_eval`` fires once,
            before ``train_start``.
        deadline: the run's deadline as a duration from its start ("23 h"): with
            ``seconds_per_step`` it shows where ``before_deadline`` and ``time_left``
            conditions fire.
    """
    shape = shape_of(shape, {k: v for k, v in locals().items() if k in SHAPE_DEFAULTS})

    def make(s: Schedule | TriggerTable) -> Simulation:
        return Simulation(s, shape, metrics=metrics, predicates=predicates, events=events,
                          sanity_eval=sanity_eval, deadline=deadline)

    with collector_paused():  # the table and the firings it builds all stay alive
        firings = make(schedule).run()
    if not isinstance(schedule, Schedule):  # a compiled table: nothing to retime
        return firings
    return SimulatedRun(firings, schedule, make)


def shape_of(shape: RunShape | None, given: Mapping[str, Any]) -> RunShape:
    """``shape``, or one built from the shape keywords ``given`` (not both: a keyword left
    at its default, ``SHAPE_DEFAULTS``, was not given)."""
    if shape is None:
        return RunShape.build(**given)
    passed = sorted(k for k, v in given.items() if v != SHAPE_DEFAULTS[k])
    if passed:
        raise TypeError(f"give shape= or the keywords that shape the run, not both "
                        f"(also given: {', '.join(passed)})")
    return shape


#: The keywords that shape a run and their defaults, as ``RunShape.build`` declares them:
#: ``simulate`` and ``assert_resumes_exactly`` take the same, read from here.
SHAPE_DEFAULTS: Final[Mapping[str, Any]] = MappingProxyType({
    n: p.default for n, p in inspect.signature(RunShape.build).parameters.items()})


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
        if sim.clock.key > (after_step, PH_STEP, 10**9):
            return firing
    return None
