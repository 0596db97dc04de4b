"""A ``[run]`` key's problem as TOML and as the Trainer's keyword report it, for the tests
that check one rule set gives both the same refusal."""

from __future__ import annotations

from typing import Any

import torch

from schedtrain.errors import SpecError
from schedtrain.spec import loads_spec
from schedtrain.training import Trainer

__all__ = ["python_problem", "toml_problem"]


def toml_problem(key: str, toml_value: str) -> str | None:
    """The message of the first problem at ``run.<key>``, without file and path."""
    text = (f'[run]\ntask = "m:f"\nrun_dir = "r"\n{key} = {toml_value}\n'
            '[callbacks.a]\ntrigger = { every = "1 step" }\n')
    try:
        loads_spec(text)
    except SpecError as exc:
        found = [p for p in exc.problems if p.path.startswith(f"run.{key}")]
        return f"`{found[0].path.removeprefix('run.')}`: {found[0].message}" if found else None
    return None


def python_problem(key: str, value: Any) -> str | None:
    """The message ``Trainer(..., key=value)`` raises, or None."""
    model = torch.nn.Linear(1, 1)
    try:
        Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1),
                [(torch.zeros(1, 1), torch.zeros(1, 1))], torch.nn.functional.mse_loss,
                handle_signals=False, **{"device": "cpu", "max_epochs": 1, key: value})
    except (TypeError, ValueError) as exc:
        return str(exc)
    return None
