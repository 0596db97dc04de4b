"""Retention policies: which checkpoints ModelSaver keeps, in Python and TOML, across resume."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from training_helpers import UnevenData, tiny_model

from schedtrain import Schedule, every, on
from schedtrain.callbacks import Callback, ModelSaver
from schedtrain.checkpoints.size import estimate_checkpoint_bytes
from schedtrain.cli import main
from schedtrain.planning.plan import plan_spec
from schedtrain.planning.render import draw_png
from schedtrain.retention import (
    AnyOf,
    Best,
    Every,
    Latest,
    Saved,
    parse_keep,
    policy_problems,
    retained,
)
from schedtrain.simulation import planned_files, simulate
from schedtrain.spec import load_spec
from schedtrain.time import Time, Timestamp
from schedtrain.training import Trainer
from schedtrain.training.from_spec import load_task


def _saves(steps: list[int], finite: list[bool] | None = None,
           values: list[float] | None = None) -> list[Saved]:
    return [Saved(f"step-{s:08d}.pt", Timestamp(step=s, seconds=s * 10.0),
                  True if finite is None else finite[i],
                  {} if values is None else {"val/loss": values[i]})
            for i, s in enumerate(steps)]


_steps = st.lists(st.integers(1, 60), min_size=1, max_size=12, unique=True).map(sorted)


class TestRules:
    """Each rule keeps what its documentation says."""

    @given(_steps, st.integers(1, 5), st.lists(st.booleans(), min_size=12, max_size=12))
    def test_latest_is_keep_n(self, steps: list[int], n: int, ok: list[bool]) -> None:
        """Latest(n): the newest n, plus the newest finite one (today's keep = n)."""
        saved = _saves(steps, ok[:len(steps)])
        kept = retained(Latest(n), saved)
        finite = [i for i, s in enumerate(saved) if s.finite]
        assert kept == set(range(len(saved))[-n:]) | set(finite[-1:])

    @given(_steps, st.integers(1, 20))
    def test_every_keeps_the_first_at_each_multiple(self, steps: list[int], k: int) -> None:
        """Every(k steps) keeps a save iff no earlier save reached its multiple of k."""
        saved = _saves(steps)
        kept = Every(Time(k, "steps")).keeps(saved)
        for i, s in enumerate(steps):
            before = steps[i - 1] if i else 0
            assert (i in kept) == (s // k > before // k)

    def test_every_on_a_time_grid(self) -> None:
        """Every('1 min') reads training time: saves at 50 s, 70 s, 110 s, 130 s keep 70, 130."""
        saved = [Saved(f"step-{i:08d}.pt", Timestamp(step=i, seconds=t))
                 for i, t in enumerate([50, 70, 110, 130], 1)]
        assert Every("1 min").keeps(saved) == {1, 3}

    @given(st.lists(st.tuples(st.integers(0, 12), st.integers(0, 4)), min_size=1,
                    max_size=12, unique=True).map(sorted), st.integers(1, 4))
    def test_every_epochs_keeps_the_last_at_or_before_each_multiple(
            self, places: list[tuple[int, int]], k: int) -> None:
        """Every(k epochs) keeps, for each multiple m of k, the last save at or before
        the end of epoch m (a save between epochs has step_in_epoch 0; one inside epoch
        e + 1 has epoch e and step_in_epoch > 0), once a later save is past it."""
        saved = [Saved(f"step-{i:08d}.pt", Timestamp(step=i, epoch=e, step_in_epoch=s))
                 for i, (e, s) in enumerate(places)]
        kept = Every(Time(k, "epochs")).keeps(saved)

        def at_or_before(i: int, m: int) -> bool:
            e, s = places[i]
            return e < m or (e == m and s == 0)

        expected = set()
        for m in range(k, 14, k):
            before = [i for i in range(len(saved)) if at_or_before(i, m)]
            if before and before[-1] + 1 < len(saved):
                expected.add(before[-1])
        assert kept == expected

    @given(st.lists(st.one_of(st.floats(-3, 3), st.just(math.nan)), min_size=1, max_size=8),
           st.integers(1, 3), st.sampled_from(["min", "max"]))
    def test_best_keeps_the_n_best_finite(self, values: list[float], n: int, mode: str) -> None:
        """Best(n) keeps the n best values (the earlier on a tie), never a NaN."""
        saved = _saves(list(range(1, len(values) + 1)), values=values)
        sign = 1 if mode == "min" else -1
        want = {i for _, i in sorted((sign * v, i) for i, v in enumerate(values)
                                     if math.isfinite(v))[:n]}
        assert Best(n, "val/loss", mode).keeps(saved) == want  # type: ignore[arg-type]

    @given(_steps, st.integers(1, 4), st.integers(1, 20))
    def test_any_is_the_union(self, steps: list[int], n: int, k: int) -> None:
        """AnyOf keeps what any of its rules keeps."""
        saved = _saves(steps)
        rules = (Latest(n), Every(Time(k, "steps")))
        assert AnyOf(rules).keeps(saved) == rules[0].keeps(saved) | rules[1].keeps(saved)


class TestParsing:
    """keep = N and the TOML tables build the same values as Python."""

    def test_the_issue_example(self) -> None:
        """The table from the documentation parses to the Python policy."""
        table = {"any": [{"latest": 3}, {"every": "10000 steps"},
                         {"best": 2, "monitor": "val/loss", "mode": "min"}, {"every": "1 h"}]}
        assert parse_keep(table) == AnyOf([Latest(3), Every("10000 steps"),
                                           Best(2, "val/loss", "min"), Every("1 h")])
        assert parse_keep(3) == Latest(3)
        assert parse_keep(None) is None

    @pytest.mark.parametrize(("value", "where", "says"), [
        (0, ("keep",), "whole number >= 1"),
        ({"latest": 0}, ("keep", "latest"), "whole number >= 1"),
        ({"every": "0 steps"}, ("keep", "every"), "> 0"),
        ({"every": "3 stps"}, ("keep", "every"), "did you mean 'steps'"),
        ({"best": 1, "monitor": "m", "mode": "up"}, ("keep", "mode"), "'min' or 'max'"),
        ({"any": [{"latest": 2}, {"lates": 2}]}, ("keep", "any", 1), "exactly one of"),
        ({"latest": 2, "monitor": "x"}, ("keep", "monitor"), "unknown key"),
        ({"any": []}, ("keep", "any"), "non-empty list"),
    ])
    def test_bad_policies_name_the_key(self, value: Any, where: tuple[Any, ...],
                                       says: str) -> None:
        """Each bad policy is one problem at its key path; Python raises the same."""
        [(at, message)] = policy_problems(value)
        assert at == where
        assert says in message
        with pytest.raises(ValueError, match=says.replace("(", r"\(")):
            ModelSaver(keep=value)

    def test_check_exits_2(self, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
        """schedtrain check reports a bad policy at its path and exits 2."""
        spec = tmp_path / "s.toml"
        spec.write_text('[run]\nmax_steps = 10\n[callbacks.save]\ntype = "ModelSaver"\n'
                        'trigger = { every = "2 steps" }\n'
                        'keep = { any = [{ latest = 2 }, { every = "-1 steps" }] }\n')
        assert main(["check", str(spec)]) == 2
        assert "callbacks.save.keep.any[1].every" in capsys.readouterr().err


class Feed(Callback):
    """Puts ``val/loss`` from a list at every step."""

    produces = ("val/loss",)

    def __init__(self, values: list[float]) -> None:
        self.values = values

    def _trigger(self) -> None:
        self.metrics.put("val/loss", self.values[self.now.step - 1])


def _run(run_dir: Path, keep: Any, values: list[float], steps: int, *,
         max_steps: int | None = None, resume: Path | None = None,
         mode: str = "sync") -> list[list[str]]:
    """A run saving every step; the files in checkpoints/ after each save."""
    seen: list[list[str]] = []

    class Look(Callback):
        def _trigger(self) -> None:
            folder = run_dir / "checkpoints"
            seen.append(sorted(p.name for p in folder.iterdir()) if folder.exists() else [])

    model, opt = tiny_model()
    schedule = Schedule({"feed": every("1 step"), "save": every("1 step"),
                         "look": every("1 step")})
    t = Trainer(model, opt, UnevenData([steps]), torch.nn.functional.mse_loss,
                schedule=schedule, bindings={"feed": Feed(values), "save": ModelSaver(keep),
                                             "look": Look()},
                max_epochs=1, max_steps=max_steps, run_dir=run_dir, checkpoint_mode=mode)
    if resume is not None:
        t.resume(resume)
    t.fit()
    return seen


def _expected(keep: Any, values: list[float], steps: int) -> list[str]:
    kept: list[Saved] = []
    policy = parse_keep(keep)
    for s in range(1, steps + 1):
        kept.append(Saved(f"step-{s:08d}.pt", Timestamp(step=s), True,
                          {"val/loss": values[s - 1]}))
        kept = [kept[i] for i in sorted(retained(policy, kept))]
    return sorted(s.name for s in kept)


_policies = st.one_of(
    st.integers(1, 3),
    st.builds(lambda n: {"latest": n}, st.integers(1, 3)),
    st.builds(lambda k: {"every": f"{k} steps"}, st.integers(1, 4)),
    st.builds(lambda n, m: {"best": n, "monitor": "val/loss", "mode": m}, st.integers(1, 2),
              st.sampled_from(["min", "max"])),
)
_any = st.lists(_policies.filter(lambda p: not isinstance(p, int)), min_size=1,
                max_size=3).map(lambda rules: {"any": rules})


class TestModelSaver:
    """A real run's files follow the policy, and resume exactly."""

    @settings(max_examples=12, deadline=None)
    @given(st.one_of(_policies, _any), st.lists(st.floats(-2, 2), min_size=6, max_size=6))
    def test_files_follow_the_policy(self, tmp_path_factory: pytest.TempPathFactory,
                                     keep: Any, values: list[float]) -> None:
        """At the end, the files left are those the rules keep, save after save."""
        run_dir = tmp_path_factory.mktemp("run")
        _run(run_dir, keep, values, 6)
        files = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
        assert files == _expected(keep, values, 6)

    @settings(max_examples=12, deadline=None)
    @given(st.one_of(_policies, _any), st.integers(2, 7), st.data())
    def test_plan_lists_the_files_a_run_leaves(self, tmp_path_factory: pytest.TempPathFactory,
                                                keep: Any, steps: int,
                                                data: st.DataObject) -> None:
        """After each save, the files in checkpoints/ are those planned_files lists for
        the simulated run (a save lands once its event's firings have run, so the real
        run's look at step s sees the files after the save of step s - 1)."""
        values = data.draw(st.lists(st.floats(-2, 2), min_size=steps, max_size=steps))
        run_dir = tmp_path_factory.mktemp("run")
        seen = _run(run_dir, keep, values, steps)
        log = simulate(Schedule({"feed": every("1 step"), "save": every("1 step"),
                                 "look": every("1 step")}), epochs=1, steps_per_epoch=steps)
        planned = planned_files(log, {"save": parse_keep(keep)},
                                lambda f: {"val/loss": values[f.step - 1]})
        assert [list(p.files) for p in planned[:-1]] == seen[1:]
        assert list(planned[-1].files) == sorted(p.name for p in (run_dir / "checkpoints")
                                                 .iterdir())

    @settings(max_examples=10, deadline=None)
    @given(st.tuples(st.integers(2, 5), st.integers(1, 4), st.integers(1, 2), st.booleans(),
                     st.integers(3, 6)))
    def test_epoch_rules_on_a_step_grid(self, tmp_path_factory: pytest.TempPathFactory,
                                        case: tuple[int, int, int, bool, int]) -> None:
        """D17: a saver on a step grid (and maybe at each epoch_end) with
        ``every = "k epochs"`` leaves the files planned_files lists, and keeps the save
        that ends epoch k, 2k... (the last at or before each boundary), not the first
        after it."""
        per_epoch, grid, k, at_end, epochs = case
        run_dir = tmp_path_factory.mktemp("run")
        trigger = every(f"{grid} steps") | on("epoch_end") if at_end else every(f"{grid} steps")
        keep = {"any": [{"latest": 1}, {"every": f"{k} epochs"}]}
        model, opt = tiny_model()
        Trainer(model, opt, UnevenData([per_epoch] * epochs), torch.nn.functional.mse_loss,
                schedule=Schedule({"save": trigger}), bindings={"save": ModelSaver(keep)},
                max_epochs=epochs, run_dir=run_dir).fit()
        files = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
        log = simulate(Schedule({"save": trigger}), epochs=epochs, steps_per_epoch=per_epoch)
        assert files == list(planned_files(log, {"save": parse_keep(keep)})[-1].files)
        steps = sorted({f.step for f in log})
        for m in range(k, epochs, k):  # each boundary a later save is past
            before = [s for s in steps if s <= m * per_epoch]
            if before:
                assert f"step-{before[-1]:08d}.pt" in files

    def test_async_saves_leave_the_planned_files(self, tmp_path: Path) -> None:
        """With background saves (each pruned once it lands), the run ends with the
        planned files."""
        keep = {"any": [{"latest": 2}, {"every": "3 steps"}, {"best": 1, "monitor": "val/loss"}]}
        values = [0.5, 0.1, 0.9, 0.8, 0.7, 0.6, 0.4, 0.3]
        _run(tmp_path, keep, values, 8, mode="async")
        log = simulate(Schedule({"save": every("1 step")}), epochs=1, steps_per_epoch=8)
        planned = planned_files(log, {"save": parse_keep(keep)},
                                lambda f: {"val/loss": values[f.step - 1]})
        assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == \
            list(planned[-1].files) == ["step-00000002.pt", "step-00000003.pt",
                                        "step-00000006.pt", "step-00000007.pt",
                                        "step-00000008.pt"]

    def test_resume_keeps_the_same_files(self, tmp_path: Path) -> None:
        """Stopped at step 3 and resumed, the run keeps the files of an unbroken one."""
        keep = {"any": [{"latest": 1}, {"best": 1, "monitor": "val/loss"}, {"every": "4 steps"}]}
        values = [0.5, 0.1, 0.9, 0.8, 0.7, 0.6]
        whole = tmp_path / "whole"
        _run(whole, keep, values, 6)
        part = tmp_path / "part"
        _run(part, keep, values, 6, max_steps=3)
        _run(part, keep, values, 6, resume=part / "checkpoints" / "step-00000003.pt")
        names = sorted(p.name for p in (part / "checkpoints").iterdir())
        assert names == sorted(p.name for p in (whole / "checkpoints").iterdir())
        assert names == ["step-00000002.pt", "step-00000004.pt", "step-00000006.pt"]


class TestPlanCommand:
    """schedtrain plan lists the files after each save, the peak and the disk."""

    SPEC = ('[clock]\nepochs = 3\nsteps_per_epoch = 100\n[callbacks.save]\n'
            'type = "ModelSaver"\ntrigger = { every = "25 steps" }\n'
            'keep = { any = [{ latest = 2 }, { every = "100 steps" }, '
            '{ best = 1, monitor = "val/loss" }] }\n')

    def _plan(self, tmp_path: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> str:
        spec = tmp_path / "s.toml"
        spec.write_text(self.SPEC)
        assert main(["plan", str(spec), *extra]) == 0
        return capsys.readouterr().out

    def test_table_gives_the_peak_and_disk(self, tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
        """Two latest, one per 100 steps and the best: 4 files at most, 16 GB at 4 GB."""
        out = self._plan(tmp_path, capsys, "--checkpoint-size", "4GB")
        assert "checkpoint files: at most 4 at once (step 250), 16 GB at 4 GB each" in out
        assert ("(the last): step-00000100.pt, step-00000200.pt, step-00000275.pt, "
                "step-00000300.pt") in out
        assert "best rules may keep up to 1 more" in out

    def test_json_places_the_best_from_a_metric_stream(
            self, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
        """With --metrics the best save (step 50, the lowest loss) stays to the end."""
        stream = tmp_path / "m.jsonl"
        stream.write_text("".join(
            f'{{"name": "val/loss", "value": {1.0 if s != 50 else 0.1}, "step": {s}}}\n'
            for s in range(25, 301, 25)))
        data = json.loads(self._plan(tmp_path, capsys, "--format", "json", "--metrics",
                                     str(stream), "--checkpoint-size", "1 MB"))
        files = data["checkpoints"]
        assert files["after_saves"][-1]["files"] == [
            "step-00000050.pt", "step-00000100.pt", "step-00000200.pt", "step-00000275.pt",
            "step-00000300.pt"]
        assert (files["peak_files"], files["peak_bytes"], files["best_slots"]) == \
            (5, 5 * 10**6, 0)

    def test_import_measures_the_size_from_the_task(
            self, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
        """plan --import takes one checkpoint's size from the task's model and optimizer."""
        monkeypatch.chdir(Path(__file__).parents[2])  # the task module is examples/digits.py
        assert main(["plan", "specs/digits.toml", "--import", "--format", "json"]) == 0
        files = json.loads(capsys.readouterr().out)["checkpoints"]
        task = load_task(load_spec("specs/digits.toml"), "examples.digits:make_task")
        size = estimate_checkpoint_bytes(task.model, task.optimizer)
        assert files["checkpoint_bytes"] == size
        # keep = 2, and the MaxSaver's one best file
        assert files["peak_bytes"] == files["peak_files"] * size == 3 * size

    def test_png_title_gives_the_peak(self, tmp_path: Path) -> None:
        """The png timeline's title says how many checkpoint files exist at most."""
        pytest.importorskip("matplotlib")
        spec = tmp_path / "s.toml"
        spec.write_text(self.SPEC)
        fig = draw_png(plan_spec(load_spec(str(spec))))
        assert "checkpoint files: at most 4 at once (step 250)" in fig.axes[0].get_title()

    def test_png_draws_the_files_after_each_save(self, tmp_path: Path) -> None:
        """The png's green curve: after each save, the files all savers hold (the same
        numbers the table and json list), up to the peak."""
        pytest.importorskip("matplotlib")
        spec = tmp_path / "s.toml"
        spec.write_text(self.SPEC)
        plan = plan_spec(load_spec(str(spec)))
        fig = draw_png(plan)
        (curve,) = fig.axes[1].get_lines()
        held: dict[str, int] = {}
        expected = []
        for save in plan.files:
            held[save.callback] = len(save.files)
            expected.append((save.at.step, sum(held.values())))
        assert list(zip(curve.get_xdata(), curve.get_ydata(), strict=True)) == expected
        assert max(n for _, n in expected) == 4
