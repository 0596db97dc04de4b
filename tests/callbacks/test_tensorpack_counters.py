"""tensorpack's ``epoch_num`` and ``global_step`` on callbacks, and ``PeriodicCallback`` /
``EnableCallbackIf`` gating hooks by them, in real training runs.

The reference is tensorpack's documented loop: ``for epoch_num in range(1, max_epoch + 1)``
(``starting_epoch = 1``), ``global_step`` counting finished steps, and
``PeriodicCallback(cb, every_k_steps=k, every_k_epochs=j)`` enabling ``cb``'s
``{before,after}_epoch``, per-step hooks and ``trigger_{epoch,step}`` when
``global_step % k == 0 or epoch_num % j == 0``, or, with j, when ``local_step ==
steps_per_epoch - 1 and epoch_num == max_epoch`` (``local_step``: the running step's index
in its epoch, -1 before the first, never reset between epochs).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from training_helpers import tiny_model

from schedtrain.callbacks import Callback
from schedtrain.schedule import EnableCallbackIf, PeriodicCallback
from schedtrain.training import Trainer

Call = tuple[str, int, int]


class Counters(Callback):
    """Records (hook, global_step, epoch_num) at every hook tensorpack has."""

    def __init__(self) -> None:
        self.calls: list[Call] = []

    def _note(self, hook: str) -> None:
        self.calls.append((hook, self.global_step, self.epoch_num))

    def _before_train(self) -> None:
        self._note("before_train")

    def _before_epoch(self) -> None:
        self._note("before_epoch")

    def _before_step(self, step: int, batch: Any) -> None:
        self._note("before_step")

    def _after_step(self, step: int, outputs: Any) -> None:
        self._note("after_step")

    def _trigger_step(self) -> None:
        self._note("trigger_step")

    def _after_epoch(self) -> None:
        self._note("after_epoch")

    def _trigger_epoch(self) -> None:
        self._note("trigger_epoch")

    def _after_train(self) -> None:
        self._note("after_train")


def _fit(callback: Any, epochs: int, steps: int) -> None:
    model, opt = tiny_model()
    # data with a length: tensorpack always knows its steps_per_epoch
    data = [(x, x.sum(1, keepdim=True)) for x in torch.randn(steps, 2, 3).unbind()]
    Trainer(model, opt, data, torch.nn.functional.mse_loss, callbacks=[callback],
            max_epochs=epochs).fit()


def tensorpack_loop(epochs: int, steps: int, enabled: Any = None) -> list[Call]:
    """The calls tensorpack makes, from its documented loop; ``enabled(global_step,
    epoch_num, local_step)`` gates what ``EnableCallbackIf`` gates (``None``: everything)."""
    calls: list[Call] = []
    gate = enabled or (lambda *_: True)
    global_step, local_step = 0, -1
    calls.append(("before_train", global_step, 0))
    for epoch_num in range(1, epochs + 1):
        if gate(global_step, epoch_num, local_step):
            calls.append(("before_epoch", global_step, epoch_num))
        for local_step in range(steps):  # as tensorpack: still the last index after it
            ran = gate(global_step, epoch_num, local_step)
            if ran:
                calls.append(("before_step", global_step, epoch_num))
            global_step += 1
            if ran:  # after_run goes with its before_run
                calls.append(("after_step", global_step, epoch_num))
            if gate(global_step, epoch_num, local_step):
                calls.append(("trigger_step", global_step, epoch_num))
        for hook in ("after_epoch", "trigger_epoch"):
            if gate(global_step, epoch_num, local_step):
                calls.append((hook, global_step, epoch_num))
    calls.append(("after_train", global_step, epochs))
    return calls


class TestCounters:
    """``self.epoch_num`` and ``self.global_step`` read as in tensorpack."""

    def test_every_hook_sees_tensorpacks_counters(self) -> None:
        """epoch_num is 1 during the first epoch and in its after/trigger_epoch; global_step
        counts finished steps (0 before the first, 1 after it)."""
        rec = Counters()
        _fit(rec, epochs=2, steps=2)
        assert rec.calls == tensorpack_loop(epochs=2, steps=2)
        assert rec.calls[1:4] == [("before_epoch", 0, 1), ("before_step", 0, 1),
                                  ("after_step", 1, 1)]

    def test_read_only(self) -> None:
        """Assigning either counter is refused with a message naming it."""
        rec = Counters()
        with pytest.raises(AttributeError, match=r"Counters\.epoch_num is read-only"):
            rec.epoch_num = 3
        with pytest.raises(AttributeError, match=r"Counters\.global_step is read-only"):
            rec.global_step = 3

    def test_unbound(self) -> None:
        """Before the callback is bound to a trainer, reading a counter says why it fails."""
        with pytest.raises(AttributeError, match="known only while training"):
            _ = Counters().global_step

    def test_enable_callback_if_on_global_step(self) -> None:
        """``EnableCallbackIf(cb, lambda self: self.global_step >= 4)`` works as in tensorpack,
        hooks and the default per-epoch trigger alike."""
        rec = Counters()
        fired: list[int] = []

        class Triggered(Callback):
            def _trigger(self) -> None:
                fired.append(self.epoch_num)

        trig = Triggered()
        _fit(EnableCallbackIf(rec, lambda self: self.global_step >= 4), epochs=3, steps=3)
        _fit(EnableCallbackIf(trig, lambda self: self.global_step >= 4), epochs=3, steps=3)
        expected = tensorpack_loop(3, 3, lambda gs, *_: gs >= 4)
        assert [c for c in rec.calls if c[0] not in ("before_train", "after_train")] == \
            [c for c in expected if c[0] not in ("before_train", "after_train")]
        assert fired == [2, 3]  # trigger_epoch -> trigger() at epoch ends with global_step >= 4


class TestPeriodicCallbackEpochs:
    """``PeriodicCallback`` counts epochs as tensorpack does (``epoch_num`` from 1)."""

    def test_issue_example(self) -> None:
        """every_k_epochs=2, 3 steps an epoch: per-step and before-epoch hooks run in the
        second and fourth epochs only, never in the first."""
        rec = Counters()
        _fit(PeriodicCallback(rec, every_k_epochs=2), epochs=4, steps=3)
        seen = sorted({gs for hook, gs, _ in rec.calls
                       if hook in ("before_epoch", "trigger_step")})
        assert seen == [3, 4, 5, 6, 9, 10, 11, 12]
        gated = [c for c in rec.calls if c[0] not in ("before_train", "after_train")]
        assert {epoch_num for _, _, epoch_num in gated} == {2, 4}

    @settings(max_examples=25, deadline=None)
    @given(k=st.none() | st.integers(1, 5), j=st.none() | st.integers(1, 3),
           epochs=st.integers(1, 4), steps=st.integers(1, 4))
    def test_matches_tensorpack(self, k: int | None, j: int | None, epochs: int,
                                steps: int) -> None:
        """For any k, j and epoch length, the hooks run exactly where tensorpack's predicate
        ``global_step % k == 0 or epoch_num % j == 0``, or its last-step clause, enables
        them."""
        if k is None and j is None:
            j = 1

        def pred(gs: int, e: int, local: int) -> bool:
            return ((k is not None and gs % k == 0) or (j is not None and e % j == 0)
                    or (j is not None and local == steps - 1 and e == epochs))

        rec = Counters()
        _fit(PeriodicCallback(rec, every_k_steps=k, every_k_epochs=j), epochs, steps)
        assert rec.calls == tensorpack_loop(epochs, steps, pred)
