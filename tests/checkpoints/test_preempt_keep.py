"""A run preempted (SIGTERM) and resumed, once or twice, keeps the files an unbroken run
keeps, whatever the savers' ``keep``: the preemption's own checkpoint is none of a
saver's saves (first-day-5 E2: it used to stand in for an ``every`` rule's milestone).
It stays only while no newer checkpoint of its folder exists (the one to resume from)."""

from __future__ import annotations

import dataclasses
import os
import signal
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from test_retention import Feed  # puts val/loss from a list at every step
from training_helpers import UnevenData, tiny_model

from schedtrain import Schedule, every
from schedtrain.callbacks import Callback, MaxSaver, MinSaver, ModelSaver, TopKSaver
from schedtrain.checkpoints import read_checkpoint, write_checkpoint
from schedtrain.errors import Preempted
from schedtrain.retention import parse_keep, saver_keep
from schedtrain.simulation import SaverFiles, planned_files, simulate
from schedtrain.training import Trainer

SPE = 6  # steps per epoch


class Preempt(Callback):
    """Sends this process SIGTERM at the end of one step, as a scheduler would."""

    def __init__(self, at: int | None) -> None:
        self.at = at

    def _trigger(self) -> None:
        if self.now.step == self.at:
            os.kill(os.getpid(), signal.SIGTERM)


def _values(n: int) -> list[float]:
    """val/loss at each step: ups and downs, so best rules and new bests move."""
    return [round(1.0 / (1 + s) + (0.3 if s % 3 == 0 else 0.0) + 0.01 * (s % 5), 6)
            for s in range(n)]


def _saver(kind: str, keep: Any) -> tuple[Callback, SaverFiles, str]:
    """A saver of ``kind``, what a plan knows of it, and the folder it prunes."""
    if kind == "ModelSaver":
        return ModelSaver(keep=keep), SaverFiles("model", parse_keep(keep)), "checkpoints"
    if kind == "MinSaver":
        return (MinSaver(keep=keep), SaverFiles("best", saver_keep("MinSaver", keep),
                                                filename="min-val-loss.pt"), "best")
    if kind == "MaxSaver":
        return (MaxSaver("val/loss", keep=keep),
                SaverFiles("best", saver_keep("MaxSaver", keep), mode="max",
                           filename="max-val-loss.pt"), "best")
    return (TopKSaver(keep=keep), SaverFiles("topk", saver_keep("TopKSaver", keep),
                                             save_last=True), "best")


@dataclasses.dataclass(frozen=True)
class Case:
    """A run: its saver and keep, a save every ``period`` steps, ``epochs`` of ``SPE``."""

    kind: str
    keep: Any
    period: int
    epochs: int
    mode: str


def _fit(run_dir: Path, case: Case, at: int | None, *, resume: bool) -> None:
    model, opt = tiny_model()
    saver, _, _ = _saver(case.kind, case.keep)
    schedule = Schedule({"feed": every("1 step"), "save": every(f"{case.period} steps"),
                         "crash": every("1 step")})
    t = Trainer(model, opt, UnevenData([SPE]), torch.nn.functional.mse_loss,
                schedule=schedule, bindings={"feed": Feed(_values(SPE * case.epochs)),
                                             "save": saver, "crash": Preempt(at)},
                max_epochs=case.epochs, run_dir=run_dir, checkpoint_mode=case.mode)
    if resume:
        assert t.resume("auto") is not None
    try:
        t.fit()
    except Preempted as exc:
        assert exc.step == at


def _files(run_dir: Path) -> set[str]:
    """Every checkpoint file of the run, as ``folder/name``."""
    return {f"{p.parent.name}/{p.name}" for folder in ("checkpoints", "best")
            if (run_dir / folder).exists() for p in (run_dir / folder).iterdir()}


_latest = st.builds(lambda n: {"latest": n}, st.integers(1, 3))
_steps = st.builds(lambda k: {"every": f"{k} steps"}, st.integers(2, 9))
_epochs = st.builds(lambda k: {"every": f"{k} epochs"}, st.integers(1, 3))
_best = st.builds(lambda n, m: {"best": n, "monitor": "val/loss", "mode": m},
                  st.integers(1, 2), st.sampled_from(["min", "max"]))


def _any(*rules: st.SearchStrategy[dict[str, Any]]) -> st.SearchStrategy[Any]:
    one = st.one_of(*rules)
    return st.one_of(one, st.lists(one, min_size=2, max_size=3).map(lambda r: {"any": r}))


_KEEPS: dict[str, st.SearchStrategy[Any]] = {
    "ModelSaver": _any(_latest, _steps, _epochs, _best),
    "MinSaver": _any(_latest, _steps, _epochs),
    "MaxSaver": _any(_latest, _steps, _epochs),
    "TopKSaver": st.builds(lambda b, rest: {"any": [{"best": b}, *rest]}, st.integers(1, 2),
                           st.lists(st.one_of(_latest, _steps, _epochs), max_size=2)),
}


def _check(tmp: pytest.TempPathFactory, case: Case, preempts: list[int]) -> None:
    whole = tmp.mktemp("whole")
    _fit(whole, case, None, resume=False)
    _, planned, folder = _saver(case.kind, case.keep)
    log = simulate(Schedule({"save": every(f"{case.period} steps")}), epochs=case.epochs,
                   steps_per_epoch=SPE)
    values = _values(SPE * case.epochs)
    plan = planned_files(log, {"save": planned}, lambda f: {"val/loss": values[f.step - 1]})
    assert {f"{folder}/{n}" for n in plan[-1].files} == {
        f for f in _files(whole) if f.startswith(f"{folder}/")}

    broken = tmp.mktemp("preempted")
    for i, at in enumerate([*preempts, None]):
        _fit(broken, case, at, resume=i > 0)
    last = preempts[-1]
    expected = _files(whole)
    # No newer step file in checkpoints/ after the last preemption: its own file stays,
    # the one to resume from (a save at its step is that file, kept by the saver).
    if case.kind != "ModelSaver" or last // case.period == SPE * case.epochs // case.period:
        expected.add(f"checkpoints/step-{last:08d}.pt")
    assert _files(broken) == expected


@pytest.mark.filterwarnings("ignore::schedtrain.ScheduleWarning")
@settings(max_examples=10, deadline=None)
@given(st.sampled_from(["ModelSaver", "MinSaver", "MaxSaver", "TopKSaver"]), st.data(),
       st.lists(st.integers(1, 30), min_size=1, max_size=2, unique=True))
def test_preempt_and_resume_keep_the_unbroken_runs_files(
        tmp_path_factory: pytest.TempPathFactory, kind: str, data: st.DataObject,
        preempts: list[int]) -> None:
    """Preempted at one or two random steps and resumed each time with ``--resume auto``:
    the files left are the unbroken run's (which the plan lists), and the last
    preemption's own file only while no newer saver file exists in its folder."""
    case = Case(kind, data.draw(_KEEPS[kind]), data.draw(st.integers(1, 5)),
                data.draw(st.integers(3, 5)), data.draw(st.sampled_from(["sync", "async"])))
    total = SPE * case.epochs
    preempts = sorted(p for p in preempts if p <= total) or [total // 2]
    _check(tmp_path_factory, case, preempts)


@pytest.mark.filterwarnings("ignore::schedtrain.ScheduleWarning")
@pytest.mark.parametrize(("keep", "mode", "preempts"), [
    ({"any": [{"latest": 2}, {"every": "2 epochs"}]}, "sync", [16]),
    ({"any": [{"latest": 1}, {"every": "2 epochs"}]}, "async", [16, 20])])
def test_the_milestone_outlives_the_preemption(tmp_path_factory: pytest.TempPathFactory,
                                               keep: Any, mode: str,
                                               preempts: list[int]) -> None:
    """first-day-5 E2, scaled: saves every 3 steps, preempted at 16. The save at 12 ends
    epoch 2 and is kept for good; it was deleted after the resume once 15 was gone, and
    the preemption's own file kept in its place."""
    _check(tmp_path_factory, Case("ModelSaver", keep, 3, 4, mode), preempts)


@pytest.mark.filterwarnings("ignore::schedtrain.ScheduleWarning")
def test_a_preemption_file_of_an_earlier_version_is_no_save(tmp_path: Path) -> None:
    """A preemption checkpoint written before ``run.preempted`` existed is taken as the
    preemption's own file when resumed from: the milestone stays, it goes."""
    case = Case("ModelSaver", {"any": [{"latest": 2}, {"every": "2 epochs"}]}, 3, 4, "sync")
    whole, broken = tmp_path / "whole", tmp_path / "broken"
    _fit(whole, case, None, resume=False)
    _fit(broken, case, 16, resume=False)
    path = broken / "checkpoints" / "step-00000016.pt"
    state = read_checkpoint(path)
    assert state["run"].pop("preempted") == ["checkpoints/step-00000016.pt"]
    write_checkpoint({k: v for k, v in state.items() if k not in ("format", "checksum")},
                     path)
    _fit(broken, case, None, resume=True)
    assert _files(broken) == _files(whole)
