"""The public testing helpers, as a user's own test suite would use them."""

from __future__ import annotations

import pytest

from schedtrain import Schedule
from schedtrain.testing import assert_fires, assert_never_fires, fired_at, next_firing, simulate
from schedtrain.triggers import every, on, window


@pytest.fixture
def schedule() -> Schedule:
    return Schedule({
        "checkpoint": every("500 steps"),
        "validate": every("1 epoch") & window(start="2 epochs"),
        "final": on("train_end"),
    })


class TestFiredAt:
    """``fired_at`` lists the clock at each firing in a chosen unit."""

    def test_steps_and_epochs(self, schedule: Schedule) -> None:
        """Steps by default, epochs on request."""
        log = simulate(schedule, epochs=3, steps_per_epoch=400)
        assert fired_at(log, "checkpoint") == [500, 1000]
        assert fired_at(log, "validate", "epochs") == [2, 3]
        assert fired_at(log, "final", event="train_end") == [1200]


class TestAssertFires:
    """``assert_fires`` fails with a readable diff."""

    def test_passes_when_equal(self, schedule: Schedule) -> None:
        """Exactly the expected steps pass."""
        assert_fires(simulate(schedule, epochs=3, steps_per_epoch=400), "checkpoint", [500, 1000])

    def test_message_lists_missing_and_unexpected(self, schedule: Schedule) -> None:
        """The message names what was missing and what was unexpected."""
        log = simulate(schedule, epochs=3, steps_per_epoch=400)
        with pytest.raises(AssertionError, match=r"missing \[1500\]; unexpected \[500\]"):
            assert_fires(log, "checkpoint", [1000, 1500])

    def test_never_fires(self, schedule: Schedule) -> None:
        """``assert_never_fires`` lists firings when there are some."""
        log = simulate(schedule, epochs=1, steps_per_epoch=400)
        assert_never_fires(log, "validate")
        with pytest.raises(AssertionError, match="'final' fired 1 times"):
            assert_never_fires(log, "final")


class TestNextFiring:
    """``next_firing`` answers when anything fires next."""

    def test_after_a_step(self, schedule: Schedule) -> None:
        """The first firing after a given step."""
        f = next_firing(schedule, after_step=1000, epochs=3, steps_per_epoch=400)
        assert f is not None
        assert (f.callback, f.event, f.step) == ("validate", "epoch_end", 1200)

    def test_none_left(self) -> None:
        """None when nothing fires after that step."""
        assert next_firing(Schedule({"a": every("5 steps")}), after_step=10, epochs=1,
                           steps_per_epoch=10) is None
