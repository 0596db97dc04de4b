"""The schedule in Ignite: any trigger as an event filter, or a whole schedule on an ``Engine``.

Ignite counts *iterations* (``state.iteration``: process-function calls) and epochs.
schedtrain's clock maps them so (docs/integrations.md)::

    batch  = state.iteration                 (each ITERATION_COMPLETED is one micro-batch)
    step   = state.iteration // batches_per_step
             (create_supervised_trainer(gradient_accumulation_steps=N) steps the
             optimizer when state.iteration % N == 0: pass batches_per_step=N)
    epoch  = epochs completed (EPOCH_COMPLETED), sample/token = what samples(batch) and
             tokens(batch) report for each iteration's state.batch

Events map as STARTED -> train_start, EPOCH_STARTED -> epoch_start, ITERATION_COMPLETED ->
batch_end (and step_end on the iterations that end a step), EPOCH_COMPLETED -> epoch_end,
COMPLETED -> train_end. An epoch cut by ``terminate()`` or ``max_iters`` has no
EPOCH_COMPLETED, so no epoch_end, as in schedtrain's own loop.

A resumed engine (``engine.load_state_dict`` with ``Checkpoint``) fires STARTED and
EPOCH_STARTED again: the schedule's saved state (``state_dict``) knows it already began,
so train_start and the epoch's epoch_start do not fire twice.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from time import perf_counter_ns
from typing import TYPE_CHECKING, Any

try:
    from ignite.engine import Engine, Events, EventsList
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("schedtrain.integrations.ignite needs Ignite: "
                      "pip install 'schedtrain[ignite]'") from exc

import torch

from schedtrain.callbacks.base import Callback
from schedtrain.integrations.driver import ScheduleDriver, refuse_unknown_actions
from schedtrain.integrations.hosted import (
    CallbackDriver,
    check_bound,
    driver_for,
    refuse_uncounted,
    spec_bindings,
    split_actions,
)
from schedtrain.integrations.ranks import reads_time
from schedtrain.schedule.schedule import Schedule
from schedtrain.triggers.base import Trigger
from schedtrain.triggers.protocol import Predicate

if TYPE_CHECKING:
    from schedtrain.spec import Spec

__all__ = ["ScheduleHandle", "attach_schedule", "attach_spec", "trigger_event"]

Counter = Callable[[Any], int]
"""Reads a count (samples, tokens) from one iteration's ``engine.state.batch``."""
MetricSource = Callable[[Engine], Mapping[str, Any]]
"""Reads metric values from the engine at each optimizer step's end."""

_EVENTS = (Events.STARTED, Events.EPOCH_STARTED, Events.ITERATION_COMPLETED,
           Events.EPOCH_COMPLETED, Events.COMPLETED)


def _whole(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"`{name}` must be a whole number >= 1, got {value!r}")
    return value


class ScheduleHandle:
    """A schedule following an ``Engine``'s events; keep it to save and load its state
    (``Checkpoint(to_save={"schedule": handle, ...})``) and to ``put`` metrics.

    Args:
        driver: the schedule's driver (its clock, table and latest metrics).
        batches_per_step: iterations per optimizer step.
        samples, tokens: read each iteration's counts from ``engine.state.batch``.
        metrics: read metric values from the engine at each step's end.
        actions: name -> ``handler(engine)``, run when that callback fires.
        loss: reads the step's loss from the engine (for a callback that watches it).
    """

    def __init__(self, driver: ScheduleDriver, *, batches_per_step: int = 1,
                 samples: Counter | None = None, tokens: Counter | None = None,
                 metrics: MetricSource | None = None,
                 actions: Mapping[str, Callable[[Engine], Any]] | None = None,
                 loss: Callable[[Engine], Any] | None = None) -> None:
        self.driver = driver
        self._hosted = driver if isinstance(driver, CallbackDriver) else None
        self._loss = loss if self._hosted is not None and self._hosted.wants_loss else None
        self.batches_per_step = _whole("batches_per_step", batches_per_step)
        self._samples, self._tokens, self._metrics = samples, tokens, metrics
        self._actions = dict(actions or {})
        self._last: tuple[str, int, int] | None = None
        self._iteration = -1  # the ITERATION_COMPLETED answered last (-1: another event)
        self._fired: tuple[str, ...] = ()
        # trigger_event's quiet path: iterations below `quiet_until` are not counted as they
        # end but caught up later (exact only for plain steps of a time-free schedule).
        self._may_lag = (batches_per_step == 1 and samples is None and tokens is None
                         and self._hosted is None and not driver.table.needs_batch_end
                         and not reads_time(driver.table))
        self._lags = False
        self._engine: Engine | None = None
        #: Iterations below it end quietly when a filter skips them (0: none may).
        self.quiet_until: float = 0

    # -- following the engine ----------------------------------------------------------------
    def on(self, event: str, engine: Engine) -> tuple[str, ...]:
        """The callbacks that fire at Ignite's ``event`` (a name of ``Events``) now.

        Called again at the same point (two handlers on one filtered event), it returns
        the first answer without moving the clock twice.
        """
        if event == "ITERATION_COMPLETED":
            return self.iteration_completed(engine)
        st = engine.state
        key = (event, st.iteration, st.epoch)
        if key == self._last:
            return self._fired
        self._last, self._iteration = key, -1
        if self._lags:
            self.catch_up(st.iteration)
        self._engine = engine
        self._fired = fired = self._advance(event, engine)
        if event == "STARTED":
            self._lags = self._may_lag and self.driver.ranks is None
        self.quiet_until = self.driver.table.step_due if self._lags else 0
        self._after(event, engine, fired)
        return fired

    def catch_up(self, iteration: int) -> None:
        """Count the quiet iterations up to ``iteration`` that the filter skipped (no
        further than the last one below ``quiet_until``: nothing from there can fire)."""
        quiet = self.quiet_until
        self.driver.skip_to(iteration if iteration < quiet else int(quiet) - 1)

    def iteration_completed(self, engine: Engine) -> tuple[str, ...]:
        """``on("ITERATION_COMPLETED", engine)``: the per-iteration path, kept short (an
        iteration is answered once, whatever the number of handlers that ask)."""
        st = engine.state
        iteration = st.iteration
        if iteration == self._iteration:
            return self._fired
        self._last, self._iteration = None, iteration
        d = self.driver
        if iteration != d.clock.batch + 1:
            self._fired = ()
            raise RuntimeError(
                f"the engine is at iteration {iteration} but the schedule counted "
                f"{d.clock.batch}: attach the schedule before the engine runs, before any "
                "Checkpoint handler (handlers run in the order attached), and load its "
                "state from the same checkpoint as the engine's")
        samples, tokens = self._samples, self._tokens
        fired = d.batch_end(samples(st.batch) if samples is not None else 0,
                            tokens(st.batch) if tokens is not None else 0)
        if not iteration % self.batches_per_step:  # the iteration ends an optimizer step
            if self._metrics is not None:
                for name, value in self._metrics(engine).items():
                    d.put(name, value)
            if self._loss is not None:
                self._hosted.report_loss(self._loss(engine))  # type: ignore[union-attr]
            fired += d.step_end()
        self._fired = fired
        if fired or self._hosted is not None:
            self._after("ITERATION_COMPLETED", engine, fired)
        return fired

    def _after(self, event: str, engine: Engine, fired: tuple[str, ...]) -> None:
        """Stop the engine when a schedtrain callback asked, then run what fired."""
        hosted = self._hosted
        if hosted is not None and hosted.stop_reason is not None and event != "COMPLETED":
            engine.terminate()
        for name in fired:
            action = self._actions.get(name)
            if action is not None:
                action(engine)

    def _advance(self, event: str, engine: Engine) -> tuple[str, ...]:
        d, st = self.driver, engine.state
        if event == "STARTED":
            if st.iteration < d.clock.batch:
                raise RuntimeError(
                    f"the engine starts at iteration {st.iteration} but the schedule is at "
                    f"batch {d.clock.batch}: a new run needs a new schedule (or load the "
                    "schedule's state with the engine's)")
            if self._hosted is not None and st.epoch_length:
                self._hosted.context.bind(steps_in_epoch=st.epoch_length // self.batches_per_step)
            return d.train_start()
        if event == "EPOCH_STARTED":
            # Resumed from a checkpoint taken after an epoch's last iteration but before its
            # EPOCH_COMPLETED: Ignite starts the next epoch; end the saved one first.
            late = d.epoch_end() if d.in_epoch and st.epoch - 1 > d.clock.epoch else ()
            return late + d.epoch_start()
        if event == "EPOCH_COMPLETED":
            return d.epoch_end()
        return d.train_end()

    # -- metrics and state ---------------------------------------------------------------------
    def put(self, name: str, value: Any) -> None:
        """Record a metric value (an evaluator's result, say) for conditions and metric
        triggers."""
        self.driver.put(name, value)

    def state_dict(self) -> dict[str, Any]:
        """The schedule's state (clock, triggers, latest metrics) for Ignite's ``Checkpoint``."""
        if self._lags and self._engine is not None:  # the quiet iterations count too
            self.catch_up(self._engine.state.iteration)
        return self.driver.state_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore ``state_dict`` (``Checkpoint.load_objects``)."""
        self.driver.load_state_dict(state)
        self._last, self._iteration = None, -1
        self._lags, self.quiet_until = False, 0  # until the resumed engine starts


def attach_schedule(
    engine: Engine,
    schedule: Schedule,
    actions: Mapping[str, Callable[[Engine], Any] | Callback] | None = None,
    *,
    batches_per_step: int = 1,
    samples: Counter | None = None,
    tokens: Counter | None = None,
    metrics: MetricSource | None = None,
    predicates: Mapping[str, Predicate] | None = None,
    record: bool = False,
    model: torch.nn.Module | None = None,
    optimizer: torch.optim.Optimizer | None = None,
    loss: Callable[[Engine], Any] | None = None,
    reduce: Mapping[str, str] | None = None,
    time_source: Callable[[], int] = perf_counter_ns,
) -> ScheduleHandle:
    """Follow ``engine`` with ``schedule``, running ``actions[name](engine)`` at each firing.

    Attach it before a ``Checkpoint`` handler, so a checkpoint holds the schedule's state
    after the iteration it was taken at.

    Args:
        engine: the trainer engine.
        schedule: the schedule (Python or ``load_spec(...).schedule()``).
        actions: callback name -> handler taking the engine.
        batches_per_step: iterations per optimizer step (gradient accumulation).
        samples, tokens: count each iteration's batch (``lambda b: len(b[0])``).
        metrics: metric values read at each step's end (``lambda e: {"loss": e.state.output}``).
        predicates: predicates registered by name for ``when(name)`` conditions.
        record: keep every firing in ``handle.driver.firings``.
        model, optimizer: what schedtrain callbacks see as ``self.model``, ``self.optimizer``
            (an ``Engine`` holds neither).
        loss: reads each step's loss from the engine (``lambda e: e.state.output``), for a
            callback that watches it (``TerminateOnNaN``).

    An action may be a schedtrain ``Callback``: it runs with its hooks, and its stop
    (``request_stop``, ``StopTraining``) ends the run through ``engine.terminate()``.
        reduce: on several processes (``idist``), metric name -> "mean" (default), "sum",
            "max", "min", or "host" for a value Ignite already agreed (its ``Metric``
            objects reduce across ranks when they compute).
        time_source: monotonic nanoseconds for time triggers (tests pass a fake one).
    """
    if not isinstance(engine, Engine):
        raise TypeError(f"expected an ignite Engine, got {engine!r}")
    refuse_unknown_actions(schedule.names, actions or {})
    own, callbacks = split_actions(actions)
    check_bound(schedule, [*own, *callbacks], record=record)
    _refuse_uncounted(schedule, samples, tokens)
    driver = driver_for(schedule, {}, callbacks, host="Ignite",
                        gives=("loss",) if loss is not None else (), predicates=predicates,
                        record=record, reduce=reduce,
                        time_source=time_source)
    if isinstance(driver, CallbackDriver):
        driver.context.bind(model=model, optimizer=optimizer)
    handle = ScheduleHandle(driver, batches_per_step=batches_per_step, samples=samples,
                            tokens=tokens, metrics=metrics, actions=own, loss=loss)
    for event in _EVENTS:
        engine.add_event_handler(event, _follow(handle, event.name))
    return handle


def attach_spec(engine: Engine, spec: Spec | str | Path,
                actions: Mapping[str, Callable[[Engine], Any] | Callback] | None = None,
                **kwargs: Any) -> ScheduleHandle:
    """``attach_schedule`` for a spec (or its path): its typed callbacks (``type =
    "EarlyStopping"``) built as ``schedtrain train`` builds them, ``actions`` binding the
    others; ``kwargs`` as ``attach_schedule``'s."""
    schedule, bound = spec_bindings(spec, actions)
    return attach_schedule(engine, schedule, bound, **kwargs)


def _refuse_uncounted(schedule: Schedule, samples: Counter | None,
                      tokens: Counter | None) -> None:
    for counter, given in (("sample", samples), ("token", tokens)):
        if given is None:
            refuse_uncounted(schedule, counter, f"nothing counts: pass {counter}s=, a "
                             f"function of engine.state.batch returning its {counter}s")


def _follow(handle: ScheduleHandle, event: str) -> Callable[[Engine], object]:
    if event == "ITERATION_COMPLETED":  # every iteration: no wrapper in between
        return handle.iteration_completed

    def follow(engine: Engine) -> None:
        handle.on(event, engine)

    return follow


def trigger_event(
    trigger: Trigger,
    *,
    batches_per_step: int = 1,
    samples: Counter | None = None,
    tokens: Counter | None = None,
) -> EventsList:
    """Ignite events that fire when ``trigger`` does: ``engine.on(trigger_event(t))(handler)``.

    The handler is registered on STARTED, EPOCH_STARTED, ITERATION_COMPLETED,
    EPOCH_COMPLETED and COMPLETED, each filtered by one shared schedule that follows the
    engine, so it runs exactly where ``trigger`` fires (once per event; several handlers
    may share the returned events). Use a new one per engine.

    A trigger on steps and epochs alone (one iteration a step, no samples or tokens, no
    wall time) costs one comparison on each iteration before its next due step: those
    iterations are counted when that step or another event comes.
    """
    schedule = Schedule({"trigger": trigger})
    _refuse_uncounted(schedule, samples, tokens)
    driver = ScheduleDriver(schedule)
    return _events(ScheduleHandle(driver, batches_per_step=batches_per_step, samples=samples,
                                  tokens=tokens))


def _events(handle: ScheduleHandle) -> EventsList:
    """The five events, each filtered by ``handle``."""
    out = EventsList()
    for event in _EVENTS:
        out = out | event(event_filter=_filter(handle, event.name))
    return out


def _filter(handle: ScheduleHandle, event: str) -> Callable[[Engine, int], bool]:
    if event == "ITERATION_COMPLETED":  # every iteration: straight to its short path
        iteration_completed, table = handle.iteration_completed, handle.driver.table

        def iteration_filter(engine: Engine, iteration: int) -> bool:
            # Ignite passes state.iteration: below the next due step, one comparison.
            if iteration < handle.quiet_until:
                return False
            if handle._lags:
                if iteration == handle._iteration:  # another handler on the event asks
                    return bool(handle._fired)
                due = table.step_due
                if iteration < due:  # the iteration after a firing: quiet again
                    handle.quiet_until = due
                    return False
                handle.catch_up(iteration - 1)
                fired = iteration_completed(engine)
                # After a firing the other handlers ask again at this iteration: they pass.
                handle.quiet_until = iteration if fired else table.step_due
                return bool(fired)
            return bool(iteration_completed(engine))

        return iteration_filter

    def event_filter(engine: Engine, event_value: int) -> bool:
        return bool(handle.on(event, engine))

    return event_filter

