"""``EarlyStopping`` and ``TerminateOnNaN``: end training with ``StopTraining``."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

import structlog
import torch

from schedtrain.callbacks.base import Callback
from schedtrain.triggers import Trigger, every, plateau
from schedtrain.triggers.metric import Plateau, better

__all__ = ["EarlyStopping", "TerminateOnNaN"]

_log = structlog.get_logger("schedtrain.callbacks")


class EarlyStopping(Callback):
    """Stop training.

    Without ``patience`` it stops as soon as it fires: give it a trigger such as
    ``plateau("val/loss", patience=3)`` (its default trigger when none is given); a spec
    whose trigger for it has no metric part is refused, as it would stop at its first
    firing.
    With ``patience`` it counts itself: each time it fires it reads ``monitor``
    and stops after ``patience`` firings without a new best (default trigger:
    every epoch).

    Args:
        monitor: the metric watched (default ``val/loss``).
        patience: firings without improvement before stopping, or ``None``.
        mode: ``"min"`` or ``"max"``.
        min_delta: the smallest change that counts as an improvement.
    """

    #: stops only from what every rank shares (reduced metrics, its firing)
    may_stop_alone: ClassVar[bool] = False

    def __init__(self, monitor: str = "val/loss", patience: int | None = None,
                 mode: Literal["min", "max"] = "min", min_delta: float = 0.0) -> None:
        if mode not in ("min", "max"):
            raise ValueError(f"`mode` must be 'min' or 'max', got {mode!r}")
        if patience is not None and (isinstance(patience, bool)
                                     or not isinstance(patience, int) or patience < 1):
            raise ValueError(f"`patience` must be a whole number >= 1 or None, got {patience!r}")
        self.monitor, self.patience, self.mode, self.min_delta = (
            monitor, patience, mode, float(min_delta))
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
        v = got.value
        if better(v, self.best, self.mode, self.min_delta):
            self.best, self.wait = v, 0
            return
        self.wait += 1
        if self.wait >= self.patience:
            _log.info("early_stopping", callback=self.name, step=self.now.step, best=self.best)
            self.trainer.request_stop(f"stopped by {self.name} {where}: {self.monitor} did "
                                      f"not improve for {self.patience} checks "
                                      f"(best {self.best:.4g})")

    def _why(self) -> str:
        """Why its trigger fired, from the metric parts of that trigger."""
        schedule = getattr(self.trainer, "schedule", None)
        entry = next((e for e in getattr(schedule, "entries", ()) if e.callback is self), None)
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
        self.best, self.wait = state["best"], int(state["wait"])


class TerminateOnNaN(Callback):
    """Stop when the last step's loss is NaN or infinite.

    Reading the loss syncs with the device, so it only looks when fired: by
    default every 100 steps (a NaN poisons the weights, so later losses stay NaN).
    """

    default_trigger: ClassVar[Trigger] = every("100 steps")

    def __init__(self) -> None:
        self.triggered_at: int | None = None

    def _trigger(self) -> None:
        loss = self.trainer.last_loss
        if loss is None:
            return
        if not bool(torch.isfinite(loss).all()):
            self.triggered_at = self.now.step
            _log.warning("nan_loss", callback=self.name, step=self.now.step)
            value = float(loss.float().mean())
            self.trainer.request_stop(f"stopped by {self.name} at epoch {self.now.epoch} "
                                      f"(step {self.now.step}): the training loss is {value}")

    def state_dict(self) -> dict[str, Any]:
        return {}
