"""A finished run whose last checkpoint comes before its end (a saver every K steps, an end
that is no multiple of K) is never trained again: `--resume auto` says "nothing left to
do" (exit 0) and `--resume PATH` is refused (exit 2), every file as it was. Only a newer
checkpoint the run wrote that is damaged or gone makes an older one train what remains;
a later end (a larger max_epochs) still continues."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
from first_day_project import spec

from schedtrain.checkpoints import list_checkpoints
from schedtrain.checkpoints.storage import FsspecStorage
from schedtrain.cli import main

STEPS_PER_EPOCH = 4  # the project's task: 32 rows, batches of 8

BODY = """
    [run]
    task = "MODULE:make_task"
    max_epochs = {epochs}
    device = "cpu"
    seed = 0

    [callbacks.validate]
    type = "InferenceRunner"
    trigger = {{ every = "1 epoch" }}

    [callbacks.ckpt]
    type = "ModelSaver"
    trigger = {{ every = "{every} steps" }}

    [callbacks.best]
    type = "MinSaver"
    monitor = "val/loss"
    trigger = {{ every = "1 epoch" }}
"""

#: (epochs, save every K steps): each run ends past its last checkpoint
CASES = [(3, 5), (3, 7), (5, 3), (4, 6), (2, 3)]


def _spec(project: Path, epochs: int, every: int) -> str:
    return spec(project, BODY.format(epochs=epochs, every=every), name=f"e{epochs}.toml")


def _train(spec_path: str, run_dir: Path, *extra: str) -> int:
    return main(["train", spec_path, "--run-dir", str(run_dir), *extra])


def _md5s(run_dir: Path) -> dict[str, str]:
    return {str(p.relative_to(run_dir)): hashlib.md5(p.read_bytes()).hexdigest()
            for p in sorted(run_dir.rglob("*")) if p.is_file() and p.name != ".lock"}


def _finished(project: Path, epochs: int, every: int) -> tuple[str, Path]:
    path, run_dir = _spec(project, epochs, every), project / f"run-{epochs}-{every}"
    assert _train(path, run_dir) == 0
    end = epochs * STEPS_PER_EPOCH
    newest = list_checkpoints(run_dir / "checkpoints")[0]
    assert newest.name == f"step-{end // every * every:08d}.pt"
    assert end % every  # the run trained steps after its last checkpoint
    return path, run_dir


@pytest.mark.parametrize(("epochs", "every"), CASES)
def test_a_finished_run_is_not_trained_again(
        project: Path, capsys: pytest.CaptureFixture[str], epochs: int, every: int) -> None:
    """--resume auto: exit 0, "nothing left to do"; --resume with any checkpoint of the
    run: exit 2, "nothing left to resume"; no file written, the best file included."""
    path, run_dir = _finished(project, epochs, every)
    before = _md5s(run_dir)
    assert any(name.startswith("best/") for name in before)
    capsys.readouterr()
    assert _train(path, run_dir, "--resume", "auto") == 0
    err = capsys.readouterr().err
    assert "nothing left to do" in err and "resumed from" not in err, err
    assert _md5s(run_dir) == before
    newest = list_checkpoints(run_dir / "checkpoints")[0]
    assert _train(path, run_dir, "--resume", str(newest)) == 2
    err = capsys.readouterr().err
    assert "nothing left to resume" in err and "Traceback" not in err, err
    assert _md5s(run_dir) == before


@pytest.mark.parametrize(("epochs", "every"), CASES[:3])
def test_a_damaged_newest_checkpoint_trains_what_remains(
        project: Path, epochs: int, every: int) -> None:
    """The run's newest checkpoint damaged: --resume auto continues from the one before
    and trains to the same end, its log the uninterrupted run's."""
    path, run_dir = _finished(project, epochs, every)
    full = (run_dir / "events.jsonl").read_text().splitlines()
    newest = list_checkpoints(run_dir / "checkpoints")[0]
    newest.write_bytes(newest.read_bytes()[:100])
    assert _train(path, run_dir, "--resume", "auto") == 0
    lines = (run_dir / "events.jsonl").read_text().splitlines()
    assert [json.loads(x).get("step") for x in lines] == \
        [json.loads(x).get("step") for x in full]
    status = json.loads((run_dir / "run.json").read_text())
    assert (status["status"], status["step"]) == ("finished", epochs * STEPS_PER_EPOCH)


@pytest.mark.parametrize(("epochs", "every"), CASES[:3])
def test_a_later_end_continues_from_the_newest_checkpoint(
        project: Path, capsys: pytest.CaptureFixture[str], epochs: int, every: int) -> None:
    """max_epochs raised in the spec: the run continues to the new end."""
    _, run_dir = _finished(project, epochs, every)
    newest = list_checkpoints(run_dir / "checkpoints")[0]
    capsys.readouterr()
    assert _train(_spec(project, epochs + 1, every), run_dir, "--resume", "auto") == 0
    assert f"resumed from {newest} at step" in capsys.readouterr().err
    status = json.loads((run_dir / "run.json").read_text())
    assert (status["status"], status["step"]) == ("finished",
                                                  (epochs + 1) * STEPS_PER_EPOCH)


def test_a_finished_run_with_checkpoints_in_a_bucket_is_not_trained_again(
        project: Path, capsys: pytest.CaptureFixture[str], s3_endpoint: str,
        s3_bucket: tuple[str, dict[str, Any]]) -> None:
    """The same with `checkpoint_dir` in S3: --resume auto exit 0, --resume
    RUN_DIR/checkpoints/NAME (standing for the bucket's file) and --resume URL of that
    file exit 2, the run directory's files and the bucket's objects as they were."""
    url = f"{s3_bucket[0]}/job/checkpoints"
    body = BODY.format(epochs=3, every=5).replace(
        'seed = 0\n', f'seed = 0\ncheckpoint_dir = "{url}"\n'
        f'storage_options = {{ client_kwargs = {{ endpoint_url = "{s3_endpoint}" }} }}\n')
    path, run_dir = spec(project, body, name="s3.toml"), project / "run"
    assert _train(path, run_dir) == 0
    store = FsspecStorage(url, s3_bucket[1])
    objects = {name: hashlib.md5(store.read(name)).hexdigest() for name in store.committed()}
    assert max(objects) == "step-00000010.pt"  # the run ended at step 12
    before = _md5s(run_dir)
    capsys.readouterr()
    assert _train(path, run_dir, "--resume", "auto") == 0
    assert "nothing left to do" in capsys.readouterr().err
    assert _train(path, run_dir, "--resume",
                  str(run_dir / "checkpoints" / "step-00000010.pt")) == 2
    assert "nothing left to resume" in capsys.readouterr().err
    assert _train(path, run_dir, "--resume", f"{url}/step-00000010.pt") == 2
    err = capsys.readouterr().err
    assert "nothing left to resume" in err and len(err.strip().splitlines()) == 1, err
    assert _md5s(run_dir) == before
    assert {n: hashlib.md5(store.read(n)).hexdigest() for n in store.committed()} == objects
