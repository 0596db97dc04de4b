"""``--resume auto`` where no valid checkpoint is left: a run cut short starts again, a run
that ended there is never trained again (its log and best weights are kept)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from schedtrain.cli import main

ROOT = Path(__file__).resolve().parents[2]


def _spec(tmp_path: Path, name: str, epochs: int) -> Path:
    """The digits job for ``epochs`` epochs: its ModelSaver (every 5 epochs) never saves."""
    text = (ROOT / "specs" / "digits.toml").read_text()
    assert "max_epochs = 30" in text and 'every = "5 epochs"' in text
    spec = tmp_path / name
    spec.write_text(text.replace("max_epochs = 30", f"max_epochs = {epochs}"))
    return spec


def _train(spec: Path, run_dir: Path, *extra: str) -> int:
    return main(["train", str(spec), "--run-dir", str(run_dir), *extra])


@pytest.fixture
def ended(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(ROOT)  # the spec's task module is examples/digits.py
    run_dir = tmp_path / "run"
    assert _train(_spec(tmp_path, "two.toml", 2), run_dir) == 0
    assert not (run_dir / "checkpoints").exists() or not any((run_dir / "checkpoints").iterdir())
    return run_dir


def _files(run_dir: Path) -> dict[str, bytes]:
    return {str(p.relative_to(run_dir)): p.read_bytes() for p in sorted(run_dir.rglob("*"))
            if p.is_file() and p.name != ".lock"}


def test_a_later_end_is_refused_and_nothing_changes(
        ended: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Four epochs asked of a run that finished two without a checkpoint: exit 2 naming
    the missing checkpoint; events.jsonl and best/ are the finished run's."""
    before = _files(ended)
    capsys.readouterr()
    assert _train(_spec(tmp_path, "four.toml", 4), ended, "--resume", "auto") == 2
    err = capsys.readouterr().err
    assert "finished at step 90" in err and "left no checkpoint to continue from" in err
    assert "--overwrite" in err and "Traceback" not in err
    assert _files(ended) == before


def test_the_same_end_has_nothing_left_to_do(
        ended: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The same job requeued after it finished: exit 0, every file as it was."""
    before = _files(ended)
    capsys.readouterr()
    assert _train(_spec(tmp_path, "two.toml", 2), ended, "--resume", "auto") == 0
    assert "nothing left to do" in capsys.readouterr().err
    assert _files(ended) == before


def test_a_run_cut_short_starts_again_and_says_so(
        ended: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """run.json says running with a gone process (killed before its first checkpoint):
    the resume trains from step 0, with a starting_over line, to the new end."""
    status = json.loads((ended / "run.json").read_text())
    status.update(status="running", pid=2**22 + 12345)
    (ended / "run.json").write_text(json.dumps(status))
    capsys.readouterr()
    assert _train(_spec(tmp_path, "four.toml", 4), ended, "--resume", "auto") == 0
    out = capsys.readouterr()
    assert "starting_over" in out.out + out.err
    rows = [json.loads(x) for x in (ended / "events.jsonl").read_text().splitlines()]
    assert rows[0]["step"] == 0 and max(r.get("step", 0) for r in rows) == 180
    assert json.loads((ended / "run.json").read_text())["status"] == "finished"
