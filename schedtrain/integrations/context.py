"""``HostContext``: the ``TrainingContext`` a host (Lightning, the HF ``Trainer``, Ignite,
a loop of your own) can give a schedtrain ``Callback``.

A callback written for schedtrain's own loop reads the run through ``self.trainer``; inside
a host that is a ``HostContext``, filled from the host's objects: the clock and metric store
of the schedule's driver, the model and optimizer the host trains, its device, precision
and rank. What only schedtrain's ``Trainer`` owns (its checkpoints, the run directory, the
gradient accumulation it steps) is refused: ``check_callback`` does it when the callback is
given to the host, and the context's methods say so if a callback asks anyway.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch

from schedtrain.callbacks.base import BATCH_HOOKS, Callback, overrides
from schedtrain.callbacks.saver import MaxSaver, MinSaver, ModelSaver, TopKSaver
from schedtrain.clock import Clock
from schedtrain.errors import Error
from schedtrain.monitors.store import MetricStore

__all__ = ["HOST_HOOKS", "HostContext", "HostError", "check_callback"]

#: The hooks a host calls (with ``_setup`` and ``_trigger``); a callback overriding another
#: one (the per-step and per-micro-batch hooks schedtrain's own loop calls around the
#: forward, backward and optimizer step) is refused: the host's step is its own.
HOST_HOOKS = ("_before_train", "_after_train", "_before_epoch", "_after_epoch",
              "_trigger_epoch", "_trigger_step", "_before_firings", "_on_exception")
_STEP_HOOKS = ("_before_step", "_after_step", *BATCH_HOOKS, "_after_backward",
               "_before_optimizer_step")
_SAVERS = (ModelSaver, MinSaver, MaxSaver, TopKSaver)


class HostError(Error, ValueError):
    """A schedtrain callback asks a host for what it cannot give."""


def check_callback(name: str, callback: object, host: str, gives: Iterable[str]) -> None:
    """Refuse ``callback`` (bound to ``name``) if it needs what ``host`` cannot give.

    ``gives`` names what the host reports besides the basics: ``"loss"`` (each step's loss,
    for ``watches_loss``), ``"exception"`` (a failed run, for ``_on_exception``).

    Raises:
        HostError: one line naming the callback, what it needs and what to do instead.
    """
    if not isinstance(callback, Callback):
        raise TypeError(f"callback {name!r}: expected a schedtrain Callback, got {callback!r}")
    what = f"callback {name!r} ({type(callback).__name__})"
    if isinstance(callback, _SAVERS):
        raise HostError(f"{what} writes schedtrain checkpoints, which need schedtrain's "
                        f"Trainer; inside {host} bind the schedule to the host's own save "
                        "(docs/integrations.md)")
    if getattr(callback, "sets_grad_accum", False):
        raise HostError(f"{what} changes the gradient accumulation, which {host} sets "
                        "itself; use the host's own setting")
    gives = set(gives)
    if getattr(callback, "watches_loss", False) and "loss" not in gives:
        raise HostError(f"{what} reads each step's training loss, which {host} does not "
                        "show its callbacks")
    for hook in _STEP_HOOKS:
        if overrides(callback, hook):
            raise HostError(f"{what} overrides {hook}, which {host} cannot call (its step is "
                            f"its own); inside a host schedtrain calls _setup, _trigger and "
                            f"{', '.join(h for h in HOST_HOOKS if h != '_on_exception')}")
    if overrides(callback, "_on_exception") and "exception" not in gives:
        raise HostError(f"{what} overrides _on_exception, which {host} cannot call: it does "
                        "not tell its callbacks that training failed")


def _rank() -> int:
    dist = torch.distributed
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


class HostContext:
    """The run as a schedtrain callback sees it inside a host (``TrainingContext``).

    The host fills ``model``, ``optimizer``, ``device``, ``precision``, ``rank`` and
    ``steps_in_epoch`` (``bind``) before training starts, and ``last_loss`` after each step
    where it knows it; the driver owns the clock, the metric store and firing.

    Args:
        host: the host's name, for messages ("Lightning").
        clock: the driver's clock.
        metrics: the driver's metric store (its triggers read it too).
        fire: fires an event on the driver's schedule, returning the names that ran.
    """

    def __init__(self, host: str, clock: Clock, metrics: MetricStore,
                 fire: Callable[[str], tuple[str, ...]]) -> None:
        self.host = host
        self._clock, self._metrics, self._fire = clock, metrics, fire
        self._model: torch.nn.Module | None = None
        self._optimizer: torch.optim.Optimizer | None = None
        self._device: torch.device | None = None
        self.precision = "fp32"
        self.rank = _rank()
        self.steps_in_epoch: int | None = None
        self.last_loss: torch.Tensor | None = None
        self.outcome: str | None = None
        self.payload: dict[str, Any] = {}
        #: why a callback asked training to stop, until the host stopped
        self.stop_reason: str | None = None
        self._bad_step: int | None = None
        #: the schedule the callbacks are in (``EarlyStopping`` names its trigger)
        self.schedule: Any = None
        #: the host's framework holds the run's options and talks with the ranks itself
        self.config: None = None
        self.comm: None = None

    def bind(self, *, model: torch.nn.Module | None = None,
             optimizer: torch.optim.Optimizer | None = None,
             device: torch.device | str | None = None, precision: str | None = None,
             steps_in_epoch: int | None = None, rank: int | None = None) -> None:
        """Set what the host gave (``None`` leaves a value as it is)."""
        if model is not None:
            self._model = model
        if optimizer is not None:
            self._optimizer = optimizer
        if device is not None:
            self._device = torch.device(device)
        if precision is not None:
            self.precision = precision
        if steps_in_epoch is not None:
            self.steps_in_epoch = steps_in_epoch
        if rank is not None:
            self.rank = rank

    # -- what the host gave ------------------------------------------------------------------
    @property
    def model(self) -> torch.nn.Module:
        """The model the host trains."""
        if self._model is None:
            raise HostError(f"a callback read the model, which {self.host} did not give "
                            "(pass model=... where you add the schedule)")
        return self._model

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        """The host's optimizer."""
        if self._optimizer is None:
            raise HostError(f"a callback read the optimizer, which {self.host} did not give "
                            "(pass optimizer=... where you add the schedule)")
        return self._optimizer

    @property
    def device(self) -> torch.device:
        """Where the model is (its first parameter's device), else the CPU."""
        if self._device is not None:
            return self._device
        if self._model is not None:
            for p in self._model.parameters():
                return p.device
        return torch.device("cpu")

    @property
    def metrics(self) -> MetricStore:
        """The driver's metric store: the host's watched metrics and what callbacks put."""
        return self._metrics

    @property
    def clock(self) -> Clock:
        """The driver's clock, on the host's counters."""
        return self._clock

    @property
    def run_dir(self) -> Path | None:
        """``None``: inside a host schedtrain writes no run directory."""
        return None

    @property
    def val_data(self) -> Iterable[Any] | None:
        """``None``: give an evaluating callback its data."""
        return None

    @property
    def loss_fn(self) -> Callable[[Any, Any], torch.Tensor] | None:
        """``None``: the host computes its loss."""
        return None

    # -- the loss --------------------------------------------------------------------------
    def report_loss(self, step: int, loss: Any) -> None:
        """The host's loss of optimizer step ``step`` (kept detached; a non-finite one is
        remembered for ``nonfinite_loss_step``: one sync, done only for a callback whose
        class sets ``watches_loss``)."""
        if not isinstance(loss, torch.Tensor):
            loss = torch.as_tensor(float(loss))
        self.last_loss = loss = loss.detach()
        if self._bad_step is None and not bool(torch.isfinite(loss).all()):
            self._bad_step = step

    def nonfinite_loss_step(self) -> int | None:
        """The first step whose reported loss was NaN or infinite (``None``: none)."""
        return self._bad_step

    def any_rank(self, flag: bool) -> bool:
        """Whether ``flag`` is true on any rank (one collective on several processes)."""
        dist = torch.distributed
        if not (dist.is_available() and dist.is_initialized()):
            return flag
        t = torch.tensor([1.0 if flag else 0.0], device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return bool(t.item())

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        """Autocast in the host's precision (a no-op for fp32)."""
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(self.precision)
        if dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=dtype)

    def to_device(self, batch: Any) -> Any:
        """``batch`` with every tensor moved to the model's device."""
        if isinstance(batch, torch.Tensor):
            return batch.to(self.device)
        if isinstance(batch, dict):
            return {k: self.to_device(v) for k, v in batch.items()}
        if isinstance(batch, list | tuple):
            return type(batch)(self.to_device(v) for v in batch)
        return batch

    # -- what a callback may do ---------------------------------------------------------------
    def fire(self, event: str, **payload: Any) -> tuple[str, ...]:
        """Fire ``event`` (a custom one declared on the schedule, or ``eval_*``) now."""
        outer, self.payload = self.payload, dict(payload)
        try:
            return self._fire(event)
        finally:
            self.payload = outer

    def request_stop(self, reason: str) -> None:
        """Ask the host to stop once the current event is over."""
        if self.stop_reason is None:
            self.stop_reason = reason

    def _owner(self, what: str) -> HostError:
        return HostError(f"a callback called {what}, which needs schedtrain's Trainer; "
                         f"inside {self.host} use the host's own checkpoints")

    def set_grad_accum(self, n: int) -> None:
        """Refused: the host sets its own gradient accumulation."""
        raise HostError(f"a callback called set_grad_accum({n!r}); {self.host} sets its own "
                        "gradient accumulation")

    def save_checkpoint(self, path: str | Path,
                        on_saved: Callable[[Path], None] | None = None) -> None:
        """Refused: schedtrain writes no checkpoints inside a host."""
        raise self._owner("save_checkpoint")

    def load_weights(self, path: str | Path) -> None:
        """Refused, as ``save_checkpoint``."""
        raise self._owner("load_weights")

    def export_checkpoint(self, checkpoint: str | Path, path: str | Path) -> Path | None:
        """Refused, as ``save_checkpoint``."""
        raise self._owner("export_checkpoint")

    def written_checkpoints(self) -> list[Path]:
        """None: schedtrain writes no checkpoints inside a host."""
        return []

    def delete_checkpoint(self, path: str | Path) -> bool:
        """``False``: no checkpoint inside a host is schedtrain's to delete."""
        return False
