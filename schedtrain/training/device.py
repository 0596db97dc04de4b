"""The torch side of a ``RunConfig``: its device resolved, its precision's autocast."""

from __future__ import annotations

import contextlib
from typing import Any

import torch

__all__ = ["autocast", "resolve_device"]


def resolve_device(device: str | torch.device) -> torch.device:
    """``"auto"`` is CUDA when present, else the CPU; other names as torch reads them."""
    if isinstance(device, torch.device):
        return device
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        return torch.device(device)
    except RuntimeError:
        raise ValueError(f"`device` must be 'auto', 'cpu', 'cuda' or 'cuda:N', got "
                         f"{device!r}") from None


def autocast(precision: str, device: torch.device) -> contextlib.AbstractContextManager[Any]:
    """The autocast context of ``precision`` on ``device`` (a no-op for fp32)."""
    if precision == "fp32":
        return contextlib.nullcontext()
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    return torch.autocast(device.type, dtype=dtype)
