"""``schedtrain diff`` and ``planning.changes``: what differs between two schedules."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schedtrain import Schedule, every, on
from schedtrain.cli.main import main
from schedtrain.planning.changes import (
    canonical,
    carry,
    continue_with,
    diff_texts,
    firing_changes,
    spec_changes,
)
from schedtrain.schedule.firings import Firing
from schedtrain.simulation import simulate
from schedtrain.simulation.simclock import RunShape
from schedtrain.time import Timestamp

OLD = """\
[clock]
epochs = 4
steps_per_epoch = 45

[callbacks.validate]
trigger = { any = [{ every = "1 epoch" }, { on = "train_end" }] }

[callbacks.progress]
trigger = { every = "15 steps" }
"""
NEW = """\
[clock]
epochs = 4
steps_per_epoch = 45

[callbacks.validate]
trigger = { every = "30 steps" }

[callbacks.progress]
trigger = { every = "15 steps" }

[callbacks.extra]
trigger = { on = "train_end" }
"""


def _write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


class TestSpecChanges:
    """Spec changes are reported by key path, a trigger as one value."""

    def test_added_removed_changed(self) -> None:
        """A changed trigger, an added callback and a removed one, each by its path."""
        got = {(c.path, c.kind) for c in spec_changes(
            {"callbacks": {"a": {"trigger": {"every": "1 epoch"}}, "gone": {"trigger": {}}}},
            {"callbacks": {"a": {"trigger": {"every": "2 epochs"}}, "new": {"trigger": {}}}})}
        assert got == {("callbacks.a.trigger", "changed"), ("callbacks.gone", "removed"),
                       ("callbacks.new", "added")}

    @given(st.permutations(["a", "b", "c", "d"]), st.sampled_from(["a", "b", "c", "d"]))
    def test_a_new_order_of_callbacks_is_a_change(self, order: list[str], gone: str) -> None:
        """Callbacks fire in declaration order at an event: another order of the names
        both documents have is one ``reordered`` change (and only another order is)."""
        old = {"callbacks": {n: {"trigger": {"every": "1 epoch"}} for n in "abcd"}}
        new = {"callbacks": {n: {"trigger": {"every": "1 epoch"}} for n in order if n != gone}}
        kept_old = [n for n in "abcd" if n != gone]
        kept_new = [n for n in order if n != gone]
        got = [c for c in spec_changes(old, new) if c.kind == "reordered"]
        if kept_old == kept_new:
            assert got == []
        else:
            assert [(c.path, c.old, c.new) for c in got] == [
                ("callbacks", kept_old, kept_new)]
            assert "reordered callbacks" in str(got[0])

    def test_equal_documents_have_no_changes(self) -> None:
        """Equal documents: nothing."""
        assert spec_changes({"run": {"max_epochs": 3}}, {"run": {"max_epochs": 3}}) == ()


_FIRINGS = st.lists(st.tuples(st.sampled_from(["a", "b"]),
                              st.sampled_from(["step_end", "epoch_end"]),
                              st.integers(0, 6)), max_size=12)


def _firings(rows: list[tuple[str, str, int]]) -> list[Firing]:
    return [Firing(n, e, Timestamp(step=s, batch=s)) for n, e, s in rows]


def _key(f: Firing) -> tuple[str, str, int]:
    return (f.callback, f.event, f.step)


@settings(max_examples=200, deadline=None)
@given(_FIRINGS, _FIRINGS)
def test_firing_changes_turn_old_into_new(old: list[tuple[str, str, int]],
                                          new: list[tuple[str, str, int]]) -> None:
    """Old's firings, less the removed and moved-from ones, plus the added and moved-to
    ones, are exactly new's; a move never changes callback or event."""
    a, b = _firings(old), _firings(new)
    changes = firing_changes(a, b)
    got = Counter(_key(f) for f in a)
    for c in changes:
        if c.old is not None:
            got[_key(c.old)] -= 1
        if c.new is not None:
            got[_key(c.new)] += 1
        if c.kind == "moved":
            assert c.old is not None and c.new is not None
            assert (c.old.callback, c.old.event) == (c.new.callback, c.new.event)
    assert +got == Counter(_key(f) for f in b)
    assert (changes == ()) == (Counter(map(_key, a)) == Counter(map(_key, b)))


class TestContinueWith:
    """``continue_with``: the old schedule up to a step, the new one on by the rules."""

    def test_same_schedule_continues_as_one_run(self) -> None:
        """Resuming with the same schedule: before + after is the uninterrupted run."""
        schedule = Schedule({"v": every("1 epoch") | every("7 steps"), "e": on("train_end")})
        shape = RunShape.build(epochs=3, steps_per_epoch=10)
        run = continue_with(schedule, schedule, shape, from_step=13)
        assert [*run.before, *run.new] == list(simulate(schedule, shape=shape))
        assert run.new == run.old

    def test_grids_stay_on_absolute_counters(self) -> None:
        """A new every-N-steps trigger fires on the run's grid after the resume step,
        never at points already passed."""
        old = Schedule({"v": every("1 epoch")})
        new = Schedule({"v": every("4 steps")})
        run = continue_with(old, new, RunShape.build(epochs=2, steps_per_epoch=10),
                            from_step=6)
        assert [f.step for f in run.new] == [8, 12, 16, 20]

    def test_rules(self) -> None:
        """Kept, reset, added and removed callbacks by name and trigger."""
        old = canonical(Schedule({"a": every("1 epoch"), "b": every("2 steps"),
                                  "c": on("train_end")}))
        new = canonical(Schedule({"a": every("1 epoch"), "b": every("3 steps"),
                                  "d": on("train_end")}))
        assert old is not None and new is not None
        rules = carry(old, new)
        assert (rules.kept, rules.reset, rules.added, rules.removed) == (
            ("a",), ("b",), ("d",), ("c",))


def test_diff_texts_of_equal_schedules_is_equal() -> None:
    """The same text: equal, over a simulated run too."""
    diff = diff_texts(OLD, OLD, shape=RunShape.build(epochs=4, steps_per_epoch=45))
    assert diff.equal and diff.firings == ()


class TestCli:
    """``schedtrain diff OLD NEW``: exit 0 equal, 1 different, 2 bad input."""

    def test_different_specs(self, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
        """The table names the changed trigger, the added callback and the new firings."""
        rc = main(["diff", _write(tmp_path, "old.toml", OLD), _write(tmp_path, "new.toml", NEW),
                   "--from", "90"])
        out = capsys.readouterr().out
        assert rc == 1
        assert "changed callbacks.validate.trigger" in out
        assert "added   callbacks.extra" in out
        assert "firings after step 90" in out
        assert "added   step_end step 120 (epoch 2)" in out
        assert "progress" not in out.split("firings")[1]  # its firings do not change

    def test_json(self, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
        """--format json: the spec changes and per-firing changes from the step."""
        rc = main(["diff", _write(tmp_path, "old.toml", OLD), _write(tmp_path, "new.toml", NEW),
                   "--from", "90", "--format", "json"])
        data = json.loads(capsys.readouterr().out)
        assert rc == 1 and data["equal"] is False
        assert data["firings"]["from_step"] == 90
        added = [c["new"]["step"] for c in data["firings"]["changes"]
                 if c["callback"] == "validate" and c["change"] == "added"]
        assert added == [120, 150, 180]
        assert data["rules"]["reset"] == ["validate"] and data["rules"]["added"] == ["extra"]

    def test_equal(self, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
        """The same spec twice: exit 0."""
        path = _write(tmp_path, "old.toml", OLD)
        assert main(["diff", path, path]) == 0
        assert "spec: 0 changes" in capsys.readouterr().out

    @pytest.mark.parametrize("bad", ["missing.toml", "bad.toml"])
    def test_bad_input(self, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                       bad: str) -> None:
        """A missing file or an invalid spec: exit 2, one line naming it, no traceback."""
        _write(tmp_path, "bad.toml", "[callbacks.x]\ntrigger = { every = \"soon\" }\n")
        rc = main(["diff", str(tmp_path / bad), _write(tmp_path, "new.toml", NEW)])
        err = capsys.readouterr().err
        assert rc == 2
        assert bad in err and "Traceback" not in err

    def test_without_a_shape_only_the_spec(self, tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
        """No [clock] and no --epochs: the spec's changes, and a note that firings were
        not compared."""
        old = _write(tmp_path, "old.toml", OLD.split("\n\n", 1)[1])
        new = _write(tmp_path, "new.toml", NEW.split("\n\n", 1)[1])
        rc = main(["diff", old, new])
        captured = capsys.readouterr()
        assert rc == 1 and "firings not compared" in captured.err
        assert "firings after" not in captured.out
