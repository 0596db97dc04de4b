"""Checkpoints: safe to load, checked, never a bad one over a good one, pruned carefully."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
import torch
from training_helpers import Noop, UnevenData, tiny_model

from schedtrain import Schedule, every
from schedtrain.callbacks import Callback, ModelSaver
from schedtrain.checkpoints import (
    STATE_FILE,
    CheckpointError,
    file_digests,
    list_checkpoints,
    newest_valid,
    read_checkpoint,
    remove_leftovers,
    replace_dir,
    write_checkpoint,
)
from schedtrain.training import Trainer

mse = torch.nn.functional.mse_loss


def _trainer(run_dir: Path, *, steps: int = 6, keep: int | None = 2, epochs: int = 1,
             extra: dict[str, Callback] | None = None, **kw: object) -> Trainer:
    model, opt = tiny_model()
    schedule = Schedule({"save": every("1 step"), **{n: every("1 step") for n in extra or {}}})
    return Trainer(model, opt, UnevenData([steps] * epochs), mse, schedule=schedule,
                   bindings={"save": ModelSaver(keep=keep), **(extra or {})},
                   max_epochs=epochs, run_dir=run_dir, **kw)  # type: ignore[arg-type]


class TestFormat:
    """The file loads in plain PyTorch, with weights_only, and its keys are documented."""

    def test_loads_with_weights_only(self, tmp_path: Path) -> None:
        """torch.load(weights_only=True) reads it; the weights load into a fresh model."""
        t = _trainer(tmp_path)
        t.fit()
        path = tmp_path / "checkpoints" / "step-00000006.pt"
        state = torch.load(path, weights_only=True)
        assert {"format", "phase", "step", "epoch", "finite", "model", "optimizer", "scaler",
                "run", "checksum"} <= set(state)
        fresh = torch.nn.Linear(3, 1)
        fresh.load_state_dict(state["model"])
        assert torch.equal(fresh.weight, t.model.weight)

    def test_files_get_the_umask_mode(self, tmp_path: Path) -> None:
        """A checkpoint is created with the mode the user's umask gives, not 0600."""
        old = os.umask(0o022)
        try:
            _trainer(tmp_path).fit()
        finally:
            os.umask(old)
        mode = stat.S_IMODE((tmp_path / "checkpoints" / "step-00000006.pt").stat().st_mode)
        assert mode == 0o644

    def test_state_that_is_not_plain_data_is_refused_by_name(self, tmp_path: Path) -> None:
        """A callback whose state_dict holds an object is named, and nothing is written."""
        class Odd(Callback):
            def state_dict(self) -> dict[str, object]:
                return {"where": Path("x")}

        t = _trainer(tmp_path, extra={"odd": Odd()})
        with pytest.raises(CheckpointError, match=r"checkpoint\.run\.callbacks\.odd\.where: "
                                                  r"PosixPath"):
            t.fit()
        assert list_checkpoints(tmp_path / "checkpoints") == []


class TestChecksum:
    """Every checkpoint carries a checksum; a corrupt one is reported by name."""

    @pytest.mark.parametrize("where", [0.5, 0.8, 0.95])
    def test_flipped_bytes_are_detected(self, tmp_path: Path, where: float) -> None:
        """64 flipped bytes anywhere make the file refused, never loaded silently."""
        _trainer(tmp_path).fit()
        path = tmp_path / "checkpoints" / "step-00000006.pt"
        data = bytearray(path.read_bytes())
        start = int(len(data) * where)
        for i in range(start, start + 64):
            data[i] ^= 0xFF
        path.write_bytes(bytes(data))
        with pytest.raises(CheckpointError, match=r"step-00000006\.pt"):
            read_checkpoint(path)

    def test_resume_auto_falls_back_to_the_newest_valid(self, tmp_path: Path) -> None:
        """A corrupt newest checkpoint is reported and the one before it is used."""
        _trainer(tmp_path).fit()
        newest = tmp_path / "checkpoints" / "step-00000006.pt"
        data = bytearray(newest.read_bytes())
        data[len(data) // 2:len(data) // 2 + 64] = bytes(64)
        newest.write_bytes(bytes(data))
        skipped: list[tuple[str, str]] = []
        found = newest_valid(tmp_path / "checkpoints", lambda p, r: skipped.append((p.name, r)))
        assert found is not None and found.name == "step-00000005.pt"
        assert skipped and skipped[0][0] == "step-00000006.pt"

    def test_a_foreign_file_is_refused(self, tmp_path: Path) -> None:
        """A file that is not a schedtrain checkpoint says so."""
        path = tmp_path / "step-00000001.pt"
        torch.save({"weights": torch.ones(2)}, path)
        with pytest.raises(CheckpointError, match="not a schedtrain-checkpoint-2 file"):
            read_checkpoint(path)

    def test_write_then_read(self, tmp_path: Path) -> None:
        """What is written is what is read back."""
        path = write_checkpoint({"model": {"w": torch.arange(4.0)}, "n": [1, (2, 3)]},
                                tmp_path / "c.pt")
        state = read_checkpoint(path)
        assert torch.equal(state["model"]["w"], torch.arange(4.0))
        assert state["n"] == [1, (2, 3)]


class Poison(Callback):
    """Makes the model's weights NaN at a given step."""

    def __init__(self, at: int) -> None:
        self.at = at

    def _after_step(self, step: int, outputs: object) -> None:
        if step == self.at:
            with torch.no_grad():
                for p in self.model.parameters():
                    p.fill_(float("nan"))


class TestNonFinite:
    """A diverged run never loses its last good checkpoint."""

    def test_keep_never_deletes_the_last_finite(self, tmp_path: Path) -> None:
        """NaN from step 3 on, keep = 2: steps 5 and 6 are kept, and step 2, the last good."""
        model, opt = tiny_model()
        t = Trainer(model, opt, UnevenData([6]), mse,
                    schedule=Schedule({"poison": every("100 steps"), "save": every("1 step")}),
                    bindings={"poison": Poison(3), "save": ModelSaver(keep=2)}, max_epochs=1,
                    run_dir=tmp_path)
        t.fit()
        names = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
        assert names == ["step-00000002.pt", "step-00000005-nonfinite.pt",
                         "step-00000006-nonfinite.pt"]
        assert newest_valid(tmp_path / "checkpoints") == tmp_path / "checkpoints" / \
            "step-00000002.pt"

    def test_a_non_finite_checkpoint_never_replaces_a_good_file(self, tmp_path: Path) -> None:
        """Saving NaN weights to a path that holds a good checkpoint writes beside it."""
        t = _trainer(tmp_path, steps=2)
        t.fit()
        good = tmp_path / "checkpoints" / "step-00000002.pt"
        before = good.read_bytes()
        with torch.no_grad():
            t.model.weight.fill_(float("inf"))
        written: list[Path] = []
        t.save_checkpoint(good, on_saved=written.append)
        assert good.read_bytes() == before
        assert written == [tmp_path / "checkpoints" / "step-00000002-nonfinite.pt"]


class TestPruning:
    """keep = N deletes only checkpoints this run wrote."""

    def test_other_files_are_left_alone(self, tmp_path: Path) -> None:
        """A checkpoint-named file the run did not write survives pruning."""
        folder = tmp_path / "checkpoints"
        folder.mkdir()
        foreign = folder / "step-00000000.pt"  # a name this run never writes
        foreign.write_bytes(b"not ours")
        t = _trainer(tmp_path, steps=5, keep=2, overwrite=False)
        t.start_over()  # the directory holds files, but no run: start without --overwrite
        t.fit()
        assert sorted(p.name for p in folder.iterdir()) == [
            "step-00000000.pt", "step-00000004.pt", "step-00000005.pt"]

    def test_resuming_a_copy_prunes_in_the_copy(self, tmp_path: Path) -> None:
        """A run resumed from a copy of its directory prunes the copy, not the original."""
        import shutil

        _trainer(tmp_path / "a", steps=4, keep=2, epochs=1).fit()
        shutil.copytree(tmp_path / "a", tmp_path / "b")
        original = sorted(p.name for p in (tmp_path / "a" / "checkpoints").iterdir())
        second = _trainer(tmp_path / "b", steps=4, keep=2, epochs=2)
        second.resume(tmp_path / "b" / "checkpoints" / "step-00000004.pt")
        second.fit()
        assert sorted(p.name for p in (tmp_path / "a" / "checkpoints").iterdir()) == original
        assert sorted(p.name for p in (tmp_path / "b" / "checkpoints").iterdir()) == [
            "step-00000007.pt", "step-00000008.pt"]


    def test_a_saver_deletes_nothing_the_run_did_not_write(self, tmp_path: Path) -> None:
        """Deleting through the trainer (what savers prune with) refuses any path this run
        did not write, inside the run directory or outside it."""
        outside = tmp_path / "victim.txt"
        outside.write_text("keep me")
        t = _trainer(tmp_path / "run", steps=3, keep=None)
        t.fit()
        foreign = tmp_path / "run" / "checkpoints" / "step-00000099.pt"
        foreign.write_bytes(b"not ours")
        assert not t.delete_checkpoint(outside)
        assert not t.delete_checkpoint(foreign)
        assert outside.read_text() == "keep me" and foreign.exists()
        mine = t.written_checkpoints()[0]
        assert t.delete_checkpoint(mine) and not mine.exists()


def test_one_process_runs_never_import_dcp(tmp_path: Path) -> None:
    """torch.distributed.checkpoint (over a second to import) is loaded only for sharded
    checkpoints: a one-process run that saves and resumes never imports it."""
    import subprocess
    import sys

    code = f"""
import sys, torch
sys.path.insert(0, {str(Path(__file__).resolve().parents[1])!r})
from training_helpers import tiny_model
from schedtrain.callbacks import ModelSaver
from schedtrain.checkpoints import list_checkpoints
from schedtrain.training import Trainer
run = {str(tmp_path / "run")!r}
data = [(torch.randn(4, 3), torch.randn(4, 1)) for _ in range(3)]
def make(epochs):
    m, opt = tiny_model()
    return Trainer(m, opt, data,
                   torch.nn.functional.mse_loss, callbacks=[ModelSaver()],
                   max_epochs=epochs, run_dir=run, handle_signals=False)
make(1).fit()
t = make(2)
t.resume(list_checkpoints(run + "/checkpoints")[0])
t.fit()
assert t.clock.epoch == 2
print(sorted(m for m in sys.modules if m.startswith("torch.distributed.checkpoint")))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "[]"


def _sharded(folder: Path, name: str, step: int, shards: int = 2) -> Path:
    """A sharded checkpoint directory as ``checkpoints.sharded`` builds one (shard files
    stand in for DCP's), moved into place with ``replace_dir``."""
    tmp = folder / f".{name}.tmp"
    tmp.mkdir(parents=True)
    for rank in range(shards):
        (tmp / f"__{rank}_0.distcp").write_bytes(os.urandom(64) + bytes([step % 256]))
    (tmp / ".metadata").write_bytes(os.urandom(32))
    write_checkpoint({"phase": "manual", "step": step, "epoch": 0, "finite": True,
                      "model": None, "optimizer": None, "scaler": None, "run": {},
                      "shards": {"world_size": shards, "files": file_digests(tmp)}},
                     tmp / STATE_FILE)
    return replace_dir(tmp, folder / name)


class TestShardedDirectories:
    """A sharded (FSDP2) checkpoint is a directory checked file by file, replaced whole."""

    @pytest.mark.parametrize("victim", ["__0_0.distcp", "__1_0.distcp", ".metadata", STATE_FILE])
    @pytest.mark.parametrize("damage", ["flip", "delete"])
    def test_any_damaged_file_is_named_and_passed_over(self, tmp_path: Path, victim: str,
                                                       damage: str) -> None:
        older = tmp_path / "step-00000001.pt"
        write_checkpoint({"phase": "manual", "step": 1, "finite": True}, older)
        newer = _sharded(tmp_path, "step-00000002.dcp", 2)
        assert read_checkpoint(newer)["step"] == 2
        target = newer / victim
        if damage == "delete":
            target.unlink()
        else:
            data = bytearray(target.read_bytes())
            for i in range(len(data) // 2, min(len(data), len(data) // 2 + 64)):
                data[i] ^= 0xFF  # 64 bytes: a single one can fall in the zip's padding
            target.write_bytes(bytes(data))
        with pytest.raises(CheckpointError) as info:
            read_checkpoint(newer)
        assert str(newer) in str(info.value)
        if victim != STATE_FILE:
            assert repr(victim) in info.value.reason
        skipped: list[Path] = []
        assert newest_valid(tmp_path, lambda p, _: skipped.append(p)) == older
        assert skipped == [newer]

    def test_listed_with_files_newest_first(self, tmp_path: Path) -> None:
        for step in (3, 1):
            _sharded(tmp_path, f"step-{step:08d}.dcp", step)
        write_checkpoint({"phase": "manual", "step": 2}, tmp_path / "step-00000002.pt")
        assert [p.name for p in list_checkpoints(tmp_path)] == [
            "step-00000003.dcp", "step-00000002.pt", "step-00000001.dcp"]

    def test_replacing_keeps_the_old_until_the_new_is_in_place(self, tmp_path: Path) -> None:
        """A crash between moving the old directory aside and the new one in: opening the
        folder puts the old one back; an unfinished temporary directory is removed."""
        good = _sharded(tmp_path, "min-val-loss.dcp", 1)
        before = file_digests(good)
        aside = tmp_path / ".min-val-loss.dcp.old.tmp"
        good.replace(aside)  # as replace_dir does first
        (tmp_path / ".step-00000009.dcp.tmp").mkdir()  # a save that never finished
        remove_leftovers(tmp_path)
        assert sorted(p.name for p in tmp_path.iterdir()) == ["min-val-loss.dcp"]
        assert file_digests(good) == before and read_checkpoint(good)["step"] == 1
        _sharded(tmp_path, "min-val-loss.dcp", 7)  # a normal replacement
        assert read_checkpoint(good)["step"] == 7
        assert sorted(p.name for p in tmp_path.iterdir()) == ["min-val-loss.dcp"]


def test_noop_callbacks_do_not_need_state(tmp_path: Path) -> None:
    """A callback with the default (empty) state round-trips."""
    t = _trainer(tmp_path, extra={"n": Noop()})
    t.fit()
    assert read_checkpoint(tmp_path / "checkpoints" / "step-00000006.pt")["run"]["callbacks"][
        "n"] == {}
