"""Tiny models, data and recording callbacks for the training-loop tests."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import attrs
import torch

from schedtrain.callbacks import Callback
from schedtrain.simulation import Firing

torch.set_num_threads(1)


class Noop(Callback):
    """Does nothing when fired (the trainer records the firing)."""


class UnevenData:
    """An iterable of unknown length whose e-th pass yields ``lengths[e]`` batches."""

    def __init__(self, lengths: Sequence[int], batch_size: int = 2, seed: int = 0) -> None:
        self.lengths = list(lengths)
        self.batch_size = batch_size
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(max(self.lengths) * batch_size, 3, generator=g)
        self.y = self.x.sum(1, keepdim=True)
        self.passes = 0

    def __iter__(self) -> Iterator[Any]:
        n = self.lengths[min(self.passes, len(self.lengths) - 1)]
        self.passes += 1
        b = self.batch_size
        for i in range(n):
            yield self.x[i * b:(i + 1) * b], self.y[i * b:(i + 1) * b]


def tiny_model() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """A 3 -> 1 linear model and SGD."""
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    return model, torch.optim.SGD(model.parameters(), lr=0.01)


def comparable(firings: Sequence[Firing]) -> list[tuple[str, str, Any]]:
    """Firings without wall time (real seconds never equal simulated ones)."""
    return [(f.callback, f.event, attrs.evolve(f.timestamp, time_ns=0)) for f in firings]


def as_if_killed(run_dir: Path) -> None:
    """``run_dir``'s run.json as a run killed after its last step, before it recorded how
    it ended (a resume then goes on from a checkpoint; a run recorded as ended has nothing
    left to do)."""
    path = run_dir / "run.json"
    state = json.loads(path.read_text())
    path.write_text(json.dumps({**state, "status": "running"}))
