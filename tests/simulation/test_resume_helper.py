"""``assert_resumes_exactly``: built-in triggers pass it; a trigger that forgets state fails."""

from __future__ import annotations

import re
from typing import Any

import attrs
import pytest
from hypothesis import given, reject, settings
from hypothesis import strategies as st
from strategies import Shape, clock_triggers, shapes

from schedtrain import ScheduleError
from schedtrain.events import EventSet
from schedtrain.testing import assert_resumes_exactly
from schedtrain.time import Timestamp
from schedtrain.triggers import (
    Trigger,
    before_deadline,
    every,
    improved,
    on,
    plateau,
    when,
    window,
)
from schedtrain.triggers.protocol import ANY_TIME, Due, Point

# Random trees often contain dead branches; their warnings are expected here.
pytestmark = pytest.mark.filterwarnings("ignore::schedtrain.ScheduleWarning")


@attrs.frozen
class EveryOtherStep(Trigger):
    """Fires at every second step end it sees; ``keeps_state`` off forgets the count."""

    keeps_state: bool = True

    def events(self) -> EventSet:
        return EventSet.of("step_end")

    def compile(self) -> Any:
        return _Counter(self.keeps_state)


class _Counter:
    def __init__(self, keeps_state: bool) -> None:
        self.seen = 0
        self.keeps_state = keeps_state

    def evaluate(self, pt: Point) -> bool:
        self.seen += pt.event == "step_end"
        return pt.event == "step_end" and self.fires(pt)

    def fires(self, pt: Point) -> bool:
        return self.seen % 2 == 0

    def bound(self, event: str, last: Timestamp) -> Due:
        return ANY_TIME

    def explain(self, pt: Point) -> Any:
        raise NotImplementedError

    def state_dict(self) -> dict[str, Any]:
        return {"seen": self.seen} if self.keeps_state else {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.seen = state.get("seen", 0)


@attrs.frozen
class CountsSteps(EveryOtherStep):
    """Fires at each step end while the step ends it saw are the clock's steps."""

    def compile(self) -> Any:
        node = _Counter(self.keeps_state)
        node.fires = lambda pt: node.seen == pt.now.step  # type: ignore[attr-defined]
        return node


class _Opaque:
    """Not plain data: a checkpoint cannot hold it."""


@attrs.frozen
class HoldsAnObject(Trigger):
    def events(self) -> EventSet:
        return EventSet.of("step_end")

    def compile(self) -> Any:
        node = _Counter(True)
        node.state_dict = lambda: {"seen": 0, "memo": {"last": _Opaque()}}  # type: ignore[method-assign]
        return node


#: Metric values at random steps: what metric triggers and conditions read.
metric_streams = st.lists(st.tuples(st.integers(1, 60), st.floats(0, 2, width=16)),
                          min_size=1, max_size=25).map(
    lambda pts: {"loss": [(f"{s} steps", v) for s, v in sorted(dict(pts).items())]})

metric_triggers = st.one_of(
    st.builds(improved, st.just("loss"), st.sampled_from(["min", "max"]),
              st.sampled_from([0.0, 0.1])),
    st.builds(plateau, st.just("loss"), st.integers(1, 3), st.sampled_from(["min", "max"])),
)


class TestBuiltIns:
    """Every built-in trigger saves what it needs: cut anywhere, it fires the same."""

    @settings(max_examples=80, deadline=None)
    @given(clock_triggers(), shapes(), st.integers(0, 2**32 - 1))
    def test_clock_triggers(self, trigger: Trigger, shape: Shape, seed: int) -> None:
        """every, at, on, windows and their all/any/not, over random run shapes."""
        try:
            assert_resumes_exactly(trigger, seed=seed, points=4, **shape.kwargs())
        except ScheduleError:
            reject()  # a trigger that can never fire is refused before it runs

    @settings(max_examples=80, deadline=None)
    @given(metric_triggers, st.sampled_from(["plain", "every", "any", "and_on"]),
           metric_streams, st.integers(0, 2**32 - 1))
    def test_metric_triggers(self, metric: Trigger, how: str, stream: dict[str, Any],
                             seed: int) -> None:
        """improved and plateau keep their best value, count and wait across a resume,
        alone and composed with clock parts."""
        trigger = {"plain": metric, "every": every("3 steps") & metric,
                   "any": metric | every("1 epoch"), "and_on": on("step_end") & metric}[how]
        assert_resumes_exactly(trigger, epochs=3, steps_per_epoch=20, metrics=stream,
                               seed=seed, points=5)

    @settings(max_examples=40, deadline=None)
    @given(metric_streams, st.integers(0, 2**32 - 1))
    def test_conditions(self, stream: dict[str, Any], seed: int) -> None:
        """A condition is read from the metrics at each point, so it needs no state."""
        trigger = every("2 steps") & when("loss < 1") & window(stop="50 steps")
        assert_resumes_exactly(trigger, epochs=3, steps_per_epoch=20, metrics=stream, seed=seed)

    @settings(max_examples=40, deadline=None)
    @given(st.integers(1, 40), st.integers(0, 2**32 - 1))
    def test_before_deadline_fires_once(self, margin_s: int, seed: int) -> None:
        """before_deadline remembers that it fired, so a resumed run never fires it again."""
        assert_resumes_exactly(before_deadline(f"{margin_s} s"), epochs=2, steps_per_epoch=30,
                               seconds_per_step=1.0, deadline="50 s", seed=seed)

    def test_a_stateful_trigger_of_your_own_that_saves_its_state(self) -> None:
        """A user's trigger whose state_dict holds its count passes."""
        assert_resumes_exactly(EveryOtherStep(), epochs=2, steps_per_epoch=25, points=8)


class TestFailures:
    """What the helper says when a trigger does not resume exactly."""

    def test_state_not_saved_names_the_first_differing_firing(self) -> None:
        """A trigger that forgets its count after a resume fails, naming the cut points,
        the resume before the difference and both firings."""
        expected = ("EveryOtherStep(keeps_state=False) does not resume exactly (cut at steps "
                    "[5, 8, 12, 15, 18], seed=3): firing #3, after the resume at step 5, "
                    "differs: uninterrupted 'trigger' at step_end, step 6, epoch 0; resumed "
                    "'trigger' at step_end, step 7, epoch 0")
        with pytest.raises(AssertionError, match=f"^{re.escape(expected)}$"):
            assert_resumes_exactly(EveryOtherStep(keeps_state=False), epochs=2,
                                   steps_per_epoch=10, seed=3)

    @given(st.integers(0, 2**32 - 1), st.integers(1, 6), st.integers(2, 40))
    @settings(max_examples=30, deadline=None)
    def test_state_not_saved_fails_at_any_cut(self, seed: int, points: int,
                                              steps: int) -> None:
        """Whatever the cut points, a trigger that counts the steps it saw and forgets
        the count on resume is found."""
        with pytest.raises(AssertionError, match="does not resume exactly"):
            assert_resumes_exactly(CountsSteps(keeps_state=False), epochs=1,
                                   steps_per_epoch=steps, seed=seed, points=points)
        assert_resumes_exactly(CountsSteps(), epochs=1, steps_per_epoch=steps, seed=seed,
                               points=points)

    def test_state_a_checkpoint_cannot_hold_is_named_by_key_path(self) -> None:
        """State that is not plain data fails with where it is in the run's state."""
        with pytest.raises(AssertionError, match=r"^state at step \d+\.table\.triggers\.trigger"
                                                 r"\.memo\.last: _Opaque .* is not plain data"):
            assert_resumes_exactly(HoldsAnObject(), epochs=1, steps_per_epoch=10, points=1)

    def test_unknown_shape_keyword_is_refused(self) -> None:
        """A misspelt run-shape keyword is named, with the ones that exist."""
        with pytest.raises(TypeError, match=r"unexpected keywords \['epoch'\]"):
            assert_resumes_exactly(every("2 steps"), epoch=3, steps_per_epoch=10)

    def test_points_must_be_a_positive_count(self) -> None:
        """``points=0`` would check nothing: it is refused, naming the argument."""
        with pytest.raises(ValueError, match=r"points=0\): expected a whole number >= 1"):
            assert_resumes_exactly(every("2 steps"), points=0, epochs=1, steps_per_epoch=10)


_PLAIN_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=3),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner,
                                                                max_size=3), max_leaves=8)


@given(_PLAIN_VALUES, st.lists(st.sampled_from(["a", "b"]), max_size=3))
def test_one_plain_data_walk_names_the_same_key_path(value: Any, path: list[str]) -> None:
    """The checkpoint's check and ``checkpoint_round_trip`` are one walk (``nesting``):
    an object that is not plain data is refused by both at the same key path, each
    with its own error (``TypeError``; ``AssertionError`` in a user's test)."""
    from schedtrain.checkpoints.format import check_plain
    from schedtrain.testing.resume import checkpoint_round_trip

    state: dict[str, Any] = {"x": value}
    node = state
    for key in path:
        node[key] = {}
        node = node[key]
    node["bad"] = object()
    where = ".".join(["state", *path, "bad"])
    with pytest.raises(TypeError) as by_checkpoint:
        check_plain(state, "state")
    with pytest.raises(AssertionError) as by_test:
        checkpoint_round_trip(state)
    for err in (by_checkpoint, by_test):
        assert str(err.value).startswith(f"{where}: object <object object at")
    assert checkpoint_round_trip({"x": value}) == {"x": value}
