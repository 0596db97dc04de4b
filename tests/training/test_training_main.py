"""The main job: train_from_spec on the digits example, and `schedtrain train` end to end."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from schedtrain import SpecError
from schedtrain.spec import Spec, loads_spec

ROOT = Path(__file__).resolve().parents[2]
SPEC = ROOT / "specs" / "digits.toml"
MAIN = "import sys; from schedtrain.cli import main; sys.exit(main(sys.argv[1:]))"


def _spec(task: str | None = "examples.digits:make_task", max_epochs: int = 3,
          checkpoint_args: str = "keep = 1") -> Spec:
    """A digits spec, loaded through the real TOML loader."""
    task_line = f'task = "{task}"' if task else ""
    text = f"""
[run]
{task_line}
max_epochs = {max_epochs}
device = "cpu"

[callbacks.validate]
type = "InferenceRunner"
trigger = {{ every = "1 epoch" }}

[callbacks.best]
type = "MaxSaver"
monitor = "val/accuracy"
trigger = {{ every = "1 epoch" }}

[callbacks.checkpoint]
type = "ModelSaver"
{checkpoint_args}
trigger = {{ any = [{{ every = "1 epoch" }}, {{ on = "train_end" }}] }}

[callbacks.stop]
type = "EarlyStopping"
trigger = {{ plateau = "val/loss", patience = 5 }}
"""
    return loads_spec(text, file=str(SPEC))


def _accuracy(run_dir: Path) -> float:
    rows = [json.loads(x) for x in (run_dir / "events.jsonl").read_text().splitlines()]
    return [r["value"] for r in rows if r.get("name") == "val/accuracy"][-1]


class TestTrainFromSpec:
    """train_from_spec builds the task and callbacks from a spec and trains."""

    def test_short_run_writes_files(self, tmp_path: Path) -> None:
        """Three epochs of digits: events, checkpoints and the best model are written."""
        pytest.importorskip("sklearn")
        from schedtrain.training import train_from_spec

        train_from_spec(_spec(), str(tmp_path), None)
        assert (tmp_path / "events.jsonl").exists()
        assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["step-00000135.pt"]
        assert (tmp_path / "best" / "max-val-accuracy.pt").exists()
        assert _accuracy(tmp_path) > 0.85

    def test_resume_auto(self, tmp_path: Path) -> None:
        """--resume auto continues from the newest checkpoint in RUN_DIR/checkpoints."""
        pytest.importorskip("sklearn")
        from schedtrain.training import train_from_spec

        train_from_spec(_spec(max_epochs=2), str(tmp_path), None)
        train_from_spec(_spec(max_epochs=3), str(tmp_path), "auto")
        rows = [json.loads(x) for x in (tmp_path / "events.jsonl").read_text().splitlines()]
        epochs = [r["epoch"] for r in rows if r.get("callback") == "validate"]
        assert epochs == [1, 2, 3]

    def test_missing_task_is_a_spec_error(self) -> None:
        """No [run] task: a SpecError naming run.task."""
        from schedtrain.training import train_from_spec

        spec = _spec(task=None)
        with pytest.raises(SpecError, match=r"run\.task"):
            train_from_spec(spec, None, None)

    def test_bad_task_and_bad_arguments(self, tmp_path: Path) -> None:
        """An unimportable task, or callback arguments that do not fit, are SpecErrors."""
        from schedtrain.training import train_from_spec

        with pytest.raises(SpecError, match=r"cannot import 'nowhere'"):
            train_from_spec(_spec(task="nowhere:make"), str(tmp_path), None)
        # A built-in's arguments are checked when the spec loads, before any training.
        with pytest.raises(SpecError, match=r"callbacks\.checkpoint\.kep: unknown argument"):
            _spec(checkpoint_args="kep = 2")


@pytest.mark.slow
class TestCommandLine:
    """`schedtrain train specs/digits.toml` trains the digits MLP to >= 95% accuracy."""

    def test_schedtrain_train_digits(self, tmp_path: Path) -> None:
        """Exit code 0, files written, a summary line, final validation accuracy >= 0.95."""
        pytest.importorskip("sklearn")
        env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
        proc = subprocess.run(
            [sys.executable, "-c", MAIN, "train", str(SPEC), "--run-dir", str(tmp_path)],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
            check=False)
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert "val/accuracy=" in proc.stdout.splitlines()[-1]
        assert (tmp_path / "events.jsonl").exists()
        assert list((tmp_path / "checkpoints").glob("step-*.pt"))
        assert _accuracy(tmp_path) >= 0.95
