"""``train/loss``: the mean step loss since it was last published, summed on the device."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from training_helpers import Noop, tiny_model

from schedtrain import Schedule, every
from schedtrain.training import Trainer
from schedtrain.training.losses import FOLD, LossKeeper


def _data(n: int, batch: int = 2) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(n, batch, 3, generator=g)
    return [(x[i], x[i].sum(1, keepdim=True)) for i in range(n)]


class _RecordingLoss:
    """``mse_loss`` that remembers every value it returned, in order."""

    def __init__(self) -> None:
        self.values: list[float] = []

    def __call__(self, out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        loss = torch.nn.functional.mse_loss(out, target)
        self.values.append(loss.item())
        return loss


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def _fit(steps: int, every_steps: int, **kw: Any) -> tuple[Trainer, _RecordingLoss]:
    model, opt = tiny_model()
    loss = _RecordingLoss()
    trainer = Trainer(model, opt, _data(steps * kw.get("grad_accum", 1)), loss,
                      schedule=Schedule({"tick": every(every_steps, "steps")}),
                      bindings={"tick": Noop()}, max_epochs=1, device="cpu", **kw)
    trainer.fit()
    return trainer, loss


class TestTrainLoss:
    """What the trainer publishes as ``train/loss``, and ``last_loss``."""

    def test_mean_since_last_publication(self) -> None:
        """Published at each firing and at epoch end: the mean of the steps since the last one.

        Over long intervals (1100 steps) the kept losses are summed on the device in
        between; the mean is the same.
        """
        trainer, loss = _fit(2300, 1100)
        v = loss.values
        history = trainer.metrics.history("train/loss")
        assert [step for step, _ in history] == [1100, 2200, 2300]
        expected = [_mean(v[:1100]), _mean(v[1100:2200]), _mean(v[2200:])]
        assert [value for _, value in history] == pytest.approx(expected, rel=1e-5)

    def test_mean_with_gradient_accumulation(self) -> None:
        """Under accumulation a step's loss is the mean of its micro-batches' losses."""
        trainer, loss = _fit(150, 100, grad_accum=2)
        v = loss.values
        steps = [(a + b) / 2 for a, b in zip(v[::2], v[1::2], strict=True)]
        history = trainer.metrics.history("train/loss")
        assert [step for step, _ in history] == [100, 150]
        expected = [_mean(steps[:100]), _mean(steps[100:])]
        assert [value for _, value in history] == pytest.approx(expected, rel=1e-5)

    def test_last_loss_is_the_last_steps_loss(self) -> None:
        """``last_loss`` is the final step's loss, also once it has been published."""
        trainer, loss = _fit(30, 10)
        assert trainer.last_loss is not None
        assert not trainer.last_loss.requires_grad
        assert trainer.last_loss.item() == pytest.approx(loss.values[-1])

    def test_no_loss_before_the_first_step(self) -> None:
        """Before training, ``last_loss`` is ``None`` and nothing is published."""
        model, opt = tiny_model()
        trainer = Trainer(model, opt, _data(3), torch.nn.functional.mse_loss,
                          callbacks=[Noop()], max_epochs=1)
        assert trainer.last_loss is None
        assert "train/loss" not in trainer.metrics

    def test_resume_keeps_the_running_mean(self, tmp_path: Path) -> None:
        """A checkpoint between two publications carries the losses not yet published."""

        class SaveAfterStep7(Noop):
            def _after_step(self, step: int, outputs: Any) -> None:
                if step == 7:
                    self.trainer.save_checkpoint(tmp_path / "ckpt.pt")

        def make() -> Trainer:
            model, opt = tiny_model()
            return Trainer(model, opt, _data(20), torch.nn.functional.mse_loss,
                           schedule=Schedule({"tick": every(10, "steps")}),
                           bindings={"tick": SaveAfterStep7()}, max_steps=10, device="cpu")

        full = make()
        full.fit()
        resumed = make()
        resumed.resume(tmp_path / "ckpt.pt")
        resumed.fit()
        (step, value), = full.metrics.history("train/loss")
        assert resumed.metrics.history("train/loss") == [(step, pytest.approx(value, rel=1e-6))]


# Long enough for several folds of FOLD steps.
MAX_STEPS = 3 * FOLD


@settings(max_examples=60, deadline=None)
@given(losses=st.lists(st.floats(-1e6, 1e6, width=32), min_size=1, max_size=MAX_STEPS),
       dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float64]),
       published=st.integers(0, MAX_STEPS - 1))
def test_the_number_agreed_across_ranks_is_the_mean_publish_would_put(
        losses: list[float], dtype: torch.dtype, published: int) -> None:
    """On several processes each rank sends ``host_mean`` in the step's agreement; it must
    be exactly what ``publish`` computes, folded or not, so one process and many (and a
    resumed run, which may take the other path) put the same ``train/loss``."""
    class Put:
        """Keeps what is put, as it is put (the store may narrow it when it flushes)."""

        def __init__(self) -> None:
            self.values: list[Any] = []

        def put(self, name: str, value: Any) -> None:
            self.values.append(value)

    keeper, split = LossKeeper(), min(published, len(losses) - 1)
    for step, value in enumerate(losses, 1):
        keeper.losses.append(torch.tensor(value, dtype=dtype))
        if keeper.kept >= FOLD:
            keeper.fold()
        if step == split:
            keeper.publish(Put(), step)  # type: ignore[arg-type]
    expected = keeper.host_mean(len(losses))
    put = Put()
    keeper.publish(put, len(losses))  # type: ignore[arg-type]
    assert expected is not None and len(put.values) == 1
    assert float(put.values[0]) == expected


@settings(max_examples=60, deadline=None)
@given(losses=st.lists(st.floats(-1e6, 1e6, width=32), min_size=1, max_size=MAX_STEPS),
       as_number=st.lists(st.booleans(), min_size=MAX_STEPS, max_size=MAX_STEPS),
       cut=st.integers(0, MAX_STEPS - 1))
def test_losses_kept_as_numbers_sum_as_tensors_do(losses: list[float], as_number: list[bool],
                                                   cut: int) -> None:
    """The plain CPU step keeps float32 losses as numbers, other steps as tensors (after
    settling the numbers, as the loop does), and a resumed run may get either back: every
    mix publishes the same ``train/loss``, to the bit, and a checkpoint of the keeper
    holds the same tensors."""

    class Put:
        def __init__(self) -> None:
            self.values: list[Any] = []

        def put(self, name: str, value: Any) -> None:
            self.values.append(value)

    def run(numbers: bool) -> tuple[list[float], dict[str, Any]]:
        keeper, put, state = LossKeeper(), Put(), None
        for step, value in enumerate(losses, 1):
            if numbers and as_number[step - 1]:
                keeper.numbers.append(value)
            else:
                if keeper.numbers:
                    keeper.settle()
                keeper.losses.append(torch.tensor(value, dtype=torch.float32))
            if keeper.kept >= FOLD:
                keeper.fold(step)
            if step == cut:  # a checkpoint, restored into a new keeper
                state = keeper.state_dict()
                keeper = LossKeeper()
                keeper.load_state_dict(state)
        keeper.publish(put, len(losses))  # type: ignore[arg-type]
        return [float(v) for v in put.values], state or {}

    (tensors, state_t), (mixed, state_m) = run(False), run(True)
    assert tensors == mixed
    for key in ("sum", "kept", "last"):
        a, b = state_t.get(key), state_m.get(key)
        assert (a is None) == (b is None)
        if a is not None:
            assert torch.equal(a, b) and a.dtype == b.dtype and a.shape == b.shape
