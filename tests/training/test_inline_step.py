"""The loop's inline copy of ``PlainStep.run`` (one process, ``(tensor, target)`` pairs)
computes what ``PlainStep.run`` computes: the same losses, weights and counters."""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from training_helpers import Noop, comparable

from schedtrain import Schedule, every
from schedtrain.training import Trainer
from schedtrain.training.steps import PlainStep


class Pair(NamedTuple):
    """A pair the inline path does not take (a tuple subclass): it goes through
    ``PlainStep.run``, the strategy's definition."""

    inputs: torch.Tensor
    targets: torch.Tensor


def _batches(sizes: list[int]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(3)
    out = []
    for n in sizes:
        x = torch.randn(n, 3, generator=g)
        out.append((x, x.sum(1, keepdim=True)))
    return out


def _fit(data: list[Any], epochs: int, tick: int) -> Trainer:
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    trainer = Trainer(model, torch.optim.SGD(model.parameters(), lr=0.05), data,
                      torch.nn.functional.mse_loss,
                      schedule=Schedule({"tick": every(tick, "steps")}),
                      bindings={"tick": Noop()}, max_epochs=epochs, device="cpu",
                      handle_signals=False)
    assert type(trainer._parts.loop.step) is PlainStep  # both runs use the plain strategy
    trainer.fit()
    return trainer


@settings(max_examples=15, deadline=None)
@given(sizes=st.lists(st.integers(1, 5), min_size=1, max_size=12),
       epochs=st.integers(1, 3), tick=st.integers(1, 7))
def test_inline_step_equals_plain_step_run(sizes: list[int], epochs: int, tick: int) -> None:
    """Batches of any sizes (uneven last batch included), through the inline body and
    through ``PlainStep.run``: bit-identical weights and published losses, equal clocks
    (steps, batches, samples, tokens) and firings."""
    data = _batches(sizes)
    inline = _fit(data, epochs, tick)
    defined = _fit([Pair(x, y) for x, y in data], epochs, tick)
    a, b = inline.clock.now(), defined.clock.now()
    assert (a.step, a.batch, a.epoch, a.sample, a.token) == (
        b.step, b.batch, b.epoch, b.sample, b.token)
    assert a.sample == sum(sizes) * epochs
    assert inline.metrics.history("train/loss") == defined.metrics.history("train/loss")
    for p, q in zip(inline.model.parameters(), defined.model.parameters(), strict=True):
        assert torch.equal(p, q)
    assert comparable(inline.firings) == comparable(defined.firings)
