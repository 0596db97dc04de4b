"""Hostile checkpoints: crafted ``written`` lists, checkpoints without a checksum, and a
background write cut by kill -9, a file size limit or a read-only folder. Each ends
with a clear line, exit 2 or a clean resume; no file outside the run changes and no file
the run keeps is deleted. The runs killed or limited are children forked from the test
process (``jobs.forked``: torch imported once)."""

from __future__ import annotations

import errno
import io
import os
import resource
import signal
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from jobs import forked
from jobs.forked import Forked
from training_helpers import UnevenData, tiny_model

from schedtrain import Schedule, every
from schedtrain.callbacks import Callback, ModelSaver
from schedtrain.checkpoints import CheckpointError, newest_valid, read_checkpoint
from schedtrain.checkpoints.format import digest
from schedtrain.checkpoints.storage import FsspecStorage
from schedtrain.cli import main
from schedtrain.training import Trainer

mse = torch.nn.functional.mse_loss


def _trainer(run_dir: Path, steps: int, *, keep: Any = 2, **kw: Any) -> Trainer:
    model, opt = tiny_model()
    return Trainer(model, opt, UnevenData([steps]), mse,
                   schedule=Schedule({"save": every("1 step")}),
                   bindings={"save": ModelSaver(keep=keep)}, max_epochs=1,
                   run_dir=run_dir, handle_signals=False, **kw)


def _recrafted(state: dict[str, Any]) -> dict[str, Any]:
    """``state`` with its checksum recomputed, so it loads as a valid checkpoint."""
    state = {k: v for k, v in state.items() if k != "checksum"}
    state["checksum"] = {"algorithm": "blake2b-256", "digest": digest(state)}
    return state


def _snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file()}


# -- crafted `written` lists ----------------------------------------------------------------

#: Where a crafted ``written`` entry points: (key written into the list, file planted)
_PLANTED = {
    "older in checkpoints/": ("checkpoints/step-00000002.pt", "run/checkpoints/step-00000002.pt"),
    "newer in checkpoints/": ("checkpoints/step-00000099.pt", "run/checkpoints/step-00000099.pt"),
    "outside the run": ("{tmp}/victim/step-00000001.pt", "victim/step-00000001.pt"),
    "up and out": ("../victim/step-00000003.pt", "victim/step-00000003.pt"),
}


@pytest.mark.parametrize(("where", "foreign"), [
    *((w, f) for w in ("older in checkpoints/", "newer in checkpoints/")
      for f in ("a user's file", "another run's checkpoint")),
    ("outside the run", "a user's file"), ("up and out", "another run's checkpoint")])
def test_a_crafted_written_list_deletes_no_foreign_file(tmp_path: Path, where: str,
                                                        foreign: str) -> None:
    """A checkpoint whose ``written`` names a file the run never wrote (its checksum
    recomputed, so it loads): the resumed run prunes its own files as the policy says,
    and the planted file, byte for byte, and everything outside the run stay."""
    other = tmp_path / "other"
    _trainer(other, 3).fit()  # another run's checkpoint: a real one, same model
    key, planted = _PLANTED[where]
    key = key.format(tmp=tmp_path)
    run = tmp_path / "run"
    _trainer(run, 8, max_steps=4).fit()  # keeps step 3 and 4
    victim = tmp_path / planted
    victim.parent.mkdir(parents=True, exist_ok=True)
    victim.write_bytes(b"a user's notes" if foreign == "a user's file"
                       else (other / "checkpoints" / "step-00000003.pt").read_bytes())
    source = run / "checkpoints" / "step-00000004.pt"
    state = torch.load(source, weights_only=True)
    state["run"]["written"] = [key, *state["run"]["written"]]
    torch.save(_recrafted(state), source)
    read_checkpoint(source)  # it loads: only the identity says the file is not the run's
    outside = {k: v for k, v in _snapshot(tmp_path).items() if not k.startswith("run/")}
    t = _trainer(run, 8)
    t.resume(source)
    t.fit()
    assert victim.read_bytes() == (outside.get(planted) or victim.read_bytes())
    assert victim.exists()
    mine = sorted(p.name for p in (run / "checkpoints").iterdir() if p != victim)
    assert mine == ["step-00000007.pt", "step-00000008.pt"]
    after = {k: v for k, v in _snapshot(tmp_path).items() if not k.startswith("run/")}
    assert after == outside


@pytest.mark.filterwarnings("ignore::schedtrain.ScheduleWarning")
def test_a_crafted_written_list_in_a_bucket(tmp_path: Path,
                                            s3_bucket: tuple[str, dict[str, Any]]) -> None:
    """In a bucket folder shared with another run: a crafted ``written`` naming the
    other run's committed checkpoint deletes neither it nor its manifest."""
    url, options = f"{s3_bucket[0]}/shared/checkpoints", s3_bucket[1]
    store = FsspecStorage(url, options)
    _trainer(tmp_path / "run", 8, checkpoint_dir=url, storage_options=options,
             max_steps=4).fit()
    # The other run's committed checkpoint (its own bytes and manifest) beside ours.
    other = tmp_path / "other"
    _trainer(other, 2).fit()
    theirs = (other / "checkpoints" / "step-00000002.pt").read_bytes()
    store.write("step-00000002.pt", lambda f: f.write(theirs))
    manifest = store.fs.cat_file(f"{store.root}/step-00000002.manifest.json")
    state = torch.load(io.BytesIO(store.read("step-00000004.pt")),
                       weights_only=True)
    state["run"]["written"] = ["checkpoints/step-00000002.pt", *state["run"]["written"]]
    crafted = _recrafted(state)
    store.write("step-00000004.pt", lambda f: torch.save(crafted, f))
    t = _trainer(tmp_path / "run", 8, checkpoint_dir=url, storage_options=options)
    t.resume(tmp_path / "run" / "checkpoints" / "step-00000004.pt")
    t.fit()
    assert sorted(store.committed()) == ["step-00000002.pt", "step-00000007.pt",
                                         "step-00000008.pt"]
    assert store.read("step-00000002.pt") == theirs
    assert store.fs.cat_file(f"{store.root}/step-00000002.manifest.json") == manifest


def test_a_resumed_run_still_prunes_its_earlier_files(tmp_path: Path) -> None:
    """The identities travel in the checkpoint: files written before a resume (by this
    run) are pruned as an unbroken run prunes them."""
    run = tmp_path / "run"
    _trainer(run, 9, keep={"any": [{"latest": 1}, {"every": "2 steps"}]}, max_steps=5).fit()
    t = _trainer(run, 9, keep={"any": [{"latest": 1}, {"every": "2 steps"}]})
    t.resume(run / "checkpoints" / "step-00000005.pt")
    t.fit()
    whole = tmp_path / "whole"
    _trainer(whole, 9, keep={"any": [{"latest": 1}, {"every": "2 steps"}]}).fit()
    names = sorted(p.name for p in (run / "checkpoints").iterdir())
    assert names == sorted(p.name for p in (whole / "checkpoints").iterdir())
    assert "step-00000005.pt" not in names  # the one resumed from, pruned too


# -- checkpoints without a (valid) checksum ------------------------------------------------

_CHECKSUMS: dict[str, Any] = {
    "removed": None,
    "a number": 7,
    "a list": ["blake2b-256"],
    "no digest": {"algorithm": "blake2b-256"},
    "a number as digest": {"algorithm": "blake2b-256", "digest": 12},
    "another algorithm": {"algorithm": "md5", "digest": "REAL"},  # the true digest
}


@pytest.mark.parametrize("how", sorted(_CHECKSUMS))
def test_a_checkpoint_without_a_checksum_is_damaged(tmp_path: Path, how: str) -> None:
    """A checkpoint with its checksum removed, malformed or of another algorithm is
    refused by read_checkpoint with one line saying so, and passed over by name when
    looking for one to resume from."""
    _trainer(tmp_path, 3, keep=None).fit()
    path = tmp_path / "checkpoints" / "step-00000003.pt"
    state = torch.load(path, weights_only=True)
    true = state.pop("checksum")["digest"]
    if _CHECKSUMS[how] is not None:
        state["checksum"] = {k: true if v == "REAL" else v for k, v in _CHECKSUMS[how].items()
                             } if isinstance(_CHECKSUMS[how], dict) else _CHECKSUMS[how]
    torch.save(state, path)
    with pytest.raises(CheckpointError, match="checksum") as caught:
        read_checkpoint(path)
    assert "damaged" in str(caught.value) and "\n" not in str(caught.value)
    skipped: list[tuple[str, str]] = []
    found = newest_valid(tmp_path / "checkpoints", lambda p, why: skipped.append((p.name, why)))
    assert found is not None and found.name == "step-00000002.pt"
    assert [n for n, _ in skipped] == ["step-00000003.pt"]


#: Keys a reader indexes, each removed or retyped in a checkpoint whose checksum is then
#: recomputed: the file is whole, only its shape is wrong.
_SHAPES = {
    "no run": (("run",), None),
    "run a list": (("run",), []),
    "no step": (("step",), None),
    "step a string": (("step",), "3"),
    "step a bool": (("step",), True),
    "no run.clock": (("run", "clock"), None),
    "no run.written": (("run", "written"), None),
    "run.epoch_open a number": (("run", "epoch_open"), 1),
    "no run.callbacks": (("run", "callbacks"), None),
}


@pytest.mark.parametrize("how", sorted(_SHAPES))
def test_a_whole_checkpoint_without_a_needed_key_is_refused_by_name(
        tmp_path: Path, how: str, capsys: pytest.CaptureFixture[str]) -> None:
    """A checkpoint with a valid checksum but a key a resume reads missing or of another
    type: the resume is refused in one line naming the key path (a CheckpointError, exit 2
    from `train`), and nothing of the run is changed."""
    _trainer(tmp_path, 3, keep=None).fit()
    path = tmp_path / "checkpoints" / "step-00000003.pt"
    state = torch.load(path, weights_only=True)
    keys, value = _SHAPES[how]
    holder = state
    for key in keys[:-1]:
        holder = holder[key]
    if value is None:
        del holder[keys[-1]]
    else:
        holder[keys[-1]] = value
    torch.save(_recrafted(state), path)
    again = _trainer(tmp_path / "again", 6, keep=None)
    before = [p.detach().clone() for p in again.model.parameters()]
    with pytest.raises(CheckpointError, match="key " + ".".join(keys)) as caught:
        again.resume(path)
    assert "\n" not in str(caught.value)
    assert again.clock.step == 0
    assert all(torch.equal(a, b) for a, b in zip(before, again.model.parameters(), strict=True))


def test_a_checkpoint_error_keeps_a_url_whole() -> None:
    """The error's ``path`` is the URL as given (a Path would fold ``s3://`` into ``s3:/``),
    a local path stays a Path."""
    assert CheckpointError("s3://bucket/run/step-00000004.pt", "x").path == (
        "s3://bucket/run/step-00000004.pt")
    assert CheckpointError("run/step-00000004.pt", "x").path == Path("run/step-00000004.pt")


def _spec(tmp_path: Path, task: str = "jobs.crash:make_task", epochs: int = 2,
          mode: str = "async") -> Path:
    spec = tmp_path / "job" / "specs" / "job.toml"
    spec.parent.mkdir(parents=True, exist_ok=True)
    spec.write_text(textwrap.dedent(f"""\
        [run]
        task = "{task}"
        max_epochs = {epochs}
        checkpoint_mode = "{mode}"
        [callbacks.checkpoint]
        type = "ModelSaver"
        keep = {{ any = [{{ latest = 2 }}, {{ every = "1 epoch" }}] }}
        trigger = {{ every = "16 steps" }}
        """))
    return spec


def test_resume_auto_skips_a_checksumless_checkpoint_by_name(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """`train --resume auto`: the newest checkpoint, its checksum removed, is named as
    skipped and the run resumes from the one before."""
    spec = _spec(tmp_path, epochs=1, mode="sync")
    monkeypatch.chdir(spec.parent.parent)
    monkeypatch.setenv("CRASH_JOB_WORKERS", "0")
    run = tmp_path / "run"
    assert main(["train", str(spec), "--run-dir", str(run)]) == 0
    newest = run / "checkpoints" / "step-00000064.pt"
    state = torch.load(newest, weights_only=True)
    del state["checksum"]
    torch.save(state, newest)
    spec.write_text(spec.read_text().replace("max_epochs = 1", "max_epochs = 2"))
    capsys.readouterr()
    assert main(["train", str(spec), "--run-dir", str(run), "--resume", "auto"]) == 0
    err = capsys.readouterr().err
    skipped = [line for line in err.splitlines() if "step-00000064.pt" in line]
    assert skipped and "no checksum" in skipped[0], err
    assert read_checkpoint(run / "checkpoints" / "step-00000128.pt")["step"] == 128


# -- a background write cut short ----------------------------------------------------------


def _planned(spec: Path, epochs: int) -> list[str]:
    """The files the spec's saver leaves after an unbroken run of ``epochs`` (64 steps each)."""
    from schedtrain.retention import parse_keep
    from schedtrain.simulation import planned_files, simulate
    from schedtrain.spec import load_spec

    log = simulate(load_spec(spec).schedule(), epochs=epochs, steps_per_epoch=64)
    keep = parse_keep({"any": [{"latest": 2}, {"every": "1 epoch"}]})
    return sorted(planned_files(log, {"checkpoint": keep})[-1].files)


def test_kill_9_during_a_background_write(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    """A run killed (SIGKILL) while its third checkpoint is half written in the
    background: the earlier checkpoints are valid, `--resume auto` resumes cleanly and
    ends with the files an unbroken run keeps; nothing outside the run changed."""
    spec = _spec(tmp_path, "jobs.stalled_write:make_task", epochs=1)
    run, marker = tmp_path / "run", tmp_path / "stalled"
    before = _snapshot(spec.parent.parent)
    proc = forked.schedtrain(["train", str(spec), "--run-dir", str(run)],
                             cwd=spec.parent.parent,
                             env={"CRASH_JOB_WORKERS": "0", "OMP_NUM_THREADS": "1",
                                  "STALL_WRITE": "3", "STALL_MARKER": str(marker)})
    try:
        deadline = time.monotonic() + 120
        while not marker.exists():
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.005)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.communicate()
    thread, name = marker.read_text().split()
    assert thread == "schedtrain-checkpoint" and name == "step-00000048.pt"
    assert sorted(p.name for p in (run / "checkpoints").glob("step-*")) == [
        "step-00000016.pt", "step-00000032.pt"]
    monkeypatch.chdir(spec.parent.parent)
    assert main(["train", str(spec), "--run-dir", str(run), "--resume", "auto"]) == 0
    assert "step-00000032.pt" in capsys.readouterr().err  # resumed from it
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == _planned(spec, 1)
    assert _snapshot(spec.parent.parent) == before


class Grow(Callback):
    """Makes the model's checkpoint grow past a size limit."""

    def _trigger(self) -> None:
        self.trainer.model.register_buffer("pad", torch.zeros(200_000))


def test_a_file_size_limit_during_a_background_write(tmp_path: Path) -> None:
    """`ulimit -f` hit by a background write: one line names the checkpoint and the
    cause, the checkpoints before it are valid and kept, and the run resumes cleanly
    from the newest of them."""
    run = tmp_path / "run"

    def fill() -> int:  # in a child: the size limit is its own
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        torch.manual_seed(0)
        model = torch.nn.Linear(3, 1)
        t = Trainer(model, torch.optim.SGD(model.parameters(), lr=0.01), UnevenData([6]),
                    torch.nn.functional.mse_loss,
                    schedule=Schedule({"save": every("1 step"), "grow": every("3 steps")}),
                    bindings={"save": ModelSaver(keep=2), "grow": Grow()}, max_epochs=1,
                    run_dir=run, handle_signals=False, checkpoint_mode="async")
        resource.setrlimit(resource.RLIMIT_FSIZE, (400_000, 400_000))
        try:
            t.fit()
        except Exception as exc:
            print(type(exc).__name__, "|", str(exc).replace(chr(10), " / "))
        return 0

    child = Forked(fill, cwd=tmp_path)
    stdout, stderr = child.communicate(timeout=120)
    assert child.returncode == 0, stderr
    out = stdout.strip().splitlines()
    assert len(out) == 1 and out[0].startswith("CheckpointError | "), out
    assert "step-00000003.pt" in out[0] and "could not be written" in out[0]
    kept = sorted(p.name for p in (run / "checkpoints").iterdir())
    assert kept == ["step-00000001.pt", "step-00000002.pt"]
    for name in kept:
        read_checkpoint(run / "checkpoints" / name)
    model, opt = tiny_model()
    t = Trainer(model, opt, UnevenData([6]), mse,
                schedule=Schedule({"save": every("1 step"), "grow": every("3 steps")}),
                bindings={"save": ModelSaver(keep=2), "grow": Grow()}, max_epochs=1,
                run_dir=run, handle_signals=False)
    found = newest_valid(run / "checkpoints")
    assert found is not None and found.name == "step-00000002.pt"
    t.resume(found)
    t.fit()
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == [
        "step-00000005.pt", "step-00000006.pt"]


def test_a_read_only_folder_during_a_background_write(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The checkpoint folder turns read-only (EROFS; tests run as root, where a chmod
    would not stop a write) while the third save is written in the background: the
    run fails with one line naming that checkpoint and the cause, the two before it
    are kept and valid, and a resume from the newest finishes the run."""
    from schedtrain.checkpoints import store

    real, calls = store.write_atomic, [0]

    def read_only(path: Path, write: Any) -> Path:
        calls[0] += 1
        if calls[0] >= 3:
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))
        return real(path, write)

    monkeypatch.setattr(store, "write_atomic", read_only)
    run = tmp_path / "run"
    with pytest.raises(CheckpointError) as caught:
        _trainer(run, 6, checkpoint_mode="async").fit()
    line = str(caught.value)
    assert "\n" not in line and "step-00000003.pt" in line
    assert "Read-only file system" in line
    monkeypatch.setattr(store, "write_atomic", real)
    kept = sorted(p.name for p in (run / "checkpoints").iterdir())
    assert kept == ["step-00000001.pt", "step-00000002.pt"]
    t = _trainer(run, 6)
    t.resume(run / "checkpoints" / "step-00000002.pt")
    t.fit()
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == [
        "step-00000005.pt", "step-00000006.pt"]
