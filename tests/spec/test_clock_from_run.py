"""A schedule's clock taken from ``[run]`` and the task's data on the first day
(issue 12 C): ``plan`` and ``check`` without ``[clock]``."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from first_day_project import spec

from schedtrain.cli import main


class TestClockFromRun:
    """Without ``[clock]``, ``plan`` and ``check`` take the run's shape from ``[run]`` and (with
    ``--import``) the task's data; a ``[clock]`` that disagrees is a warning. (first day, issue 12
    C)"""

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
