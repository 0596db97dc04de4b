"""The sanity evaluation before training (Lightning's ``num_sanity_val_steps``):
``sanity_eval_batches = N`` fires ``sanity_eval`` once, before ``train_start``; an
``InferenceRunner`` it fires evaluates at most N batches and logs nothing, a resumed
run does not run it again, and training is the same with or without it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from schedtrain import Schedule, Scheduled, ScheduleWarning, every, on, simulate
from schedtrain.callbacks import Callback, InferenceRunner, ModelSaver
from schedtrain.errors import SpecError
from schedtrain.spec import loads_spec
from schedtrain.training import Trainer

ce = torch.nn.functional.cross_entropy


class Counted:
    """Validation batches that count how many were drawn."""

    def __init__(self, n: int, *, width: int = 4) -> None:
        g = torch.Generator().manual_seed(1)
        self.x = torch.randn(n * 4, width, generator=g)
        self.y = (self.x[:, 0] > 0).long()
        self.n, self.drawn = n, 0

    def __iter__(self) -> Any:
        for i in range(self.n):
            self.drawn += 1
            yield self.x[i * 4:(i + 1) * 4], self.y[i * 4:(i + 1) * 4]


def _train_data() -> DataLoader[Any]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(24, 4, generator=g)
    return DataLoader(TensorDataset(x, (x[:, 1] > 0).long()), batch_size=4, shuffle=True)


def _trainer(val: Any, *, sanity: int, run_dir: Path | None = None,
             extra: dict[str, Any] | None = None, **kw: Any) -> Trainer:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Dropout(0.5),
                                torch.nn.Linear(8, 2))
    entries = {"validate": Scheduled(on("sanity_eval") | every("1 epoch"),
                                     InferenceRunner(), "validate")}
    entries.update(extra or {})
    return Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), _train_data(), ce,
                   val_data=val, schedule=Schedule(list(entries.values())),
                   sanity_eval_batches=sanity, run_dir=run_dir, handle_signals=False, **kw)


class TestSanityEval:
    """What the sanity evaluation runs, fires and logs."""

    def test_at_most_n_batches_before_train_start_logging_nothing(self) -> None:
        """N = 2 of 5 batches: two batches drawn before the first step, the firing is
        recorded at sanity_eval before train_start, no eval_* event fires and no val/*
        value is put by it."""
        val = Counted(5)
        events: list[tuple[str, int]] = []
        note = {f"e_{ev}": Scheduled(on(ev), lambda t, ev=ev: events.append((ev, t.clock.step)),
                                     f"e_{ev}")
                for ev in ("eval_start", "eval_step_start", "eval_end", "train_start")}
        drawn: list[int] = []
        note["first_step"] = Scheduled(on("train_start"),
                                       lambda t: drawn.append(val.drawn), "first_step")
        t = _trainer(val, sanity=2, max_epochs=1, extra=note)
        t.fit()
        assert drawn == [2]
        first = t.firings[0]
        assert (first.callback, first.event, first.timestamp.step) == ("validate",
                                                                     "sanity_eval", 0)
        assert events[0] == ("train_start", 0)
        assert [ev for ev, _ in events].count("eval_start") == 1  # the epoch's only
        assert [step for step, _ in t.metrics.history("val/loss")] == [6]  # the epoch's
        assert val.drawn == 2 + 5

    def test_n_beyond_the_data_evaluates_it_all(self) -> None:
        """N larger than the validation data: every batch once, no error."""
        val = Counted(3)
        t = _trainer(val, sanity=10, max_steps=1)
        t.fit()
        assert val.drawn == 3
        assert t.firings[0].event == "sanity_eval"

    def test_zero_runs_nothing(self) -> None:
        """sanity_eval_batches = 0 (the default): sanity_eval never fires."""
        val = Counted(3)
        t = _trainer(val, sanity=0, max_steps=1)
        t.fit()
        assert val.drawn == 0
        assert all(f.event != "sanity_eval" for f in t.firings)

    def test_a_broken_validation_step_fails_before_training(self) -> None:
        """Validation batches the model cannot take fail the run at step 0."""
        t = _trainer(Counted(3, width=5), sanity=1, max_epochs=1)
        with pytest.raises(RuntimeError):
            t.fit()
        assert t.clock.step == 0

    def test_training_is_the_same_with_or_without_it(self) -> None:
        """The random generators are as they were after it: shuffled data and dropout
        draw the same numbers, so the weights end equal."""
        x = torch.randn(16, 4)
        val = DataLoader(TensorDataset(x, (x[:, 0] > 0).long()), batch_size=4, shuffle=True)
        runs = []
        for sanity in (0, 3):
            t = _trainer(val, sanity=sanity, max_epochs=2)
            t.fit()
            runs.append(t.model.state_dict())
        for name, value in runs[0].items():
            assert torch.equal(value, runs[1][name])

    def test_asked_for_with_nothing_to_run_warns(self) -> None:
        """sanity_eval_batches > 0 with no trigger naming sanity_eval warns; so does a
        trigger naming it in a run where it never fires."""
        model = torch.nn.Linear(4, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        with pytest.warns(ScheduleWarning, match="no callback's trigger names 'sanity_eval'"):
            Trainer(model, opt, _train_data(), ce, callbacks=[InferenceRunner()],
                    val_data=Counted(1), max_epochs=1, sanity_eval_batches=2)
        with pytest.warns(ScheduleWarning, match="'v' names 'sanity_eval', which never fires"):
            Trainer(model, opt, _train_data(), ce, val_data=Counted(1), max_epochs=1,
                    schedule=Schedule({"v": on("sanity_eval")}),
                    bindings={"v": InferenceRunner()})

    def test_bad_count_is_refused_with_its_name(self) -> None:
        """A negative or non-integer count names the argument."""
        for bad in (-1, 1.5, True):
            with pytest.raises(ValueError, match="sanity_eval_batches"):
                _trainer(Counted(1), sanity=bad, max_epochs=1)  # type: ignore[arg-type]


class Crash(Callback):
    """Fails the run at one step (as a kill would end it there), when armed."""

    def __init__(self, at: int | None) -> None:
        self.at = at

    def _trigger(self) -> None:
        if self.now.step == self.at:
            raise RuntimeError("killed")


def _log(run_dir: Path) -> list[dict[str, Any]]:
    rows = []
    for line in (run_dir / "events.jsonl").read_text().splitlines():
        row = json.loads(line)
        for key in ("seconds", "time", "wall", "duration"):
            row.pop(key, None)
        rows.append(row)
    return rows


class TestResume:
    """A resumed run does not run the sanity evaluation again."""

    @pytest.mark.parametrize("at", [2, 6, 7])
    def test_resumed_log_equals_the_uninterrupted_one(self, tmp_path: Path, at: int) -> None:
        """Killed at a step and resumed from the newest checkpoint: events.jsonl holds the
        one sanity_eval line of the uninterrupted run, and the weights end equal."""
        def make(run_dir: Path, crash: int | None) -> Trainer:
            return _trainer(Counted(3), sanity=2, run_dir=run_dir, max_epochs=2, extra={
                "save": Scheduled(every("1 step"), ModelSaver(keep=None), "save"),
                "crash": Scheduled(every("1 step"), Crash(crash), "crash")})

        full = make(tmp_path / "full", None)
        full.fit()
        with pytest.raises(RuntimeError, match="killed"):
            make(tmp_path / "cut", at).fit()
        resumed = make(tmp_path / "cut", None)
        found = resumed.checkpoints.newest_valid(tmp_path / "cut" / "checkpoints")
        assert found is not None
        resumed.resume(found)
        resumed.fit()
        assert _log(tmp_path / "cut") == _log(tmp_path / "full")
        assert sum(1 for row in _log(tmp_path / "full")
                   if row.get("event") == "sanity_eval") == 1
        assert all(f.event != "sanity_eval" for f in resumed.firings)
        for name, value in full.model.state_dict().items():
            assert torch.equal(value, resumed.model.state_dict()[name])


class TestSimulationAndSpec:
    """simulate() and plan know the event; [run] sanity_eval_batches is checked."""

    def test_simulate_lists_it_first(self) -> None:
        """With sanity_eval=True the firing comes first, at step 0; without, never."""
        schedule = Schedule({"v": on("sanity_eval") | on("train_start")})
        log = simulate(schedule, epochs=1, steps_per_epoch=2, sanity_eval=True)
        assert [(f.event, f.timestamp.step) for f in log] == [("sanity_eval", 0),
                                                              ("train_start", 0)]
        plain = simulate(schedule, epochs=1, steps_per_epoch=2)
        assert [f.event for f in plain] == ["train_start"]

    def test_spec_refuses_a_negative_count(self) -> None:
        """[run] sanity_eval_batches = -1 is refused with its key path."""
        text = ('[run]\ntask = "m:f"\nmax_epochs = 1\nsanity_eval_batches = -1\n'
                '[callbacks.v]\ntype = "InferenceRunner"\ntrigger = { on = "sanity_eval" }\n')
        with pytest.raises(SpecError, match=r"run\.sanity_eval_batches"):
            loads_spec(text)

    def test_plan_takes_it_from_run(self) -> None:
        """plan fires sanity_eval when [run] sanity_eval_batches > 0 ([clock] may say)."""
        from schedtrain.planning import plan_spec
        from schedtrain.spec.shape import derive_clock

        text = ('[clock]\nsteps_per_epoch = 2\n[run]\ntask = "m:f"\nmax_epochs = 1\n'
                'sanity_eval_batches = 2\n[callbacks.v]\ntype = "InferenceRunner"\n'
                'trigger = { any = [{ on = "sanity_eval" }, { every = "1 epoch" }] }\n')
        spec, notes = derive_clock(loads_spec(text))
        assert notes == []
        firings = plan_spec(spec).log
        assert [(f.event, f.timestamp.step) for f in firings] == [("sanity_eval", 0),
                                                                  ("epoch_end", 2)]
