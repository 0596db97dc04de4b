"""What the Lightning integration reads from, and drives in, Lightning's fit loop beyond its
public API, kept in one place and taken only on the Lightning versions ``VALIDATE_KNOWN``
names (the verbs that need them are refused on others, in one line)."""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from typing import Any

import lightning.pytorch as pl
import torch

from schedtrain.integrations.driver import ScheduleDriver, refuse_unknown_actions
from schedtrain.integrations.driver_state import DriverStateError
from schedtrain.schedule.schedule import Schedule

__all__ = ["VALIDATE_KNOWN", "VERBS", "Hook", "batch_size", "check_bindings", "check_resumed",
           "check_version", "precision_name", "set_log_every", "step_counter", "synced",
           "validate"]

#: What a callback of the schedule may be bound to, besides a function.
VERBS = ("validate", "log", "checkpoint", "stop")
#: Where Lightning acts on a verb: only the schedule's step ends and epoch ends, or only
#: its step ends (the loggers get a step's values after its on_train_batch_end).
_ACTS_AT = {"validate": ("step_end", "epoch_end"), "log": ("step_end",)}
_EVENTS = ("train_start", "epoch_start", "batch_end", "step_end", "epoch_end", "train_end")
Hook = Callable[["pl.Trainer", "pl.LightningModule"], Any]


def set_log_every(trainer: pl.Trainer, n: int) -> None:
    """Set ``trainer.log_every_n_steps`` (Trainer's argument; its logger connector sets the
    attribute, which the Trainer class does not declare): Lightning's
    ``should_update_logs`` reads it for each step (0: never)."""
    setattr(trainer, "log_every_n_steps", n)  # noqa: B010 - undeclared on the class


#: The Lightning versions whose fit loop ``validate`` and ``step_counter`` know:
#: [first, last] (major, minor).
VALIDATE_KNOWN = ((2, 2), (2, 6))


def check_version(name: str, verb: str, version: str) -> None:
    """Refuse the ``validate`` and ``log`` verbs on a Lightning whose fit loop they do not
    know (``validate``; where ``should_update_logs`` is read)."""
    try:
        major, minor = (int(p) for p in version.split(".")[:2])
    except ValueError:
        major, minor = -1, -1
    (a, b), (c, d) = VALIDATE_KNOWN
    if not (a, b) <= (major, minor) <= (c, d):
        how, own = (("runs Lightning's validation loop through its fit loop",
                     "val_check_interval") if verb == "validate" else
                    ("drives when Lightning's logger connector logs a step",
                     "log_every_n_steps"))
        raise ValueError(
            f"actions[{name!r}] = {verb!r} {how}, known for lightning {a}.{b} to {c}.{d}, "
            f"and this is lightning {version}: install a known version, or set "
            f"Lightning's own {own} instead")


def step_counter(trainer: pl.Trainer) -> Any:
    """The progress record whose ``completed`` is ``trainer.global_step``, or ``None``.

    ``global_step`` walks six properties (about 6 k instructions, most of a quiet batch
    end); the record it ends at is updated in place all fit long, checkpoint loads
    included. Taken only on the Lightning versions ``VALIDATE_KNOWN`` names and checked
    against ``global_step`` here and at each epoch start; otherwise the property is read.
    """
    try:
        major, minor = (int(p) for p in str(getattr(pl, "__version__", "")).split(".")[:2])
        if not VALIDATE_KNOWN[0] <= (major, minor) <= VALIDATE_KNOWN[1]:
            return None
        loop = trainer.fit_loop.epoch_loop
        module = trainer.lightning_module
        counter = (loop.automatic_optimization.optim_progress.optimizer.step.total
                   if module is None or module.automatic_optimization
                   else loop.manual_optimization.optim_step_progress.total)
        return counter if counter.completed == trainer.global_step else None
    except (AttributeError, ValueError):
        return None


def synced(trainer: pl.Trainer, name: str) -> bool:
    """Whether Lightning reduced ``name`` across ranks itself (``self.log(...,
    sync_dist=True)``) in training or validation; its value is then used as it is."""
    loop = trainer.fit_loop.epoch_loop
    try:
        results = [*loop._results.values(), *loop.val_loop._results.values()]
        return any(r.meta.sync.should for r in results
                   if name in (r.meta.name, f"{r.meta.name}_step", f"{r.meta.name}_epoch"))
    except AttributeError:  # Lightning's internals moved: reduce it (the same on all ranks)
        return False


def validate(trainer: pl.Trainer) -> None:
    """Run the fit's validation loop now, as Lightning's epoch loop does at its checks.

    Lightning has no public call for this: ``trainer.validate`` called inside ``fit`` fails
    (an assertion in Lightning 2.6), and its cadence flags (``val_check_interval``,
    ``check_val_every_n_epoch``) are read after every callback's ``on_train_batch_end``,
    too late for the schedule's step end (whose metrics later callbacks read), and
    before ``on_train_epoch_end``, too early for its epoch end. So this is the one place
    that uses the fit loop's internals, for the versions ``VALIDATE_KNOWN`` names (checked
    when the verb is bound; docs/integrations.md).
    """
    loop = trainer.fit_loop.epoch_loop
    trainer.validating = True
    first = trainer._logger_connector._first_loop_iter
    loop.val_loop.run()
    trainer.training = True
    trainer._logger_connector._first_loop_iter = first


def check_resumed(driver: ScheduleDriver, trainer: pl.Trainer) -> None:
    """A resumed driver's counters checked against Lightning's own, restored from the same
    checkpoint (at ``on_train_start``): the optimizer steps, the batches, the epoch, and
    inside an epoch its position; one that disagrees is damage, refused by key path
    (``driver.clock.now.step``), never a schedule silently shifted."""
    now = driver.now
    pending = driver.pending_batches
    accumulate = max(int(trainer.accumulate_grad_batches), 1)

    def refuse(key: str, lightning: str, found: int | bool) -> None:
        raise DriverStateError(f"driver.{key}", f"{lightning}, as Lightning's own counter "
                               "in the same checkpoint", str(found))

    if now.step != trainer.global_step:
        refuse("clock.now.step", f"{trainer.global_step} (global_step)", now.step)
    if pending >= accumulate:
        refuse("pending[0]", f"below {accumulate} (accumulate_grad_batches)", pending)
    progress = getattr(getattr(trainer.fit_loop, "epoch_loop", None), "batch_progress", None)
    if progress is None:  # pragma: no cover - a Lightning without the progress counters
        return
    total, current = int(progress.total.ready), int(progress.current.ready)
    if now.batch != total:
        refuse("clock.now.batch", f"{total} (the batches Lightning ran)", now.batch)
    epoch = trainer.current_epoch
    batches = trainer.num_training_batches
    inside = 0 < current < batches  # Lightning resumes inside an epoch
    # saved at an epoch's end, the clock has ended it and Lightning counts it done after;
    # saved after its last batch, Lightning has moved on and the clock ends it later
    if now.epoch != epoch and not (not driver.in_epoch and now.epoch == epoch + 1) and not (
            driver.in_epoch and not inside and now.epoch + 1 == epoch):
        refuse("clock.now.epoch", f"{epoch} (current_epoch)", now.epoch)
    if inside:
        if not driver.in_epoch:
            refuse("in_epoch", "true (Lightning resumes inside an epoch)", False)
        if now.step_in_epoch * accumulate + pending != current:
            refuse("clock.now.step_in_epoch", f"{current // accumulate} (the epoch's "
                   f"batches Lightning ran: {current})", now.step_in_epoch)


def precision_name(lightning: str) -> str:
    """schedtrain's name of Lightning's precision ("bf16-mixed" -> "bf16")."""
    return "bf16" if "bf16" in lightning else "fp16" if lightning.startswith("16") else "fp32"


def batch_size(batch: Any) -> int:
    """The first dimension of the first tensor in ``batch`` (0 when it holds none)."""
    if isinstance(batch, torch.Tensor):  # every batch: the cheapest reads torch has
        return batch.shape[0] if batch.ndim else 1
    values: Collection[Any] = (batch.values() if isinstance(batch, Mapping)
                               else batch if isinstance(batch, list | tuple) else ())
    for value in values:
        n = batch_size(value)
        if n:
            return n
    return 0


def check_bindings(schedule: Schedule, actions: Mapping[str, Hook | str]) -> None:
    """Refuse an action that is neither a function nor a verb, or a verb bound to a
    trigger that fires where Lightning cannot act on it."""
    refuse_unknown_actions(schedule.names, actions)
    for name, action in actions.items():
        if isinstance(action, str):
            if action not in VERBS:
                raise ValueError(f"actions[{name!r}]: unknown Lightning verb {action!r}; "
                                 f"expected a function (trainer, pl_module) or one of {VERBS}")
            acts_at = _ACTS_AT.get(action)
            if acts_at is not None:
                check_version(name, action, str(getattr(pl, "__version__", "unknown")))
                events = schedule[name].events()
                wrong = sorted(e for e in _EVENTS if e in events and e not in acts_at)
                if wrong:
                    what = ("runs Lightning's validation loop, which runs" if action ==
                            "validate" else "sends the step's self.log values to the loggers, "
                            "which Lightning does (on_epoch values: at every epoch end itself)")
                    raise ValueError(
                        f"actions[{name!r}] = {action!r} {what} only at {' and '.join(acts_at)}"
                        f"; the trigger {schedule[name]!r} can also fire at {wrong}")
        elif not callable(action):
            raise TypeError(f"actions[{name!r}] must be a function (trainer, pl_module) or "
                            f"one of {VERBS}, got {action!r}")
