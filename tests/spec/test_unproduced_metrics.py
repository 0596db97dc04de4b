"""Metrics nobody produces on the first day (issue 12 C): ``check`` reports them and
``train`` refuses them before training, with the names that exist."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
from first_day_project import VALIDATE, spec

from schedtrain.cli import main

PRODUCER = '''

class Producer(Callback):
    produces = ("my/score",)

    def _trigger(self):
        self.metrics.put("my/score", 1.0)
'''


class TestMetricsNobodyProduces:
    """A metric read (trigger or ``monitor``) that nothing produces is reported by ``check`` and
    refused by ``train`` before training, with the names that exist. (first day, issue 12 C)"""

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
