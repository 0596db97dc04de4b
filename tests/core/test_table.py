"""The compiled trigger table: static checks, evaluation order, cost, explain, state."""

from __future__ import annotations

import re
import warnings

import pytest

from schedtrain import Schedule, ScheduleError, ScheduleWarning, Timestamp
from schedtrain.clock import LoopClock
from schedtrain.triggers import MetricValue, at, every, improved, on, when, window


class Store:
    """A tiny metric store."""

    def __init__(self) -> None:
        self.values: dict[str, list[float]] = {}

    def put(self, name: str, value: float) -> None:
        self.values.setdefault(name, []).append(value)

    def latest(self, name: str) -> MetricValue | None:
        v = self.values.get(name)
        return MetricValue(v[-1], len(v)) if v else None


class Spy:
    """Wraps a compiled node and records where it is evaluated."""

    def __init__(self, node, seen: list[int]) -> None:
        self.node, self.seen = node, seen

    def evaluate(self, pt):
        self.seen.append(pt.now.step)
        return self.node.evaluate(pt)

    def bound(self, event, last):
        return self.node.bound(event, last)


def run_steps(table, clock: LoopClock, n: int) -> list[tuple[int, tuple[str, ...]]]:
    out = []
    for _ in range(n):
        clock.end_batch()
        clock.end_step()
        fired = table.step_end()
        if fired:
            out.append((clock.step, fired))
    return out


class TestStaticChecks:
    """A schedule that cannot work is refused at compile time, naming the trigger."""

    def test_step_and_epoch_conjunction_never_fires(self) -> None:
        """An ``all`` of a step-only and an epoch-only trigger is an error."""
        with pytest.raises(ScheduleError, match="never fire") as info:
            Schedule({"x": every("3 steps") & every("2 epochs")}).compile()
        assert info.value.problems[0].path == "callbacks.x.trigger"

    def test_points_outside_window(self) -> None:
        """Points that all lie outside the window are an error."""
        with pytest.raises(ScheduleError, match=re.escape(
                "at('5 steps', '8 steps') is never true at step 10 or later, and "
                "window(start='10 steps') is not true before step 10")):
            Schedule({"x": at("5 steps", "8 steps") & window(start="10 steps")}).compile()

    def test_period_past_window(self) -> None:
        """A period whose first firing is after the window ends is an error."""
        with pytest.raises(ScheduleError, match=re.escape(
                "window(stop='500 steps') is never true at step 1000 or later, and "
                "every('1000 steps') is not true before step 1000")):
            Schedule({"x": every("1000 steps") & window(stop="500 steps")}).compile()

    def test_disjoint_windows(self) -> None:
        """Windows on one counter that do not overlap are an error."""
        t = every("1 step") & window(stop="5 steps") & window(start="10 steps")
        with pytest.raises(ScheduleError, match=re.escape(
                "window(stop='5 steps') is never true at step 10 or later")):
            Schedule({"x": t}).compile()

    def test_unknown_event_suggests(self) -> None:
        """A misspelled event gets a suggestion; custom events must be declared."""
        with pytest.raises(ScheduleError, match="did you mean 'train_end'"):
            Schedule({"x": on("train_ned")}).compile()
        Schedule({"x": on("swa_start")}, events=["swa_start"]).compile()

    def test_every_problem_is_listed(self) -> None:
        """All problems are reported at once, each with its path."""
        with pytest.raises(ScheduleError) as info:
            Schedule({"a": on("nope"), "b": every("1 step") & every("1 epoch")}).compile()
        assert [p.path for p in info.value.problems] == [
            "callbacks.a.trigger", "callbacks.b.trigger"]

    def test_unregistered_predicate(self) -> None:
        """A condition naming an unregistered predicate is an error when predicates are given."""
        with pytest.raises(ScheduleError, match=r"'is_chef' is not registered.*is_chief"):
            Schedule({"a": every("1 step") & when("is_chef")}).compile(
                predicates={"is_chief": lambda pt: True})

    def test_metric_nobody_produces_warns(self) -> None:
        """A condition on a metric no callback produces is a warning naming it."""
        with pytest.warns(ScheduleWarning, match="'val/los'.*did you mean 'val/loss'"):
            table = Schedule({"a": every("1 epoch") & when("val/los < 1")}).compile(
                produced_metrics={"val/loss"})
        assert len(table.warnings) == 1

    def test_dead_branch_warns(self) -> None:
        """An ``any`` branch that can never fire is reported as dead."""
        with pytest.warns(ScheduleWarning, match="dead"):
            Schedule({"a": on("train_end") | (every("1 step") & every("1 epoch"))}).compile()

    def test_duplicate_names(self) -> None:
        """Two callbacks with one name are refused."""
        from schedtrain import Scheduled

        with pytest.raises(ValueError, match="used twice"):
            Schedule([Scheduled(every("1 step"), name="a"), Scheduled(every("2 steps"), name="a")])


class TestFiring:
    """Firing through the loop clock."""

    def test_declared_order_and_once_per_event(self) -> None:
        """Callbacks fire in declared order, once each even when satisfied twice."""
        sched = Schedule({"b": every("2 steps") | every("3 steps"), "a": every("6 steps")})
        table = sched.compile()
        clock = LoopClock()
        table.attach(clock)
        assert run_steps(table, clock, 6) == [
            (2, ("b",)), (3, ("b",)), (4, ("b",)), (6, ("b", "a"))]

    def test_dynamic_parts_only_when_clock_part_fires(self) -> None:
        """A condition is evaluated only at steps where its clock part holds."""
        calls: list[int] = []
        sched = Schedule({"r": every("100 steps") & when(lambda pt: calls.append(pt.now.step)
                                                          or True)})
        table = sched.compile(predicates={})
        clock = LoopClock()
        table.attach(clock, predicates={})
        run_steps(table, clock, 1000)
        assert calls == list(range(100, 1001, 100))

    def test_skipped_steps_evaluate_nothing(self) -> None:
        """Between firings no trigger node is evaluated, however many callbacks there are."""
        evaluated: list[int] = []
        sched = Schedule({f"c{i}": every(1000 + i, "steps") for i in range(50)})
        table = sched.compile()
        table.nodes = tuple(Spy(n, evaluated) for n in table.nodes)
        clock = LoopClock()
        table.attach(clock)
        run_steps(table, clock, 999)
        assert evaluated == []
        run_steps(table, clock, 1)
        assert evaluated == [1000]

    def test_resumed_table_evaluates_where_the_uninterrupted_one_did(self) -> None:
        """Attached to a clock restored after step 9 (evaluated before the save), the table
        evaluates next at step 12, as the uninterrupted table did: a metric trigger beside
        a conditioned clock part is looked at only there, so it sees the same values."""
        def evaluated(resume_at: int | None) -> list[int]:
            seen: list[int] = []
            sched = Schedule({"r": improved("m") & (at("1 step")
                                                    | (every("3 steps") & when("m < 0.5")))})
            table = sched.compile(predicates={})
            table.nodes = tuple(Spy(n, seen) for n in table.nodes)
            clock, store = LoopClock(), Store()
            table.attach(clock, store, predicates={})
            for step in range(1, 16):
                if step - 1 == resume_at:
                    restored = LoopClock()
                    restored.load_state_dict(clock.state_dict())
                    clock = restored
                    table.attach(clock, store, predicates={})
                clock.end_batch()
                clock.end_step()
                store.put("m", float(step * 7 % 5))
                if clock.step >= table.step_due:
                    table.step_end()
            return seen

        assert evaluated(9) == evaluated(None) == [1, 3, 6, 9, 12, 15]

    def test_metric_trigger_in_loop(self) -> None:
        """``improved`` reads the metric store at epoch ends."""
        store = Store()
        table = Schedule({"best": every("1 epoch") & improved("val/loss")}).compile()
        clock = LoopClock()
        table.attach(clock, store)
        fired = []
        for loss in [0.5, 0.4, 0.6, 0.3]:
            clock.end_step()
            clock.end_epoch()
            store.put("val/loss", loss)
            fired.append(bool(table.epoch_end()))
        assert fired == [True, True, False, True]

    def test_requires_attach(self) -> None:
        """Firing before attaching to a clock is a clear error."""
        table = Schedule({"a": on("train_end")}).compile()
        with pytest.raises(RuntimeError, match="attach"):
            table.decide("train_end")


class TestExplain:
    """``explain`` says which callbacks fire at a point and why."""

    def test_explain(self) -> None:
        """Firing and non-firing callbacks are explained with their reasons."""
        table = Schedule({"ckpt": every("500 steps"), "val": every("1 epoch")}).compile()
        ex = table.explain("step_end", Timestamp(step=1500))
        assert ex.firing == ("ckpt",)
        text = str(ex)
        assert "crossed 1500" in text
        assert "[val] every('1 epoch'): no — not evaluated at step_end" in text

    def test_always_evaluated_reported(self) -> None:
        """A trigger with no clock part is listed as evaluated at every step."""
        table = Schedule({"a": when("loss < 1"), "b": every("5 steps")}).compile()
        assert table.always_evaluated == ("a",)


class TestState:
    """Trigger state round-trips."""

    def test_metric_state_round_trips(self) -> None:
        """The best value of ``improved`` survives ``state_dict``/``load_state_dict``."""
        store = Store()
        sched = Schedule({"best": every("1 epoch") & improved("val/loss")})
        table = sched.compile()
        clock = LoopClock()
        table.attach(clock, store)
        clock.end_step()
        clock.end_epoch()
        store.put("val/loss", 0.5)
        assert table.epoch_end() == ("best",)
        state, clock_state = table.state_dict(), clock.state_dict()

        fresh, fresh_clock = sched.compile(), LoopClock()
        fresh_clock.load_state_dict(clock_state)
        fresh.attach(fresh_clock, store)
        fresh.load_state_dict(state)
        fresh_clock.end_step()
        fresh_clock.end_epoch()
        store.put("val/loss", 0.6)
        assert fresh.epoch_end() == ()

    def test_unknown_names_in_state(self) -> None:
        """Loading state for callbacks that are not in the schedule is refused."""
        table = Schedule({"a": every("1 step")}).compile()
        with pytest.raises(ValueError, match="not in this schedule"):
            table.load_state_dict({"triggers": {"zzz": {}}})

    def test_compiling_twice_gives_independent_state(self) -> None:
        """Each compiled table has its own metric state."""
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            sched = Schedule({"best": every("1 epoch") & improved("m")})
            assert sched.compile().nodes[0] is not sched.compile().nodes[0]


class TestRunWhileEvaluating:
    """``fire(event, run)`` runs each callback before later triggers are evaluated."""

    def test_metric_produced_earlier_is_seen_at_the_same_event(self) -> None:
        """A plateau trigger sees the value a callback declared before it put at this event.

        ``run`` gets each firing callback's name and the clock at the event.
        """
        from schedtrain import Schedule
        from schedtrain.clock import LoopClock
        from schedtrain.triggers import MetricValue, every, improved

        values: dict[str, MetricValue] = {}

        class Store:
            def latest(self, name: str) -> MetricValue | None:
                return values.get(name)

        table = Schedule({"validate": every("1 epoch"),
                          "best": improved("val/loss")}).compile()
        clock = LoopClock()
        table.attach(clock, Store())
        clock.end_epoch()
        ran: list[tuple[str, int]] = []

        def run(name: str, now: Timestamp) -> None:
            ran.append((name, now.epoch))
            if name == "validate":
                values["val/loss"] = MetricValue(0.5, 1)

        assert table.epoch_end(run) == ("validate", "best")
        assert ran == [("validate", 1), ("best", 1)]

    def test_equal_conditions_are_evaluated_per_callback(self) -> None:
        """Equal conditional triggers are not shared: the later one sees the metric put
        in between."""
        values: dict[str, MetricValue] = {}

        class Store:
            def latest(self, name: str) -> MetricValue | None:
                return values.get(name)

        cond = every("1 epoch") & when("ready > 0")
        table = Schedule({"a": cond, "setter": every("1 epoch"), "b": cond}).compile(
            produced_metrics=["ready"])
        clock = LoopClock()
        table.attach(clock, Store())
        clock.end_epoch()

        def run(name: str, now: Timestamp) -> None:
            if name == "setter":
                values["ready"] = MetricValue(1.0, 1)

        assert table.epoch_end(run) == ("setter", "b")


class TestSharedTriggers:
    """Callbacks with equal clock-only triggers fire, and are next due, together."""

    def test_equal_periodic_triggers_fire_together_every_time(self) -> None:
        """100 callbacks on one period all fire at each multiple, and nowhere else."""
        names = {f"cb{i}": every(3, "steps") for i in range(100)}
        names["other"] = every(2, "steps")
        table = Schedule(names).compile()
        clock = LoopClock()
        table.attach(clock)
        fired = run_steps(table, clock, 12)
        by_step = {step: set(got) for step, got in fired if got}
        every3 = {f"cb{i}" for i in range(100)}
        assert by_step == {2: {"other"}, 3: every3, 4: {"other"}, 6: every3 | {"other"},
                           8: {"other"}, 9: every3, 10: {"other"}, 12: every3 | {"other"}}
