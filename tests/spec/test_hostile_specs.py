"""Hostile inputs of issue 34: deep nesting, huge numbers, very long names, crafted
stored schedules and crafted driver states. Each ends in one clear line and exit 2 (or
a clean resume), in bounded work, with no file deleted.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies import clock_triggers

from schedtrain import Schedule
from schedtrain.cli import main
from schedtrain.clock import LoopClock
from schedtrain.events import EventSet
from schedtrain.integrations import ScheduleDriver
from schedtrain.integrations.driver_state import DriverStateError
from schedtrain.schedule.analysis import analyze, locate
from schedtrain.time import Timestamp
from schedtrain.triggers import (
    MAX_DEPTH,
    AllOf,
    AnyOf,
    Trigger,
    all_of,
    any_of,
    at,
    every,
    improved,
    not_,
    window,
)
from schedtrain.triggers import base as trigger_base
from schedtrain.triggers.protocol import Due, Point

COUNTERS = ("step", "batch", "epoch")


def _run(argv: list[str]) -> tuple[int, str, str]:
    """``schedtrain ARGV`` in process: exit code, stdout, stderr."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue(), err.getvalue()


# -- deep nesting: the static checks end in bounded work ------------------------------

def _plain_first_possible(t: Trigger, counter: str, value: float) -> float:
    """The recursion ``first_possible`` was before it remembered answers (the oracle)."""
    if isinstance(t, AnyOf):
        return min(_plain_first_possible(c, counter, value) for c in t.triggers)
    if isinstance(t, AllOf):
        for _ in range(64):
            nxt = max(_plain_first_possible(c, counter, value) for c in t.triggers)
            if nxt in (value, math.inf):
                return nxt
            value = nxt
        return value
    return t.first_possible(counter, value)


class TooMuchWork(Exception):
    """A leaf was asked more often than a bounded search could ask it."""


class Counted(Trigger):
    """A leaf that counts the ``first_possible`` questions put to it, across all leaves,
    and stops a search that asks more than ``limit`` (an exponential one would hang)."""

    asked = 0
    limit = 10**9

    def __init__(self, inner: Trigger) -> None:
        self.inner = inner

    def events(self) -> EventSet:
        return self.inner.events()

    def evaluate(self, pt: Point) -> bool | None:
        return self.inner.evaluate(pt)

    def bound(self, event: str, last: Timestamp) -> Due:
        return self.inner.bound(event, last)

    def first_possible(self, counter: str, value: float) -> float:
        Counted.asked += 1
        if Counted.asked > Counted.limit:
            raise TooMuchWork(Counted.asked)
        return self.inner.first_possible(counter, value)

    def __repr__(self) -> str:
        return repr(self.inner)


_step_leaves = st.one_of(
    st.builds(lambda k, o: every(f"{k} steps", offset=f"{o} steps") if o else every(
        f"{k} steps"), st.integers(1, 9), st.integers(0, 9)),
    st.builds(lambda a, b: window(f"{a} steps", f"{a + b} steps"), st.integers(0, 60),
              st.integers(1, 40)),
    st.builds(lambda a: window(f"{a} steps"), st.integers(0, 60)),
    st.lists(st.integers(1, 80), min_size=1, max_size=4).map(
        lambda ps: at(*(f"{p} steps" for p in ps))),
    st.builds(lambda k, a: all_of(every(f"{k} steps"), window(f"{a} steps")),
              st.integers(1, 9), st.integers(0, 60)),
)


@st.composite
def _deep(draw: st.DrawFn) -> Trigger:
    """A tree nested exactly MAX_DEPTH levels: at each level an ``any``, ``all`` (or a
    ``not``) over the level below and one or two leaves; mostly alternating."""
    tree: Trigger = Counted(draw(_step_leaves))
    kind = draw(st.sampled_from(["any", "all"]))
    while tree.depth < MAX_DEPTH:
        if tree.depth < MAX_DEPTH - 1 and draw(st.integers(0, 9)) == 0:
            tree = not_(tree)
            continue
        kind = ("all" if kind == "any" else "any") if draw(st.integers(0, 4)) else kind
        side = [Counted(draw(_step_leaves)) for _ in range(draw(st.integers(1, 2)))]
        parts = [tree, *side] if draw(st.booleans()) else [*side, tree]
        # AllOf/AnyOf directly: any_of/all_of would splice a same-kind child in.
        tree = AnyOf(tuple(parts)) if kind == "any" else AllOf(tuple(parts))
    return tree


class TestDeepNesting:
    """``first_possible`` remembers answers; the static checks of any tree end in
    bounded work (issue 34 item 4)."""

    @settings(max_examples=200, deadline=None)
    @given(tree=clock_triggers(max_leaves=10), counter=st.sampled_from(COUNTERS),
           value=st.integers(0, 100))
    def test_answers_are_the_plain_recursions(self, tree: Trigger, counter: str,
                                              value: int) -> None:
        """On shallow trees the remembered search gives the plain recursion's answer."""
        assert tree.first_possible(counter, value) == _plain_first_possible(tree, counter,
                                                                           value)

    @settings(max_examples=80, deadline=None)
    @given(tree=clock_triggers(max_leaves=10), values=st.lists(st.integers(0, 100),
                                                                min_size=1, max_size=8))
    def test_a_shared_scope_answers_as_fresh_questions(self, tree: Trigger,
                                                       values: list[int]) -> None:
        """Questions in one scope (as ``check`` asks them) get each fresh answer."""
        with trigger_base.first_possible_memo():
            for node in locate(tree, "t").walk():
                for v in values:
                    for counter in COUNTERS:
                        assert node.trigger.first_possible(counter, v) == \
                            _plain_first_possible(node.trigger, counter, v)

    @settings(max_examples=10, deadline=None,
              suppress_health_check=[HealthCheck.large_base_example, HealthCheck.too_slow])
    @given(tree=_deep())
    def test_checking_a_tree_at_the_depth_limit_is_bounded(self, tree: Trigger) -> None:
        """A tree MAX_DEPTH levels deep: the whole check asks the leaves at most about
        the search budget's number of questions (the plain recursion asks exponentially
        many: it is stopped here instead of hanging)."""
        bound = trigger_base.SEARCH_BUDGET + 64 * 3 * 200
        Counted.asked, Counted.limit = 0, bound
        try:
            analyze([("x", locate(tree, "callbacks.x.trigger"))])
        finally:
            asked, Counted.asked, Counted.limit = Counted.asked, 0, 10**9
        assert asked <= bound

    def test_the_alternating_chain_is_still_proven_dead_where_it_is(self) -> None:
        """Bounding the search keeps what it proves: an ``all`` of two disjoint windows
        deep in a 60-level alternation is still found dead."""
        dead = all_of(window("0 steps", "5 steps"), window("10 steps"))
        tree: Trigger = any_of(dead, every("7 steps"))
        for level in range(58):
            leaf = every(f"{level % 5 + 1} steps")
            tree = AllOf((tree, leaf)) if level % 2 == 0 else AnyOf((tree, leaf))
        notes = analyze([("x", locate(tree, "callbacks.x.trigger"))]).notes
        assert [n for n in notes if f": {dead!r} is dead: it can never fire" in n], notes


def _alternating(levels: int) -> str:
    """A trigger table of ``any``/``all`` alternating ``levels`` deep, a clock leaf and a
    window beside each level (the shape that never returned from ``check``)."""
    inner = '{ every = "3 steps" }'
    for level in range(levels - 1):
        kind = "any" if level % 2 else "all"
        inner = (f'{{ {kind} = [{inner}, {{ every = "{level + 2} steps", '
                 f'start = "{level + 1} steps" }}] }}')
    return inner


@pytest.mark.timeout(120)
def test_check_of_alternating_nesting_at_the_limit_returns(tmp_path: Path) -> None:
    """``schedtrain check`` of any/all alternating to the depth limit returns (exit 0);
    one level more is refused with the depth, exit 2."""
    path = tmp_path / "deep.toml"
    path.write_text(f"[callbacks.x]\ntrigger = {_alternating(MAX_DEPTH - 1)}\n",
                    encoding="utf-8")
    code, _, err = _run(["check", str(path)])
    assert code == 0, err
    path.write_text(f"[callbacks.x]\ntrigger = {_alternating(MAX_DEPTH + 1)}\n",
                    encoding="utf-8")
    code, _, err = _run(["check", str(path)])
    assert code == 2 and f"more than {MAX_DEPTH} levels" in err and "Traceback" not in err


# -- crafted driver states ------------------------------------------------------------

def _driver() -> ScheduleDriver:
    return ScheduleDriver(Schedule({"a": every("2 steps"), "b": improved("m")}))


def _saved_inside_a_step() -> dict[str, Any]:
    """A state saved after 5 steps of 2 micro-batches and one micro-batch of step 6."""
    driver = _driver()
    driver.train_start()
    driver.epoch_start()
    for _ in range(5):
        driver.batch_end(3, 7)
        driver.batch_end(3, 7)
        driver.put("m", 1.0)
        driver.step_end()
    driver.batch_end(3, 7)
    state: dict[str, Any] = json.loads(json.dumps(driver.state_dict()))
    return state


_HOSTILE_VALUES = st.sampled_from([
    -1, 2**63, 10**100, 10**5000, 1.5, "7", None, True, [], {}, [1, 2], "x" * 100_000,
    float("nan"),
])


def _leaves(state: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    items = state.items() if isinstance(state, dict) else enumerate(state) \
        if isinstance(state, list) else None
    if items is None:
        return [path]
    return [p for key, value in items for p in _leaves(value, (*path, key))] + [path]


class TestCraftedDriverStates:
    """``ScheduleDriver.load_state_dict`` refuses a damaged state in one line and never
    replays it for ever (issue 34 item 5)."""

    def test_a_huge_pending_count_is_refused_at_once(self,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
        """``pending`` of 10**18 micro-batches: one line naming ``pending[0]``, not a loop
        (the clock is never asked to count them one by one)."""
        state = _saved_inside_a_step()
        state["pending"][0] = 10**19
        driver = _driver()
        calls: list[object] = []
        monkeypatch.setattr(LoopClock, "end_batch", lambda *a: calls.append(a))
        with pytest.raises(DriverStateError) as info:
            driver.load_state_dict(state)
        assert str(info.value).startswith("driver state: pending[0]: expected an integer")
        assert calls == []

    def test_a_large_valid_pending_count_loads_at_once(self,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
        """A large pending count within range is counted, not replayed."""
        state = _saved_inside_a_step()
        state["pending"] = [10**15, 5, 9]
        driver = _driver()
        monkeypatch.setattr(LoopClock, "end_batch", None)
        driver.load_state_dict(state)
        assert (driver.clock.batch, driver.clock.sample, driver.clock.token) == (
            10 + 10**15, 35, 79)

    def test_a_clean_state_resumes_where_it_was(self) -> None:
        """The state saved inside a step loads to the same clock and fires on as before."""
        state = _saved_inside_a_step()
        driver = _driver()
        driver.load_state_dict(state)
        assert (driver.clock.step, driver.clock.batch, driver.clock.sample) == (5, 11, 33)
        driver.train_start()
        driver.batch_end(3, 7)
        assert driver.step_end() == ("a",)

    @settings(max_examples=150, deadline=None)
    @given(data=st.data(), bad=_HOSTILE_VALUES)
    def test_any_damaged_value_is_one_line_or_a_clean_load(self, data: st.DataObject,
                                                           bad: Any) -> None:
        """One value of a saved state replaced by a hostile one: the load either succeeds
        or raises ``DriverStateError`` (a ValueError): one line of at most 1,000
        characters naming where; nothing else escapes."""
        state = _saved_inside_a_step()
        paths = _leaves(state)[:-1]
        path = data.draw(st.sampled_from(paths), label="path")
        target = state
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = bad
        try:
            _driver().load_state_dict(state)
        except DriverStateError as exc:
            line = str(exc)
            assert "\n" not in line and len(line) <= 1000 and line.startswith("driver state: ")


# -- crafted stored schedules ---------------------------------------------------------

ROOT = Path(__file__).resolve().parents[2]
_RUN = ('[run]\ntask = "examples.digits:make_task"\nmax_steps = {steps}\nseed = 0\n'
        '[callbacks.checkpoint]\ntype = "ModelSaver"\ntrigger = {{ every = "{every} steps" }}\n')


def _files(folder: Path) -> dict[str, int]:
    return {str(p.relative_to(folder)): p.stat().st_size for p in sorted(folder.rglob("*"))
            if p.is_file() and p.name != "train.lock"}


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run directory of 6 steps with checkpoints at steps 3 and 6."""
    folder = tmp_path_factory.mktemp("stored")
    spec = folder / "old.toml"
    spec.write_text(_RUN.format(steps=6, every=3), encoding="utf-8")
    code, _, err = _run(["train", str(spec), "--run-dir", str(folder / "run")])
    assert code == 0, err
    return folder


def _crafted(trained: Path, tmp_path: Path, schedule: object) -> tuple[Path, Path]:
    """A copy of the trained run whose newest checkpoint stores ``schedule`` (its checksum
    recomputed, as a crafted file would), and a spec with another schedule."""
    import shutil

    import torch

    from schedtrain.checkpoints.format import digest

    run = tmp_path / "run"
    shutil.copytree(trained / "run", run)
    newest = max((run / "checkpoints").glob("step-*.pt"))
    state = torch.load(newest, weights_only=True)
    state["run"]["schedule"] = schedule
    state["checksum"]["digest"] = digest(state)
    torch.save(state, newest)
    spec = tmp_path / "new.toml"
    spec.write_text(_RUN.format(steps=12, every=4), encoding="utf-8")
    return run, spec


_BAD_STORED = {
    "integer": 7,
    "list": ["[callbacks.a]"],
    "not toml": "[callbacks.a\ntrigger = ",
    "not a schedule": '[callbacks.a]\ntrigger = { every = "3 stps" }\n',
    "huge integer": "[clock]\nepochs = " + "9" * 5001 + "\n",
    "long name": f'[callbacks.{"x" * 100_000}]\ntrigger = {{ every = "1 step" }}\n',
}


@pytest.mark.parametrize("kind", list(_BAD_STORED))
@pytest.mark.parametrize("rule", ["apply", "refuse"])
def test_a_crafted_stored_schedule_is_refused_in_one_line(trained: Path, tmp_path: Path,
                                                          kind: str, rule: str) -> None:
    """A checkpoint whose stored schedule is not text, or not a valid schedule: the resume
    is refused with one line naming the checkpoint and why, exit 2, every file kept."""
    run, spec = _crafted(trained, tmp_path, _BAD_STORED[kind])
    before = _files(run)
    code, _, err = _run(["train", str(spec), "--run-dir", str(run), "--resume", "auto",
                         "--schedule-change", rule])
    assert code == 2, err
    (line,) = [x for x in err.splitlines() if x.startswith("error: ")]
    assert "holds a stored schedule that cannot be read" in line and len(line) <= 1100
    assert "Traceback" not in err and "AttributeError" not in err
    assert _files(run) == before


def test_a_stored_schedule_of_2000_callbacks_is_summarised(trained: Path,
                                                            tmp_path: Path) -> None:
    """A valid stored schedule of 2,000 callbacks: the refusal is a summary of a few
    lines (not a line per callback), exit 2, every file kept."""
    many = "".join(f'[callbacks.c{i}]\ntrigger = {{ every = "{i % 7 + 1} steps" }}\n'
                   for i in range(2_000))
    run, spec = _crafted(trained, tmp_path, many)
    before = _files(run)
    code, _, err = _run(["train", str(spec), "--run-dir", str(run), "--resume", "auto"])
    assert code == 2, err[:2000]
    assert len(err) < 8_000 and "more" in err
    assert _files(run) == before


# -- huge numbers, long messages, keep policies ---------------------------------------

_SAVER = '[callbacks.s]\ntype = "ModelSaver"\ntrigger = { every = "1 step" }\n'
_HUGE_PLACES = {
    "callbacks.s.keep": _SAVER + "keep = {n}\n",
    "clock.epochs": "[clock]\nepochs = {n}\nsteps_per_epoch = 3\n" + _SAVER,
    "callbacks.s.keep.any[0]": _SAVER.replace(
        "[callbacks.s]", "[callbacks.s]\nkeep = { any = [{ latest = {n} }] }"),
}


@settings(max_examples=12, deadline=None)
@given(place=st.sampled_from(sorted(_HUGE_PLACES)), digits=st.integers(4301, 20_000),
       sep=st.sampled_from(["", "_"]))
def test_an_integer_past_pythons_digit_limit_is_one_line_with_its_key(
        tmp_path_factory: pytest.TempPathFactory, place: str, digits: int, sep: str) -> None:
    """Any integer of more than 4,300 digits in a spec: exit 2, one line naming the key
    path (its table and key) and the number's size, not Python's own words."""
    number = "1" + "0" * (digits - 1)
    if sep:  # TOML's digit groups: 1_000_000 (Python's limit counts the digits alone)
        head = len(number) % 3 or 3
        number = number[:head] + "".join(f"_{number[i:i + 3]}"
                                         for i in range(head, len(number), 3))
    path = tmp_path_factory.mktemp("huge") / "s.toml"
    path.write_text(_HUGE_PLACES[place].replace("{n}", number), encoding="utf-8")
    code, _, err = _run(["check", str(path)])
    assert code == 2
    (line,) = [x for x in err.splitlines() if x.startswith("error: ")]
    key = place.partition(".any")[0]  # in an inline table: the key its line starts with
    assert f": {key}: an integer of " in line and " digits" in line, line
    assert "4300" not in err and "set_int_max_str_digits" not in err and len(line) < 300


@pytest.mark.parametrize(("keep", "where", "says"), [
    ("{ best = 2 }", "callbacks.s.keep", "needs the metric it ranks by"),
    ('{ any = [{ every = "2 steps" }, { best = 1, mode = "max" }] }', "callbacks.s.keep.any[1]",
     "needs the metric it ranks by"),
    ("{ any = [1, 2] }", "callbacks.s.keep.any[0]", "a bare number in `any` is ambiguous"),
    ("{ any = [{ latest = 2 }, 3] }", "callbacks.s.keep.any[1]", "rule table"),
])
def test_an_ambiguous_keep_is_refused_at_its_key(tmp_path: Path, keep: str, where: str,
                                                 says: str) -> None:
    """``keep = { best = N }`` without the metric, and bare numbers in ``any``: exit 2 with
    the key path and what is expected."""
    path = tmp_path / "s.toml"
    path.write_text(_SAVER + f"keep = {keep}\n", encoding="utf-8")
    code, _, err = _run(["check", str(path)])
    assert code == 2, err
    assert f"error: {path}: {where}: " in err and says in err and "expected" in err


def test_a_best_rule_with_its_monitor_is_accepted(tmp_path: Path) -> None:
    """The same rules written out are accepted (so the refusal is of the gap alone)."""
    path = tmp_path / "s.toml"
    path.write_text(_SAVER + 'keep = { any = [{ latest = 1 }, { best = 2, monitor = '
                             '"val/loss" }] }\n', encoding="utf-8")
    assert _run(["check", str(path)])[0] == 0


def _deep_all() -> str:
    inner = '{ any = [{ all = [{ at = "5 steps" }, { start = "10 steps" }] }, ' \
            '{ every = "3 steps" }] }'
    for i in range(MAX_DEPTH - 3):
        inner = (f'{{ all = [{inner}, {{ every = "{i % 3 + 1} steps" }}] }}' if i % 2
                 else f'{{ any = [{inner}, {{ on = "train_end" }}] }}')
    return inner


def test_plan_of_a_63_deep_trigger_prints_readable_lines(tmp_path: Path) -> None:
    """A trigger nested to the limit, with a dead branch at the bottom: every line ``plan``
    prints is at most about 1,000 characters; its warning is a ``warning:`` line."""
    path = tmp_path / "s.toml"
    path.write_text(f"[clock]\nepochs = 1\nsteps_per_epoch = 10\n[callbacks.x]\n"
                    f"trigger = {_deep_all()}\n", encoding="utf-8")
    code, out, err = _run(["plan", str(path)])
    assert code == 0, err
    assert max(len(x) for x in (out + err).splitlines()) <= 1100
    assert err.startswith(f"warning: {path}: callbacks.x.trigger.") and "is dead" in err
    assert "ScheduleWarning" not in err


def test_diff_of_2000_callbacks_is_a_summary(tmp_path: Path) -> None:
    """Two specs of 2,000 callbacks each, every trigger changed: a summary of a screen,
    not a line per callback."""
    def spec(every: int) -> str:
        return "[clock]\nepochs = 1\nsteps_per_epoch = 4\n" + "".join(
            f'[callbacks.c{i}]\ntrigger = {{ every = "{every} steps" }}\n' for i in range(2000))
    old, new = tmp_path / "old.toml", tmp_path / "new.toml"
    old.write_text(spec(2), encoding="utf-8")
    new.write_text(spec(3), encoding="utf-8")
    code, out, _ = _run(["diff", str(old), str(new)])
    assert code == 1
    lines = out.splitlines()
    assert len(lines) < 200 and max(len(x) for x in lines) <= 1100
    assert "... and 1,980 more spec changes" in out and "... and 1,980 more callbacks" in out


def test_a_dead_trigger_after_thousands_of_others_is_still_found(tmp_path: Path) -> None:
    """The search budget grows with the schedule: a trigger that can never fire, declared
    after 6,000 small compositions, is still refused."""
    ok = '{ all = [{ every = "2 steps" }, { start = "1 step" }] }'
    dead = '{ all = [{ at = "5 steps" }, { start = "10 steps" }] }'
    path = tmp_path / "many.toml"
    path.write_text("".join(f"[callbacks.c{i}]\ntrigger = {ok}\n" for i in range(6000))
                    + f"[callbacks.last]\ntrigger = {dead}\n", encoding="utf-8")
    code, _, err = _run(["check", str(path)])
    assert code == 2 and "callbacks.last.trigger: " in err and "can never fire" in err
