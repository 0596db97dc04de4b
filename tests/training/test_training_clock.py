"""The clock the loop drives: what it counts, and when code inside a step can read it."""

from __future__ import annotations

from typing import Any, NamedTuple

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from training_helpers import Noop, comparable, tiny_model

from schedtrain import Schedule, every, simulate
from schedtrain.clock import LoopClock
from schedtrain.training import Trainer


class _TokenBatches:
    """Dict batches of ``batch`` samples that report ``tokens`` tokens each."""

    def __init__(self, n: int, batch: int = 2, tokens: int = 7) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, batch, 3, generator=g)
        self.tokens = tokens

    def __len__(self) -> int:
        return len(self.x)

    def __iter__(self) -> Any:
        for x in self.x:
            yield {"x": x, "y": x.sum(1, keepdim=True), "num_tokens": self.tokens}


def _step(model: torch.nn.Module, batch: dict[str, Any]) -> torch.Tensor:
    return torch.nn.functional.mse_loss(model(batch["x"]), batch["y"])


class TestCounting:
    """Samples and tokens reach the clock as the batches report them."""

    @pytest.mark.parametrize("accum", [1, 2])
    def test_token_and_sample_triggers_fire_as_simulated(self, accum: int) -> None:
        """Token and sample periods fire where simulate() says, with and without accumulation."""
        schedule = Schedule({"tok": every("30 tokens"), "smp": every("10 samples"),
                             "ep": every("1 epoch")})
        expected = simulate(schedule, epochs=2, steps_per_epoch=6, batches_per_step=accum,
                            samples_per_batch=2, tokens_per_batch=7)
        model, opt = tiny_model()
        trainer = Trainer(model, opt, _TokenBatches(6 * accum), step_fn=_step,
                          schedule=schedule, bindings={n: Noop() for n in schedule.names},
                          max_epochs=2, grad_accum=accum)
        trainer.fit()
        assert comparable(trainer.firings) == comparable(expected)
        assert (trainer.clock.sample, trainer.clock.token) == (24 * accum, 84 * accum)


class _Pair(NamedTuple):
    """An ``(inputs, targets)`` pair that reports its tokens (two per target row)."""

    inputs: torch.Tensor
    targets: torch.Tensor

    @property
    def num_tokens(self) -> int:
        return 2 * len(self.targets)


class TestNamedTuplePairs:
    """A NamedTuple (inputs, targets) batch trains with ``loss_fn`` and reports its tokens."""

    @pytest.mark.parametrize("clip", [None, 1.0], ids=["plain-step", "general-step"])
    def test_tokens_counted_on_both_step_paths(self, clip: float | None) -> None:
        """Token periods fire as simulated whether or not the run takes the plain step."""
        data = [_Pair(x, x.sum(1, keepdim=True)) for x in _TokenBatches(5, batch=3).x]
        schedule = Schedule({"tok": every("8 tokens")})
        expected = simulate(schedule, epochs=2, steps_per_epoch=5, samples_per_batch=3,
                            tokens_per_batch=6)
        model, opt = tiny_model()
        trainer = Trainer(model, opt, data, torch.nn.functional.mse_loss, schedule=schedule,
                          bindings={"tok": Noop()}, max_epochs=2, grad_clip=clip)
        trainer.fit()
        assert comparable(trainer.firings) == comparable(expected)
        assert (trainer.clock.sample, trainer.clock.token) == (30, 60)


class TestReadingTheClock:
    """Code inside a step, and callbacks, see the clock up to date."""

    def test_step_fn_sees_completed_steps(self) -> None:
        """A ``step_fn`` reading the trainer's clock sees every step completed before it."""
        seen: list[tuple[int, int]] = []
        holder: dict[str, Trainer] = {}

        def step(model: torch.nn.Module, batch: Any) -> torch.Tensor:
            clock = holder["t"].clock
            seen.append((clock.step, clock.sample))
            x, y = batch
            return torch.nn.functional.mse_loss(model(x), y)

        model, opt = tiny_model()
        x = torch.randn(10, 2, 3)
        holder["t"] = Trainer(model, opt, [(xi, xi.sum(1, keepdim=True)) for xi in x],
                              step_fn=step, callbacks=[Noop()], max_epochs=2)
        holder["t"].fit()
        assert seen == [(i, 2 * i) for i in range(20)]

    def test_callbacks_see_the_clock_at_their_firing(self) -> None:
        """With ``loss_fn`` the loop counts in local variables; a firing callback still sees
        the clock exactly at its step, the previous step end included."""
        got: list[tuple[int, int, int, int]] = []

        class Look(Noop):
            def _trigger(self) -> None:
                prev = self.trainer.clock.previous("step_end")
                got.append((self.now.step, self.now.sample, prev.step, prev.sample))

        model, opt = tiny_model()
        x = torch.randn(10, 3, 3)
        trainer = Trainer(model, opt, [(xi, xi.sum(1, keepdim=True)) for xi in x],
                          torch.nn.functional.mse_loss,
                          schedule=Schedule({"look": every("4 steps")}),
                          bindings={"look": Look()}, max_epochs=2)
        trainer.fit()
        assert got == [(4, 12, 3, 9), (8, 24, 7, 21), (12, 36, 11, 33), (16, 48, 15, 45),
                       (20, 60, 19, 57)]
        assert (trainer.clock.step, trainer.clock.batch, trainer.clock.sample) == (20, 20, 60)


class TestCatchUp:
    """``LoopClock.catch_up`` equals one ``end_batch``/``end_step`` pair per step."""

    @settings(max_examples=50, deadline=None)
    @given(st.lists(st.tuples(st.integers(1, 3), st.integers(0, 5), st.integers(0, 9)),
                    min_size=1, max_size=12), st.integers(1, 4))
    def test_equals_step_by_step(self, steps: list[tuple[int, int, int]], every_k: int) -> None:
        """Counters and the previous step end agree, catching up every ``every_k`` steps
        (each step of one to three micro-batches)."""
        one, lazy = LoopClock(), LoopClock()
        step, batch, sample, token = 0, 0, 0, 0
        prev_sample = prev_token = 0
        time = prev_time = None
        for i, (micro, n, tk) in enumerate(steps, start=1):
            for _ in range(micro):
                one.end_batch(n, tk)
            one.end_step()
            prev_sample, prev_token = sample, token
            step, batch = step + 1, batch + micro
            sample, token = sample + micro * n, token + micro * tk
            prev_time, time = time, i
            if i % every_k == 0 or i == len(steps):
                lazy.catch_up(step, batch=batch, sample=sample, token=token,
                              prev_sample=prev_sample, prev_token=prev_token,
                              prev_time=prev_time, time=time)
                a, b = one.now(), lazy.now()
                assert (a.step, a.batch, a.step_in_epoch, a.sample, a.token) == \
                    (b.step, b.batch, b.step_in_epoch, b.sample, b.token)
                pa, pb = one.previous("step_end"), lazy.previous("step_end")
                assert (pa.step, pa.sample, pa.token) == (pb.step, pb.sample, pb.token)

    def test_nothing_new_changes_nothing(self) -> None:
        """Catching up to the step the clock already holds is a no-op."""
        clock = LoopClock()
        clock.end_batch(3)
        clock.end_step()
        before = (clock.now(), clock.previous("step_end"))
        clock.catch_up(1, batch=99, sample=99, token=99, prev_sample=99, prev_token=99,
                       prev_time=1, time=2)
        assert (clock.now(), clock.previous("step_end")) == before
