"""The ``Callback`` base: lifecycle hooks and ``_trigger`` (what), never when.

Public methods (``before_train``, ``trigger``...) are called by the trainer and
call the overridable underscore methods, as in tensorpack. Where each hook runs::

    setup(trainer)                         once, before anything else
    before_train()
    [sanity_eval]   with sanity_eval_batches > 0, on a fresh run only
    [train_start]   _trigger() of callbacks whose trigger fires here
                    (at every [event] where any callback fires, before_firings()
                    runs first, on the callbacks that override it)
    for each epoch:
        before_epoch()
        [epoch_start]
        for each optimizer step:
            before_step(step, batch)       may return fetches: {name: fn()}
            for each micro-batch (grad_accum of them):
                before_batch(info); [batch_start]
                forward
                before_backward(info)      info.loss set
                backward
                after_batch(info); [batch_end]
            after_backward(step)           the step's gradients, as accumulated
            before_optimizer_step(step)    unscaled gradients, before clipping
            optimizer step
            after_step(step, outputs); trigger_step()
            [step_end]
        after_epoch(); trigger_epoch()
        [epoch_end]
    [train_end]
    after_train()                          also after StopTraining and exceptions
    on_exception(exc)                      when training fails, before after_train

``[event]`` marks where the trigger table is evaluated. Per-event hooks are
called only on callbacks that override them, and only while the callback's
gate (``EnableCallbackIf``/``PeriodicCallback``) is open. The three per-micro-batch
hooks run once per micro-batch (``grad_accum`` times a step); the others once per
optimizer step. A callback sees the loop through ``self.trainer``, a
``TrainingContext``.
"""

from __future__ import annotations

import inspect
import warnings
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from schedtrain.callbacks.payloads import BatchInfo, Fetches, StepOutputs
from schedtrain.callbacks.porting import porting_message, uncalled
from schedtrain.errors import PortingWarning
from schedtrain.triggers import Trigger, every

if TYPE_CHECKING:
    from schedtrain.callbacks.context import TrainingContext
    from schedtrain.clock import Clock
    from schedtrain.monitors.store import MetricStore
    from schedtrain.time import Timestamp

__all__ = ["BATCH_HOOKS", "PER_EVENT_HOOKS", "STOP_PLACES_BEYOND_TRIGGER", "BatchInfo",
           "Callback", "Fetches", "StepOutputs", "overrides", "stops_alone"]

class Callback:
    """Base class of training callbacks.

    Override ``_trigger`` (what to do when the callback's trigger fires) and the
    lifecycle hooks you need. ``default_trigger`` is used when the callback is
    given to the trainer without one. ``produces`` and ``needs`` name the metrics
    it writes and reads: the trainer refuses an order in which a callback runs
    before the one producing what it needs.
    """

    default_trigger: ClassVar[Trigger] = every("1 epoch")
    produces: tuple[str, ...] = ()
    needs: tuple[str, ...] = ()
    #: Whether it may ask to stop (``request_stop``, ``StopTraining``) from what can
    #: differ between ranks: its own state, a rank's loss or data. On several processes
    #: the ranks agree on a stop flag after an event where such a callback ran. ``False``
    #: on one that never stops, or stops only from what every rank shares (the clock,
    #: reduced metrics); a subclass that overrides ``_trigger``, a hook, ``_setup``,
    #: ``_before_train`` or ``load_state_dict`` without restating it counts as ``True``
    #: (``stops_alone``).
    may_stop_alone: ClassVar[bool] = True

    trainer: TrainingContext
    name: str | None = None
    _old_before_step = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Warn (``PortingWarning``) once for each lineage hook the class defines that
        schedtrain never calls (``schedtrain.callbacks.porting``): it would be silently
        ignored."""
        super().__init_subclass__(**kwargs)
        for hook in uncalled([cls]):
            # stacklevel 2: the class statement (type.__new__ runs no Python frame)
            warnings.warn(porting_message(cls.__qualname__, hook), PortingWarning,
                          stacklevel=2)

    # -- public API, called by the trainer -------------------------------------------------
    def setup(self, trainer: TrainingContext) -> None:
        """Bind to ``trainer``; called once before training."""
        self.trainer = trainer
        self._old_before_step = _takes_step_only(self)
        self._setup()

    def before_train(self) -> None:
        """Before the first epoch (also when resuming)."""
        self._before_train()

    def after_train(self) -> None:
        """After training ends, however it ends."""
        self._after_train()

    def before_epoch(self) -> None:
        """Before each epoch's first step (``step_in_epoch`` is already 0, or on resume the
        step the epoch resumes at)."""
        self._before_epoch()

    def after_epoch(self) -> None:
        """After each epoch's last step (the epoch counter already counts it)."""
        self._after_epoch()

    def before_step(self, step: int, batch: Any = None) -> Fetches | None:
        """Before optimizer step number ``step`` (1-based) starts, with its first batch."""
        if self._old_before_step:
            self._before_step(step)  # type: ignore[call-arg]
            return None
        return self._before_step(step, batch)

    def before_batch(self, info: BatchInfo) -> None:
        """Before each micro-batch's forward (``info.loss`` is ``None``)."""
        self._before_batch(info)

    def before_backward(self, info: BatchInfo) -> None:
        """After each micro-batch's forward, before its backward (``info.loss`` set)."""
        self._before_backward(info)

    def after_batch(self, info: BatchInfo) -> None:
        """After each micro-batch's backward (its gradients added to the step's)."""
        self._after_batch(info)

    def after_backward(self, step: int) -> None:
        """After the step's backward: gradients as accumulated (scaled under fp16)."""
        self._after_backward(step)

    def before_optimizer_step(self, step: int) -> None:
        """Just before the optimizer step: gradients unscaled, not yet clipped."""
        self._before_optimizer_step(step)

    def after_step(self, step: int, outputs: StepOutputs) -> None:
        """After optimizer step ``step``; ``outputs`` stay on the device."""
        self._after_step(step, outputs)

    def trigger_step(self) -> None:
        """After every step, after ``after_step``."""
        self._trigger_step()

    def trigger_epoch(self) -> None:
        """After every epoch, after ``after_epoch``; by default (``_trigger_epoch`` not
        overridden) it calls ``trigger()``, as tensorpack's does."""
        self._trigger_epoch()

    def trigger(self) -> None:
        """The callback's trigger fired."""
        # Bypassed on one process: where a class keeps this method, a firing calls
        # `_trigger` straight away (training/dispatch.py, `_direct_call`), a Python call
        # less per firing. Code added here runs only where a subclass overrides it.
        self._trigger()

    def before_firings(self) -> None:
        """At an event where callbacks fire, before the first of them runs: the state the
        last step left, before any callback changes it (whether this one fires or not)."""
        self._before_firings()

    def on_exception(self, exc: BaseException) -> None:
        """Training failed with ``exc`` (not called for ``StopTraining``)."""
        self._on_exception(exc)

    # -- override points -------------------------------------------------------------------
    def _setup(self) -> None:
        return None

    def _before_train(self) -> None:
        return None

    def _after_train(self) -> None:
        return None

    def _before_epoch(self) -> None:
        return None

    def _after_epoch(self) -> None:
        return None

    def _before_step(self, step: int, batch: Any) -> Fetches | None:
        return None

    def _before_batch(self, info: BatchInfo) -> None:
        return None

    def _before_backward(self, info: BatchInfo) -> None:
        return None

    def _after_batch(self, info: BatchInfo) -> None:
        return None

    def _after_backward(self, step: int) -> None:
        return None

    def _before_optimizer_step(self, step: int) -> None:
        return None

    def _after_step(self, step: int, outputs: StepOutputs) -> None:
        return None

    def _trigger_step(self) -> None:
        return None  # tensorpack's default too: nothing

    def _trigger_epoch(self) -> None:
        # tensorpack's default: the per-epoch call is trigger(), so a ported override
        # ending in ``super()._trigger_epoch()`` runs ``_trigger`` as it did there. The
        # trainer calls this hook only on classes that override it.
        self.trigger()

    def _trigger(self) -> None:
        return None

    def _before_firings(self) -> None:
        return None

    def _on_exception(self, exc: BaseException) -> None:
        return None

    def state_dict(self) -> dict[str, Any]:
        """State to checkpoint: plain data (numbers, strings, lists, dicts) and tensors."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore ``state_dict``."""

    def load_records(self, state: dict[str, Any]) -> None:
        """On a resume whose new schedule changed this callback's trigger (its state
        starts afresh), take back from its saved ``state`` what records facts rather
        than schedule state: a saver's record of each file it wrote, which its pruning
        needs to know what the files are. Nothing by default."""

    @property
    def bare_trigger_epoch(self) -> str:
        """How ``_trigger_epoch`` runs when the callback is given without a trigger
        (``Scheduled.trigger_epoch``): ``"fires"`` when its class overrides
        ``_trigger_epoch`` and keeps the base ``default_trigger``, as in tensorpack, where
        an overridden ``_trigger_epoch`` *replaces* the per-epoch ``trigger()`` call (so
        ``_trigger`` runs only when called, not every epoch as well); else ``"hook"``."""
        if overrides(self, "_trigger_epoch") and self.default_trigger is Callback.default_trigger:
            return "fires"
        return "hook"

    # -- context -------------------------------------------------------------------------
    @property
    def model(self) -> torch.nn.Module:
        """The model being trained."""
        return self.trainer.model

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        """The optimizer."""
        return self.trainer.optimizer

    @property
    def now(self) -> Timestamp:
        """The clock's counters at this moment."""
        return self.trainer.clock.now()

    @property
    def epoch_num(self) -> int:
        """tensorpack's ``epoch_num``: the 1-based number of the current epoch (1 during the
        first epoch and still 1 in its ``_after_epoch`` and ``_trigger_epoch``; 0 before the
        first epoch starts). Read-only."""
        clock = self._bound_clock("epoch_num")
        return clock.epoch + 1 if clock.in_epoch else clock.epoch

    @epoch_num.setter
    def epoch_num(self, _value: object) -> None:
        raise AttributeError(_read_only(self, "epoch_num", "the trainer's clock counts epochs"))

    @property
    def global_step(self) -> int:
        """tensorpack's ``global_step``: the optimizer steps completed so far. Read-only."""
        return self._bound_clock("global_step").step

    @global_step.setter
    def global_step(self, _value: object) -> None:
        raise AttributeError(_read_only(self, "global_step", "the trainer's clock counts steps"))

    def _bound_clock(self, what: str) -> Clock:
        trainer: TrainingContext | None = getattr(self, "trainer", None)
        if trainer is None:
            raise AttributeError(
                f"{type(self).__name__}.{what} is known only while training: the callback is "
                "not bound to a trainer yet (it is, from its _setup on)")
        return trainer.clock

    @property
    def metrics(self) -> MetricStore:
        """The metric store: ``put(name, value)``, ``latest(name)``, ``history(name)``."""
        return self.trainer.metrics

    def fire(self, event: str, **payload: Any) -> None:
        """Fire an event: a custom one declared on the schedule, or an ``eval_*`` one."""
        self.trainer.fire(event, **payload)

    @property
    def rank(self) -> int:
        """This process's rank (0 without ``torch.distributed``)."""
        return self.trainer.rank

    @property
    def is_chief(self) -> bool:
        """Whether this process is rank 0 (write files only there)."""
        return self.trainer.rank == 0

    def __repr__(self) -> str:
        return f"<{type(self).__name__}>"


#: Hooks the trainer calls only on callbacks that override them (see ``overrides``).
#: The per-micro-batch hooks (Lightning's on_train_batch_start, on_before_backward,
#: on_after_backward); any of them makes the loop take the general step.
BATCH_HOOKS = ("_before_batch", "_before_backward", "_after_batch")
PER_EVENT_HOOKS = ("_before_epoch", "_after_epoch", "_before_step", *BATCH_HOOKS,
                   "_after_backward", "_before_optimizer_step", "_after_step",
                   "_trigger_step", "_trigger_epoch")
#: Where a callback can ask to stop besides its trigger: its hooks, setup and resume.
STOP_PLACES_BEYOND_TRIGGER = (*PER_EVENT_HOOKS, "_before_firings", "_setup",
                              "_before_train", "load_state_dict")
_STOP_PLACES = ("_trigger", "trigger", *STOP_PLACES_BEYOND_TRIGGER,
                *(h.lstrip("_") for h in STOP_PLACES_BEYOND_TRIGGER))


def _read_only(callback: Callback, name: str, why: str) -> str:
    return (f"{type(callback).__name__}.{name} is read-only ({why}); keep your own count "
            "under another name")


def stops_alone(callback: object) -> bool:
    """``callback.may_stop_alone`` as set on the instance, else as its most derived
    class that says it, or that overrides ``_trigger``, a hook, ``_setup``,
    ``_before_train`` or ``load_state_dict``, has it (``True`` for a plain object)."""
    if not isinstance(callback, Callback):
        return True
    if "may_stop_alone" in vars(callback):
        return bool(vars(callback)["may_stop_alone"])
    for klass in type(callback).__mro__:
        if klass is Callback:
            break
        own = vars(klass)
        if "may_stop_alone" in own:
            return bool(own["may_stop_alone"])
        if any(m in own for m in _STOP_PLACES):
            return True
    return True


def overrides(callback: object, hook: str) -> bool:
    """Whether ``callback``'s class overrides ``hook`` of ``Callback`` (plain objects: has it)."""
    if not isinstance(callback, Callback):
        return callable(getattr(callback, hook, None))
    return getattr(type(callback), hook) is not getattr(Callback, hook)


def _takes_step_only(callback: Callback) -> bool:
    """An override ``_before_step(self, step)`` from before hooks received the batch.

    Checked once at setup; it still works, with a ``DeprecationWarning``.
    """
    if not overrides(callback, "_before_step"):
        return False
    try:
        params = inspect.signature(callback._before_step).parameters
    except (TypeError, ValueError):
        return False
    if len(params) != 1 or any(p.kind is p.VAR_POSITIONAL for p in params.values()):
        return False
    warnings.warn(f"{type(callback).__name__}._before_step(self, step) is deprecated: define "
                  "_before_step(self, step, batch) (it may return fetches); the one-argument "
                  "form stops working in 0.3", DeprecationWarning, stacklevel=3)
    return True
