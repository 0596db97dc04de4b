"""`schedtrain train --resume URL` of a run whose checkpoint_dir is in S3 (moto's server on
loopback): a checkpoint URL of the run's own checkpoint_dir resumes exactly as
`--resume auto` does from that object (and as `--resume RUN_DIR/checkpoints/NAME`, its
local stand-in); any other URL, a URL beside a local checkpoint_dir, and a checkpoint that
is not there are refused in one line, exit 2, before a file or an object changes."""

from __future__ import annotations

import hashlib
import io
import json
from pathlib import Path
from typing import Any

import attrs
import pytest
import torch
from first_day_project import spec

from schedtrain.checkpoints.storage import FsspecStorage
from schedtrain.cli import main

Bucket = tuple[str, dict[str, Any]]
ENV = "RESUME_URL_INTERRUPT"

#: A callback that interrupts the run once, where ``$RESUME_URL_INTERRUPT`` says:
#: ``preempt:N`` (SIGTERM at step N, as a scheduler sends it) or ``crash:N`` (an error).
INTERRUPT = f'''
import os
import signal

from schedtrain.callbacks import Callback


class Interrupt(Callback):
    def _trigger(self):
        how, _, at = os.environ.get("{ENV}", "").partition(":")
        if at and self.now.step == int(at):
            if how == "preempt":
                os.kill(os.getpid(), signal.SIGTERM)
            else:
                raise RuntimeError(f"crash at step {{at}}")
'''

BODY = """
    [run]
    task = "MODULE:make_task"
    max_epochs = 4
    device = "cpu"
    seed = 0
    {storage}

    [callbacks.validate]
    type = "InferenceRunner"
    trigger = {{ every = "1 epoch" }}

    [callbacks.ckpt]
    type = "ModelSaver"
    keep = 2
    trigger = {{ any = [{{ every = "3 steps" }}, {{ on = "train_end" }}] }}

    [callbacks.interrupt]
    type = "{interrupt}:Interrupt"
    trigger = {{ every = "1 step" }}
"""


def _spec(project: Path, name: str, url: str | None, endpoint: str = "") -> str:
    module = f"interrupt_{project.name.replace('-', '_')}"
    (project / f"{module}.py").write_text(INTERRUPT)
    storage = "" if url is None else f'checkpoint_dir = "{url}"\n    ' + (
        f'storage_options = {{ client_kwargs = {{ endpoint_url = "{endpoint}" }} }}'
        if endpoint else "")
    return str(spec(project, BODY.format(storage=storage, interrupt=module), name=name))


def _train(spec_path: str, run_dir: Path, *extra: str) -> int:
    return main(["train", spec_path, "--run-dir", str(run_dir), *extra])


def _interrupted(spec_path: str, run_dir: Path, how: str,
                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV, how)
    assert _train(spec_path, run_dir) == (75 if how.startswith("preempt") else 1)
    monkeypatch.delenv(ENV)


def _lines(run_dir: Path, url: str) -> list[dict[str, Any]]:
    """The log without wall-clock fields, the run's checkpoint_dir written as URL."""
    text = (run_dir / "events.jsonl").read_text().replace(url, "URL")
    rows = [json.loads(x) for x in text.splitlines()]
    return [{k: v for k, v in r.items() if k not in ("time", "seconds", "duration")}
            for r in rows]


def _final(store: FsspecStorage) -> dict[str, torch.Tensor]:
    state = torch.load(io.BytesIO(store.read(max(store.committed()))), weights_only=True)
    assert state["phase"] == "train_end"
    model: dict[str, torch.Tensor] = state["model"]
    return model


def _files(run_dir: Path) -> dict[str, str]:
    return {str(p.relative_to(run_dir)): hashlib.md5(p.read_bytes()).hexdigest()
            for p in sorted(run_dir.rglob("*")) if p.is_file() and p.name != ".lock"}


def _objects(bucket: Bucket) -> dict[str, str]:
    """Every object of the bucket (manifests and leases too) and its digest."""
    store = FsspecStorage(bucket[0], bucket[1])
    return {str(p): hashlib.md5(store.fs.cat_file(p)).hexdigest()
            for p in store.fs.find(store.root)}


@pytest.mark.filterwarnings("ignore::schedtrain.ScheduleWarning")
@pytest.mark.parametrize("case", ["preempt:7 newest", "crash:10 newest", "preempt:8 older"])
def test_resume_url_is_resume_auto_from_that_object(
        project: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        s3_bucket: Bucket, case: str) -> None:
    """Two runs interrupted alike (SIGTERM, exit 75; an error, exit 1), one resumed with
    `--resume auto`, the other with `--resume URL` of the checkpoint auto picks: the same
    log line for line and the same final weights bit for bit. An older checkpoint's URL
    resumes as `--resume RUN_DIR/checkpoints/NAME` of that object does."""
    how, pick = case.split()
    endpoint = s3_bucket[1]["client_kwargs"]["endpoint_url"]
    urls = {run: f"{s3_bucket[0]}/{run}/checkpoints" for run in ("a", "b")}
    specs = {run: _spec(project, f"{run}.toml", url, endpoint) for run, url in urls.items()}
    for run in urls:
        _interrupted(specs[run], project / run, how, monkeypatch)
    stores = {run: FsspecStorage(url, s3_bucket[1]) for run, url in urls.items()}
    names = sorted(stores["b"].committed())
    assert names == sorted(stores["a"].committed()) and len(names) >= 2
    name = names[-1] if pick == "newest" else names[-2]
    capsys.readouterr()
    if pick == "newest":
        assert _train(specs["a"], project / "a", "--resume", "auto") == 0
        assert f"resumed from {urls['a']}/{name} at step" in capsys.readouterr().err
    else:
        assert _train(specs["a"], project / "a", "--resume",
                      str(project / "a" / "checkpoints" / name)) == 0
    assert _train(specs["b"], project / "b", "--resume", f"{urls['b']}/{name}") == 0
    assert "error" not in capsys.readouterr().err
    assert _lines(project / "b", urls["b"]) == _lines(project / "a", urls["a"])
    want, got = _final(stores["a"]), _final(stores["b"])
    assert want.keys() == got.keys()
    assert all(torch.equal(want[k], got[k]) for k in want)
    assert not (project / "b" / "checkpoints").exists()


def _refused(capsys: pytest.CaptureFixture[str], spec_path: str, run_dir: Path, given: str,
             bucket: Bucket) -> str:
    """``--resume given``: exit 2, one error line and nothing else; no file of the run
    directory and no object of the bucket changed (no lease taken either)."""
    files, objects = _files(run_dir), _objects(bucket)
    capsys.readouterr()
    assert _train(spec_path, run_dir, "--resume", given) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and err.startswith("error: "), err
    assert "Traceback" not in err and len(err.strip()) <= 300 + len("error: ")
    assert _files(run_dir) == files
    assert _objects(bucket) == objects
    return err


@pytest.mark.filterwarnings("ignore::schedtrain.ScheduleWarning")
def test_other_urls_and_missing_objects_refused(
        project: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        s3_endpoint: str, s3_bucket: Bucket) -> None:
    """A URL outside the run's checkpoint_dir (another bucket, another prefix, a folder
    under it, the folder itself, credentials in it) names the URL and the checkpoint_dir
    it must be in; a checkpoint that is not committed there says so; each exit 2 with
    one line, before anything changes. The run then resumes by its URL."""
    url = f"{s3_bucket[0]}/job/checkpoints"
    path, run_dir = _spec(project, "s3.toml", url, s3_endpoint), project / "run"
    _interrupted(path, run_dir, "preempt:10", monkeypatch)
    bucket = s3_bucket[0].removeprefix("s3://")
    outside = [f"s3://other-{bucket}/job/checkpoints/step-00000010.pt",
               f"{s3_bucket[0]}/elsewhere/step-00000010.pt",
               f"{s3_bucket[0]}/job/checkpoints-old/step-00000010.pt",
               f"{url}/sub/step-00000010.pt", url, f"{url}/", f"{url}/..",
               f"gs://{bucket}/job/checkpoints/step-00000010.pt"]
    for given in outside:  # long names are shortened in the middle, to fit the line
        err = _refused(capsys, path, run_dir, given, s3_bucket)
        assert err.startswith(f"error: checkpoint '{given[:10]}") and f"{given[-12:]}': " in err
        assert "must be a checkpoint in this run's checkpoint_dir 's3://t-" in err, err
        assert "/job/checkpoints' (a name there" in err, err
    secret = f"s3://KEY:SeCrEt@{bucket}/job/checkpoints/step-00000010.pt"
    err = _refused(capsys, path, run_dir, secret, s3_bucket)
    assert "SeCrEt" not in err and "s3://***@" in err, err
    # Not there: never written, pruned (keep=2: 6 and 9 stay), or a file without
    # its manifest.
    store = FsspecStorage(url, s3_bucket[1])
    store.fs.pipe_file(f"{store.root}/step-00000005.pt", b"half a checkpoint")
    for name in ("step-00000099.pt", "step-00000003.pt", "step-00000005.pt"):
        err = _refused(capsys, path, run_dir, f"{url}/{name}", s3_bucket)
        assert f"/{name}': no checkpoint of that name is committed in checkpoint_dir" in err
    store.fs.rm_file(f"{store.root}/step-00000005.pt")
    assert _train(path, run_dir, "--resume", f"{url}/step-00000010.pt") == 0
    status = json.loads((run_dir / "run.json").read_text())
    assert (status["status"], status["step"]) == ("finished", 16)


@pytest.mark.filterwarnings("ignore::schedtrain.ScheduleWarning")
@pytest.mark.parametrize("folder", [None, "elsewhere/ck"])
def test_url_refused_beside_a_local_checkpoint_dir(
        project: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        s3_bucket: Bucket, folder: str | None) -> None:
    """A run whose checkpoints are local files (RUN_DIR/checkpoints, or a local
    checkpoint_dir) refuses any --resume URL, file:// ones included, naming its folder;
    a missing local file is exit 2 too."""
    local = None if folder is None else str(project / folder)
    path, run_dir = _spec(project, "local.toml", local), project / "run"
    _interrupted(path, run_dir, "preempt:7", monkeypatch)
    checkpoints = run_dir / "checkpoints" if local is None else Path(local)
    newest = checkpoints / "step-00000007.pt"
    assert newest.is_file()
    for given in (f"{s3_bucket[0]}/run/checkpoints/step-00000007.pt", newest.as_uri()):
        err = _refused(capsys, path, run_dir, given, s3_bucket)
        assert err.startswith(f"error: checkpoint '{given[:8]}"), err
        assert "/step-00000007.pt': --resume URL must be a checkpoint in this run's " \
               "object-store checkpoint_dir, and its checkpoints are local files in '" in err
        assert f"/{checkpoints.name}': give a path" in err, err
    missing = str(run_dir / "checkpoints" / "step-00000099.pt")
    err = _refused(capsys, path, run_dir, missing, s3_bucket)
    assert "step-00000099.pt': no such file" in err, err
    assert _train(path, run_dir, "--resume", str(run_dir / "checkpoints" / newest.name)) == 0


@pytest.mark.filterwarnings("ignore::schedtrain.ScheduleWarning")
def test_trainer_resume_url(project: Path, monkeypatch: pytest.MonkeyPatch,
                            s3_endpoint: str, s3_bucket: Bucket) -> None:
    """From Python: ``Trainer.resume(URL)`` restores that object and returns its URL; a
    URL of another folder raises ``UnresumableCheckpoint`` (a ``RunDirError``)."""
    from schedtrain.checkpoints.format import UnresumableCheckpoint
    from schedtrain.spec import load_spec
    from schedtrain.training.from_spec import prepare_run
    from schedtrain.training.trainer import Trainer

    url = f"{s3_bucket[0]}/job/checkpoints"
    path, run_dir = _spec(project, "s3.toml", url, s3_endpoint), project / "run"
    _interrupted(path, run_dir, "preempt:7", monkeypatch)

    def trainer() -> Trainer:  # as train_from_spec builds it
        loaded = load_spec(path, imports=True)
        prepared = prepare_run(loaded)
        assert loaded.run is not None and prepared.task is not None
        task = prepared.task
        return Trainer(task.model, task.optimizer, task.train_data, task.loss_fn,
                       val_data=task.val_data, prepared=prepared.bound,
                       config=attrs.evolve(loaded.run, run_dir=str(run_dir)))

    t = trainer()
    with pytest.raises(UnresumableCheckpoint, match="must be a checkpoint in this run's"):
        t.resume(f"{s3_bucket[0]}/other/step-00000006.pt")
    assert t.resume(f"{url}/step-00000006.pt") == f"{url}/step-00000006.pt"
    assert t.clock.step == 6
    t.fit()
    assert t.outcome == "finished" and t.clock.step == 16
