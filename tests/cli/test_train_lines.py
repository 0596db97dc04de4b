"""What ``train`` prints on the first day (issue 12 C): a failure in user code, why the run
stopped, and schedule warnings, each as one line."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from first_day_project import VALIDATE, spec

from schedtrain.cli import main


class TestFailures:
    """An exception in user code exits 1 with one line saying where; the traceback is saved in the
    run directory and run.json says failed. (first day, issue 12 C)"""

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


STOPPER = '''

class Stopper(Callback):
    def _trigger(self):
        raise StopTraining("enough for today")
'''


class TestWhyItStopped:
    """``train`` prints one line saying why the run ended. (first day, issue 12 C)"""

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


def test_train_prints_schedule_warnings_as_lines(project: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """A schedule warning during ``train`` is one ``warning: SPEC: ...`` line, not a Python warning
    pointing into the library. (first day, issue 12 C)"""
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
