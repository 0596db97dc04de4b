"""What a new user meets on the first day: a run's failures, stops, seed, and
what ``check`` and ``train`` say before anything trains."""

from __future__ import annotations

import json
import re
import sys
import textwrap
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from schedtrain.cli import main
from tests.test_sink_cadence import Keep

TASK = '''
import torch
from torch.utils.data import DataLoader, TensorDataset

from schedtrain.callbacks import Callback
from schedtrain.training import Task


class Fragile(torch.nn.Linear):
    """Raises in its forward from the ``fail_at``-th call on."""

    fail_at = 0
    calls = 0

    def forward(self, x):
        type(self).calls += 1
        if self.fail_at and type(self).calls >= self.fail_at:
            raise RuntimeError("mat1 and mat2 shapes cannot be multiplied")
        return super().forward(x)


def make_task(fail_at: int = 0):
    g = torch.Generator().manual_seed(0)  # the data does not depend on the run's seed
    x = torch.randn(32, 4, generator=g)
    y = x.sum(1, keepdim=True)
    Fragile.fail_at, Fragile.calls = fail_at, 0
    model = Fragile(4, 1)  # random init, from the generator the run's seed seeded
    return Task(model, torch.optim.SGD(model.parameters(), lr=0.1),
                DataLoader(TensorDataset(x, y), batch_size=8, shuffle=True),
                DataLoader(TensorDataset(x, y), batch_size=16),
                loss_fn=torch.nn.functional.mse_loss)


def failing_task():
    return make_task(fail_at=3)


class Boom(Callback):
    def _trigger(self):
        raise ValueError("bad value\\nsecond line")
'''


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A project directory with a task module (``firstday_task``) and a ``specs/`` folder."""
    name = f"firstday_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(TASK)
    (tmp_path / "specs").mkdir()
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "module_name").write_text(name)
    return tmp_path


def spec(project: Path, body: str, task: str = "make_task", name: str = "s.toml") -> str:
    """Write ``specs/NAME`` with a ``[run]`` table using the project's task."""
    module = (project / "module_name").read_text()
    path = project / "specs" / name
    text = textwrap.dedent(body).replace("MODULE", module)
    if "[run]" not in text:
        text = f'[run]\ntask = "{module}:{task}"\nmax_epochs = 3\ndevice = "cpu"\n' + text
    path.write_text(text)
    return str(path)


class TestFailures:
    """An exception in user code exits 1 with one line saying where; the traceback is
    saved in the run directory and run.json says failed."""

    def _check_failed(self, run_dir: Path, err: str, expected: str) -> None:
        lines = err.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in err, err
        assert expected in lines[0]
        assert lines[0].endswith(f"; traceback in {Path(run_dir.name, 'traceback.txt')}")
        saved = (run_dir / "traceback.txt").read_text()
        assert saved.startswith("Traceback") and expected.partition(" raised ")[0] in saved
        assert json.loads((run_dir / "run.json").read_text())["status"] == "failed"

    @pytest.mark.parametrize(("trigger", "place"), [
        ('{ every = "3 steps" }', "callback 'boom' at step_end (step 3, epoch 0)"),
        ('{ every = "2 epochs" }', "callback 'boom' at epoch_end (step 8, epoch 2)"),
        ('{ on = "train_start" }', "callback 'boom' at train_start (step 0, epoch 0)"),
        ('{ on = "train_end" }', "callback 'boom' at train_end (step 12, epoch 3)"),
    ])
    def test_callback_raises(self, project: Path, capsys: pytest.CaptureFixture[str],
                             trigger: str, place: str) -> None:
        """The callback, the event and the clock are named; only the first line of the
        exception's message is shown."""
        path = spec(project, f"""
            [callbacks.boom]
            type = "MODULE:Boom"
            trigger = {trigger}
            """)
        assert main(["train", path, "--run-dir", "out"]) == 1
        self._check_failed(project / "out", capsys.readouterr().err,
                           f"{place} raised ValueError: bad value ...")

    def test_forward_raises(self, project: Path, capsys: pytest.CaptureFixture[str]) -> None:
        """The model's forward raising names the training step it happened in."""
        path = spec(project, """
            [callbacks.nan]
            type = "TerminateOnNaN"
            trigger = { every = "1 step" }
            """, task="failing_task")
        assert main(["train", path, "--run-dir", "out"]) == 1
        self._check_failed(project / "out", capsys.readouterr().err,
                           "the training step after step 2 (epoch 0) raised RuntimeError: "
                           "mat1 and mat2 shapes cannot be multiplied")


class TestSeed:
    """``[run] seed`` seeds before the task builds its model: one seed, one run."""

    def _run(self, project: Path, seed: int, run_dir: str) -> tuple[dict, dict]:
        import copy

        import torch

        from schedtrain.spec import load_spec
        from schedtrain.training import Task, train_from_spec

        module = __import__((project / "module_name").read_text())
        built: list[Task] = []
        original = module.make_task

        def recording() -> Task:
            task = original()
            built.append(copy.deepcopy(task.model.state_dict()))
            return task

        module.recording = recording
        path = spec(project, f"""
            [run]
            task = "MODULE:recording"
            max_epochs = 2
            device = "cpu"
            seed = {seed}
            [callbacks.validate]
            type = "InferenceRunner"
            trigger = {{ every = "1 epoch" }}
            """, name=f"{run_dir}.toml")
        trainer = train_from_spec(load_spec(path), run_dir, None)
        final = {k: v.clone() for k, v in trainer.model.state_dict().items()}
        assert all(isinstance(v, torch.Tensor) for v in final.values())
        return built[0], final

    def test_same_seed_same_run(self, project: Path) -> None:
        """Two runs with one seed have bit-identical initial and final weights; another
        seed gives other initial weights."""
        import torch

        init_a, final_a = self._run(project, 5, "a")
        init_b, final_b = self._run(project, 5, "b")
        init_c, _ = self._run(project, 6, "c")
        for k in init_a:
            assert torch.equal(init_a[k], init_b[k]) and torch.equal(final_a[k], final_b[k])
            assert not torch.equal(init_a[k], final_a[k])  # it trained
        assert any(not torch.equal(init_a[k], init_c[k]) for k in init_a)


PRODUCER = '''

class Producer(Callback):
    produces = ("my/score",)

    def _trigger(self):
        self.metrics.put("my/score", 1.0)
'''

VALIDATE = """
    [callbacks.validate]
    type = "InferenceRunner"
    trigger = { every = "1 epoch" }
"""


class TestMetricsNobodyProduces:
    """A metric read (trigger or ``monitor``) that nothing produces is reported by
    ``check`` and refused by ``train`` before training, with the names that exist."""

    @pytest.mark.parametrize(("wrong", "closest"), [
        ("val_loss", "val/loss"), ("val/acc", "val/accuracy"), ("train_loss", "train/loss"),
        ("val/err", "val/error")])
    def test_monitor(self, project: Path, capsys: pytest.CaptureFixture[str], wrong: str,
                     closest: str) -> None:
        """A saver's ``monitor``: exit 2 naming the key path; the produced names are listed,
        the closest first."""
        path = spec(project, VALIDATE + f"""
            [callbacks.best]
            type = "MinSaver"
            monitor = "{wrong}"
            trigger = {{ every = "1 epoch" }}
            """)
        assert main(["check", path]) == 2
        err = capsys.readouterr().err
        assert f"callbacks.best.monitor: metric {wrong!r} is never produced" in err
        listed = re.findall(r"'([^']+)'", err.partition("produced: ")[2])
        assert listed[0] == closest
        assert sorted(listed[:4]) == ["train/loss", "val/accuracy", "val/error", "val/loss"]
        assert main(["train", path, "--run-dir", "out"]) == 2
        assert f"metric {wrong!r} is never produced" in capsys.readouterr().err
        assert not (project / "out" / "events.jsonl").exists()  # refused before training

    def test_trigger_metric(self, project: Path, capsys: pytest.CaptureFixture[str]) -> None:
        """A trigger's metric (``plateau``, ``if``) is checked at its own key path."""
        path = spec(project, VALIDATE + """
            [callbacks.stop]
            type = "EarlyStopping"
            trigger = { all = [{ every = "1 epoch" }, { plateau = "val_loss", patience = 2 }] }
            [callbacks.save]
            type = "ModelSaver"
            trigger = { every = "1 epoch", if = "val/loss < 0.5" }
            """)
        assert main(["check", path]) == 2
        err = capsys.readouterr().err
        assert "callbacks.stop.trigger.all[1].plateau: metric 'val_loss' is never produced" in err
        assert "val/loss <" not in err  # a produced metric is fine

    def test_user_callback_may_produce(self, project: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
        """A user class may put the metric: ``check`` warns (exit 0); ``train`` knows
        what it produces and trains when it declares it."""
        with (project / f"{(project / 'module_name').read_text()}.py").open("a") as f:
            f.write(PRODUCER)
        path = spec(project, """
            [callbacks.score]
            type = "MODULE:Producer"
            trigger = { every = "1 epoch" }
            [callbacks.best]
            type = "MaxSaver"
            monitor = "my/score"
            trigger = { every = "1 epoch" }
            """)
        assert main(["check", path]) == 0
        err = capsys.readouterr().err
        assert "warning:" in err and "unless 'score' puts it" in err
        assert main(["train", path, "--run-dir", "out"]) == 0

    def test_early_stopping_needs_a_metric_part(self, project: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
        """EarlyStopping without ``patience`` on a plain clock trigger would stop at its
        first firing: refused; with ``patience`` it counts checks itself and is fine."""
        body = VALIDATE + """
            [callbacks.stop]
            type = "EarlyStopping"
            EXTRA
            trigger = { every = "1 epoch" }
            """
        assert main(["check", spec(project, body.replace("EXTRA", ""))]) == 2
        err = capsys.readouterr().err
        assert "callbacks.stop.trigger: EarlyStopping without `patience`" in err
        assert main(["check", spec(project, body.replace("EXTRA", "patience = 2"))]) == 0

    def test_check_import_finds_modules_as_train(self, project: Path, tmp_path_factory:
                                                 pytest.TempPathFactory,
                                                 monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
        """``check --import`` finds the task's package where ``train`` does (next to the
        spec's folder), from any working directory."""
        path = spec(project, """
            [callbacks.boom]
            type = "MODULE:Boom"
            trigger = { every = "1 epoch" }
            """)
        monkeypatch.setattr(sys, "path", [p for p in sys.path if p != str(project)])
        monkeypatch.chdir(tmp_path_factory.mktemp("elsewhere"))
        assert main(["check", "--import", path]) == 0, capsys.readouterr().err


STOPPER = '''

class Stopper(Callback):
    def _trigger(self):
        raise StopTraining("enough for today")
'''


class TestWhyItStopped:
    """``train`` prints one line saying why the run ended."""

    def _train(self, project: Path, body: str, capsys: pytest.CaptureFixture[str],
               **kw: str) -> str:
        assert main(["train", spec(project, body, **kw), "--run-dir", "out"]) == 0
        return capsys.readouterr().out.splitlines()[0]

    def test_plateau(self, project: Path, capsys: pytest.CaptureFixture[str]) -> None:
        """EarlyStopping on a plateau trigger names the metric and the patience."""
        line = self._train(project, VALIDATE + """
            [callbacks.stop]
            type = "EarlyStopping"
            trigger = { all = [{ every = "1 epoch" }, "flat"] }
            [triggers.flat]
            plateau = "val/loss"
            patience = 1
            min_delta = 100.0
            """, capsys)
        assert re.fullmatch(r"stopped by stop at epoch 2 \(step 8\): val/loss did not improve "
                            r"for 1 checks \(last [0-9.e+-]+\)", line), line

    def test_patience(self, project: Path, capsys: pytest.CaptureFixture[str]) -> None:
        """EarlyStopping counting its own checks says how many and the best value."""
        line = self._train(project, VALIDATE + """
            [callbacks.stop]
            type = "EarlyStopping"
            patience = 1
            min_delta = 100.0
            trigger = { every = "1 epoch" }
            """, capsys)
        assert re.fullmatch(r"stopped by stop at epoch 2 \(step 8\): val/loss did not improve "
                            r"for 1 checks \(best [0-9.e+-]+\)", line), line

    def test_stop_training_raised(self, project: Path,
                                  capsys: pytest.CaptureFixture[str]) -> None:
        """A callback raising StopTraining is named with the event and the clock."""
        with (project / f"{(project / 'module_name').read_text()}.py").open("a") as f:
            f.write("from schedtrain import StopTraining\n" + STOPPER)
        line = self._train(project, """
            [callbacks.enough]
            type = "MODULE:Stopper"
            trigger = { every = "6 steps" }
            """, capsys)
        assert line == ("stopped by callback 'enough' at step_end (step 6, epoch 1): "
                        "enough for today")

    @pytest.mark.parametrize(("limit", "expected"), [
        ("max_epochs = 2", "finished: reached max_epochs = 2 at step 8"),
        ("max_steps = 6", "finished: reached max_steps = 6 at epoch 1")])
    def test_limits(self, project: Path, capsys: pytest.CaptureFixture[str], limit: str,
                    expected: str) -> None:
        """A run that reaches its limit says which."""
        module = (project / "module_name").read_text()
        line = self._train(project, f"""
            [run]
            task = "{module}:make_task"
            device = "cpu"
            {limit}
            [callbacks.nan]
            type = "TerminateOnNaN"
            trigger = {{ every = "1 epoch" }}
            """, capsys)
        assert line == expected


class TestSinks:
    """``[run] sinks`` chooses where scalars go, ``sink_every`` how often."""

    def test_bad_sinks_are_listed_with_key_paths(self) -> None:
        """Every problem of sinks and sink_every is reported at its key path."""
        from schedtrain import SpecError
        from schedtrain.spec import loads_spec

        with pytest.raises(SpecError) as info:
            loads_spec("""
                [run]
                sinks = ["jsonl", "consol", "jsonl"]
                sink_every = { jsonl = "1 epoch", tensorboard = "2 epochs", console = "30 s" }
                [callbacks.a]
                trigger = { every = "1 epoch" }
                """.replace("\n                ", "\n"))
        found = {p.path: p.message for p in info.value.problems}
        assert "did you mean 'console'" in found["run.sinks[1]"]
        assert "listed twice" in found["run.sinks[2]"]
        assert "events.jsonl keeps every value" in found["run.sink_every.jsonl"]
        assert "not in run.sinks" in found["run.sink_every.tensorboard"]
        assert "steps or epochs" in found["run.sink_every.console"]

    @pytest.mark.parametrize("period", ["0 steps", "1.5 epochs", "100 tokens", "soon"])
    def test_bad_periods(self, period: str) -> None:
        """A cadence is a whole number >= 1 of steps or epochs."""
        from schedtrain.spec.document import sink_period_problem

        assert sink_period_problem(period) is not None
        assert sink_period_problem("3 steps") is None

    def test_console_every_two_epochs(self, project: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
        """The console prints one report every second epoch; without "jsonl" no
        events.jsonl is written."""
        module = (project / "module_name").read_text()
        path = spec(project, f"""
            [run]
            task = "{module}:make_task"
            device = "cpu"
            max_epochs = 5
            sinks = ["console"]
            sink_every = {{ console = "2 epochs" }}
            """ + VALIDATE)
        assert main(["train", path, "--run-dir", "out"]) == 0
        printed = [x for x in capsys.readouterr().out.splitlines() if x.startswith("epoch ")]
        assert [x.split()[:4] for x in printed] == [["epoch", "2", "step", "8"],
                                                    ["epoch", "4", "step", "16"]]
        assert all("val/loss=" in x for x in printed)
        assert not (project / "out" / "events.jsonl").exists()

    @given(st.lists(st.integers(0, 50), min_size=1, max_size=40), st.integers(1, 7),
           st.integers(1, 5))
    def test_every_passes_one_report_per_period(self, deltas: list[int], k: int,
                                                chunk: int) -> None:
        """Of reports at non-decreasing steps, however they are flushed, exactly the first
        report (step) of each period that has one goes through, with all its values."""
        from schedtrain.monitors.cadence import Every
        from schedtrain.monitors.store import Record

        steps = [sum(deltas[: i + 1]) for i in range(len(deltas))]
        records = [Record(n, float(s), s, 0, 0.0) for s in steps for n in ("a", "b")]
        keep = Keep()
        sink = Every(keep, f"{k} steps")
        for i in range(0, len(records), chunk):
            sink.scalars(records[i:i + chunk])
        expected, last = [], 0
        for s in dict.fromkeys(steps):
            if s // k != last // k:
                expected.append(s)
                last = s
        # Every value of an accepted report goes, also when it comes in a later flush.
        assert keep.got == [r for r in records if r.step in expected]


class TestClockFromRun:
    """Without ``[clock]``, ``plan`` and ``check`` take the run's shape from ``[run]`` and
    (with ``--import``) the task's data; a ``[clock]`` that disagrees is a warning."""

    EACH_EPOCH = """
        [callbacks.validate]
        type = "InferenceRunner"
        trigger = { every = "1 epoch" }
        [callbacks.often]
        type = "ModelSaver"
        trigger = { every = "5 steps" }
        [callbacks.last]
        type = "TerminateOnNaN"
        trigger = { on = "train_end" }
        """

    def _plan(self, path: str, capsys: pytest.CaptureFixture[str], *extra: str) -> list[dict]:
        assert main(["plan", path, "--format", "json", *extra]) == 0
        return json.loads(capsys.readouterr().out)["firings"]

    @pytest.mark.parametrize(("limits", "end"), [
        ("max_epochs = 3", (3, 12)), ("max_steps = 10", (2, 10)),
        ("max_epochs = 5\nmax_steps = 14", (3, 14)), ("max_epochs = 2\ngrad_accum = 3", (2, 4))])
    def test_plan_counts_the_task(self, project: Path, capsys: pytest.CaptureFixture[str],
                                  limits: str, end: tuple[int, int]) -> None:
        """The plan is the run train trains: 32 samples in batches of 8 are 4 batches per
        epoch (grad_accum = 3: 2 steps), as long as [run] says; the epoch ends and the
        periodic firings match the simulated shape."""
        module = (project / "module_name").read_text()
        path = spec(project, f'[run]\ntask = "{module}:make_task"\ndevice = "cpu"\n{limits}\n'
                    + textwrap.dedent(self.EACH_EPOCH))
        assert main(["plan", path]) == 2
        assert "--import to count the steps per epoch" in capsys.readouterr().err
        firings = self._plan(path, capsys, "--import")
        per_epoch = 2 if "grad_accum" in limits else 4
        ends = [(f["epoch"], f["step"]) for f in firings if f["callback"] == "validate"]
        assert ends == [(e, e * per_epoch) for e in range(1, len(ends) + 1)]
        assert [f["step"] for f in firings if f["callback"] == "last"] == [end[1]]
        assert len(ends) == end[0]
        assert [f["step"] for f in firings if f["callback"] == "often"] == list(
            range(5, end[1] + 1, 5))

    def test_disagreeing_clock_warns(self, project: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
        """A [clock] that disagrees with [run] or the data is a warning naming both
        values; the plan uses [clock] as written."""
        path = spec(project, """
            [clock]
            epochs = 10
            steps_per_epoch = 5
            """ + self.EACH_EPOCH)
        assert main(["check", "--import", path]) == 0
        err = capsys.readouterr().err
        assert "clock.epochs: [clock] epochs = 10 but [run] max_epochs = 3" in err
        assert ("clock.steps_per_epoch: [clock] steps_per_epoch = 5 but the task's data "
                "makes 4") in err
        firings = self._plan(path, capsys, "--import")
        assert max(f["step"] for f in firings) == 50


class TestBatchContract:
    """What docs/training.md says batches are: counted samples and tokens, moved tensors."""

    @given(st.integers(1, 6), st.integers(1, 9), st.data())
    def test_dict_batches_count_tokens(self, size: int, length: int, data: st.DataObject) -> None:
        """A dict batch counts its first tensor's rows as samples; tokens are its
        ``num_tokens`` (int or one-element tensor), else the element count of ``tokens``."""
        import torch

        from schedtrain.training.batches import count_batch

        ids = torch.zeros(size, length, dtype=torch.long)
        mask = torch.tensor(data.draw(st.lists(st.lists(st.integers(0, 1), min_size=length,
                                                        max_size=length),
                                               min_size=size, max_size=size)))
        real = int(mask.sum())
        assert count_batch({"input_ids": ids, "attention_mask": mask,
                            "num_tokens": mask.sum()}) == (size, real)
        assert count_batch({"input_ids": ids, "num_tokens": real}) == (size, real)
        assert count_batch({"tokens": ids, "labels": ids}) == (size, size * length)
        assert count_batch({"input_ids": ids, "num_samples": 1}) == (1, 0)
        assert count_batch((ids, ids[:, 0])) == (size, 0)

    def test_loop_adds_what_batches_report(self) -> None:
        """Training on dict batches with a step function, under accumulation, the clock's
        samples and tokens are the sums the batches report."""
        import torch

        from schedtrain.training import Trainer

        g = torch.Generator().manual_seed(0)
        batches = []
        for size in (3, 5, 2, 4, 1):
            mask = (torch.rand(size, 6, generator=g) > 0.3).long()
            batches.append({"input_ids": torch.randint(0, 9, (size, 6), generator=g),
                            "attention_mask": mask, "num_tokens": mask.sum()})
        model = torch.nn.Embedding(9, 1)

        def step_fn(m: torch.nn.Module, batch: dict) -> torch.Tensor:
            out = m(batch["input_ids"]).squeeze(-1)
            return (out * batch["attention_mask"]).pow(2).mean()

        t = Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), batches, step_fn=step_fn,
                    callbacks=[], max_epochs=2, grad_accum=2, handle_signals=False)
        t.fit()
        assert (t.clock.step, t.clock.batch) == (6, 10)  # 3 steps per epoch (2 + 2 + 1)
        assert t.clock.sample == 2 * sum(len(b["input_ids"]) for b in batches)
        assert t.clock.token == 2 * sum(int(b["attention_mask"].sum()) for b in batches)

    def test_to_device_moves_every_tensor(self) -> None:
        """Tensors anywhere in tuples, named tuples, lists and mappings are moved; the
        containers keep their types, other values stay as they are."""
        import collections

        import torch

        from schedtrain.training.batches import to_device

        pair = collections.namedtuple("pair", "x y")
        batch = {"a": (torch.ones(2), [torch.zeros(1), "text", 3]),
                 "b": pair(torch.ones(1), {"c": torch.ones(3)}),
                 "d": collections.defaultdict(list, e=torch.ones(1))}
        moved = to_device(batch, torch.device("meta"))
        assert moved["a"][0].is_meta and moved["a"][1][0].is_meta
        assert moved["a"][1][1:] == ["text", 3] and isinstance(moved["a"], tuple)
        assert isinstance(moved["b"], pair) and moved["b"].y["c"].is_meta
        assert moved["d"]["e"].is_meta
        assert not batch["a"][0].is_meta  # the original is left alone


def test_train_prints_schedule_warnings_as_lines(project: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """A schedule warning during ``train`` is one ``warning: SPEC: ...`` line, not a
    Python warning pointing into the library."""
    path = spec(project, """
        [callbacks.save]
        type = "ModelSaver"
        trigger = { any = [{ every = "1 epoch" }, "never"] }
        [triggers.never]
        all = [{ every = "2 steps" }, { on = "train_start" }]
        """)
    assert main(["train", path, "--run-dir", "out"]) == 0
    err = capsys.readouterr().err
    warned = [x for x in err.splitlines() if x.startswith("warning: ")]
    assert warned and all(x.startswith(f"warning: {path}: ") for x in warned), err
    assert "schedtrain/" not in err and "Warning:" not in err
