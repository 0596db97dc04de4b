"""tensorpack's scheduling wrappers as thin sugar over the algebra.

Each returns a ``Scheduled`` (callback + trigger + hook gate) for a trainer:

* ``PeriodicTrigger(cb, every_k_steps=, every_k_epochs=, before_train=)``: run
  ``cb``'s ``_trigger`` when ``step % k == 0`` (at step end) or ``epoch % k == 0``
  (at epoch end), or once before training. Its other hooks run as usual, except
  ``_trigger_epoch``: as in tensorpack, the wrapper replaces that call.
* ``EnableCallbackIf(cb, pred)``: the callback's per-event hooks and its trigger
  run only while ``pred(cb)`` is true; ``pred`` is evaluated when each hook would run.
* ``PeriodicCallback(cb, every_k_steps=, every_k_epochs=)``: ``EnableCallbackIf``
  with the predicate ``global_step % k == 0 or epoch_num % k == 0`` (tensorpack's
  counters: ``epoch_num`` is 1-based, 1 during the first epoch): it can only make a
  callback *less* frequent. With ``every_k_epochs``, as tensorpack's since 2018, it is
  also enabled once the final epoch's last step runs (``local_step == steps_per_epoch - 1
  and epoch_num == max_epoch``): that step's hooks, the epoch's end, and, as tensorpack's
  step counter still points at the previous epoch's last step there, the final epoch's
  ``before_epoch`` (unless it is the first).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs

from schedtrain.schedule.schedule import HookGate, Scheduled
from schedtrain.time import Timestamp, Unit
from schedtrain.triggers.base import Trigger, all_of, any_of
from schedtrain.triggers.conditions import when
from schedtrain.triggers.lifecycle import on
from schedtrain.triggers.periodic import every
from schedtrain.triggers.protocol import Point

__all__ = ["Divisible", "EnableCallbackIf", "PeriodicCallback", "PeriodicTrigger", "gate_at"]

_DEFAULT = every("1 epoch")


@attrs.frozen
class _Parts:
    callback: Any
    trigger: Trigger
    gate: Callable[[Timestamp], bool] | None
    name: str | None
    trigger_epoch: str


def _unwrap(callback: Any) -> _Parts:
    if isinstance(callback, Scheduled):
        return _Parts(callback.callback, callback.trigger, callback.gate, callback.name,
                      callback.trigger_epoch)
    trigger = getattr(callback, "default_trigger", None)
    mode = getattr(callback, "bare_trigger_epoch", "hook")  # a Callback's, as bind() reads it
    return _Parts(callback, trigger if isinstance(trigger, Trigger) else _DEFAULT, None, None,
                  mode if isinstance(mode, str) else "hook")


def _check_k(name: str, k: int | None) -> None:
    if k is not None and (isinstance(k, bool) or not isinstance(k, int) or k < 1):
        raise ValueError(f"`{name}` must be a whole number >= 1 or None, got {k!r}")


def PeriodicTrigger(
    callback: Any,
    every_k_steps: int | None = None,
    every_k_epochs: int | None = None,
    before_train: bool = False,
) -> Scheduled:
    """Trigger ``callback`` every k steps and/or every k epochs (and optionally before training)."""
    _check_k("every_k_steps", every_k_steps)
    _check_k("every_k_epochs", every_k_epochs)
    parts: list[Trigger] = []
    if every_k_steps is not None:
        parts.append(every(every_k_steps, Unit.STEP))
    if every_k_epochs is not None:
        parts.append(every(every_k_epochs, Unit.EPOCH))
    if before_train:
        parts.append(on("train_start"))
    if not parts:
        raise ValueError(
            "PeriodicTrigger needs every_k_steps, every_k_epochs or before_train=True")
    p = _unwrap(callback)
    # tensorpack's PeriodicTrigger takes the epoch call over: the wrapped callback's
    # trigger_epoch is never called, its trigger() is (every k).
    return Scheduled(any_of(*parts), p.callback, p.name, p.gate, trigger_epoch="off")


@attrs.frozen
class _CallbackPredicate:
    """``pred(callback)``, callable both as a hook gate and as a ``when`` predicate."""

    pred: Callable[[Any], bool]
    callback: Any

    def __call__(self, _at: Timestamp | Point) -> bool:
        return bool(self.pred(self.callback))


@attrs.frozen
class _Both:
    """Two hook gates, both open; each told which hook it gates where it asks (``at``)."""

    first: HookGate
    second: HookGate

    def __call__(self, ts: Timestamp) -> bool:
        return self.first(ts) and self.second(ts)

    def at(self, hook: str, table: Any) -> HookGate:
        return _Both(gate_at(self.first, hook, table), gate_at(self.second, hook, table))


def gate_at(gate: HookGate, hook: str, table: Any) -> HookGate:
    """``gate`` as it gates ``hook`` of a run on ``table`` (the trigger table; it knows the
    run's ``final_epoch``): the gate itself unless it asks (``at``)."""
    at = getattr(gate, "at", None)
    return at(hook, table) if at is not None else gate


def _both(first: HookGate | None, second: HookGate) -> HookGate:
    return second if first is None else _Both(first, second)


def EnableCallbackIf(callback: Any, pred: Callable[[Any], bool]) -> Scheduled:
    """Run ``callback``'s hooks and trigger only while ``pred(callback)`` is true."""
    if not callable(pred):
        raise TypeError(f"EnableCallbackIf needs a callable predicate, got {pred!r}")
    p = _unwrap(callback)
    check = _CallbackPredicate(pred, p.callback)
    return Scheduled(all_of(p.trigger, when(check)), p.callback, p.name, _both(p.gate, check),
                     trigger_epoch=p.trigger_epoch)


#: Events inside an epoch: there tensorpack's ``epoch_num`` is the completed epochs + 1.
_INSIDE_EPOCH = frozenset({"epoch_start", "batch_end", "step_end"})


@attrs.frozen(repr=False)
class Divisible(Trigger):
    """True where ``global_step % steps == 0`` or ``epoch_num % epochs == 0`` (a clock state,
    not a crossing), with tensorpack's counters: ``global_step`` the steps completed,
    ``epoch_num`` the 1-based number of the current epoch (completed epochs + 1 at
    ``epoch_start``, ``batch_end`` and ``step_end``; the completed epochs at other events).

    tensorpack's ``PeriodicCallback`` predicate.
    """

    steps: int | None
    epochs: int | None

    def holds(self, step: int, epoch_num: int) -> bool:
        """The predicate at these tensorpack counters."""
        if self.steps is not None and step % self.steps == 0:
            return True
        return self.epochs is not None and epoch_num % self.epochs == 0

    def evaluate(self, pt: Point) -> bool:
        now = pt.now
        inside = pt.event in _INSIDE_EPOCH
        if self.holds(now.step, now.epoch + inside):
            return True
        final = pt.final_epoch
        if self.epochs is None or not final:
            return False
        # tensorpack's last-step clause (local_step == steps_per_epoch - 1 in the final
        # epoch): at the final epoch's last step and after it; at its start, tensorpack's
        # local_step is still the previous epoch's last
        if not inside:
            return now.epoch == final
        if pt.event == "epoch_start":
            return now.epoch + 1 == final > 1
        last = pt.final_step
        return last is not None and now.step == (last if pt.event == "step_end" else last - 1)

    def __repr__(self) -> str:
        return f"Divisible(steps={self.steps!r}, epochs={self.epochs!r})"


#: Hooks run while a step runs (tensorpack's local_step is that step's index); after it
#: (``_after_step``, ``_trigger_step``) the clock counts it already.
_IN_STEP = frozenset({"_before_step", "_before_batch", "_before_backward", "_after_batch",
                      "_after_backward", "_before_optimizer_step"})


@attrs.frozen
class _PeriodicGate:
    """``PeriodicCallback``'s hook gate: the predicate at the callback's own ``global_step``
    and ``epoch_num`` (tensorpack's counters, which know whether an epoch is open); told
    its hook and table (``at``), also tensorpack's last-step clause."""

    divisible: Divisible
    callback: Any
    hook: str = ""
    table: Any = None

    def at(self, hook: str, table: Any) -> _PeriodicGate:
        return attrs.evolve(self, hook=hook, table=table)

    def __call__(self, ts: Timestamp) -> bool:
        epoch_num = getattr(self.callback, "epoch_num", None)
        # Hooks run only on trainer-bound callbacks, which have epoch_num; an object
        # without it (a stand-in in a test) is judged on the completed epochs.
        num = epoch_num if isinstance(epoch_num, int) else ts.epoch
        return self.divisible.holds(ts.step, num) or self._last_step(ts, num)

    def _last_step(self, ts: Timestamp, epoch_num: int) -> bool:
        """tensorpack's ``local_step == steps_per_epoch - 1 and epoch_num == max_epoch``."""
        final = getattr(self.table, "final_epoch", None)
        if self.divisible.epochs is None or final is None or epoch_num != final:
            return False
        hook = self.hook
        if hook in ("_after_epoch", "_trigger_epoch"):
            return True
        if hook == "_before_epoch":  # tensorpack's local_step: the last epoch's last step
            return epoch_num > 1
        trainer = getattr(self.callback, "trainer", None)
        length = getattr(trainer, "steps_in_epoch", None)
        if not isinstance(length, int):  # data of unknown length: the last step is unknown
            return False
        return ts.step_in_epoch == (length - 1 if hook in _IN_STEP else length)


def PeriodicCallback(
    callback: Any, every_k_steps: int | None = None, every_k_epochs: int | None = None
) -> Scheduled:
    """Enable ``callback`` only when ``global_step % k == 0`` or ``epoch_num % k == 0``
    (tensorpack's counters: ``epoch_num`` is 1 during the first epoch)."""
    _check_k("every_k_steps", every_k_steps)
    _check_k("every_k_epochs", every_k_epochs)
    if every_k_steps is None and every_k_epochs is None:
        raise ValueError("PeriodicCallback needs every_k_steps or every_k_epochs")
    p = _unwrap(callback)
    check = Divisible(every_k_steps, every_k_epochs)
    return Scheduled(all_of(p.trigger, check), p.callback, p.name,
                     _both(p.gate, _PeriodicGate(check, p.callback)),
                     trigger_epoch=p.trigger_epoch)


