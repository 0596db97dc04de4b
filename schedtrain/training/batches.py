"""What a batch reports to the clock, and moving batches to the device.

Counting rule (documented in docs/training.md):

* samples: the length of the first dimension of the batch's first tensor
  (a tensor; the first item of a tuple/list; the first value of a mapping),
  or the batch's ``num_samples`` attribute / key when it has one;
* tokens: the batch's ``num_tokens`` attribute or key (an int or a one-element
  tensor, such as ``attention_mask.sum()``), else its ``"tokens"`` key (an int, or a
  tensor of token ids whose element count is used), else 0.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

__all__ = ["count_batch", "to_device"]


def _first_tensor(batch: Any) -> torch.Tensor | None:
    if isinstance(batch, torch.Tensor):
        return batch
    if isinstance(batch, Mapping):
        for v in batch.values():
            if isinstance(v, torch.Tensor):
                return v
        return None
    if isinstance(batch, list | tuple):
        for v in batch:
            t = _first_tensor(v)
            if t is not None:
                return t
    return None


def _get(batch: Any, name: str) -> Any:
    if isinstance(batch, Mapping):
        return batch.get(name)
    return getattr(batch, name, None)


def _count(value: Any) -> int:
    if isinstance(value, torch.Tensor):
        return value.numel()
    return int(value)


def count_batch(batch: Any) -> tuple[int, int]:
    """``(samples, tokens)`` a micro-batch adds to the clock (see the module doc)."""
    n = _get(batch, "num_samples")
    if n is not None:
        samples = int(n)
    else:
        t = _first_tensor(batch)
        samples = int(t.shape[0]) if t is not None and t.ndim > 0 else 0
    tokens = _get(batch, "num_tokens")
    if tokens is not None:  # a count, also as a tensor (reading it syncs)
        return samples, int(tokens)
    tokens = _get(batch, "tokens") if isinstance(batch, Mapping) else None
    return samples, (_count(tokens) if tokens is not None else 0)


def to_device(batch: Any, device: torch.device) -> Any:
    """``batch`` with every tensor moved to ``device`` (non-blocking)."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, Mapping):
        values = {k: to_device(v, device) for k, v in batch.items()}
        try:
            return type(batch)(values)  # type: ignore[call-arg]
        except TypeError:  # a mapping type not built from a dict (defaultdict...): a dict
            return values
    if isinstance(batch, tuple):
        moved = [to_device(v, device) for v in batch]
        return type(batch)(*moved) if hasattr(batch, "_fields") else tuple(moved)
    if isinstance(batch, list):
        return [to_device(v, device) for v in batch]
    return batch
