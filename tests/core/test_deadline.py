"""Deadlines: `time_left` in conditions and `before_deadline`, on a simulated or fake clock."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schedtrain import Schedule, SpecError
from schedtrain.clock import LoopClock
from schedtrain.simulation import Simulation, simulate
from schedtrain.simulation.simclock import RunShape
from schedtrain.spec import loads_spec
from schedtrain.triggers import before_deadline, every, parse_condition, when
from schedtrain.triggers.conditions import Compare


def steps_of(log, name: str) -> list[int]:
    return [f.timestamp.step for f in log if f.callback == name and f.event == "step_end"]


def test_time_left_compares_with_durations() -> None:
    assert parse_condition("time_left < 10 min") == Compare(("time_left", 600.0), ("<",))
    assert parse_condition("90 s >= time_left") == Compare((90.0, "time_left"), (">=",))


def test_before_deadline_fires_once_at_the_first_step_under_the_margin() -> None:
    # one step a second, deadline 100 s after the start: 9 s are left after step 91
    sched = Schedule({"ckpt": before_deadline("10 s"), "late": when("time_left < 10 s")})
    log = simulate(sched, steps_per_epoch=150, epochs=1, seconds_per_step=1.0,
                   deadline="100 s")
    assert steps_of(log, "ckpt") == [91]
    assert steps_of(log, "late") == list(range(91, 151))


def test_without_a_deadline_nothing_fires() -> None:
    sched = Schedule({"ckpt": before_deadline("10 s"), "late": when("time_left < 1 h")})
    log = simulate(sched, steps_per_epoch=50, epochs=1, seconds_per_step=1.0)
    assert steps_of(log, "ckpt") == steps_of(log, "late") == []


def test_before_deadline_never_fires_twice_across_a_resume() -> None:
    sched = Schedule({"ckpt": before_deadline("30 s"), "tick": every("20 steps")})
    shape = RunShape.build(steps_per_epoch=100, epochs=1, seconds_per_step=1.0)
    whole = Simulation(sched, shape, deadline="80 s").run()
    first = Simulation(sched, shape, deadline="80 s")
    head = first.run(until_step=60)
    second = Simulation(sched, shape, deadline="80 s")
    second.load_state_dict(first.state_dict())
    tail = second.run()
    assert steps_of(whole, "ckpt") == [51]
    assert steps_of(head, "ckpt") + steps_of(tail, "ckpt") == [51]
    assert steps_of(head, "tick") + steps_of(tail, "tick") == steps_of(whole, "tick")


def test_fake_clock_in_the_loop() -> None:
    """On the loop's clock with a fake time source: fires at the first step end that
    reads less than the margin, and is then not looked at again."""
    now = [0]
    clock = LoopClock(time_source=lambda: now[0])
    table = Schedule({"ckpt": before_deadline("5 s")}).compile(predicates={})
    table.deadline_ns = 60 * 10**9
    clock.start_train()
    table.attach(clock, None, predicates={})
    fired = []
    for step in range(1, 40):
        now[0] = step * 2 * 10**9  # two seconds a step
        clock.end_batch()
        clock.end_step()
        if clock.step >= table.step_due and table.step_end():
            fired.append(step)
    assert fired == [28]  # 60 - 56 = 4 s left
    assert table.state_dict()  # the node's `fired` is saved


@settings(max_examples=60, deadline=None)
@given(deadline=st.integers(1, 400), margin=st.integers(1, 200), sps=st.integers(1, 7))
def test_before_deadline_is_the_first_step_time_left_drops_below(
        deadline: int, margin: int, sps: int) -> None:
    sched = Schedule({"once": before_deadline(f"{margin} s"),
                      "cond": when(f"time_left < {margin} s")})
    log = simulate(sched, steps_per_epoch=60, epochs=1, seconds_per_step=float(sps),
                   deadline=f"{deadline} s")
    expected = [s for s in range(1, 61) if deadline - s * sps < margin]
    assert steps_of(log, "cond") == expected
    assert steps_of(log, "once") == expected[:1]


def test_toml_before_deadline_and_time_left() -> None:
    """The TOML keys load as the Python triggers and fire as they do: at 30 s a step and a
    deadline 1 h away, 10 min are left after step 100 and 30 min after step 60."""
    spec = loads_spec('[callbacks.save]\ntype = "ModelSaver"\n'
                      'trigger = { before_deadline = "10 min" }\n'
                      '[callbacks.late]\ntype = "ModelSaver"\n'
                      'trigger = { every = "100 steps", if = "time_left < 30 min" }\n')
    assert spec.callbacks["save"].trigger == before_deadline("10 min")
    assert spec.callbacks["late"].trigger == every("100 steps") & when("time_left < 30 min")
    log = simulate(spec.schedule(), steps_per_epoch=250, epochs=1, seconds_per_step=30.0,
                   deadline="1 h")
    assert steps_of(log, "save") == [101]
    assert steps_of(log, "late") == [100, 200]


@pytest.mark.parametrize(("value", "says"), [
    ('"10 steps"', "`before_deadline` needs a duration such as '10 min', got 10 steps"),
    ("10", "found integer 10"),
    ('"soon"', "invalid time 'soon'"),
])
def test_toml_before_deadline_bad_value(value: str, says: str) -> None:
    with pytest.raises(SpecError) as info:
        loads_spec('[callbacks.save]\ntype = "ModelSaver"\n'
                   f'trigger = {{ before_deadline = {value} }}\n')
    message = str(info.value)
    assert message.startswith("<string>: callbacks.save.trigger.before_deadline: ")
    assert says in message and "\n" not in message


def test_resolve_deadline_the_earlier_wins() -> None:
    from schedtrain.spec.deadlines import resolve_deadline
    assert resolve_deadline("23 h", start=1000.0, env={}) == 1000.0 + 23 * 3600
    assert resolve_deadline("23 h", start=1000.0, env={"SLURM_JOB_END_TIME": "5000"}) == 5000
    assert resolve_deadline("10 s", start=1000.0, env={"SLURM_JOB_END_TIME": "5000"}) == 1010
    assert resolve_deadline("1970-01-01T00:20:00+00:00", start=0.0, env={}) == 1200
    assert resolve_deadline(None, start=0.0, env={"SLURM_JOB_END_TIME": "77"}) == 77
    assert resolve_deadline(None, start=0.0, env={}) is None
    with pytest.raises(ValueError, match="SLURM_JOB_END_TIME='soon'"):
        resolve_deadline(None, start=0.0, env={"SLURM_JOB_END_TIME": "soon"})


@pytest.mark.parametrize(("key", "value", "says"), [
    ("deadline", '"10 steps"', "a duration such as '23 h'"),
    ("deadline", '"tomorrow"', "expected an ISO time"),
    ("deadline", "5", "expected a string"),
    ("preempt_signals", '["SIGKILL"]', "SIGKILL cannot be caught"),
    ("preempt_signals", '["SIGFOO"]', "'SIGFOO' is not a signal name"),
    ("preempt_signals", "[]", "non-empty list"),
])
def test_run_deadline_and_signals_bad_values(key: str, value: str, says: str) -> None:
    with pytest.raises(SpecError) as info:
        loads_spec(f'[run]\ntask = "m:f"\nmax_steps = 5\n{key} = {value}\n'
                   '[callbacks.c]\ntype = "ModelSaver"\ntrigger = { every = "1 step" }\n')
    message = str(info.value)
    assert message.startswith(f"<string>: run.{key}: ")
    assert says in message and "\n" not in message


def test_plan_shows_where_the_run_deadline_fires() -> None:
    """`plan` counts a duration deadline from now: 2 s a step and an hour: step 1501."""
    from schedtrain.planning import plan_spec
    spec = loads_spec('[clock]\nepochs = 1\nsteps_per_epoch = 2000\nseconds_per_step = 2.0\n'
                      '[run]\ntask = "m:f"\nmax_epochs = 1\ndeadline = "1 h"\n'
                      '[callbacks.save]\ntype = "ModelSaver"\n'
                      'trigger = { before_deadline = "10 min" }\n')
    plan = plan_spec(spec)
    assert [f.timestamp.step for f in plan.log if f.callback == "save"] == [1501]


def test_python_to_toml_and_back() -> None:
    from schedtrain.spec.write import trigger_to_toml
    trigger = before_deadline("10 min") | (every("5 steps") & when("time_left < 10 min"))
    text = trigger_to_toml(trigger)
    assert text == ('{ any = [{ before_deadline = "10 min" }, '
                    '{ every = "5 steps", if = "time_left < 10 min" }] }')
    spec = loads_spec(f'[callbacks.c]\ntype = "ModelSaver"\ntrigger = {text}\n')
    assert spec.callbacks["c"].trigger == trigger
