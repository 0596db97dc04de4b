"""The schedule in PyTorch Lightning: a ``Callback`` that fires a schedtrain ``Schedule``.

Lightning's counters map to schedtrain's clock so (docs/integrations.md)::

    step   = trainer.global_step    optimizer steps: under accumulate_grad_batches=N one
                                    step is N batches, and Lightning also steps on an
                                    epoch's last batch when fewer than N remain
    batch  = on_train_batch_end calls (batch_idx + 1 within the epoch, counted on)
    epoch  = epochs completed (on_train_epoch_end of an epoch that ran all its batches)
    sample, token = samples(batch), tokens(batch) of each batch

Events: on_train_start -> train_start, on_train_epoch_start -> epoch_start,
on_train_batch_end -> batch_end, then step_end once per optimizer step taken in that
batch (global_step moved), on_train_epoch_end -> epoch_end, on_train_end -> train_end. An
epoch cut by ``max_steps`` or ``should_stop`` has no epoch_end, as in schedtrain's loop.

Each callback of the schedule is bound to a function ``fn(trainer, pl_module)`` or to
one of Lightning's verbs: ``"validate"`` (runs the validation loop there and then; the
callback turns off Lightning's own validation cadence), ``"log"`` (the values
``self.log`` gathered in the step go to the loggers after it, where
``log_every_n_steps`` would send them: the schedule replaces it), ``"checkpoint"``
(``trainer.save_checkpoint`` once the event is evaluated) or ``"stop"``
(``trainer.should_stop``). The schedule's state rides in Lightning's checkpoint, so a
resumed fit fires what the uninterrupted one would.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from time import perf_counter_ns
from typing import TYPE_CHECKING, Any

try:
    import lightning.pytorch as pl
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("schedtrain.integrations.lightning needs Lightning: "
                      "pip install 'schedtrain[lightning]'") from exc

from schedtrain.checkpoints.files import remove
from schedtrain.integrations.driver import takes_event
from schedtrain.integrations.driver_state import check_nesting, host_state, latest_values
from schedtrain.integrations.host_control import HostControl
from schedtrain.integrations.hosted import (
    CallbackDriver,
    check_bound,
    driver_for,
    refuse_uncounted,
    spec_bindings,
    split_actions,
)
from schedtrain.integrations.keeping import KeepArg, host_keeps, load_keeps, save_kept
from schedtrain.integrations.lightning_control import (
    check_control,
    forget_preempted,
    preempt,
    resume_path,
    retimer_of,
)
from schedtrain.integrations.lightning_loop import (
    VALIDATE_KNOWN,
    VERBS,
    Hook,
    batch_size,
    check_bindings,
    check_resumed,
    precision_name,
    set_log_every,
    step_counter,
    synced,
    validate,
)
from schedtrain.schedule.schedule import Schedule
from schedtrain.training.control.retime import Retimer
from schedtrain.triggers.protocol import Predicate

if TYPE_CHECKING:
    from schedtrain.spec import Spec

__all__ = ["VALIDATE_KNOWN", "VERBS", "ScheduleCallback", "batch_size"]

Counter = Callable[[Any], int]


class ScheduleCallback(pl.Callback):
    """Fire ``schedule`` inside ``lightning.pytorch.Trainer.fit``.

    Args:
        schedule: the schedule (Python, or ``load_spec(path).schedule()``); an entry whose
            object is a schedtrain ``Callback`` runs it.
        actions: callback name -> ``fn(trainer, pl_module)`` (also given ``event=``, the
            event that fired it, when it declares ``event``), a verb of ``VERBS``, or a
            schedtrain ``Callback`` (it sees the LightningModule as ``self.model``, the
            first optimizer, and stops the fit through ``trainer.should_stop``).
        samples: counts a batch's samples (default ``batch_size``); ``None``: not counted.
        tokens: counts a batch's tokens (``lambda b: int(b["attention_mask"].sum())``).
        checkpoint_dir: where ``"checkpoint"`` writes (default
            ``trainer.default_root_dir/checkpoints``), as ``NAME-epoch=E-step=S.ckpt``.
        predicates: predicates registered by name for ``when(name)`` conditions.
        time_source: monotonic nanoseconds for time triggers (tests pass a fake one).
        record: keep every firing in ``firings``.
        keep: a ``"checkpoint"`` callback's name -> which of its own files to keep (a
            retention policy, ``N`` or its TOML table; default: all).
        control: ``HostControl(RUN_DIR, ...)``: signals, cloud notices (a preemption saves
            and exits 75: ``lightning_control``) and live retime (``retimer``).

    Metrics that the schedule's conditions and metric triggers name are read from
    ``trainer.callback_metrics`` at each step end where a trigger is evaluated (every step
    end when a trigger counts batches), at each epoch end and after each validation; a
    value equal to the last one read is not a new value (``plateau`` counts values that
    change). Under DDP a value logged with ``sync_dist=True`` is taken as Lightning reduced
    it; any other is reduced (the mean over ranks) before a trigger reads it.
    """

    def __init__(
        self,
        schedule: Schedule,
        actions: Mapping[str, Hook | str] | None = None,
        *,
        samples: Counter | None = batch_size,
        tokens: Counter | None = None,
        checkpoint_dir: str | Path | None = None,
        predicates: Mapping[str, Predicate] | None = None,
        time_source: Callable[[], int] = perf_counter_ns,
        record: bool = False,
        keep: Mapping[str, KeepArg | None] | None = None,
        control: HostControl | None = None,
    ) -> None:
        if not isinstance(schedule, Schedule):
            raise TypeError(f"expected a schedtrain Schedule, got {schedule!r}")
        self.control = check_control(control)
        self.actions, callbacks = split_actions(actions)
        check_bindings(schedule, self.actions)
        check_bound(schedule, [*self.actions, *callbacks], record=record)
        for counter, given in (("sample", samples), ("token", tokens)):
            if given is None:
                refuse_uncounted(schedule, counter, f"nothing counts: pass {counter}s=, a "
                                 f"function of a batch returning its {counter}s")
        self._told = {n for n, a in self.actions.items() if callable(a) and takes_event(a)}
        self.keep = host_keeps(keep, self.actions, "checkpoint")  #: its saves, what stays
        self._samples, self._tokens = samples, tokens
        self.checkpoint_dir = None if checkpoint_dir is None else Path(checkpoint_dir)
        self.driver = driver_for(
            schedule, {n: self._bound(n) for n in self.actions}, callbacks, host="Lightning",
            gives=("loss", "exception"), predicates=predicates, time_source=time_source,
            record=record, control=self.control)
        #: the driver, when it runs schedtrain callbacks
        self._hosted = self.driver if isinstance(self.driver, CallbackDriver) else None
        self._retimed()
        self.driver.on_retime = self._retimed
        if self.control is not None:  # each batch end reaches the driver
            self.control.reports_every_batch()
        self._state_key = self._generate_state_key(callbacks=list(self.driver.table.names))
        self._last_read: dict[str, float] = {}
        self._host: tuple[pl.Trainer, pl.LightningModule] | None = None
        self._deferred: list[str] = []
        self._batch_idx = -1  # of the epoch's last batch end so far (-1: none yet)
        self._steps: Any = None  # Lightning's optimizer-step counter (see step_counter)
        self._first_batch = False
        self._logging = False  # a "log" firing set log_every_n_steps for this step
        self._resumed = False  # a state was loaded: checked against Lightning's at start

    @classmethod
    def from_spec(cls, spec: Spec | str | Path,
                  actions: Mapping[str, Hook | str | Any] | None = None,
                  **kwargs: Any) -> ScheduleCallback:
        """The callback for a spec (or its path): its typed callbacks (``type =
        "EarlyStopping"``) built as ``schedtrain train`` builds them, ``actions`` binding
        the others; ``kwargs`` as the constructor's."""
        schedule, bound = spec_bindings(spec, actions)
        return cls(schedule, bound, **kwargs)

    def _bound(self, name: str) -> Callable[[], None]:
        return lambda: self._act(name)

    def _retimed(self) -> None:
        """What the schedule reads (again after a retime); ``_plain``: nothing to read."""
        self._watched = sorted(self.driver.metric_names)
        self._plain = self._hosted is None and not self._watched

    @property
    def retimer(self) -> Retimer:
        """Live retime's Python API (with ``control``): ``retimer.retime(schedule)``."""
        return retimer_of(self.control)

    @property
    def resume_path(self) -> str | None:
        """Lightning's checkpoint of a preempted fit in the run folder, for
        ``trainer.fit(..., ckpt_path=callback.resume_path)``; ``None``: none (a fresh fit)."""
        return resume_path(self.control)

    @property
    def firings(self) -> list[Any]:
        """What fired, with the clock's counters (with ``record=True``)."""
        return self.driver.firings

    @property
    def state_key(self) -> str:
        # Lightning reads it at every hook call of every step (its profiler's name): built
        # once, it costs what a plain callback's does.
        return self._state_key

    # -- Lightning's hooks -------------------------------------------------------------------
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if "validate" in self.actions.values():
            # The schedule decides when to validate: Lightning's cadence never comes round.
            trainer.check_val_every_n_epoch = sys.maxsize
        if "log" in self.actions.values():
            # ... and when to log a step: Lightning's should_update_logs is false while
            # log_every_n_steps is 0, true for the step a firing sets it to 1 for.
            set_log_every(trainer, 0)

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._first_batch = True
        self._steps = step_counter(trainer)
        if self._hosted is not None:
            accumulate = max(int(trainer.accumulate_grad_batches), 1)
            batches = trainer.num_training_batches
            self._hosted.context.bind(
                model=pl_module, optimizer=trainer.optimizers[0] if trainer.optimizers else None,
                device=pl_module.device, precision=precision_name(str(trainer.precision)),
                rank=trainer.global_rank,
                steps_in_epoch=-(-int(batches) // accumulate) if batches != float("inf") else None)
        if self._resumed:  # its counters against Lightning's, restored with them
            self._resumed = False
            check_resumed(self.driver, trainer)
        self._event(trainer, pl_module, self.driver.train_start)
        if self.driver.ranks is not None:  # reads again at each look: new if it changed
            self.driver.ranks.dedup = True

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._batch_idx = -1
        if self._steps is not None and self._steps.completed != trainer.global_step:
            self._steps = None  # not the counter global_step reads: read the property
        self._event(trainer, pl_module, lambda: self._catch_up(trainer))

    def _catch_up(self, trainer: pl.Trainer) -> tuple[str, ...]:
        """Start the epoch Lightning is in. A fit resumed from a checkpoint taken after an
        epoch's last batch (before its on_train_epoch_end) starts the next epoch: the
        saved one ends first, as it did in the uninterrupted fit."""
        d = self.driver
        late = d.epoch_end() if d.in_epoch and trainer.current_epoch > d.clock.epoch else ()
        return late + d.epoch_start()

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                             batch: Any, batch_idx: int) -> None:
        if self._logging:  # the step a "log" firing logged has been logged
            self._logging = False
            set_log_every(trainer, 0)
        if self._first_batch:
            # Resumed from a checkpoint of an epoch's last batch, Lightning calls neither
            # epoch hook: the saved epoch ends and the next starts here, before the next
            # step trains, so their actions see the weights and global_step they would
            # have seen in the uninterrupted fit.
            self._first_batch = False
            self._event(trainer, pl_module, lambda: self._catch_up(trainer))

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                           outputs: Any, batch: Any, batch_idx: int) -> None:
        # Runs every batch: the quiet step reads global_step once and compares it with the
        # clock; what is the same all epoch (num_training_batches) is read at the epoch end.
        d = self.driver
        self._host = (trainer, pl_module)
        samples, tokens = self._samples, self._tokens
        n = samples(batch) if samples is not None else 0
        t = tokens(batch) if tokens is not None else 0
        self._batch_idx = batch_idx
        steps = self._steps
        stepped = steps.completed if steps is not None else trainer.global_step
        clock = d.clock
        if self._plain and stepped == clock.step + 1:  # one step, no metric or loss read
            d.step(n, t)
        else:
            d.batch_end(n, t)
        if clock.step < stepped:
            hosted = self._hosted
            if hosted is not None and hosted.wants_loss:
                loss = outputs.get("loss") if isinstance(outputs, Mapping) else outputs
                if loss is not None:
                    hosted.report_loss(loss)
            while clock.step < stepped:
                # A batch_end trigger may read a metric before the next step end: the value
                # of this step is put at its end, as where the step_end triggers read it.
                if self._watched and (clock.step + 1 >= d.table.step_due
                                      or d.table.needs_batch_end):
                    self._read_metrics(trainer)
                d.step_end()
        if self._deferred or self._hosted is not None:
            self._finish(trainer)
        if d.preempt_requested is not None:  # a signal or notice, seen at this step end
            self._event(trainer, pl_module, lambda: d.fire("preempt"))
            preempt(trainer, d, self.control)

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # Not an epoch cut by max_steps or should_stop: its last batch was the last one.
        if self._batch_idx >= 0 and self._batch_idx + 1 >= trainer.num_training_batches:
            self._read_metrics(trainer)
            self._event(trainer, pl_module, self.driver.epoch_end)

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not trainer.sanity_checking:
            self._read_metrics(trainer)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._event(trainer, pl_module, lambda: self._late_end(trainer) + self.driver.train_end())
        forget_preempted(trainer, self.control)

    def _late_end(self, trainer: pl.Trainer) -> tuple[str, ...]:
        """Resumed from a checkpoint of the fit's last batch (before its epoch end),
        Lightning runs no batch and calls no epoch hook: the saved epoch ends here, as it
        did in the uninterrupted fit, before train_end."""
        d = self.driver
        if (self._first_batch and d.in_epoch and d.now.step_in_epoch > 0
                and trainer.current_epoch > d.clock.epoch):
            return d.epoch_end()
        return ()

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                     exception: BaseException) -> None:
        if self._hosted is not None:
            self._hosted.exception(exception)
        else:
            self.driver.close_control(exception)

    # -- firing ------------------------------------------------------------------------------
    def _event(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
               report: Callable[[], tuple[str, ...]]) -> None:
        self._host = (trainer, pl_module)
        report()
        self._finish(trainer)

    def _act(self, name: str) -> None:
        action = self.actions[name]
        assert self._host is not None
        trainer, module = self._host
        if action == "validate":
            validate(trainer)
            self._read_metrics(trainer)
        elif action == "log":
            self._logging = True
            set_log_every(trainer, 1)
        elif isinstance(action, str):  # checkpoint, stop: once the event is evaluated
            self._deferred.append(name)
        elif name in self._told:
            action(trainer, module, event=self.driver.event)
        else:
            action(trainer, module)

    def _finish(self, trainer: pl.Trainer) -> None:
        if self._hosted is not None and self._hosted.stop_reason is not None:
            trainer.should_stop = True
        deferred, self._deferred = self._deferred, []
        for name in deferred:
            if self.actions[name] == "stop":
                trainer.should_stop = True
            else:
                now = self.driver.now
                folder = self.checkpoint_dir or Path(trainer.default_root_dir) / "checkpoints"
                path = folder / f"{name}-epoch={now.epoch}-step={now.step}.ckpt"
                # weights_only given: Lightning logs a line at each save that leaves it out
                save_kept(self.keep.get(name), path, now, trainer.callback_metrics,
                          lambda p: trainer.save_checkpoint(p, weights_only=False),
                          delete=remove, prune=trainer.is_global_zero)

    def _read_metrics(self, trainer: pl.Trainer) -> None:
        if not self._watched:
            return
        logged = trainer.callback_metrics
        ranks = self.driver.ranks
        for name in self._watched:
            value = logged.get(name)
            if value is None:
                continue
            number = float(value)
            if ranks is not None and not synced(trainer, name):
                # this rank's value: reduced over the ranks, then new if it changed
                self.driver.put(name, number)
            elif self._last_read.get(name) != number:
                self._last_read[name] = number
                self.driver.put(name, number, agreed=True)

    # -- state -------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {"driver": self.driver.state_dict(), "last_read": dict(self._last_read),
                "keep": {n: k.state() for n, k in self.keep.items()}}

    def on_load_checkpoint(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                           checkpoint: dict[str, Any]) -> None:
        # before Lightning deep-copies this state (too deep a one would overflow there)
        check_nesting((checkpoint.get("callbacks") or {}).get(self.state_key))

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        # each part checked before any is restored; a damaged one refused by key path
        top = host_state(state_dict, ("driver", "last_read", "keep"))
        last_read = latest_values(top["last_read"], "last_read")
        load_keeps(self.keep, top["keep"])
        self.driver.load_state_dict(top["driver"])
        self._last_read = last_read
        self._resumed = True
