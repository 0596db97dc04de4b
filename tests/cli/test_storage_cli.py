"""`schedtrain check` and `train` with `[run] checkpoint_dir` a URL: the bucket of a moto
S3 server, `--resume auto` from it after SIGTERM and kill -9, and bad input refused. The
`train` commands are children forked from the test process (``jobs.forked``: torch
imported once), signalled as ``python -m schedtrain train`` would be."""

from __future__ import annotations

import io
import json
import signal
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from jobs.trials import SPEC, lines, train

from schedtrain.checkpoints.storage import FsspecStorage
from schedtrain.cli import main
from schedtrain.spec import load_spec
from schedtrain.training.from_spec import interrupted_line

EPOCHS = 2


def _spec(folder: Path, extra: str) -> Path:
    path = folder / "specs" / "crash.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(SPEC.format(epochs=EPOCHS).replace("seed = 3\n", f"seed = 3\n{extra}\n"))
    return path


def _s3_lines(url: str, endpoint: str) -> str:
    return (f'checkpoint_dir = "{url}"\n'
            f'storage_options = {{ client_kwargs = {{ endpoint_url = "{endpoint}" }} }}')


@pytest.mark.slow
def test_sigterm_and_kill_resume_from_bucket_exactly(tmp_path: Path, s3_endpoint: str,
                                                     s3_bucket: tuple[str, dict[str, Any]]
                                                     ) -> None:
    """A run whose checkpoints go to S3, preempted (exit 75) and killed with kill -9,
    then `--resume auto` to the end: the log line for line and the final weights bit for
    bit of the uninterrupted local run; the run directory holds no checkpoint file. The
    signals land mid-run, by the steps the log shows (SIGTERM in the first epoch, kill -9
    in the second, after the resume's first save)."""
    reference = tmp_path / "reference"
    assert train(_spec(tmp_path / "a", ""), reference, resume=False,
                 fork=True).returncode == 0
    url = f"{s3_bucket[0]}/job/checkpoints"
    spec = _spec(tmp_path / "b", _s3_lines(url, s3_endpoint))
    run_dir = tmp_path / "run"
    first = train(spec, run_dir, kill_at_step=30, sig=signal.SIGTERM, fork=True)
    assert first.returncode in (0, 75), first.stderr
    assert first.returncode == 75, "SIGTERM came after the end: send it earlier"
    if first.returncode == 75:  # the line names the checkpoint by its URL
        assert f"checkpoint {url}/step-" in first.stderr
    second = train(spec, run_dir, kill_at_step=90, sig=signal.SIGKILL, fork=True)
    assert second.returncode in (0, -signal.SIGKILL), second.stderr
    assert second.returncode == -signal.SIGKILL, "kill -9 came after the end: kill earlier"
    assert json.loads((run_dir / "run.json").read_text())["status"] == "running"
    last = train(spec, run_dir, fork=True)
    assert last.returncode == 0, last.stderr
    assert lines(run_dir) == lines(reference)
    store = FsspecStorage(url, s3_bucket[1])
    newest = max(store.committed())
    state = torch.load(io.BytesIO(store.read(newest)), weights_only=True)
    assert state["phase"] == "train_end"
    want = torch.load(max((reference / "checkpoints").glob("step-*.pt")), weights_only=True)
    assert newest == max(p.name for p in (reference / "checkpoints").glob("step-*.pt"))
    assert all(torch.equal(want["model"][k], state["model"][k]) for k in want["model"])
    assert not list((run_dir / "checkpoints").glob("*"))
    status = json.loads((run_dir / "run.json").read_text())
    assert status["checkpoint"] == f"{url}/{newest}"
    assert f"continues from '{url}/{newest}'" in interrupted_line(load_spec(spec), str(run_dir))


def test_missing_package_names_the_extra(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """A gs:// checkpoint_dir without gcsfs: check and train exit 2 naming the extra."""
    monkeypatch.setitem(sys.modules, "gcsfs", None)  # as if not installed
    spec = _spec(tmp_path, 'checkpoint_dir = "gs://bucket/ck"')
    assert main(["check", str(spec)]) == 2
    assert main(["train", str(spec), "--run-dir", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert err.count("run.checkpoint_dir") == 2
    assert "pip install 'schedtrain[gcs]'" in err
    assert "Traceback" not in err


def test_storage_options_need_a_url(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """storage_options beside a local folder (or none) is refused by key path."""
    spec = _spec(tmp_path, 'checkpoint_dir = "ck"\nstorage_options = { anon = true }')
    assert main(["check", str(spec)]) == 2
    assert "run.storage_options" in capsys.readouterr().err
