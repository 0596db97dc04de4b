"""Step hooks see the batch and outputs, may fetch, gradient hooks see the gradients,
evaluation events can be named, and gated step hooks stay paired."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset
from training_helpers import UnevenData, tiny_model

from schedtrain import Schedule, Scheduled, at, every, on, window
from schedtrain.callbacks import Callback, InferenceRunner, StepOutputs
from schedtrain.schedule import EnableCallbackIf
from schedtrain.training import Trainer

mse = torch.nn.functional.mse_loss


def _fit(callbacks: list[Any], *, steps: int = 4, epochs: int = 1, **kw: Any) -> Trainer:
    model, opt = tiny_model()
    t = Trainer(model, opt, UnevenData([steps] * epochs), mse, callbacks=callbacks,
                max_epochs=epochs, **kw)
    t.fit()
    return t


class VerifyBatch(Callback):
    """pytorch-accelerated's VerifyBatchCallback: check the batch before the step."""

    def __init__(self) -> None:
        self.seen: list[tuple[int, int]] = []

    def _before_step(self, step: int, batch: Any) -> None:
        inputs, _ = batch
        self.seen.append((step, inputs.shape[0]))


class Fetcher(Callback):
    """tensorpack's _before_run fetches: ask for the gradient norm, get it after the step."""

    def __init__(self) -> None:
        self.got: list[tuple[int, float, tuple[int, ...]]] = []

    def _before_step(self, step: int, batch: Any) -> dict[str, Any]:
        model = self.model
        return {"grad_norm": lambda: torch.sqrt(sum((p.grad ** 2).sum()
                                                    for p in model.parameters()))}

    def _after_step(self, step: int, outputs: StepOutputs) -> None:
        self.got.append((step, float(outputs.fetched["grad_norm"]),
                         tuple(outputs.batch[0].shape)))


class Grads(Callback):
    """Gradient hooks: after backward and before the optimizer step, gradients intact."""

    def __init__(self) -> None:
        self.after: list[bool] = []
        self.before: list[float] = []

    def _after_backward(self, step: int) -> None:
        self.after.append(all(p.grad is not None for p in self.model.parameters()))

    def _before_optimizer_step(self, step: int) -> None:
        self.before.append(float(sum(p.grad.abs().sum() for p in self.model.parameters())))


class TestStepHooks:
    """The hooks the seeds need."""

    def test_before_step_sees_the_batch(self) -> None:
        """Each step's first batch reaches before_step, before the step runs."""
        cb = VerifyBatch()
        _fit([cb], steps=3)
        assert cb.seen == [(1, 2), (2, 2), (3, 2)]

    def test_fetches_reach_after_step(self) -> None:
        """What before_step asks for is evaluated after backward and given to after_step."""
        cb = Fetcher()
        _fit([cb], steps=3)
        assert [s for s, _, _ in cb.got] == [1, 2, 3]
        assert all(norm > 0 for _, norm, _ in cb.got)
        assert all(shape == (2, 3) for _, _, shape in cb.got)

    @pytest.mark.parametrize("accum", [1, 3])
    def test_gradient_hooks_see_gradients(self, accum: int) -> None:
        """after_backward and before_optimizer_step run once per optimizer step, gradients
        present (clipping comes after before_optimizer_step)."""
        cb = Grads()
        _fit([cb], steps=6, grad_accum=accum, grad_clip=1e-6)
        assert cb.after == [True] * (6 // accum)
        assert len(cb.before) == 6 // accum and all(g > 1e-6 for g in cb.before)

    def test_old_one_argument_before_step_warns_and_works(self) -> None:
        """_before_step(self, step) still runs, with a DeprecationWarning at setup."""
        class Old(Callback):
            def __init__(self) -> None:
                self.steps: list[int] = []

            def _before_step(self, step: int) -> None:  # type: ignore[override]
                self.steps.append(step)

        cb = Old()
        with pytest.warns(DeprecationWarning, match=r"_before_step\(self, step\) is deprecated"):
            _fit([cb], steps=2)
        assert cb.steps == [1, 2]


class TestGatedPairs:
    """A gated callback's after_step runs exactly when its before_step ran."""

    def test_pairs_stay_paired_when_the_gate_changes_mid_step(self) -> None:
        """A gate open before odd steps is closed after them (the clock moved): still
        paired, and after_step never runs for a step whose before_step did not."""
        class Pair(Callback):
            def __init__(self) -> None:
                self.events: list[str] = []

            def _before_step(self, step: int, batch: Any) -> None:
                self.events.append(f"before{step}")

            def _after_step(self, step: int, outputs: object) -> None:
                self.events.append(f"after{step}")

        cb = Pair()
        _fit([EnableCallbackIf(cb, lambda c: c.now.step % 2 == 0)], steps=4)
        assert cb.events == ["before1", "after1", "before3", "after3"]


class TestEvaluationEvents:
    """eval_start, eval_step_end and eval_end can be named by triggers."""

    def test_triggers_name_eval_events(self) -> None:
        """A callback on eval_end runs after each validation; eval_step_end per batch."""
        x = torch.randn(32, 4)
        data = DataLoader(TensorDataset(x, (x[:, 0] > 0).long()), batch_size=8)
        model = torch.nn.Linear(4, 2)
        seen: list[tuple[str, int]] = []

        def note(trainer: Trainer, event: str) -> None:
            seen.append((event, trainer.clock.step))

        schedule = Schedule([
            Scheduled(every("2 steps"), InferenceRunner(), "validate"),
            Scheduled(on("eval_start"), lambda t: note(t, "start"), "a"),
            Scheduled(on("eval_step_end"), lambda t: note(t, "batch"), "b"),
            Scheduled(on("eval_end") & window(start="4 steps"), lambda t: note(t, "end"), "c"),
        ])
        t = Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), data,
                    torch.nn.functional.cross_entropy, val_data=data, schedule=schedule,
                    max_steps=4)
        t.fit()
        assert seen == [("start", 2), ("batch", 2), ("batch", 2), ("batch", 2), ("batch", 2),
                        ("start", 4), ("batch", 4), ("batch", 4), ("batch", 4), ("batch", 4),
                        ("end", 4)]


    def test_eval_step_payloads(self) -> None:
        """eval_step_start and eval_step_end carry the batch, its index in the evaluation
        and its loss (None before the forward); eval_step_end adds the outputs
        (pytorch-accelerated's on_eval_step_start/end)."""
        x = torch.randn(12, 4)
        data = DataLoader(TensorDataset(x, (x[:, 0] > 0).long()), batch_size=4)
        model = torch.nn.Linear(4, 2)
        seen: list[tuple[str, int, float | None, bool]] = []

        def note(trainer: Trainer, event: str) -> None:
            p = trainer.payload
            inputs, targets = p["batch"]
            want = float(torch.nn.functional.cross_entropy(model(inputs), targets))
            loss = None if p["loss"] is None else float(p["loss"])
            seen.append((event, p["index"], loss, loss is None or abs(loss - want) < 1e-6))

        schedule = Schedule([
            Scheduled(at("1 step"), InferenceRunner(), "validate"),
            Scheduled(on("eval_step_start"), lambda t: note(t, "start"), "a"),
            Scheduled(on("eval_step_end"), lambda t: note(t, "end"), "b"),
        ])
        Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), data,
                torch.nn.functional.cross_entropy, val_data=data, schedule=schedule,
                max_steps=1).fit()
        assert [(e, i, loss is None, ok) for e, i, loss, ok in seen] == [
            ("start", 0, True, True), ("end", 0, False, True),
            ("start", 1, True, True), ("end", 1, False, True),
            ("start", 2, True, True), ("end", 2, False, True)]


class TestStopAndPayload:
    """request_stop ends training after the event; custom events carry a payload."""

    def test_request_stop_finishes_the_event(self) -> None:
        """Every callback firing at the event runs; training stops; the reason is kept."""
        order: list[str] = []

        class Stopper(Callback):
            def _trigger(self) -> None:
                order.append("stopper")
                self.trainer.request_stop("enough")

        class After(Callback):
            def _trigger(self) -> None:
                order.append("after")

        t = _fit([Scheduled(at("2 steps"), Stopper()), Scheduled(at("2 steps"), After())],
                 steps=5)
        assert order == ["stopper", "after"]
        assert (t.clock.step, t.stopped and t.stopped.reason) == (2, "enough")

    def test_payload_reaches_the_callback(self) -> None:
        """fire("found", value=3) — the callback reads the value from the trainer."""
        got: list[Any] = []
        schedule = Schedule([Scheduled(on("found"), lambda t: got.append(t.payload), "x"),
                             Scheduled(at("2 steps"), lambda t: t.fire("found", value=3),
                                       "y")], events=["found"])
        model, opt = tiny_model()
        Trainer(model, opt, UnevenData([3]), mse, schedule=schedule, max_epochs=1).fit()
        assert got == [{"value": 3}]
