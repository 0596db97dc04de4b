"""What a hyper-parameter setter may set: the rule ``ScheduledHyperParamSetter`` and
``HumanHyperParamSetter`` share, and that ``check --import`` and ``train`` apply to the
built optimizer before training."""

from __future__ import annotations

import math
import numbers
from typing import Any

import torch

__all__ = ["numeric_params", "param_problem", "value_problem"]


def _numeric(value: object) -> bool:
    if isinstance(value, torch.Tensor):
        return value.numel() == 1 and value.is_floating_point()
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def numeric_params(optimizer: torch.optim.Optimizer) -> list[str]:
    """The keys every param group of ``optimizer`` holds a number under (``lr``, ...)."""
    groups = optimizer.param_groups
    keys = set.intersection(*(set(g) for g in groups)) if groups else set()
    return sorted(k for k in keys if all(_numeric(g[k]) for g in groups))


def param_problem(optimizer: torch.optim.Optimizer, param: str) -> str | None:
    """Why ``param`` is not a numeric hyper-parameter of every param group of
    ``optimizer`` (``"params"``, ``"betas"``, a missing key), or ``None`` when it is."""
    for i, group in enumerate(optimizer.param_groups):
        if param not in group:
            return (f"optimizer param group {i} has no {param!r}; its numeric "
                    f"hyper-parameters are {numeric_params(optimizer)}")
        if not _numeric(group[param]):
            return (f"{param!r} of optimizer param group {i} is not a number (it holds "
                    f"{type(group[param]).__name__}); a setter sets one of "
                    f"{numeric_params(optimizer)}")
    return None


def value_problem(optimizer: torch.optim.Optimizer, value: Any) -> str | None:
    """Why the optimizer could not use ``value``: not finite, or too large for its
    parameters' dtype (the step would fail converting it); ``None`` when it can."""
    if not isinstance(value, float) or not math.isfinite(value):
        return f"{value!r} is not a finite number"
    for group in optimizer.param_groups:
        for p in group["params"]:
            if p.is_floating_point() and abs(value) > torch.finfo(p.dtype).max:
                return (f"{value!r} is larger than the model's {p.dtype} parameters can "
                        f"take ({torch.finfo(p.dtype).max:.4g})")
    return None
