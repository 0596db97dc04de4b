"""Schedule coverage: the pytest plugin in real sessions, and the recorder against an oracle."""

from __future__ import annotations

import importlib

import pytest
from hypothesis import given, reject, settings
from hypothesis import strategies as st
from strategies import Shape, evaluated_at, evaluation_points, holds, schedules, shapes

from schedtrain import Schedule, ScheduleError, simulate
from schedtrain.planning.plan import plan_spec
from schedtrain.simulation import RunShape, Simulation
from schedtrain.spec.load import loads_spec
from schedtrain.testing.coverage import CallbackCoverage
from schedtrain.testing.plugin import count
from schedtrain.testing.recorder import Recorder
from schedtrain.triggers import Trigger, every, improved, on, plateau, when, window

pytest_plugins = ("pytester",)
simulate_module = importlib.import_module("schedtrain.simulation.simulate")
# Random trees often contain dead branches; their warnings are expected here.
pytestmark = pytest.mark.filterwarnings("ignore::schedtrain.ScheduleWarning")

#: A suite that exercises every part of its triggers.
COVERED = '''
from schedtrain import Schedule, every, improved, on, window, when
from schedtrain.testing import simulate

SCHEDULE = Schedule({
    "val": every("100 steps") & window(start="300 steps"),
    "ck": every("250 steps") | on("train_end"),
    "report": every("1 epoch") & when("loss < 0.5"),
    "quiet": every("100 steps") & ~window(start="200 steps", stop="300 steps"),
    "best": every("1 epoch") & improved("loss"),
})

def test_run():
    simulate(SCHEDULE, epochs=5, steps_per_epoch=100,
             metrics={"loss": [("1 epoch", 0.9), ("2 epochs", 0.4), ("3 epochs", 0.6)]})
'''

#: A suite whose run is too short to enter the validation window.
UNENTERED = '''
from schedtrain import Schedule, every, on, window
from schedtrain.testing import simulate

def test_short_run():
    simulate(Schedule({"val": every("100 steps") & window(start="1000 steps"),
                       "ck": every("500 steps") | on("train_end")}),
             epochs=2, steps_per_epoch=300)
'''


def _gap_lines(result: pytest.RunResult) -> list[str]:
    lines = result.outlines
    start = next(i for i, line in enumerate(lines) if "schedule coverage" in line)
    return [line.strip() for line in lines[start + 2:] if line.startswith("    ")]


class TestPlugin:
    """``pytest --schedule-coverage`` over real pytest sessions."""

    def test_off_by_default(self, pytester: pytest.Pytester) -> None:
        """Without the option nothing is recorded or reported, and simulations are not
        observed at all."""
        pytester.makepyfile(UNENTERED + '''
def test_nothing_observes():
    import sys
    assert sys.modules["schedtrain.simulation.simulate"]._observer is None
''')
        result = pytester.runpytest("-p", "no:cacheprovider")
        result.assert_outcomes(passed=2)
        assert "schedule coverage" not in result.stdout.str()

    def test_a_suite_that_exercises_every_part_reports_nothing(
            self, pytester: pytest.Pytester) -> None:
        """Every window entered and left, both branches of the any alone, the condition
        true and false, the `not` blocking, the metric trigger firing and not: no gap."""
        pytester.makepyfile(COVERED)
        result = pytester.runpytest("-p", "no:cacheprovider", "--schedule-coverage")
        result.assert_outcomes(passed=1)
        result.stdout.fnmatch_lines(["*= schedule coverage =*",
                                     "every part of the 5 simulated callback triggers "
                                     "decided a firing"])

    def test_a_window_never_entered_is_reported_exactly(
            self, pytester: pytest.Pytester) -> None:
        """The report names the window by key path and TOML spelling, and nothing else of
        that trigger (its `every` fired; the window kept it from counting)."""
        pytester.makepyfile(UNENTERED)
        result = pytester.runpytest("-p", "no:cacheprovider", "--schedule-coverage")
        result.assert_outcomes(passed=1)
        assert _gap_lines(result) == [
            'val.trigger.all[1] (start = "1000 steps"): window never entered']
        result.stdout.fnmatch_lines([
            "1 part of 1 callback (of 2 simulated) never decided a firing:",
            "*val (first simulated in test_*.py::test_short_run)"])

    def test_one_callback_is_counted_in_the_singular(self, pytester: pytest.Pytester) -> None:
        """One simulated callback, every part covered: no "1 ... triggers"."""
        pytester.makepyfile('''
from schedtrain import Schedule, every
from schedtrain.testing import simulate

def test_run():
    simulate(Schedule({"ck": every("5 steps")}), epochs=1, steps_per_epoch=10)
''')
        result = pytester.runpytest("-p", "no:cacheprovider", "--schedule-coverage")
        result.stdout.fnmatch_lines(["every part of the 1 simulated callback trigger "
                                     "decided a firing"])

    def test_an_any_branch_that_never_fired_is_named_by_key_path(
            self, pytester: pytest.Pytester) -> None:
        """A branch always true together with another never decided a firing alone."""
        pytester.makepyfile('''
from schedtrain import Schedule, every, on
from schedtrain.testing import simulate

def test_run():
    simulate(Schedule({"ck": every("500 steps") | every("1000 steps") | on("train_end")}),
             epochs=2, steps_per_epoch=1000)
''')
        result = pytester.runpytest("-p", "no:cacheprovider", "--schedule-coverage")
        assert _gap_lines(result) == [
            'ck.trigger.any[1] (every = "1000 steps"): never fired alone: each time it was '
            "true another branch fired too"]

    def test_coverage_is_the_union_over_tests(self, pytester: pytest.Pytester) -> None:
        """A window entered in one test and not in another is covered."""
        pytester.makepyfile(UNENTERED + '''
def test_long_run():
    simulate(Schedule({"val": every("100 steps") & window(start="1000 steps"),
                       "ck": every("500 steps") | on("train_end")}),
             epochs=2, steps_per_epoch=700)
''')
        result = pytester.runpytest("-p", "no:cacheprovider", "--schedule-coverage")
        result.stdout.fnmatch_lines(["every part of the 2 simulated callback triggers *"])

    def test_a_schedule_simulated_while_collecting_is_reported_outside_a_test(
            self, pytester: pytest.Pytester) -> None:
        """A simulation at import time counts too, and says it ran outside a test."""
        pytester.makepyfile(UNENTERED.replace("def test_short_run():", "if True:")
                            + "\ndef test_nothing():\n    pass\n")
        result = pytester.runpytest("-p", "no:cacheprovider", "--schedule-coverage")
        result.stdout.fnmatch_lines(["  val (first simulated outside a test)",
                                     "*window never entered"])

    def test_fail_option_fails_a_passing_session_with_gaps(
            self, pytester: pytest.Pytester) -> None:
        """``--schedule-coverage-fail`` turns gaps into a failed session, and only gaps."""
        pytester.makepyfile(test_short=UNENTERED)
        result = pytester.runpytest("-p", "no:cacheprovider", "--schedule-coverage-fail")
        assert result.ret == pytest.ExitCode.TESTS_FAILED
        result.stdout.fnmatch_lines(["*window never entered",
                                     "failing the session: --schedule-coverage-fail"])
        pytester.makepyfile(test_short=COVERED)
        result = pytester.runpytest("-p", "no:cacheprovider", "--schedule-coverage-fail")
        assert result.ret == pytest.ExitCode.OK

    def test_loads_with_p_too(self, pytester: pytest.Pytester) -> None:
        """``-p schedtrain.testing.plugin`` (where the entry point is not loaded) works, and
        with the entry point loaded as well it is not registered twice."""
        pytester.makepyfile(UNENTERED)
        result = pytester.runpytest("-p", "no:cacheprovider", "-p", "schedtrain.testing.plugin",
                                    "--schedule-coverage")
        result.assert_outcomes(passed=1)
        assert _gap_lines(result) == [
            'val.trigger.all[1] (start = "1000 steps"): window never entered']

    def test_a_spec_from_toml_is_reported_in_its_own_keys(
            self, pytester: pytest.Pytester) -> None:
        """A TOML schedule's parts are named by callback, key path and the keys written."""
        pytester.makepyfile('''
from schedtrain.spec.load import loads_spec
from schedtrain.testing import simulate

SPEC = loads_spec("""
[callbacks.report]
trigger = { every = "10 steps", if = "loss < 0.5" }
""")

def test_run():
    simulate(SPEC.schedule(), epochs=1, steps_per_epoch=50,
             metrics={"loss": [("1 steps", 0.1)]})
''')
        result = pytester.runpytest("-p", "no:cacheprovider", "--schedule-coverage")
        assert _gap_lines(result) == [
            'report.trigger.all[1] (if = "loss < 0.5"): condition never false where the '
            "rest held"]


def _decisive(schedule: Schedule, shape: Shape) -> dict[str, tuple[list[bool], list[bool]]]:
    """Per callback and part (pre-order), whether it decided a firing and a non-firing
    anywhere, found by evaluating every part at every point (no table, no bounds)."""
    out = {}
    for entry in schedule.entries:
        name, nodes = entry.default_name(), _preorder(entry.trigger)
        seen = CallbackCoverage(name, entry.trigger, "")
        for event, now, prev in evaluation_points(shape):
            if evaluated_at(entry.trigger, event):
                values = [int(holds(t, event, now, prev)) for t in nodes]
                seen.observe(values, bool(values[0]))
        out[name] = (seen.fired, seen.blocked)
    return out


def _preorder(trigger):
    out = [trigger]
    if type(trigger).__name__ in ("AllOf", "AnyOf", "Not"):
        for c in trigger.children():
            out.extend(_preorder(c))
    return out


class TestRecorder:
    """What the recorder sees, checked against evaluating every part at every point."""

    @settings(max_examples=60, deadline=None)
    @given(schedules(), shapes())
    def test_coverage_never_changes_firings(self, schedule: Schedule, shape: Shape) -> None:
        """A simulation under coverage fires exactly what it fires without."""
        try:
            plain = list(simulate(schedule, **shape.kwargs()))
        except ScheduleError:
            reject()
        recorder = Recorder()
        recorder.start()
        try:
            covered = list(simulate(schedule, **shape.kwargs()))
        finally:
            recorder.stop()
        assert covered == plain

    @settings(max_examples=60, deadline=None)
    @given(schedules(), shapes())
    def test_what_decided_a_firing_matches_every_point(self, schedule: Schedule,
                                                       shape: Shape) -> None:
        """For clock-only triggers, the parts that decided a firing, and the parts of an
        `all` that decided against one, are those a point-by-point evaluation finds,
        although the table skips points where nothing can fire."""
        recorder = Recorder()
        recorder.start()
        try:
            simulate(schedule, **shape.kwargs())
        except ScheduleError:
            reject()
        finally:
            recorder.stop()
        expected = _decisive(schedule, shape)
        for (name, _), cov in recorder.callbacks.items():
            fired, blocked = expected[name]
            assert cov.fired == fired, name
            for i, p in enumerate(cov.parts):
                if p.parent >= 0 and cov.parts[p.parent].kind == "all" \
                        and not cov._under_not(i):
                    assert cov.blocked[i] == blocked[i], (name, p.path)

    def test_a_metric_trigger_that_never_fired(self) -> None:
        """A loss that improves every epoch never plateaus: the plateau is named."""
        recorder = Recorder()
        recorder.start()
        try:
            simulate(Schedule({"drop": every("1 epoch") & plateau("loss", patience=2)}),
                     epochs=3, steps_per_epoch=10,
                     metrics={"loss": [("1 epoch", 0.9), ("2 epochs", 0.8), ("3 epochs", 0.7)]})
        finally:
            recorder.stop()
        assert [str(g) for g in recorder.gaps()] == [
            'drop.trigger.all[1] (plateau = "loss", patience = 2, mode = "min"): metric trigger '
            "never fired"]

    @pytest.mark.parametrize(("trigger", "gap"), [
        (on("swa_start"), 'cb.trigger (on = "swa_start"): never evaluated: no simulation '
                          "reached an event it watches"),
        (every("5 steps") & when("loss > 5"),
         'cb.trigger.all[1] (if = "loss > 5"): condition never true'),
        (every("5 steps") & ~window(start="100 steps"),
         "cb.trigger.all[1] (not = { start = \"100 steps\" }): `not` never blocked a firing"),
        (every("5 steps") & window(stop="100 steps"),
         'cb.trigger.all[1] (stop = "100 steps"): window never blocked a firing: the rest '
         "never held outside it"),
        (every("5 steps") & window(start="100 steps", stop="200 steps") | on("train_end"),
         'cb.trigger.any[0].all[1] (start = "100 steps", stop = "200 steps"): window never '
         "entered"),
    ])
    def test_each_kind_of_gap_is_named(self, trigger: Trigger, gap: str) -> None:
        """Each way a part can go untested is reported in its own words, at its key path."""
        recorder = Recorder()
        recorder.start()
        try:
            simulate(Schedule({"cb": trigger}, events=("swa_start",)), epochs=1,
                     steps_per_epoch=50, metrics={"loss": [("1 steps", 1.0)]})
        finally:
            recorder.stop()
        assert [str(g) for g in recorder.gaps()] == [gap]

    def test_plan_reports_the_same_under_coverage(self) -> None:
        """What ``plan`` says of callbacks evaluated at every step is the trigger's own."""
        # coverage looks at `a` at every step inside its window until its `every` has
        # blocked once; `a` is still not a callback evaluated at every step
        spec = loads_spec('[callbacks.a]\ntrigger = { every = "10 steps", stop = "50 steps" }\n'
                          '[callbacks.b]\ntrigger = { stop = "15 steps" }\n')
        shape = RunShape.build(epochs=1, steps_per_epoch=20)
        recorder = Recorder()
        recorder.start()
        try:
            covered = Simulation(spec.schedule(), shape)
            assert covered.table.always_evaluated == ("b",)  # as plan asks, before the run
            assert plan_spec(spec, shape=shape).always == ("b",)
        finally:
            recorder.stop()
        assert simulate_module._observer is None

    def test_resumed_simulations_keep_trigger_state(self) -> None:
        """A probed table saves and loads the same trigger state as a plain one."""
        schedule = Schedule({"best": on("step_end") & improved("loss"),
                             "v": every("3 steps") & window(start="4 steps")})
        metrics = {"loss": [(f"{k} steps", 1.0 / k) for k in range(1, 30)]}
        plain = Simulation(schedule, RunShape.build(
            epochs=1, steps_per_epoch=30), metrics=metrics)
        plain.run(until_step=12)
        recorder = Recorder()
        recorder.start()
        try:
            covered = Simulation(schedule, RunShape.build(
                epochs=1, steps_per_epoch=30), metrics=metrics)
            covered.run(until_step=12)
        finally:
            recorder.stop()
        assert covered.state_dict() == plain.state_dict()


@given(st.integers(0, 10**6), st.sampled_from(["part", "callback", "simulated callback trigger"]))
def test_counts_are_plural_unless_one(n: int, noun: str) -> None:
    """The report's counts agree with their number: 1 part, 0 parts, 2 parts."""
    assert count(n, noun) == (f"1 {noun}" if n == 1 else f"{n} {noun}s")
