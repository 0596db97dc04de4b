"""Ported callbacks run as tensorpack runs them, checked against a reference model.

``TP`` below is a transcription of tensorpack's own logic (tensorpack/callbacks/base.py:
``Callback``, ``ProxyCallback``; trigger.py: ``PeriodicTrigger``, ``EnableCallbackIf``,
``PeriodicCallback``; train/base.py: ``TrainLoop`` and ``Trainer.main_loop``), without
TensorFlow. The same callback class body runs under that model and under schedtrain's
``Trainer``; the hooks it sees, with tensorpack's counters, must be the same.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from training_helpers import tiny_model

from schedtrain.callbacks import Callback
from schedtrain.schedule import EnableCallbackIf, PeriodicCallback, PeriodicTrigger
from schedtrain.training import Trainer

Calls = list[tuple[str, int, int]]


# -- the reference: tensorpack's logic, transcribed --------------------------------------
class TP:
    """tensorpack's callback classes and loop, reduced to the control flow."""

    class Loop:  # train/base.py TrainLoop: local_step starts at -1 and is never reset
        def __init__(self, steps_per_epoch: int, max_epoch: int) -> None:
            self.steps_per_epoch, self.max_epoch = steps_per_epoch, max_epoch
            self.epoch_num, self.global_step, self.local_step = 0, 0, -1

    class Callback:  # base.py Callback
        loop: TP.Loop

        def setup(self, loop: TP.Loop) -> None:
            self.loop = loop
            self._setup()

        def _setup(self) -> None:
            pass

        @property
        def epoch_num(self) -> int:
            return self.loop.epoch_num

        @property
        def global_step(self) -> int:
            return self.loop.global_step

        @property
        def local_step(self) -> int:
            return self.loop.local_step

        def before_epoch(self) -> None:
            self._before_epoch()

        def _before_epoch(self) -> None:
            pass

        def after_epoch(self) -> None:
            self._after_epoch()

        def _after_epoch(self) -> None:
            pass

        def before_run(self) -> None:
            self._before_run()

        def _before_run(self) -> None:
            pass

        def trigger_step(self) -> None:
            self._trigger_step()

        def _trigger_step(self) -> None:
            pass  # "Defaults to no-op"

        def trigger_epoch(self) -> None:
            self._trigger_epoch()

        def _trigger_epoch(self) -> None:
            self.trigger()  # "Defaults to call self.trigger()"

        def trigger(self) -> None:
            self._trigger()

        def _trigger(self) -> None:
            pass

    class Proxy(Callback):  # base.py ProxyCallback
        def __init__(self, cb: TP.Callback) -> None:
            self.cb = cb

        def _setup(self) -> None:
            self.cb.setup(self.loop)

        def _trigger_epoch(self) -> None:
            self.cb.trigger_epoch()

        def _trigger_step(self) -> None:
            self.cb.trigger_step()

        def _before_epoch(self) -> None:
            self.cb.before_epoch()

        def _after_epoch(self) -> None:
            self.cb.after_epoch()

        def _before_run(self) -> None:
            self.cb._before_run()

    class PeriodicTrigger(Proxy):  # trigger.py
        def __init__(self, cb: TP.Callback, every_k_steps: int | None = None,
                     every_k_epochs: int | None = None) -> None:
            super().__init__(cb)
            self.step_k, self.epoch_k = every_k_steps, every_k_epochs

        def _trigger_step(self) -> None:
            self.cb.trigger_step()
            if self.step_k is not None and self.global_step % self.step_k == 0:
                self.cb.trigger()

        def _trigger_epoch(self) -> None:
            if self.epoch_k is not None and self.epoch_num % self.epoch_k == 0:
                self.cb.trigger()

    class EnableCallbackIf(Proxy):  # trigger.py
        def __init__(self, cb: TP.Callback, pred: Callable[[Any], bool]) -> None:
            super().__init__(cb)
            self.pred = pred

        def _before_epoch(self) -> None:
            if self.pred(self):
                super()._before_epoch()

        def _after_epoch(self) -> None:
            if self.pred(self):
                super()._after_epoch()

        def _before_run(self) -> None:
            if self.pred(self):
                super()._before_run()

        def _trigger_epoch(self) -> None:
            if self.pred(self):
                super()._trigger_epoch()

        def _trigger_step(self) -> None:
            if self.pred(self):
                super()._trigger_step()

    class PeriodicCallback(EnableCallbackIf):  # trigger.py, with its last-step clause
        def __init__(self, cb: TP.Callback, every_k_steps: int | None = None,
                     every_k_epochs: int | None = None) -> None:
            super().__init__(cb, type(self).predicate)
            self.step_k, self.epoch_k = every_k_steps, every_k_epochs

        def predicate(self) -> bool:
            if self.step_k is not None and self.global_step % self.step_k == 0:
                return True
            if self.epoch_k is not None and self.epoch_num % self.epoch_k == 0:
                return True
            return (self.epoch_k is not None
                    and self.local_step == self.loop.steps_per_epoch - 1
                    and self.epoch_num == self.loop.max_epoch)

    @staticmethod
    def train(cb: TP.Callback, steps_per_epoch: int, max_epoch: int) -> None:
        """train/base.py ``main_loop`` (global_step counts finished steps)."""
        loop = TP.Loop(steps_per_epoch, max_epoch)
        cb.setup(loop)
        for loop.epoch_num in range(1, max_epoch + 1):
            cb.before_epoch()
            for loop.local_step in range(steps_per_epoch):
                cb.before_run()
                loop.global_step += 1  # the step runs
                cb.trigger_step()
            cb.after_epoch()
            cb.trigger_epoch()


# -- the ported callbacks: one body, run under both ------------------------------------
class Records:
    """Records each hook with tensorpack's counters (global_step, epoch_num)."""

    calls: Calls

    def _log(self, hook: str) -> None:
        self.calls.append((hook, self.global_step, self.epoch_num))  # type: ignore[attr-defined]

    def _before_epoch(self) -> None:
        self._log("before_epoch")

    def _after_epoch(self) -> None:
        self._log("after_epoch")

    def _trigger(self) -> None:
        self._log("trigger")


class EpochWork(Records):
    """tensorpack's idiom: epoch work, then the base class's ``_trigger_epoch``."""

    def _trigger_epoch(self) -> None:
        self._log("trigger_epoch")
        super()._trigger_epoch()  # type: ignore[misc]


class StepWork(Records):
    """Step work, then the base class's ``_trigger_step`` (a no-op in tensorpack)."""

    def _trigger_step(self) -> None:
        self._log("trigger_step")
        super()._trigger_step()  # type: ignore[misc]


class Both(EpochWork, StepWork):
    """Both idioms in one class."""


class Plain(Records):
    """Only ``_trigger`` and the epoch hooks."""


def _tensorpack(body: type, wrap: str, k: int, epochs: int, steps: int) -> Calls:
    class Ported(body, TP.Callback):  # type: ignore[valid-type,misc]
        def _before_run(self) -> None:
            self._log("before_run")

    cb = Ported()
    cb.calls = []
    TP.train(_WRAPS[wrap](TP, cb, k), steps, epochs)
    return cb.calls


def _schedtrain(body: type, wrap: str, k: int, epochs: int, steps: int) -> Calls:
    class Ported(body, Callback):  # type: ignore[valid-type,misc]
        def _before_step(self, step: int, batch: Any) -> None:
            self._log("before_run")

    cb = Ported()
    cb.calls = []
    model, opt = tiny_model()
    # data with a length, as tensorpack's steps_per_epoch: the last step is known ahead
    data = [(x, x.sum(1, keepdim=True)) for x in torch.randn(steps, 2, 3).unbind()]
    Trainer(model, opt, data, torch.nn.functional.mse_loss,
            callbacks=[_WRAPS[wrap](_SCHEDTRAIN, cb, k)], max_epochs=epochs).fit()
    return cb.calls


class _SCHEDTRAIN:
    PeriodicTrigger, PeriodicCallback, EnableCallbackIf = (
        PeriodicTrigger, PeriodicCallback, EnableCallbackIf)


_WRAPS: dict[str, Callable[[Any, Any, int], Any]] = {
    "bare": lambda lib, cb, k: cb,
    "PeriodicTrigger(every_k_steps)": lambda lib, cb, k: lib.PeriodicTrigger(
        cb, every_k_steps=k),
    "PeriodicTrigger(every_k_epochs)": lambda lib, cb, k: lib.PeriodicTrigger(
        cb, every_k_epochs=k),
    "PeriodicCallback(every_k_steps)": lambda lib, cb, k: lib.PeriodicCallback(
        cb, every_k_steps=k),
    "PeriodicCallback(every_k_epochs)": lambda lib, cb, k: lib.PeriodicCallback(
        cb, every_k_epochs=k),
    "PeriodicCallback(PeriodicTrigger(every_k_steps=1), every_k_epochs)":
        lambda lib, cb, k: lib.PeriodicCallback(lib.PeriodicTrigger(cb, every_k_steps=1),
                                                every_k_epochs=k),
    "EnableCallbackIf(epoch_num % k)": lambda lib, cb, k: lib.EnableCallbackIf(
        cb, lambda c: c.epoch_num % k != 0),
}

BODIES = [EpochWork, StepWork, Both, Plain]


@pytest.mark.parametrize("body", BODIES, ids=lambda b: b.__name__)
@pytest.mark.parametrize("wrap", list(_WRAPS))
@settings(max_examples=6, deadline=None)
@given(epochs=st.integers(1, 4), steps=st.integers(1, 3), k=st.integers(1, 3))
def test_hooks_as_tensorpack_runs_them(body: type, wrap: str, epochs: int, steps: int,
                                       k: int) -> None:
    """Every hook, ``super()._trigger_epoch()`` / ``super()._trigger_step()`` included,
    runs where and as often as tensorpack runs it, under each wrapper."""
    expected = _tensorpack(body, wrap, k, epochs, steps)
    assert _schedtrain(body, wrap, k, epochs, steps) == expected


def test_super_trigger_epoch_runs_trigger_every_epoch() -> None:
    """The issue's case: ``_trigger_epoch`` doing work and then ``super()._trigger_epoch()``
    runs ``_trigger`` after every epoch (as tensorpack's base class does)."""
    calls = _schedtrain(EpochWork, "bare", 1, 3, 2)
    assert [c for c in calls if c[0] == "trigger"] == [
        ("trigger", 2, 1), ("trigger", 4, 2), ("trigger", 6, 3)]


def test_issue_case_final_epoch_hooks_run() -> None:
    """3 epochs, ``PeriodicCallback(every_k_epochs=2)``: tensorpack runs the final epoch's
    last-step and epoch-end hooks (its last-step clause); so does schedtrain."""
    expected = _tensorpack(Both, "PeriodicCallback(every_k_epochs)", 2, 3, 2)
    final = [c for c in expected if c[2] == 3]
    assert {hook for hook, _, _ in final} >= {"trigger_step", "after_epoch", "trigger_epoch",
                                              "trigger"}  # the reference has the clause
    assert _schedtrain(Both, "PeriodicCallback(every_k_epochs)", 2, 3, 2) == expected


@settings(max_examples=30, deadline=None)
@given(epochs=st.integers(1, 6), steps=st.integers(1, 4), k=st.integers(1, 4))
def test_simulation_plans_what_tensorpack_triggers(epochs: int, steps: int, k: int) -> None:
    """``simulate()`` (and so ``plan``) fires a bare callback under
    ``PeriodicCallback(every_k_epochs=k)`` at the epochs where tensorpack calls its
    ``trigger()``, the final one included."""
    from schedtrain import Schedule
    from schedtrain.testing import fired_at, simulate

    expected = [e for hook, _, e in _tensorpack(Plain, "PeriodicCallback(every_k_epochs)", k,
                                                epochs, steps) if hook == "trigger"]

    class Bare(Plain, Callback):
        pass

    log = simulate(Schedule([PeriodicCallback(Bare(), every_k_epochs=k)]), epochs=epochs,
                   steps_per_epoch=steps)
    assert fired_at(log, "Bare", "epochs") == expected
