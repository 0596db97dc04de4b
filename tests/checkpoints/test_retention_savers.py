"""MinSaver, MaxSaver and TopKSaver speak the keep vocabulary: files, plan, check, resume."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, ClassVar

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from test_retention import Feed  # puts val/loss from a list at every step
from training_helpers import UnevenData, tiny_model

from schedtrain import Schedule, every
from schedtrain.callbacks import Callback, MaxSaver, MinSaver, ModelSaver, TopKSaver
from schedtrain.checkpoints import read_checkpoint, write_checkpoint
from schedtrain.checkpoints.format import DamagedCheckpoint
from schedtrain.cli import main
from schedtrain.retention import AnyOf, Best, Every, Latest, saver_keep
from schedtrain.simulation import SaverFiles, planned_files, simulate
from schedtrain.training import Trainer


def _run(run_dir: Path, saver: Callback, values: list[float], *,
         max_steps: int | None = None, resume: Path | None = None,
         mode: str = "sync") -> list[list[str]]:
    """A run firing ``saver`` every step; the files in best/ after each firing's save."""
    seen: list[list[str]] = []

    class Look(Callback):
        def _trigger(self) -> None:
            folder = run_dir / "best"
            seen.append(sorted(p.name for p in folder.iterdir()) if folder.exists() else [])

    model, opt = tiny_model()
    schedule = Schedule({"feed": every("1 step"), "save": every("1 step"),
                         "look": every("1 step"), "mark": every("1 step")})
    # ``mark`` checkpoints every step, so a run can be resumed from any step
    t = Trainer(model, opt, UnevenData([len(values)]), torch.nn.functional.mse_loss,
                schedule=schedule, bindings={"feed": Feed(values), "save": saver,
                                             "look": Look(), "mark": ModelSaver(keep=None)},
                max_epochs=1, max_steps=max_steps, run_dir=run_dir, checkpoint_mode=mode)
    if resume is not None:
        t.resume(resume)
    t.fit()
    return seen


def _files(run_dir: Path) -> list[str]:
    best = run_dir / "best"  # not made until a saver writes (every value NaN: never)
    return sorted(p.name for p in best.iterdir()) if best.exists() else []


_history = st.one_of(
    st.none(), st.integers(1, 3),
    st.builds(lambda n: {"latest": n}, st.integers(1, 3)),
    st.builds(lambda k: {"every": f"{k} steps"}, st.integers(2, 4)),
    st.builds(lambda n, k: {"any": [{"latest": n}, {"every": f"{k} steps"}]},
              st.integers(1, 2), st.integers(2, 4)))
_ranked = st.one_of(
    st.builds(lambda n: {"best": n}, st.integers(1, 3)),
    st.builds(lambda n, m: {"any": [{"best": n}, {"latest": m}]},
              st.integers(1, 2), st.integers(1, 2)),
    st.builds(lambda n, k: {"any": [{"best": n}, {"every": f"{k} steps"}]},
              st.integers(1, 2), st.integers(2, 4)))
_values = st.lists(st.one_of(st.floats(-2, 2), st.sampled_from([0.5, math.nan, math.inf])),
                   min_size=2, max_size=7)


def _saver(kind: str, keep: Any, mode: str) -> tuple[Callback, SaverFiles]:
    """A saver of ``kind`` and what a plan knows of it."""
    if kind == "MinSaver":
        policy = saver_keep("MinSaver", keep)
        return MinSaver(keep=keep), SaverFiles("best", policy, filename="min-val-loss.pt")
    if kind == "MaxSaver":
        policy = saver_keep("MaxSaver", keep)
        return (MaxSaver("val/loss", keep=keep),
                SaverFiles("best", policy, mode="max", filename="max-val-loss.pt"))
    policy = saver_keep("TopKSaver", keep, "val/loss", mode)
    return (TopKSaver(mode=mode, keep=keep),
            SaverFiles("topk", policy, mode=mode, save_last=True))  # type: ignore[arg-type]


class TestPlannedFiles:
    """After every save a real run's best/ folder holds the files the plan lists."""

    @settings(max_examples=20, deadline=None)
    @given(st.sampled_from(["MinSaver", "MaxSaver", "TopKSaver"]), st.data(), _values,
           st.sampled_from(["min", "max"]))
    def test_after_every_save(self, tmp_path_factory: pytest.TempPathFactory, kind: str,
                              data: st.DataObject, values: list[float], mode: str) -> None:
        """A save lands once its event's firings have run, so the look at step s sees
        the files after the save of step s - 1, and the folder at the end the last."""
        keep = data.draw(_ranked if kind == "TopKSaver" else _history)
        saver, planned_saver = _saver(kind, keep, mode)
        run_dir = tmp_path_factory.mktemp("run")
        seen = _run(run_dir, saver, values)
        log = simulate(Schedule({"save": every("1 step")}), epochs=1,
                       steps_per_epoch=len(values))
        planned = planned_files(log, {"save": planned_saver},
                                lambda f: {"val/loss": values[f.step - 1]})
        assert [sorted(p.files) for p in planned[:-1]] == seen[1:]
        assert sorted(planned[-1].files) == _files(run_dir)

    @pytest.mark.parametrize("kind", ["MinSaver", "MaxSaver"])
    def test_no_file_when_every_value_is_nan(self, tmp_path: Path, kind: str) -> None:
        """Nothing finite to rank: no best file is written, and the plan lists none."""
        saver, planned_saver = _saver(kind, None, "min")
        values = [math.nan, math.nan]
        seen = _run(tmp_path / "run", saver, values)
        log = simulate(Schedule({"save": every("1 step")}), epochs=1, steps_per_epoch=2)
        planned = planned_files(log, {"save": planned_saver},
                                lambda f: {"val/loss": values[f.step - 1]})
        assert [sorted(p.files) for p in planned] == [[], []]
        assert seen[1:] == [[]] and _files(tmp_path / "run") == []


class TestSavers:
    """What each saver writes and keeps in a run, and across resume."""

    VALUES: ClassVar[list[float]] = [0.9, 0.5, 0.7, 0.4, 0.3, 0.8, 0.2]

    def test_min_saver_keeps_a_history_of_new_bests(self, tmp_path: Path) -> None:
        """keep = 2: the best file and the two newest new bests (steps 5 and 7)."""
        _run(tmp_path, MinSaver(keep=2), self.VALUES)
        assert _files(tmp_path) == ["min-val-loss-step-00000005.pt",
                                    "min-val-loss-step-00000007.pt", "min-val-loss.pt"]

    def test_topk_keep_adds_rules_beside_the_best(self, tmp_path: Path) -> None:
        """keep = best 2 or every 3 steps: the two lowest (steps 5, 7) and the first
        save at or after steps 3 and 6, and last.pt."""
        _run(tmp_path, TopKSaver(keep={"any": [{"best": 2}, {"every": "3 steps"}]}),
             self.VALUES)
        assert _files(tmp_path) == ["last.pt", "val-loss-step-00000003.pt",
                                    "val-loss-step-00000005.pt", "val-loss-step-00000006.pt",
                                    "val-loss-step-00000007.pt"]

    @pytest.mark.parametrize(("saver", "planned"), [
        (lambda: MinSaver(keep=2), SaverFiles("best", Latest(2), filename="min-val-loss.pt")),
        (lambda: TopKSaver(keep={"any": [{"best": 2}, {"every": "3 steps"}]}),
         SaverFiles("topk", AnyOf([Best(2), Every("3 steps")]), save_last=True))])
    def test_background_saves_leave_the_planned_files(self, tmp_path: Path, saver: Any,
                                                      planned: SaverFiles) -> None:
        """With background saves (each pruned once it lands) the run ends with the plan's
        files."""
        _run(tmp_path, saver(), self.VALUES, mode="async")
        log = simulate(Schedule({"save": every("1 step")}), epochs=1,
                       steps_per_epoch=len(self.VALUES))
        files = planned_files(log, {"save": planned},
                              lambda f: {"val/loss": self.VALUES[f.step - 1]})
        assert _files(tmp_path) == sorted(files[-1].files)

    def test_save_top_k_is_a_best_rule(self) -> None:
        """save_top_k = 2 is keep = { best = 2 } by the saver's monitor and mode."""
        saver = TopKSaver("val/acc", "max", 2)
        assert saver.keep == Best(2, "val/acc", "max")
        assert TopKSaver(save_top_k=0).keep is None

    @pytest.mark.parametrize("saver", [
        lambda: MinSaver(keep={"any": [{"latest": 1}, {"every": "4 steps"}]}),
        lambda: TopKSaver(keep={"any": [{"best": 1}, {"latest": 1}, {"every": "4 steps"}]})])
    def test_resume_keeps_the_same_files(self, tmp_path: Path, saver: Any) -> None:
        """Stopped at step 3 and resumed, the run keeps the files of an unbroken one."""
        whole, part = tmp_path / "whole", tmp_path / "part"
        _run(whole, saver(), self.VALUES)
        _run(part, saver(), self.VALUES, max_steps=3)
        _run(part, saver(), self.VALUES,
             resume=part / "checkpoints" / "step-00000003.pt")
        assert _files(part) == _files(whole)

    @pytest.mark.parametrize("saver", [lambda: MinSaver(keep=1),
                                       lambda: TopKSaver(keep={"best": 1})])
    def test_a_record_naming_another_folder_is_refused(self, tmp_path: Path,
                                                       saver: Any) -> None:
        """A checkpoint whose saver records name ``../victim`` is refused on resume, by
        key path, before anything is restored (nothing is deleted)."""
        run = tmp_path / "run"
        _run(run, saver(), self.VALUES[:3])
        path = run / "checkpoints" / "step-00000003.pt"
        state = read_checkpoint(path)
        state["run"]["callbacks"]["save"]["records"][0][0] = "../victim.txt"
        write_checkpoint({k: v for k, v in state.items() if k not in ("format", "checksum")},
                         path)
        key = r"run\.callbacks\.save\.records\[0\]\[0\]"
        with pytest.raises(DamagedCheckpoint, match=key + ": .*victim"):
            _run(run, saver(), self.VALUES[:3], resume=path)

    def test_python_policies_are_checked_like_toml(self) -> None:
        """A policy object gets the same refusals as its table."""
        assert MinSaver(keep=AnyOf([Latest(1), Every("2 steps")])).keep is not None
        with pytest.raises(ValueError, match="new best of its monitor"):
            MinSaver(keep=Best(2))
        with pytest.raises(ValueError, match="ranks by its own monitor 'val/acc'"):
            TopKSaver("val/acc", keep=Best(2))
        with pytest.raises(ValueError, match="not both"):
            TopKSaver(save_top_k=2, keep={"best": 2})


class TestCheck:
    """schedtrain check refuses keep rules that make no sense for a saver."""

    @pytest.mark.parametrize(("body", "where", "says"), [
        ('type = "MinSaver"\nkeep = { any = [{ latest = 2 }, { best = 1 }] }',
         "callbacks.s.keep.any[1]", "write { latest = N } for the history"),
        ('type = "TopKSaver"\nkeep = { latest = 2 }', "callbacks.s.keep",
         "needs a best rule"),
        ('type = "TopKSaver"\nkeep = 3', "callbacks.s.keep", "write save_top_k = 3"),
        ('type = "TopKSaver"\nmode = "max"\nkeep = { best = 2, mode = "min" }',
         "callbacks.s.keep.mode", "ranks by its own mode 'max'"),
        ('type = "TopKSaver"\nsave_top_k = 2\nkeep = { best = 2 }', "callbacks.s.keep",
         "not both"),
        ('type = "MaxSaver"\nkeep = { every = "0 steps" }', "callbacks.s.keep.every",
         "time > 0"),
    ])
    def test_bad_keep_exits_2(self, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                              body: str, where: str, says: str) -> None:
        """The error names the key path and what to write instead, with no traceback."""
        spec = tmp_path / "s.toml"
        spec.write_text(f'[callbacks.s]\n{body}\ntrigger = {{ every = "1 epoch" }}\n')
        assert main(["check", str(spec)]) == 2
        err = capsys.readouterr().err
        assert where in err and says in err and "Traceback" not in err


class TestPlan:
    """schedtrain plan lists the best savers' files."""

    SPEC = ('[clock]\nepochs = 1\nsteps_per_epoch = 40\n'
            '[callbacks.best]\ntype = "MinSaver"\nkeep = 1\ntrigger = { every = "10 steps" }\n'
            '[callbacks.top]\ntype = "TopKSaver"\ntrigger = { every = "10 steps" }\n'
            'keep = { any = [{ best = 1 }, { every = "20 steps" }] }\n')

    def test_json_from_a_metric_stream(self, tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
        """With --metrics, new bests at steps 10 and 30 (not 20, 40) decide the files."""
        spec, stream = tmp_path / "s.toml", tmp_path / "m.jsonl"
        spec.write_text(self.SPEC)
        stream.write_text("".join(f'{{"name": "val/loss", "value": {v}, "step": {s}}}\n'
                                  for s, v in ((10, 0.5), (20, 0.6), (30, 0.4), (40, 0.45))))
        assert main(["plan", str(spec), "--format", "json", "--metrics", str(stream)]) == 0
        after = json.loads(capsys.readouterr().out)["checkpoints"]["after_saves"]
        last = {a["callback"]: a["files"] for a in after}
        assert last == {"best": ["min-val-loss.pt", "min-val-loss-step-00000030.pt"],
                        "top": ["last.pt", "val-loss-step-00000020.pt",
                                "val-loss-step-00000030.pt", "val-loss-step-00000040.pt"]}

    def test_table_without_metrics(self, tmp_path: Path,
                                   capsys: pytest.CaptureFixture[str]) -> None:
        """Without values each MinSaver firing is a new best, and the best slot is open."""
        spec = tmp_path / "s.toml"
        spec.write_text(self.SPEC)
        assert main(["plan", str(spec)]) == 0
        out = capsys.readouterr().out
        assert "best: min-val-loss.pt at each new min of val/loss, its history keep = " \
               "{ latest = 1 }" in out
        assert "top: keep = { any = [{ best = 1, monitor = \"val/loss\", mode = \"min\" }, " \
               "{ every = \"20 steps\" }] }, and last.pt" in out
        assert "best rules may keep up to 1 more" in out
        assert "each MinSaver/MaxSaver firing is taken as a new best" in out
