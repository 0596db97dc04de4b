"""``every = "auto"`` in a spec: ``[run] mtbf``/``failure_rate``/``max_checkpoint_overhead``
checked, a use without a failure rate refused in one line at its key path, written back."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from schedtrain.errors import ArgumentError, SpecError
from schedtrain.spec import loads_spec
from schedtrain.spec.config import run_config
from schedtrain.spec.failures import mtbf_seconds, overhead_fraction
from schedtrain.spec.registry import BUILTINS
from schedtrain.spec.write import dump_spec
from schedtrain.triggers import AutoEvery


def _spec(run: str, trigger: str = '{ every = "auto" }') -> str:
    return f"{run}\n[callbacks.save]\ntype = \"ModelSaver\"\ntrigger = {trigger}\n"


@pytest.mark.parametrize("trigger, path", [
    ('{ every = "auto" }', "callbacks.save.trigger.every"),
    ('{ any = [{ on = "train_end" }, { every = "auto", offset = "5 steps" }] }',
     "callbacks.save.trigger.any[1].every"),
])
def test_auto_without_a_failure_rate_is_refused_in_one_line(trigger: str, path: str) -> None:
    with pytest.raises(SpecError) as err:
        loads_spec(_spec("", trigger))
    assert len(err.value.problems) == 1
    assert str(err.value) == (f"<string>: {path}: every = \"auto\" picks the checkpoint "
                              "interval from the failure rate: set [run] mtbf (such as "
                              "\"6 h\") or failure_rate (failures per hour)")


_WRONG = ["true", '"soon"', '"6 steps"', '"0 s"', "[1]", '{ h = 6 }', '"-1 h"']


@pytest.mark.parametrize(("key", "value"), [*(("mtbf", v) for v in ["5", "2.5", *_WRONG]),
                                            *(("failure_rate", v) for v in _WRONG)])
def test_a_wrong_failure_rate_is_one_error_at_its_key(key: str, value: str) -> None:
    """Whatever is wrong with a given mtbf or failure_rate (its type or its value), the
    one error is at its key and says what was expected: never a second one asking to set
    the key that was set (issue 42)."""
    with pytest.raises(SpecError) as err:
        loads_spec(_spec(f"[run]\n{key} = {value}"))
    assert [p.path for p in err.value.problems] == [f"run.{key}"], str(err.value)
    assert "expected " in str(err.value) and "set [run]" not in str(err.value)
    if key == "mtbf":
        assert err.value.problems[0].expected == "a duration such as '6 h' or '90 min'"


def test_a_rate_is_asked_of_a_run_and_not_of_a_schedule_alone() -> None:
    """Without [run]: refused, unless the text is a schedule whose run is elsewhere
    (schedule_only: a stored schedule, a retime's); with [run], checked either way; a
    [run] refused for another key adds no second error."""
    auto = _spec("")
    assert loads_spec(auto, schedule_only=True).callbacks["save"].trigger == AutoEvery()
    for text in (_spec('[run]\nseed = 1'), auto):
        with pytest.raises(SpecError, match="set \\[run\\] mtbf"):
            loads_spec(text, schedule_only=text != auto)
    with pytest.raises(SpecError) as err:
        loads_spec(_spec('[run]\nmtbf = "1 h"\nseed = "x"'))
    assert [p.path for p in err.value.problems] == ["run.seed"]
    with pytest.raises(SpecError, match="MaxSaver measures none"):
        loads_spec(auto.replace("ModelSaver", "MaxSaver"), schedule_only=True)


@pytest.mark.parametrize("run, key", [
    ('mtbf = "6 steps"', "run.mtbf"), ('mtbf = "0 s"', "run.mtbf"),
    ("failure_rate = 0.0", "run.failure_rate"), ("failure_rate = -2.0", "run.failure_rate"),
    ('mtbf = "1 h"\nfailure_rate = 1.0', "run.failure_rate"),
    ('mtbf = "1 h"\nmax_checkpoint_overhead = "0%"', "run.max_checkpoint_overhead"),
    ('mtbf = "1 h"\nmax_checkpoint_overhead = "101%"', "run.max_checkpoint_overhead"),
    ('mtbf = "1 h"\nmax_checkpoint_overhead = "lots"', "run.max_checkpoint_overhead"),
    ('mtbf = "1 h"\nmax_checkpoint_overhead = 0', "run.max_checkpoint_overhead"),
    ('mtbf = "1 h"\nmax_checkpoint_overhead = 1.5', "run.max_checkpoint_overhead"),
    ('mtbf = "1 h"\nmax_checkpoint_overhead = nan', "run.max_checkpoint_overhead"),
    ('mtbf = "1 h"\nmax_checkpoint_overhead = true', "run.max_checkpoint_overhead"),
])
def test_bad_failure_keys_name_their_key_path(run: str, key: str) -> None:
    with pytest.raises(SpecError) as err:
        loads_spec(_spec(f"[run]\n{run}"))
    assert [p.path for p in err.value.problems] == [key]


def test_offset_of_auto_is_the_first_save_in_steps() -> None:
    spec = loads_spec(_spec('[run]\nmtbf = "6 h"', '{ every = "auto", offset = "25 steps" }'))
    trig = spec.callbacks["save"].trigger
    assert isinstance(trig, AutoEvery) and trig.first == 25
    with pytest.raises(SpecError, match=r"callbacks\.save\.trigger\.offset: `offset` of "
                                        r"every = \"auto\" is the step of the first save"):
        loads_spec(_spec('[run]\nmtbf = "6 h"', '{ every = "auto", offset = "1 epoch" }'))


@given(st.sampled_from(['{ every = "auto" }', '{ every = "auto", offset = "7 steps" }',
                        '{ any = [{ every = "auto" }, { on = "train_end" }] }']))
def test_written_back_it_reads_the_same(trigger: str) -> None:
    spec = loads_spec(_spec('[run]\nfailure_rate = 0.5\nmax_checkpoint_overhead = "2%"',
                            trigger))
    again = loads_spec(dump_spec(spec))
    assert again.callbacks == spec.callbacks
    assert again.run == spec.run


@given(st.floats(0.01, 100.0), st.integers(1, 100))
def test_failure_rate_and_overhead_convert(rate: float, percent: int) -> None:
    config = run_config(failure_rate=rate, max_checkpoint_overhead=f"{percent}%")
    assert mtbf_seconds(config) == pytest.approx(3600 / rate)
    assert overhead_fraction(config) == pytest.approx(percent / 100)
    assert mtbf_seconds(run_config(mtbf="90 min")) == 5400


@given(st.integers(1, 100))
def test_overhead_as_a_number_is_that_share(percent: int) -> None:
    """``max_checkpoint_overhead = 0.02`` reads as ``"2%"`` does, in TOML and in Python
    (the number is the share itself, in (0, 1])."""
    share, text = percent / 100, f'"{percent}%"'
    by_number, by_text = (loads_spec(_spec(f'[run]\nmtbf = "1 h"\n'
                                           f"max_checkpoint_overhead = {v}")).run
                          for v in (share, text))
    assert overhead_fraction(by_number) == pytest.approx(overhead_fraction(by_text))
    assert overhead_fraction(run_config(max_checkpoint_overhead=share)) == pytest.approx(share)
    assert loads_spec(dump_spec(loads_spec(_spec(
        f'[run]\nmtbf = "1 h"\nmax_checkpoint_overhead = {share}')))).run == by_number


def test_python_keywords_get_the_same_rules() -> None:
    with pytest.raises(ArgumentError, match="`mtbf`: expected a duration such as '6 h'"):
        run_config(mtbf="3 epochs")


#: The arguments a built-in cannot do without (its table is refused without them first).
_REQUIRED = {
    "GradientAccumulationScheduler": "schedule = { 0 = 1 }",
    "LRScheduler": 'scheduler = "StepLR"\nargs = { step_size = 10 }',
    "ScheduledHyperParamSetter": 'param = "lr"\nschedule = [[0, 0.1]]',
    "SendStat": 'command = ["true"]',
}


@pytest.mark.parametrize("kind", sorted(set(BUILTINS) - {"ModelSaver"}))
@pytest.mark.parametrize("trigger, path", [
    ('{ every = "auto" }', "callbacks.save.trigger.every"),
    ('{ all = [{ every = "auto" }, { not = { at = "3 steps" } }] }',
     "callbacks.save.trigger.all[0].every"),
])
def test_auto_on_a_built_in_that_measures_no_save_is_refused_at_its_key_path(
        kind: str, trigger: str, path: str) -> None:
    """Only a ModelSaver feeds the interval: ``schedtrain check`` says so, without torch."""
    text = _spec('[run]\nmtbf = "6 h"', trigger).replace(
        '"ModelSaver"', f'"{kind}"\n{_REQUIRED.get(kind, "")}')
    with pytest.raises(SpecError) as err:
        loads_spec(text)
    [found] = [p for p in err.value.problems if p.path == path]
    assert f"{kind} measures none: use it on a ModelSaver" in found.message


def test_auto_on_a_user_class_waits_for_the_binding() -> None:
    """A user's class may subclass ModelSaver: judged when bound, not by its name."""
    loads_spec(_spec('[run]\nmtbf = "6 h"').replace('"ModelSaver"', '"mypkg.saving:MySaver"'))
