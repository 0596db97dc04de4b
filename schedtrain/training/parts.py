"""A run's parts, built by one function into one record.

``build_parts`` makes every part of a run from its checked ``RunConfig`` and what the user
gave (model, data, callbacks, schedule): the device and process group, the compiled
table, the metric store and its sinks, the checkpoint owner, the agreement between
ranks, the dispatcher and the loop. ``Trainer`` is the public face over this record and
``training.fit`` its lifecycle.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import attrs
import torch

from schedtrain.callbacks.base import (
    STOP_PLACES_BEYOND_TRIGGER,
    Callback,
    overrides,
    stops_alone,
)
from schedtrain.callbacks.saver import ModelSaver
from schedtrain.checkpoints import Checkpoints
from schedtrain.clock import LoopClock
from schedtrain.distributed.agreement import Agreement, Alone
from schedtrain.distributed.comm import Comm, reraise_on_all
from schedtrain.distributed.setup import prepare
from schedtrain.errors import RunDirError, ScheduleWarning
from schedtrain.monitors.jsonl import JsonlWriter
from schedtrain.monitors.store import MetricStore, Sink
from schedtrain.planning.changes import canonical
from schedtrain.schedule.schedule import Schedule
from schedtrain.schedule.table import TriggerTable
from schedtrain.simulation.simclock import RunShape
from schedtrain.spec.run import RunConfig
from schedtrain.training.binding import Bound
from schedtrain.training.control import RunControl
from schedtrain.training.control.schedule_change import ScheduleChange
from schedtrain.training.data_position import DataPosition, EpochFlag
from schedtrain.training.dispatch import Dispatcher
from schedtrain.training.loop import Loop
from schedtrain.training.losses import LossKeeper
from schedtrain.training.run_dir import RunDirectory
from schedtrain.training.run_state import RunState
from schedtrain.training.steps import StepFn
from schedtrain.triggers.protocol import Predicate

__all__ = ["Parts", "StepFn", "build_parts", "epoch_length", "make_agreement", "publish_loss"]


@attrs.frozen(eq=False, kw_only=True)
class Parts:
    """Every part of one run (built by keyword: a reordered field is an error, not a swap)."""

    comm: Comm | None
    device: torch.device
    #: the user's module, and the one steps run through (DDP's wrapper on several ranks)
    model: torch.nn.Module
    train_model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    train_data: Iterable[Any]
    val_data: Iterable[Any] | None
    scaler: Any
    clock: LoopClock
    schedule: Schedule
    callbacks: list[Callback]
    table: TriggerTable
    predicates: dict[str, Predicate]
    #: the run directory (``None`` without one, and on every rank but the chief)
    directory: RunDirectory | None
    events: JsonlWriter | None
    metrics: MetricStore
    losses: LossKeeper
    position: DataPosition
    epoch: EpochFlag
    run_state: RunState
    checkpoints: Checkpoints
    agreement: Alone
    dispatch: Dispatcher
    loop: Loop
    #: run control: signals, notices, live retime (``trainer.retimer``), the resume journal
    control: RunControl


def publish_loss(losses: LossKeeper, metrics: MetricStore, clock: LoopClock) -> None:
    """Put ``train/loss`` for the steps since it was last put (before a firing)."""
    if clock.step > losses.since:
        losses.publish(metrics, clock.step)


def epoch_length(train_data: Iterable[Any], grad_accum: int) -> int | None:
    """Optimizer steps per epoch, when the data has a length."""
    try:
        n = len(train_data)  # type: ignore[arg-type]
    except TypeError:
        return None
    return -(-n // grad_accum)


def _shape(config: RunConfig, train_data: Iterable[Any]) -> RunShape | None:
    """The run's shape as a simulation sees it (``None``: epochs of unknown length)."""
    per_epoch = epoch_length(train_data, config.grad_accum)
    if per_epoch is None:
        return None
    epochs = config.max_epochs or -(-(config.max_steps or 0) // per_epoch)
    return RunShape.build(epochs=epochs, steps_per_epoch=per_epoch,
                          max_steps=config.max_steps)


def build_parts(config: RunConfig, device: torch.device, *, model: torch.nn.Module,
                optimizer: torch.optim.Optimizer, train_data: Iterable[Any],
                val_data: Iterable[Any] | None, loss_fn: Callable[[Any, Any], torch.Tensor] | None,
                step_fn: StepFn | None, bound: Bound, sinks: Iterable[Sink],
                predicates: Mapping[str, Predicate] | None, clock: LoopClock | None) -> Parts:
    """The parts of a run on ``device`` (``config.device`` resolved), wired together
    (several processes: the group set up); ``bound``: the schedule, bound and
    order-checked once (``bind_checked``, or ``prepare_run``'s)."""
    ready = prepare(model=model, optimizer=optimizer, train_data=train_data,
                    val_data=val_data, device=device, strategy=config.strategy,
                    shard_data=config.shard_data, seed=config.seed)
    comm, device = ready.comm, ready.device
    clock = clock if clock is not None else LoopClock()
    # An empty mapping, not None: at run time conditions are decided, never "unknown".
    known: dict[str, Predicate] = dict(predicates or {})
    cbs = list(bound.callbacks)
    table = bound.schedule.compile(predicates=known, produced_metrics=set(bound.produced))
    # The run's last epoch, as a simulation of it sees it (PeriodicCallback's last step).
    try:
        shape = _shape(config, ready.train_data)
    except ValueError:  # longer than the library counts: the loop says so in its turn
        shape = None
    table.final_epoch = shape.epochs if shape is not None else config.max_epochs
    table.final_step = shape.total_steps if shape is not None and not shape.cut_short else None
    _warn_sanity(config.sanity_eval_batches, table)
    by_name = dict(zip(bound.schedule.names, cbs, strict=True))
    chief = comm is None or comm.is_chief
    # The chief alone writes the run directory and the logs.
    run_dir = config.run_path
    directory = RunDirectory(run_dir) if run_dir is not None and chief else None
    events = JsonlWriter(directory.events) if directory and config.log_events else None
    metrics = MetricStore(clock.now, [w for w in (events,) if w]
                          + (list(sinks) if chief else []))
    losses = LossKeeper()
    position = DataPosition(ready.train_data, comm.size if comm is not None else 1)
    epoch = EpochFlag()
    if comm is not None:
        losses.reduce, losses.reduce_number = comm.mean_tensor, comm.mean_number
    losses.watch = any(getattr(cb, "watches_loss", False) for cb in cbs)
    scaler = (torch.amp.GradScaler(device.type)
              if config.precision == "fp16" else None)
    publish = functools.partial(publish_loss, losses, metrics, clock)
    change = ScheduleChange(
        canonical(bound.schedule), config.schedule_change,
        functools.partial(_shape, config, ready.train_data),
        lambda: {n: cb.keep for n, cb in by_name.items() if isinstance(cb, ModelSaver)},
        ended=functools.partial(_refuse_ended, directory, comm, config))
    # Run control first: the run state and the agreement take what they need of it.

    def collect_save() -> None:  # the checkpoint owner is built below, on the run state
        checkpoints.wait()

    control = RunControl.build(
        table=table, callbacks=by_name, position=lambda: (clock.step, clock.epoch),
        time_ns=lambda: clock.time_ns, schedule=bound.schedule, change=change,
        predicates=known, produced=bound.produced,
        run_dir=run_dir, directory=directory, events=events, comm=comm,
        collect_save=collect_save,
        handle_signals=config.handle_signals, signals=config.preempt_signals,
        notice=config.preempt_notice, deadline=config.deadline)
    run_state = RunState(
        model=ready.model, optimizer=ready.optimizer, scaler=scaler, clock=clock, table=table,
        callbacks=by_name, metrics=metrics, losses=losses, data=position,
        epoch=epoch, events=events, change=change, replay=control.replay, run_dir=run_dir)
    checkpoints = Checkpoints(
        run_state, config.checkpoint_options, device_type=device.type, comm=comm,
        on_background_done=control.inbox.wake,
        on_written=directory.checkpoint_written if directory is not None else None)
    agreement = make_agreement(comm, callbacks=by_name, reduce=config.reduce, clock=clock,
                               control=control, table=table, losses=losses,
                               max_steps=config.max_steps)
    dispatch = Dispatcher(
        table, callbacks=by_name, agreement=agreement, saves=checkpoints,
        gates={e.default_name(): e.gate for e in bound.schedule.entries}, metrics=metrics,
        trigger_epoch={e.default_name(): e.trigger_epoch for e in bound.schedule.entries},
        before_firing=publish, keep_firings=config.keep_firings)
    loop = Loop.build(
        model=ready.train_model, optimizer=ready.optimizer, loss_fn=loss_fn, step_fn=step_fn,
        config=config, device=device, scaler=scaler,
        variable_accum=any(getattr(cb, "sets_grad_accum", False) for cb in cbs),
        clock=clock, table=table, dispatch=dispatch, losses=losses, position=position,
        control=control, epoch=epoch, max_epochs=config.max_epochs,
        max_steps=config.max_steps,
        steps_in_epoch=epoch_length(ready.train_data, config.grad_accum),
        publish_loss=publish, agreement=agreement)
    return Parts(
        comm=comm, device=device, model=ready.model, train_model=ready.train_model,
        optimizer=ready.optimizer, train_data=ready.train_data, val_data=ready.val_data,
        scaler=scaler, clock=clock, schedule=bound.schedule, callbacks=cbs, table=table,
        predicates=known, directory=directory, events=events, metrics=metrics, losses=losses,
        position=position, epoch=epoch, run_state=run_state, checkpoints=checkpoints,
        agreement=agreement, dispatch=dispatch, loop=loop, control=control)


def _warn_sanity(batches: int, table: TriggerTable) -> None:
    """A sanity evaluation asked for with nothing to run it, or named and never fired."""
    named = bool(table.listeners("sanity_eval"))
    if batches and not named:
        warnings.warn(f"sanity_eval_batches = {batches} but no callback's trigger names "
                      "'sanity_eval': nothing is evaluated before training; give the "
                      "InferenceRunner's trigger on('sanity_eval') (in TOML: any = "
                      "[{ on = \"sanity_eval\" }, ...])", ScheduleWarning, stacklevel=4)
    elif named and not batches:
        names = ", ".join(repr(table.names[i]) for i in table.listeners("sanity_eval"))
        warnings.warn(f"callback {names} names 'sanity_eval', which never fires with "
                      "sanity_eval_batches = 0; give sanity_eval_batches = N (N >= 1) to "
                      "evaluate N batches before training", ScheduleWarning, stacklevel=4)


def make_agreement(comm: Comm | None, *, callbacks: Mapping[str, Callback],
                   reduce: Mapping[str, str], clock: LoopClock, control: RunControl,
                   table: TriggerTable,
                   losses: LossKeeper, max_steps: int | None) -> Alone:
    """What the loop and the dispatcher settle with other ranks (``Alone`` without any):
    a preemption in run control's inbox, and the bits it carries between ranks."""
    inbox = control.inbox
    if comm is None:
        return Alone(clock=clock, inbox=inbox)
    # A stop flag is agreed after an event only where a callback that may stop alone ran
    # (or could have asked outside its trigger): decided from the classes, the same on
    # every rank.
    alone = {n: stops_alone(cb) for n, cb in callbacks.items()}
    hooks_alone = any(alone[n] and any(overrides(cb, h) for h in STOP_PLACES_BEYOND_TRIGGER)
                      for n, cb in callbacks.items())
    return Agreement(clock=clock, inbox=inbox, comm=comm, table=table,
                     losses=losses, max_steps=max_steps, alone=alone, hooks_alone=hooks_alone,
                     reduce_ops=reduce, bits=control.waiting_bits, on_agreed=control.take)


def _refuse_ended(directory: RunDirectory | None, comm: Comm | None, config: RunConfig,
                  step: int) -> None:
    """Raise ``RunEnded`` on every rank when the run resumed at ``step`` had ended, its
    end unchanged (the chief reads ``run.json``; every rank takes its answer)."""
    failed: RunDirError | None = (directory.refusal(config.max_epochs, config.max_steps,
                                                    step) if directory is not None else None)
    if comm is not None:
        failed = reraise_on_all(comm, failed)
    if failed is not None:
        raise failed
