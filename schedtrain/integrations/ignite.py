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

With ``control=HostControl(...)`` the schedule takes live retimes, signals and cloud
notices; a preemption is saved by Ignite's ``Checkpoint`` and exits 75
(``ignite_control``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from time import perf_counter_ns
from typing import TYPE_CHECKING, Any

try:
    from ignite.engine import Engine, EventsList
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("schedtrain.integrations.ignite needs Ignite: "
                      "pip install 'schedtrain[ignite]'") from exc

import torch

from schedtrain.callbacks.base import Callback
from schedtrain.integrations.driver import ScheduleDriver, refuse_unknown_actions
from schedtrain.integrations.host_control import HostControl
from schedtrain.integrations.hosted import (
    CallbackDriver,
    check_bound,
    driver_for,
    refuse_uncounted,
    spec_bindings,
    split_actions,
)
from schedtrain.integrations.ignite_control import SaveHandler, check_to_save
from schedtrain.integrations.ignite_handle import EVENTS, Counter, MetricSource, ScheduleHandle
from schedtrain.schedule.schedule import Schedule
from schedtrain.triggers.base import Trigger
from schedtrain.triggers.protocol import Predicate

if TYPE_CHECKING:
    from schedtrain.spec import Spec

__all__ = ["Counter", "MetricSource", "ScheduleHandle", "attach_schedule", "attach_spec",
           "trigger_event"]


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
    control: HostControl | None = None,
    to_save: Mapping[str, Any] | None = None,
    save_handler: SaveHandler | None = None,
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
        control: run control (``HostControl(run_dir, preempt_notice=...)``): live
            retime, signals, cloud notices, ``before_deadline``'s deadline.
        to_save: what a preemption's checkpoint holds besides the schedule (Ignite's
            ``Checkpoint(to_save, ...)``: ``{"model": model, "optimizer": optimizer,
            "trainer": engine}``); ``handle.to_save`` adds the schedule.
        save_handler: where that checkpoint goes: a folder or an Ignite save handler
            (default: ``RUN_DIR/checkpoints`` of ``control``).
    """
    if not isinstance(engine, Engine):
        raise TypeError(f"expected an ignite Engine, got {engine!r}")
    refuse_unknown_actions(schedule.names, actions or {})
    own, callbacks = split_actions(actions)
    check_bound(schedule, [*own, *callbacks], record=record)
    _refuse_uncounted(schedule, samples, tokens)
    check_to_save(to_save, save_handler, None if control is None else control.run_dir)
    driver = driver_for(schedule, {}, callbacks, host="Ignite",
                        gives=("loss",) if loss is not None else (), predicates=predicates,
                        record=record, reduce=reduce,
                        time_source=time_source, control=control)
    if control is not None:  # every ITERATION_COMPLETED is a batch_end: a retime may add some
        control.reports_every_batch()
    if isinstance(driver, CallbackDriver):
        driver.context.bind(model=model, optimizer=optimizer)
    handle = ScheduleHandle(driver, batches_per_step=batches_per_step, samples=samples,
                            tokens=tokens, metrics=metrics, actions=own, loss=loss,
                            to_save=to_save, save_handler=save_handler)
    for event in EVENTS:
        engine.add_event_handler(event, _follow(handle, event.name))
    if control is not None:
        handle._control.attach(engine)
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
    for event in EVENTS:
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

