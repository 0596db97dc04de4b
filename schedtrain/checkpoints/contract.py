"""What the checkpoint owner needs from the run (``RunParts``), the saves it keeps, and
how a failed write is reported (named and placed at the save)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import torch

from schedtrain.checkpoints.format import CheckpointError
from schedtrain.errors import locate_failure

__all__ = ["Landing", "RunParts", "Save", "cause", "failure"]

#: A save asked for during an event: where, and who to tell the path written.
Save = tuple[Path, Callable[[Path], None] | None]
#: A checkpoint being written in the background: path, phase, step, epoch, who to tell.
Landing = tuple[Path, str, int, int, Callable[[Path], None] | None]


def cause(exc: BaseException) -> str:
    """A write's failure in a few words: the OS error's own, or torch's first line."""
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    text = str(exc).strip()
    if "unexpected pos" in text or "write" in text.lower():
        return "the file could not be written in full: the disk is full or a size limit hit"
    return (text.splitlines() or [type(exc).__name__])[0][:200]


def failure(exc: BaseException, landing: Landing) -> CheckpointError:
    """A write's failure as the checkpoint's own error, placed at the save."""
    path, phase, step, epoch, _ = landing
    if isinstance(exc, CheckpointError):
        failed = exc
    else:
        failed = CheckpointError(path, f"could not be written ({cause(exc)}); the "
                                       "previous checkpoints are as they were")
    locate_failure(failed, f"the checkpoint write after step {step} "
                           f"(epoch {epoch}, {phase})")
    return failed


class RunParts(Protocol):
    """What a checkpoint holds of the run besides its weights, and how it is put back."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scaler: Any

    def position(self) -> tuple[int, int]:
        """The clock's ``(step, epoch)`` now."""

    def last_loss(self) -> torch.Tensor | None:
        """The last step's loss (its finiteness goes into the checkpoint)."""

    def data_state(self) -> Any:
        """This rank's position in the data."""

    def capture(self) -> dict[str, Any]:
        """The run's state (the checkpoint's ``run`` key) now."""

    def validate(self, path: Path | str, run: dict[str, Any]) -> None:
        """Refuse a ``run`` whose fields are of the wrong type or out of bounds
        (``readback.DamagedFile``, by key path), before anything is restored."""

    def check(self, path: Path | str, run: dict[str, Any],
              exists: Callable[[list[Path]], list[Path]] | None = None) -> None:
        """Refuse a checkpoint this run cannot continue (``ValueError``); ``exists``:
        which of the given files the checkpoint storage holds now."""

    def restore(self, run: dict[str, Any], rng: Any, data: Any) -> None:
        """Put the run's state back, with this rank's generators and data position."""
