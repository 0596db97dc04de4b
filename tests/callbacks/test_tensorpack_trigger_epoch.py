"""An overridden ``_trigger_epoch`` replaces the per-epoch ``trigger()``, as in tensorpack.

tensorpack documents ``_trigger_epoch`` as "called after each epoch; calls ``self.trigger()``
by default", ``_trigger`` as "by default called by ``_trigger_epoch``", and
``PeriodicTrigger`` as the way to call ``trigger()`` every k steps or epochs instead (its
source never calls the wrapped callback's ``trigger_epoch``). Each rule is checked in a
real training run of 3 epochs of 2 steps.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from training_helpers import UnevenData, tiny_model

from schedtrain import Scheduled, every
from schedtrain.callbacks import Callback
from schedtrain.schedule import EnableCallbackIf, PeriodicCallback, PeriodicTrigger
from schedtrain.training import Trainer

EPOCHS, STEPS = 3, 2


class Both(Callback):
    """tensorpack style: the epoch call does work and calls ``trigger()``."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []

    def _trigger_epoch(self) -> None:
        self.calls.append(("trigger_epoch", self.epoch_num))
        self.trigger()

    def _trigger(self) -> None:
        self.calls.append(("trigger", self.global_step))


class OnlyTriggerEpoch(Callback):
    """Only ``_trigger_epoch``."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []

    def _trigger_epoch(self) -> None:
        self.calls.append(("trigger_epoch", self.epoch_num))


class OnlyTrigger(Callback):
    """Only ``_trigger``."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []

    def _trigger(self) -> None:
        self.calls.append(("trigger", self.global_step))


def _run(wrap: Callable[[Any], Any], cls: type[Any]) -> list[tuple[str, int]]:
    cb = cls()
    model, opt = tiny_model()
    Trainer(model, opt, UnevenData([STEPS] * EPOCHS), torch.nn.functional.mse_loss,
            callbacks=[wrap(cb)], max_epochs=EPOCHS).fit()
    calls: list[tuple[str, int]] = cb.calls
    return calls


def _bare(cb: Any) -> Any:
    return cb


TE = "trigger_epoch"


class TestBare:
    """Given without a trigger: tensorpack's default loop."""

    @pytest.mark.parametrize(("cls", "expected"), [
        (Both, [(TE, 1), ("trigger", 2), (TE, 2), ("trigger", 4), (TE, 3), ("trigger", 6)]),
        (OnlyTriggerEpoch, [(TE, 1), (TE, 2), (TE, 3)]),
        (OnlyTrigger, [("trigger", 2), ("trigger", 4), ("trigger", 6)]),
    ])
    def test_each_epoch_once(self, cls: type[Any], expected: list[tuple[str, int]]) -> None:
        """Epoch work runs once per epoch: an overridden ``_trigger_epoch`` takes the place of
        the per-epoch ``trigger()``, which runs only when it calls ``self.trigger()``."""
        assert _run(_bare, cls) == expected

    def test_own_default_trigger_keeps_the_hook(self) -> None:
        """A class that states its ``default_trigger`` keeps ``_trigger_epoch`` as a hook:
        both run, as it said."""

        class Stated(Both):
            default_trigger = every("2 steps")

        assert _run(_bare, Stated) == [
            ("trigger", 2), (TE, 1), ("trigger", 2), ("trigger", 4), (TE, 2), ("trigger", 4),
            ("trigger", 6), (TE, 3), ("trigger", 6)]

    def test_explicit_trigger_keeps_the_hook(self) -> None:
        """``Scheduled(trigger, cb)`` is schedtrain's own form: ``_trigger`` at the trigger,
        ``_trigger_epoch`` after each epoch."""
        assert _run(lambda cb: Scheduled(every("3 steps"), cb), OnlyTriggerEpoch) == [
            (TE, 1), (TE, 2), (TE, 3)]


class TestPeriodicTrigger:
    """``PeriodicTrigger`` calls ``trigger()`` every k and replaces the epoch call."""

    @pytest.mark.parametrize(("cls", "expected"), [
        (Both, [("trigger", 4)]),
        (OnlyTriggerEpoch, []),
        (OnlyTrigger, [("trigger", 4)]),
    ])
    def test_every_k_epochs(self, cls: type[Any], expected: list[tuple[str, int]]) -> None:
        """every_k_epochs=2: ``_trigger`` at the second epoch's end; ``_trigger_epoch`` never."""
        assert _run(lambda cb: PeriodicTrigger(cb, every_k_epochs=2), cls) == expected

    @pytest.mark.parametrize("cls", [Both, OnlyTrigger])
    def test_every_k_steps(self, cls: type[Any]) -> None:
        """every_k_steps=3: ``_trigger`` at steps 3 and 6, nothing at epoch ends."""
        assert _run(lambda cb: PeriodicTrigger(cb, every_k_steps=3), cls) == [
            ("trigger", 3), ("trigger", 6)]


class TestPeriodicCallback:
    """``PeriodicCallback`` / ``EnableCallbackIf`` gate the epoch call, whichever it is."""

    @pytest.mark.parametrize(("cls", "expected"), [
        (Both, [(TE, 2), ("trigger", 4), (TE, 3), ("trigger", 6)]),
        (OnlyTriggerEpoch, [(TE, 2), (TE, 3)]),
        (OnlyTrigger, [("trigger", 4), ("trigger", 6)]),
    ])
    def test_every_k_epochs(self, cls: type[Any], expected: list[tuple[str, int]]) -> None:
        """every_k_epochs=2: the epoch call runs, once, in the second epoch and in the
        final one (tensorpack's last-step clause: its last step ends the run)."""
        assert _run(lambda cb: PeriodicCallback(cb, every_k_epochs=2), cls) == expected

    def test_enable_callback_if(self) -> None:
        """A predicate on tensorpack's counters gates the replaced epoch call."""
        assert _run(lambda cb: EnableCallbackIf(cb, lambda c: c.epoch_num != 2), Both) == [
            (TE, 1), ("trigger", 2), (TE, 3), ("trigger", 6)]
