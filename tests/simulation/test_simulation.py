"""The simulated clock: jumping simulation against a brute-force oracle, resume, run shapes."""

from __future__ import annotations

import pytest
from hypothesis import given, reject, settings
from hypothesis import strategies as st
from strategies import Shape, brute_force, schedules, shapes

from schedtrain import Schedule, ScheduleError, simulate
from schedtrain.simulation import RunShape, SimClock, Simulation
from schedtrain.triggers import every, improved, on, plateau, when

# Random trees often contain dead branches; their warnings are expected here.
pytestmark = pytest.mark.filterwarnings("ignore::schedtrain.ScheduleWarning")

def _as_tuples(log):
    return [(f.callback, f.event, f.timestamp) for f in log]


class TestAgainstBruteForce:
    """``simulate`` jumps between possible firings; the result must equal visiting every point."""

    @given(schedules(), shapes())
    def test_jumping_equals_step_by_step(self, schedule: Schedule, shape: Shape) -> None:
        """Random clock-only trigger trees fire exactly as a point-by-point evaluation says."""
        try:
            log = simulate(schedule, **shape.kwargs())
        except ScheduleError:
            reject()  # covered by test_never_fire_checks_are_sound
        assert _as_tuples(log) == brute_force(schedule, shape)

    @given(schedules(max_callbacks=1), shapes())
    def test_never_fire_checks_are_sound(self, schedule: Schedule, shape: Shape) -> None:
        """A trigger refused as 'can never fire' indeed never fires in any run."""
        try:
            schedule.compile()
        except ScheduleError:
            assert brute_force(schedule, shape) == []

    @given(schedules(), st.lists(st.integers(1, 400), min_size=1, max_size=6))
    def test_long_uneven_epochs(self, schedule: Schedule, lengths: list[int]) -> None:
        """Longer runs with uneven epochs agree too (steps and epochs only)."""
        shape = Shape(tuple(lengths), 1, 1, 0, 0.0)
        try:
            log = simulate(schedule, **shape.kwargs())
        except ScheduleError:
            reject()
        assert _as_tuples(log) == brute_force(schedule, shape)


class TestResume:
    """Interrupted anywhere and resumed from ``state_dict``, a run fires as if uninterrupted."""

    @given(schedules(), shapes(), st.integers(0, 200))
    def test_resume_equals_uninterrupted(self, schedule: Schedule, shape: Shape, cut: int) -> None:
        """Stopping after a random step and resuming in a fresh simulation changes nothing."""
        run = RunShape.build(**shape.kwargs())
        try:
            whole = Simulation(schedule, run).run()
        except ScheduleError:
            reject()
        cut = cut % (run.total_steps + 1)
        first = Simulation(schedule, run)
        head = first.run(until_step=cut)
        state = first.state_dict()
        second = Simulation(schedule, run)
        second.load_state_dict(state)
        assert list(head) + list(second.run()) == list(whole)

    @given(st.integers(1, 59), st.lists(st.floats(0.1, 1.0), min_size=6, max_size=6))
    def test_resume_keeps_metric_trigger_state(self, cut: int, losses: list[float]) -> None:
        """``improved`` and ``plateau`` carry their best value and wait across a resume."""
        schedule = Schedule({
            "best": every("1 epoch") & improved("val/loss"),
            "stop": every("1 epoch") & plateau("val/loss", patience=2),
        })
        metrics = {"val/loss": [(f"{e + 1} epochs", v) for e, v in enumerate(losses)]}
        run = RunShape.build(epochs=6, steps_per_epoch=10)
        whole = Simulation(schedule, run, metrics=metrics).run()
        first = Simulation(schedule, run, metrics=metrics)
        head = first.run(until_step=cut)
        second = Simulation(schedule, run, metrics=metrics)
        second.load_state_dict(first.state_dict())
        assert list(head) + list(second.run()) == list(whole)


class TestDesignTimelines:
    """The worked examples of DESIGN §3."""

    def test_every_three_steps(self) -> None:
        """``every 3 steps`` fires at the step end of steps 3, 6, 9."""
        log = simulate(Schedule({"a": every("3 steps")}), epochs=1, steps_per_epoch=10)
        assert log.steps("a") == [3, 6, 9]
        assert set(log.events("a")) == {"step_end"}

    def test_every_two_epochs(self) -> None:
        """``every 2 epochs`` fires at the epoch end of epochs 2 and 4."""
        log = simulate(Schedule({"a": every("2 epochs")}), epochs=5, steps_per_epoch=3)
        assert log.epochs("a") == [2, 4]
        assert set(log.events("a")) == {"epoch_end"}

    def test_sample_period_never_skipped_or_doubled(self) -> None:
        """A counter jumping by more than the period fires once per crossing point."""
        log = simulate(Schedule({"a": every("10 samples")}), epochs=1, steps_per_epoch=10,
                       samples_per_batch=25)
        # samples after each step: 25, 50, 75, ... every step crosses a multiple of 10
        assert log.steps("a") == list(range(1, 11))

    def test_start_stop_window(self) -> None:
        """``start`` is inclusive and ``stop`` exclusive, on the clock at the evaluation point."""
        from schedtrain.triggers import window

        sched = Schedule({"a": every("1 epoch") & window(start="2 epochs", stop="5 epochs")})
        log = simulate(sched, epochs=8, steps_per_epoch=2)
        assert log.epochs("a") == [2, 3, 4]

    def test_lifecycle_events_in_order(self) -> None:
        """Events come in loop order: train_start, epoch_start, step_end, epoch_end, train_end."""
        sched = Schedule({e: on(e) for e in
                          ("train_start", "epoch_start", "step_end", "epoch_end", "train_end")})
        log = simulate(sched, epochs=1, steps_per_epoch=2)
        assert [f.event for f in log] == [
            "train_start", "epoch_start", "step_end", "step_end", "epoch_end", "train_end"]

    def test_callbacks_at_one_event_in_declared_order(self) -> None:
        """Callbacks firing at the same event run in the order they were declared."""
        sched = Schedule({"z": every("1 epoch"), "a": every("1 epoch"), "m": every("1 epoch")})
        log = simulate(sched, epochs=1, steps_per_epoch=1)
        assert [f.callback for f in log] == ["z", "a", "m"]

    def test_once_per_event_when_satisfied_twice(self) -> None:
        """A trigger true several ways at one event still fires once there."""
        sched = Schedule({"a": every("2 steps") | every("3 steps") | at_six()})
        log = simulate(sched, epochs=1, steps_per_epoch=6)
        assert log.steps("a") == [2, 3, 4, 6]


def at_six():
    from schedtrain.triggers import at

    return at("6 steps")


class TestConditionsAndMetrics:
    """Dynamic parts: conditional firings without metrics, resolved with a metric stream."""

    def test_conditional_without_metrics(self) -> None:
        """Without metric values, a firing that needs one is listed where its clock part fires."""
        sched = Schedule({"r": every("2 steps") & when("val/loss < 0.5")})
        log = simulate(sched, epochs=1, steps_per_epoch=6)
        assert log.steps("r") == [2, 4, 6]
        assert all(f.conditional for f in log)

    def test_metric_stream_resolves_conditions(self) -> None:
        """A metric stream decides the condition at each clock firing."""
        sched = Schedule({"r": every("2 steps") & when("val/loss < 0.5")})
        log = simulate(sched, epochs=1, steps_per_epoch=8,
                       metrics={"val/loss": [(1, 0.9), (3, 0.4), (5, 0.7), (7, 0.1)]})
        assert log.steps("r") == [4, 8]
        assert not any(f.conditional for f in log)

    def test_improved_fires_on_new_best_only(self) -> None:
        """``improved`` fires when a new value beats the best so far."""
        sched = Schedule({"best": every("1 epoch") & improved("val/loss")})
        losses = [0.9, 0.8, 0.85, 0.7, 0.7]
        log = simulate(sched, epochs=5, steps_per_epoch=1, metrics={
            "val/loss": [(f"{i + 1} epochs", v) for i, v in enumerate(losses)]})
        assert log.epochs("best") == [1, 2, 4]

    def test_plateau_fires_after_patience(self) -> None:
        """``plateau`` fires after `patience` new values without a new best."""
        sched = Schedule({"stop": every("1 epoch") & plateau("val/loss", patience=2)})
        losses = [0.9, 0.8, 0.85, 0.81, 0.5, 0.6, 0.7]
        log = simulate(sched, epochs=7, steps_per_epoch=1, metrics={
            "val/loss": [(f"{i + 1} epochs", v) for i, v in enumerate(losses)]})
        assert log.epochs("stop") == [4, 7]

    def test_predicates_decide_when_given(self) -> None:
        """A registered predicate is called at clock firings only."""
        calls: list[int] = []

        def is_chief(pt):
            calls.append(pt.now.step)
            return pt.now.step != 4

        sched = Schedule({"r": every("2 steps") & when("is_chief")})
        log = simulate(sched, epochs=1, steps_per_epoch=6, predicates={"is_chief": is_chief})
        assert log.steps("r") == [2, 6]
        assert calls == [2, 4, 6]


class TestMaxSteps:
    """``max_steps`` ends a simulated run as it ends a real one."""

    def test_cut_mid_epoch_has_no_epoch_end(self) -> None:
        """An epoch cut short starts but never ends; train_end follows the last step."""
        sched = Schedule({"e": every("1 epoch"), "s": on("epoch_start"), "t": on("train_end")})
        log = simulate(sched, epochs=3, steps_per_epoch=4, max_steps=6)
        assert [(f.callback, f.step, f.epoch) for f in log] == [
            ("s", 0, 0), ("e", 4, 1), ("s", 4, 1), ("t", 6, 1)]

    def test_cut_at_an_epoch_end_keeps_it(self) -> None:
        """A cut exactly at an epoch's last step still ends that epoch."""
        log = simulate(Schedule({"e": every("1 epoch")}), epochs=3, steps_per_epoch=4,
                       max_steps=8)
        assert log.epochs("e") == [1, 2]


class TestCustomEvents:
    """Custom events are declared on the schedule and fired at chosen steps."""

    def test_custom_event_fires_after_its_step(self) -> None:
        """``on('swa_start')`` fires when the simulation fires that event."""
        sched = Schedule({"swa": on("swa_start"), "s": every("5 steps")}, events=["swa_start"])
        log = simulate(sched, epochs=1, steps_per_epoch=10, events={"swa_start": [5]})
        assert [(f.callback, f.event, f.step) for f in log] == [
            ("s", "step_end", 5), ("swa", "swa_start", 5), ("s", "step_end", 10)]

    def test_undeclared_custom_event_is_refused(self) -> None:
        """Firing an event the schedule does not declare is a clear error."""
        with pytest.raises(ScheduleError, match="not declared"):
            simulate(Schedule({"a": every("1 step")}), epochs=1, steps_per_epoch=2,
                     events={"nope": [1]})


class TestScale:
    """Jumping makes long runs with few firings cheap (timed in benchmarks/, not here)."""

    def test_billion_steps(self) -> None:
        """10^9 steps with sparse triggers give the exact firing count."""
        sched = Schedule({"a": every(10**8, "steps"), "b": every(100, "epochs")})
        log = simulate(sched, epochs=1000, steps_per_epoch=10**6)
        assert log.count("a") == 10
        assert log.count("b") == 10


class TestSimClock:
    """``SimClock`` moves forward only."""

    def test_refuses_to_go_backwards(self) -> None:
        """Moving to an earlier point raises a clear error."""
        clock = SimClock(RunShape.build(epochs=2, steps_per_epoch=5))
        clock.to_step_end(4)
        with pytest.raises(ValueError, match="can't go backwards"):
            clock.to_step_end(2)
        with pytest.raises(ValueError, match="can't go backwards"):
            clock.advance(-1)

    def test_counters_follow_the_run_shape(self) -> None:
        """Samples, tokens, seconds and epochs follow the configured rates."""
        clock = SimClock(RunShape.build(epochs=2, steps_per_epoch=5, batches_per_step=2,
                                        samples_per_batch=8, tokens_per_batch=100,
                                        seconds_per_step=0.5))
        clock.advance(7)
        ts = clock.now()
        assert (ts.step, ts.batch, ts.epoch, ts.step_in_epoch) == (7, 14, 1, 2)
        assert (ts.sample, ts.token, ts.seconds) == (112, 1400, 3.5)

    def test_advances_by_epochs(self) -> None:
        """``advance_epochs`` moves to epoch ends of uneven epochs."""
        clock = SimClock(RunShape.build(epoch_lengths=[3, 5, 2]))
        clock.advance_epochs(1)
        assert (clock.step, clock.epoch) == (3, 1)
        clock.advance_epochs(2)
        assert (clock.step, clock.epoch) == (10, 3)
        with pytest.raises(ValueError, match="past the run"):
            clock.advance_epochs(1)

    def test_bad_shape_is_refused(self) -> None:
        """An epoch of zero steps is refused with the offending index."""
        with pytest.raises(ValueError, match=r"epoch_lengths\[1\]"):
            RunShape.build(epoch_lengths=[3, 0])


class TestRunShapePassedOnce:
    """``simulate(shape=RunShape.build(...))`` is the keywords built once."""

    @given(st.integers(1, 4), st.integers(1, 9), st.integers(0, 3), st.integers(1, 40))
    @settings(max_examples=40, deadline=None)
    def test_shape_equals_its_keywords(self, epochs: int, steps: int, samples: int,
                                       cut: int) -> None:
        schedule = Schedule({"a": every("3 steps"), "b": every("1 epoch"),
                             "c": every("5 samples")})
        kw = {"epochs": epochs, "steps_per_epoch": steps, "samples_per_batch": samples,
              "max_steps": cut}
        assert (list(simulate(schedule, shape=RunShape.build(**kw)))
                == list(simulate(schedule, **kw)))

    def test_shape_and_keywords_together_are_refused(self) -> None:
        shape = RunShape.build(epochs=1, steps_per_epoch=3)
        with pytest.raises(TypeError, match="steps_per_epoch"):
            simulate(Schedule({"a": every("1 step")}), shape=shape, steps_per_epoch=4)
