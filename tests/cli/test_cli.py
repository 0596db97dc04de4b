"""The ``schedtrain`` command line: check, plan, train; exit codes; no tracebacks."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from schedtrain.cli import main
from schedtrain.spec import load_spec
from schedtrain.spec.registry import BUILTINS, check_arguments, is_known, resolve

ROOT = Path(__file__).resolve().parents[2]
SPECS = ROOT / "specs"
RESNET = str(SPECS / "resnet_tensorpack.toml")


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    """Run ``python -m schedtrain`` for real."""
    return subprocess.run([sys.executable, "-m", "schedtrain", *args], capture_output=True,
                          text=True, check=False, cwd=ROOT)


def write(tmp_path: Path, text: str, name: str = "s.toml") -> str:
    """Write a spec file and return its path."""
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return str(path)


class TestEntryPoint:
    """``python -m schedtrain`` through a real subprocess."""

    def test_check_ok(self) -> None:
        """A good spec checks with exit 0 and a summary line."""
        result = run_cli("check", RESNET)
        assert result.returncode == 0
        assert "ok: 4 callbacks" in result.stdout

    def test_bad_spec_exits_2_without_traceback(self) -> None:
        """A bad spec exits 2 with its errors and no traceback."""
        result = run_cli("check", str(ROOT / "tests/bad_specs/cyclic_reference.toml"))
        assert result.returncode == 2
        assert "cyclic trigger reference" in result.stderr
        assert "Traceback" not in result.stderr

    def test_bad_arguments_exit_2_cleanly(self) -> None:
        """argparse errors exit 2 with usage and no traceback."""
        result = run_cli("plan", RESNET, "--format", "svg")
        assert result.returncode == 2
        assert "invalid choice: 'svg'" in result.stderr
        assert "Traceback" not in result.stderr

    def test_plan_json(self) -> None:
        """``plan --format json`` prints one JSON object of firings, and of the checkpoint
        files when a ModelSaver saves."""
        result = run_cli("plan", RESNET, "--format", "json")
        assert result.returncode == 0
        data = json.loads(result.stdout)
        assert list(data) == ["firings", "checkpoints"]  # the spec has a ModelSaver
        assert data["checkpoints"]["after_saves"][0]["files"]


class TestHelp:
    """``--help`` for every command."""

    @pytest.mark.parametrize("command", [[], ["check"], ["plan"], ["train"]])
    def test_help_has_usage_and_exits_0(self, command: list[str],
                                        capsys: pytest.CaptureFixture[str]) -> None:
        """Each command's help exits 0; commands show an example."""
        assert main([*command, "--help"]) == 0
        out = capsys.readouterr().out
        assert out.startswith("usage: schedtrain")
        if command:
            assert "examples:" in out

    def test_no_command(self, capsys: pytest.CaptureFixture[str]) -> None:
        """No command is a usage error (exit 2)."""
        assert main([]) == 2
        assert "required" in capsys.readouterr().err


class TestCheck:
    """``schedtrain check``."""

    def test_all_shipped_specs_pass(self, capsys: pytest.CaptureFixture[str]) -> None:
        """Every spec in specs/ checks, one summary line per file."""
        paths = sorted(str(p) for p in SPECS.glob("*.toml"))
        assert main(["check", *paths]) == 0
        assert len(capsys.readouterr().out.splitlines()) == len(paths)

    def test_summary_counts(self, capsys: pytest.CaptureFixture[str]) -> None:
        """The summary counts callbacks, named triggers, events and warnings."""
        assert main(["check", str(SPECS / "early_stopping.toml")]) == 0
        assert capsys.readouterr().out.strip().endswith(
            "ok: 4 callbacks, 1 named trigger, 0 custom events, 0 warnings")

    def test_lists_every_error(self, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
        """All problems of a file are printed, each with file and key path."""
        path = write(tmp_path, """
            [callbacks.a]
            trigger = { every = "1 stepz" }
            [callbacks.b]
            type = "ModelSavr"
            trigger = { on = "train_end" }
        """)
        assert main(["check", path]) == 2
        err = capsys.readouterr().err
        assert f"error: {path}: callbacks.a.trigger.every: " in err
        assert f"error: {path}: callbacks.b.type: " in err
        assert "2 problems" in err

    def test_one_bad_file_fails_the_run(self, tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
        """Good files are still summarised when another fails; the exit is 2."""
        bad = write(tmp_path, "[callbacks.a]\ntrigger = 3\n")
        assert main(["check", RESNET, bad]) == 2
        assert "ok:" in capsys.readouterr().out

    def test_missing_file(self, capsys: pytest.CaptureFixture[str]) -> None:
        """A missing file is bad input, exit 2, no traceback."""
        assert main(["check", "nope.toml"]) == 2
        err = capsys.readouterr().err
        assert "nope.toml: cannot read the spec" in err
        assert "Traceback" not in err

    def test_import_resolves_classes(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                     capsys: pytest.CaptureFixture[str]) -> None:
        """``--import`` imports module:Class types and checks their arguments."""
        _user_module(tmp_path, monkeypatch)
        path = write(tmp_path, """
            [callbacks.a]
            type = "my_callbacks:Saver"
            keep = 2
            trigger = { every = "1 epoch" }
        """)
        assert main(["check", path, "--import"]) == 0
        assert main(["check", path]) == 0

    def test_import_reports_bad_arguments(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                          capsys: pytest.CaptureFixture[str]) -> None:
        """``--import`` reports unknown arguments with a suggestion, and missing ones."""
        _user_module(tmp_path, monkeypatch)
        path = write(tmp_path, """
            [callbacks.a]
            type = "my_callbacks:Needy"
            kep = 2
            trigger = { every = "1 epoch" }
        """)
        assert main(["check", path, "--import"]) == 2
        err = capsys.readouterr().err
        assert "callbacks.a.kep: unknown argument 'kep' for Needy (did you mean 'keep'?)" in err
        assert "callbacks.a: Needy needs the argument 'path'" in err

    def test_import_reports_missing_module(self, tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
        """An unimportable type is reported at its ``type`` key (only with ``--import``)."""
        path = write(tmp_path, """
            [callbacks.a]
            type = "no_such_pkg.mod:Thing"
            trigger = { every = "1 epoch" }
        """)
        assert main(["check", path]) == 0
        assert main(["check", path, "--import"]) == 2
        assert ("callbacks.a.type: cannot import 'no_such_pkg.mod:Thing': no module named "
                "'no_such_pkg'; looked in " in capsys.readouterr().err)


def _user_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A small user callback module on sys.path."""
    (tmp_path / "my_callbacks.py").write_text(textwrap.dedent("""
        from schedtrain.callbacks import Callback

        class Saver(Callback):
            def __init__(self, keep=3, trigger=None):
                self.keep = keep

        class Needy(Callback):
            def __init__(self, path, keep=1, *, name=None):
                self.path = path

        def not_a_class():
            pass
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("my_callbacks", None)


class TestPlan:
    """``schedtrain plan``."""

    def test_table(self, capsys: pytest.CaptureFixture[str]) -> None:
        """The table shows each callback's trigger, count and first firings."""
        assert main(["plan", RESNET]) == 0
        out = capsys.readouterr().out
        assert "100 epochs x 5,000 steps = 500,000 steps" in out
        lr = next(line for line in out.splitlines() if line.startswith("lr "))
        assert "at('30 epochs', '60 epochs', '85 epochs', '95 epochs')" in lr
        assert lr.split()[-8:] == ["4", "epoch", "30,", "epoch", "60,", "epoch", "85,",
                                   "epoch", "95"][-8:]
        saver = next(line for line in out.splitlines() if line.startswith("MinSaver "))
        assert "100 (100?)" in saver
        assert "evaluated at every step: none" in out

    def test_timeline(self, capsys: pytest.CaptureFixture[str]) -> None:
        """The timeline has one lane per callback and an epoch ruler, 64 columns wide."""
        assert main(["plan", RESNET]) == 0
        lines = capsys.readouterr().out.splitlines()
        start = next(i for i, line in enumerate(lines) if line.startswith("timeline:"))
        ruler, *lanes = lines[start + 1:start + 6]
        assert ruler.split()[0] == "epochs"
        assert len(ruler.split()[1]) == 64
        lr = next(lane for lane in lanes if lane.split()[0] == "lr")
        assert lr.count("|") == 4

    def test_always_evaluated_is_reported(self, tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
        """A callback without a clock part is listed as evaluated at every step."""
        path = write(tmp_path, """
            [clock]
            epochs = 2
            steps_per_epoch = 10
            [callbacks.watch]
            trigger = { improved = "val/loss" }
            [callbacks.tick]
            trigger = { every = "5 steps" }
        """)
        assert main(["plan", path]) == 0
        assert "evaluated at every step: watch" in capsys.readouterr().out

    @pytest.mark.parametrize(("run", "says"), [
        ("", "checkpoint_mode = 'async'"),
        ('checkpoint_mode = "sync"', "the loop waits for each file"),
        ('checkpoint_busy = "skip"', "in flight is skipped (checkpoint_busy = 'skip')"),
        ("", "in flight waits for it (checkpoint_busy = 'wait')"),
        ("", "busy at most 0.25 of the time on the CPU, flat out on a device"),
        ("checkpoint_write_share = 0.5", "writes, busy at most 0.5 of the time)"),
    ])
    def test_says_how_saves_are_written(self, tmp_path: Path, run: str, says: str,
                                        capsys: pytest.CaptureFixture[str]) -> None:
        """The table has a line on saves: the mode and the rule for a save while one is
        in flight."""
        path = write(tmp_path, f"""
            [run]
            max_epochs = 1
            {run}
            [clock]
            epochs = 1
            steps_per_epoch = 10
            [callbacks.tick]
            type = "ModelSaver"
            trigger = {{ every = "5 steps" }}
        """)
        assert main(["plan", path]) == 0
        line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("saves:"))
        assert says in line

    def test_a_bad_busy_rule_is_refused_with_its_key_path(
            self, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
        """check names run.checkpoint_busy and what it may be."""
        path = write(tmp_path, """
            [run]
            max_epochs = 1
            checkpoint_busy = "drop"
            [callbacks.tick]
            trigger = { every = "5 steps" }
        """)
        assert main(["check", path]) == 2
        err = capsys.readouterr().err
        assert "run.checkpoint_busy" in err
        assert "'wait' or 'skip'" in err

    def test_json_marks_conditional_firings(self, capsys: pytest.CaptureFixture[str]) -> None:
        """JSON firings carry the clock counters; metric-dependent ones are conditional."""
        assert main(["plan", str(SPECS / "early_stopping.toml"), "--format", "json"]) == 0
        firings = json.loads(capsys.readouterr().out)["firings"]
        best = [f for f in firings if f["callback"] == "best"]
        assert len(best) == 50
        assert all(f["conditional"] for f in best)
        assert best[0] == {"callback": "best", "event": "epoch_end", "step": 400, "batch": 400,
                           "epoch": 1, "step_in_epoch": 400, "sample": 0, "token": 0,
                           "seconds": 0.0, "conditional": True}
        assert not any("conditional" in f for f in firings if f["callback"] == "validate")

    def test_metrics_resolve_conditions(self, tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
        """``--metrics`` decides metric triggers: best saves on improvement, stop on plateau
        (and the run ends there: nothing after epoch 8)."""
        values = [1.0, 0.8, 0.7] + [0.7] * 5 + [0.6] * 42
        lines = [json.dumps({"name": "val/loss", "value": v, "epoch": e})
                 for e, v in enumerate(values, 1)]
        metrics = tmp_path / "m.jsonl"
        metrics.write_text("\n".join(lines) + "\n")
        assert main(["plan", str(SPECS / "early_stopping.toml"), "--format", "json",
                     "--metrics", str(metrics)]) == 0
        firings = json.loads(capsys.readouterr().out)["firings"]
        best = [f["epoch"] for f in firings if f["callback"] == "best"]
        stop = [f["epoch"] for f in firings if f["callback"] == "stop"]
        assert best == [1, 2, 3]
        assert stop == [8]
        assert max(f["epoch"] for f in firings) == 8
        assert not any(f.get("conditional") for f in firings)

    def test_metrics_accepts_training_events(self, tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
        """A run's events.jsonl works: scalar lines are read, other kinds skipped."""
        events = tmp_path / "events.jsonl"
        events.write_text("\n".join([
            json.dumps({"kind": "run_start", "time": 0}),
            json.dumps({"kind": "scalar", "name": "val/error", "value": 0.5, "step": 5000,
                        "epoch": 1, "wall": 12.5}),
            json.dumps({"kind": "scalar", "name": "val/error", "value": 0.6, "step": 10000,
                        "epoch": 2}),
        ]) + "\n")
        assert main(["plan", RESNET, "--epochs", "3", "--format", "json",
                     "--metrics", str(events)]) == 0
        firings = json.loads(capsys.readouterr().out)["firings"]
        assert [f["epoch"] for f in firings if f["callback"] == "MinSaver"] == [1]

    def test_bad_metrics_line(self, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
        """A malformed metrics line is bad input naming the file and line."""
        metrics = tmp_path / "m.jsonl"
        metrics.write_text('{"name": "x", "value": 1, "step": 3}\n{"name": "x"\n')
        assert main(["plan", RESNET, "--metrics", str(metrics)]) == 2
        err = capsys.readouterr().err
        assert f"{metrics}:2: invalid JSON" in err
        assert "Traceback" not in err

    def test_overrides_win_over_clock(self, capsys: pytest.CaptureFixture[str]) -> None:
        """``--epochs`` and ``--steps-per-epoch`` replace the ``[clock]`` values."""
        assert main(["plan", RESNET, "--epochs", "40", "--steps-per-epoch", "10",
                     "--format", "json"]) == 0
        firings = json.loads(capsys.readouterr().out)["firings"]
        lr = [f for f in firings if f["callback"] == "lr"]
        assert [(f["epoch"], f["step"]) for f in lr] == [(30, 300)]

    def test_no_run_length_is_bad_input(self, tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
        """Without [clock] or overrides, plan explains what it needs (exit 2)."""
        path = write(tmp_path, '[callbacks.a]\ntrigger = { every = "1 epoch" }\n')
        assert main(["plan", path, "--epochs", "3"]) == 2
        assert "set steps_per_epoch in [clock] or pass --steps-per-epoch" in (
            capsys.readouterr().err)

    def test_out_writes_a_file(self, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
        """``--out`` writes the output to a file instead of stdout."""
        out = tmp_path / "plan.json"
        assert main(["plan", RESNET, "--format", "json", "--out", str(out)]) == 0
        assert capsys.readouterr().out == ""
        assert len(json.loads(out.read_text())["firings"]) == 304

    def test_png(self, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
        """``--format png`` draws a PNG timeline."""
        pytest.importorskip("matplotlib")
        out = tmp_path / "p.png"
        assert main(["plan", RESNET, "--format", "png", "--out", str(out)]) == 0
        assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    def test_png_shows_lifecycle_firings(self, tmp_path: Path) -> None:
        """``train_start`` (step 0) and ``train_end`` firings are plotted inside the axes,
        on their callback's lane, not hidden on the frame."""
        pytest.importorskip("matplotlib")
        from schedtrain.planning import plan_spec
        from schedtrain.planning import render as plan_render

        path = write(tmp_path, """
            [clock]
            epochs = 3
            steps_per_epoch = 7
            [callbacks.setup]
            trigger = { on = "train_start" }
            [callbacks.both]
            trigger = { any = [{ on = "train_start" }, { on = "train_end" }, "pair"] }
            [triggers.pair]
            every = "2 steps"
            """)
        plan = plan_spec(load_spec(path))
        fig = plan_render.draw_png(plan)
        ax = fig.axes[0]
        lo, hi = ax.get_xlim()
        lanes = {t.get_text(): t.get_position()[1] for t in ax.get_yticklabels()}
        plotted: dict[float, set[float]] = {}
        for line in ax.get_lines():
            if line.get_marker() in ("None", "", None):  # grey epoch lines, in axes units
                continue
            for x, y in zip(line.get_xdata(), line.get_ydata(), strict=True):
                plotted.setdefault(float(y), set()).add(float(x))
        expected = {name: {float(f.step) for f in plan.log.of(name)
                           if f.event in ("train_start", "train_end")}
                    for name in ("setup", "both")}
        assert expected["setup"] == {0.0}
        for name, steps in expected.items():
            assert steps <= plotted[lanes[name]]
            assert all(lo < s < hi for s in steps)

    def test_png_without_matplotlib(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                    capsys: pytest.CaptureFixture[str]) -> None:
        """Without matplotlib, png exits 1 with the install hint."""
        monkeypatch.setitem(sys.modules, "matplotlib", None)
        assert main(["plan", RESNET, "--format", "png", "--out", str(tmp_path / "p.png")]) == 1
        assert "pip install 'schedtrain[plot]'" in capsys.readouterr().err

    def test_huge_run_is_fast(self, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
        """A 10^9-step plan with sparse firings finishes quickly (the simulation jumps)."""
        path = write(tmp_path, """
            [clock]
            epochs = 1000
            steps_per_epoch = 1_000_000
            [callbacks.ckpt]
            trigger = { every = "10M steps" }
            [callbacks.epochly]
            trigger = { every = "100 epochs", if = "val/loss < 1" }
        """)
        assert main(["plan", path]) == 0
        out = capsys.readouterr().out
        assert "1,000,000,000 steps" in out
        assert next(x for x in out.splitlines() if x.startswith("ckpt ")).split()[3] == "100"

    def test_spec_error_is_exit_2(self, capsys: pytest.CaptureFixture[str]) -> None:
        """plan on a bad spec exits 2 with the errors."""
        assert main(["plan", str(ROOT / "tests/bad_specs/zero_period.toml")]) == 2
        assert "needs a positive period" in capsys.readouterr().err


class TestTrain:
    """``schedtrain train``."""

    def test_spec_error_is_exit_2(self, capsys: pytest.CaptureFixture[str]) -> None:
        """A bad spec is refused before training (exit 2)."""
        assert main(["train", str(ROOT / "tests/bad_specs/unknown_type.toml")]) == 2
        assert "unknown callback type" in capsys.readouterr().err

    def test_calls_train_from_spec(self, monkeypatch: pytest.MonkeyPatch,
                                   capsys: pytest.CaptureFixture[str]) -> None:
        """train hands the spec, run dir and resume to train_from_spec and prints a summary."""
        import types

        from schedtrain import Timestamp
        from schedtrain.triggers import MetricValue

        calls: list[tuple[object, ...]] = []

        class Metrics:
            def names(self) -> list[str]:
                return ["val/accuracy"]

            def latest(self, name: str) -> MetricValue:
                return MetricValue(0.97, 3)

        def train_from_spec(spec, run_dir, resume, overwrite=False, schedule_change="refuse"):  # type: ignore[no-untyped-def]
            calls.append((spec.path, run_dir, resume))
            clock = types.SimpleNamespace(now=lambda: Timestamp(step=30, epoch=3, seconds=1.0))
            return types.SimpleNamespace(clock=clock, metrics=Metrics(), run_dir="runs/x",
                                         stopped=None, rank=0,
                                         config=types.SimpleNamespace(max_epochs=3,
                                                                      max_steps=None))

        fake = types.ModuleType("schedtrain.training")
        fake.train_from_spec = train_from_spec  # type: ignore[attr-defined]
        monkeypatch.setitem(sys.modules, "schedtrain.training", fake)
        _fake_threads(monkeypatch)
        assert main(["train", RESNET, "--run-dir", "runs/x", "--resume", "auto"]) == 0
        assert calls == [(RESNET, "runs/x", "auto")]
        assert capsys.readouterr().out.strip().splitlines() == [
            "finished: reached max_epochs = 3 at step 30",
            "trained 3 epochs, 30 steps in 1.0 s; val/accuracy=0.97; run directory runs/x"]

    def test_training_failure_is_exit_1(self, monkeypatch: pytest.MonkeyPatch,
                                        capsys: pytest.CaptureFixture[str]) -> None:
        """A failure while training exits 1 with the error, traceback only on request."""
        import types

        def boom(spec: object, run_dir: object, resume: object, overwrite: bool,
                 schedule_change: str = "refuse") -> None:
            raise RuntimeError("CUDA out of memory")

        fake = types.ModuleType("schedtrain.training")
        fake.train_from_spec = boom  # type: ignore[attr-defined]
        monkeypatch.setitem(sys.modules, "schedtrain.training", fake)
        _fake_threads(monkeypatch)
        assert main(["train", RESNET]) == 1
        err = capsys.readouterr().err
        assert "error: RuntimeError: CUDA out of memory" in err
        assert "Traceback" not in err
        assert main(["--traceback", "train", RESNET]) == 1
        assert "Traceback" in capsys.readouterr().err

    def test_training_module_missing_is_exit_1(self, monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
        """Without the training module, train says what is missing (exit 1)."""
        monkeypatch.setitem(sys.modules, "schedtrain.training", None)
        assert main(["train", RESNET]) == 1
        assert "schedtrain train needs schedtrain.training" in capsys.readouterr().err


class TestRegistry:
    """``schedtrain.registry``: built-in names and module:Class resolution."""

    def test_builtins_point_into_callbacks(self) -> None:
        """Every built-in maps to schedtrain.callbacks.<module>:<same name>."""
        for name, builtin in BUILTINS.items():
            assert builtin.target.startswith("schedtrain.callbacks.")
            assert builtin.target.endswith(f":{name}")

    def test_is_known(self) -> None:
        """Built-in names are known; import paths and typos are not."""
        assert is_known("ModelSaver")
        assert not is_known("ModelSavr")
        assert not is_known("pkg:Thing")

    def test_resolve_user_class(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        """``module:Class`` imports the class."""
        _user_module(tmp_path, monkeypatch)
        assert resolve("my_callbacks:Saver").__name__ == "Saver"

    def test_resolve_missing_class(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        """A missing class names the import path and suggests a near name."""
        _user_module(tmp_path, monkeypatch)
        with pytest.raises(ImportError, match=r"cannot import 'my_callbacks:Savr'.*did you mean "
                                              r"'Saver'"):
            resolve("my_callbacks:Savr")

    def test_resolve_not_a_class(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        """A function is refused: callback types are Callback classes."""
        _user_module(tmp_path, monkeypatch)
        with pytest.raises(TypeError, match=r"is not a callback class .* it is the function"):
            resolve("my_callbacks:not_a_class")

    def test_resolve_unknown_name(self) -> None:
        """A name that is neither built-in nor an import path is a ValueError."""
        with pytest.raises(ValueError, match="did you mean 'EarlyStopping'"):
            resolve("EarlyStoping")

    def test_check_arguments(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        """Arguments are checked against ``__init__``: unknown and missing ones."""
        _user_module(tmp_path, monkeypatch)
        needy = resolve("my_callbacks:Needy")
        assert check_arguments(needy, {"path": "x", "keep": 2}) == []
        assert [k for k, _ in check_arguments(needy, {"kep": 2})] == ["kep", None]


class TestSpecsDirectory:
    """The shipped schedules plan as documented."""

    def test_lm_plan_only(self) -> None:
        """Logs every 1M tokens; checkpoints every 50M tokens, every 30 min and at the end."""
        from schedtrain import simulate

        spec = load_spec(SPECS / "lm_plan_only.toml")
        c = spec.clock
        # The first 10,000 of the spec's 200,000 steps keep the test fast.
        log = simulate(spec.schedule(), epochs=c.epochs, steps_per_epoch=10_000,
                       batches_per_step=c.batches_per_step or 1,
                       tokens_per_batch=c.tokens_per_batch or 0,
                       seconds_per_step=c.seconds_per_step or 0.0)
        tokens_per_step = 4 * 16_384
        assert log.count("log") == 10_000 * tokens_per_step // 1_000_000
        ckpt = log.steps("checkpoint")
        assert ckpt[:3] == [763, 1526, 2289]  # 50M tokens at 65,536 per step: ceil(762.9)
        assert 3600 in ckpt  # 30 min at 0.5 s per step
        assert log.events("checkpoint")[-1] == "train_end"

    def test_warmup_validation(self) -> None:
        """No validation during the 2-epoch warm-up, then every 500 steps, and at the end."""
        from schedtrain import simulate

        spec = load_spec(SPECS / "warmup_validation.toml")
        log = simulate(spec.schedule(), epochs=10, steps_per_epoch=1000)
        steps = log.steps("validate")
        assert steps[0] == 2500
        assert steps[-2:] == [10_000, 10_000]
        assert log.events("validate")[-1] == "train_end"
        assert log.steps("warmup_lr")[-1] == 2000


def _fake_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    """``train`` sets torch's threads from ``schedtrain.training.threads``: a stand-in, so a
    fake ``schedtrain.training`` works whether or not an earlier test imported the real one."""
    import types

    threads = types.ModuleType("schedtrain.training.threads")
    threads.limit_cpu_threads = lambda device: None  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "schedtrain.training.threads", threads)
