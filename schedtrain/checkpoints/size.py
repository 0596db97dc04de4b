"""How large one checkpoint of a model and its optimizer will be, before any is written.

``schedtrain plan --import`` multiplies it by the most files a retention policy keeps.
The estimate: the parameters' bytes times 1 + the optimizer's state per parameter
(Adam's two moments: 2; SGD with momentum: 1; plain SGD: 0), the weights and the
optimizer state being most of a checkpoint. The generators, clock and callback states
are small beside them and left out.
"""

from __future__ import annotations

import torch

__all__ = ["estimate_checkpoint_bytes", "optimizer_state_factor"]

#: Optimizer class name -> tensors of state it keeps per parameter, each the parameter's
#: size (``torch.optim``'s algorithms; ``exp_avg``/``exp_avg_sq`` and the like).
_STATE: dict[str, int] = {"Adam": 2, "AdamW": 2, "Adamax": 2, "NAdam": 2, "RAdam": 2,
                          "Adadelta": 2, "Adagrad": 1, "Rprop": 2, "ASGD": 2, "LBFGS": 2}


def optimizer_state_factor(optimizer: torch.optim.Optimizer) -> int:
    """Tensors of optimizer state per parameter, each as large as the parameter."""
    name = type(optimizer).__name__
    defaults = optimizer.defaults
    if name == "SGD":
        return 1 if defaults.get("momentum", 0) else 0
    if name == "RMSprop":
        return 1 + bool(defaults.get("momentum", 0)) + bool(defaults.get("centered", False))
    return _STATE.get(name, 2)  # an unknown optimizer is taken to be Adam-like


def estimate_checkpoint_bytes(model: torch.nn.Module,
                              optimizer: torch.optim.Optimizer | None) -> int:
    """Parameters x bytes each x (1 + the optimizer's state factor), plus buffers."""
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    buffers = sum(b.numel() * b.element_size() for b in model.buffers())
    factor = optimizer_state_factor(optimizer) if optimizer is not None else 0
    return params * (1 + factor) + buffers
