"""``TrainingContext``: what a callback may read and do while training runs.

Callbacks see the loop only through this protocol (``self.trainer`` in a callback), so
they do not depend on the concrete ``Trainer``, and a test can drive a callback with a
small stand-in. It lists what callbacks need, read-only unless a method says otherwise.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Protocol

import torch

from schedtrain.clock import Clock
from schedtrain.distributed.comm import Comm
from schedtrain.monitors.store import MetricStore
from schedtrain.schedule.schedule import Schedule
from schedtrain.spec.run import RunConfig

__all__ = ["TrainingContext"]


class TrainingContext(Protocol):
    """The training loop, as a callback sees it."""

    @property
    def model(self) -> torch.nn.Module:
        """The model being trained."""

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        """Its optimizer."""

    @property
    def metrics(self) -> MetricStore:
        """The metric store: ``put``, ``latest``, ``history``."""

    @property
    def clock(self) -> Clock:
        """The loop's clock (read ``now()``; only the loop advances it)."""

    @property
    def device(self) -> torch.device:
        """Where the model trains."""

    @property
    def precision(self) -> str:
        """``"fp32"``, ``"bf16"`` or ``"fp16"``."""

    @property
    def run_dir(self) -> Path | None:
        """The run directory (``None``: nothing is written)."""

    @property
    def val_data(self) -> Iterable[Any] | None:
        """Validation batches, if any."""

    @property
    def loss_fn(self) -> Callable[[Any, Any], torch.Tensor] | None:
        """The training loss function, if the run has one."""

    @property
    def steps_in_epoch(self) -> int | None:
        """Optimizer steps per epoch, when the data has a length."""

    @property
    def rank(self) -> int:
        """This process's rank (0 without ``torch.distributed``)."""

    @property
    def last_loss(self) -> torch.Tensor | None:
        """The last optimizer step's loss, detached and on the device."""

    def nonfinite_loss_step(self) -> int | None:
        """The first step whose training loss was NaN or infinite (``None``: none), kept
        for a callback whose class sets ``watches_loss``; reading it syncs. On several
        processes, the first over the ranks: every rank must ask at the same point."""

    def any_rank(self, flag: bool) -> bool:
        """Whether ``flag`` is true on any rank, the same answer on all (on several
        processes one collective: every rank must ask at the same point)."""

    @property
    def config(self) -> RunConfig | None:
        """The run's options (``None`` in a host, whose framework holds its own)."""

    @property
    def schedule(self) -> Schedule | None:
        """The schedule the callbacks are in (``None`` where there is none to read)."""

    @property
    def comm(self) -> Comm | None:
        """How this process talks with the other ranks (``None``: one process, or a host)."""

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        """The autocast context of the run's precision (a no-op for fp32)."""

    def to_device(self, batch: Any) -> Any:
        """``batch`` with every tensor moved to the training device."""

    def fire(self, event: str, **payload: Any) -> tuple[str, ...]:
        """Fire an event now: a declared custom event, or ``eval_start``,
        ``eval_step_start``, ``eval_step_end``, ``eval_end``; returns the names of the
        callbacks that ran."""

    def request_stop(self, reason: str) -> None:
        """End training after the current event, as ``StopTraining`` does, saying why."""

    @property
    def payload(self) -> dict[str, Any]:
        """The keyword arguments of the event being fired (``fire(event, value=...)``)."""

    def set_grad_accum(self, n: int) -> None:
        """Micro-batches per optimizer step from the epoch about to start (call it before
        the epoch, from ``_before_epoch``; the callback's class sets ``sets_grad_accum``)."""

    def save_checkpoint(self, path: str | Path,
                        on_saved: Callable[[Path], None] | None = None) -> None:
        """Write a resumable checkpoint to ``path`` once the current event is over."""

    def load_weights(self, path: str | Path) -> None:
        """Load the model and optimizer states of a checkpoint (checked), nothing else."""

    def export_checkpoint(self, checkpoint: str | Path, path: str | Path) -> Path | None:
        """With ``export``: a written checkpoint's weights also as safetensors at ``path``."""

    @property
    def outcome(self) -> str | None:
        """How the run ended, in ``after_train``: ``"finished"``, ``"stopped"``,
        ``"failed"`` or ``"preempted"`` (``None`` while it runs)."""

    def written_checkpoints(self) -> list[Path]:
        """Checkpoints this run wrote (across resumes), oldest first."""

    def delete_checkpoint(self, path: str | Path) -> bool:
        """Delete a checkpoint this run wrote (pruning); another path is left alone.
        Returns whether it was one of this run's."""
