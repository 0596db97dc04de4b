"""``planning.stored.StoredSchedule``: a schedule's text parsed once, read by every rule.

The rules (``live_refusal``, ``carry``, ``diff_texts``, ``loop_events``) give the same
answer for a ``StoredSchedule`` as for its text; the spec read from the parsed tables is
the one ``loads_spec`` reads from the text; text that is not a schedule is refused in
one line naming it."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import schedules, shapes

from schedtrain import Schedule
from schedtrain.errors import MESSAGE_LIMIT, SpecError
from schedtrain.planning.changes import canonical, carry, diff_texts
from schedtrain.planning.requests import live_refusal, loop_events
from schedtrain.planning.stored import StoredSchedule
from schedtrain.simulation.simclock import RunShape
from schedtrain.spec import loads_spec


def _text(schedule: Schedule) -> str:
    text = canonical(schedule)
    assert text is not None
    return text


def _renamed(schedule: Schedule, data: st.DataObject) -> Schedule:
    """Some of ``schedule``'s triggers moved onto other callbacks' names, or dropped:
    changes of every kind the rules judge (kept, reset, added, removed, reordered)."""
    names = list(schedule.triggers())
    triggers = list(schedule.triggers().values())
    picked = data.draw(st.permutations(names))
    keep = data.draw(st.integers(1, len(names)))
    extra = data.draw(st.booleans())
    out = {n: triggers[names.index(n)] for n in picked[:keep]}
    if extra:
        out["added"] = triggers[0]
    return Schedule(out)


def _outcome(rule: Callable[[], object]) -> object:
    """What ``rule`` answers, or the problems it raises (where, what: not the name the
    text was given, which differs between the two ways of asking)."""
    try:
        return rule()
    except SpecError as exc:
        return [(p.path, p.message) for p in exc.problems]


@pytest.mark.filterwarnings("ignore::schedtrain.errors.ScheduleWarning")
@settings(max_examples=30, deadline=None)
@given(old=schedules(), new=schedules(), shape=shapes(), data=st.data())
def test_the_rules_answer_alike_for_text_and_stored(old: Schedule, new: Schedule,
                                                     shape: object,
                                                     data: st.DataObject) -> None:
    if data.draw(st.booleans()):
        new = _renamed(old, data)
    a, b = _text(old), _text(new)
    sa, sb = StoredSchedule.parse(a, "old"), StoredSchedule.parse(b, "new")
    assert _outcome(lambda: live_refusal(sa, sb)) == _outcome(lambda: live_refusal(a, b))
    assert _outcome(lambda: live_refusal(sa, sb, ("batch_end",))) == _outcome(
        lambda: live_refusal(a, b, ("batch_end",)))
    assert _outcome(lambda: loop_events(sb)) == _outcome(lambda: loop_events(b))
    assert carry(sa, sb) == carry(a, b)
    run = RunShape.build(epoch_lengths=list(shape.epoch_lengths))  # type: ignore[attr-defined]
    step = data.draw(st.integers(0, run.total_steps))
    assert _outcome(lambda: diff_texts(sa, sb, shape=run, from_step=step)) == _outcome(
        lambda: diff_texts(a, b, shape=run, from_step=step))
    assert _outcome(lambda: diff_texts(sa, sb)) == _outcome(lambda: diff_texts(a, b))


@pytest.mark.filterwarnings("ignore::schedtrain.errors.ScheduleWarning")
@settings(max_examples=40, deadline=None)
@given(schedule=schedules())
def test_the_spec_read_from_the_parsed_tables_is_the_texts(schedule: Schedule) -> None:
    text = _text(schedule)
    stored = StoredSchedule.parse(text, "a schedule")
    read = _outcome(stored.spec)
    assert read == _outcome(lambda: loads_spec(text, "a schedule", schedule_only=True))
    if isinstance(read, list):  # refused alike (a trigger that can never fire)
        return
    assert canonical(stored.schedule()) == text
    assert stored.schedule() is stored.schedule()  # built once
    assert stored == StoredSchedule.parse(text, "another name")
    assert stored != StoredSchedule.parse(text + "\n", "a schedule")


@pytest.mark.parametrize(("text", "found"), [
    ("[callbacks.a\ntrigger = 1", "invalid TOML"),
    ("[callbacks.a]\ntrigger = { every = \"3 parsecs\" }\n", "callbacks.a.trigger"),
    ("[callbacks]\n", "at least one [callbacks.NAME] table"),
])
def test_text_that_is_no_schedule_is_refused_in_one_line_naming_it(text: str,
                                                                     found: str) -> None:
    with pytest.raises(SpecError) as caught:
        StoredSchedule.parse(text, "the new schedule").spec()
    message = str(caught.value)
    assert "the new schedule" in message and found in message
    assert len(message.splitlines()[0]) <= MESSAGE_LIMIT
