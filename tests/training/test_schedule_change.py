"""Schedules that change: stored with the run, and a resume with another schedule."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset
from training_helpers import Noop, comparable

from schedtrain import Schedule, at, every, on, when
from schedtrain.callbacks import Callback
from schedtrain.callbacks.saver import ModelSaver
from schedtrain.checkpoints.store import read_checkpoint
from schedtrain.errors import ScheduleWarning
from schedtrain.planning.changes import canonical
from schedtrain.spec import loads_spec
from schedtrain.training import Trainer
from schedtrain.training.control.schedule_change import ScheduleChanged


def _trainer(run_dir: Path, schedule: Schedule, *, epochs: int = 3, keep: object = None,
             **kwargs: object) -> Trainer:
    torch.manual_seed(0)
    x = torch.randn(40, 3)
    model = torch.nn.Linear(3, 1)
    names = [n for n in schedule.names if n != "save"]
    return Trainer(model, torch.optim.SGD(model.parameters(), lr=0.01),
                   DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=4),
                   torch.nn.functional.mse_loss, schedule=schedule,
                   bindings={"save": ModelSaver(keep=keep),  # type: ignore[arg-type]
                             **{n: Noop() for n in names}},
                   max_epochs=epochs, run_dir=run_dir, **kwargs)  # type: ignore[arg-type]


def _schedule(**triggers: object) -> Schedule:
    return Schedule({"save": every("5 steps"), **triggers})  # type: ignore[arg-type]


class TestStoredSchedule:
    """The resolved schedule travels with the run, as canonical TOML."""

    def test_every_checkpoint_holds_the_schedule(self, tmp_path: Path) -> None:
        """Each checkpoint's run.schedule is the schedule's canonical TOML, a plain string
        (the file still loads with weights_only=True), which loads back to the schedule."""
        schedule = _schedule(tick=every("3 steps") | on("epoch_end"), end=on("train_end"))
        _trainer(tmp_path, schedule).fit()
        files = sorted((tmp_path / "checkpoints").glob("*.pt"))
        assert len(files) >= 2
        for f in files:
            text = torch.load(f, weights_only=True)["run"]["schedule"]
            assert text == canonical(schedule)
            assert loads_spec(text).schedule().triggers() == schedule.triggers()

    def test_run_json_holds_the_schedule(self, tmp_path: Path) -> None:
        """run.json records the schedule too, whatever status it says."""
        schedule = _schedule(tick=every("1 epoch"))
        _trainer(tmp_path, schedule).fit()
        status = json.loads((tmp_path / "run.json").read_text())
        assert status["status"] == "finished"
        assert status["schedule"] == canonical(schedule)

    def test_python_callable_trigger_is_unknown(self, tmp_path: Path) -> None:
        """A schedule with a when(fn) trigger has no TOML form: stored as None."""
        schedule = _schedule(odd=every("1 step") & when(lambda pt: pt.now.step % 2 == 1))
        _trainer(tmp_path, schedule, epochs=1).fit()
        state = read_checkpoint(tmp_path / "checkpoints" / f"step-{5:08d}.pt")
        assert state["run"]["schedule"] is None

    def test_old_checkpoint_without_schedule_resumes(self, tmp_path: Path) -> None:
        """A checkpoint of an earlier version (no schedule key) resumes as an unknown
        schedule: one line says so, and the run continues exactly."""
        schedule = _schedule(tick=every("3 steps"))
        full = _trainer(tmp_path / "full", schedule)
        full.fit()
        path = tmp_path / "full" / "checkpoints" / f"step-{10:08d}.pt"
        state = torch.load(path, weights_only=True)
        del state["run"]["schedule"]
        from schedtrain.checkpoints.format import digest

        state["checksum"]["digest"] = digest(state)
        old = tmp_path / "old.pt"
        torch.save(state, old)
        resumed = _trainer(tmp_path / "again", schedule)
        with pytest.warns(ScheduleWarning, match="no stored schedule"):
            resumed.resume(old)
        resumed.fit()
        cut = max(i for i, f in enumerate(full.firings) if f.step == 10
                  and f.event == "step_end") + 1
        assert comparable(resumed.firings) == comparable(full.firings[cut:])


def test_at_points_in_stored_schedule() -> None:
    """An at() trigger round-trips through the stored text unchanged."""
    schedule = _schedule(once=at("7 steps"))
    text = canonical(schedule)
    assert text is not None
    assert loads_spec(text).schedule().triggers() == schedule.triggers()


class Count(Callback):
    """Counts its firings; the count is its checkpointed state."""

    def __init__(self) -> None:
        self.n = 0

    def _trigger(self) -> None:
        self.n += 1

    def state_dict(self) -> dict[str, Any]:
        return {"n": self.n}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.n = int(state["n"])


def _events(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]


def _counted(run_dir: Path, schedule: Schedule, **kwargs: Any) -> tuple[Trainer, dict[str, Count]]:
    counts = {n: Count() for n in schedule.names if n != "save"}
    torch.manual_seed(0)
    x = torch.randn(40, 3)
    model = torch.nn.Linear(3, 1)
    trainer = Trainer(model, torch.optim.SGD(model.parameters(), lr=0.01),
                      DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=4),
                      torch.nn.functional.mse_loss, schedule=schedule,
                      bindings={"save": ModelSaver(keep=None), **counts}, max_epochs=3,
                      run_dir=run_dir, **kwargs)
    return trainer, counts


class TestResumeWithAnotherSchedule:
    """A resume whose schedule differs: refused by default, applied by the rules."""

    def test_refused_by_default_with_the_diff(self, tmp_path: Path) -> None:
        """The refusal names the changed trigger, the next firings that change and the
        way on; the run directory is left unlocked and unchanged."""
        first, _ = _counted(tmp_path, _schedule(v=every("1 epoch")))
        first.fit()
        before = (tmp_path / "events.jsonl").read_bytes()
        again, _ = _counted(tmp_path, _schedule(v=every("4 steps")))
        with pytest.raises(ScheduleChanged) as caught:
            again.resume(tmp_path / "checkpoints" / f"step-{10:08d}.pt")
        text = str(caught.value)
        assert "changed callbacks.v.trigger" in text
        assert "added   step_end step 12 (epoch 1)" in text
        assert "removed epoch_end step 20 (epoch 2)" in text
        assert "--schedule-change apply" in text
        assert (tmp_path / "events.jsonl").read_bytes() == before
        third, _ = _counted(tmp_path, _schedule(v=every("4 steps")), schedule_change="apply")
        with pytest.warns(ScheduleWarning):
            third.resume(tmp_path / "checkpoints" / f"step-{10:08d}.pt")  # not locked

    def test_apply_keeps_resets_adds_and_drops(self, tmp_path: Path) -> None:
        """apply: an unchanged callback keeps its state, a changed one restarts, a new one
        starts fresh, a removed one is dropped, each said in a line; events.jsonl gets a
        schedule_change line and then the new schedule's firings, on the run's grid."""
        old = _schedule(same=every("3 steps"), moved=every("1 epoch"), gone=on("epoch_end"))
        first, _ = _counted(tmp_path, old)
        first.fit()
        new = _schedule(same=every("3 steps"), moved=every("4 steps"), fresh=every("7 steps"))
        again, counts = _counted(tmp_path, new, schedule_change="apply")
        with pytest.warns(ScheduleWarning) as lines:
            again.resume(tmp_path / "checkpoints" / f"step-{10:08d}.pt")
        said = " ".join(str(w.message) for w in lines)
        assert "callbacks.moved: its trigger changed" in said
        assert "callbacks.fresh: new" in said and "callbacks.gone: removed" in said
        again.fit()
        assert counts["same"].n == 10  # 3 before step 10 kept, 7 after (steps 12..30)
        assert counts["moved"].n == 5  # reset: 12, 16, 20, 24, 28
        assert counts["fresh"].n == 3  # 14, 21, 28
        events = _events(tmp_path)
        (change,) = [e for e in events if e["kind"] == "schedule_change"]
        assert (change["step"], change["rule"]) == (10, "apply")
        assert change["rules"] == {"kept": ["save", "same"], "reset": ["moved"],
                                   "added": ["fresh"], "removed": ["gone"]}
        after = events[events.index(change) + 1:]
        assert [e["step"] for e in after if e.get("callback") == "moved"] == [12, 16, 20, 24, 28]
        assert not [e for e in after if e.get("callback") == "gone"]


class Put(Callback):
    """Puts m = 10 - step: a new best (min) at every firing."""

    produces = ("m",)

    def _trigger(self) -> None:
        self.metrics.put("m", 10.0 - self.trainer.clock.step)


def test_apply_keeps_metric_state_of_unchanged_triggers(tmp_path: Path) -> None:
    """A metric trigger unchanged keeps its best value across an applied change; one
    whose trigger changed starts with none (its first value is a new best again)."""
    from schedtrain import improved

    def make(schedule: Schedule, **kwargs: Any) -> Trainer:
        torch.manual_seed(0)
        x = torch.randn(40, 3)
        model = torch.nn.Linear(3, 1)
        return Trainer(model, torch.optim.SGD(model.parameters(), lr=0.01),
                       DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=4),
                       torch.nn.functional.mse_loss, schedule=schedule,
                       bindings={"save": ModelSaver(keep=None), "put": Put(),
                                 "same": Noop(), "other": Noop()},
                       max_epochs=2, run_dir=tmp_path, **kwargs)  # type: ignore[arg-type]

    first = make(Schedule({"put": every("2 steps"), "save": every("5 steps"),
                           "same": improved("m"), "other": improved("m")}))
    first.fit()
    path = tmp_path / "checkpoints" / f"step-{10:08d}.pt"
    saved = read_checkpoint(path)["run"]["table"]["triggers"]
    assert "same" in saved and "other" in saved
    again = make(Schedule({"put": every("2 steps"), "save": every("5 steps"),
                           "same": improved("m"), "other": improved("m", min_delta=0.5)}),
                 schedule_change="apply")
    with pytest.warns(ScheduleWarning, match="callbacks.other: its trigger changed"):
        again.resume(path)
    state = again.table.state_dict()["triggers"]
    assert state["same"] == saved["same"]
    assert state.get("other") != saved["other"]


class TestNoPokes:
    """``build_parts`` hands the run's state its schedule change and run control's replay
    when it builds it, and the checkpoint owner hands it its view of the files with the
    checkpoint to check, instead of setting attributes inside it after construction
    (issue 36: a moved poke changed behaviour silently)."""

    def test_build_parts_sets_no_attribute_of_a_part_inside_another(self) -> None:
        """No ``a.b = ...`` on the run state and no ``a.b.c = ...`` at all in
        training/parts.py: a part's insides are set by the part."""
        import ast
        import inspect

        from schedtrain.training import parts

        pokes = []
        for node in ast.walk(ast.parse(inspect.getsource(parts))):
            targets = (node.targets if isinstance(node, ast.Assign)
                       else [node.target] if isinstance(node, ast.AugAssign | ast.AnnAssign)
                       else [])
            for target in targets:
                for t in target.elts if isinstance(target, ast.Tuple) else [target]:
                    if isinstance(t, ast.Attribute) and (
                            isinstance(t.value, ast.Attribute)
                            or (isinstance(t.value, ast.Name) and t.value.id == "run_state")):
                        pokes.append(f"line {t.lineno}: {ast.unparse(t)}")
        assert pokes == []

    def test_run_state_takes_its_change_and_how_to_see_files(
            self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        """A resume with another schedule asks the checkpoint storage, which the
        checkpoint owner hands the run state with the checkpoint to check, which of a
        saver's files are there (in the saver's folder)."""
        asked: list[tuple[str, list[str]]] = []

        first = _trainer(tmp_path / "run", _schedule(a=every("2 steps")), epochs=1, keep=2)
        first.fit()
        again = _trainer(tmp_path / "run", _schedule(a=every("3 steps")), epochs=2, keep=2,
                         schedule_change="apply")
        state = again._parts.run_state
        assert state.change.text == canonical(_schedule(a=every("3 steps")))
        assert state.change.rule == "apply"
        mount = again._parts.checkpoints.mount
        exists = mount.exists

        def seen(paths: list[Path]) -> list[Path]:
            asked.extend((p.parent.name, [p.name]) for p in paths)
            return exists(paths)

        monkeypatch.setattr(mount, "exists", seen)
        with pytest.warns(ScheduleWarning):
            again.resume("auto")
        assert {folder for folder, _ in asked} == {"checkpoints"}
        assert asked and all(name.startswith("step-") for _, [name] in asked), asked
