"""``EarlyStopping`` and ``TerminateOnNaN``: end training with ``StopTraining``."""

from __future__ import annotations

import math
from typing import Any, ClassVar, Literal

from schedtrain.callbacks.base import Callback
from schedtrain.logs import get_logger
from schedtrain.readback import state_number
from schedtrain.time import MAX_COUNT
from schedtrain.triggers import Trigger, any_of, every, on, plateau
from schedtrain.triggers.metric import Plateau, early_stop

__all__ = ["EarlyStopping", "TerminateOnNaN"]

_log = get_logger("schedtrain.callbacks")


class EarlyStopping(Callback):
    """Stop training.

    Without ``patience`` it stops as soon as it fires: give it a trigger such as
    ``plateau("val/loss", patience=3)`` (its default trigger when none is given); a spec
    whose trigger for it has no metric part is refused, as it would stop at its first
    firing.
    With ``patience`` it counts itself: each time it fires it reads ``monitor``
    and stops after ``patience`` firings without a new best (default trigger:
    every epoch). Before counting, as Lightning's ``EarlyStopping`` does, it stops at
    once when the value is not finite (``check_finite``), when it is better than
    ``stopping_threshold``, or worse than ``divergence_threshold`` (both strictly).

    Args:
        monitor: the metric watched (default ``val/loss``).
        patience: firings without improvement before stopping, or ``None``.
        mode: ``"min"`` or ``"max"``.
        min_delta: the smallest change that counts as an improvement.
        check_finite: stop when ``monitor`` is NaN or infinite.
        stopping_threshold: stop once ``monitor`` is better than this (needs ``patience``).
        divergence_threshold: stop once ``monitor`` is worse than this (needs
            ``patience``).
    """

    #: stops only from what every rank shares (reduced metrics, its firing)
    may_stop_alone: ClassVar[bool] = False

    def __init__(self, monitor: str = "val/loss", patience: int | None = None,
                 mode: Literal["min", "max"] = "min", min_delta: float = 0.0, *,
                 check_finite: bool = True, stopping_threshold: float | None = None,
                 divergence_threshold: float | None = None) -> None:
        if mode not in ("min", "max"):
            raise ValueError(f"`mode` must be 'min' or 'max', got {mode!r}")
        if patience is not None and (isinstance(patience, bool)
                                     or not isinstance(patience, int) or patience < 1):
            raise ValueError(f"`patience` must be a whole number >= 1 or None, got {patience!r}")
        if not isinstance(check_finite, bool):
            raise ValueError(f"`check_finite` must be True or False, got {check_finite!r}")
        for key, value in (("stopping_threshold", stopping_threshold),
                           ("divergence_threshold", divergence_threshold)):
            if value is None:
                continue
            if (isinstance(value, bool) or not isinstance(value, int | float)
                    or not math.isfinite(value)):
                raise ValueError(f"`{key}` must be a finite number or None, got {value!r}")
            if patience is None:
                raise ValueError(f"`{key}` needs `patience`: without it EarlyStopping stops "
                                 "whenever its trigger fires, and looks at nothing else")
        self.monitor, self.patience, self.mode, self.min_delta = (
            monitor, patience, mode, float(min_delta))
        self.check_finite = check_finite
        self.stopping_threshold = (None if stopping_threshold is None
                                   else float(stopping_threshold))
        self.divergence_threshold = (None if divergence_threshold is None
                                     else float(divergence_threshold))
        self.default_trigger = (plateau(monitor, 3, mode=mode, min_delta=min_delta)  # type: ignore[misc]
                                if patience is None else every("1 epoch"))
        if patience is not None:
            self.needs = (monitor,)
        self.best: float | None = None
        self.wait = 0

    def _trigger(self) -> None:
        where = f"at epoch {self.now.epoch} (step {self.now.step})"
        if self.patience is None:
            _log.info("early_stopping", callback=self.name, step=self.now.step)
            self.trainer.request_stop(f"stopped by {self.name} {where}: {self._why()}")
            return
        got = self.metrics.latest(self.monitor)
        if got is None:
            return
        why = self.check(float(got.value))
        if why is not None:
            _log.info("early_stopping", callback=self.name, step=self.now.step,
                      best=self.best, reason=why)
            self.trainer.request_stop(f"stopped by {self.name} {where}: {why}")

    def check(self, value: float) -> str | None:
        """Count one check of ``monitor`` at ``value``: why training stops now, or ``None``.

        The order is Lightning's: not finite, the stopping threshold, the divergence
        threshold, then ``patience`` checks without a new best."""
        assert self.patience is not None
        self.best, self.wait, why = early_stop(
            value, best=self.best, wait=self.wait, monitor=self.monitor, mode=self.mode,
            min_delta=self.min_delta, patience=self.patience, check_finite=self.check_finite,
            stopping_threshold=self.stopping_threshold,
            divergence_threshold=self.divergence_threshold)
        return why

    def _why(self) -> str:
        """Why its trigger fired, from the metric parts of that trigger."""
        schedule = self.trainer.schedule
        entries = schedule.entries if schedule is not None else ()
        entry = next((e for e in entries if e.callback is self), None)
        todo = [entry.trigger] if entry is not None else []
        while todo:
            t = todo.pop()
            if isinstance(t, Plateau):
                got = self.metrics.latest(t.metric)
                last = f" (last {got.value:.4g})" if got is not None else ""
                return f"{t.metric} did not improve for {t.patience} checks{last}"
            todo.extend(t.children())
        if entry is not None:
            return f"its trigger {entry.trigger!r} fired"
        return "its trigger fired"

    def state_dict(self) -> dict[str, Any]:
        return {"best": self.best, "wait": self.wait}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        # checked whole before any is taken (a crafted one: PartStateError by key)
        best = state_number(state, "best", none=True, real=True)
        # counted up to patience (it stops there)
        wait = state_number(state, "wait", low=0, high=self.patience or MAX_COUNT, whole=True)
        self.best, self.wait = (None if best is None else float(best)), wait


class TerminateOnNaN(Callback):
    """Stop when a training step's loss was NaN or infinite, or an evaluation's loss is.

    Every step's loss is looked at, on the device: the loss keeper finds the first
    non-finite one among the losses it keeps for ``train/loss``, so a quiet step costs
    nothing more and never syncs. That step is read (one sync) when this callback fires:
    by default every 100 steps, at ``eval_end`` and at ``train_end``. The run stops after
    the firing that finds one (its other callbacks still run, a checkpoint of non-finite
    weights never replaces the last finite one), and the stop line names the first bad
    step. At ``eval_end`` it reads the evaluation's ``.../loss`` metrics
    (``InferenceRunner`` names them in the event's payload) and stops when one is not
    finite, naming the evaluation. On several processes the first bad step is the first
    over the ranks, and an evaluation's loss is bad when it is on any rank (one
    collective at each firing), so every rank stops at once.
    """

    #: the loss keeper finds the first non-finite step for it
    watches_loss: ClassVar[bool] = True
    #: decides from what every rank shares: the first bad step over the ranks, whether a
    #: rank's evaluation loss was not finite
    may_stop_alone: ClassVar[bool] = False

    default_trigger: ClassVar[Trigger] = any_of(every("100 steps"), on("eval_end"),
                                                on("train_end"))

    def __init__(self) -> None:
        #: the step at which it found a non-finite loss (``None``: not yet)
        self.triggered_at: int | None = None
        #: the first step whose training loss was not finite, once found
        self.first_bad_step: int | None = None

    def _trigger(self) -> None:
        now = self.now
        where = f"at epoch {now.epoch} (step {now.step})"
        names = self.trainer.payload.get("metrics")
        if names is not None:  # an evaluation ended
            self._check_eval(where, [n for n in names if n.rsplit("/", 1)[-1] == "loss"])
            return
        bad = self.trainer.nonfinite_loss_step()
        if bad is None:
            return
        self.triggered_at, self.first_bad_step = now.step, bad
        _log.warning("nan_loss", callback=self.name, step=now.step, first_bad_step=bad)
        self.trainer.request_stop(f"stopped by {self.name} {where}: the training loss was "
                                  f"not finite at step {bad} (the first such step)")

    def _check_eval(self, where: str, names: list[str]) -> None:
        """At ``eval_end`` the metrics are this rank's (reduced once the evaluation's
        callback returns): the ranks agree whether one saw a non-finite loss."""
        runner = self.trainer.payload.get("evaluation", "the evaluation")
        bad = None
        for name in names:
            got = self.metrics.latest(name)
            if got is not None and not math.isfinite(got.value):
                bad = f"{name} = {got.value}"
                break
        if not self.trainer.any_rank(bad is not None):
            return
        self.triggered_at = self.now.step
        what = bad if bad is not None else "a loss was not finite on another rank"
        _log.warning("nan_eval_loss", callback=self.name, step=self.now.step,
                     evaluation=runner, loss=what)
        self.trainer.request_stop(f"stopped by {self.name} {where}: {what} after the "
                                  f"evaluation {runner!r}")

    def state_dict(self) -> dict[str, Any]:
        return {}
