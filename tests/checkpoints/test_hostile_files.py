"""No file schedtrain writes lands outside its run directory, whatever is planted there:
a symbolic link in a file's or a folder's place, a FIFO, or a checkpoint carrying a
pickle payload."""

from __future__ import annotations

import os
import pickle
import subprocess
import textwrap
from pathlib import Path

import pytest
import torch
from jobs import forked
from training_helpers import Noop, UnevenData, tiny_model

from schedtrain import Schedule, every, on
from schedtrain.callbacks import Callback, ModelSaver
from schedtrain.checkpoints import Checkpoints
from schedtrain.cli.main import main
from schedtrain.files import UnsafeFile
from schedtrain.training import RunDirError, Trainer

mse = torch.nn.functional.mse_loss
HERE = Path(__file__).resolve().parents[1]  # tests/, where the helper modules are
VICTIM_BYTES = b"the user's own file\n"
RESNET = str(HERE.parent / "specs" / "resnet_tensorpack.toml")


class Boom(Callback):
    """Fails the run when it fires."""

    def _trigger(self) -> None:
        raise RuntimeError("boom")


def _trainer(run_dir: Path, *, epochs: int = 2, fail: bool = False,
             overwrite: bool = False) -> Trainer:
    model, opt = tiny_model()
    end = Boom() if fail else Noop()
    return Trainer(model, opt, UnevenData([3] * epochs), mse,
                   schedule=Schedule({"save": every("1 step"), "end": on("train_end")}),
                   bindings={"save": ModelSaver(keep=None), "end": end},
                   max_epochs=epochs, run_dir=run_dir, handle_signals=False,
                   overwrite=overwrite)


def _resume(run_dir: Path, epochs: int) -> Trainer:
    t = _trainer(run_dir, epochs=epochs)
    found = Checkpoints.newest_valid(run_dir / "checkpoints")
    assert found is not None
    t.resume(found)
    t.fit()
    return t


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    """A file outside the run directory that a planted link points at."""
    path = tmp_path / "outside" / "victim.txt"
    path.parent.mkdir()
    path.write_bytes(VICTIM_BYTES)
    return path


class TestPlantedFileLinks:
    """A link in the place of a file the run writes is replaced or refused, never
    written through."""

    @pytest.mark.parametrize("name", ["run.json", "traceback.txt"])
    def test_a_replaced_file_replaces_the_link(self, tmp_path: Path, victim: Path,
                                               name: str) -> None:
        """run.json and traceback.txt are written whole and renamed into place: the
        link is replaced by the run's own file."""
        run_dir = tmp_path / "run"
        run_dir.mkdir()
        (run_dir / name).symlink_to(victim)
        with pytest.raises(RuntimeError, match="boom"):
            _trainer(run_dir, fail=True).fit()
        assert victim.read_bytes() == VICTIM_BYTES
        assert not (run_dir / name).is_symlink() and (run_dir / name).stat().st_size > 0

    def test_a_fifo_as_run_json_never_blocks(self, tmp_path: Path) -> None:
        """run.json is read only as a regular file: a FIFO there is no run's status, and
        the run's own run.json replaces it."""
        run_dir = tmp_path / "run"
        run_dir.mkdir()
        os.mkfifo(run_dir / "run.json")
        _trainer(run_dir).fit()
        assert (run_dir / "run.json").is_file()

    def test_a_link_in_the_lock_files_place_is_refused(self, tmp_path: Path,
                                                       victim: Path) -> None:
        """The lock is opened in place: a link there fails the run naming the file."""
        run_dir = tmp_path / "run"
        run_dir.mkdir()
        (run_dir / ".lock").symlink_to(victim)
        with pytest.raises(UnsafeFile, match=r"\.lock' is a symbolic link"):
            _trainer(run_dir).fit()
        assert victim.read_bytes() == VICTIM_BYTES

    @pytest.mark.parametrize("kind", ["link", "fifo"])
    def test_events_jsonl_that_is_not_a_regular_file_is_refused(
            self, tmp_path: Path, victim: Path, kind: str) -> None:
        """A resumed run whose events.jsonl became a link or a FIFO is refused naming
        it, before training: neither the victim nor the run is changed or hangs."""
        run_dir = tmp_path / "run"
        _trainer(run_dir).fit()
        events = run_dir / "events.jsonl"
        events.unlink()
        if kind == "link":
            events.symlink_to(victim)
        else:
            os.mkfifo(events)
        with pytest.raises(UnsafeFile, match=r"events\.jsonl' is a (symbolic link|FIFO)"):
            _resume(run_dir, epochs=3)
        assert victim.read_bytes() == VICTIM_BYTES

    def test_a_link_in_a_checkpoints_place_is_replaced(self, tmp_path: Path,
                                                       victim: Path) -> None:
        """A link named as the next checkpoint is skipped by resume and replaced by
        the checkpoint the run writes there."""
        run_dir = tmp_path / "run"
        _trainer(run_dir).fit()
        planted = run_dir / "checkpoints" / "step-00000008.pt"
        planted.symlink_to(victim)
        t = _resume(run_dir, epochs=3)
        assert t.clock.step == 9
        assert victim.read_bytes() == VICTIM_BYTES
        assert not planted.is_symlink()

    def test_a_new_run_replaces_no_file_through_a_link_to_a_log(self, tmp_path: Path,
                                                                victim: Path) -> None:
        """A fresh run over a directory whose events.jsonl is a link is refused as
        holding a run; with --overwrite the link (not the victim) is removed."""
        run_dir = tmp_path / "run"
        run_dir.mkdir()
        (run_dir / "events.jsonl").symlink_to(victim)
        with pytest.raises(RunDirError, match="holds a run"):
            _trainer(run_dir).fit()
        _trainer(run_dir, overwrite=True).fit()
        assert victim.read_bytes() == VICTIM_BYTES
        assert not (run_dir / "events.jsonl").is_symlink()


class TestPlantedFolderLinks:
    """A folder of the run directory that leads out of it is refused before any write."""

    @pytest.mark.parametrize("name", ["checkpoints", "best"])
    def test_a_folder_leading_out_is_refused(self, tmp_path: Path, name: str) -> None:
        """Nothing is written into, or deleted from, the folder the link leads to."""
        run_dir, outside = tmp_path / "run", tmp_path / "outside"
        run_dir.mkdir()
        outside.mkdir()
        (outside / ".keep.tmp").write_bytes(VICTIM_BYTES)  # looks like a leftover
        (run_dir / name).symlink_to(outside, target_is_directory=True)
        with pytest.raises(UnsafeFile, match=f"{name}' leads out of the run directory"):
            _trainer(run_dir).fit()
        assert [p.name for p in outside.iterdir()] == [".keep.tmp"]

    def test_a_tensorboard_folder_leading_out_is_refused(self, tmp_path: Path) -> None:
        """The tensorboard sink of a spec's run refuses RUN_DIR/tensorboard leading out
        before it writes an event file."""
        pytest.importorskip("tensorboard")
        from schedtrain.monitors.cadence import build_sinks

        run_dir, outside = tmp_path / "run", tmp_path / "outside"
        run_dir.mkdir()
        outside.mkdir()
        (run_dir / "tensorboard").symlink_to(outside, target_is_directory=True)
        with pytest.raises(UnsafeFile, match="tensorboard' leads out of the run directory"):
            build_sinks(["tensorboard"], {}, run_dir)
        assert list(outside.iterdir()) == []

    def test_a_folder_link_inside_the_run_directory_is_followed(self,
                                                                tmp_path: Path) -> None:
        """A link to a folder inside the run directory keeps the writes inside: allowed."""
        run_dir = tmp_path / "run"
        (run_dir / "kept").mkdir(parents=True)
        (run_dir / "checkpoints").symlink_to(run_dir / "kept", target_is_directory=True)
        _trainer(run_dir).fit()
        assert len(list((run_dir / "kept").glob("step-*.pt"))) == 6

    def test_the_command_line_says_it_in_one_line(self, tmp_path: Path) -> None:
        """`schedtrain train` with a checkpoints link leading out exits 2 with one
        error line naming the folder, and no traceback."""
        spec = _job_spec(tmp_path)
        run_dir, outside = tmp_path / "run", tmp_path / "outside"
        run_dir.mkdir()
        outside.mkdir()
        (run_dir / "checkpoints").symlink_to(outside, target_is_directory=True)
        result = _cli_train(spec, run_dir)
        assert result.returncode == 2, result.stderr
        assert "checkpoints' leads out of the run directory" in result.stderr
        assert "Traceback" not in result.stderr
        assert list(outside.iterdir()) == []


def _job_spec(tmp_path: Path) -> Path:
    """A one-epoch job that checkpoints at its end."""
    spec = tmp_path / "job" / "specs" / "crash.toml"
    spec.parent.mkdir(parents=True)
    spec.write_text(textwrap.dedent("""\
        [run]
        task = "jobs.crash:make_task"
        max_epochs = 1
        [callbacks.checkpoint]
        type = "ModelSaver"
        trigger = { on = "train_end" }
        """))
    return spec


def _cli_train(spec: Path, run_dir: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    """``schedtrain train`` in a child forked from the test process (``jobs.forked``:
    torch imported once), its own stdout, stderr and exit code as a fresh one's."""
    argv = ["train", str(spec), "--run-dir", str(run_dir), *extra]
    proc = forked.schedtrain(argv, cwd=spec.parent.parent,
                             env={"OMP_NUM_THREADS": "1", "CRASH_JOB_WORKERS": "0"})
    out, err = proc.communicate(timeout=300)
    return subprocess.CompletedProcess(argv, proc.wait(), out, err)


def test_plan_out_replaces_a_link_instead_of_writing_through(tmp_path: Path,
                                                              victim: Path) -> None:
    """`plan --out FILE` where FILE is a link: the plan replaces the link."""
    out = tmp_path / "plan.txt"
    out.symlink_to(victim)
    assert main(["plan", RESNET, "--out", str(out)]) == 0
    assert victim.read_bytes() == VICTIM_BYTES
    assert not out.is_symlink() and out.stat().st_size > 0


class Payload:
    """Pickled, it creates a marker file when loaded: proof that a load ran code."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.system, (f"touch {self.marker}",))


def test_a_pickle_payload_checkpoint_is_skipped_by_name(tmp_path: Path) -> None:
    """A checkpoint-named file carrying a pickle payload is refused by weights_only
    loading: `train --resume auto` names it as skipped and its code never runs."""
    spec = _job_spec(tmp_path)
    run_dir = tmp_path / "run"
    assert _cli_train(spec, run_dir).returncode == 0
    marker = tmp_path / "payload-ran"
    planted = run_dir / "checkpoints" / "step-00000099.pt"
    with planted.open("wb") as f:
        pickle.dump({"format": "schedtrain-checkpoint-1", "x": Payload(marker)}, f)
    result = _cli_train(spec, run_dir, "--resume", "auto")
    assert result.returncode == 0, result.stderr
    skipped = [line for line in result.stderr.splitlines() if "checkpoint_skipped" in line]
    assert len(skipped) == 1 and "step-00000099.pt" in skipped[0], result.stderr
    assert "nothing left to do" in result.stderr
    assert not marker.exists()
