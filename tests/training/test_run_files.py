"""A run's files are never damaged by another command, a crafted file or a full disk. The
other processes (a lock's holder, a run under a file size limit, `schedtrain train`) are
children forked from the test process (``jobs.forked``: torch imported once)."""

from __future__ import annotations

import os
import resource
import signal
from pathlib import Path

import pytest
import torch
from jobs import forked
from jobs.forked import Forked
from training_helpers import Noop, UnevenData, tiny_model

from schedtrain import Schedule, every, on
from schedtrain.callbacks import Callback, ModelSaver, TopKSaver
from schedtrain.checkpoints import (
    CheckpointError,
    Checkpoints,
    list_checkpoints,
    read_checkpoint,
    write_checkpoint,
)
from schedtrain.errors import RunEnded
from schedtrain.training import RunDirError, Trainer
from schedtrain.training.run_dir import RunDirectory

mse = torch.nn.functional.mse_loss


def _trainer(run_dir: Path, *, epochs: int = 3, steps: int = 3, **kw: object) -> Trainer:
    model, opt = tiny_model()
    return Trainer(model, opt, UnevenData([steps] * epochs), mse,
                   schedule=Schedule({"save": every("1 step"), "end": on("train_end")}),
                   bindings={"save": ModelSaver(keep=None), "end": Noop()},
                   max_epochs=epochs, run_dir=run_dir, handle_signals=False,
                   **kw)  # type: ignore[arg-type]


def _resume_auto(run_dir: Path, **kw: object) -> Trainer:
    """What ``train --resume auto`` does: the newest valid checkpoint, then fit."""
    t = _trainer(run_dir, **kw)
    found = Checkpoints.newest_valid(run_dir / "checkpoints")
    assert found is not None
    t.resume(found)
    t.fit()
    return t


def _files(run_dir: Path) -> dict[str, bytes]:
    return {str(p.relative_to(run_dir)): p.read_bytes() for p in sorted(run_dir.rglob("*"))
            if p.is_file() and p.name != ".lock"}


class TestAnotherCommand:
    """A refused command changes nothing; a finished run stays as it is."""

    def test_a_refused_resume_leaves_the_live_run_alone(self, tmp_path: Path) -> None:
        """Resuming a directory another process holds is refused before any file changes
        (the live run's events.jsonl keeps every line)."""
        _trainer(tmp_path, epochs=2).fit()
        (tmp_path / "run.json").unlink()  # as if the holder were still running
        before = _files(tmp_path)
        ready_r, ready_w = os.pipe()  # the holder says it holds the lock
        go_r, go_w = os.pipe()  # closed by the test: the holder lets go and exits

        def hold() -> int:
            os.close(ready_r)
            os.close(go_w)
            held = RunDirectory(tmp_path)
            held.acquire()
            os.write(ready_w, b"held\n")
            os.read(go_r, 1)
            held.release()
            return 0

        holder = Forked(hold, cwd=tmp_path)  # another process: the lock is per process
        os.close(ready_w)
        os.close(go_r)
        try:
            with os.fdopen(ready_r) as said:
                assert said.readline().strip() == "held"
            t = _trainer(tmp_path, epochs=4)
            oldest = sorted(list_checkpoints(tmp_path / "checkpoints"))[0]
            with pytest.raises(RunDirError, match="in use by process"):
                t.resume(oldest)
            assert _files(tmp_path) == before
        finally:
            os.close(go_w)
            assert holder.wait(60) == 0

    def test_requeuing_a_finished_run_changes_no_file(self, tmp_path: Path) -> None:
        """--resume auto on a finished run: nothing left to do, every file as it was."""
        _trainer(tmp_path).fit()
        before = _files(tmp_path)
        with pytest.raises(RunEnded):
            _resume_auto(tmp_path)
        after = _files(tmp_path)
        assert after.keys() == before.keys()
        assert {k: v for k, v in after.items() if k != "run.json"} == \
            {k: v for k, v in before.items() if k != "run.json"}

    @pytest.mark.parametrize("damaged", [1, 2, 4])
    def test_an_older_checkpoint_trains_what_remains(self, tmp_path: Path,
                                                     damaged: int) -> None:
        """With the newest checkpoints of a finished run damaged, --resume auto continues
        from the newest good one and trains the rest again, to the same end."""
        full = _trainer(tmp_path / "full")
        full.fit()
        _trainer(tmp_path / "run").fit()
        newest = list_checkpoints(tmp_path / "run" / "checkpoints")[:damaged]
        for path in newest:
            path.write_bytes(path.read_bytes()[:100])
        t = _resume_auto(tmp_path / "run")
        assert t.clock.step == full.clock.step
        for name, param in full.model.state_dict().items():
            assert torch.equal(param, t.model.state_dict()[name])
        lines = (tmp_path / "run" / "events.jsonl").read_text().splitlines()
        want = (tmp_path / "full" / "events.jsonl").read_text().splitlines()
        assert len(lines) == len(want)


class TestCraftedFiles:
    """Names read from checkpoints never reach outside the run."""

    def test_a_kept_name_with_a_folder_part_is_refused(self, tmp_path: Path) -> None:
        """A checkpoint whose TopKSaver state names ``../../victim`` (checksum recomputed)
        is refused on resume, and the file it names survives."""
        victim = tmp_path / "victim.txt"
        victim.write_text("keep me")

        def make(run: Path) -> Trainer:
            model, opt = tiny_model()
            return Trainer(model, opt, UnevenData([3] * 3), mse,
                           schedule=Schedule({"top": every("1 step")}),
                           bindings={"top": TopKSaver(monitor="train/loss", save_top_k=1)},
                           max_epochs=3, run_dir=run, handle_signals=False)

        run = tmp_path / "a" / "run"
        make(run).fit()
        path = sorted((run / "best").glob("*-step-*.pt"))[-1]
        state = read_checkpoint(path)
        state["run"]["callbacks"]["top"]["best"] = [[0.0, 1, "../../../victim.txt"]]
        state["run"]["written"].append("../../victim.txt")
        write_checkpoint({k: v for k, v in state.items() if k not in ("format", "checksum")},
                         path)
        with pytest.raises(ValueError, match="victim"):
            make(run).resume(path)
        assert victim.read_text() == "keep me"

    @pytest.mark.parametrize("name", ["../x.pt", "/etc/x.pt", "a\x00b.pt", "x" * 300 + ".pt"])
    def test_saver_file_names_stay_in_their_folder(self, name: str) -> None:
        """A saver's ``filename`` is one file name: a folder part, a NUL byte or a name
        over the file system's limit is refused when the callback is made."""
        from schedtrain.callbacks import MinSaver

        with pytest.raises(ValueError, match="filename"):
            MinSaver(filename=name)

    def test_written_entries_outside_the_run_are_never_deleted(self, tmp_path: Path) -> None:
        """A path in the checkpoint's list of written files, but in no folder this process
        wrote into, is left alone."""
        victim = tmp_path / "elsewhere" / "step-00000001.pt"
        victim.parent.mkdir()
        victim.write_bytes(b"someone else's")
        t = _trainer(tmp_path / "run", epochs=1)
        t.fit()
        t.checkpoints.written.append(str(victim.resolve()))
        assert not t.delete_checkpoint(victim)
        assert victim.exists()


class TestDamagedCheckpoints:
    """Every unreadable candidate is skipped by name; the run then writes over it."""

    def test_empty_files_and_directories_are_skipped(self, tmp_path: Path) -> None:
        _trainer(tmp_path, epochs=2).fit()
        folder = tmp_path / "checkpoints"
        (folder / "step-00000099.pt").write_bytes(b"")
        (folder / "step-00000098.pt").mkdir()
        (folder / "step-00000097.pt").write_bytes(b"PK\x03\x04")
        skipped: list[tuple[str, str]] = []
        found = Checkpoints.newest_valid(folder, lambda p, why: skipped.append((p.name, why)))
        assert found is not None and found.name == "step-00000006.pt"
        assert [n for n, _ in skipped] == ["step-00000099.pt", "step-00000098.pt",
                                           "step-00000097.pt"]
        assert all(why for _, why in skipped)

    def test_a_directory_in_a_checkpoints_place_is_replaced(self, tmp_path: Path) -> None:
        """A directory where the run will write a checkpoint does not fail the run."""
        _trainer(tmp_path, epochs=2).fit()
        (tmp_path / "checkpoints" / "step-00000008.pt").mkdir()
        t = _resume_auto(tmp_path, epochs=3)
        assert t.clock.step == 9
        assert read_checkpoint(tmp_path / "checkpoints" / "step-00000008.pt")["step"] == 8


def test_a_full_disk_names_the_checkpoint_write(tmp_path: Path) -> None:
    """A checkpoint that cannot be written (here: over the process's file size limit, as
    on a full disk) fails the run naming the write, the path and the cause; the
    checkpoints written before stay valid."""
    def fill() -> int:  # in a child: the size limit is its own
        from schedtrain.errors import failure_place

        class Grow(Callback):
            def _trigger(self) -> None:
                self.trainer.model.register_buffer("pad", torch.zeros(200_000))

        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        model = torch.nn.Linear(3, 1)
        t = Trainer(model, torch.optim.SGD(model.parameters(), lr=0.01), UnevenData([4]),
                    torch.nn.functional.mse_loss,
                    schedule=Schedule({"save": every("1 step"), "grow": every("3 steps")}),
                    bindings={"save": ModelSaver(keep=None), "grow": Grow()},
                    max_epochs=1, run_dir=tmp_path / "run", handle_signals=False)
        resource.setrlimit(resource.RLIMIT_FSIZE, (400_000, 400_000))
        try:
            t.fit()
        except Exception as exc:
            print(type(exc).__name__)
            print(failure_place(exc))
            print(exc)
        return 0

    child = Forked(fill, cwd=tmp_path)
    stdout, stderr = child.communicate(timeout=120)
    assert child.returncode == 0, stderr
    out = stdout.splitlines()
    assert out[0] == "CheckpointError", out
    assert "checkpoint write after step 3" in out[1]
    assert "step-00000003.pt" in out[2] and "could not be written" in out[2]
    assert "too large" in out[2].lower() or "disk is full" in out[2]
    kept = list_checkpoints(tmp_path / "run" / "checkpoints")
    assert [p.name for p in kept] == ["step-00000002.pt", "step-00000001.pt"]
    for path in kept:
        read_checkpoint(path)
    with pytest.raises(CheckpointError):
        read_checkpoint(tmp_path / "run" / "checkpoints" / "step-00000003.pt")


class TestTaskFactories:
    """A task factory must return a Task: anything else is exit 2, with nothing trained."""

    @pytest.mark.parametrize(("task", "says"), [
        ("sys:exit", "standard library"), ("os:getcwd", "standard library"),
        ("tasks:exits", "exited"), ("tasks:returns_none", "got NoneType"),
    ])
    def test_the_run_is_refused(self, tmp_path: Path, task: str, says: str) -> None:
        (tmp_path / "tasks.py").write_text("import sys\n\ndef exits():\n    sys.exit(0)\n\n"
                                           "def returns_none():\n    return None\n")
        spec = tmp_path / "job.toml"
        spec.write_text(f'[run]\ntask = "{task}"\nmax_epochs = 1\n\n'
                        '[callbacks.save]\ntype = "ModelSaver"\ntrigger = { every = "1 epoch" }\n')
        proc = forked.schedtrain(["train", str(spec), "--run-dir", str(tmp_path / "run")],
                                 cwd=tmp_path)
        _, stderr = proc.communicate(timeout=120)
        assert proc.returncode == 2, stderr
        assert "run.task" in stderr and says in stderr
        assert "Traceback" not in stderr
        assert not (tmp_path / "run" / "checkpoints").exists()
