"""Per-micro-batch hooks and the batch events' payloads, as Lightning and
pytorch-accelerated users rely on them (on_train_batch_start/end, on_before_backward,
on_after_backward, on_train_step_start/end).

Under ``grad_accum = N`` the micro-batch hooks run N times per optimizer step, in the
order forward -> before_backward -> backward -> after_batch; the per-step hooks keep
running once per step around them.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from training_helpers import UnevenData, tiny_model

from schedtrain import Schedule, Scheduled, every, on
from schedtrain.callbacks import BatchInfo, Callback, StepOutputs
from schedtrain.schedule import EnableCallbackIf
from schedtrain.training import Trainer
from schedtrain.training.steps import PlainStep, Step

mse = torch.nn.functional.mse_loss


class Recorder(Callback):
    """Every per-step and per-micro-batch hook, with what it was given."""

    def __init__(self) -> None:
        self.log: list[tuple[Any, ...]] = []

    def _before_step(self, step: int, batch: Any) -> None:
        self.log.append(("before_step", step))

    def _before_batch(self, info: BatchInfo) -> None:
        self.log.append(("before_batch", info.step, info.index, info.accum_index,
                         info.loss is None, self.now.batch))

    def _before_backward(self, info: BatchInfo) -> None:
        grads = [p.grad for p in self.model.parameters()]
        self.log.append(("before_backward", info.step, info.index, info.accum_index,
                         info.loss is not None, all(g is None for g in grads)
                         if info.accum_index == 0 else True))

    def _after_batch(self, info: BatchInfo) -> None:
        self.log.append(("after_batch", info.step, info.index, info.accum_index,
                         self.now.batch))

    def _after_backward(self, step: int) -> None:
        self.log.append(("after_backward", step))

    def _after_step(self, step: int, outputs: StepOutputs) -> None:
        self.log.append(("after_step", step))


def _expected(lengths: list[int], accum: int) -> list[tuple[Any, ...]]:
    """The hook sequence for epochs of ``lengths`` micro-batches: the last step of an
    epoch takes what is left (a short accumulation)."""
    out: list[tuple[Any, ...]] = []
    step = batches = 0
    for n in lengths:
        for first in range(0, n, accum):
            step += 1
            out.append(("before_step", step))
            for k in range(min(accum, n - first)):
                index = first + k
                out.append(("before_batch", step, index, k, True, batches))
                out.append(("before_backward", step, index, k, True, True))
                batches += 1
                out.append(("after_batch", step, index, k, batches))
            out.append(("after_backward", step))
            out.append(("after_step", step))
    return out


class TestMicroBatchHooks:
    """_before_batch, _before_backward and _after_batch run once per micro-batch."""

    @settings(max_examples=30, deadline=None)
    @given(st.lists(st.integers(1, 7), min_size=1, max_size=3), st.integers(1, 4))
    def test_order_under_accumulation(self, lengths: list[int], accum: int) -> None:
        """For any grad_accum and epoch lengths: each micro-batch's hooks in order, its
        index in the epoch, the step it belongs to and its place in the accumulation;
        gradients are fresh before the first micro-batch's backward; the clock counts each
        micro-batch as it ends."""
        cb = Recorder()
        model, opt = tiny_model()
        Trainer(model, opt, UnevenData(lengths), mse, callbacks=[cb],
                max_epochs=len(lengths), grad_accum=accum).fit()
        assert cb.log == _expected(lengths, accum)

    def test_loss_is_the_micro_batch_loss_detached(self) -> None:
        """info.loss is the micro-batch's own loss (not divided by grad_accum), detached."""
        seen: list[tuple[float, float, bool]] = []

        class Check(Callback):
            def _before_batch(self, info: BatchInfo) -> None:
                inputs, targets = info.batch
                with torch.no_grad():
                    self.want = float(mse(self.model(inputs), targets))

            def _before_backward(self, info: BatchInfo) -> None:
                assert info.loss is not None
                seen.append((float(info.loss), self.want, info.loss.requires_grad))

        model, opt = tiny_model()
        Trainer(model, opt, UnevenData([6]), mse, callbacks=[Check()], max_epochs=1,
                grad_accum=3).fit()
        assert len(seen) == 6
        assert all(got == pytest.approx(want) and not grad for got, want, grad in seen)

    def test_gated_hooks_follow_the_gate(self) -> None:
        """EnableCallbackIf closes the micro-batch hooks as it closes the others."""
        cb = Recorder()
        model, opt = tiny_model()
        Trainer(model, opt, UnevenData([4]), mse, max_epochs=1, grad_accum=2,
                callbacks=[EnableCallbackIf(cb, lambda c: c.now.step >= 1)]).fit()
        assert [e[1] for e in cb.log if e[0] == "after_batch"] == [2, 2]


class TestBatchEventPayloads:
    """batch_start and batch_end carry the micro-batch, its index and its loss."""

    def test_payloads_per_micro_batch(self) -> None:
        """Under grad_accum = 2 each micro-batch fires batch_start (loss None) then
        batch_end (its loss), with the very batch object the data gave."""
        data = UnevenData([4, 4])
        given: list[Any] = []
        got: list[tuple[str, int, bool, bool, int]] = []

        class Spy:
            def __iter__(self) -> Any:
                for b in data:
                    given.append(b)
                    yield b

        def note(t: Trainer, event: str) -> None:
            p = t.payload
            got.append((event, p["index"], p["loss"] is None,
                        any(p["batch"] is b for b in given), t.clock.batch))

        schedule = Schedule([Scheduled(on("batch_start"), lambda t: note(t, "start"), "s"),
                             Scheduled(on("batch_end"), lambda t: note(t, "end"), "e")])
        model, opt = tiny_model()
        Trainer(model, opt, Spy(), mse, schedule=schedule, max_epochs=2, grad_accum=2).fit()
        want = []
        for batches, index in enumerate([0, 1, 2, 3, 0, 1, 2, 3]):
            want += [("start", index, True, True, batches), ("end", index, False, True,
                                                             batches + 1)]
        assert got == want

    def test_batch_end_loss_matches_before_backward(self) -> None:
        """The batch_end payload's loss is the one before_backward saw."""
        losses: list[torch.Tensor] = []

        class Keep(Callback):
            def _before_backward(self, info: BatchInfo) -> None:
                assert info.loss is not None
                losses.append(info.loss)

        ends: list[torch.Tensor] = []
        schedule = Schedule([Scheduled(every("1 epoch"), Keep(), "k"),
                             Scheduled(on("batch_end"), lambda t: ends.append(
                                 t.payload["loss"]), "e")])
        model, opt = tiny_model()
        Trainer(model, opt, UnevenData([3]), mse, schedule=schedule, max_epochs=1).fit()
        assert ends == losses and len(ends) == 3


class AfterBatchOnly(Callback):
    """Overrides one micro-batch hook and nothing else."""

    def _after_batch(self, info: BatchInfo) -> None:
        return None


class TestStepStrategy:
    """The plain step stays for quiet runs; per-micro-batch work takes the general one."""

    @pytest.mark.parametrize(("callbacks", "schedule_event", "general"), [
        ([], None, False),
        ([AfterBatchOnly()], None, True),
        ([], "batch_start", True),
        ([], "batch_end", True),
        ([], "step_end", False),
    ])
    def test_which_step(self, callbacks: list[Any], schedule_event: str | None,
                        general: bool) -> None:
        """A callback overriding a micro-batch hook, or a trigger naming batch_start or
        batch_end, makes the loop take Step; otherwise PlainStep."""
        model, opt = tiny_model()
        schedule = (Schedule([Scheduled(on(schedule_event), lambda t: None, "x")])
                    if schedule_event else None)
        t = Trainer(model, opt, UnevenData([2]), mse, callbacks=callbacks or None,
                    schedule=schedule, max_epochs=1)
        step = t._parts.loop.step
        assert isinstance(step, Step if general else PlainStep)


class TestResumedIndexes:
    """A run resumed inside an epoch numbers its micro-batches as the uninterrupted run."""

    def test_indexes_and_batches_continue(self, tmp_path: Any) -> None:
        """Killed at step 2 of an epoch of 4 steps under grad_accum = 2 and resumed from
        step 1's checkpoint (step 2's event never finished): batch_end's payload indexes
        go on at 2..7, with the same batches."""
        from schedtrain.callbacks import ModelSaver

        class Crash(Callback):
            def __init__(self, at: int | None) -> None:
                self.at = at

            def _trigger(self) -> None:
                if self.now.step == self.at:
                    raise RuntimeError("killed")

        def make(run_dir: Any, crash: int | None,
                 seen: list[tuple[int, list[float]]]) -> Trainer:
            model, opt = tiny_model()
            return Trainer(model, opt, UnevenData([8]), mse, grad_accum=2, max_epochs=1,
                           run_dir=run_dir, handle_signals=False, schedule=Schedule({
                               "save": every("1 step"), "crash": every("1 step"),
                               "seen": on("batch_end")}),
                           bindings={"save": ModelSaver(keep=None), "crash": Crash(crash),
                                     "seen": lambda t: seen.append(
                                         (t.payload["index"],
                                          t.payload["batch"][0].flatten().tolist()))})

        full: list[tuple[int, list[float]]] = []
        make(tmp_path / "full", None, full).fit()
        cut: list[tuple[int, list[float]]] = []
        with pytest.raises(RuntimeError, match="killed"):
            make(tmp_path / "cut", 2, cut).fit()
        rest: list[tuple[int, list[float]]] = []
        resumed = make(tmp_path / "cut", None, rest)
        found = resumed.checkpoints.newest_valid(tmp_path / "cut" / "checkpoints")
        assert found is not None
        resumed.resume(found)
        resumed.fit()
        assert [i for i, _ in full] == list(range(8))
        assert rest == full[2:]
