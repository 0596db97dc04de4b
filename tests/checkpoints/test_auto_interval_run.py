"""``every("auto")`` in a real run: a save's measured cost decides the interval, each
decision is logged, and a run cut anywhere and resumed fires as the uninterrupted one."""

from __future__ import annotations

import itertools
import json
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from training_helpers import Noop, UnevenData, comparable, tiny_model

from schedtrain import Schedule, every
from schedtrain.callbacks import ModelSaver
from schedtrain.triggers import auto_every
from schedtrain.triggers.auto import auto_interval

#: The test's clock (seconds): each step adds 1, each save's landing what ``_COST`` says.
_NOW = [0.0]


def _cost(step: int) -> float:
    return 0.5 + (step * 7 % 5) / 4


class _Timed(ModelSaver):
    """A saver whose measurements read the test's clock: the same in every run."""

    def _setup(self) -> None:
        super()._setup()
        assert self._pacing is not None
        self._pacing.clock = lambda: _NOW[0]

    def _landed(self, written: Path) -> None:
        _NOW[0] += _cost(self.now.step)
        super()._landed(written)


class _Tick(Noop):
    def _trigger(self) -> None:
        _NOW[0] += 1.0


def _trainer(run_dir: Path, **kw: Any) -> Any:
    from schedtrain.training import Trainer
    model, opt = tiny_model()
    return Trainer(model, opt, UnevenData([12] * 4), torch.nn.functional.mse_loss,
                   schedule=Schedule({"tick": every("1 step"), "save": auto_every(3)}),
                   bindings={"tick": _Tick(), "save": _Timed(keep=None)}, device="cpu",
                   run_dir=run_dir, handle_signals=False, checkpoint_mode="sync",
                   mtbf="40 s", **kw)


def _clock_at(step: int, firings: list[Any]) -> float:
    """The test's clock once the save at ``step`` landed, as the uninterrupted run had it."""
    saves = [f.step for f in firings if f.callback == "save" and f.step <= step]
    return step + sum(_cost(s) for s in saves)


@settings(max_examples=4, deadline=None)
@given(st.integers(4, 47))
def test_cut_anywhere_and_resumed_fires_as_the_uninterrupted_run(
        tmp_path_factory: pytest.TempPathFactory, cut: int) -> None:
    """The decision the resumed checkpoint's own save made is read back from the log; the
    next firings are where the uninterrupted run put them."""
    tmp = tmp_path_factory.mktemp("auto")
    _NOW[0] = 0.0
    whole = _trainer(tmp / "whole", max_epochs=4)
    whole.fit()
    saves = [f.step for f in whole.firings if f.callback == "save"]
    assert len({b - a for a, b in itertools.pairwise(saves)}) > 1  # it adapts
    _NOW[0] = 0.0
    _trainer(tmp / "cut", max_steps=cut).fit()
    again = _trainer(tmp / "cut", max_epochs=4)
    found = again.resume("auto")
    assert found is not None
    at = again.clock.step
    _NOW[0] = _clock_at(at, whole.firings)
    again.fit()
    want = [f for f in comparable(whole.firings) if f[2].step > at]
    assert [f for f in comparable(again.firings) if f[2].step > at] == want
    logged = [json.loads(x) for x in (tmp / "cut" / "events.jsonl").read_text().splitlines()]
    intervals = [r["value"] for r in logged if r.get("name") == "save/interval"]
    assert intervals == [r["value"] for r in map(json.loads, (
        tmp / "whole" / "events.jsonl").read_text().splitlines()) if r.get("name") ==
        "save/interval"]


def test_a_slow_save_is_measured_and_lengthens_the_interval(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A save made 0.5 s slower is measured so (sync: the loop's stall), and Young/Daly
    give it a longer interval than a fast one."""
    from schedtrain.checkpoints.mount import Mount
    from schedtrain.training import Trainer

    def run(delay: float, where: Path) -> list[dict[str, Any]]:
        real = Mount.write

        def slow(self: Any, body: Any, path: Any) -> Any:
            time.sleep(delay)
            return real(self, body, path)

        monkeypatch.setattr(Mount, "write", slow)
        model, opt = tiny_model()
        Trainer(model, opt, UnevenData([30]), torch.nn.functional.mse_loss,
                schedule=Schedule({"save": auto_every(2)}), bindings={"save": ModelSaver()},
                device="cpu", run_dir=where, handle_signals=False, checkpoint_mode="sync",
                mtbf="1 h", max_epochs=1).fit()
        rows = [json.loads(x) for x in (where / "events.jsonl").read_text().splitlines()]
        return [r for r in rows if r.get("name", "").startswith("save/")]

    fast = run(0.0, tmp_path / "fast")
    slow = run(0.5, tmp_path / "slow")
    cost = [r["value"] for r in slow if r["name"] == "save/save_cost"]
    assert cost and all(c >= 0.5 for c in cost)
    # Each decision is Young/Daly's for what was measured, in seconds longer for the
    # slower save (in steps it also depends on the step time, which load changes).
    seconds = []
    for rows in (fast, slow):
        got = {r["name"]: r["value"] for r in rows[:3]}
        assert got["save/interval"] == auto_interval(max(got["save/save_cost"], 1e-6), 3600.0,
                                                     got["save/step_time"])
        seconds.append(got["save/interval"] * got["save/step_time"])
    assert seconds[1] > seconds[0]


def test_auto_without_a_failure_rate_is_refused_in_one_line(tmp_path: Path) -> None:
    from schedtrain.training import Trainer
    model, opt = tiny_model()
    t = Trainer(model, opt, UnevenData([4]), torch.nn.functional.mse_loss,
                schedule=Schedule({"save": auto_every()}), bindings={"save": ModelSaver()},
                device="cpu", run_dir=tmp_path, handle_signals=False, max_epochs=1)
    with pytest.raises(ValueError, match=r"callback 'save': every\('auto'\) picks the "
                                         r"interval from the failure rate"):
        t.fit()


# -- a schedule change that keeps the saver (issue 42, E1) ----------------------------------

class _Ask(Noop):
    """Hands its own running trainer ``new`` when it fires (a live retime)."""

    def __init__(self, new: Schedule) -> None:
        super().__init__()
        self.new = new

    def _trigger(self) -> None:
        self.trainer.retimer.retime(self.new)


def _changing(other: str, ask: int) -> Schedule:
    """The timed job with one more callback, ``other``, whose trigger a change alters."""
    return Schedule({"tick": every("1 step"), "other": every(other),
                     "ask": every(f"{ask} steps"), "save": auto_every(3)})


def _changed_trainer(run_dir: Path, schedule: Schedule, ask: Any, **kw: Any) -> Any:
    from schedtrain.training import Trainer
    model, opt = tiny_model()
    return Trainer(model, opt, UnevenData([12] * 4), torch.nn.functional.mse_loss,
                   schedule=schedule, bindings={"tick": _Tick(), "other": Noop(), "ask": ask,
                                                "save": _Timed(keep=None)},
                   device="cpu", run_dir=run_dir, handle_signals=False,
                   checkpoint_mode="sync", mtbf="40 s", max_epochs=4, **kw)


def _decisions(run_dir: Path) -> list[tuple[int, float]]:
    rows = [json.loads(x) for x in (run_dir / "events.jsonl").read_text().splitlines()]
    return [(r["step"], r["value"]) for r in rows if r.get("name") == "save/interval"]


def _saves(trainer: Any, after: int = 0) -> list[int]:
    return [f.step for f in trainer.firings if f.callback == "save" and f.step > after]


@settings(max_examples=3, deadline=None)
@given(st.integers(4, 12))  # the interval still changes after it (8 -> 9 at step 14)
def test_a_live_retime_of_another_callback_leaves_the_savers_decisions(
        tmp_path_factory: pytest.TempPathFactory, step: int) -> None:
    """Retimed live at ``step`` (another callback's trigger changes): applied, and the
    saver's interval decisions and saves are the unretimed run's, before and after it."""
    tmp = tmp_path_factory.mktemp("live")
    _NOW[0] = 0.0
    whole = _changed_trainer(tmp / "whole", _changing("2 steps", 10**6), Noop())
    whole.fit()
    _NOW[0] = 0.0
    new = _changing("3 steps", step)
    retimed = _changed_trainer(tmp / "retimed", _changing("2 steps", step), _Ask(new))
    retimed.fit()
    rows = [json.loads(x) for x in (tmp / "retimed" / "events.jsonl").read_text().splitlines()]
    assert [(r["step"], r["rule"]) for r in rows if r["kind"] == "schedule_change"] == [
        (step, "retime")]
    assert [f.step for f in retimed.firings if f.callback == "other" and f.step > step] == [
        s for s in range(step + 1, 49) if s % 3 == 0]
    decided = _decisions(tmp / "whole")
    then = [v for s, v in decided if s <= step]
    assert any(v != then[-1] for s, v in decided if s > step)  # the saver re-decides
    assert _saves(retimed) == _saves(whole)
    assert _decisions(tmp / "retimed") == decided


@settings(max_examples=3, deadline=None)
@given(st.integers(4, 40))
def test_a_resume_applying_another_schedule_keeps_the_savers_decisions(
        tmp_path_factory: pytest.TempPathFactory, cut: int) -> None:
    """Cut at ``cut`` and resumed with ``schedule_change="apply"`` and another callback's
    trigger changed: the saver is kept, and saves where the uninterrupted run did, with
    the same decisions (the one its checkpoint's own save made read back from the log)."""
    tmp = tmp_path_factory.mktemp("apply")
    _NOW[0] = 0.0
    whole = _changed_trainer(tmp / "whole", _changing("2 steps", 10**6), Noop())
    whole.fit()
    _NOW[0] = 0.0
    _changed_trainer(tmp / "cut", _changing("2 steps", 10**6), Noop(), max_steps=cut).fit()
    again = _changed_trainer(tmp / "cut", _changing("3 steps", 10**6), Noop(),
                             schedule_change="apply")
    assert again.resume("auto") is not None
    at = again.clock.step
    _NOW[0] = _clock_at(at, whole.firings)
    again.fit()
    assert _saves(again, at) == _saves(whole, at)
    assert _decisions(tmp / "cut") == _decisions(tmp / "whole")
