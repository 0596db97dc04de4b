"""Checking the trainer's options: each bad one is refused with its name and what was wrong."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Final

import attrs
import torch

__all__ = ["PRECISIONS", "Options", "StepFn"]

PRECISIONS: Final = ("fp32", "bf16", "fp16")

StepFn = Callable[[torch.nn.Module, Any], "torch.Tensor | Mapping[str, Any]"]


def _positive(name: str, value: int | None, *, allow_none: bool) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"`{name}` must be a whole number >= 1"
                         f"{' or None' if allow_none else ''}, got {value!r}")


@attrs.frozen
class Options:
    """The checked options that shape a run's loop."""

    max_epochs: int | None
    max_steps: int | None
    precision: str
    grad_accum: int
    grad_clip: float | None

    @classmethod
    def check(cls, *, loss_fn: object, step_fn: object, max_epochs: int | None,
              max_steps: int | None, precision: str, grad_accum: int,
              grad_clip: float | None) -> Options:
        """Refuse a bad combination with the argument's name (``TypeError``/``ValueError``)."""
        if (loss_fn is None) == (step_fn is None):
            raise TypeError("give exactly one of `loss_fn` and `step_fn`")
        if max_epochs is None and max_steps is None:
            raise ValueError("give `max_epochs` or `max_steps` (or both): training must end")
        _positive("max_epochs", max_epochs, allow_none=True)
        _positive("max_steps", max_steps, allow_none=True)
        _positive("grad_accum", grad_accum, allow_none=False)
        if precision not in PRECISIONS:
            raise ValueError(f"`precision` must be one of {PRECISIONS}, got {precision!r}")
        if grad_clip is not None and not grad_clip > 0:
            raise ValueError(f"`grad_clip` must be > 0 or None, got {grad_clip!r}")
        return cls(max_epochs, max_steps, precision, grad_accum, grad_clip)

    @staticmethod
    def resolve_device(device: str | torch.device) -> torch.device:
        """``"auto"`` is CUDA when present, else the CPU."""
        if isinstance(device, torch.device):
            return device
        if device == "auto":
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        try:
            return torch.device(device)
        except RuntimeError:
            raise ValueError(f"`device` must be 'auto', 'cpu', 'cuda' or 'cuda:N', got "
                             f"{device!r}") from None
