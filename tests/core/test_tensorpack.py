"""tensorpack's PeriodicTrigger, PeriodicCallback and EnableCallbackIf over the algebra."""

from __future__ import annotations

import pytest

from schedtrain import Schedule, Timestamp, simulate
from schedtrain.schedule import EnableCallbackIf, PeriodicCallback, PeriodicTrigger
from schedtrain.triggers import every


class Saver:
    """A stand-in callback with a default trigger."""

    default_trigger = every("1 epoch")

    def __init__(self) -> None:
        self.enabled = True


class TestPeriodicTrigger:
    """``_trigger`` every k steps or epochs, or before training."""

    def test_steps_or_epochs(self) -> None:
        """Fires when ``step % k == 0`` at step end or ``epoch % k == 0`` at epoch end."""
        sc = PeriodicTrigger(Saver(), every_k_steps=4, every_k_epochs=2, before_train=True)
        log = simulate(Schedule([sc]), epochs=4, steps_per_epoch=3)
        assert [(f.event, f.step, f.epoch) for f in log] == [
            ("train_start", 0, 0), ("step_end", 4, 1), ("epoch_end", 6, 2),
            ("step_end", 8, 2), ("step_end", 12, 3), ("epoch_end", 12, 4)]

    def test_needs_a_period(self) -> None:
        """Without any period it is refused (tensorpack asserts; we raise)."""
        with pytest.raises(ValueError, match="every_k_steps, every_k_epochs or before_train"):
            PeriodicTrigger(Saver())


class TestEnableCallbackIf:
    """Hooks and trigger run only while the predicate holds."""

    def test_gates_trigger_and_hooks(self) -> None:
        """The predicate receives the callback; the gate decides hooks too."""
        cb = Saver()
        sc = EnableCallbackIf(cb, lambda c: c.enabled)
        table = Schedule([sc]).compile(predicates={})
        assert sc.gate is not None and sc.gate(Timestamp()) is True
        cb.enabled = False
        assert sc.gate(Timestamp()) is False
        log = simulate(table, epochs=2, steps_per_epoch=2, predicates={})
        assert len(log) == 0


class TestPeriodicCallback:
    """Only less frequent: ``step % k == 0 or epoch % k == 0`` at the moment of the call."""

    def test_epoch_gate(self) -> None:
        """The default per-epoch trigger runs only at even epochs, and at the final
        epoch's end (tensorpack's last-step clause)."""
        sc = PeriodicCallback(Saver(), every_k_epochs=2)
        log = simulate(Schedule([sc]), epochs=5, steps_per_epoch=3)
        assert log.epochs("Saver") == [2, 4, 5]
        assert sc.gate is not None and sc.gate(Timestamp(epoch=3)) is False

    def test_epochs_count_from_one_inside_an_epoch(self) -> None:
        """At step ends the epoch part counts tensorpack's ``epoch_num`` (1 in the first
        epoch): a per-step trigger gated by every_k_epochs=2 fires in the second epoch, and
        at the final epoch's last step (tensorpack's last-step clause)."""
        sc = PeriodicCallback(PeriodicTrigger(Saver(), every_k_steps=1), every_k_epochs=2)
        log = simulate(Schedule([sc]), epochs=3, steps_per_epoch=2)
        assert [(f.event, f.step) for f in log] == [("step_end", 3), ("step_end", 4),
                                                    ("step_end", 6)]
