"""What hooks receive: one optimizer step's outputs, one micro-batch, the fetches a
``before_step`` hook asks for. Tensors stay on the device (reading them syncs)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import attrs
import torch

__all__ = ["BatchInfo", "Fetches", "StepOutputs"]

Fetches = Mapping[str, Callable[[], Any]]
"""What a ``before_step`` hook asks the step for: name -> a function evaluated right after
the step's backward (gradients present), its result delivered to ``after_step``."""


@attrs.frozen
class StepOutputs:
    """What one optimizer step produced; tensors stay on the device (reading them syncs).

    Args:
        loss: the mean loss over the step's micro-batches, detached.
        outputs: the step function's outputs of the last micro-batch, detached.
        batch: the step's first micro-batch, as the data gave it.
        fetched: what ``before_step`` hooks asked for, by name.
    """

    loss: torch.Tensor
    outputs: Mapping[str, Any]
    batch: Any = None
    fetched: Mapping[str, Any] = attrs.field(factory=dict)


@attrs.frozen
class BatchInfo:
    """One micro-batch, as the per-micro-batch hooks and the ``batch_start`` /
    ``batch_end`` events' payload see it.

    Args:
        batch: the micro-batch as the data gave it (not moved to the device).
        index: its 0-based index in the epoch, counted in micro-batches.
        step: the 1-based optimizer step it belongs to.
        accum_index: its 0-based place in that step's accumulation (0 to grad_accum - 1).
        loss: its loss, detached on the device; ``None`` before its forward.
    """

    batch: Any
    index: int
    step: int
    accum_index: int
    loss: torch.Tensor | None = None
